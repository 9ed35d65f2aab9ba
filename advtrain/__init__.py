"""advtrain: adversarial training and transfer learning for Keras 3.

Public API:
    AdversarialModel, TRADES      keras.Model subclasses with a custom step
    Attack, fgsm, fgsm_random_start, pgd
    load_recipe, Recipe, RecipeError
    run                            train + evaluate a recipe
    fit                            any Keras model through the same runtime
"""

from advtrain.config import Recipe, RecipeError, load_recipe

__version__ = "0.1.0"


def __getattr__(name):
    # TensorFlow-heavy names load on first use so `advtrain recipes` and
    # recipe validation stay fast.
    if name in ("AdversarialModel", "TRADES"):
        from advtrain import models

        return getattr(models, name)
    if name in ("Attack", "fgsm", "fgsm_random_start", "pgd"):
        from advtrain import attacks

        return getattr(attacks, name)
    if name == "run":
        from advtrain.experiment import run

        return run
    if name == "fit":
        # In `fitting`, not `fit`: importing a submodule `advtrain.fit`
        # would replace this function on the package with the module.
        from advtrain.fitting import fit

        return fit
    raise AttributeError(f"module 'advtrain' has no attribute {name!r}")


__all__ = [
    "AdversarialModel",
    "Attack",
    "Recipe",
    "RecipeError",
    "TRADES",
    "fgsm",
    "fit",
    "fgsm_random_start",
    "load_recipe",
    "pgd",
    "run",
]
