"""Registry facts: preprocess modes and minimum sizes match Keras."""

import keras
import numpy as np
import pytest

from advtrain.backbones import backbones
from advtrain.models.classifier import backbone_spec
from advtrain.models.layers import BackbonePreprocess

# The keras.applications module whose preprocess_input each backbone uses.
KERAS_MODULES = {
    "resnet50": keras.applications.resnet50,
    "inception_v3": keras.applications.inception_v3,
    "mobilenet_v2": keras.applications.mobilenet_v2,
    "efficientnet_b0": keras.applications.efficientnet,
}


def test_registered_names():
    assert set(KERAS_MODULES) | {"small_cnn"} <= set(backbones.names())


@pytest.mark.parametrize("name", sorted(KERAS_MODULES))
def test_preprocess_mode_matches_keras(name):
    spec = backbones.get(name)
    assert spec.channels == 3
    pixels = np.random.default_rng(0).random((2, 5, 5, 3)).astype("float32")
    ours = BackbonePreprocess(spec.preprocess)(pixels)
    expected = KERAS_MODULES[name].preprocess_input(255.0 * pixels)
    np.testing.assert_allclose(np.asarray(ours), expected, atol=1e-4)


@pytest.mark.parametrize("name", sorted(KERAS_MODULES))
def test_min_size_is_keras_minimum(name):
    spec = backbones.get(name)
    side = spec.min_size - 1
    # Keras validates the shape before creating any layer: cheap.
    with pytest.raises(ValueError, match="(?i)input size|at least|should be"):
        spec.build((side, side, 3), weights=None)


def test_unknown_backbone_lists_known_names():
    with pytest.raises(ValueError) as info:
        backbone_spec("resnet5")
    message = str(info.value)
    assert "\n" not in message
    assert "Did you mean 'resnet50'" in message
    for name in ("inception_v3", "resnet50", "small_cnn"):
        assert name in message


@pytest.mark.parametrize(
    "recipe, backbone",
    [("gtsrb_resnet", "resnet50"), ("mnist_inception", "inception_v3")],
)
def test_pretrained_recipes_validate(recipe, backbone):
    from pathlib import Path

    import advtrain
    from advtrain.recipe.loader import load_recipe

    path = Path(advtrain.__file__).parent / "recipes" / f"{recipe}.yaml"
    model = load_recipe(path).model
    assert model.backbone == backbone and model.weights == "imagenet"
    assert min(model.input_size) >= backbones.get(backbone).min_size
    assert model.batchnorm.momentum == 0.9 and model.batchnorm.recalibrate


def test_mnist_cnn_is_the_papers_model():
    from advtrain.models.batchnorm.policy import batchnorm_layers
    from advtrain.models.classifier import build_classifier

    model = build_classifier((28, 28, 1), 10, backbone="mnist_cnn")
    assert not batchnorm_layers(model)
    shapes = [tuple(w.shape) for w in model.trainable_weights]
    # conv 4x4 1->16, conv 4x4 16->32 (28 -> 14 -> 7), dense 1568->100, 100->10
    assert shapes == [
        (4, 4, 1, 16),
        (16,),
        (4, 4, 16, 32),
        (32,),
        (7 * 7 * 32, 100),
        (100,),
        (100, 10),
        (10,),
    ]
