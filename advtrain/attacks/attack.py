"""`Attack`: a serializable attack configuration that can be called, the
attack registry, and `make_attack` (an `Attack` from a recipe's keys)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, Optional

import tensorflow as tf

from advtrain.attacks import apgd, cleverhans_backend, fgsm, pgd, square
from advtrain.attacks.common import (
    LossFn,
    ModelFn,
    canonical_norm,
    check_count,
    check_eps,
    check_fraction,
)
from advtrain.utils.errors import ArgumentError
from advtrain.utils.keywords import check_options, keyword_names
from advtrain.utils.registry import Registry

attacks: Registry[Callable] = Registry("attack")

BACKENDS = ("advtrain", "cleverhans")


def register_attack(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering an attack function under a method name.

    The function has the shape of the built-in attacks:
    `fn(model_fn, x, y, *, eps, norm, ...) -> x_adv`, pixels in, pixels
    out. `Attack(name, ...)` then runs it, in training (`AdversarialModel`)
    and in evaluation, passing the keywords the function declares among
    the `Attack` fields (`eps`, `norm`, `alpha`, `steps`, `step_size`,
    `random_start`, `restarts`, `clip_min`, `clip_max`, `clip_start`,
    `noise`, `zero_quantile`, `queries`) and
    the call's `loss_fn`, `loss_scale` (mixed precision: multiply the loss
    before differentiating) and `seed` (a `keras.random` seed). Any other
    keyword argument is an option of the attack: `Attack(name,
    options={...})` passes it (`attack_options` lists them). A recipe
    names it as `attack.method: <name>`, its options as `attack.options`.
    A duplicate name is a ValueError.

    Example:

    ```python
    import tensorflow as tf
    from advtrain.attacks import Attack, register_attack
    from advtrain.attacks.common import (
        attack_inputs, clip_pixels, input_gradient)

    @register_attack("fgsm_half")
    def fgsm_half(model_fn, x, y=None, *, eps, loss_fn=None,
                  loss_scale=None, clip_min=0.0, clip_max=1.0):
        x, y = attack_inputs(model_fn, x, y)  # float tensor; y or predictions
        grad = input_gradient(model_fn, x, y, loss_fn, loss_scale)
        return clip_pixels(x + 0.5 * eps * tf.sign(grad), clip_min, clip_max)

    attack = Attack("fgsm_half", eps=0.1)
    x_adv = attack(lambda z: model(z, training=False), x, y)
    ```
    """
    return attacks.register(name)


