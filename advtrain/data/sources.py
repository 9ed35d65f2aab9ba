"""Data sources: the registry, `load_splits`, and the `DataSplits` they give.
A built-in source's module is imported the first time it is asked for.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from typing import Any, Optional, TypeVar

import numpy as np

from advtrain import backend
from advtrain.data.batches import Examples
from advtrain.data.errors import DataArgumentError, needs_tensorflow, tensorflow_or_none
from advtrain.utils.registry import Registry

T = TypeVar("T")

_BUILTIN_MODULES = {
    "digits": "advtrain.data.digits",
    "mnist": "advtrain.data.mnist",
    "gtsrb": "advtrain.data.gtsrb",
    "arrays": "advtrain.data.arrays",
    "folder": "advtrain.data.folder",
    "tfds": "advtrain.data.tfds_source",
}

# The options a source may take; `load_splits` passes those it names.
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


@dataclasses.dataclass
class DataSplits:
    """Unbatched `(image, label)` datasets (`Examples` without TensorFlow)
    and what the model needs to know.

    `skipped` counts corrupt examples left out under `on_corrupt="skip"`.
    `train_fn`, for sources that draw their order inside the source
    (`arrays`), builds a fresh training stream: `fresh_train()`.
    """

    train: Any
    test: Any
    val: Any
    num_classes: int
    image_shape: tuple[int, int, int]
    train_size: int
    test_size: int
    val_size: int = 0
    class_names: Optional[list[str]] = None
    skipped: int = 0
    train_fn: Optional[Callable[[], Any]] = None

    def fresh_train(self) -> Any:
        """The training stream, its epochs a function of the seeds only (what
        a resumed run needs)."""
        return self.train_fn() if self.train_fn is not None else self.train


class SourceRegistry(Registry):
    """A `Registry` that knows the built-in sources before they are imported."""

    def get(self, name: str) -> Callable[..., Any]:
        if name not in self._entries and name in _BUILTIN_MODULES:
            try:
                importlib.import_module(_BUILTIN_MODULES[name])
            except ModuleNotFoundError as exc:
                if not (exc.name or "").startswith("tensorflow"):
                    raise
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
    """Registers a function as data source `name`.

    `load_splits(name, **options)` calls it with the `LOAD_OPTIONS` its
    signature names (all of them for `**options`); it returns `DataSplits`
    of unbatched `(image, label)`, pixels uint8 or float32 in [0, 1]. A name
    already registered is an error.

    Example:

    ```python
    from advtrain.data import load_splits, register_source, splits_from_arrays

    @register_source("noise")
    def noise(*, val_fraction=0.0, seed=0):
        rng = np.random.default_rng(seed)
        x, y = rng.random((100, 8, 8, 1), np.float32), rng.integers(0, 2, 100)
        return splits_from_arrays((x[:80], y[:80]), (x[80:], y[80:]),
                                  num_classes=2, val_fraction=val_fraction)

    load_splits("noise", seed=1, path="ignored").train_size  # 80
    ```
    """
    return sources.register(name)


def load_splits(source: str = "digits", /, **options: Any) -> DataSplits:
    """Loads data source `source`; it receives the `options` it names.

    Raises:
        ValueError: one line naming the file and what was expected, for a
            wrong layout or a corrupt example (unless `on_corrupt="skip"`);
            FileNotFoundError for a missing file or directory.
        TypeError: an option neither `LOAD_OPTIONS` nor the source knows.

    Example:

    ```python
    load_splits("digits", val_fraction=0.1, seed=0).num_classes  # 10
    ```
    """
    fn = sources.get(source)
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(**options)
    unknown = sorted(set(options) - set(params) - set(LOAD_OPTIONS))
    if unknown:
        raise TypeError(
            f"Unknown data option for source {source}: expected one of "
            f"{', '.join(sorted({*LOAD_OPTIONS, *params}))}. "
            f"Received: {unknown[0]}={options[unknown[0]]!r}"
        )
    return fn(**{key: value for key, value in options.items() if key in params})


def require(source: str, argument: str, value: T, what: str) -> T:
    """`value`, unless it is None: then a one-line error naming `argument`."""
    if value is None:
        raise DataArgumentError(
            argument, f"source {source} needs {what}. Received: {argument}=None"
        )
    return value


def stratified_split(
    labels: np.ndarray, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Splits indices so each class keeps `fraction` of its examples aside."""
    rng = np.random.default_rng(seed)
    keep, held = [], []
    for cls in np.unique(labels):
        idx = np.flatnonzero(labels == cls)
        rng.shuffle(idx)
        n_held = int(round(len(idx) * fraction))
        held.append(idx[:n_held])
        keep.append(idx[n_held:])
    return np.sort(np.concatenate(keep)), np.sort(np.concatenate(held))


def hold_out(
    labels: np.ndarray,
    *,
    test_fraction: Optional[float] = None,
    val_fraction: float = 0.0,
    seed: int = 0,
    val_seed: Optional[int] = None,
) -> tuple[np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]:
    """Indices (train, val, test) into `labels`, each stratified by class:
    `test_fraction` first (seed `seed`), then `val_fraction` of the rest
    (seed `val_seed`, default `seed`); a split not drawn is None."""
    train, val, test = np.arange(len(labels)), None, None
    if test_fraction is not None:
        train, test = stratified_split(labels, test_fraction, seed=seed)
    if val_fraction > 0:
        keep, held = stratified_split(
            labels[train], val_fraction, seed=seed if val_seed is None else val_seed
        )
        train, val = train[keep], train[held]
    return train, val, test


def splits_from_arrays(
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    *,
    num_classes: int,
    class_names: Optional[list[str]] = None,
    val_fraction: float = 0.0,
    limit_train: Optional[int] = None,
    limit_test: Optional[int] = None,
    seed: int = 0,
) -> DataSplits:
    """DataSplits from in-memory arrays, holding out `val_fraction` of train
    (tf.data where TensorFlow is installed, else `Examples`)."""
    x_train, y_train = train
    val = None
    if val_fraction > 0:
        keep, held, _ = hold_out(y_train, val_fraction=val_fraction, seed=seed)
        val = (x_train[held], y_train[held])
        x_train, y_train = x_train[keep], y_train[keep]
    x_train, y_train = x_train[:limit_train], y_train[:limit_train]
    x_test, y_test = test[0][:limit_test], test[1][:limit_test]

    def to_ds(x, y):
        if not backend.HAS_TENSORFLOW:
            return Examples(x, y)
        return tensorflow_or_none().data.Dataset.from_tensor_slices((x, y))

    return DataSplits(
        train=to_ds(x_train, y_train),
        test=to_ds(x_test, y_test),
        val=None if val is None else to_ds(*val),
        num_classes=num_classes,
        image_shape=tuple(x_train.shape[1:]),
        train_size=len(y_train),
        test_size=len(y_test),
        val_size=0 if val is None else len(val[1]),
        class_names=class_names,
    )
