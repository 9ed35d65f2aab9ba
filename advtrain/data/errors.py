"""The data package's errors, and its one way to reach TensorFlow."""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Optional

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


def tensorflow_or_none() -> Optional[ModuleType]:
    """TensorFlow, imported quietly, where it is installed; else None (the
    sources then hold numpy arrays, `advtrain.data.batches`)."""
    if importlib.util.find_spec("tensorflow") is None:
        return None
    from advtrain._tfimport import import_tensorflow

    import_tensorflow()
    import tensorflow

    return tensorflow


def needs_tensorflow(what: str, received: str) -> DataError:
    """The one-line error for a part of the data that needs TensorFlow."""
    return DataError(
        f"{what} needs TensorFlow (tf.data), which is not installed: pip "
        f"install tensorflow. Received: {received}"
    )
