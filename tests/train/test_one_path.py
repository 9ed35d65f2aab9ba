"""One path: a recipe's run and `advtrain.fit` share one compile, one
BatchNorm settle and one phase loop, so the same small model trained both
ways (deterministic ops) ends with the same weights, bit for bit."""

import keras
import numpy as np
import pytest

import advtrain
from advtrain.data import load_splits, make_input
from advtrain.models.classifier import build_classifier
from advtrain.recipe.loader import recipe_from_dict
from advtrain.recipe.run import run
from advtrain.recipe.saved import load_classifier

SEED = 3
RECIPE = {
    "name": "one-path",
    "data": {"source": "digits", "limit_train": 128, "limit_test": 32},
    "model": {"backbone": "small_cnn", "width": 4},
    "attack": {"method": "fgsm_rs", "eps": 0.1, "adv_weight": 0.5},
    "train": {"epochs": 2, "batch_size": 32, "seed": SEED, "learning_rate": 3e-3},
    "eval": {"attacks": ["pgd"], "pgd_steps": 1},
    "runtime": {"deterministic": True, "steps_per_execution": 2},
    "output": {"tensorboard": False, "plots": False, "export_saved_model": False},
}


@pytest.fixture(scope="module")
def by_recipe(tmp_path_factory):
    """The recipe's run, in this process: its saved classifier's weights."""
    out = tmp_path_factory.mktemp("one-path") / "run"
    run(recipe_from_dict(RECIPE), out, echo=lambda line: None)
    return load_classifier(out / "model.keras").get_weights()


def fit_like_the_recipe(**changed):
    """`advtrain.fit` with the arguments the recipe stands for."""
    keras.utils.set_random_seed(SEED)
    splits = load_splits("digits", limit_train=128, limit_test=32)
    data = make_input(
        splits.fresh_train(),
        batch_size=32,
        training=True,
        seed=0,
        deterministic=True,
        source="digits",
    )
    arguments = dict(
        attack={"method": "fgsm_rs", "eps": 0.1},
        adv_weight=0.5,
        epochs=2,
        learning_rate=3e-3,
        seed=SEED,
        runtime={"deterministic": True, "steps_per_execution": 2},
        echo=None,
    )
    result = advtrain.fit(
        lambda: build_classifier(
            splits.image_shape, splits.num_classes, backbone="small_cnn", width=4
        ),
        data,
        **{**arguments, **changed},
    )
    return result.model.classifier.get_weights()


def test_a_recipe_and_fit_train_the_same_weights(by_recipe):
    weights = fit_like_the_recipe()
    assert len(weights) == len(by_recipe)
    assert all(np.array_equal(a, b) for a, b in zip(weights, by_recipe, strict=True))
    # Trained, not two copies of the initial weights.
    keras.utils.set_random_seed(SEED)
    initial = build_classifier((8, 8, 1), 10, backbone="small_cnn", width=4)
    assert not np.array_equal(initial.get_weights()[0], weights[0])
