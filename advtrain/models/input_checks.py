"""`InputChecks`: training inputs that fit what the model and its attack assume.

Pixels: an attack's eps and clipping are measured in its pixel range
`[clip_min, clip_max]` (usually [0, 1]); 0-255 pixels would make every
adversarial image a saturated one and eps 255 times too small. Labels: a
sparse cross-entropy takes integer classes in [0, num_classes), a
categorical one takes one-hot rows as wide as the logits.

The checks run inside the training graph, on every batch, for the cost of a
min and a max per checked tensor: a failed check stops `fit` at that batch
with one line (`PixelRangeError` or `LabelError`, both `ValueError`s)
instead of TensorFlow's multi-line "Graph execution error". In a
TensorFlow graph they are assertions whose message carries a marker that
`InputChecks.clean_error` turns into the clean error; eagerly they raise at
once; under XLA (and on JAX, which always compiles with it), which drops
assertions, the reductions leave the step with its logs and
`InputChecks.check_logs` reads them on the host. The reductions are
`keras.ops`; TensorFlow is imported only for its assertions.
"""

from __future__ import annotations

import contextlib
import re
import sys
import warnings
from collections.abc import Iterator
from typing import Any, Optional

import keras
from keras import ops

# Float rounding (and a resize or a colour conversion) may overshoot the
# range by a little; a wrong scale overshoots by far more.
PIXEL_TOLERANCE = 1e-3
SPARSE, CATEGORICAL = "sparse", "categorical"

_SPARSE_NAMES = ("sparse_categorical_crossentropy",)
_CATEGORICAL_NAMES = ("categorical_crossentropy", "categorical_focal_crossentropy")
_MARK = "advtrain-input-check"
_FOUND = re.compile(rf"<{_MARK} (\w+) (\S+) (\S+)>")
# The keys the reductions travel under in the logs (XLA), popped by
# `check_logs` before Keras sees them.
_LOG_KEY = "_advtrain_input_{}_{}"


PROBABILITY_ACTIVATIONS = ("softmax", "sigmoid")


class PixelRangeError(ValueError):
    """Training pixels lie outside the attack's [clip_min, clip_max]."""


class LabelError(ValueError):
    """Labels that the loss cannot use with this model's logits."""


def label_kind(loss: Any) -> Optional[str]:
    """ "sparse" or "categorical" for Keras's cross-entropy losses (object,
    function or name); None for any other loss, and for a sparse loss with
    an `ignore_class` (its labels may lie outside the class range)."""
    if isinstance(loss, keras.losses.Loss):
        config = loss.get_config()
        if isinstance(loss, keras.losses.SparseCategoricalCrossentropy):
            return SPARSE if config.get("ignore_class") is None else None
        if isinstance(
            loss,
            (
                keras.losses.CategoricalCrossentropy,
                keras.losses.CategoricalFocalCrossentropy,
            ),
        ):
            return CATEGORICAL
        return None
    name = loss if isinstance(loss, str) else getattr(loss, "__name__", None)
    if name in _SPARSE_NAMES:
        return SPARSE
    if name in _CATEGORICAL_NAMES:
        return CATEGORICAL
    return None


def loss_name(loss: Any) -> str:
    """How the messages name a compiled loss: its class or its name."""
    if isinstance(loss, str):
        return loss
    if isinstance(loss, keras.losses.Loss):
        return type(loss).__name__
    return getattr(loss, "__name__", "the loss")


def output_shape(model: keras.Model) -> Optional[tuple]:
    """The shape of `model`'s single output when known without calling it
    (functional and Sequential models), with an int last axis; else None."""
    try:
        shape = model.output_shape
    except (AttributeError, ValueError, RuntimeError):
        return None
    if not isinstance(shape, tuple) or not shape or not isinstance(shape[-1], int):
        return None
    return shape


def probability_activation(model: keras.Model) -> Optional[str]:
    """The activation ("softmax" or "sigmoid") `model` ends in, else None."""
    layer = model
    while isinstance(layer, keras.Model) and layer.layers:
        layer = layer.layers[-1]
    if isinstance(layer, keras.layers.Softmax):
        return "softmax"
    name = getattr(getattr(layer, "activation", None), "__name__", None)
    return name if name in PROBABILITY_ACTIVATIONS else None


