"""Source `mnist`: the four original IDX files (plain or `.gz`) in `path`,
or TFDS `mnist` (downloaded once into `tfds_data_dir`) without `path`.
"""

from __future__ import annotations

import logging
import zlib
from pathlib import Path
from typing import Optional, Union

import numpy as np

from advtrain import backend
from advtrain.data.errors import (
    DataError,
    check_label_count,
    needs_tensorflow,
    valid_labels,
    warn_skipped,
)
from advtrain.data.sources import DataSplits, register_source, splits_from_arrays

logger = logging.getLogger(__name__)

FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
# IDX type codes 0x08, 0x09, 0x0B..0x0E.
_IDX_TYPES = {8: "u1", 9: "i1", 11: ">i2", 12: ">i4", 13: ">f4", 14: ">f8"}


def _read_bytes(path: Path) -> tuple[bytes, bool]:
    # The (decompressed) bytes and whether they are complete.
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror}).") from None
    if path.suffix != ".gz":
        return raw, True
    # A decompressobj returns what a truncated stream holds instead of
    # raising, so on_corrupt: skip can keep the complete records.
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(raw)
    except zlib.error as exc:
        raise DataError(f"{path}: not a readable gzip file ({exc}).") from None
    return data, inflater.eof


def _read_idx(path: Path, partial: bool) -> tuple[np.ndarray, int]:
    # The complete records and the count the header declares. IDX: two zero
    # bytes, a type code, the number of dimensions, one big-endian uint32
    # per dimension, then the raw values.
    data, complete = _read_bytes(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise DataError(
            f"{path}: not an IDX file: expected magic 00 00 <type> <ndim>. "
            f"Received: {data[:4].hex(' ') or 'empty file'}"
        )
    dtype, ndim = np.dtype(_IDX_TYPES[data[2]]), data[3]
    offset = 4 + 4 * ndim
    if ndim < 1 or len(data) < offset:
        raise DataError(f"{path}: truncated IDX header ({ndim} dimensions).")
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    record = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    have = (len(data) - offset) // record if record else shape[0]
    n = min(have, shape[0])
    if (not complete or have < shape[0]) and not partial:
        reason = "gzip stream ends early" if not complete else "file ends early"
        raise DataError(
            f"{path}: truncated IDX: expected {shape[0]} records of shape "
            f"{tuple(shape[1:])}, {reason}. Received: {n}"
        )
    array = np.frombuffer(
        data, dtype, count=n * record // dtype.itemsize, offset=offset
    )
    return array.reshape([n, *shape[1:]]).astype(dtype.newbyteorder("=")), shape[0]


def read_idx(path: Union[str, Path]) -> np.ndarray:
    """Reads an IDX file (plain or .gz); a `DataError` if it is not whole."""
    return _read_idx(Path(path), partial=False)[0]


def _find(directory: Path, name: str) -> Path:
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise DataError(f"{directory}: expected {name} or {name}.gz (MNIST IDX files).")


def _load_split(directory: Path, split: str, partial: bool):
    images_path, labels_path = (_find(directory, name) for name in FILES[split])
    images, n_images = _read_idx(images_path, partial)
    labels, n_labels = _read_idx(labels_path, partial)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise DataError(
            f"{images_path}: expected uint8 images of shape (N, rows, cols). "
            f"Received: {images.dtype} {images.shape}"
        )
    if labels.ndim != 1:
        raise DataError(
            f"{labels_path}: expected labels of shape (N,). Received: {labels.shape}"
        )
    check_label_count(images_path, labels_path, n_images, n_labels)
    n = min(len(images), len(labels))
    images, labels = images[:n], labels[:n].astype(np.int64)
    keep = valid_labels(labels, 10, partial, labels_path)
    images, labels = images[keep], labels[keep]
    skipped = n_images - len(labels)
    warn_skipped(logger, f"mnist {split}", skipped)
    return images[..., None], labels, skipped


def load_mnist_idx(
    directory: Union[str, Path], on_corrupt: str = "error"
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], int]:
    """({"train": (images, labels), "test": ...}, skipped) from the four
    IDX files in `directory`: uint8 `(N, 28, 28, 1)` images, int64 labels;
    `skipped` counts records left out under `on_corrupt="skip"`."""
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise DataError(
            f"{directory}: MNIST directory not found. Expected "
            "the four IDX files there."
        )
    out, skipped = {}, 0
    for split in FILES:
        images, labels, n_skipped = _load_split(directory, split, on_corrupt == "skip")
        out[split] = (images, labels)
        skipped += n_skipped
    return out, skipped


@register_source("mnist")
def mnist_splits(
    *,
    path: Optional[str] = None,
    tfds_data_dir: Optional[str] = None,
    image_size: Optional[tuple[int, int]] = None,
    test_fraction: float = 0.2,
    val_fraction: float = 0.0,
    limit_train: Optional[int] = None,
    limit_test: Optional[int] = None,
    on_corrupt: str = "error",
    seed: int = 0,
) -> DataSplits:
    """MNIST from IDX files in `path`, else TFDS `mnist` (in `tfds_data_dir`,
    resized to `image_size` when set)."""
    held_out = dict(
        val_fraction=val_fraction, limit_train=limit_train, limit_test=limit_test
    )
    if path is None:
        if not backend.HAS_TENSORFLOW:
            raise needs_tensorflow("mnist from TFDS (no path given)", "path=None")
        from advtrain.data.tfds_source import tfds_splits

        return tfds_splits(
            tfds_name="mnist",
            tfds_data_dir=tfds_data_dir,
            image_size=image_size,
            test_fraction=test_fraction,
            **held_out,
        )
    arrays, skipped = load_mnist_idx(path, on_corrupt)
    splits = splits_from_arrays(
        arrays["train"],
        arrays["test"],
        num_classes=10,
        class_names=[str(i) for i in range(10)],
        seed=seed,
        **held_out,
    )
    splits.skipped = skipped
    return splits
