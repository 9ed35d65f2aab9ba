"""The objective registry: training objectives (`AdversarialModel` and its
subclasses) by name, and the keyword options each one takes."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from advtrain.models.adversarial import AdversarialModel
from advtrain.utils.registry import Registry

objectives: Registry[type[AdversarialModel]] = Registry("objective")


def register_objective(name: str) -> Callable[[type], type]:
    """Class decorator registering a training objective under a name.

    An objective is an `AdversarialModel` subclass that changes the
    documented hooks (`generate_adversarial`, `adversarial_loss`) and
    inherits the step, metrics and saving. It is built as
    `cls(classifier, attack, adv_weight=..., attack_mode=..., seed=...,
    reuse_gradient=..., eps_ramp_steps=..., **options)`: so its `__init__` takes
    `(classifier, attack=None, <its options>, **kwargs)` and passes
    `**kwargs` on; `options` are the keyword arguments it adds
    (`objective_options` lists them, and a builder accepts no other).
    An objective that always attacks with one method (TRADES: "pgd")
    names it in the class attribute `attack_method`.

    Built in: "adversarial" (`AdversarialModel`, the clean/adversarial
    mix), "trades" (`TRADES`) and "grad_align" (`GradAlign`). A recipe
    picks one with `attack.objective: <name>` and passes its options in
    `attack.objective_options` (its `plugins` key imports the module
    that registers it).

    Args:
        name: the objective's name; a duplicate is a ValueError.

    Returns:
        The decorator, which raises TypeError for a class that is not an
        `AdversarialModel` subclass.

    Example:

    ```python
    import tensorflow as tf
    import advtrain

    @advtrain.register_objective("logit_pairing")
    class LogitPairing(advtrain.AdversarialModel):
        # The mixed loss plus the squared clean-to-adversarial logit gap.
        def __init__(self, classifier, attack=None, pairing=0.5, **kwargs):
            super().__init__(classifier, attack, **kwargs)
            self.pairing = float(pairing)

        def adversarial_loss(self, x, y, y_pred, x_adv, y_pred_adv,
                             sample_weight):
            loss = super().adversarial_loss(
                x, y, y_pred, x_adv, y_pred_adv, sample_weight)
            gap = tf.reduce_sum(tf.square(y_pred - y_pred_adv), axis=-1)
            return loss + self.pairing * self.reduce_per_example(
                gap, sample_weight)

        def get_config(self):
            return {**super().get_config(), "pairing": self.pairing}

    # attack: {method: fgsm_rs, objective: logit_pairing,
    #          objective_options: {pairing: 0.2}} in a recipe builds
    model = LogitPairing(classifier, advtrain.Attack("fgsm_rs", eps=0.1),
                         pairing=0.2)
    ```
    """
    register = objectives.register(name)

    def decorator(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, AdversarialModel)):
            raise TypeError(
                f"register_objective('{name}') takes an AdversarialModel "
                f"subclass. Received: {cls!r}"
            )
        return register(cls)

    return decorator


def objective_options(cls: type[AdversarialModel]) -> tuple[str, ...]:
    """The keyword arguments `cls` adds to `AdversarialModel`'s: those of
    each `__init__` from `cls` up to `AdversarialModel`, for as long as
    each passes `**kwargs` on.

    Example:

    ```python
    objective_options(TRADES)  # ("beta",)
    objective_options(AdversarialModel)  # ()
    ```
    """
    names: list[str] = []
    for klass in cls.__mro__:
        if klass is AdversarialModel:
            break
        init = vars(klass).get("__init__")
        if init is None:
            continue
        parameters = _parameters(init)
        names += [
            p.name
            for p in parameters
            if p.kind in _BY_KEYWORD and p.name not in RESERVED and p.name not in names
        ]
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            break
    return tuple(names)


def _parameters(init: Callable) -> list[inspect.Parameter]:
    """`init`'s parameters after (self, classifier, attack)."""
    return list(inspect.signature(init).parameters.values())[3:]


_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
# `AdversarialModel`'s own arguments: a recipe fills them from keys of
# their own (attack.adv_weight, attack.mode ...), never as options.
RESERVED = ("classifier", "attack") + tuple(
    p.name for p in _parameters(AdversarialModel.__init__) if p.kind in _BY_KEYWORD
)


register_objective("adversarial")(AdversarialModel)
