"""The data package's errors, and its one way to reach TensorFlow."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from advtrain import backend
from advtrain.backend import tensorflow_or_none  # noqa: F401 (the data's way)
from advtrain.utils.errors import ArgumentError


class DataError(ValueError):
    """A file, layout or option that cannot be used: one line naming the
    file (or argument), what was expected and what was received. Code that
    wraps foreign errors (TFDS, network) tells ours from them by this class."""


class DataArgumentError(DataError, ArgumentError):
    """A `DataError` about a named argument: "argument: message"."""


def needs_tensorflow(what: str, received: str) -> DataError:
    """The one-line error for a part of the data that needs TensorFlow."""
    return DataError(
        f"{what} needs TensorFlow (tf.data), which is not installed: "
        f"{backend.install_command(['tensorflow'])}. Received: {received}"
    )


def warn_skipped(logger: logging.Logger, where: str, n: int, what: str = "example"):
    if n:
        logger.warning(
            "%s: skipped %d corrupt %s(s) (on_corrupt: skip).", where, n, what
        )


def check_label_count(x_path: Path, y_path: Path, n_x: int, n_y: int) -> None:
    if n_x != n_y:
        raise DataError(
            f"{y_path}: expected {n_x} labels, one per image in {x_path.name}. "
            f"Received: {n_y}"
        )


def valid_labels(
    labels: np.ndarray, num_classes: int, partial: bool, path: Path, note: str = ""
) -> np.ndarray:
    """A mask of the labels in 0..num_classes-1; unless `partial`, any other
    is a one-line error naming `path` and its index."""
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any() and not partial:
        first = np.argmax(bad)
        raise DataError(
            f"{path} index {first}: label out of range: expected "
            f"0..{num_classes - 1}{note}. Received: {labels[first]}"
        )
    return ~bad
