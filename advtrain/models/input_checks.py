"""`InputChecks`: training data that fits what the model and its attack assume.

Pixels must lie in the attack's `[clip_min, clip_max]` (eps is in those
units); labels must suit the loss. A failed check is one line
(`PixelRangeError`, `LabelError`, both `ValueError`s).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any, Optional

import keras
import numpy as np

from advtrain import backend

# Float rounding (a resize, a colour conversion) may overshoot the range by
# a little; a wrong scale overshoots by far more.
PIXEL_TOLERANCE = 1e-3
SPARSE, CATEGORICAL = "sparse", "categorical"
# Arrays larger than this many values are checked on a strided row sample.
SAMPLE_VALUES = 1 << 24


class PixelRangeError(ValueError):
    """Training pixels lie outside the attack's [clip_min, clip_max]."""


class LabelError(ValueError):
    """Labels that the loss cannot use with this model's logits."""


def label_kind(loss: Any) -> Optional[str]:
    """ "sparse" or "categorical" for Keras's cross-entropy losses (object,
    function or name); else None (a sparse loss with `ignore_class` too)."""
    losses = keras.losses
    if isinstance(loss, losses.SparseCategoricalCrossentropy):
        return SPARSE if loss.get_config().get("ignore_class") is None else None
    categorical = (losses.CategoricalCrossentropy, losses.CategoricalFocalCrossentropy)
    if isinstance(loss, categorical):
        return CATEGORICAL
    if isinstance(loss, losses.Loss):
        return None
    name = loss if isinstance(loss, str) else getattr(loss, "__name__", None)
    if name == "sparse_categorical_crossentropy":
        return SPARSE
    if name in ("categorical_crossentropy", "categorical_focal_crossentropy"):
        return CATEGORICAL
    return None


def loss_name(loss: Any) -> str:
    if isinstance(loss, str):
        return loss
    if isinstance(loss, keras.losses.Loss):
        return type(loss).__name__
    return getattr(loss, "__name__", "the loss")


def output_shape(model: keras.Model) -> Optional[tuple]:
    """`model`'s single output shape, when known without calling it and its
    last axis is an int."""
    try:
        shape = model.output_shape
    except (AttributeError, ValueError, RuntimeError):
        return None
    if not isinstance(shape, tuple) or not shape or not isinstance(shape[-1], int):
        return None
    return shape


def warn_if_probability_output(model: keras.Model, loss: Any) -> None:
    """Warns when `model` ends in softmax/sigmoid but `loss` takes logits."""
    layer = model
    while isinstance(layer, keras.Model) and layer.layers:
        layer = layer.layers[-1]
    activation = getattr(getattr(layer, "activation", None), "__name__", None)
    if isinstance(layer, keras.layers.Softmax):
        activation = "softmax"
    config = getattr(loss, "get_config", dict)()
    if activation in ("softmax", "sigmoid") and config.get("from_logits"):
        warnings.warn(
            f"The classifier's last layer applies {activation}, but the "
            "loss has from_logits=True (and the attacks take logits too): "
            "remove the final activation so the classifier returns "
            f"logits. Received: activation={activation}, "
            f"loss={type(loss).__name__}",
            stacklevel=3,
        )


