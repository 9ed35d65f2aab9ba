"""In-memory examples batched with numpy: the input without TensorFlow.
The same seed gives the same batches, though not tf.data's.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Optional

import keras
import numpy as np


@dataclasses.dataclass(frozen=True)
class Examples:
    """One split's images `(N, H, W, C)` (uint8, or float in [0, 1]) and
    integer labels `(N,)`."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)


class ArrayBatches(keras.utils.PyDataset):
    """Batches of `Examples` as float32 pixels in [0, 1] and their labels.

    Training batches come in a fresh order each epoch (epoch e's from
    `(seed, e)`), augmented (`AUGMENT_DEFAULTS` keys, filled in), the last
    partial batch dropped; evaluation keeps the order and every example.
    `repeat()` and `skip(n)` act as the `tf.data.Dataset` methods.

    Example:

    ```python
    batches = ArrayBatches(Examples(x, y), batch_size=64, training=True)
    model.fit(batches.repeat(), steps_per_epoch=len(batches), epochs=2)
    ```
    """

    def __init__(
        self,
        examples: Examples,
        *,
        batch_size: int,
        training: bool,
        seed: int = 0,
        augment: Optional[dict[str, Any]] = None,
        endless: bool = False,
        start: int = 0,
    ):
        super().__init__()
        self.examples, self.batch_size, self.training = examples, batch_size, training
        self.seed, self.augment = seed % 2**32, augment or {}
        self.endless, self.start = endless, start
        self._last_order: tuple[int, Any] = (-1, None)
        n = len(examples)
        self.steps = n // batch_size if training else -(-n // batch_size)
        if training and self.steps == 0:
            raise ValueError(
                f"batch_size={batch_size} is larger than the {n} training examples."
            )

    def __len__(self) -> int:
        return self.steps

    @property
    def num_batches(self) -> Optional[int]:
        return None if self.endless else self.steps

    def repeat(self) -> ArrayBatches:
        return self._with(endless=True)

    def skip(self, count: int) -> ArrayBatches:
        return self._with(start=self.start + count)

    def _with(self, **changes: Any) -> ArrayBatches:
        batches = copy.copy(self)
        batches.__dict__.update(changes)
        return batches

    def __getitem__(self, index: int):
        index += self.start
        if not self.endless and index >= self.steps:
            raise IndexError(index)
        epoch, step = divmod(index, self.steps)
        rows = self._order(epoch)[step * self.batch_size : (step + 1) * self.batch_size]
        x = self.examples.x[rows]
        x = x.astype(np.float32) / 255.0 if x.dtype == np.uint8 else x.astype("float32")
        if self.training and any(self.augment.values()):
            x = augmented(
                x, np.random.default_rng([self.seed, 1, index]), **self.augment
            )
        return x, self.examples.y[rows]

    def _order(self, epoch: int) -> np.ndarray:
        if self._last_order[0] != epoch:
            n = len(self.examples)
            rng = np.random.default_rng([self.seed, 0, epoch])
            order = rng.permutation(n) if self.training else np.arange(n)
            self._last_order = (epoch, order)
        return self._last_order[1]


def augmented(
    x: np.ndarray,
    rng: np.random.Generator,
    *,
    random_crop_pad: int = 0,
    brightness: float = 0.0,
    contrast: float = 0.0,
    horizontal_flip: bool = False,
) -> np.ndarray:
    """The batch `x` augmented as tf.data's path does, clipped to [0, 1]."""
    n, height, width = x.shape[:3]
    if random_crop_pad:
        pad = random_crop_pad
        padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        top, left = rng.integers(0, 2 * pad + 1, (2, n))
        crops = zip(padded, top, left, strict=True)
        x = np.stack([p[t : t + height, s : s + width] for p, t, s in crops])
    if brightness:
        x = x + rng.uniform(-brightness, brightness, (n, 1, 1, 1)).astype(x.dtype)
    if contrast:
        factor = rng.uniform(1 - contrast, 1 + contrast, (n, 1, 1, 1)).astype(x.dtype)
        mean = x.mean(axis=(1, 2), keepdims=True)
        x = (x - mean) * factor + mean
    if horizontal_flip:
        flip = rng.random(n) < 0.5
        x = np.where(flip[:, None, None, None], x[:, :, ::-1], x)
    return np.clip(x, 0.0, 1.0)
