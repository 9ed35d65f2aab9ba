"""advtrain: adversarial training and transfer learning for Keras 3.

Public API:
    AdversarialModel, TRADES, GradAlign
                                   keras.Model subclasses with a custom step
    Attack, fgsm, fgsm_random_start, pgd
    load_recipe, Recipe, RecipeError
    run                            train + evaluate a recipe
    fit                            any Keras model through the same runtime
    evaluate                       AutoAttack-grade robust accuracy of a model
    register_attack, register_source, register_backbone,
    register_objective             extension points a recipe can name
                                   (its `plugins` key imports the module)

Importing the package imports TensorFlow (once, without its C++ start-up
lines; see `advtrain._tfimport`) and registers everything a saved run needs
in a fresh process: advtrain's Keras layers, models and schedules, so
`keras.saving.load_model("model.keras")` works, and the `gtsrb` TFDS
builder, so `tfds.builder("gtsrb")` finds it.
"""

from advtrain._tfimport import import_tensorflow

import_tensorflow()

# Below TensorFlow's quiet import. Each import also registers its Keras
# objects (register_keras_serializable) or its TFDS builder.
from advtrain import data  # noqa: E402, F401  (the gtsrb TFDS builder)
from advtrain.attacks import (  # noqa: E402
    Attack,
    fgsm,
    fgsm_random_start,
    make_attack,
    pgd,
    register_attack,
)
from advtrain.backbones import register_backbone  # noqa: E402
from advtrain.data import register_source  # noqa: E402
from advtrain.evaluation.robustness import evaluate  # noqa: E402
from advtrain.models import TRADES, AdversarialModel, GradAlign  # noqa: E402
from advtrain.models.objectives import register_objective  # noqa: E402
from advtrain.recipe.loader import load_recipe  # noqa: E402
from advtrain.recipe.run import run  # noqa: E402
from advtrain.recipe.schema import Recipe, RecipeError  # noqa: E402
from advtrain.train import runtime  # noqa: E402, F401  (OneCycle)

# `fit` lives in `advtrain.train.fitting`, not `advtrain.fit`: a submodule named
# `fit` would replace this function on the package with the module.
from advtrain.train.fitting import fit  # noqa: E402

__version__ = "0.2.0"

__all__ = [
    "AdversarialModel",
    "Attack",
    "GradAlign",
    "Recipe",
    "RecipeError",
    "TRADES",
    "evaluate",
    "fgsm",
    "fit",
    "fgsm_random_start",
    "load_recipe",
    "make_attack",
    "pgd",
    "register_attack",
    "register_backbone",
    "register_objective",
    "register_source",
    "run",
]
