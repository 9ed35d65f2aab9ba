"""The library names its arguments; under a recipe the same error names the
recipe key the argument was filled from (`advtrain.recipe.keys`)."""

import types

import pytest
import tensorflow as tf

from advtrain.models.batchnorm.policy import bn_gap_warning
from advtrain.models.classifier import build_classifier
from advtrain.recipe.build import recipe_classifier, recipe_plan
from advtrain.recipe.keys import recipe_keys
from advtrain.recipe.loader import recipe_from_dict
from advtrain.recipe.run_folder import check_recipe_paths
from advtrain.recipe.schema import RecipeError
from advtrain.train.runtime import Runtime, plan_batches
from advtrain.utils.errors import ArgumentError

TINY = {"model": {"backbone": "small_cnn", "width": 4}}


def one_replica() -> Runtime:
    return Runtime(
        strategy=tf.distribute.get_strategy(),
        strategy_name="default",
        replicas=1,
        device_kind="cpu",
        precision="float32",
        jit_compile=False,
        steps_per_execution_setting="auto",
    )


def test_a_weights_error_names_the_argument_and_under_a_recipe_the_key(tmp_path):
    missing = str(tmp_path / "missing.weights.h5")
    with pytest.raises(ArgumentError) as python:
        build_classifier((8, 8, 1), 3, backbone="small_cnn", width=4, weights=missing)
    assert python.value.argument == "weights"
    assert str(python.value) == (
        "weights: expected 'imagenet', a weights file or None (null); no such "
        f"file. Received: weights={missing}"
    )

    recipe = recipe_from_dict({"model": {**TINY["model"], "weights": missing}})
    splits = types.SimpleNamespace(image_shape=(8, 8, 1), num_classes=3)
    with pytest.raises(RecipeError) as under_recipe:
        recipe_classifier(recipe, splits)
    assert str(under_recipe.value) == f"model.weights: {python.value.message}"


def test_a_batch_error_names_the_argument_and_under_a_recipe_the_key():
    with pytest.raises(ArgumentError) as python:
        plan_batches(one_replica(), 100, batch_size=128)
    assert str(python.value) == (
        "batch_size: larger than the training set (100 examples); lower it. "
        "Received: batch_size=128"
    )
    recipe = recipe_from_dict({"train": {"batch_size": 128}})
    with pytest.raises(RecipeError) as under_recipe:
        recipe_plan(recipe, one_replica(), 100)
    assert str(under_recipe.value) == f"train.batch_size: {python.value.message}"


def test_only_the_sections_own_arguments_are_renamed():
    with pytest.raises(ArgumentError, match="^image_shape: from the data"):
        with recipe_keys("model"):
            raise ArgumentError("image_shape", "from the data, not a model key")
    with pytest.raises(RecipeError, match="^train.batch_size: noisy"):
        with recipe_keys("model.batchnorm", batch_size="train.batch_size"):
            raise ArgumentError("batch_size", "noisy")
    keys = recipe_keys("model.batchnorm")
    assert keys["momentum"] == "model.batchnorm.momentum"
    assert "image_shape" not in recipe_keys("model")


def test_advice_and_path_errors_name_the_keys_they_are_given(tmp_path):
    names = recipe_keys("model.batchnorm", batch_size="train.batch_size")
    stale = bn_gap_warning(0.3, momentum=0.99, names=names)
    assert "Fix: model.batchnorm.momentum: 0.9 (now 0.99)" in stale
    assert "model.batchnorm.recalibrate: true" in stale
    assert "a larger train.batch_size" in bn_gap_warning(-0.3, names=names)
    # Without names: the arguments' own.
    assert "Fix: momentum: 0.9 (now 0.99)" in bn_gap_warning(0.3, momentum=0.99)

    recipe = recipe_from_dict(
        {"data": {"source": "mnist", "path": str(tmp_path / "no-mnist")}}
    )
    with pytest.raises(FileNotFoundError, match="^data.path .*no-mnist: not found"):
        check_recipe_paths(recipe, writes=False)
