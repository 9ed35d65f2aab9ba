"""Held-out splits shared by the sources: stratified, seeded, limited.

`hold_out` draws the test and validation indices the sources that have no
split of their own use; `splits_from_arrays` turns in-memory arrays into
`DataSplits` (tf.data where TensorFlow is installed, else `Examples`);
`require` is the one-line error for a missing argument.
"""

from __future__ import annotations

from typing import Optional, TypeVar

import numpy as np

from advtrain.data.batches import Examples
from advtrain.data.errors import DataArgumentError
from advtrain.data.pipeline import DataSplits, tf

T = TypeVar("T")


def require(source: str, argument: str, value: T, what: str) -> T:
    """`value`, unless it is None: then a one-line error naming `argument`."""
    if value is None:
        raise DataArgumentError(
            argument, f"source {source} needs {what}. Received: {argument}=None"
        )
    return value


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


def hold_out(
    labels: np.ndarray,
    *,
    test_fraction: Optional[float] = None,
    val_fraction: float = 0.0,
    seed: int = 0,
    val_seed: Optional[int] = None,
) -> tuple[np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]:
    """Indices (train, val, test) into `labels`, each stratified by class.

    `test_fraction` of the examples is held out first when given (seeded by
    `seed`), then `val_fraction` of the rest (seeded by `val_seed`, default
    `seed`); a split not drawn is None.
    """
    train, val, test = np.arange(len(labels)), None, None
    if test_fraction is not None:
        train, test = stratified_split(labels, test_fraction, seed=seed)
    if val_fraction > 0:
        keep, held = stratified_split(
            labels[train], val_fraction, seed=seed if val_seed is None else val_seed
        )
        train, val = train[keep], train[held]
    return train, val, test


def limit(items: T, n: Optional[int]) -> T:
    """The first `n` of `items` (all when `n` is None)."""
    return items if n is None else items[:n]


def splits_from_arrays(
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    *,
    num_classes: int,
    class_names: Optional[list[str]] = None,
    val_fraction: float = 0.0,
    limit_train: Optional[int] = None,
    limit_test: Optional[int] = None,
    seed: int = 0,
) -> DataSplits:
    """DataSplits from in-memory arrays, holding out `val_fraction` of train."""
    x_train, y_train = train
    val = None
    if val_fraction > 0:
        keep, held, _ = hold_out(y_train, val_fraction=val_fraction, seed=seed)
        val = (x_train[held], y_train[held])
        x_train, y_train = x_train[keep], y_train[keep]
    x_train, y_train = limit(x_train, limit_train), limit(y_train, limit_train)
    x_test, y_test = limit(test[0], limit_test), limit(test[1], limit_test)

    def to_ds(x, y):
        if tf is None:
            return Examples(x, y)
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
