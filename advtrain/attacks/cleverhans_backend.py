"""cleverhans.tf2's FGM and PGD behind advtrain's attack interface."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import tensorflow as tf

from advtrain.attacks.common import (
    LossFn,
    ModelFn,
    Norm,
    attack_inputs,
    checked_norm,
    per_example_cross_entropy,
)


def _cleverhans_loss(loss_fn: Optional[LossFn], loss_scale: Optional[Any]):
    """Our per-example loss, times the mixed-precision loss scale: cleverhans
    only uses the gradient's direction, so the scale cancels, and it keeps
    a float16 backward pass from underflowing to a zero gradient."""
    loss_fn = loss_fn or per_example_cross_entropy

    def wrapped(labels, logits):
        loss = tf.cast(loss_fn(labels, logits), tf.float32)
        if loss_scale is not None:
            loss = loss * tf.cast(loss_scale, tf.float32)
        return loss

    return wrapped


def _finite_or_clean(x_adv: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
    # An overflowing scaled loss gives a NaN gradient; no step beats a NaN
    # image (advtrain's own attacks zero such gradients the same way).
    x_adv = tf.cast(x_adv, x.dtype)
    return tf.where(tf.math.is_finite(x_adv), x_adv, x)


def _np_norm(norm: str):
    return np.inf if norm == "inf" else 2


def cleverhans_fgsm(
    model_fn: ModelFn,
    x: Any,
    y: Optional[Any] = None,
    *,
    eps: float,
    norm: Norm = "inf",
    loss_fn: Optional[LossFn] = None,
    clip_min: Optional[float] = 0.0,
    clip_max: Optional[float] = 1.0,
    loss_scale: Optional[Any] = None,
) -> tf.Tensor:
    """`cleverhans.tf2.attacks.fast_gradient_method` with our arguments.

    cleverhans computes in float32; the result is cast back to `x.dtype`.
    `loss_scale` multiplies the loss before differentiating (mixed
    precision), as in advtrain's own attacks.
    """
    from cleverhans.tf2.attacks.fast_gradient_method import (
        fast_gradient_method,
    )

    norm = checked_norm(norm, eps)
    x, y = attack_inputs(model_fn, x, y)
    x_adv = fast_gradient_method(
        model_fn,
        x,
        eps,
        _np_norm(norm),
        loss_fn=_cleverhans_loss(loss_fn, loss_scale),
        clip_min=clip_min,
        clip_max=clip_max,
        y=y,
    )
    return _finite_or_clean(x_adv, x)


def cleverhans_pgd(
    model_fn: ModelFn,
    x: Any,
    y: Optional[Any] = None,
    *,
    eps: float,
    steps: int = 10,
    step_size: Optional[float] = None,
    norm: Norm = "inf",
    random_start: bool = True,
    loss_fn: Optional[LossFn] = None,
    clip_min: Optional[float] = 0.0,
    clip_max: Optional[float] = 1.0,
    loss_scale: Optional[Any] = None,
) -> tf.Tensor:
    """`cleverhans.tf2.attacks.projected_gradient_descent` with our arguments.

    One start per example: cleverhans has no restarts. `loss_scale` as in
    `cleverhans_fgsm`.
    """
    from cleverhans.tf2.attacks.projected_gradient_descent import (
        projected_gradient_descent,
    )

    norm = checked_norm(norm, eps)
    step_size = 2.5 * eps / steps if step_size is None else step_size
    if step_size > eps:
        # cleverhans asserts eps_iter <= eps; say so before it does.
        raise ValueError(
            "The cleverhans backend needs step_size <= eps. "
            f"Received: step_size={step_size}, eps={eps}"
        )
    x, y = attack_inputs(model_fn, x, y)
    x_adv = projected_gradient_descent(
        model_fn,
        x,
        eps,
        step_size,
        steps,
        _np_norm(norm),
        loss_fn=_cleverhans_loss(loss_fn, loss_scale),
        clip_min=clip_min,
        clip_max=clip_max,
        y=y,
        rand_init=random_start,
        sanity_checks=False,
    )
    return _finite_or_clean(x_adv, x)
