"""Rows streamed from `.npy` files and arrays into tf.data, a few MB at a
time, each epoch in an order drawn from the seeds alone (a resumed run
replays the batches). Files are read with plain reads, not through a memory
map, whose touched pages would count as resident memory.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from advtrain.data.errors import DataError

_CONSTANT_BYTES = 64 * 2**20  # in-memory arrays up to this become a constant


def read_rows(
    path: Path,
    offset: int,
    row_shape: tuple[int, ...],
    dtype: np.dtype,
    index: np.ndarray,
) -> np.ndarray:
    """Copies rows `index` (sorted) of the C-order array of `row_shape` rows
    stored from byte `offset` of `path`: one read per run of rows."""
    out = np.empty((len(index), *row_shape), dtype)
    raw = out.reshape(len(index), -1).view(np.uint8)
    row_bytes = raw.shape[1]
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    starts = np.concatenate([[0], breaks]).astype(np.int64)
    ends = np.concatenate([breaks, [len(index)]]).astype(np.int64)
    with open(path, "rb", buffering=0) as f:
        for start, end in zip(starts, ends, strict=True):
            f.seek(offset + int(index[start]) * row_bytes)
            view = memoryview(raw[start:end]).cast("B")
            while view.nbytes:
                got = f.readinto(view)
                if not got:
                    raise DataError(
                        f"{path}: file ended while reading row "
                        f"{index[start]}; was it changed during training?"
                    )
                view = view[got:]
    return out


def epochs(epoch: Callable, repeat: bool, seed: int) -> tf.data.Dataset:
    # repeat: epoch(0), epoch(1), ... from every iterator; else one epoch
    # with a fresh random key per iterator.
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
    """Global batches of `(x, y)`; the last partial batch is dropped.

    Small in-memory arrays become a constant tensor. A memory map
    (`np.load(path, mmap_mode="r")`) or an array over 64 MiB is read a batch
    at a time; shuffling then permutes blocks of `batch_size` rows and the
    rows within each block, which keeps reads sequential. Without `repeat`:
    one epoch, in a new order per iterator; with it, endless epochs, epoch e
    in the order drawn from (seed, e), the same stream from every iterator.

    Example:

    ```python
    ds = array_batches(np.load("x.npy", mmap_mode="r"), labels, 256)
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
    ds = epochs(epoch, repeat=repeat, seed=seed)
    cardinality = tf.data.INFINITE_CARDINALITY if repeat else blocks
    ds = ds.apply(tf.data.experimental.assert_cardinality(cardinality))
    return ds.prefetch(prefetch)


def _constant_epoch(x, y, blocks, batch_size, shuffle, seed) -> Callable:
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
    read = _row_reader(x)

    def generate(key):
        rng = np.random.default_rng([seed % 2**32, int(key) % 2**32])
        order = rng.permutation(blocks) if shuffle else np.arange(blocks)
        for block in order:
            start = int(block) * batch_size
            xb, yb = read(start, start + batch_size), y[start : start + batch_size]
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
    # `read(start, stop)` copies rows: by file reads for whole memory maps.
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
    offset, path = int(x.offset), Path(filename)
    if path.stat().st_size < offset + len(x) * row_bytes:
        raise ValueError(f"{path}: shorter than its array header says.")
    return lambda start, stop: read_rows(
        path, offset, x.shape[1:], x.dtype, np.arange(start, stop)
    )
