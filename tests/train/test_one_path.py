"""One path: a recipe's run and `advtrain.fit` share one compile, one
BatchNorm settle and one phase loop, so the same small model trained both
ways (deterministic ops) ends with the same weights, bit for bit."""

import keras
import numpy as np
import pytest

import advtrain
from advtrain.data import load_splits, make_input
from advtrain.models.classifier import build_classifier
from advtrain.models.freezing import phases
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


def by_recipe(tmp_path, **model):
    """The recipe's run, in this process: its saved classifier's weights."""
    recipe = {**RECIPE, "model": {**RECIPE["model"], **model}}
    run(recipe_from_dict(recipe), tmp_path / "run", echo=lambda line: None)
    return load_classifier(tmp_path / "run" / "model.keras").get_weights()


def fit_like_the_recipe(**changed):
    """`advtrain.fit` with the arguments the recipe stands for."""
    keras.utils.set_random_seed(SEED)
    splits = load_splits("digits", limit_train=128, limit_test=32)

    def data():  # built anew for each phase, as a recipe's run does
        return make_input(
            splits.fresh_train(),
            batch_size=32,
            training=True,
            seed=0,
            deterministic=True,
            source="digits",
        )

    arguments = dict(
        attack={"method": "fgsm_rs", "eps": 0.1, "adv_weight": 0.5},
        epochs=2,
        train={"learning_rate": 3e-3, "seed": SEED},
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


def same(a: list, b: list) -> bool:
    assert len(a) == len(b)
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_recipe_and_fit_train_the_same_weights(tmp_path):
    weights = fit_like_the_recipe()
    assert same(weights, by_recipe(tmp_path))
    # Trained, not two copies of the initial weights.
    keras.utils.set_random_seed(SEED)
    initial = build_classifier((8, 8, 1), 10, backbone="small_cnn", width=4)
    assert not np.array_equal(initial.get_weights()[0], weights[0])


def test_phases_are_the_same_both_ways(tmp_path):
    """A head-only warm-up epoch, then fine-tuning at a tenth of the rate."""
    lines = []
    weights = fit_like_the_recipe(
        epochs=phases(2, head_only_epochs=1, finetune_lr_factor=0.1),
        echo=lines.append,
    )
    assert any(line.startswith("phase finetune: epochs 2-2") for line in lines)
    assert same(weights, by_recipe(tmp_path, head_only_epochs=1))
    assert not same(weights, fit_like_the_recipe())


def test_phases_must_end_at_the_last_epoch():
    with pytest.raises(ValueError, match="given twice") as info:
        fit_like_the_recipe(epochs=phases(3, head_only_epochs=1), train={"epochs": 2})
    assert "\n" not in str(info.value)
