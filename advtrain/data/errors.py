"""The error the data sources raise for data they cannot use."""

from __future__ import annotations


class DataError(ValueError):
    """A data file, layout or option that cannot be used, in one line naming
    the file (or `data.` key), what was expected and what was received.

    A `ValueError`: code that wraps foreign errors (TFDS, network) tells
    advtrain's own one-line messages from them by this class.
    """
