"""Source `folder`: your own images, one folder per class.

`path` is `root/train/<class>/*.png|jpg|jpeg` with `root/test/<class>/...`
(a subset of the classes), or `root/<class>/...` with `test_fraction` held
out; classes are the sorted folder names. Images are decoded in tf.data and
resized to `image_size` (default: the first image's size); grayscale stays
one channel, RGBA drops alpha. A truncated file fails at load, by name.

Example:

```python
splits = load_splits("folder", path="/data/signs", image_size=(64, 64))
```
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import numpy as np
import tensorflow as tf

from advtrain.data.errors import DataError, warn_skipped
from advtrain.data.pipeline import resize_pixels
from advtrain.data.sources import DataSplits, hold_out, register_source, require

logger = logging.getLogger(__name__)

EXTENSIONS = (".png", ".jpg", ".jpeg")
_PNG = b"\x89PNG\r\n\x1a\n"


def _check_image_file(path: Path) -> Optional[str]:
    # What is wrong with a PNG / JPEG file, or None: its signature and the
    # end marker (PNG IEND, JPEG EOI) a truncated file lacks.
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            f.seek(max(0, size - 1024))
            tail = f.read()
    except OSError as exc:
        return f"cannot read ({exc.strerror})"
    if size == 0:
        return "empty file: expected a PNG or JPEG image"
    if head.startswith(_PNG):
        return None if b"IEND" in tail else "truncated PNG: no IEND chunk"
    if head.startswith(b"\xff\xd8\xff"):
        return None if b"\xff\xd9" in tail else "truncated JPEG: no EOI marker"
    return f"not a PNG or JPEG image. Received: first bytes {head[:8]!r}"


def _class_dirs(root: Path) -> list[Path]:
    return sorted(
        p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
    )


def _list_tree(root: Path, class_names: list[str], shown_root: Path, partial: bool):
    paths, labels, skipped = [], [], 0
    index = {name: i for i, name in enumerate(class_names)}
    for folder in _class_dirs(root):
        if folder.name not in index:
            message = (
                f"{folder.relative_to(shown_root)}: class not in the training "
                f"classes (label out of range). Expected one of: "
                f"{', '.join(class_names)}"
            )
            if not partial:
                raise DataError(message)
            n = sum(1 for p in folder.iterdir() if p.suffix.lower() in EXTENSIONS)
            logger.warning("folder: skipping %d image(s): %s", n, message)
            skipped += n
            continue
        for path in sorted(folder.iterdir()):
            if path.suffix.lower() not in EXTENSIONS or not path.is_file():
                continue
            problem = _check_image_file(path)
            if problem is not None:
                message = f"{path.relative_to(shown_root)}: {problem}"
                if not partial:
                    raise DataError(message)
                logger.warning("folder: skipping %s", message)
                skipped += 1
                continue
            paths.append(str(path))
            labels.append(index[folder.name])
    return paths, labels, skipped


def _decoder(channels: int, size: tuple[int, int]):
    def load(path, label):
        image = tf.io.decode_image(
            tf.io.read_file(path), channels=channels, expand_animations=False
        )
        image.set_shape([None, None, channels])
        same = tf.reduce_all(tf.equal(tf.shape(image)[:2], size))
        image = tf.cond(same, lambda: image, lambda: resize_pixels(image, size))
        image.set_shape([*size, channels])
        return image, label

    return load


def _read_trees(root: Path, partial: bool):
    if not root.is_dir():
        raise DataError(
            f"{root}: image directory not found. Expected "
            "root/train/<class>/*.png or root/<class>/*.png."
        )
    train_root = root / "train" if (root / "train").is_dir() else root
    test_root = root / "test" if train_root != root else None
    class_names = [p.name for p in _class_dirs(train_root)]
    if not class_names:
        raise DataError(
            f"{train_root}: expected one folder per class "
            "(root/train/<class>/*.png or root/<class>/*.png). Received: none"
        )
    paths, labels, skipped = _list_tree(train_root, class_names, root, partial)
    if not paths:
        raise DataError(
            f"{train_root}: expected {', '.join(EXTENSIONS)} images in the "
            "class folders. Received: none"
        )
    test = None
    if test_root is not None and test_root.is_dir():
        test_paths, test_labels, n = _list_tree(test_root, class_names, root, partial)
        skipped += n
        test = (np.array(test_paths), np.array(test_labels, np.int64))
    train = (np.array(paths), np.array(labels, np.int64))
    return class_names, train, test, skipped


def _image_format(root: Path, first: str, image_size) -> tuple[int, tuple[int, int]]:
    try:
        image = tf.io.decode_image(tf.io.read_file(first), expand_animations=False)
    except tf.errors.OpError as exc:
        raise DataError(
            f"{Path(first).relative_to(root)}: cannot decode image "
            f"({exc.message.splitlines()[0]})."
        ) from None
    channels = 1 if image.shape[-1] in (1, 2) else 3
    size = tuple(image_size or image.shape[:2])
    if image_size is None:
        logger.info(
            "folder: images resized to %dx%d, the size of %s "
            "(set image_size to choose).",
            *size,
            first,
        )
    return channels, size


@register_source("folder")
def folder_splits(
    *,
    path: Optional[str] = None,
    image_size: Optional[tuple[int, int]] = None,
    test_fraction: float = 0.2,
    val_fraction: float = 0.0,
    limit_train: Optional[int] = None,
    limit_test: Optional[int] = None,
    on_corrupt: str = "error",
    seed: int = 0,
) -> DataSplits:
    """Class-per-folder images; see the module docstring."""
    root = Path(require("folder", "path", path, "an image directory")).expanduser()
    partial = on_corrupt == "skip"
    class_names, (paths, labels), test, skipped = _read_trees(root, partial)
    train, val, held = hold_out(
        labels,
        test_fraction=test_fraction if test is None else None,
        val_fraction=val_fraction,
        seed=seed,
        val_seed=seed + 1,
    )
    if test is None:
        test = (paths[held], labels[held])
    if val is not None:
        val = (paths[val], labels[val])
    # Class folders are listed in order; mix them once so a shuffle buffer
    # smaller than the data set still sees every class.
    train = train[np.random.default_rng(seed).permutation(len(train))]
    train = (paths[train][:limit_train], labels[train][:limit_train])
    test = (test[0][:limit_test], test[1][:limit_test])
    channels, size = _image_format(root, paths[0], image_size)
    load = _decoder(channels, size)

    def to_ds(pair):
        ds = tf.data.Dataset.from_tensor_slices(pair)
        ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE)
        if partial:
            # Damage the header check cannot see fails in the decoder.
            ds = ds.ignore_errors(log_warning=True)
        return ds

    warn_skipped(logger, "folder", skipped, "image")
    return DataSplits(
        train=to_ds(train),
        test=to_ds(test),
        val=None if val is None else to_ds(val),
        num_classes=len(class_names),
        image_shape=(*size, channels),
        train_size=len(train[1]),
        test_size=len(test[1]),
        val_size=0 if val is None else len(val[1]),
        class_names=class_names,
        skipped=skipped,
    )
