"""Datasets of raw pixels and integer labels, batched for `Model.fit`.

`load_splits(source, **options)` returns unbatched train / validation /
test datasets of `(image, label)`: uint8 or float32 in [0, 1] pixels at the
dataset's native size; `make_input` batches one for training or evaluation,
`make_distributed_input` per replica under a strategy. Sources: `digits`,
`mnist` (IDX files or TFDS), `gtsrb` (a TFDS builder, registered with
TensorFlow), `arrays` (`.npy` streamed from disk), `folder` (one folder per
class), `tfds` and those added with `register_source`. Without TensorFlow,
the in-memory sources (`digits`, `mnist` IDX, `splits_from_arrays`) hold
numpy arrays batched by numpy; the others say what to install.
"""

from advtrain import backend
from advtrain.data.errors import DataError
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

if backend.HAS_TENSORFLOW:
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
