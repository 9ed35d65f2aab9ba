"""Shuffle, augment, batch, cache and prefetch in tf.data on the host CPU,
so the device never waits; without TensorFlow, `Examples` batched by numpy.
"""

from __future__ import annotations

from typing import Any, Optional

from advtrain.data.batches import ArrayBatches, Examples
from advtrain.data.errors import tensorflow_or_none

tf = tensorflow_or_none()

# Sources whose whole (decoded) data fits in host memory.
_BOUNDED_SOURCES = ("digits", "mnist", "gtsrb")

# The data options `make_input` takes besides its own arguments.
INPUT_OPTIONS = (
    "seed",
    "shuffle_buffer",
    "cache",
    "deterministic",
    "augment",
    "source",
)
AUGMENT_DEFAULTS = {
    "random_crop_pad": 0,
    "brightness": 0.0,
    "contrast": 0.0,
    "horizontal_flip": False,
}


def to_unit_pixels(image, label):
    """uint8 0..255 -> float32 0..1; float images are taken as [0, 1]."""
    return tf.image.convert_image_dtype(image, tf.float32), label


def resize_pixels(image, size):
    """uint8 `image` resized to `size` (height, width), antialiased."""
    image = tf.image.resize(image, size, antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)


def augment_options(augment: Any) -> dict[str, Any]:
    """The augmentation settings, defaults filled in (None: none)."""
    augment = dict(augment or {})
    unknown = sorted(set(augment) - set(AUGMENT_DEFAULTS))
    if unknown:
        raise TypeError(
            f"augment: expected keys {', '.join(AUGMENT_DEFAULTS)}. "
            f"Received: {unknown[0]}={augment[unknown[0]]!r}"
        )
    return {**AUGMENT_DEFAULTS, **augment}


def has_augmentation(augment: Any) -> bool:
    """Whether `augment` (a dict of `AUGMENT_DEFAULTS` keys) changes images."""
    return any(augment_options(augment).values())


def _augment(*, random_crop_pad, brightness, contrast, horizontal_flip):
    def apply(element, seed):
        image, label = element
        seeds = tf.random.experimental.stateless_split(seed, num=4)
        if random_crop_pad:
            shape, pad = tf.shape(image), random_crop_pad
            image = tf.image.pad_to_bounding_box(
                image, pad, pad, shape[0] + 2 * pad, shape[1] + 2 * pad
            )
            image = tf.image.stateless_random_crop(image, shape, seed=seeds[0])
        if brightness:
            image = tf.image.stateless_random_brightness(
                image, brightness, seed=seeds[1]
            )
        if contrast:
            image = tf.image.stateless_random_contrast(
                image, 1.0 - contrast, 1.0 + contrast, seed=seeds[2]
            )
        if horizontal_flip:
            image = tf.image.stateless_random_flip_left_right(image, seed=seeds[3])
        return tf.clip_by_value(image, 0.0, 1.0), label

    return apply


def cache_mode(cache: str = "auto", source: Optional[str] = None) -> str:
    """`cache` with "auto" resolved: "memory" for the sources of bounded
    size (digits, mnist, gtsrb), else "none"."""
    if cache == "auto":
        return "memory" if source in _BOUNDED_SOURCES else "none"
    return cache


# A shuffle buffer holds whole decoded examples: 10,000 images of 224 px
# would pin 1.5 GB, so the buffer is capped by bytes as well as count.
_SHUFFLE_BYTES = 256 << 20


