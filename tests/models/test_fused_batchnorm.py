"""FusedBatchNormalization matches Keras's BatchNormalization and is applied
by the recipe's BatchNorm policy."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import bn_classifier

from advtrain.models.batchnorm.fused import (
    FusedBatchNormalization,
    fuse_batchnorm,
)
from advtrain.models.batchnorm.policy import apply_batchnorm_policy, batchnorm_layers


def _pair(shape, momentum=0.9, **kwargs):
    """A Keras BN and a fused BN with the same, non-trivial state."""
    rng = np.random.default_rng(1)
    channels = shape[-1]
    layers = []
    for cls in (keras.layers.BatchNormalization, FusedBatchNormalization):
        layer = cls(momentum=momentum, **kwargs)
        layer.build(shape)
        layers.append(layer)
    values = {
        "gamma": rng.uniform(0.5, 2.0, channels),
        "beta": rng.normal(size=channels),
        "moving_mean": rng.normal(size=channels),
        "moving_variance": rng.uniform(0.5, 3.0, channels),
    }
    for layer in layers:
        for name, value in values.items():
            if getattr(layer, name, None) is not None:
                getattr(layer, name).assign(value.astype("float32"))
    return layers


@pytest.mark.parametrize("training", [True, False])
def test_matches_keras_outputs_statistics_and_gradients(training):
    x = tf.constant(np.random.default_rng(0).normal(2.0, 3.0, (6, 5, 4, 3)), tf.float32)
    keras_bn, fused_bn = _pair(x.shape)
    start_var = fused_bn.moving_variance.numpy().copy()
    results = []
    for layer in (keras_bn, fused_bn):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=training)
            loss = tf.reduce_sum(y * tf.sin(y))
        grads = tape.gradient(loss, [x, layer.gamma, layer.beta])
        results.append((y, grads))
    (y_k, g_k), (y_f, g_f) = results
    np.testing.assert_allclose(y_f, y_k, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_f, g_k, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    for name in ("moving_mean", "moving_variance"):
        np.testing.assert_allclose(
            getattr(fused_bn, name),
            getattr(keras_bn, name),
            rtol=1e-6,
            atol=1e-6,
        )
    if training:  # moved by Keras's rule, with the biased batch variance
        batch_var = np.var(x.numpy(), axis=(0, 1, 2))
        np.testing.assert_allclose(
            fused_bn.moving_variance,
            0.9 * start_var + 0.1 * batch_var,
            rtol=1e-5,
        )
    else:
        np.testing.assert_array_equal(fused_bn.moving_variance, start_var)


def test_without_scale_and_center():
    x = tf.random.stateless_normal((4, 3, 3, 2), seed=(1, 2))
    keras_bn, fused_bn = _pair(x.shape, scale=False, center=False)
    np.testing.assert_allclose(
        fused_bn(x, training=True), keras_bn(x, training=True), atol=1e-5
    )


def test_falls_back_to_keras_for_other_ranks():
    x = tf.random.stateless_normal((8, 5), seed=(3, 4))
    keras_bn, fused_bn = _pair(x.shape)
    np.testing.assert_allclose(
        fused_bn(x, training=True), keras_bn(x, training=True), atol=1e-6
    )
    np.testing.assert_allclose(
        fused_bn.moving_variance, keras_bn.moving_variance, atol=1e-6
    )


def test_bfloat16_inputs_keep_the_compute_dtype():
    layer = FusedBatchNormalization(dtype="mixed_bfloat16")
    x = tf.cast(tf.random.stateless_normal((4, 3, 3, 2), seed=(5, 6)), tf.bfloat16)
    y = layer(x, training=True)
    assert y.dtype == tf.bfloat16
    assert layer.moving_mean.dtype == "float32"
    assert np.all(np.isfinite(layer.moving_variance.numpy()))


def test_fuse_batchnorm_switches_nested_plain_layers_only():
    class MyBN(keras.layers.BatchNormalization):
        pass

    inner = bn_classifier()
    inputs = keras.Input((8, 8, 1))
    h = MyBN()(inputs)
    outer = keras.Model(inputs, inner(h))
    before = outer(np.ones((2, 8, 8, 1), "float32"), training=False)

    assert fuse_batchnorm(outer) == 1
    kinds = sorted(type(layer).__name__ for layer in batchnorm_layers(outer))
    assert kinds == ["FusedBatchNormalization", "MyBN"]
    after = outer(np.ones((2, 8, 8, 1), "float32"), training=False)
    np.testing.assert_allclose(after, before, atol=1e-5)


def test_fused_model_saves_and_loads(tmp_path):
    model = bn_classifier()
    fuse_batchnorm(model)
    x = np.random.default_rng(0).random((4, 8, 8, 1)).astype("float32")
    model(x, training=True)  # moves the moving statistics
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert any(
        isinstance(layer, FusedBatchNormalization) for layer in batchnorm_layers(loaded)
    )
    np.testing.assert_allclose(
        loaded(x, training=False), model(x, training=False), atol=1e-6
    )


@pytest.mark.parametrize("fused", [True, False])
def test_recipe_policy_applies_the_fused_kernel(fused):
    model = bn_classifier()
    apply_batchnorm_policy(model, fused_kernel=fused, momentum=0.8)
    (layer,) = batchnorm_layers(model)
    assert isinstance(layer, FusedBatchNormalization) is fused
    assert layer.momentum == 0.8


def test_training_with_fused_batchnorm_matches_keras():
    rng = np.random.default_rng(0)
    x = rng.random((32, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 10, 32)
    weights = []
    for fused in (False, True):
        model = bn_classifier(seed=3)
        if fused:
            fuse_batchnorm(model)
        model.compile(
            keras.optimizers.SGD(0.1),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        weights.append(model.get_weights())
    for a, b in zip(*weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
