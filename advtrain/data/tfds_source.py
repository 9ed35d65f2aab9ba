"""Source `tfds`: any TFDS image classification dataset, by `tfds_name`.

Prepared once into `tfds_data_dir` (`path`: the TFDS manual directory),
with supervised keys `(image, label)`. Validation is the first
`val_fraction` of `train`; without a `test` split, test is the last
`test_fraction` of `train`. `image_size` resizes (antialiased).
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Optional

import tensorflow as tf
import tensorflow_datasets as tfds

from advtrain.data.errors import DataArgumentError, DataError
from advtrain.data.pipeline import resize_pixels
from advtrain.data.sources import DataSplits, register_source, require
from advtrain.utils.downloads import check_reachable
from advtrain.utils.errors import one_line


def prepare_tfds(
    name: str, *, path: Optional[str] = None, tfds_data_dir: Optional[str] = None
) -> tfds.core.DatasetBuilder:
    """Downloads and prepares TFDS dataset `name` once; returns its builder
    (a one-line `DataError` for an unknown name or a failed download)."""
    try:
        builder = tfds.builder(name, data_dir=tfds_data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise DataArgumentError(
            "tfds_name", f"unknown TFDS dataset. Received: tfds_name={name!r}"
        ) from None
    manual = None if path is None else str(Path(path).expanduser())
    try:
        if not builder.is_prepared():
            # Fail in seconds where a host is unreachable (TFDS retries each
            # URL for minutes): one URL per host of its registered checksums.
            hosts = {}
            for url in builder.url_infos or {}:
                hosts.setdefault(urllib.parse.urlsplit(url).netloc, url)
            for url in hosts.values():
                check_reachable(url)
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(manual_dir=manual)
        )
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 (network, disk, TFDS errors)
        hint = (
            " Offline? Use source mnist with path set to the IDX files' folder."
            if (name == "mnist")
            else " Offline? Prepare it on a machine with network and copy "
            f"{builder.data_dir} to the same path here (tfds_data_dir), "
            "or put the files TFDS expects in the folder given as path "
            "(manual_dir)."
        )
        raise DataError(
            f"tfds {name}: could not download or prepare into "
            f"{builder.data_dir} ({type(exc).__name__}: {one_line(exc)})."
            f"{hint}"
        ) from None
    return builder


def _class_label(name: str, info: tfds.core.DatasetInfo):
    if info.supervised_keys is None or len(info.supervised_keys) != 2:
        raise DataArgumentError(
            "tfds_name", f"{name} has no (image, label) supervised keys."
        )
    image_key, label_key = info.supervised_keys
    label = info.features[label_key]
    if getattr(label, "num_classes", None) is None:
        raise DataArgumentError(
            "tfds_name",
            f"{name} labels are not class labels. Received: {type(label).__name__}",
        )
    return image_key, label


@register_source("tfds")
def tfds_splits(
    *,
    tfds_name: Optional[str] = None,
    path: Optional[str] = None,
    tfds_data_dir: Optional[str] = None,
    image_size: Optional[tuple[int, int]] = None,
    test_fraction: float = 0.2,
    val_fraction: float = 0.0,
    limit_train: Optional[int] = None,
    limit_test: Optional[int] = None,
) -> DataSplits:
    """TFDS dataset `tfds_name`; see the module docstring."""
    name = require("tfds", "tfds_name", tfds_name, "a TFDS dataset name, e.g. mnist")
    builder = prepare_tfds(name, path=path, tfds_data_dir=tfds_data_dir)
    info = builder.info
    image_key, label = _class_label(name, info)
    n_train = info.splits["train"].num_examples
    if "test" in info.splits:
        test_spec, n_test = "test", info.splits["test"].num_examples
        train_end = n_train
    else:
        n_test = int(round(n_train * test_fraction))
        train_end = n_train - n_test
        test_spec = f"train[{train_end}:]"
    n_val = int(round(train_end * val_fraction))
    n_fit = train_end - n_val
    if limit_train is not None:
        n_fit = min(n_fit, limit_train)
    if limit_test is not None:
        n_test = min(n_test, limit_test)

    image_shape = tuple(info.features[image_key].shape)
    if image_size is not None:
        image_shape = (*image_size, image_shape[-1])

    def convert(x, y):
        if image_size is not None:
            x = resize_pixels(x, image_size)
        return x, tf.cast(y, tf.int64)

    def load(split):
        ds = builder.as_dataset(split=split, as_supervised=True)
        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    return DataSplits(
        train=load(f"train[{n_val}:{n_val + n_fit}]"),
        test=load(test_spec).take(n_test),
        val=load(f"train[:{n_val}]") if n_val else None,
        num_classes=int(label.num_classes),
        image_shape=image_shape,
        train_size=n_fit,
        test_size=n_test,
        val_size=n_val,
        class_names=list(getattr(label, "names", []) or []) or None,
    )