@dataclasses.dataclass(frozen=True)
class Attack:
    """An attack and its hyperparameters, in pixel space.

    Calling it runs the attack: `attack(model_fn, x, y)` returns adversarial
    pixels. `method` names a registered attack ("fgsm", "fgsm_rs",
    "n_fgsm", "zerograd", "pgd", "apgd_ce", "apgd_dlr", "square" (gradient-
    free), or one added with `register_attack`). `options` are the
    attack function's own keyword arguments beyond these fields (the
    names `attack_options(method)` lists; any other is a TypeError); every
    call passes them, in training and in evaluation.

    Example:

    ```python
    attack = Attack("pgd", eps=0.1, steps=20, restarts=5)
    x_adv = attack(lambda x: model(x, training=False), x, y)
    # APGD's step-size checkpoint rule (rho), an option of apgd_ce:
    attack = Attack("apgd_ce", eps=0.1, steps=50, options={"rho": 0.5})
    ```
    """

    method: str = "fgsm_rs"
    eps: float = 8 / 255
    norm: str = "inf"
    alpha: Optional[float] = None
    # The recipe's default (attack.steps) too: PGD-7 training, Madry et al.
    steps: int = 7
    step_size: Optional[float] = None
    random_start: bool = True
    restarts: int = 1
    backend: str = "advtrain"
    clip_min: Optional[float] = 0.0
    clip_max: Optional[float] = 1.0
    # fgsm_rs, n_fgsm, zerograd: clip the random start to [clip_min,
    # clip_max] before taking its gradient (advtrain.attacks.fgsm).
    clip_start: bool = True
    # n_fgsm: the random start's radius (default 2 * eps, de Jorge et al.).
    noise: Optional[float] = None
    # zerograd: the share of each example's smallest input-gradient entries
    # set to zero before the step (Golgooni et al. 2021).
    zero_quantile: float = 0.35
    # square: model queries per image and restart (AutoAttack: 5,000).
    queries: int = 5000
    # The attack function's own keyword arguments beyond the fields above
    # (a registered attack's, or apgd's `rho`), checked against its
    # signature: see `attack_options`.
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)

    def __post_init__(self):
        # The one home of the rules on these fields: recipes, `advtrain.fit`,
        # `AdversarialModel` and evaluation all construct an Attack, and a
        # bad value is an `ArgumentError` naming the field (a recipe reports
        # it under its key, `attack.eps`).
        object.__setattr__(self, "norm", canonical_norm(self.norm))
        self._check_numbers()
        self._check_backend()
        attacks.get(self.method)
        self._check_clip_start()
        options = check_options(
            f"attack '{self.method}'",
            self.options,
            attack_options(self.method, self.backend),
            reserved=(*OPTION_KEYS, *CALL_KEYS),
        )
        object.__setattr__(self, "options", options)

    def _check_numbers(self) -> None:
        """The pixel range, then eps (an L-inf ball fits in the pixel
        range), the step sizes, shares and counts."""
        low, high = self.clip_min, self.clip_max
        width = None
        if _is_number(low) and _is_number(high):
            if not (math.isfinite(low) and math.isfinite(high) and low < high):
                raise ArgumentError(
                    "clip_max",
                    "must be a finite number > clip_min (the pixel range). "
                    f"Received: clip_min={low!r}, clip_max={high!r}",
                )
            width = high - low
        if self.norm == "inf" and width is not None:
            check_eps(
                "eps",
                self.eps,
                upper=width,
                why=f", the width of the pixel range [{low:g}, {high:g}] "
                "(eps is in pixel units)",
            )
        else:
            check_eps("eps", self.eps)
        for name in ("alpha", "step_size", "noise"):
            if getattr(self, name) is not None:
                check_eps(name, getattr(self, name))
        check_fraction("zero_quantile", self.zero_quantile)
        for name in ("steps", "restarts", "queries"):
            check_count(name, getattr(self, name))

    def _check_backend(self) -> None:
        if self.backend not in BACKENDS:
            raise ArgumentError(
                "backend",
                f"must be one of {', '.join(BACKENDS)}. "
                f"Received: backend={self.backend!r}",
            )
        if self.backend == "cleverhans" and self.method not in ("fgsm", "pgd"):
            raise ArgumentError(
                "backend",
                "the cleverhans backend provides methods fgsm and pgd only. "
                f"Received: backend='cleverhans', method={self.method!r}",
            )
        one_start = isinstance(self.restarts, int) and self.restarts == 1
        if self.backend == "cleverhans" and not one_start:
            raise ArgumentError(
                "restarts",
                "the cleverhans backend runs one start per example; restarts "
                f"need backend='advtrain'. Received: restarts={self.restarts!r}",
            )

    def _check_clip_start(self) -> None:
        """clip_start=False only for an attack that takes `clip_start`."""
        if self.clip_start:
            return
        takes = keyword_names(
            attacks.get(_function_name(self.method, self.backend)), skip=3
        )
        if takes is None or "clip_start" in takes:
            return
        raise ArgumentError(
            "clip_start",
            "False applies to the attacks with a random start that take it "
            f"({', '.join(_taking('clip_start'))}). Received: "
            f"clip_start=False, method={self.method!r}",
        )

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
        `return_gradient=True` for the single-step attacks, after the
        fields it declares and `options`."""
        fn = attacks.get(_function_name(self.method, self.backend))
        offered = {
            **{name: getattr(self, name) for name in _FIELDS_OFFERED},
            "loss_fn": loss_fn,
            "loss_scale": loss_scale,
            "seed": seed,
        }
        accepted = keyword_names(fn)
        if accepted is not None:
            offered = {k: v for k, v in offered.items() if k in accepted}
        return fn(model_fn, x, y, **offered, **self.options, **extra)

    @property
    def single_step(self) -> bool:
        """FGSM-type: one input gradient, at the clean point or a random one
        (the attack can return it: `return_gradient=True`)."""
        return self.backend == "advtrain" and self.method in SINGLE_STEP

    @property
    def fusable(self) -> bool:
        """FGSM or FGSM-RS, which `step_from_gradient` (the fused training
        step) can take from a gradient computed elsewhere."""
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

        if not self.fusable:
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


# The built-in single-step attacks (advtrain backend).
SINGLE_STEP = ("fgsm", "fgsm_rs", "n_fgsm", "zerograd")

# The keyword arguments of `make_attack`: every `Attack` field but `method`.
OPTION_KEYS = tuple(f.name for f in dataclasses.fields(Attack) if f.name != "method")
# The fields `__call__` offers the attack function, by name.
_FIELDS_OFFERED = tuple(k for k in OPTION_KEYS if k not in ("backend", "options"))
# Keywords the caller of an attack gives per call (`Attack.__call__`,
# `return_gradient`, `return_queries`): never options.
CALL_KEYS = ("loss_fn", "loss_scale", "seed", "return_gradient", "return_queries")


def attack_options(method: str, backend: str = "advtrain") -> Optional[tuple[str, ...]]:
    """The options the registered attack `method` takes: the keyword
    arguments of its function (after `model_fn, x, y`) that are neither
    `Attack` fields nor given per call (`CALL_KEYS`); None when it takes
    `**kwargs`. `Attack(method, options={...})` accepts these names only.

    Example:

    ```python
    @register_attack("scaled_noise")
    def scaled_noise(model_fn, x, y=None, *, eps, scale=1.0, seed=None):
        noise = keras.random.uniform(tf.shape(x), -eps, eps, seed=seed)
        return tf.clip_by_value(x + scale * noise, 0.0, 1.0)

    attack_options("scaled_noise")  # ("scale",)
    attack = Attack("scaled_noise", eps=0.1, options={"scale": 0.5})
    x_adv = attack(lambda z: model(z, training=False), x, y)
    ```
    """
    names = keyword_names(attacks.get(_function_name(method, backend)), skip=3)
    if names is None:
        return None
    return tuple(n for n in names if n not in OPTION_KEYS and n not in CALL_KEYS)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _taking(keyword: str) -> list[str]:
    """The registered advtrain-backend attacks whose function takes
    `keyword`."""
    return [
        name
        for name in attacks.names()
        if not name.startswith("cleverhans_")
        and keyword in (keyword_names(attacks.get(name), skip=3) or ())
    ]


def _function_name(method: str, backend: str) -> str:
    """The registry name of `method` on `backend`."""
    return method if backend == "advtrain" else f"cleverhans_{method}"


def make_attack(method: str = "fgsm_rs", /, **options: Any) -> Optional[Attack]:
    """The `Attack` a recipe's attack keys describe; None for "none".

    `method` is a registered attack or "none" (no training attack).
    `options` are the `Attack` fields by their recipe names: eps, norm,
    alpha, steps, step_size, random_start, restarts, backend, clip_start,
    clip_min, clip_max, noise, zero_quantile, queries, and `options` (the
    attack function's own, see `attack_options`). Unknown keys are a
    TypeError.

    Example:

    ```python
    make_attack("pgd", eps=0.3, steps=7)  # Attack("pgd", eps=0.3, steps=7)
    make_attack("apgd_ce", eps=0.3, options={"rho": 0.5})
    make_attack("none")  # None
    ```
    """
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise TypeError(
            f"make_attack takes the keys {', '.join(OPTION_KEYS)}. "
            "Received: " + ", ".join(f"{k}={options[k]!r}" for k in unknown)
        )
    if method == "none":
        return None
    return Attack(method, **options)


# The built-in methods; "cleverhans_" + method for that backend.
register_attack("fgsm")(fgsm.fgsm)
register_attack("fgsm_rs")(fgsm.fgsm_random_start)
register_attack("n_fgsm")(fgsm.n_fgsm)
register_attack("zerograd")(fgsm.zerograd)
register_attack("pgd")(pgd.pgd)
register_attack("apgd_ce")(apgd.apgd_ce)
register_attack("apgd_dlr")(apgd.apgd_dlr)
register_attack("square")(square.square)
register_attack("cleverhans_fgsm")(cleverhans_backend.cleverhans_fgsm)
register_attack("cleverhans_pgd")(cleverhans_backend.cleverhans_pgd)
