"""`Attack`: a serializable attack configuration that can be called."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import tensorflow as tf

from advtrain.attacks import cleverhans_backend, fgsm, pgd
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

    def __post_init__(self):
        object.__setattr__(self, "norm", canonical_norm(self.norm))
        check_eps("eps", self.eps)
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
    ) -> tf.Tensor:
        key = self.method if self.backend == "advtrain" else f"cleverhans_{self.method}"
        return attacks.get(key)(
            self, model_fn, x, y, loss_fn=loss_fn, loss_scale=loss_scale, seed=seed
        )

    def replace(self, **changes: Any) -> "Attack":
        return dataclasses.replace(self, **changes)

    def get_config(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Attack":
        return cls(**config)


# Adapters from an Attack's fields to each function's keywords. Attacks are
# looked up by method, or by "cleverhans_" + method for that backend.


@register_attack("fgsm")
def _fgsm(a, model_fn, x, y, *, loss_fn, loss_scale, seed):
    del seed
    return fgsm.fgsm(
        model_fn, x, y, eps=a.eps, norm=a.norm, loss_fn=loss_fn,
        clip_min=a.clip_min, clip_max=a.clip_max, loss_scale=loss_scale,
    )


@register_attack("fgsm_rs")
def _fgsm_rs(a, model_fn, x, y, *, loss_fn, loss_scale, seed):
    return fgsm.fgsm_random_start(
        model_fn, x, y, eps=a.eps, alpha=a.alpha, norm=a.norm,
        loss_fn=loss_fn, clip_min=a.clip_min, clip_max=a.clip_max,
        loss_scale=loss_scale, seed=seed,
    )


@register_attack("pgd")
def _pgd(a, model_fn, x, y, *, loss_fn, loss_scale, seed):
    return pgd.pgd(
        model_fn, x, y, eps=a.eps, steps=a.steps, step_size=a.step_size,
        norm=a.norm, random_start=a.random_start, restarts=a.restarts,
        loss_fn=loss_fn, clip_min=a.clip_min, clip_max=a.clip_max,
        loss_scale=loss_scale, seed=seed,
    )


@register_attack("cleverhans_fgsm")
def _ch_fgsm(a, model_fn, x, y, *, loss_fn, loss_scale, seed):
    del loss_scale, seed
    return cleverhans_backend.cleverhans_fgsm(
        model_fn, x, y, eps=a.eps, norm=a.norm, loss_fn=loss_fn,
        clip_min=a.clip_min, clip_max=a.clip_max,
    )


@register_attack("cleverhans_pgd")
def _ch_pgd(a, model_fn, x, y, *, loss_fn, loss_scale, seed):
    del loss_scale, seed
    return cleverhans_backend.cleverhans_pgd(
        model_fn, x, y, eps=a.eps, steps=a.steps, step_size=a.step_size,
        norm=a.norm, random_start=a.random_start, loss_fn=loss_fn,
        clip_min=a.clip_min, clip_max=a.clip_max,
    )