class InputChecks:
    """The checks on one model's training data, none of them a host call
    per step: arrays once before training (a strided sample of a large
    one); a `tf.data.Dataset` in its own graph, through a `map` whose
    Python runs only to raise for a bad batch (a distributed one is not
    checked); `PyDataset`/generator batches on the host as they are made,
    where they are made in Python anyway. The same on every backend.

    Args:
        pixel_range: the attack's `(clip_min, clip_max)`; None skips the
            pixel check, a None bound that side.
        logits_shape: the model's output shape, None when unknown.
        labels: "sparse", "categorical" (`label_kind`) or None (no check).
        loss_name: names the loss in the messages.

    Example:

    ```python
    checks = InputChecks((0.0, 1.0), logits_shape=(None, 10), labels="sparse")
    with checks.clean_errors():
        model.fit(checks.checked(dataset))
    ```
    """

    def __init__(
        self,
        pixel_range: Optional[tuple[Optional[float], Optional[float]]] = None,
        logits_shape: Optional[tuple] = None,
        labels: Optional[str] = None,
        loss_name: str = "the loss",
    ):
        self.pixel_range = None if pixel_range == (None, None) else pixel_range
        self.num_classes = None if logits_shape is None else logits_shape[-1]
        # Sparse labels have one axis less than the logits (or a last axis
        # of 1); one-hot labels have the logits' shape.
        self.logits_rank = 2 if logits_shape is None else len(logits_shape)
        self.labels = labels
        self.loss_name = loss_name
        self.failed: Optional[ValueError] = None  # what a data pipeline raised

    def checked(self, x: Any, y: Any = None) -> Any:
        """`x` as `fit` takes it, checked: arrays (and `y`) now, a
        `PyDataset`, generator or `tf.data.Dataset` batch by batch."""
        if self.pixel_range is None and self.labels is None:
            return x
        if backend.is_dataset(x):
            return self._checked_dataset(x)
        if isinstance(x, keras.utils.PyDataset):
            return _CheckedPyDataset(x, self.check_batch)
        if hasattr(x, "__next__"):
            return (self.check_batch(batch) or batch for batch in x)
        if y is not None:
            self.check_label_shape((None, *np.shape(y)[1:]))
        self.check_values(_sample(x), _sample(y))
        return x

    def check_batch(self, batch: Any) -> None:
        """Checks one `(x, y[, sample_weight])` batch on the host."""
        x, y, _ = keras.utils.unpack_x_y_sample_weight(batch)
        if y is not None:
            self.check_label_shape(np.shape(y))
        self.check_values(x, y)

    def check_values(self, x: Any, y: Any = None) -> None:
        """Checks the pixel and label ranges of host arrays."""
        for kind, values in self._checked_parts(x, y).items():
            values = np.asarray(values)
            if values.size:
                self._check_range(kind, float(values.min()), float(values.max()))

    def _checked_parts(self, x, y) -> dict[str, Any]:
        parts = {}
        if self.pixel_range is not None and _numeric(x):
            parts["pixels"] = x
        if self.labels == SPARSE and _numeric(y):
            parts["labels"] = y
        return parts

    def _checked_dataset(self, dataset):
        """`dataset` with each batch's ranges checked in the graph: a few
        reductions per batch inside the `map`, and Python only to raise
        the error of a batch that failed (no host call per step)."""
        import tensorflow as tf

        spec = dataset.element_spec
        if isinstance(spec, tuple) and len(spec) in (2, 3):
            self.check_label_shape(spec[1].shape)

        def check(*element):
            batch = element if len(element) > 1 else element[0]
            x, y, _ = keras.utils.unpack_x_y_sample_weight(batch)
            parts = self._checked_parts(x, y)
            if not parts:
                return batch
            ranges, inside = [], []
            for kind, values in parts.items():
                low = tf.cast(tf.reduce_min(values), tf.float64)
                high = tf.cast(tf.reduce_max(values), tf.float64)
                bottom, top = self._bounds(kind)
                empty = tf.equal(tf.size(values), 0)
                inside.append(empty | ((low >= bottom) & (high <= top)))
                ranges += [low, high]
            kinds = list(parts)
            ok = tf.cond(
                tf.reduce_all(tf.stack(inside)),
                lambda: tf.constant(True),
                # Runs only for a batch that failed: raises its one line.
                lambda: tf.numpy_function(
                    lambda *found: self._check_ranges(kinds, found), ranges, tf.bool
                ),
            )
            with tf.control_dependencies([ok]):
                return tf.nest.map_structure(tf.identity, batch)

        return dataset.map(check)

    def _check_ranges(self, kinds: list[str], found) -> np.bool_:
        for kind, low, high in zip(kinds, found[::2], found[1::2], strict=True):
            self._check_range(kind, float(low), float(high))
        return np.bool_(True)

    def check_label_shape(self, shape) -> None:
        """Raises `LabelError` when labels of `shape` do not suit the loss."""
        if self.labels is None or getattr(shape, "rank", 0) is None:
            return
        shape = tuple(None if d is None else int(d) for d in shape)
        width = shape[-1] if shape else None
        classes, full_rank = self.num_classes, len(shape) == self.logits_rank
        if self.labels == SPARSE and full_rank and (width or 0) > 1:
            raise LabelError(
                f"{self.loss_name} takes integer class labels, one per "
                f"example, but these look one-hot: pass y.argmax(-1), or "
                "use keras.losses.CategoricalCrossentropy. Received: labels "
                f"shape={shape}"
            )
        one_hot = full_rank and (width is None or classes is None or width == classes)
        if self.labels == CATEGORICAL and not one_hot:
            rows = f"rows of {classes}" if classes else "rows as wide as the logits"
            raise LabelError(
                f"{self.loss_name} takes one-hot labels ({rows}); for "
                "integer class labels use "
                "keras.losses.SparseCategoricalCrossentropy, or one-hot encode "
                f"them (keras.utils.to_categorical). Received: labels "
                f"shape={shape}"
            )

    def _bounds(self, kind: str) -> tuple[float, float]:
        """The lowest and highest value of `kind` ("pixels", "labels")
        that pass, the pixels' rounding tolerance included."""
        if kind == "pixels":
            clip_min, clip_max = self.pixel_range
            return (
                -np.inf if clip_min is None else clip_min - PIXEL_TOLERANCE,
                np.inf if clip_max is None else clip_max + PIXEL_TOLERANCE,
            )
        classes = self.num_classes
        return 0.0, np.inf if classes is None else float(classes - 1)

    def _check_range(self, kind: str, low: float, high: float) -> None:
        bottom, top = self._bounds(kind)
        if low >= bottom and high <= top:
            return
        classes = self.num_classes
        if kind == "pixels":
            clip_min, clip_max = self.pixel_range
            bounds = f"[{_number(clip_min, '-inf')}, {_number(clip_max, 'inf')}]"
            example = " (e.g. x / 255)" if self.pixel_range == (0.0, 1.0) else ""
            error = PixelRangeError(
                f"Training inputs must be pixels in the attack's range {bounds}, "
                f"the units of its eps and clipping: scale them to {bounds}"
                f"{example}, or set the attack's clip_min and clip_max to the "
                f"data's range. Received: pixel range [{_number(low)}, "
                f"{_number(high)}]"
            )
        else:
            expected = (
                f"in [0, {classes}) for this model's {classes} logits"
                if classes is not None
                else ">= 0"
            )
            error = LabelError(
                f"labels must be integers {expected} ({self.loss_name}). "
                f"Received: label range [{_number(low)}, {_number(high)}]"
            )
        self.failed = error  # for `clean_errors`: a pipeline wraps it
        raise error

    @contextlib.contextmanager
    def clean_errors(self) -> Iterator[None]:
        """Inside, a check that failed in a data pipeline raises its own
        one-line error, not the pipeline's wrapper."""
        self.failed = None
        try:
            yield
        except Exception:
            if self.failed is None:
                raise
            raise self.failed from None


