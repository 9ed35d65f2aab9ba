"""Source `tfds`: any TFDS image classification dataset, by `data.tfds_name`.

The dataset is downloaded and prepared once into `data.tfds_data_dir`;
`data.path` is passed as the TFDS manual directory for datasets that need
one. It must have supervised keys `(image, label)`. The validation split is
the first `val_fraction` of `train` (TFDS shuffles records when preparing);
a dataset without a `test` split gives the last `test_fraction` of `train`.
Without network, the download stops within seconds (a quick check of the
hosts in the dataset's registered checksums) instead of TFDS's minutes of
retries. With `data.image_size`, images are resized in tf.data
(antialiased) so datasets of mixed sizes batch.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import tensorflow as tf
import tensorflow_datasets as tfds

from advtrain.config import DataConfig, RecipeError
from advtrain.data.pipeline import DataSplits
from advtrain.data.sources import register_source
from advtrain.downloads import check_reachable


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _check_hosts(builder: tfds.core.DatasetBuilder) -> None:
    """Fails in seconds if a host the dataset downloads from is unreachable.

    TFDS retries each URL for minutes. The URLs are those in the dataset's
    registered checksums; a dataset without them is left to TFDS.
    """
    hosts = {}
    for url in builder.url_infos or {}:
        hosts.setdefault(urllib.parse.urlsplit(url).netloc, url)
    for url in hosts.values():
        check_reachable(url)


def load_tfds_splits(name: str, cfg: DataConfig) -> DataSplits:
    """Prepares TFDS dataset `name` and returns its DataSplits."""
    try:
        builder = tfds.builder(name, data_dir=cfg.tfds_data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise RecipeError(
            f"data.tfds_name: unknown TFDS dataset. Received: tfds_name={name!r}"
        ) from None
    manual = None if cfg.path is None else str(Path(cfg.path).expanduser())
    try:
        if not builder.is_prepared():
            _check_hosts(builder)
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(manual_dir=manual)
        )
    except RecipeError:
        raise
    except Exception as exc:  # noqa: BLE001 (network, disk, TFDS errors)
        hint = (
            " Offline? Use source mnist with data.path for IDX files."
            if (name == "mnist")
            else " Offline? Prepare it on a machine with network and copy "
            f"{builder.data_dir} to the same path here (data.tfds_data_dir), "
            "or put the files TFDS expects in data.path (manual_dir)."
        )
        raise RecipeError(
            f"tfds {name}: could not download or prepare into "
            f"{builder.data_dir} ({type(exc).__name__}: {_one_line(exc)})."
            f"{hint}"
        ) from None
    info = builder.info
    if info.supervised_keys is None or len(info.supervised_keys) != 2:
        raise RecipeError(
            f"data.tfds_name: {name} has no (image, label) supervised keys."
        )
    image_key, label_key = info.supervised_keys
    label = info.features[label_key]
    num_classes = getattr(label, "num_classes", None)
    if num_classes is None:
        raise RecipeError(
            f"data.tfds_name: {name} labels are not class labels. "
            f"Received: {type(label).__name__}"
        )
    n_train = info.splits["train"].num_examples
    if "test" in info.splits:
        test_spec, n_test = "test", info.splits["test"].num_examples
        train_end = n_train
    else:
        n_test = int(round(n_train * cfg.test_fraction))
        train_end = n_train - n_test
        test_spec = f"train[{train_end}:]"
    n_val = int(round(train_end * cfg.val_fraction))
    n_fit = train_end - n_val
    if cfg.limit_train is not None:
        n_fit = min(n_fit, cfg.limit_train)
    if cfg.limit_test is not None:
        n_test = min(n_test, cfg.limit_test)

    image_shape = tuple(info.features[image_key].shape)
    size = cfg.image_size
    if size is not None:
        image_shape = (*size, image_shape[-1])

    def convert(x, y):
        if size is not None:
            x = tf.image.resize(x, size, antialias=True)
            x = tf.cast(tf.clip_by_value(tf.round(x), 0, 255), tf.uint8)
        return x, tf.cast(y, tf.int64)

    def load(split):
        ds = builder.as_dataset(split=split, as_supervised=True)
        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    test = load(test_spec).take(n_test)
    return DataSplits(
        train=load(f"train[{n_val}:{n_val + n_fit}]"),
        test=test,
        val=load(f"train[:{n_val}]") if n_val else None,
        num_classes=int(num_classes),
        image_shape=image_shape,
        train_size=n_fit,
        test_size=n_test,
        val_size=n_val,
        class_names=list(getattr(label, "names", []) or []) or None,
    )


@register_source("tfds")
def tfds_splits(cfg: DataConfig) -> DataSplits:
    if not cfg.tfds_name:
        raise RecipeError(
            "data.tfds_name: source tfds needs a TFDS dataset name, e.g. "
            "mnist. Received: tfds_name=None"
        )
    return load_tfds_splits(cfg.tfds_name, cfg)
