"""Classifier: raw [0, 1] pixels in, preprocessing inside, weights sources."""

import urllib.error

import h5py
import keras
import numpy as np
import pytest

from advtrain.models.batchnorm.policy import batchnorm_layers
from advtrain.models.classifier import (
    backbone_input_size,
    build_classifier,
    classifier_head,
)
from advtrain.models.freezing import apply_freeze, get_backbone
from advtrain.models.weights import load_weights_file


def _pixels(shape, seed=0):
    return np.random.default_rng(seed).random(shape).astype("float32")


@pytest.fixture(scope="module")
def resnet_rgb():
    keras.utils.set_random_seed(1)
    return build_classifier((32, 32, 3), 4, backbone="resnet50")


@pytest.fixture(scope="module")
def resnet_gray():
    keras.utils.set_random_seed(2)
    return build_classifier((28, 28, 1), 10, backbone="resnet50")


def _reference(model, module, resized):
    """head(backbone(keras preprocess_input(255 * resized image)))."""
    features = get_backbone(model)(module.preprocess_input(255.0 * resized))
    for layer in classifier_head(model):
        features = layer(features)
    return np.asarray(features)


def _assert_close(ours, expected):
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5 * scale)


def test_resnet50_preprocessing_parity(resnet_rgb):
    # RGB input: the caffe mode's RGB->BGR flip is visible only in colour.
    x = _pixels((2, 32, 32, 3))
    expected = _reference(resnet_rgb, keras.applications.resnet50, x)
    _assert_close(np.asarray(resnet_rgb(x, training=False)), expected)


def test_grayscale_below_minimum_is_resized(resnet_gray):
    model = resnet_gray
    assert model.get_layer("resize").height == 32
    assert model.get_layer("to_channels").channels == 3
    x = _pixels((2, 28, 28, 1))
    logits = np.asarray(model(x))
    assert logits.shape == (2, 10) and logits.dtype == np.float32
    # A plain call serves in inference mode (keras.layers.Resizing would
    # switch the BN layers after it to training mode).
    np.testing.assert_array_equal(logits, np.asarray(model(x, training=False)))
    # Parity through the input adapter: gray -> RGB -> resize -> caffe.
    rgb = np.repeat(x, 3, axis=-1)
    resized = np.asarray(keras.ops.image.resize(rgb, (32, 32)))
    _assert_close(logits, _reference(model, keras.applications.resnet50, resized))


def test_inception_v3_grayscale_mnist_parity():
    model = build_classifier((28, 28, 1), 10, backbone="inception_v3")
    assert model.get_layer("resize").height == 75
    x = _pixels((2, 28, 28, 1), seed=6)
    resized = keras.ops.image.resize(np.repeat(x, 3, axis=-1), (75, 75))
    expected = _reference(model, keras.applications.inception_v3, np.asarray(resized))
    _assert_close(np.asarray(model(x)), expected)


def test_input_size_rules():
    name = "inception_v3"
    assert backbone_input_size(name, 28, 28) == (75, 75)
    assert backbone_input_size(name, 28, 28, weights="imagenet") == (299, 299)
    assert backbone_input_size(name, 28, 56) == (75, 150)
    assert backbone_input_size(name, 80, 90) == (80, 90)
    assert backbone_input_size(name, 28, 28, input_size=(139, 139)) == (139, 139)
    with pytest.raises(ValueError, match="needs sides >= 75"):
        backbone_input_size(name, 28, 28, input_size=(64, 64))


def test_saved_model_serves_raw_pixels(tmp_path):
    # Gray 28x28 -> to_channels -> resize 32 -> tf mode -> MobileNetV2.
    model = build_classifier((28, 28, 1), 10, backbone="mobilenet_v2")
    path = tmp_path / "classifier.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert [layer.name for layer in loaded.layers[:4]] == [
        "pixels",
        "to_channels",
        "resize",
        "preprocess",
    ]
    x = _pixels((2, 28, 28, 1), seed=3)
    expected = np.asarray(model(x))
    assert np.all(np.isfinite(expected))
    np.testing.assert_allclose(np.asarray(loaded(x)), expected, rtol=1e-6, atol=1e-6)


def test_offline_imagenet_is_one_line_error(monkeypatch, tmp_path):
    from keras.src.backend import config as keras_config
    from keras.src.utils import file_utils

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure")

    # Empty cache, and the download Keras would attempt fails at once.
    # (KERAS_HOME is read by Keras at import, by advtrain at each call.)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    monkeypatch.setattr(keras_config, "_KERAS_DIR", str(tmp_path))
    monkeypatch.setattr(file_utils, "urlretrieve", offline)
    # The reachability probe must not contact a real host either.
    from advtrain.models import weights

    monkeypatch.setattr(weights, "WEIGHTS_URL", "https://advtrain-offline.invalid/")
    with pytest.raises(ValueError) as info:
        build_classifier((32, 32, 3), 4, backbone="resnet50", weights="imagenet")
    message = str(info.value)
    assert "\n" not in message
    assert "resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5" in message
    assert str(tmp_path / "models") in message
    assert "$KERAS_HOME/models/" in message and "~/.keras/models/" in message
    # Named by the argument; a recipe reports it under model.weights.
    assert message.startswith("weights: cannot download the imagenet weights")
    assert "set weights to the path of a weights file" in message
    assert "or to None (null) to train from scratch" in message