def warn_if_probability_output(model: keras.Model, loss: Any) -> None:
    """Warns when `model` ends in softmax/sigmoid but `loss` takes logits:
    the loss and the attacks would see probabilities as logits."""
    activation = probability_activation(model)
    config = getattr(loss, "get_config", dict)()
    if activation and config.get("from_logits"):
        warnings.warn(
            f"The classifier's last layer applies {activation}, but the "
            "loss has from_logits=True (and the attacks take logits too): "
            "remove the final activation so the classifier returns "
            f"logits. Received: activation={activation}, "
            f"loss={type(loss).__name__}",
            stacklevel=3,
        )


def fit_label_shape(arguments: Optional[dict]) -> Optional[tuple]:
    """The shape of the labels `fit` gets (`arguments`: `keras.Model.fit`'s
    arguments by name), from `y` or a dataset's element spec, with the
    batch axis None; else None."""
    if arguments is None:
        return None
    x, y = arguments.get("x"), arguments.get("y")
    if y is None and _is_tf_dataset(x):
        spec = x.element_spec
        if isinstance(spec, tuple) and len(spec) in (2, 3):
            y = spec[1]
    shape = getattr(y, "shape", None)
    if shape is None or len(shape) == 0:
        return None
    return (None, *tuple(shape)[1:])


