"""The data package's errors, and its one way to reach TensorFlow."""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Optional

from advtrain.utils.errors import ArgumentError


class DataError(ValueError):
    """A file, layout or option that cannot be used: one line naming the
    file (or argument), what was expected and what was received. Code that
    wraps foreign errors (TFDS, network) tells ours from them by this class."""


class DataArgumentError(DataError, ArgumentError):
    """A `DataError` about a named argument: "argument: message"."""


def tensorflow_or_none() -> Optional[ModuleType]:
    """TensorFlow, imported quietly, where it is installed; else None."""
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
