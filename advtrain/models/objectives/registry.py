"""The objective registry: `AdversarialModel` and its subclasses by name."""

from __future__ import annotations

from collections.abc import Callable

import keras

from advtrain.models.adversarial import AdversarialModel
from advtrain.models.adversarial_arguments import init_keywords
from advtrain.utils.registry import Registry

objectives: Registry[type[AdversarialModel]] = Registry("objective")


def register_objective(name: str) -> Callable[[type], type]:
    """Class decorator registering a training objective under `name`.

    An objective is an `AdversarialModel` subclass built as
    `cls(classifier, attack, adv_weight=..., ..., **options)`: its
    `__init__` takes `(classifier, attack=None, <its options>, **kwargs)`
    and passes `**kwargs` on. One that always attacks with one method names
    it in `attack_method` (TRADES: "pgd"). A duplicate name is a ValueError.

    Example:

    ```python
    @advtrain.register_objective("logit_pairing")
    class LogitPairing(advtrain.AdversarialModel):
        def __init__(self, classifier, attack=None, pairing=0.5, **kwargs):
            super().__init__(classifier, attack, **kwargs)
            self.pairing = float(pairing)

        # adversarial_loss: see `AdversarialModel.adversarial_loss`.

        def get_config(self):
            return {**super().get_config(), "pairing": self.pairing}
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
    """The keyword arguments `cls` adds to `AdversarialModel`'s, e.g.
    `("beta",)` for TRADES."""
    names = init_keywords(cls, AdversarialModel, skip=3, passed_on=True)
    return tuple(name for name in names if name not in RESERVED)


# `AdversarialModel`'s own arguments, never objective options.
RESERVED = tuple(init_keywords(AdversarialModel, keras.Model))


register_objective("adversarial")(AdversarialModel)
