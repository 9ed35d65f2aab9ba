"""In-memory numpy arrays as DataSplits, with seeded stratified splits."""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from advtrain.config import DataConfig
from advtrain.data.pipeline import DataSplits


def stratified_split(
    labels: np.ndarray, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Splits indices so each class keeps `fraction` of its examples aside."""
    rng = np.random.default_rng(seed)
    keep, held = [], []
    for cls in np.unique(labels):
        idx = np.flatnonzero(labels == cls)
        rng.shuffle(idx)
        n_held = int(round(len(idx) * fraction))
        held.append(idx[:n_held])
        keep.append(idx[n_held:])
    return np.sort(np.concatenate(keep)), np.sort(np.concatenate(held))


def _limit(x: np.ndarray, y: np.ndarray, n: Optional[int]):
    return (x, y) if n is None else (x[:n], y[:n])


def splits_from_arrays(
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    cfg: DataConfig,
    num_classes: int,
    class_names: Optional[list[str]] = None,
) -> DataSplits:
    """Builds DataSplits from arrays, holding out `cfg.val_fraction`."""
    x_train, y_train = train
    val = None
    if cfg.val_fraction > 0:
        keep, held = stratified_split(y_train, cfg.val_fraction, seed=cfg.seed)
        val = (x_train[held], y_train[held])
        x_train, y_train = x_train[keep], y_train[keep]
    x_train, y_train = _limit(x_train, y_train, cfg.limit_train)
    x_test, y_test = _limit(*test, cfg.limit_test)

    def to_ds(x, y):
        return tf.data.Dataset.from_tensor_slices((x, y))

    return DataSplits(
        train=to_ds(x_train, y_train),
        test=to_ds(x_test, y_test),
        val=None if val is None else to_ds(*val),
        num_classes=num_classes,
        image_shape=tuple(x_train.shape[1:]),
        train_size=len(y_train),
        test_size=len(y_test),
        val_size=0 if val is None else len(val[1]),
        class_names=class_names,
    )
