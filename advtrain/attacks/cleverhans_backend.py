"""cleverhans.tf2's FGM and PGD with the arguments of `advtrain.attacks.fgsm`
and `advtrain.attacks.pgd` (their signatures), so that
`Attack(..., backend="cleverhans")` swaps one for the other. What cleverhans
cannot do is refused: a returned gradient, restarts, a step larger than
eps. TensorFlow only, imported on first use.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
from keras import ops

from advtrain import backend
from advtrain.attacks.common import (
    attack_inputs,
    checked_norm,
    per_example_cross_entropy,
)
from advtrain.attacks.fgsm import fgsm
from advtrain.attacks.pgd import default_step_size, pgd


def _cleverhans_attack(module: str) -> Callable:
    # `cleverhans.tf2.attacks.<module>.<module>`, imported on first use.
    backend.require_tensorflow_tensors(
        "The cleverhans backend", instead="backend='advtrain'"
    )
    try:
        found = importlib.import_module(f"cleverhans.tf2.attacks.{module}")
    except ImportError as error:
        raise ImportError(
            "The cleverhans backend needs TensorFlow and cleverhans: "
            f"{backend.install_command(['tensorflow'])}. Received: {error}"
        ) from None
    return getattr(found, module)


def _same_arguments(ours: Callable) -> Callable:
    # The wrapper takes `ours`'s signature and gets every argument by name.
    signature = inspect.signature(ours)

    def decorate(wrapper: Callable) -> Callable:
        @functools.wraps(wrapper)
        def bound(*args: Any, **kwargs: Any) -> Any:
            arguments = signature.bind(*args, **kwargs)
            arguments.apply_defaults()
            return wrapper(**arguments.arguments)

        bound.__signature__ = signature
        return bound

    return decorate


def _run(attack, a: dict, *args: Any, **kwargs: Any) -> Any:
    # cleverhans's `attack(model_fn, x, eps, *args, norm, ...)` on our
    # arguments `a`.
    norm = checked_norm(a["norm"], a["eps"])
    x, y = attack_inputs(a["model_fn"], a["x"], a["y"])
    loss_fn, loss_scale = a["loss_fn"] or per_example_cross_entropy, a["loss_scale"]

    def scaled_loss(labels, logits):
        # The mixed-precision loss scale: cleverhans only uses the
        # gradient's direction, so it cancels.
        loss = ops.cast(loss_fn(labels, logits), "float32")
        if loss_scale is not None:
            loss = loss * ops.cast(loss_scale, "float32")
        return loss

    x_adv = attack(
        a["model_fn"],
        x,
        a["eps"],
        *args,
        np.inf if norm == "inf" else 2,
        loss_fn=scaled_loss,
        clip_min=a["clip_min"],
        clip_max=a["clip_max"],
        y=y,
        **kwargs,
    )
    # An overflowing scaled loss gives a NaN gradient: no step beats a NaN
    # image (advtrain's own attacks zero such gradients the same way).
    x_adv = ops.cast(x_adv, x.dtype)
    return ops.where(ops.isfinite(x_adv), x_adv, x)


@_same_arguments(fgsm)
def cleverhans_fgsm(**a: Any) -> Any:
    """`cleverhans.tf2.attacks.fast_gradient_method` with `fgsm`'s
    arguments; the result is cast back to `x.dtype`."""
    if a["return_gradient"]:
        raise ValueError(
            "The cleverhans backend does not return the input gradient. "
            "Received: return_gradient=True"
        )
    return _run(_cleverhans_attack("fast_gradient_method"), a)


@_same_arguments(pgd)
def cleverhans_pgd(**a: Any) -> Any:
    """`cleverhans.tf2.attacks.projected_gradient_descent` with `pgd`'s
    arguments: one start per example, drawn unseeded (`seed` is unused)."""
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
        _cleverhans_attack("projected_gradient_descent"),
        a,
        step_size,
        steps,
        rand_init=a["random_start"],
        sanity_checks=False,
    )
