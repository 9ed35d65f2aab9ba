"""Shuffle, augment, batch, cache and prefetch, off the device's path.

`make_input` turns an unbatched `(image, label)` dataset into batches of
float32 pixels in [0, 1] for `Model.fit`; `make_distributed_input` does the
same per input pipeline under a `tf.distribute` strategy, each pipeline
reading its own shard and batching with the per-replica batch. Decoding,
augmentation and shuffling all run in tf.data on the host CPU, in parallel
(AUTOTUNE), with prefetch so the device never waits on them.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Optional, Union

import tensorflow as tf

from advtrain.config import DataConfig


@dataclasses.dataclass
class DataSplits:
    """Unbatched `(image, label)` datasets and what the model needs to know.

    `skipped` counts corrupt examples left out under `on_corrupt: skip`.
    `train_fn`, for sources that draw their order inside the source (the
    streamed `arrays`), builds a fresh training stream whose epoch orders
    start over; `fresh_train()` returns one (or `train`).
    """

    train: tf.data.Dataset
    test: tf.data.Dataset
    val: Optional[tf.data.Dataset]
    num_classes: int
    image_shape: tuple[int, int, int]
    train_size: int
    test_size: int
    val_size: int = 0
    class_names: Optional[list[str]] = None
    skipped: int = 0
    train_fn: Optional[Callable[[], tf.data.Dataset]] = None

    def fresh_train(self) -> tf.data.Dataset:
        """The training examples, as a stream whose sequence of epochs
        depends only on the seeds: what a resumed run needs."""
        return self.train_fn() if self.train_fn is not None else self.train


# The module that registers each source; imported only when asked for, so
# a recipe on digits never pays for importing tensorflow_datasets.
_SOURCE_MODULES = {
    "digits": "advtrain.data.digits",
    "mnist": "advtrain.data.mnist",
    "gtsrb": "advtrain.data.gtsrb",
    "arrays": "advtrain.data.npy",
    "folder": "advtrain.data.folder",
    "tfds": "advtrain.data.tfds_source",
}

# Sources whose whole (decoded) data fits in host memory.
_BOUNDED_SOURCES = ("digits", "mnist", "gtsrb")


def load_splits(cfg: DataConfig) -> DataSplits:
    """Loads the source the recipe's `data.source` names.

    Raises:
        RecipeError: one line naming the file and what was expected, for a
            missing directory, a wrong layout, or a corrupt example (unless
            `on_corrupt: skip`).
    """
    from advtrain.data.sources import sources

    module = _SOURCE_MODULES.get(cfg.source)
    if module is not None:
        importlib.import_module(module)
    return sources.get(cfg.source)(cfg)


def to_unit_pixels(image, label):
    """uint8 0..255 -> float32 0..1; float images are taken as [0, 1]."""
    return tf.image.convert_image_dtype(image, tf.float32), label


def _augment(cfg: DataConfig):
    """Stateless random ops: the same seed gives the same augmentation."""
    aug = cfg.augment

    def apply(element, seed):
        image, label = element
        seeds = tf.random.experimental.stateless_split(seed, num=4)
        if aug.random_crop_pad:
            shape = tf.shape(image)
            pad = aug.random_crop_pad
            image = tf.image.pad_to_bounding_box(
                image, pad, pad, shape[0] + 2 * pad, shape[1] + 2 * pad
            )
            image = tf.image.stateless_random_crop(image, shape, seed=seeds[0])
        if aug.brightness:
            image = tf.image.stateless_random_brightness(
                image, aug.brightness, seed=seeds[1]
            )
        if aug.contrast:
            image = tf.image.stateless_random_contrast(
                image, 1.0 - aug.contrast, 1.0 + aug.contrast, seed=seeds[2]
            )
        if aug.horizontal_flip:
            image = tf.image.stateless_random_flip_left_right(image, seed=seeds[3])
        return tf.clip_by_value(image, 0.0, 1.0), label

    return apply


def _has_augmentation(cfg: DataConfig) -> bool:
    aug = cfg.augment
    return bool(
        aug.random_crop_pad or aug.brightness or aug.contrast or aug.horizontal_flip
    )


def _cache_mode(cfg: DataConfig) -> str:
    if cfg.cache == "auto":
        return "memory" if cfg.source in _BOUNDED_SOURCES else "none"
    return cfg.cache


# A shuffle buffer holds whole decoded examples: 10,000 images of 224 px
# would pin 1.5 GB, so the buffer is capped by bytes as well as count.
_SHUFFLE_BYTES = 256 << 20


def _shuffle_buffer(ds: tf.data.Dataset, requested: int) -> int:
    image_spec = ds.element_spec[0]
    shape = image_spec.shape
    if requested <= 1 or not shape.is_fully_defined():
        return requested
    example_bytes = max(1, shape.num_elements() * image_spec.dtype.size)
    return max(1, min(requested, _SHUFFLE_BYTES // example_bytes))


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
        seed: shuffle and augmentation seed; defaults to `cfg.seed`.

    Example:

    ```python
    splits = load_splits(cfg)
    train = make_input(splits.train, cfg, batch_size=128, training=True)
    ```
    """
    seed = cfg.seed if seed is None else seed
    options = tf.data.Options()
    options.deterministic = cfg.deterministic or not training
    ds = ds.with_options(options)
    # Cache the raw (often uint8) elements: 4x smaller than float pixels.
    cache = _cache_mode(cfg)
    if cache == "memory":
        ds = ds.cache()
    elif cache != "none":
        ds = ds.cache(cache)
    buffer = _shuffle_buffer(ds, cfg.shuffle_buffer)
    if training and buffer > 1:
        ds = ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
    if training and _has_augmentation(cfg):
        ds = ds.map(to_unit_pixels, num_parallel_calls=tf.data.AUTOTUNE)
        # One seed pair per element, drawn afresh each epoch: parallel map
        # order cannot change which image gets which augmentation.
        seeds = tf.data.Dataset.random(
            seed=seed, rerandomize_each_iteration=True
        ).batch(2)
        ds = tf.data.Dataset.zip((ds, seeds)).map(
            _augment(cfg), num_parallel_calls=tf.data.AUTOTUNE
        )
        ds = ds.batch(batch_size, drop_remainder=training)
    else:
        # Batch the raw pixels, then convert a whole batch in one op:
        # per-element work is what limits a tf.data pipeline.
        ds = ds.batch(batch_size, drop_remainder=training)
        ds = ds.map(to_unit_pixels, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


DatasetOrFn = Union[tf.data.Dataset, Callable[[], tf.data.Dataset]]


def make_replica_input(
    ds: DatasetOrFn,
    cfg: DataConfig,
    input_context: tf.distribute.InputContext,
    *,
    global_batch: int,
    training: bool,
    seed: Optional[int] = None,
) -> tf.data.Dataset:
    """The dataset of one input pipeline: its shard, per-replica batches.

    Args:
        ds: unbatched `(image, label)` elements, or a function that builds
            them (called here, so each worker builds its own pipeline).
        cfg: the recipe's data section.
        input_context: from `strategy.distribute_datasets_from_function`.
        global_batch: the recipe's batch; each replica gets
            `global_batch / num_replicas_in_sync`.
        training: as in `make_input`.
        seed: base seed; each pipeline folds in its id so their
            augmentations differ.

    Raises:
        ValueError: if the global batch does not split evenly.
    """
    replicas = input_context.num_replicas_in_sync
    if global_batch % replicas:
        raise ValueError(
            f"The global batch must be divisible by the {replicas} replicas. "
            f"Received: global_batch={global_batch}"
        )
    per_replica = input_context.get_per_replica_batch_size(global_batch)
    if not isinstance(ds, tf.data.Dataset):
        ds = ds()
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    base = cfg.seed if seed is None else seed
    return make_input(
        ds,
        cfg,
        batch_size=per_replica,
        training=training,
        seed=base + 1_000_003 * input_context.input_pipeline_id,
    )


def make_distributed_input(
    ds_or_fn: DatasetOrFn,
    cfg: DataConfig,
    strategy: tf.distribute.Strategy,
    global_batch: int,
    training: bool,
    seed: Optional[int] = None,
    *,
    repeat: bool = False,
    skip_steps: int = 0,
) -> tf.distribute.DistributedDataset:
    """Feeds every replica its own examples, batched per replica.

    Each input pipeline (one per worker) keeps every n-th example of `ds`
    and batches with `global_batch / replicas`; within a worker the
    strategy hands consecutive batches to its local replicas, so no two
    replicas see the same example in a step. `repeat` repeats each
    pipeline; `skip_steps` drops the first steps' batches (one per local
    replica each), which is how a resumed run starts where it stopped.

    Example:

    ```python
    strategy = tf.distribute.MirroredStrategy()
    dist = make_distributed_input(splits.train, cfg, strategy, 256, True)
    ```
    """

    def dataset_fn(input_context: tf.distribute.InputContext):
        ds = make_replica_input(
            ds_or_fn,
            cfg,
            input_context,
            global_batch=global_batch,
            training=training,
            seed=seed,
        )
        if repeat:
            ds = ds.repeat()
        if skip_steps:
            local = (
                input_context.num_replicas_in_sync // input_context.num_input_pipelines
            )
            ds = ds.skip(skip_steps * local)
        return ds

    return strategy.distribute_datasets_from_function(dataset_fn)
