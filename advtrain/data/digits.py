"""scikit-learn's 1,797 real 8x8 handwritten digits (ships with the install)."""

from __future__ import annotations

import numpy as np

from advtrain.config import DataConfig
from advtrain.data.arrays import splits_from_arrays, stratified_split
from advtrain.data.sources import register_source


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Returns images (N, 8, 8, 1) float32 in [0, 1] and int64 labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    # Pixel values are 0..16 in this data set.
    images = (bunch.images.astype(np.float32) / 16.0)[..., None]
    return images, bunch.target.astype(np.int64)


@register_source("digits")
def digits_splits(cfg: DataConfig):
    images, labels = load_digits_arrays()
    train_idx, test_idx = stratified_split(labels, cfg.test_fraction, seed=1234)
    return splits_from_arrays(
        (images[train_idx], labels[train_idx]),
        (images[test_idx], labels[test_idx]),
        cfg,
        num_classes=10,
        class_names=[str(i) for i in range(10)],
    )
