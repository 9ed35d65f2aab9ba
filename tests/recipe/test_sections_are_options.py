"""One definition: the recipe's sections that `advtrain.fit` takes are its
option types (subclassed, not copied), key for key."""

import inspect

import pytest

import advtrain
from advtrain.models.batchnorm.options import BatchNormOptions
from advtrain.recipe.schema import Recipe
from advtrain.train.options import CheckpointOptions, PlanOptions, RuntimeOptions

# fit's argument -> (the recipe section, its option type).
SECTIONS = {
    "train": ("train", PlanOptions),
    "runtime": ("runtime", RuntimeOptions),
    "checkpoints": ("output", CheckpointOptions),
    "batchnorm": ("model.batchnorm", BatchNormOptions),
}

# Keys of those sections that are the recipe's own: the guard is a callback
# the recipe builds; the report, plots and export follow `fit`.
RECIPE_ONLY = {
    "train": {
        "co_guard",
        "co_guard_drop",
        "co_guard_gap",
        "co_guard_action",
        "co_guard_examples",
        "co_guard_pgd_steps",
        "co_guard_keep",
    },
    "output": {"tensorboard", "plots", "export_saved_model"},
}


def section_type(path: str):
    model = Recipe
    for part in path.split("."):
        model = model.model_fields[part].annotation
    return model


@pytest.mark.parametrize("argument", sorted(SECTIONS))
def test_each_key_of_fits_sections_is_an_option_field_and_back(argument):
    section, options = SECTIONS[argument]
    assert argument in inspect.signature(advtrain.fit).parameters
    model = section_type(section)
    assert issubclass(model, options), f"{section} is not derived from {options}"
    keys = set(model.model_fields) - RECIPE_ONLY.get(section, set())
    fields = set(options.model_fields)
    assert keys - fields == set(), f"{section} keys without an option field"
    assert fields - keys == set(), f"{options.__name__} fields without a key"


def test_fit_takes_the_recipes_attack_section():
    """`attack=recipe.attack`: the section's keys set the attack and the
    training model around it."""
    import keras

    from advtrain.recipe.loader import recipe_from_dict

    recipe = recipe_from_dict(
        {"attack": {"method": "pgd", "eps": 0.1, "steps": 2, "adv_weight": 0.25}}
    )
    x = keras.random.uniform((40, 4), seed=0)
    y = keras.ops.zeros((40,), "int32")
    setup = advtrain.prepare(
        lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
        (x, y),
        batch_size=20,
        attack=recipe.attack,
        echo=None,
    )
    assert setup.model.adv_weight == 0.25
    assert setup.model.attack.method == "pgd"
    assert setup.model.attack.get_config()["steps"] == 2
