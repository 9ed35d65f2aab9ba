"""advtrain: adversarial training and transfer learning for Keras 3.

Public API:
    AdversarialModel, TRADES, GradAlign
                                   keras.Model subclasses with a custom step
    Attack, attack_settings, fgsm, fgsm_random_start, pgd
    load_recipe, Recipe, RecipeError
    run                            train + evaluate a recipe
    fit                            any Keras model through the same runtime
    prepare, Setup, Stream         a run set up once (fit, profile, show)
    RuntimeOptions, PlanOptions, CheckpointOptions, BatchNormOptions
                                   fit's option groups (the recipe's keys)
    evaluate                       AutoAttack-grade robust accuracy of a model
    register_attack, register_source, register_backbone,
    register_objective             extension points a recipe can name
                                   (its `plugins` key imports the module)

Importing the package imports the core on any Keras backend and registers
advtrain's Keras objects, so `keras.saving.load_model("model.keras")` works
in a fresh process. The TensorFlow parts (`fit`, the data sources, the
runtime) are imported with it on the TensorFlow backend, elsewhere on first
use (without TensorFlow: a one-line ImportError). The recipe application
(`load_recipe`, `Recipe`, `RecipeError`, `run`) is imported on first use of
one of its names: the library never loads it.
"""

import importlib
from typing import TYPE_CHECKING

from advtrain.utils.errors import BackendNotInstalled

# First: the backend chooses Keras's backend among the installed ones and
# imports Keras (and TensorFlow, quietly, on its backend). With none
# installed the package still imports, so that `advtrain --version` and
# the command line can say so in one line; each of its names raises that
# line (`__getattr__`).
try:
    from advtrain import backend
except BackendNotInstalled as missing:
    _NO_BACKEND: "BackendNotInstalled | None" = missing
else:
    _NO_BACKEND = None

# The parts that need TensorFlow: imported now on the TensorFlow backend, on
# first use elsewhere (`__getattr__`).
_TENSORFLOW_PARTS = {
    "data": "advtrain.data",
    "register_source": "advtrain.data",
    "runtime": "advtrain.train.runtime",
    # `fit` lives in `advtrain.train.fitting`, not `advtrain.fit`: a submodule
    # named `fit` would replace this function on the package with the module.
    "fit": "advtrain.train.fitting",
    "prepare": "advtrain.train.fitting",
    "Setup": "advtrain.train.fitting",
    "Stream": "advtrain.train.fitting",
}

if _NO_BACKEND is None:
    # The core, on every backend; each import registers its Keras objects.
    from advtrain.attacks import (
        Attack,
        attack_settings,
        fgsm,
        fgsm_random_start,
        pgd,
        register_attack,
    )
    from advtrain.backbones import register_backbone
    from advtrain.evaluation.robustness import evaluate
    from advtrain.models import TRADES, AdversarialModel, GradAlign
    from advtrain.models.batchnorm.options import BatchNormOptions
    from advtrain.models.objectives import register_objective
    from advtrain.train.options import CheckpointOptions, PlanOptions, RuntimeOptions

    if backend.IMPORTS_TENSORFLOW:
        from advtrain import data  # noqa: F401
        from advtrain.data import register_source
        from advtrain.train import runtime  # noqa: F401
        from advtrain.train.fitting import Setup, Stream, fit, prepare

__version__ = "0.3.0"

# The application's names, imported on first use (PEP 562): the application
# sits above the library, so `import advtrain.attacks` must not load it.
_APPLICATION = {
    "load_recipe": "advtrain.recipe.loader",
    "Recipe": "advtrain.recipe.schema",
    "RecipeError": "advtrain.recipe.schema",
    "run": "advtrain.recipe.run",
}

if TYPE_CHECKING:  # the same names, for type checkers and the API reference
    from advtrain.recipe.loader import load_recipe
    from advtrain.recipe.run import run
    from advtrain.recipe.schema import Recipe, RecipeError


def __getattr__(name: str):
    if _NO_BACKEND is not None and not name.startswith("__"):
        raise BackendNotInstalled(_NO_BACKEND.summary, _NO_BACKEND.received)
    module = _APPLICATION.get(name) or _TENSORFLOW_PARTS.get(name)
    if module is None:
        raise AttributeError(f"module 'advtrain' has no attribute {name!r}")
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("tensorflow"):
            raise
        raise ImportError(
            f"advtrain.{name} needs TensorFlow, which is not installed: "
            f"{backend.install_command(['tensorflow'])}. "
            f"Received: KERAS_BACKEND={backend.NAME}"
        ) from None
    value = imported if name in ("data", "runtime") else getattr(imported, name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_APPLICATION, *_TENSORFLOW_PARTS})


__all__ = [
    "AdversarialModel",
    "Attack",
    "BatchNormOptions",
    "CheckpointOptions",
    "PlanOptions",
    "RuntimeOptions",
    "Setup",
    "Stream",
    "attack_settings",
    "GradAlign",
    "Recipe",
    "RecipeError",
    "TRADES",
    "evaluate",
    "fgsm",
    "fit",
    "fgsm_random_start",
    "load_recipe",
    "pgd",
    "prepare",
    "register_attack",
    "register_backbone",
    "register_objective",
    "register_source",
    "run",
]
