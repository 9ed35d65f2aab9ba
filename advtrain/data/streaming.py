"""Global batches from in-memory arrays and memory maps: small arrays
become one constant tensor, large ones and memory maps are read a batch at
a time (never resident in the process).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from advtrain.data.arrays import read_rows

# In-memory arrays up to this size become one constant tensor
# (from_tensor_slices); larger ones, and every memory map, are read one
# batch at a time.
_CONSTANT_BYTES = 64 * 2**20


def _epochs(epoch: Callable, repeat: bool, seed: int) -> tf.data.Dataset:
    """`epoch(key)` for key 0, 1, 2, ... (repeat: the same stream from every
    iterator), or one epoch with a fresh random key per iterator."""
    if repeat:
        keys = tf.data.Dataset.counter()
    else:
        keys = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
        keys = keys.take(1)
    return keys.flat_map(epoch)


def array_batches(
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    repeat: bool = False,
) -> tf.data.Dataset:
    """Global batches of `(x, y)`; large arrays and memory maps stream.

    Small in-memory arrays become a constant tensor. A memory map (from
    `np.load(path, mmap_mode="r")`) or an array over 64 MiB is read one
    batch at a time: a memory map with plain file reads, so the file
    never becomes resident in the process (its pages stay in the page
    cache, not in the process). Shuffling then permutes the order of
    contiguous blocks of `batch_size` rows and the rows within each batch,
    which keeps reads sequential. The last partial batch is dropped.

    Without `repeat`: one epoch, in a new order for every iterator. With
    `repeat`: epochs without end, epoch e in the order drawn from
    (seed, e), and every iterator replays the same stream.

    Example:

    ```python
    x = np.load("features.npy", mmap_mode="r")
    ds = array_batches(x, labels, 256)
    ```
    """
    y = np.asarray(y)
    n = len(y) // batch_size * batch_size
    if n == 0:
        raise ValueError(
            f"batch_size={batch_size} is larger than the {len(y)} examples."
        )
    blocks = n // batch_size
    if not isinstance(x, np.memmap) and np.asarray(x).nbytes <= _CONSTANT_BYTES:
        epoch = _constant_epoch(np.asarray(x), y, blocks, batch_size, shuffle, seed)
        prefetch = tf.data.AUTOTUNE
    else:
        epoch = _streamed_epoch(x, y, blocks, batch_size, shuffle, seed)
        prefetch = 2
    ds = _epochs(epoch, repeat=repeat, seed=seed)
    cardinality = tf.data.INFINITE_CARDINALITY if repeat else blocks
    ds = ds.apply(tf.data.experimental.assert_cardinality(cardinality))
    return ds.prefetch(prefetch)


def _constant_epoch(x, y, blocks, batch_size, shuffle, seed) -> Callable:
    """`epoch(key)`: the batches of one epoch, gathered from constants."""
    xs, ys = tf.constant(x), tf.constant(y)

    def epoch(key):
        rows = tf.range(len(y), dtype=tf.int64)
        if shuffle:
            rows = tf.random.experimental.stateless_shuffle(
                rows, seed=tf.stack([tf.constant(seed, tf.int64), key])
            )
        rows = tf.reshape(rows[: blocks * batch_size], (blocks, batch_size))
        return tf.data.Dataset.from_tensor_slices(rows).map(
            lambda r: (tf.gather(xs, r), tf.gather(ys, r))
        )

    return epoch


def _streamed_epoch(x, y, blocks, batch_size, shuffle, seed) -> Callable:
    """`epoch(key)`: the batches of one epoch, read a block at a time."""
    read = _row_reader(x)

    def generate(key):
        rng = np.random.default_rng([seed % 2**32, int(key) % 2**32])
        order = rng.permutation(blocks) if shuffle else np.arange(blocks)
        for block in order:
            start = int(block) * batch_size
            xb = read(start, start + batch_size)
            yb = y[start : start + batch_size]
            if shuffle:
                rows = rng.permutation(batch_size)
                xb, yb = xb[rows], yb[rows]
            yield xb, yb

    spec = (
        tf.TensorSpec((batch_size, *x.shape[1:]), tf.as_dtype(x.dtype)),
        tf.TensorSpec((batch_size, *y.shape[1:]), tf.as_dtype(y.dtype)),
    )

    def epoch(key):
        return tf.data.Dataset.from_generator(
            generate, args=(key,), output_signature=spec
        )

    return epoch


def _row_reader(x: np.ndarray) -> Callable[[int, int], np.ndarray]:
    """`read(start, stop)` copies rows; file reads for whole memory maps."""
    filename = getattr(x, "filename", None)
    base_ok = (
        isinstance(x, np.memmap)
        and filename is not None
        and x.flags.c_contiguous
        and isinstance(getattr(x, "base", None), mmap.mmap)
    )
    if not base_ok:
        return lambda start, stop: np.array(x[start:stop])
    row_bytes = int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize
    offset = int(x.offset)
    path = Path(filename)
    if path.stat().st_size < offset + len(x) * row_bytes:
        raise ValueError(f"{path}: shorter than its array header says.")

    def read(start: int, stop: int) -> np.ndarray:
        return read_rows(path, offset, x.shape[1:], x.dtype, np.arange(start, stop))

    return read
