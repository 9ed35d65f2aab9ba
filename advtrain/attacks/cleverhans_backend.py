"""cleverhans.tf2's FGM and PGD behind advtrain's attack interface.

`cleverhans_fgsm` and `cleverhans_pgd` take exactly the arguments of
`advtrain.attacks.fgsm` and `advtrain.attacks.pgd` (their signatures are
those functions'), so `Attack(..., backend="cleverhans")` swaps one for
the other. What cleverhans cannot do is refused: a returned gradient,
several restarts, a step larger than eps. Its random start is unseeded.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from advtrain.attacks.common import (
    LossFn,
    attack_inputs,
    checked_norm,
    per_example_cross_entropy,
)
from advtrain.attacks.fgsm import fgsm
from advtrain.attacks.pgd import default_step_size, pgd


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


def _same_arguments(ours: Callable) -> Callable:
    """Gives a cleverhans wrapper the signature of our attack `ours` and
    calls it with every argument bound by name, defaults filled in."""
    signature = inspect.signature(ours)

    def decorate(wrapper: Callable) -> Callable:
        @functools.wraps(wrapper)
        def bound(*args: Any, **kwargs: Any) -> tf.Tensor:
            arguments = signature.bind(*args, **kwargs)
            arguments.apply_defaults()
            return wrapper(**arguments.arguments)

        bound.__signature__ = signature
        return bound

    return decorate


def _run(attack, a: dict, *args: Any, **kwargs: Any) -> tf.Tensor:
    """Calls the cleverhans `attack(model_fn, x, eps, *args, norm, ...)` on
    our arguments `a`: labels (or predictions), the loss times the loss
    scale, the pixel range; NaN results fall back to the clean pixels."""
    norm = checked_norm(a["norm"], a["eps"])
    x, y = attack_inputs(a["model_fn"], a["x"], a["y"])
    x_adv = attack(
        a["model_fn"],
        x,
        a["eps"],
        *args,
        np.inf if norm == "inf" else 2,
        loss_fn=_cleverhans_loss(a["loss_fn"], a["loss_scale"]),
        clip_min=a["clip_min"],
        clip_max=a["clip_max"],
        y=y,
        **kwargs,
    )
    return _finite_or_clean(x_adv, x)


@_same_arguments(fgsm)
def cleverhans_fgsm(**a: Any) -> tf.Tensor:
    """`cleverhans.tf2.attacks.fast_gradient_method` with `fgsm`'s arguments.

    cleverhans computes in float32; the result is cast back to `x.dtype`.
    `loss_scale` multiplies the loss before differentiating (mixed
    precision), as in advtrain's own attacks.
    """
    from cleverhans.tf2.attacks.fast_gradient_method import (
        fast_gradient_method,
    )

    if a["return_gradient"]:
        raise ValueError(
            "The cleverhans backend does not return the input gradient. "
            "Received: return_gradient=True"
        )
    return _run(fast_gradient_method, a)


@_same_arguments(pgd)
def cleverhans_pgd(**a: Any) -> tf.Tensor:
    """`cleverhans.tf2.attacks.projected_gradient_descent` with `pgd`'s
    arguments.

    One start per example: cleverhans has no restarts. `seed` is not used
    (cleverhans draws its random start unseeded). `loss_scale` as in
    `cleverhans_fgsm`.
    """
    from cleverhans.tf2.attacks.projected_gradient_descent import (
        projected_gradient_descent,
    )

    if not (isinstance(a["restarts"], int) and a["restarts"] == 1):
        raise ValueError(
            "The cleverhans backend runs one start per example. "
            f"Received: restarts={a['restarts']!r}"
        )
    eps, steps = a["eps"], a["steps"]
    step_size = a["step_size"]
    step_size = default_step_size(eps, steps) if step_size is None else step_size
    if step_size > eps:
        # cleverhans asserts eps_iter <= eps; say so before it does.
        raise ValueError(
            "The cleverhans backend needs step_size <= eps. "
            f"Received: step_size={step_size}, eps={eps}"
        )
    return _run(
        projected_gradient_descent,
        a,
        step_size,
        steps,
        rand_init=a["random_start"],
        sanity_checks=False,
    )
