"""GTSRB, the German Traffic Sign Recognition Benchmark, as a TFDS dataset.

Importing this package registers the TFDS builder `gtsrb` (`builder`) and
the source `gtsrb`: train, validation of whole tracks (a track's 30 frames
show one sign), test. The builder downloads the three official archives
(from `$ADVTRAIN_GTSRB_URL` if set) or reads them, or the folders they
extract to, from the TFDS manual directory (`path`); offline without one it
stops within seconds, naming:

```
GTSRB_Final_Training_Images.zip  or  GTSRB/Final_Training/Images/000NN/
GTSRB_Final_Test_Images.zip      or  GTSRB/Final_Test/Images/
GTSRB_Final_Test_GT.zip          or  GT-final_test.csv
```

Example:

```python
import advtrain  # registers "gtsrb"

config = tfds.download.DownloadConfig(manual_dir="/data")
ds = tfds.load("gtsrb/roi_32x32", split="train", data_dir="/tmp/tfds",
               download_and_prepare_kwargs={"download_config": config})
```
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from advtrain.data.errors import DataError
from advtrain.data.gtsrb.builder import (
    CLASS_NAMES,
    URL_ENV,
    Gtsrb,
    GtsrbConfig,
    archives_url,
    gtsrb_config,
    locate_manual_dir,
)
from advtrain.data.gtsrb.rows import NUM_CLASSES
from advtrain.data.sources import DataSplits, register_source, require

logger = logging.getLogger(__name__)

__all__ = [
    "CLASS_NAMES",
    "Gtsrb",
    "GtsrbConfig",
    "NUM_CLASSES",
    "URL_ENV",
    "archives_url",
    "gtsrb_config",
    "gtsrb_splits",
    "locate_manual_dir",
    "prepare_gtsrb",
    "split_by_track",
]


def split_by_track(
    labels: np.ndarray, tracks: np.ndarray, fraction: float, seed: int
) -> np.ndarray:
    """A mask of the examples held out for validation, whole tracks only: in
    each class `round(fraction * tracks)` tracks (at least one when there
    are two or more and `fraction > 0`, never all)."""
    labels, tracks = np.asarray(labels), np.asarray(tracks)
    rng = np.random.default_rng(seed)
    held = np.zeros(len(labels), bool)
    if fraction <= 0:
        return held
    for cls in np.unique(labels):
        in_class = labels == cls
        ids = np.unique(tracks[in_class])
        n = int(round(fraction * len(ids)))
        n = min(max(n, 1 if len(ids) > 1 else 0), len(ids) - 1)
        chosen = rng.permutation(ids)[:n]
        held |= in_class & np.isin(tracks, chosen)
    return held


def prepare_gtsrb(
    *,
    path: Optional[str] = None,
    tfds_data_dir: Optional[str] = None,
    image_size: Optional[tuple[int, int]] = None,
    roi_crop: bool = True,
    on_corrupt: str = "error",
) -> tfds.core.DatasetBuilder:
    """Prepares (once) and returns the GTSRB builder for these options;
    `path` is the TFDS manual directory, else the archives are downloaded."""
    builder = tfds.builder(
        "gtsrb",
        data_dir=tfds_data_dir,
        config=gtsrb_config(roi_crop, image_size),
        on_corrupt=on_corrupt,
    )
    if builder.is_prepared():
        return builder
    manual = None
    if path is not None:
        manual = Path(path).expanduser()
        # Checked here: TFDS would take a missing manual dir as "download".
        locate_manual_dir(manual)
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=manual)
    )
    return builder


def _skipped(builder, on_corrupt: str) -> int:
    skipped = int((builder.info.metadata or {}).get("skipped", 0))
    if skipped and on_corrupt == "error":
        raise DataError(
            f"{builder.data_dir}: prepared with on_corrupt: skip ({skipped} "
            "example(s) left out); on_corrupt: error expects every example. "
            "Delete that folder to prepare it again."
        )
    if skipped:
        logger.warning(
            "gtsrb: %d corrupt example(s) were left out when the data set was "
            "prepared (on_corrupt: skip).",
            skipped,
        )
    return skipped


def _labels_and_tracks(builder) -> tuple[np.ndarray, np.ndarray]:
    """The training labels and track ids, without decoding the images."""
    keys = builder.as_dataset(
        split="train",
        decoders=tfds.decode.PartialDecoding({"label": True, "track": True}),
    )
    batches = list(keys.batch(8192).as_numpy_iterator())
    if not batches:
        return np.zeros(0, np.int64), np.zeros(0, np.int32)
    return tuple(
        np.concatenate([b[key] for b in batches]) for key in ("label", "track")
    )


def _train_by_track(builder, held_keys: np.ndarray, want_held: bool):
    """The training examples whose (label, track) key is (or is not) held."""
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(held_keys, tf.int64), tf.ones(len(held_keys), tf.int64)
        ),
        default_value=0,
    )

    def keep(ex):
        key = tf.cast(ex["label"], tf.int64) * 100_000 + tf.cast(ex["track"], tf.int64)
        return tf.equal(table.lookup(key), 1) == want_held

    ds = builder.as_dataset(split="train", shuffle_files=False)
    return ds.filter(keep).map(
        lambda ex: (ex["image"], tf.cast(ex["label"], tf.int64)),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


@register_source("gtsrb")
def gtsrb_splits(
    *,
    path: Optional[str] = None,
    tfds_data_dir: Optional[str] = None,
    image_size: Optional[tuple[int, int]] = None,
    roi_crop: bool = True,
    val_fraction: float = 0.0,
    limit_train: Optional[int] = None,
    limit_test: Optional[int] = None,
    on_corrupt: str = "error",
    seed: int = 0,
) -> DataSplits:
    """GTSRB train / test, with a validation split of whole tracks."""
    image_size = require(
        "gtsrb",
        "image_size",
        image_size,
        "one image size, e.g. image_size: [32, 32] (its images are 15..250 "
        "px and not square)",
    )
    builder = prepare_gtsrb(
        path=path,
        tfds_data_dir=tfds_data_dir,
        image_size=image_size,
        roi_crop=roi_crop,
        on_corrupt=on_corrupt,
    )
    skipped = _skipped(builder, on_corrupt)
    labels, tracks = _labels_and_tracks(builder)
    held = split_by_track(labels, tracks, val_fraction, seed)

    def supervised(split):
        # ClassLabel decodes to int64 already: no extra map per element.
        return builder.as_dataset(split=split, shuffle_files=False, as_supervised=True)

    n_val = int(held.sum())
    if n_val:
        # The key is unique per physical sign: track ids restart per class.
        held_keys = np.unique(labels[held] * 100_000 + tracks[held])
        train = _train_by_track(builder, held_keys, want_held=False)
        val = _train_by_track(builder, held_keys, want_held=True)
    else:
        train, val = supervised("train"), None
    train_size = len(labels) - n_val
    test_size = builder.info.splits["test"].num_examples
    if limit_train is not None and limit_train < train_size:
        train, train_size = train.take(limit_train), limit_train
    test = supervised("test")
    if limit_test is not None and limit_test < test_size:
        test, test_size = test.take(limit_test), limit_test
    return DataSplits(
        train=train,
        test=test,
        val=val,
        num_classes=NUM_CLASSES,
        image_shape=(*image_size, 3),
        train_size=train_size,
        test_size=test_size,
        val_size=n_val,
        class_names=list(CLASS_NAMES),
        skipped=skipped,
    )
