"""The rules on `AdversarialModel`'s arguments, checked before anything is
built, and the arguments of its `fit`."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterable
from typing import Any, Optional

import keras

from advtrain.attacks import Attack, attack_settings
from advtrain.models.batchnorm.policy import (
    RENAMED_MOMENTUM,
    check_momentum,
    fit_total_steps,
    set_momentum,
)
from advtrain.utils.errors import ArgumentError
from advtrain.utils.keywords import check_keywords, keyword_names

ATTACK_MODES = ("inference", "train")
# What `keras.Model.__init__` takes besides a model's own arguments.
KERAS_KEYWORDS = ("name", "dtype", "trainable", "autocast", "activity_regularizer")
# Keywords of 0.2 and their 0.3 names: refused from Python, mapped in a
# saved 0.2 config.
RENAMED = {"fused": "reuse_gradient"}
# The fields of 0.2's one `Attack` dataclass: a saved 0.2 attack lists them
# all; its config drops those its method does not take.
ATTACK_FIELDS_0_2 = (
    "alpha",
    "steps",
    "step_size",
    "random_start",
    "restarts",
    "clip_start",
    "noise",
    "zero_quantile",
    "queries",
    "options",
)


def check_keywords_known(owner: str, given: dict, accepted: Iterable[str]) -> None:
    """A TypeError for a keyword `owner` does not take (or renamed since 0.2)."""
    for old, new in RENAMED.items():
        if old in given:
            raise TypeError(
                f"{owner}: `{old}` was renamed `{new}` in 0.3. "
                f"Received: {old}={given[old]!r}"
            )
    check_keywords(owner, given, [*accepted, *KERAS_KEYWORDS])


def renamed_config(config: dict) -> dict:
    # A saved 0.2 config's keys under their 0.3 names.
    config = dict(config)
    for old, new in RENAMED.items():
        if old in config:
            config.setdefault(new, config.pop(old))
    momentum = config.get("batchnorm_momentum")
    if isinstance(momentum, str) and momentum in RENAMED_MOMENTUM:
        config["batchnorm_momentum"] = RENAMED_MOMENTUM[momentum]
    if isinstance(config.get("attack"), dict):
        config["attack"] = _attack_without_0_2_fields(config["attack"])
    return config


def _attack_without_0_2_fields(attack: dict) -> dict:
    attack = {**attack, **(attack.get("options") or {})}
    attack.pop("options", None)
    takes = attack_settings(
        attack.get("method", "fgsm_rs"), attack.get("backend", "advtrain")
    )
    if takes is None:
        return attack
    return {k: v for k, v in attack.items() if k not in ATTACK_FIELDS_0_2 or k in takes}


def checked_arguments(
    attack, adv_weight, attack_mode, eps_ramp_steps, batchnorm_momentum
) -> Optional[Attack]:
    """Validates `AdversarialModel`'s arguments; returns the `Attack`."""
    check_momentum(batchnorm_momentum, "batchnorm_momentum")
    if isinstance(attack, dict):
        attack = Attack.from_config(attack)
    if attack is not None and not isinstance(attack, Attack):
        raise TypeError(
            "attack must be an advtrain.attacks.Attack or its config dict. "
            f"Received: attack={attack!r}"
        )
    number = isinstance(adv_weight, (int, float)) and not isinstance(adv_weight, bool)
    if not number or not 0 <= adv_weight <= 1:
        raise ArgumentError(
            "adv_weight",
            f"must be between 0.0 and 1.0. Received: adv_weight={adv_weight!r}",
        )
    if adv_weight > 0 and attack is None:
        raise ArgumentError(
            "attack", "adv_weight > 0 needs an attack. Received: attack=None"
        )
    _check_ramp(eps_ramp_steps, attack)
    if attack_mode not in ATTACK_MODES:
        raise ArgumentError(
            "attack_mode",
            f"must be one of {', '.join(ATTACK_MODES)}. "
            f"Received: attack_mode={attack_mode!r}",
        )
    return attack


def _check_ramp(eps_ramp_steps, attack: Optional[Attack]) -> None:
    if (
        isinstance(eps_ramp_steps, bool)
        or not isinstance(eps_ramp_steps, int)
        or eps_ramp_steps < 0
    ):
        raise ArgumentError(
            "eps_ramp_steps",
            f"must be an integer >= 0. Received: eps_ramp_steps={eps_ramp_steps!r}",
        )
    if eps_ramp_steps and (attack is None or attack.backend != "advtrain"):
        received = "attack=None" if attack is None else f"backend={attack.backend!r}"
        raise ArgumentError(
            "eps_ramp_steps",
            "eps_ramp_steps > 0 needs an attack on the advtrain backend. "
            f"Received: {received}",
        )


def check_hooks(cls: type) -> None:
    names = keyword_names(cls.generate_adversarial)
    if names is None or "attack" in names:
        return
    raise TypeError(
        f"{cls.__name__}.generate_adversarial must take the step's attack, "
        "as `def generate_adversarial(self, x, y, attack=None)` (the "
        "training step passes the eps-ramped attack; 0.3's hook took x, y). "
        f"Received: generate_adversarial{inspect.signature(cls.generate_adversarial)}"
    )


_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def init_keywords(
    cls: type, stop: type, skip: int = 1, passed_on: bool = False
) -> list[str]:
    """The keyword names of each `__init__` from `cls` up to `stop`
    (excluded), after its first `skip` parameters; with `passed_on`, only
    as far as each passes `**kwargs` on."""
    names: list[str] = []
    for klass in cls.__mro__:
        if klass is stop:
            break
        if "__init__" not in vars(klass):
            continue
        parameters = list(inspect.signature(klass.__init__).parameters.values())
        names += [
            p.name
            for p in parameters[skip:]
            if p.kind in _BY_KEYWORD and p.name not in names
        ]
        if passed_on and not any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters
        ):
            break
    return names


def set_momentum_for_fit(classifier: keras.Model, momentum: Any, arguments: dict):
    steps = None
    if momentum == "auto":
        names = keyword_names(fit_total_steps)
        steps = fit_total_steps(**{k: v for k, v in arguments.items() if k in names})
    note = set_momentum(classifier, momentum, steps)
    if note:
        warnings.warn(
            f"{note} Pass batchnorm_momentum=None to keep them.", stacklevel=3
        )


def fit_arguments(*args, **kwargs) -> Optional[dict[str, Any]]:
    """`keras.Model.fit`'s arguments by name; None when they do not bind."""
    try:
        bound = inspect.signature(keras.Model.fit).bind(None, *args, **kwargs)
    except TypeError:
        return None
    return {k: v for k, v in bound.arguments.items() if k != "self"}