class InputChecks:
    """The checks on one model's training batches.

    Args:
        pixel_range: the attack's `(clip_min, clip_max)`; None (or both None)
            skips the pixel check, a None bound skips that side.
        logits_shape: the model's output shape (`output_shape`): its last
            axis is the number of classes; None when unknown (then only the
            label checks that need neither are made).
        labels: "sparse", "categorical" (see `label_kind`) or None: no
            label check.
        loss_name: names the loss in the messages.

    Example:

    ```python
    checks = InputChecks((0.0, 1.0), logits_shape=(None, 10), labels="sparse")
    x, y, stats = checks.attach(x, y)  # in the train step, before any loss
    with checks.clean_errors():  # around what runs the step
        model.fit(...)
    ```
    """

    def __init__(
        self,
        pixel_range: Optional[tuple[Optional[float], Optional[float]]] = None,
        logits_shape: Optional[tuple] = None,
        labels: Optional[str] = None,
        loss_name: str = "the loss",
    ):
        if pixel_range is not None and pixel_range == (None, None):
            pixel_range = None
        self.pixel_range = pixel_range
        self.num_classes = None if logits_shape is None else logits_shape[-1]
        # Sparse labels have one axis less than the logits (or a last axis
        # of 1); one-hot labels have the logits' shape.
        self.logits_rank = 2 if logits_shape is None else len(logits_shape)
        self.labels = labels
        self.loss_name = loss_name

    @property
    def active(self) -> bool:
        return self.pixel_range is not None or self.labels is not None

    # ------------------------------------------------------------ graph

    def attach(self, x, y, xla: bool = False):
        """`(x, y, stats)`: the batch, made to wait for the checks.

        Label shapes are checked now (at trace time). With `xla` (XLA or
        JAX: no assertions), `stats` holds the reductions for the step's
        logs (`check_logs`), else it is empty; eagerly on TensorFlow the
        values are checked now; in a TensorFlow graph they become
        assertions (`x` and `y` depend on them, so no loss sees a bad
        batch).
        """
        if y is not None:
            self.check_label_shape(y.shape)
        reductions = self._reductions(x, y)
        if not reductions:
            return x, y, {}
        if xla:
            stats = {}
            for kind, (low, high) in reductions.items():
                stats[_LOG_KEY.format(kind, "low")] = low
                stats[_LOG_KEY.format(kind, "high")] = high
            return x, y, stats
        import tensorflow as tf

        if tf.executing_eagerly():
            for kind, (low, high) in reductions.items():
                self._raise_if_bad(kind, float(low), float(high))
            return x, y, {}
        asserts = [
            tf.debugging.Assert(
                self._in_range(kind, low, high), [_marked(kind, low, high)]
            )
            for kind, (low, high) in reductions.items()
        ]
        with tf.control_dependencies(asserts):
            x = tf.identity(x)
            y = tf.identity(y) if y is not None else None
        return x, y, {}

    def _reductions(self, x, y) -> dict[str, tuple]:
        """{kind: (low, high)} as float32 scalars."""
        found = {}
        if self.pixel_range is not None and ops.is_tensor(x):
            found["pixels"] = _min_max(x)
        if self.labels == SPARSE and y is not None and ops.is_tensor(y):
            found["labels"] = _min_max(y)
        return found

    def _in_range(self, kind: str, low, high):
        """Whether an observed range passes, as a boolean scalar tensor."""
        ok = ops.convert_to_tensor(True)
        if kind == "pixels":
            clip_min, clip_max = self.pixel_range
            if clip_min is not None:
                ok = ops.logical_and(ok, low >= clip_min - PIXEL_TOLERANCE)
            if clip_max is not None:
                ok = ops.logical_and(ok, high <= clip_max + PIXEL_TOLERANCE)
        else:
            ok = ops.logical_and(ok, low >= 0)
            if self.num_classes is not None:
                ok = ops.logical_and(ok, high <= self.num_classes - 1)
        return ok

    def check_label_shape(self, shape) -> None:
        """Raises `LabelError` when labels of `shape` do not suit the loss:
        one-hot rows for a sparse loss, class indices for a categorical
        one."""
        shape = _dims(shape)
        if self.labels is None or shape is None:
            return
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

    # ------------------------------------------------------------ host

    def error(self, kind: str, low: float, high: float) -> Optional[ValueError]:
        """The error for an observed range, or None when it is fine."""
        if kind == "pixels" and self.pixel_range is not None:
            clip_min, clip_max = self.pixel_range
            if (clip_min is None or low >= clip_min - PIXEL_TOLERANCE) and (
                clip_max is None or high <= clip_max + PIXEL_TOLERANCE
            ):
                return None
            bounds = f"[{_number(clip_min, '-inf')}, {_number(clip_max, 'inf')}]"
            example = " (e.g. x / 255)" if self.pixel_range == (0.0, 1.0) else ""
            return PixelRangeError(
                f"Training inputs must be pixels in the attack's range {bounds}, "
                f"the units of its eps and clipping: scale them to {bounds}"
                f"{example}, or set the attack's clip_min and clip_max to the "
                f"data's range. Received: pixel range [{_number(low)}, "
                f"{_number(high)}]"
            )
        if kind == "labels":
            classes = self.num_classes
            if low >= 0 and (classes is None or high <= classes - 1):
                return None
            expected = (
                f"in [0, {classes}) for this model's {classes} logits"
                if classes is not None
                else ">= 0"
            )
            return LabelError(
                f"labels must be integers {expected} ({self.loss_name}). "
                f"Received: label range [{_number(low)}, {_number(high)}]"
            )
        return None

    def _raise_if_bad(self, kind: str, low: float, high: float) -> None:
        error = self.error(kind, low, high)
        if error is not None:
            raise error

    def check_logs(self, logs: dict) -> dict:
        """`logs` without the reductions `attach(xla=True)` added; raises
        the check's error when they are out of range."""
        found = {}
        for key in [k for k in logs if k.startswith("_advtrain_input_")]:
            found[key] = logs.pop(key)
        for kind in ("pixels", "labels"):
            low = found.get(_LOG_KEY.format(kind, "low"))
            if low is not None:
                high = found[_LOG_KEY.format(kind, "high")]
                self._raise_if_bad(kind, float(low), float(high))
        return logs

    @contextlib.contextmanager
    def clean_errors(self) -> Iterator[None]:
        """Inside, a failed in-graph check raises its one-line error."""
        try:
            yield
        except Exception as exc:  # TensorFlow's InvalidArgumentError
            error = self.clean_error(exc)
            if error is None:
                raise
            raise error from None

    def clean_error(self, exc: BaseException) -> Optional[ValueError]:
        """The one-line `PixelRangeError` / `LabelError` for TensorFlow's
        error (many lines) from a failed in-graph check; None for any
        other error."""
        found = _FOUND.search(str(exc))
        if found is None:
            return None
        kind, low, high = found.groups()
        return self.error(kind, float(low), float(high))


def _min_max(t) -> tuple:
    t = ops.cast(t, "float32")
    return ops.min(t), ops.max(t)


def _is_tf_dataset(x: Any) -> bool:
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(x, tf.data.Dataset)


def _dims(shape) -> Optional[tuple]:
    """A shape (tuple, TensorShape) as a tuple of ints and None; None for
    an unknown rank."""
    if getattr(shape, "rank", 0) is None:
        return None
    return tuple(None if d is None else int(d) for d in shape)


def _marked(kind: str, low, high):
    import tensorflow as tf

    return tf.strings.join(
        [
            f"<{_MARK} {kind} ",
            tf.strings.as_string(low, shortest=True),
            " ",
            tf.strings.as_string(high, shortest=True),
            ">",
        ]
    )


def _number(value: Optional[float], none: str = "None") -> str:
    if value is None:
        return none
    return f"{value:g}"


def model_input_checks(model) -> InputChecks:
    """The checks for a compiled `AdversarialModel`: the attack's pixel
    range (when it runs in training), the compiled loss's labels, the
    logits; none with `check_inputs=False`."""
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