class _CheckedPyDataset(keras.utils.PyDataset):
    def __init__(self, dataset: keras.utils.PyDataset, check):
        super().__init__(
            workers=dataset.workers,
            use_multiprocessing=dataset.use_multiprocessing,
            max_queue_size=dataset.max_queue_size,
        )
        self.dataset, self.check = dataset, check

    @property
    def num_batches(self):
        return self.dataset.num_batches

    def __getitem__(self, index):
        batch = self.dataset[index]
        self.check(batch)
        return batch

    def on_epoch_begin(self):
        self.dataset.on_epoch_begin()

    def on_epoch_end(self):
        self.dataset.on_epoch_end()


def _numeric(values: Any) -> bool:
    dtype = getattr(values, "dtype", None)
    dtype = getattr(dtype, "as_numpy_dtype", dtype)  # a tf.DType
    try:
        return dtype is not None and np.issubdtype(np.dtype(dtype), np.number)
    except TypeError:
        return False


def _sample(values: Any) -> Any:
    size = getattr(values, "size", None)
    if not isinstance(size, int) or size <= SAMPLE_VALUES or not len(values):
        return values
    return values[:: -(-size // SAMPLE_VALUES)]


def _number(value: Optional[float], none: str = "None") -> str:
    return none if value is None else f"{value:g}"


def model_input_checks(model) -> InputChecks:
    """The checks for a compiled `AdversarialModel`."""
    if not model.check_inputs:
        return InputChecks()
    attack = model.attack
    attacked = attack is not None and (model.adv_weight > 0 or model.needs_clean_logits)
    loss = getattr(model, "loss", None)
    return InputChecks(
        (attack.clip_min, attack.clip_max) if attacked else None,
        logits_shape=output_shape(model.classifier),
        labels=label_kind(loss),
        loss_name=loss_name(loss),
    )