def test_imagenet_for_backbone_without_it():
    with pytest.raises(ValueError, match="has no 'imagenet' weights"):
        build_classifier((8, 8, 1), 3, backbone="small_cnn", weights="imagenet")


def test_weights_from_path_round_trip(tmp_path):
    keras.utils.set_random_seed(4)
    source = build_classifier((8, 8, 1), 3, width=4)
    # Non-default BN statistics, so that loading them is checked too.
    for variable in source.non_trainable_weights:
        variable.assign(np.full(variable.shape, 0.5, "float32"))
    x = _pixels((2, 8, 8, 1), seed=5)

    whole = tmp_path / "classifier.weights.h5"
    source.save_weights(whole)
    loaded = build_classifier((8, 8, 1), 3, width=4, weights=str(whole))
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(source(x)))

    part = tmp_path / "backbone.weights.h5"
    get_backbone(source).save_weights(part)
    keras.utils.set_random_seed(5)
    loaded = build_classifier((8, 8, 1), 7, width=4, weights=str(part))
    pairs = zip(get_backbone(loaded).weights, get_backbone(source).weights, strict=True)
    for ours, theirs in pairs:
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())

    # Same class count: the head would fit, the file still is the backbone's.
    target = build_classifier((8, 8, 1), 3, width=4)
    assert load_weights_file(target, get_backbone(target), str(part)) == ("backbone")
    assert load_weights_file(target, get_backbone(target), str(whole)) == ("classifier")


@pytest.mark.parametrize("saved_fused", [True, False])
def test_weights_load_across_batchnorm_kernels(tmp_path, saved_fused):
    # A .keras file keys weights by layer class: a run saved with fused
    # BatchNorm (the default) must load into a freshly built classifier
    # (plain Keras BatchNorm), and a plain one into a fused classifier.
    from advtrain.models.batchnorm.fused import FusedBatchNormalization, fuse_batchnorm

    source = build_classifier((8, 8, 1), 3, backbone="small_cnn", width=4)
    for layer in batchnorm_layers(source):
        layer.moving_mean.assign(np.full(layer.moving_mean.shape, 0.25, "float32"))
    if saved_fused:
        fuse_batchnorm(source)
    path = tmp_path / "source.keras"
    source.save(path)
    target = build_classifier((8, 8, 1), 3, backbone="small_cnn", width=4)
    if not saved_fused:
        fuse_batchnorm(target)
    kinds = [type(layer) for layer in batchnorm_layers(target)]
    assert load_weights_file(target, get_backbone(target), str(path)) == "classifier"
    # Weights came over, and each layer kept its own class.
    assert [type(layer) for layer in batchnorm_layers(target)] == kinds
    assert (FusedBatchNormalization in kinds) != saved_fused
    x = np.random.default_rng(0).random((4, 8, 8, 1)).astype("float32")
    np.testing.assert_allclose(
        target(x, training=False), source(x, training=False), atol=1e-6
    )


def test_weights_from_legacy_h5(tmp_path):
    # The format of the ImageNet files Keras caches in ~/.keras/models/.
    from keras.src.legacy.saving import legacy_h5_format

    source = get_backbone(build_classifier((8, 8, 1), 3, width=4))
    path = tmp_path / "notop.h5"
    with h5py.File(path, "w") as file:
        legacy_h5_format.save_weights_to_hdf5_group(file, source)
    loaded = build_classifier((8, 8, 1), 3, width=4, weights=str(path))
    pairs = zip(get_backbone(loaded).weights, source.weights, strict=True)
    for ours, theirs in pairs:
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_weights_that_fit_nothing(tmp_path):
    other = build_classifier((8, 8, 1), 3, width=8)
    path = tmp_path / "other.weights.h5"
    other.save_weights(path)
    with pytest.raises(ValueError, match="fits neither") as info:
        build_classifier((8, 8, 1), 3, width=4, weights=str(path))
    assert "\n" not in str(info.value)
    missing = str(tmp_path / "nope.weights.h5")
    with pytest.raises(ValueError, match="no such file"):
        build_classifier((8, 8, 1), 3, width=4, weights=missing)


def test_frozen_resnet50_is_bit_identical_after_fit(resnet_rgb):
    # Here rather than in test_freezing.py to reuse the built ResNet50; it
    # changes the fixture's head, so it runs last in this file.
    model = resnet_rgb
    apply_freeze(model, "frozen")
    before = {v.path: v.numpy().copy() for v in model.weights}
    rng = np.random.default_rng(7)
    x = rng.random((8, 32, 32, 3)).astype("float32")
    model.compile(
        keras.optimizers.SGD(1e-2),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        # Eager keeps this to seconds on a CPU; Keras resolves `training`
        # for nested layers the same way when the step is traced.
        run_eagerly=True,
    )
    model.fit(x, rng.integers(0, 4, 8), batch_size=8, verbose=0)
    changed = {
        v.path for v in model.weights if not np.array_equal(v.numpy(), before[v.path])
    }
    assert changed == {"logits/kernel", "logits/bias"}
    assert len(batchnorm_layers(model)) == 53
