"""scikit-learn's 1,797 real 8x8 handwritten digits (ships with the install)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from advtrain.data.sources import (
    DataSplits,
    register_source,
    splits_from_arrays,
    stratified_split,
)


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Returns images (N, 8, 8, 1) float32 in [0, 1] and int64 labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    # Pixel values are 0..16 in this data set.
    images = (bunch.images.astype(np.float32) / 16.0)[..., None]
    return images, bunch.target.astype(np.int64)


@register_source("digits")
def digits_splits(
    *,
    test_fraction: float = 0.2,
    val_fraction: float = 0.0,
    limit_train: Optional[int] = None,
    limit_test: Optional[int] = None,
    seed: int = 0,
) -> DataSplits:
    """The digits, `test_fraction` held out as test (always the same split)."""
    images, labels = load_digits_arrays()
    train_idx, test_idx = stratified_split(labels, test_fraction, seed=1234)
    return splits_from_arrays(
        (images[train_idx], labels[train_idx]),
        (images[test_idx], labels[test_idx]),
        num_classes=10,
        class_names=[str(i) for i in range(10)],
        val_fraction=val_fraction,
        limit_train=limit_train,
        limit_test=limit_test,
        seed=seed,
    )
