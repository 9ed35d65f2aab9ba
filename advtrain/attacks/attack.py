"""`Attack`: a serializable attack configuration that can be called."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import tensorflow as tf

from advtrain.attacks import apgd, cleverhans_backend, fgsm, pgd
from advtrain.attacks.common import LossFn, ModelFn, canonical_norm, check_eps
from advtrain.registry import Registry

attacks: Registry = Registry("attack")
register_attack = attacks.register

BACKENDS = ("advtrain", "cleverhans")


@dataclasses.dataclass(frozen=True)
class Attack:
    """An attack and its hyperparameters, in pixel space.

    Calling it runs the attack: `attack(model_fn, x, y)` returns adversarial
    pixels. `method` names a registered attack ("fgsm", "fgsm_rs", "pgd").

    Example:

    ```python
    attack = Attack("pgd", eps=0.1, steps=20, restarts=5)
    x_adv = attack(lambda x: model(x, training=False), x, y)
    ```
    """

    method: str = "fgsm_rs"
    eps: float = 8 / 255
    norm: str = "inf"
    alpha: Optional[float] = None
    steps: int = 10
    step_size: Optional[float] = None
    random_start: bool = True
    restarts: int = 1
    backend: str = "advtrain"
    clip_min: Optional[float] = 0.0
    clip_max: Optional[float] = 1.0
    # fgsm_rs: clip the random start to [clip_min, clip_max] before taking
    # its gradient (see advtrain.attacks.fgsm.fgsm_random_start).
    clip_start: bool = True

    def __post_init__(self):
        object.__setattr__(self, "norm", canonical_norm(self.norm))
        check_eps("eps", self.eps)
        pgd.check_count("steps", self.steps)
        pgd.check_count("restarts", self.restarts)
        if self.backend not in BACKENDS:
            raise ValueError(
                f"backend must be one of {', '.join(BACKENDS)}. "
                f"Received: backend={self.backend!r}"
            )
        if self.backend == "cleverhans" and self.method not in ("fgsm", "pgd"):
            raise ValueError(
                "The cleverhans backend provides fgsm and pgd. "
                f"Received: method={self.method!r}"
            )
        one_start = isinstance(self.restarts, int) and self.restarts == 1
        if self.backend == "cleverhans" and not one_start:
            raise ValueError(
                "The cleverhans backend runs one start per example; restarts "
                f"need backend='advtrain'. Received: restarts={self.restarts!r}"
            )
        attacks.get(self.method)

    def __call__(
        self,
        model_fn: ModelFn,
        x: Any,
        y: Optional[Any] = None,
        *,
        loss_fn: Optional[LossFn] = None,
        loss_scale: Optional[Any] = None,
        seed: Any = None,
        **extra: Any,
    ) -> tf.Tensor:
        """Runs the attack. `extra` goes to the attack function, e.g.
        `return_gradient=True` for the single-step attacks."""
        key = self.method if self.backend == "advtrain" else f"cleverhans_{self.method}"
        return attacks.get(key)(
            self,
            model_fn,
            x,
            y,
            loss_fn=loss_fn,
            loss_scale=loss_scale,
            seed=seed,
            **extra,
        )

    @property
    def single_step(self) -> bool:
        """FGSM-type: one input gradient, at the clean point or a random one."""
        return self.backend == "advtrain" and self.method in ("fgsm", "fgsm_rs")

    def step_from_gradient(self, x, grad, seed: Any = None) -> tf.Tensor:
        """The FGSM(-RS) result for a gradient computed elsewhere.

        Used by the fused training step, which gets the input gradient at
        the clean point from the clean loss's own backward pass. With a
        random start the step is taken from the random point using that
        clean-point gradient (an approximation of FGSM-RS, which would
        differentiate at the random point).
        """
        from advtrain.attacks.common import (
            clip_pixels,
            project,
            random_in_ball,
            steepest_step,
        )

        if not self.single_step:
            raise ValueError(
                "step_from_gradient needs method fgsm or fgsm_rs on the "
                f"advtrain backend. Received: method={self.method!r}, "
                f"backend={self.backend!r}"
            )
        if self.method == "fgsm":
            x_adv = x + steepest_step(grad, self.eps, self.norm)
        else:
            alpha = 1.25 * self.eps if self.alpha is None else self.alpha
            delta = random_in_ball(x, self.eps, self.norm, seed)
            delta = project(
                delta + steepest_step(grad, alpha, self.norm), self.eps, self.norm
            )
            x_adv = x + delta
        return clip_pixels(x_adv, self.clip_min, self.clip_max)

    def replace(self, **changes: Any) -> Attack:
        return dataclasses.replace(self, **changes)

    def get_config(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Attack:
        return cls(**config)


# Adapters from an Attack's fields to each function's keywords. Attacks are
# looked up by method, or by "cleverhans_" + method for that backend.

_PIXELS = ("eps", "norm", "clip_min", "clip_max")


def _fields(a: Attack, *names: str) -> dict[str, Any]:
    return {name: getattr(a, name) for name in (*_PIXELS, *names)}


@register_attack("fgsm")
def _fgsm(a, model_fn, x, y, *, loss_fn, loss_scale, seed, **extra):
    del seed
    return fgsm.fgsm(
        model_fn, x, y, loss_fn=loss_fn, loss_scale=loss_scale,
        **_fields(a), **extra,
    )  # fmt: skip


@register_attack("fgsm_rs")
def _fgsm_rs(a, model_fn, x, y, *, loss_fn, loss_scale, seed, **extra):
    return fgsm.fgsm_random_start(
        model_fn, x, y, loss_fn=loss_fn, loss_scale=loss_scale, seed=seed,
        **_fields(a, "alpha", "clip_start"), **extra,
    )  # fmt: skip


@register_attack("pgd")
def _pgd(a, model_fn, x, y, *, loss_fn, loss_scale, seed):
    return pgd.pgd(
        model_fn, x, y, loss_fn=loss_fn, loss_scale=loss_scale, seed=seed,
        **_fields(a, "steps", "step_size", "random_start", "restarts"),
    )  # fmt: skip


@register_attack("apgd_ce")
def _apgd_ce(a, model_fn, x, y, *, loss_fn, loss_scale, seed, **extra):
    return apgd.apgd_ce(
        model_fn, x, y, loss_fn=loss_fn, loss_scale=loss_scale, seed=seed,
        **_fields(a, "steps", "restarts"), **extra,
    )  # fmt: skip


@register_attack("apgd_dlr")
def _apgd_dlr(a, model_fn, x, y, *, loss_fn, loss_scale, seed, **extra):
    del loss_fn  # DLR is the attack's own loss; `targets=` comes in `extra`
    return apgd.apgd_dlr(
        model_fn, x, y, loss_scale=loss_scale, seed=seed,
        **_fields(a, "steps", "restarts"), **extra,
    )  # fmt: skip


@register_attack("cleverhans_fgsm")
def _ch_fgsm(a, model_fn, x, y, *, loss_fn, loss_scale, seed):
    del seed  # cleverhans has no random start for FGSM
    return cleverhans_backend.cleverhans_fgsm(
        model_fn, x, y, loss_fn=loss_fn, loss_scale=loss_scale, **_fields(a)
    )


@register_attack("cleverhans_pgd")
def _ch_pgd(a, model_fn, x, y, *, loss_fn, loss_scale, seed):
    del seed  # cleverhans draws its random start unseeded
    return cleverhans_backend.cleverhans_pgd(
        model_fn, x, y, loss_fn=loss_fn, loss_scale=loss_scale,
        **_fields(a, "steps", "step_size", "random_start"),
    )  # fmt: skip
