"""Datasets of raw pixels and integer labels, batched for `Model.fit`.

`load_splits(source, **options)` returns unbatched train / validation / test
datasets whose elements are `(image, label)`: images are uint8 (0..255) or
float32 in [0, 1] at the dataset's native size and channels; the model does
the rest. `make_input(...)` batches one of them for training or evaluation,
and `make_distributed_input(...)` does so per replica under a strategy. The
options are keyword arguments named like the recipe's data keys
(`LOAD_OPTIONS`, `INPUT_OPTIONS`).

The datasets are `tf.data` pipelines where TensorFlow is installed. Without
it (Keras on JAX alone) the in-memory sources (`digits`, `mnist` from IDX
files, `register_source` functions built on `splits_from_arrays`) hold
numpy arrays and `make_input` batches them with numpy
(`advtrain.data.batches`); the others say in one line what to install.

Sources: `digits` (ships with scikit-learn), `mnist` (IDX files or TFDS),
`gtsrb` (TFDS builder over the official archives), `arrays` (`.npy` files
streamed from disk), `folder` (one folder per class), `tfds` (any TFDS
image classification dataset), and those registered with
`register_source`.

With TensorFlow, importing this package registers the `gtsrb` TFDS
builder, so `tfds.builder("gtsrb")` finds advtrain's.
"""

from advtrain.data.errors import DataError, tensorflow_or_none
from advtrain.data.pipeline import (
    AUGMENT_DEFAULTS,
    INPUT_OPTIONS,
    DataSplits,
    cache_mode,
    has_augmentation,
    load_splits,
    make_distributed_input,
    make_input,
    make_replica_input,
)
from advtrain.data.sources import (
    LOAD_OPTIONS,
    register_source,
    sources,
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
]