def _shuffle_buffer(ds: tf.data.Dataset, requested: int) -> int:
    spec = ds.element_spec[0]
    if requested <= 1 or not spec.shape.is_fully_defined():
        return requested
    example_bytes = max(1, spec.shape.num_elements() * spec.dtype.size)
    return max(1, min(requested, _SHUFFLE_BYTES // example_bytes))


def make_input(
    ds: Any,
    *,
    batch_size: int,
    training: bool,
    seed: int = 0,
    shuffle_buffer: int = 10_000,
    cache: str = "auto",
    deterministic: bool = False,
    augment: Optional[dict[str, Any]] = None,
    source: Optional[str] = None,
) -> Any:
    """Batches `ds` with the global batch size, ready for `Model.fit`.

    Args:
        ds: unbatched `(image, label)`: a `tf.data.Dataset`, or `Examples`,
            batched as `ArrayBatches` (in memory, shuffled whole: `cache`,
            `shuffle_buffer` and `deterministic` do not apply).
        batch_size: the global batch; a strategy splits it across replicas.
        training: shuffle, augment and drop the last partial batch.
        seed: shuffle and augmentation seed.
        shuffle_buffer, deterministic: tf.data's shuffle buffer (capped at
            256 MiB) and, when training, `Options.deterministic`.
        cache: "auto" keeps the elements in memory when `source` is one of
            bounded size (`cache_mode`), "memory", "none" or a file path.
        augment: None, or a dict of `AUGMENT_DEFAULTS` keys, when `training`.

    Example:

    ```python
    train = make_input(load_splits("digits").train, batch_size=128,
                       training=True, augment={"brightness": 0.1})
    ```
    """
    augment = augment_options(augment)
    if isinstance(ds, Examples):
        return ArrayBatches(
            ds, batch_size=batch_size, training=training, seed=seed, augment=augment
        )
    options = tf.data.Options()
    options.deterministic = deterministic or not training
    ds = ds.with_options(options)
    # Cache the raw (often uint8) elements: 4x smaller than float pixels.
    cache = cache_mode(cache, source)
    if cache != "none":
        ds = ds.cache("" if cache == "memory" else cache)
    buffer = _shuffle_buffer(ds, shuffle_buffer)
    if training and buffer > 1:
        ds = ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
    if training and any(augment.values()):
        ds = ds.map(to_unit_pixels, num_parallel_calls=tf.data.AUTOTUNE)
        # One seed pair per element, drawn afresh each epoch: parallel map
        # order cannot change which image gets which augmentation.
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
        ds = tf.data.Dataset.zip((ds, seeds.batch(2))).map(
            _augment(**augment), num_parallel_calls=tf.data.AUTOTUNE
        )
        ds = ds.batch(batch_size, drop_remainder=True)
    else:
        # Convert whole batches in one op: per-element work limits tf.data.
        ds = ds.batch(batch_size, drop_remainder=training)
        ds = ds.map(to_unit_pixels, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def make_replica_input(
    ds: Any,
    input_context: Any,
    *,
    global_batch: int,
    training: bool,
    seed: int = 0,
    **input_options: Any,
) -> tf.data.Dataset:
    """The dataset of one input pipeline: its shard, per-replica batches.

    `ds` may be a function that builds the dataset (each worker builds its
    own); the pipeline id is folded into `seed`; `**input_options` go to
    `make_input`.

    Raises:
        ValueError: if `global_batch` does not split evenly over replicas.
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
    return make_input(
        ds,
        batch_size=per_replica,
        training=training,
        seed=seed + 1_000_003 * input_context.input_pipeline_id,
        **input_options,
    )


def make_distributed_input(
    ds_or_fn: Any,
    strategy: Any,
    *,
    global_batch: int,
    training: bool,
    seed: int = 0,
    repeat: bool = False,
    skip_steps: int = 0,
    **input_options: Any,
) -> Any:
    """Feeds every replica its own examples, batched per replica.

    Each input pipeline (one per worker) keeps every n-th example and
    batches with `global_batch / replicas`, so no two replicas see the same
    example in a step. `repeat` repeats each pipeline; `skip_steps` drops
    the first steps' batches (how a resumed run starts where it stopped).

    Example:

    ```python
    dist = make_distributed_input(splits.train, strategy, global_batch=256,
                                  training=True)
    ```
    """

    def dataset_fn(input_context: tf.distribute.InputContext):
        ds = make_replica_input(
            ds_or_fn,
            input_context,
            global_batch=global_batch,
            training=training,
            seed=seed,
            **input_options,
        )
        if repeat:
            ds = ds.repeat()
        # Each pipeline feeds its local replicas one batch each per step.
        local = input_context.num_replicas_in_sync // input_context.num_input_pipelines
        return ds.skip(skip_steps * local) if skip_steps else ds

    return strategy.distribute_datasets_from_function(dataset_fn)
