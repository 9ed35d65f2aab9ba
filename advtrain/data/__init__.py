"""Datasets as `tf.data` pipelines of raw pixels and integer labels.

`load_splits(cfg)` returns unbatched train / validation / test datasets whose
elements are `(image, label)`: images are uint8 (0..255) or float32 in [0, 1]
at the dataset's native size and channels; the model does the rest.
`make_input(...)` batches one of them for training or evaluation, and
`make_distributed_input(...)` does so per replica under a strategy.

Sources: `digits` (ships with scikit-learn), `mnist` (IDX files or TFDS),
`gtsrb` (TFDS builder over the official archives), `arrays` (`.npy` files
streamed from disk), `folder` (one folder per class), `tfds` (any TFDS
image classification dataset).

Importing this package registers the `gtsrb` TFDS builder, so
`tfds.builder("gtsrb")` finds advtrain's.
"""

from advtrain.data import gtsrb  # noqa: F401  (registers the TFDS builder)
from advtrain.data.pipeline import (
    DataSplits,
    load_splits,
    make_distributed_input,
    make_input,
    make_replica_input,
)
from advtrain.data.sources import register_source, sources

__all__ = [
    "DataSplits",
    "load_splits",
    "make_distributed_input",
    "make_input",
    "make_replica_input",
    "register_source",
    "sources",
]
