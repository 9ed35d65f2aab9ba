"""The error the data sources raise for data they cannot use."""

from __future__ import annotations

from advtrain.utils.errors import ArgumentError


class DataError(ValueError):
    """A data file, layout or option that cannot be used, in one line naming
    the file (or the argument), what was expected and what was received.

    A `ValueError`: code that wraps foreign errors (TFDS, network) tells
    advtrain's own one-line messages from them by this class.
    """


class DataArgumentError(DataError, ArgumentError):
    """A `DataError` about the value of a named argument (`path`,
    `tfds_name`, `image_size`): "argument: message", as `ArgumentError`."""
