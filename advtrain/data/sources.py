"""Registry of data sources: each returns DataSplits from keyword options.

The built-in sources register themselves when their module is imported;
the registry imports that module the first time a source is asked for, so
a recipe on digits never pays for importing tensorflow_datasets.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from advtrain.utils.registry import Registry

# The module that registers each built-in source.
_BUILTIN_MODULES = {
    "digits": "advtrain.data.digits",
    "mnist": "advtrain.data.mnist",
    "gtsrb": "advtrain.data.gtsrb",
    "arrays": "advtrain.data.arrays",
    "folder": "advtrain.data.folder",
    "tfds": "advtrain.data.tfds_source",
}

# The recipe's data keys a source may take (`load_splits` passes a source
# those its signature names).
LOAD_OPTIONS = (
    "path",
    "tfds_name",
    "tfds_data_dir",
    "image_size",
    "test_fraction",
    "val_fraction",
    "limit_train",
    "limit_test",
    "roi_crop",
    "on_corrupt",
    "seed",
)


class SourceRegistry(Registry):
    """A `Registry` that knows the built-in sources before they are imported."""

    def get(self, name: str) -> Callable[..., Any]:
        if name not in self._entries and name in _BUILTIN_MODULES:
            try:
                importlib.import_module(_BUILTIN_MODULES[name])
            except ModuleNotFoundError as exc:
                if not (exc.name or "").startswith("tensorflow"):
                    raise
                from advtrain.data.errors import needs_tensorflow

                raise needs_tensorflow(
                    f"data source {name}", f"source={name}"
                ) from None
        return super().get(name)

    def names(self) -> list[str]:
        return sorted({*self._entries, *_BUILTIN_MODULES})

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in _BUILTIN_MODULES


sources = SourceRegistry("data source")


def register_source(name: str) -> Callable[[Callable], Callable]:
    """Registers a function as data source `name` (`data.source: name`).

    `load_splits(name, **options)` calls it as `fn(**options)` with the
    options its signature names, all keyword arguments named like the
    recipe's data keys: `path`, `tfds_name`, `tfds_data_dir`, `image_size`
    (height, width), `test_fraction`, `val_fraction`, `limit_train`,
    `limit_test`, `roi_crop`, `on_corrupt` ("error" or "skip") and `seed`
    (a function with `**options` receives them all). It returns
    `DataSplits` of unbatched `(image, label)` examples, pixels uint8 or
    float32 in [0, 1]. A name already registered is an error.

    Example:

    ```python
    import numpy as np
    from advtrain.data import load_splits, register_source
    from advtrain.data.splits import splits_from_arrays

    @register_source("noise")
    def noise(*, val_fraction=0.0, limit_train=None, limit_test=None, seed=0):
        rng = np.random.default_rng(seed)
        x = rng.random((100, 8, 8, 1), dtype=np.float32)
        y = rng.integers(0, 2, 100)
        return splits_from_arrays(
            (x[:80], y[:80]), (x[80:], y[80:]), num_classes=2,
            val_fraction=val_fraction, limit_train=limit_train,
            limit_test=limit_test, seed=seed,
        )

    splits = load_splits("noise", seed=1, path="ignored: noise takes no path")
    splits.train_size  # 80
    ```
    """
    return sources.register(name)
