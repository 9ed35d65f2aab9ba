"""Datasets of raw pixels and integer labels, batched for `Model.fit`.

`load_splits(source, **options)` returns unbatched train / validation /
test datasets of `(image, label)`: uint8 (0..255) or float32 in [0, 1]
pixels at the dataset's native size and channels; the model does the rest.
`make_input` batches one for training or evaluation, `make_distributed_input`
per replica under a strategy.

Sources: `digits` (scikit-learn's), `mnist` (IDX files or TFDS), `gtsrb`
(a TFDS builder over the official archives), `arrays` (`.npy` files
streamed from disk), `folder` (one folder per class), `tfds` (any TFDS
image classification dataset) and those added with `register_source`.
The datasets are `tf.data` pipelines; without TensorFlow the in-memory
sources (`digits`, `mnist` IDX, `splits_from_arrays`) hold numpy arrays,
batched by numpy, and the others say in one line what to install. With
TensorFlow, importing this package registers the TFDS builder `gtsrb`.
"""

from advtrain.data.errors import DataError, tensorflow_or_none
from advtrain.data.pipeline import (
    AUGMENT_DEFAULTS,
    INPUT_OPTIONS,
    cache_mode,
    has_augmentation,
    make_distributed_input,
    make_input,
    make_replica_input,
)
from advtrain.data.sources import (
    LOAD_OPTIONS,
    DataSplits,
    load_splits,
    register_source,
    sources,
    splits_from_arrays,
)

if tensorflow_or_none() is not None:
    from advtrain.data import gtsrb  # noqa: F401  (registers the TFDS builder)

__all__ = [
    "AUGMENT_DEFAULTS",
    "DataError",
    "DataSplits",
    "INPUT_OPTIONS",
    "LOAD_OPTIONS",
    "cache_mode",
    "has_augmentation",
    "load_splits",
    "make_distributed_input",
    "make_input",
    "make_replica_input",
    "register_source",
    "sources",
    "splits_from_arrays",
]
