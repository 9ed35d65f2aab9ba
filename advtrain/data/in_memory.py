"""An endless stream of batches from arrays in memory, with or without
TensorFlow."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from advtrain import backend
from advtrain.data.batches import ArrayBatches, Examples


def array_stream(
    x: Any, y: Any, batch_size: int, *, shuffle: bool, seed: int
) -> Callable[[int], Any]:
    """`stream(skip)`: the endless stream of whole batches of `(x, y)`
    without its first `skip`; tf.data's `array_batches` where TensorFlow is
    installed, else batched by numpy (the same seed gives the same batches,
    though not tf.data's)."""
    if backend.HAS_TENSORFLOW:
        from advtrain.data.streaming import array_batches

        ds = array_batches(x, y, batch_size, shuffle=shuffle, seed=seed, repeat=True)
        return ds.skip
    # Whole batches only, as array_batches and the plan's steps per epoch
    # count them (shuffled batches drop the rest).
    whole = len(x) if shuffle else len(x) // batch_size * batch_size
    examples = Examples(np.asarray(x)[:whole], np.asarray(y)[:whole])
    batches = ArrayBatches(examples, batch_size=batch_size, training=shuffle, seed=seed)
    return batches.repeat().skip
