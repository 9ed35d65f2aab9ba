"""Source `arrays`: `.npy` files streamed from disk, never loaded whole.

`path` is a directory of `x_train.npy`, `y_train.npy` (and optionally
`x_test.npy`, `y_test.npy`), or a prefix `PATH` of `PATH_x.npy`,
`PATH_y.npy`. Without a test pair, `test_fraction` is held out as test,
then `val_fraction` of the rest (stratified, seeded by `seed`). Images are
`(N, H, W)` or `(N, H, W, C)`, uint8 or float in [0, 1]; labels integers
`(N,)` or `(N, 1)` in 0..K-1, K = 1 + the largest training label. Each
epoch reads the training rows in an order drawn from `seed` alone.

Example:

```python
np.save("/data/x_train.npy", x)
np.save("/data/y_train.npy", y)
splits = load_splits("arrays", path="/data")
```
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Optional

import numpy as np
import tensorflow as tf

from advtrain.data.errors import (
    DataError,
    check_label_count,
    valid_labels,
    warn_skipped,
)
from advtrain.data.sources import DataSplits, hold_out, register_source, require
from advtrain.data.streaming import epochs, read_rows
from advtrain.utils.errors import one_line

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 4 << 20  # read per generator step


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    try:
        with path.open("rb") as f:
            fmt = np.lib.format
            major, _ = fmt.read_magic(f)
            read = (
                fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
            )
            shape, fortran, dtype = read(f)
            return shape, dtype, fortran, f.tell()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror}).") from None
    except ValueError as exc:
        raise DataError(f"{path}: not a .npy file ({one_line(exc)}).") from None


class _Rows:
    # The rows of a .npy file; `rows` of them are complete.

    def __init__(self, path: Path, partial: bool):
        self.path = path
        shape, dtype, fortran, offset = _npy_header(path)
        if dtype.hasobject:
            raise DataError(
                f"{path}: expected a numeric array. Received: dtype={dtype}"
            )
        if not shape:
            raise DataError(
                f"{path}: expected an array of examples. Received: a scalar"
            )
        self.shape, self.dtype, self._offset = shape, dtype, offset
        self._fortran = fortran
        row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        self.row_bytes = max(1, row_bytes)
        size = path.stat().st_size
        complete = (size - offset) // self.row_bytes if row_bytes else shape[0]
        self.rows = min(shape[0], complete)
        if self.rows < shape[0] and not partial:
            expected = offset + shape[0] * row_bytes
            raise DataError(
                f"{path}: truncated .npy: expected {expected} bytes for "
                f"shape {shape} {dtype}. Received: {size}"
            )
        # Opened once the way numpy opens it, which also checks the header.
        self._open()

    def _open(self):
        if self.rows == self.shape[0]:
            return np.load(self.path, mmap_mode="r", allow_pickle=False)
        # Truncated under on_corrupt: skip: map the complete rows only.
        shape, order = (self.rows, *self.shape[1:]), "F" if self._fortran else "C"
        return np.memmap(self.path, self.dtype, "r", self._offset, shape, order)

    def read(self, index: np.ndarray) -> np.ndarray:
        if self._fortran:  # rows are not contiguous on disk
            return np.array(self._open()[index])
        return read_rows(self.path, self._offset, self.shape[1:], self.dtype, index)

    def read_all(self) -> np.ndarray:
        return np.array(self._open())


def _labels(path: Path, partial: bool) -> tuple[np.ndarray, int]:
    rows = _Rows(path, partial)
    y = rows.read_all()
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DataError(
            f"{path}: expected integer labels of shape (N,) or (N, 1). "
            f"Received: {y.dtype} {y.shape}"
        )
    return y.astype(np.int64), rows.shape[0] - rows.rows


class _Part:
    # One x / y pair: image rows on disk, labels in memory, usable indices.

    def __init__(self, x_path: Path, y_path: Path, partial: bool):
        self.x = _Rows(x_path, partial)
        self.y, missing_y = _labels(y_path, partial)
        shape = self.x.shape
        if len(shape) not in (3, 4) or (len(shape) == 4 and shape[3] not in (1, 3, 4)):
            raise DataError(
                f"{x_path}: expected images (N, H, W) or (N, H, W, C) with C "
                f"1, 3 or 4. Received: shape={shape}"
            )
        if not (self.x.dtype == np.uint8 or np.issubdtype(self.x.dtype, np.floating)):
            raise DataError(
                f"{x_path}: expected uint8 or float images. "
                f"Received: dtype={self.x.dtype}"
            )
        check_label_count(x_path, y_path, shape[0], len(self.y) + missing_y)
        n = min(self.x.rows, len(self.y))
        self.index = np.arange(n)
        self.skipped = shape[0] - n
        self.y_path = y_path
        self.image_shape = shape[1:] if len(shape) == 4 else (*shape[1:], 1)

    def drop_out_of_range(self, num_classes: int, partial: bool, name: str):
        y = self.y[self.index]  # all complete rows so far: index == position
        keep = valid_labels(y, num_classes, partial, self.y_path, f" ({name})")
        self.index, self.skipped = self.index[keep], self.skipped + int((~keep).sum())

    def stream(self, index: np.ndarray, shuffle_seed: Optional[int] = None):
        # Unbatched (image, label) at `index`, read a chunk at a time; with
        # `shuffle_seed`, each pass in a fresh seeded order.
        dtype = np.uint8 if self.x.dtype == np.uint8 else np.float32
        chunk = max(1, _CHUNK_BYTES // self.x.row_bytes)

        def generate(epoch_seed):
            order, rng = index, None
            if shuffle_seed is not None:
                rng = np.random.default_rng([shuffle_seed, int(epoch_seed) % 2**63])
                order = rng.permutation(index)
            for start in range(0, len(order), chunk):
                # Sorted reads walk the file forward; then back to random order.
                idx = np.sort(order[start : start + chunk])
                x = self.x.read(idx).astype(dtype, copy=False)
                x, y = x.reshape(-1, *self.image_shape), self.y[idx]
                if rng is not None:
                    perm = rng.permutation(len(idx))
                    x, y = x[perm], y[perm]
                yield x, y

        signature = (
            tf.TensorSpec((None, *self.image_shape), tf.as_dtype(dtype)),
            tf.TensorSpec((None,), tf.int64),
        )

        def epoch(key):
            return tf.data.Dataset.from_generator(
                generate, args=(key,), output_signature=signature
            )

        ds = epochs(epoch, repeat=False, seed=shuffle_seed or 0).unbatch()
        return ds.apply(tf.data.experimental.assert_cardinality(len(index)))


def _layout(path: Path):
    if path.is_dir():
        train = (path / "x_train.npy", path / "y_train.npy")
        test = (path / "x_test.npy", path / "y_test.npy")
        for p in train:
            if not p.is_file():
                raise DataError(
                    f"{path}: expected x_train.npy and y_train.npy (and "
                    f"optionally x_test.npy, y_test.npy). Missing: {p.name}"
                )
        present = [p.is_file() for p in test]
        if any(present) and not all(present):
            missing = test[present.index(False)]
            raise DataError(
                f"{path}: x_test.npy and y_test.npy go together. "
                f"Missing: {missing.name}"
            )
        return train, test if all(present) else None
    pair = (Path(f"{path}_x.npy"), Path(f"{path}_y.npy"))
    if not pair[0].parent.is_dir():
        raise DataError(
            f"{path}: arrays directory not found. Expected a "
            "directory with x_train.npy, y_train.npy or a prefix of "
            "PREFIX_x.npy, PREFIX_y.npy."
        )
    for p in pair:
        if not p.is_file():
            raise DataError(
                f"{p}: not found. Expected the path to be a directory with "
                "x_train.npy, y_train.npy or a prefix of PREFIX_x.npy, "
                "PREFIX_y.npy."
            )
    return pair, None


def _read_parts(path: Path, partial: bool):
    train_paths, test_paths = _layout(path)
    train = _Part(*train_paths, partial)
    num_classes = int(train.y[train.index].max()) + 1 if len(train.index) else 0
    if num_classes < 1:
        raise DataError(f"{train_paths[1]}: expected at least one example.")
    train.drop_out_of_range(num_classes, partial, "labels start at 0")
    test = None
    if test_paths is not None:
        test = _Part(*test_paths, partial)
        if test.x.shape[1:] != train.x.shape[1:]:
            raise DataError(
                f"{test_paths[0]}: expected images of shape "
                f"{train.x.shape[1:]} like {train_paths[0].name}. "
                f"Received: {test.x.shape[1:]}"
            )
        test.drop_out_of_range(
            num_classes, partial, f"classes seen in {train_paths[1].name}"
        )
    return train, test, num_classes


@register_source("arrays")
def arrays_splits(
    *,
    path: Optional[str] = None,
    test_fraction: float = 0.2,
    val_fraction: float = 0.0,
    limit_train: Optional[int] = None,
    limit_test: Optional[int] = None,
    on_corrupt: str = "error",
    seed: int = 0,
) -> DataSplits:
    """Streams `.npy` images from disk; see the module docstring."""
    path = require("arrays", "path", path, "a directory or a file prefix")
    train, test, num_classes = _read_parts(
        Path(path).expanduser(), on_corrupt == "skip"
    )
    keep, val, held = hold_out(
        train.y[train.index],
        test_fraction=test_fraction if test is None else None,
        val_fraction=val_fraction,
        seed=seed,
        val_seed=seed + 1,
    )
    train_index = train.index[keep][:limit_train]
    val_index = None if val is None else train.index[val]
    test_part = train if test is None else test
    test_index = (train.index[held] if test is None else test.index)[:limit_test]
    skipped = train.skipped + (test.skipped if test is not None else 0)
    warn_skipped(logger, "arrays", skipped)
    train_fn = functools.partial(train.stream, train_index, seed)
    return DataSplits(
        train=train_fn(),
        train_fn=train_fn,
        test=test_part.stream(test_index),
        val=None if val_index is None else train.stream(val_index),
        num_classes=num_classes,
        image_shape=train.image_shape,
        train_size=len(train_index),
        test_size=len(test_index),
        val_size=0 if val_index is None else len(val_index),
        skipped=skipped,
    )
