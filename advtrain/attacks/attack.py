"""`Attack`: an attack method and its own settings, callable; the attack
registry. A method's settings are the keyword arguments of its function
after `model_fn, x, y` (`attack_settings`)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, Optional

from advtrain.attacks import apgd, cleverhans_backend, fab, fgsm, pgd, square
from advtrain.attacks.common import (
    LossFn,
    ModelFn,
    canonical_norm,
    check_count,
    check_eps,
    check_fraction,
    is_number,
    is_tensor,
)
from advtrain.utils.errors import ArgumentError, did_you_mean
from advtrain.utils.keywords import keyword_names
from advtrain.utils.registry import Registry

attacks: Registry[Callable] = Registry("attack")
# Method name -> its `from_gradient` step (`register_attack`).
gradient_steps: dict[str, Callable] = {}

BACKENDS = ("advtrain", "cleverhans")

# The settings every method shares, with their defaults.
SHARED = {"eps": 8 / 255, "norm": "inf", "clip_min": 0.0, "clip_max": 1.0}

# Keywords given per call, never settings.
CALL_KEYS = ("loss_fn", "loss_scale", "seed", "return_gradient", "return_queries")

SINGLE_STEP = ("fgsm", "fgsm_rs", "n_fgsm", "zerograd")


def register_attack(
    name: str, *, from_gradient: Optional[Callable] = None
) -> Callable[[Callable], Callable]:
    """Decorator registering an attack function under a method name.

    The function has the shape of the built-in attacks,
    `fn(model_fn, x, y, *, eps, norm, ...) -> x_adv`, pixels in and out;
    its keyword arguments are the method's settings, which `Attack(name,
    ...)` accepts and passes on every call, with the call's `loss_fn`,
    `loss_scale` (multiply the loss before differentiating) and `seed`
    where the function takes them. A duplicate name is a ValueError. A
    single-step method may give `from_gradient`, `fn(x, grad, *, eps, ...)
    -> x_adv`, its result for an input gradient computed elsewhere: the
    gradient-reusing training step passes the clean loss's own.

    Example:

    ```python
    from keras import ops
    from advtrain.attacks import Attack, register_attack
    from advtrain.attacks.common import (
        attack_inputs, clip_pixels, input_gradient)

    @register_attack("fgsm_scaled")
    def fgsm_scaled(model_fn, x, y=None, *, eps, scale=0.5, loss_fn=None,
                    loss_scale=None, clip_min=0.0, clip_max=1.0):
        x, y = attack_inputs(model_fn, x, y)  # float tensor; y or predictions
        grad = input_gradient(model_fn, x, y, loss_fn, loss_scale)
        return clip_pixels(x + scale * eps * ops.sign(grad), clip_min, clip_max)

    attack = Attack("fgsm_scaled", eps=0.1, scale=0.25)
    x_adv = attack(lambda z: model(z, training=False), x, y)
    ```
    """
    register = attacks.register(name)

    def decorator(fn: Callable) -> Callable:
        register(fn)
        if from_gradient is not None:
            gradient_steps[name] = from_gradient
        return fn

    return decorator


def attack_settings(method: str, backend: str = "advtrain") -> Optional[dict]:
    """The settings `method` takes beyond the shared ones, with their
    defaults (`inspect.Parameter.empty`: required); None for `**kwargs`.

    Example:

    ```python
    attack_settings("pgd")
    # {"steps": 10, "step_size": None, "random_start": True, "restarts": 1}
    attack_settings("fgsm")  # {}
    ```
    """
    parameters = _parameters(method, backend)
    if parameters is None:
        return None
    return {k: v for k, v in parameters.items() if k not in SHARED}


def _parameters(method: str, backend: str) -> Optional[dict[str, Any]]:
    # Every setting the method's function takes, shared ones included.
    fn = attacks.get(_function_name(method, backend))
    names, defaults = _signature(fn)
    if names is None:
        return None
    skip = CALL_KEYS + tuple(defaults)[:3]  # model_fn, x, y
    return {k: defaults[k].default for k in names if k not in skip}


# Per attack function: its keyword names and parameters, read once. An
# eager step (PyTorch) builds and calls its attack every step, and
# `inspect.signature` costs about as much as a small tensor op.
_SIGNATURES: dict[int, tuple[Callable, Optional[tuple[str, ...]], Any]] = {}


def _signature(fn: Callable) -> tuple[Optional[tuple[str, ...]], Any]:
    entry = _SIGNATURES.get(id(fn))
    if entry is None or entry[0] is not fn:
        entry = (fn, keyword_names(fn), inspect.signature(fn).parameters)
        _SIGNATURES[id(fn)] = entry
    return entry[1], entry[2]


_UNSET = object()  # a shared setting the caller did not give


class Attack:
    """An attack method and its settings; `attack(model_fn, x, y)` returns
    adversarial pixels.

    `method` names a registered attack ("fgsm", "fgsm_rs", "n_fgsm",
    "zerograd", "pgd", "apgd_ce", "apgd_dlr", "fab_t", "square", or one
    added with `register_attack`). Every method takes `eps` (pixel units),
    `norm` ("inf" or 2) and the pixel range `clip_min`, `clip_max`;
    `backend` is "advtrain" or "cleverhans" (fgsm and pgd). Other keywords
    (or `options`, a mapping) are the method's own settings
    (`attack_settings(method)`); any other is an `ArgumentError`. An
    `Attack` is immutable and hashable; `replace` returns a changed copy.

    Example:

    ```python
    attack = Attack("pgd", eps=0.1, steps=20, restarts=5)
    x_adv = attack(lambda x: model(x, training=False), x, y)
    attack.settings  # {"steps": 20, "step_size": None, ...}
    Attack("fgsm", eps=0.1, steps=50)
    # ArgumentError: steps: fgsm does not take steps; it takes eps, norm,
    # clip_min, clip_max. Received: steps=50
    ```
    """

    def __init__(
        self,
        method: str = "fgsm_rs",
        *,
        eps: Any = _UNSET,
        norm: Any = _UNSET,
        clip_min: Any = _UNSET,
        clip_max: Any = _UNSET,
        backend: str = "advtrain",
        options: Optional[Mapping[str, Any]] = None,
        **settings: Any,
    ):
        given = dict(eps=eps, norm=norm, clip_min=clip_min, clip_max=clip_max)
        given = {k: v for k, v in given.items() if v is not _UNSET}
        _check_backend(method, backend)
        settings = _merged(settings, options)
        parameters = _parameters(method, backend)
        _check_taken(method, parameters, {**given, **settings})
        shared = {**SHARED, **given}
        shared["norm"] = canonical_norm(shared["norm"])
        own = {**(attack_settings(method, backend) or {}), **settings}
        missing = [k for k, v in own.items() if v is inspect.Parameter.empty]
        if missing:
            raise ArgumentError(
                missing[0], f"{method} needs a value for {missing[0]}. Received: none"
            )
        _check_numbers(shared, own)
        if backend == "cleverhans" and own.get("restarts", 1) != 1:
            raise ArgumentError(
                "restarts",
                "the cleverhans backend runs one start per example; restarts "
                f"need backend='advtrain'. Received: restarts={own['restarts']!r}",
            )
        state = self.__dict__
        state.update(method=method, backend=backend, _shared=shared, _own=own)

    def __getattr__(self, name: str) -> Any:
        # Only called when ordinary lookup fails: the shared and own settings.
        state = self.__dict__
        if "_own" in state:
            values = {**state["_own"], **state["_shared"]}
            if name in values:
                return values[name]
            raise AttributeError(
                f"{state['method']} has no setting '{name}'; it takes "
                f"{_takes_text(_parameters(state['method'], state['backend']))}"
            )
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"an Attack is immutable; use attack.replace({name}=...). "
            f"Received: {name}={value!r}"
        )

    @property
    def settings(self) -> dict[str, Any]:
        """The method's own settings (not the shared ones), by name."""
        return dict(self._own)

    def _key(self) -> tuple:
        return (self.method, self.backend, _frozen({**self._shared, **self._own}))

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Attack) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        shown = {"eps": self.eps, "norm": self.norm}
        for name in ("clip_min", "clip_max"):
            if self._shared[name] != SHARED[name]:
                shown[name] = self._shared[name]
        if self.backend != "advtrain":
            shown["backend"] = self.backend
        shown.update(self._own)
        pairs = ", ".join(f"{k}={v!r}" for k, v in shown.items())
        return f"Attack({self.method!r}, {pairs})"

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
    ) -> Any:
        """Runs the attack; `extra` (e.g. `return_gradient=True`) goes to
        the attack function as it is."""
        fn = attacks.get(_function_name(self.method, self.backend))
        per_call = {"loss_fn": loss_fn, "loss_scale": loss_scale, "seed": seed}
        return fn(model_fn, x, y, **self._arguments(fn, per_call), **extra)

    def _arguments(self, fn: Callable, per_call: dict[str, Any]) -> dict[str, Any]:
        takes, _ = _signature(fn)  # None: **kwargs, any name
        return {
            **{k: v for k, v in self._shared.items() if takes is None or k in takes},
            **self._own,
            **{k: v for k, v in per_call.items() if takes is None or k in takes},
        }

    @property
    def single_step(self) -> bool:
        """FGSM-type: one input gradient (`return_gradient=True` returns it)."""
        return self.backend == "advtrain" and self.method in SINGLE_STEP

    @property
    def fusable(self) -> bool:
        """Whether the method has a `from_gradient` step (FGSM, FGSM-RS)."""
        return self.backend == "advtrain" and self.method in gradient_steps

    def step_from_gradient(self, x, grad, seed: Any = None) -> Any:
        """The method's result for an input gradient `grad` computed
        elsewhere, by its `from_gradient` function."""
        if not self.fusable:
            raise ValueError(
                "step_from_gradient needs a method with a step from a gradient "
                f"({', '.join(sorted(gradient_steps))}) on the advtrain backend. "
                f"Received: method={self.method!r}, backend={self.backend!r}"
            )
        step = gradient_steps[self.method]
        return step(x, grad, **self._arguments(step, {"seed": seed}))

    def replace(self, **changes: Any) -> Attack:
        """A copy with `changes` (settings, `method` or `backend`); a new
        method keeps the settings it takes."""
        method = changes.pop("method", self.method)
        backend = changes.pop("backend", self.backend)
        values = {**self._shared, **self._own}
        if (method, backend) != (self.method, self.backend):
            takes = _parameters(method, backend)
            values = {k: v for k, v in values.items() if takes is None or k in takes}
        return Attack(method, backend=backend, **{**values, **changes})

    def get_config(self) -> dict[str, Any]:
        """`method`, `backend`, the shared settings and the method's own."""
        return {
            "method": self.method,
            "backend": self.backend,
            **self._shared,
            **self._own,
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Attack:
        """The `Attack` of a `get_config` dict: `method` (default
        "fgsm_rs") and `Attack`'s keyword arguments.

        Example:

        ```python
        Attack.from_config({"method": "pgd", "eps": 0.3, "steps": 7})
        ```
        """
        if not isinstance(config, Mapping):
            raise TypeError(
                "An attack config must be a mapping of Attack's arguments. "
                f"Received: config={config!r}"
            )
        config = dict(config)
        return cls(config.pop("method", "fgsm_rs"), **config)


def _check_backend(method: str, backend: str) -> None:
    if backend not in BACKENDS:
        raise ArgumentError(
            "backend",
            f"must be one of {', '.join(BACKENDS)}. Received: backend={backend!r}",
        )
    attacks.get(method)  # an unknown method: the registry's did-you-mean
    if backend == "cleverhans" and method not in ("fgsm", "pgd"):
        raise ArgumentError(
            "backend",
            "the cleverhans backend provides methods fgsm and pgd only. "
            f"Received: backend='cleverhans', method={method!r}",
        )


def _merged(settings: dict[str, Any], options: Any) -> dict[str, Any]:
    if options is None:
        return settings
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise ArgumentError(
            "options",
            f"must map setting names to values. Received: options={options!r}",
        )
    twice = sorted(set(options) & set(settings))
    if twice:
        raise ArgumentError(
            "options",
            f"'{twice[0]}' is given both as a keyword and in options; give "
            f"it once. Received: options={dict(options)!r}",
        )
    return {**settings, **options}


def _check_taken(method: str, parameters: Optional[dict], given: dict) -> None:
    for name, value in given.items():
        if name in CALL_KEYS:
            raise ArgumentError(
                name,
                f"is given per call (attack(model_fn, x, y, {name}=...)), not "
                f"as a setting. Received: {name}={value!r}",
            )
        if parameters is None or name in parameters or name == "eps":
            continue
        if name in SHARED and value == SHARED[name]:
            continue  # a shared default is no setting of the user's
        hint = did_you_mean(name, [k for k in parameters if k not in SHARED])
        raise ArgumentError(
            name,
            f"{method} does not take {name}; it takes "
            f"{_takes_text(parameters)}.{hint} "
            f"Received: {name}={value!r}",
        )


def _takes_text(parameters: Optional[dict]) -> str:
    if parameters is None:
        return "any keyword (its function takes **kwargs)"
    return ", ".join(["eps", *(k for k in parameters if k != "eps")])


def _check_numbers(shared: dict[str, Any], own: dict[str, Any]) -> None:
    low, high = shared["clip_min"], shared["clip_max"]
    upper, why = None, ""
    if is_number(low) and is_number(high):
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ArgumentError(
                "clip_max",
                "must be a finite number > clip_min (the pixel range). "
                f"Received: clip_min={low!r}, clip_max={high!r}",
            )
        if shared["norm"] == "inf":  # the L-inf ball fits in the pixel range
            upper = high - low
            why = f", the width of the pixel range [{low:g}, {high:g}] "
            why += "(eps is in pixel units)"
    check_eps("eps", shared["eps"], upper, why)
    for name in ("alpha", "step_size", "noise"):
        if own.get(name) is not None:
            check_eps(name, own[name])
    if "zero_quantile" in own and not is_tensor(own["zero_quantile"]):
        check_fraction("zero_quantile", own["zero_quantile"])
    for name in ("steps", "restarts", "queries"):
        if name in own:
            check_count(name, own[name])


def _frozen(value: Any) -> Any:
    # Hashable: lists as tuples, mappings as sorted pairs.
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


def _function_name(method: str, backend: str) -> str:
    return method if backend == "advtrain" else f"cleverhans_{method}"


# The built-in methods; "cleverhans_" + method for that backend.
register_attack("fgsm", from_gradient=fgsm.fgsm_from_gradient)(fgsm.fgsm)
register_attack("fgsm_rs", from_gradient=fgsm.fgsm_random_start_from_gradient)(
    fgsm.fgsm_random_start
)
register_attack("n_fgsm")(fgsm.n_fgsm)
register_attack("zerograd")(fgsm.zerograd)
register_attack("pgd")(pgd.pgd)
register_attack("apgd_ce")(apgd.apgd_ce)
register_attack("apgd_dlr")(apgd.apgd_dlr)
register_attack("square")(square.square)
register_attack("fab_t")(fab.fab_t)
register_attack("cleverhans_fgsm")(cleverhans_backend.cleverhans_fgsm)
register_attack("cleverhans_pgd")(cleverhans_backend.cleverhans_pgd)
