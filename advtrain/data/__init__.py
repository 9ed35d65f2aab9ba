"""Datasets as `tf.data` pipelines of raw pixels and integer labels.

`load_splits(source, **options)` returns unbatched train / validation / test
datasets whose elements are `(image, label)`: images are uint8 (0..255) or
float32 in [0, 1] at the dataset's native size and channels; the model does
the rest. `make_input(...)` batches one of them for training or evaluation,
and `make_distributed_input(...)` does so per replica under a strategy. The
options are keyword arguments named like the recipe's data keys
(`LOAD_OPTIONS`, `INPUT_OPTIONS`).

Sources: `digits` (ships with scikit-learn), `mnist` (IDX files or TFDS),
`gtsrb` (TFDS builder over the official archives), `arrays` (`.npy` files
streamed from disk), `folder` (one folder per class), `tfds` (any TFDS
image classification dataset), and those registered with
`register_source`.

Importing this package registers the `gtsrb` TFDS builder, so
`tfds.builder("gtsrb")` finds advtrain's.
"""

import keras

from advtrain._tfimport import import_tensorflow

# On Keras's TensorFlow backend `import advtrain` imported it already; on
# JAX this is its first import: quietly, as there.
try:
    import_tensorflow()
except ModuleNotFoundError as exc:
    if exc.name != "tensorflow":
        raise
    raise ModuleNotFoundError(
        "advtrain.data (the tf.data input of recipes and advtrain.fit) needs "
        "TensorFlow, which is not installed: pip install tensorflow. "
        f"Received: KERAS_BACKEND={keras.backend.backend()}",
        name="tensorflow",
    ) from None

from advtrain.data import gtsrb  # noqa: E402, F401  (registers the TFDS builder)
from advtrain.data.errors import DataError  # noqa: E402
from advtrain.data.pipeline import (  # noqa: E402
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
from advtrain.data.sources import (  # noqa: E402
    LOAD_OPTIONS,
    register_source,
    sources,
)

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
