"""Shuffle, augment, batch, cache and prefetch, off the device's path."""

from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow as tf

from advtrain.config import DataConfig


@dataclasses.dataclass
class DataSplits:
    """Unbatched `(image, label)` datasets and what the model needs to know."""

    train: tf.data.Dataset
    test: tf.data.Dataset
    val: Optional[tf.data.Dataset]
    num_classes: int
    image_shape: tuple[int, int, int]
    train_size: int
    test_size: int
    val_size: int = 0
    class_names: Optional[list[str]] = None


def load_splits(cfg: DataConfig) -> DataSplits:
    """Loads the source the recipe's `data.source` names."""
    # Importing the modules registers their sources.
    from advtrain.data import digits  # noqa: F401
    from advtrain.data.sources import sources

    return sources.get(cfg.source)(cfg)


def to_unit_pixels(image, label):
    """uint8 0..255 -> float32 0..1; float images are taken as [0, 1]."""
    return tf.image.convert_image_dtype(image, tf.float32), label


def _augment(cfg: DataConfig):
    aug = cfg.augment

    def apply(image, label):
        if aug.random_crop_pad:
            shape = tf.shape(image)
            pad = aug.random_crop_pad
            image = tf.image.pad_to_bounding_box(
                image, pad, pad, shape[0] + 2 * pad, shape[1] + 2 * pad
            )
            image = tf.image.random_crop(image, shape)
        if aug.brightness:
            image = tf.image.random_brightness(image, aug.brightness)
        if aug.contrast:
            image = tf.image.random_contrast(
                image, 1.0 - aug.contrast, 1.0 + aug.contrast
            )
        if aug.horizontal_flip:
            image = tf.image.random_flip_left_right(image)
        return tf.clip_by_value(image, 0.0, 1.0), label

    return apply


def _has_augmentation(cfg: DataConfig) -> bool:
    aug = cfg.augment
    return bool(
        aug.random_crop_pad or aug.brightness or aug.contrast
        or aug.horizontal_flip
    )


def make_input(
    ds: tf.data.Dataset,
    cfg: DataConfig,
    *,
    batch_size: int,
    training: bool,
    seed: Optional[int] = None,
) -> tf.data.Dataset:
    """Batches `ds` with the global batch size, ready for `Model.fit`.

    Args:
        ds: unbatched `(image, label)` elements.
        cfg: the recipe's data section (cache, shuffle, augmentation).
        batch_size: the global batch; a strategy splits it across replicas.
        training: shuffle, augment and drop the last partial batch.
        seed: shuffle seed; defaults to `cfg.seed`.
    """
    options = tf.data.Options()
    options.deterministic = cfg.deterministic or not training
    ds = ds.with_options(options)
    # Cache the raw (often uint8) elements: 4x smaller than float pixels.
    if cfg.cache == "memory":
        ds = ds.cache()
    elif cfg.cache != "none":
        ds = ds.cache(cfg.cache)
    if training and cfg.shuffle_buffer > 1:
        ds = ds.shuffle(
            cfg.shuffle_buffer,
            seed=cfg.seed if seed is None else seed,
            reshuffle_each_iteration=True,
        )
    ds = ds.map(to_unit_pixels, num_parallel_calls=tf.data.AUTOTUNE)
    if training and _has_augmentation(cfg):
        ds = ds.map(_augment(cfg), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(batch_size, drop_remainder=training)
    return ds.prefetch(tf.data.AUTOTUNE)
