"""Pieces every attack shares: norms, input gradients, steps, projections.

All functions run in-graph (under `tf.function` and XLA) and follow the
dtype of the input images.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Optional, Union

import keras
import tensorflow as tf

from advtrain.utils.errors import ArgumentError

Norm = Union[str, int, float]
ModelFn = Callable[[tf.Tensor], tf.Tensor]
LossFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]

_TINY = 1e-12


def canonical_norm(norm: Norm) -> str:
    """Returns "inf" or "2"; accepts np.inf, "inf", "linf", 2 and "2"."""
    text = str(norm).lower()
    if text in ("inf", "linf", "l_inf", "np.inf"):
        return "inf"
    if text in ("2", "2.0", "l2"):
        return "2"
    raise ArgumentError(
        "norm", f"must be 'inf' (L-infinity) or 2 (L2). Received: norm={norm!r}"
    )


def check_eps(
    name: str, value: Any, upper: Optional[float] = None, why: str = ""
) -> None:
    """Validates a non-negative finite scalar hyperparameter up front; with
    `upper`, at most that (`why` says what the bound is)."""
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number. Received: {name}={value!r}")
    if not math.isfinite(value) or value < 0:
        raise ArgumentError(
            name, f"must be a finite number >= 0. Received: {name}={value}"
        )
    if upper is not None and value > upper:
        raise ArgumentError(
            name, f"must be <= {upper:g}{why}. Received: {name}={value}"
        )


def check_count(name: str, value: Any, tensor: bool = True) -> None:
    """Validates a count (`steps`, `restarts`, `queries`): an int >= 1, or
    with `tensor` a scalar integer tensor (known when the graph runs)."""
    if tensor and tf.is_tensor(value):
        if value.dtype.is_integer and value.shape.rank == 0:
            return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        what = " or a scalar integer tensor" if tensor else ""
        raise ArgumentError(
            name, f"must be an int >= 1{what}. Received: {name}={value!r}"
        )


def check_fraction(name: str, value: Any) -> None:
    """Validates a share in [0, 1) up front (e.g. ZeroGrad's quantile)."""
    if not 0.0 <= value < 1.0:
        raise ArgumentError(name, f"must be in [0, 1). Received: {name}={value!r}")


def per_example_cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Cross-entropy per example; sparse int labels or probability rows."""
    logits = tf.cast(logits, tf.float32)
    if labels.shape.rank == logits.shape.rank:
        return tf.nn.softmax_cross_entropy_with_logits(
            labels=tf.cast(labels, tf.float32), logits=logits
        )
    labels = tf.cast(tf.reshape(labels, [-1]), tf.int32)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def input_gradient(
    model_fn: ModelFn,
    x: tf.Tensor,
    y: tf.Tensor,
    loss_fn: Optional[LossFn] = None,
    loss_scale: Optional[Any] = None,
) -> tf.Tensor:
    """Gradient of the summed per-example loss with respect to `x`.

    `loss_scale` multiplies the loss before differentiating, as mixed
    precision training does for weight gradients: a float16 backward pass
    would otherwise underflow to zero and `sign` would give no perturbation.
    Attack steps only use the gradient's direction, so the scale cancels.
    """
    loss_fn = loss_fn or per_example_cross_entropy
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(tf.cast(loss_fn(y, model_fn(x)), tf.float32))
        if loss_scale is not None:
            loss = loss * tf.cast(loss_scale, tf.float32)
    grad = tape.gradient(loss, x)
    # An overflowing scaled loss yields inf/nan: no step beats a NaN image.
    return tf.where(tf.math.is_finite(grad), grad, tf.zeros_like(grad))


def _reduce_axes(x: tf.Tensor) -> list[int]:
    return list(range(1, x.shape.rank))


def steepest_step(grad: tf.Tensor, size: Any, norm: str) -> tf.Tensor:
    """The step of length `size` (in `norm`) that most increases the loss."""
    size = tf.cast(size, grad.dtype)
    if norm == "inf":
        return size * tf.stop_gradient(tf.sign(grad))
    sq = tf.reduce_sum(tf.square(grad), axis=_reduce_axes(grad), keepdims=True)
    return size * grad / tf.sqrt(tf.maximum(sq, tf.cast(_TINY, grad.dtype)))


def project(delta: tf.Tensor, eps: Any, norm: str) -> tf.Tensor:
    """Projects a perturbation onto the eps-ball of `norm`."""
    eps = tf.cast(eps, delta.dtype)
    if norm == "inf":
        return tf.clip_by_value(delta, -eps, eps)
    sq = tf.reduce_sum(tf.square(delta), axis=_reduce_axes(delta), keepdims=True)
    length = tf.sqrt(tf.maximum(sq, tf.cast(_TINY, delta.dtype)))
    return delta * tf.minimum(tf.cast(1.0, delta.dtype), eps / length)


def random_in_ball(x: tf.Tensor, eps: Any, norm: str, seed: Any = None) -> tf.Tensor:
    """A perturbation drawn uniformly from the eps-ball of `norm`.

    `seed` is anything `keras.random` accepts: None, an int, or a
    `keras.random.SeedGenerator` (whose state is checkpointed with a model).
    """
    eps = tf.cast(eps, x.dtype)
    shape = tf.shape(x)
    if norm == "inf":
        unit = keras.random.uniform(
            shape, minval=-1.0, maxval=1.0, dtype="float32", seed=seed
        )
        return tf.cast(unit, x.dtype) * eps
    flat_dim = tf.reduce_prod(shape[1:])
    direction = keras.random.normal(
        tf.stack([shape[0], flat_dim]), dtype="float32", seed=seed
    )
    direction /= tf.norm(direction, axis=1, keepdims=True) + _TINY
    # Radius r = eps * u^(1/d) gives a uniform density inside the ball.
    u = keras.random.uniform(tf.stack([shape[0], 1]), dtype="float32", seed=seed)
    radius = tf.pow(u, 1.0 / tf.cast(flat_dim, tf.float32))
    return tf.cast(tf.reshape(direction * radius, shape), x.dtype) * eps


def int_labels(y: tf.Tensor) -> tf.Tensor:
    """Integer class labels (int32, one per example) from integer labels or
    probability rows."""
    if y.shape.rank is not None and y.shape.rank > 1:
        return tf.argmax(y, axis=-1, output_type=tf.int32)
    return tf.cast(tf.reshape(y, [-1]), tf.int32)


def labels_or_predictions(model_fn: ModelFn, x: tf.Tensor, y: Optional[tf.Tensor]):
    """Uses the model's own predictions when no labels are given, which
    avoids label leaking (Kurakin et al. 2016)."""
    if y is not None:
        return tf.convert_to_tensor(y)
    return tf.argmax(model_fn(x), axis=-1)


def attack_inputs(model_fn: ModelFn, x: Any, y: Any) -> tuple[tf.Tensor, Any]:
    """`x` as a float tensor and the labels to attack (the model's own
    predictions when `y` is None); every attack starts with this, after
    validating its hyperparameters."""
    x = as_float_tensor(x)
    return x, labels_or_predictions(model_fn, x, y)


def checked_norm(norm: Norm, eps: Any) -> str:
    """Validates `eps` and returns the canonical `norm`."""
    check_eps("eps", eps)
    return canonical_norm(norm)


def clip_pixels(x: tf.Tensor, clip_min: Optional[float], clip_max: Optional[float]):
    if clip_min is None and clip_max is None:
        return x
    low = tf.cast(-math.inf if clip_min is None else clip_min, x.dtype)
    high = tf.cast(math.inf if clip_max is None else clip_max, x.dtype)
    return tf.clip_by_value(x, low, high)


def as_float_tensor(x: Any) -> tf.Tensor:
    """Converts input pixels to a float tensor, keeping a float dtype."""
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise TypeError(
            "Attacks work on float pixels in [0, 1]; convert uint8 images with "
            f"tf.image.convert_image_dtype first. Received: dtype={x.dtype.name}"
        )
    return x
