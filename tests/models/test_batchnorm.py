"""BatchNorm policy: momentum override, recalibration, train/inference gap."""

import keras
import numpy as np
import pytest
from sklearn.datasets import load_digits

from advtrain.models.batchnorm.policy import (
    apply_batchnorm_policy,
    batchnorm_layers,
    bn_gap,
    bn_gap_warning,
    recalibrate_batchnorm,
)
from advtrain.models.classifier import build_classifier


class _Block(keras.layers.Layer):
    """A custom layer owning a BN layer: not visible in `Model.layers`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.norm = keras.layers.BatchNormalization(name="block_bn")

    def call(self, inputs, training=None):
        return self.norm(inputs, training=training)


def _nested_model():
    inner_inputs = keras.Input((4,))
    inner = keras.Model(
        inner_inputs,
        keras.layers.BatchNormalization(name="inner_bn")(inner_inputs),
        name="inner",
    )
    middle = keras.Sequential(
        [keras.Input((4,)), inner, _Block(name="block")], name="middle"
    )
    inputs = keras.Input((4,))
    x = keras.layers.BatchNormalization(name="outer_bn")(inputs)
    return keras.Model(inputs, middle(x), name="outer")


def test_momentum_override_reaches_nested_batchnorm():
    model = _nested_model()
    bns = batchnorm_layers(model)
    assert sorted(layer.name for layer in bns) == [
        "block_bn",
        "inner_bn",
        "outer_bn",
    ]
    assert apply_batchnorm_policy(model, momentum=0.5) is None  # no note
    assert all(layer.momentum == 0.5 for layer in bns)
    # The traced train step uses it: from moving_mean 0, one step gives
    # (1 - 0.5) * batch mean at the first BN layer.
    x = np.random.default_rng(0).normal(3.0, 1.0, (8, 4)).astype("float32")
    model.compile(keras.optimizers.SGD(0.0), "mse")
    model.train_on_batch(x, np.zeros((8, 4), "float32"))
    outer = model.get_layer("outer_bn")
    np.testing.assert_allclose(
        outer.moving_mean.numpy(), 0.5 * x.mean(axis=0), rtol=1e-5
    )
    apply_batchnorm_policy(model, momentum=None)
    assert all(layer.momentum == 0.5 for layer in bns)  # None keeps it
    assert apply_batchnorm_policy(model, total_steps=1_000) is None
    assert all(layer.momentum == 0.5 for layer in bns)  # auto keeps a choice
    fresh = _nested_model()
    note = apply_batchnorm_policy(fresh, total_steps=1_000)
    # auto: the layers at Keras's 0.99, nested ones too, follow the run.
    assert [layer.momentum for layer in batchnorm_layers(fresh)] == [0.98] * 3
    assert "-> 0.98 on 3 layer(s)" in note


def test_momentum_override_on_classifier():
    model = build_classifier((8, 8, 1), 3, width=4)
    apply_batchnorm_policy(model, momentum=0.9)
    assert [layer.momentum for layer in batchnorm_layers(model)] == [0.9] * 3


def test_recalibration_is_an_equal_weight_average():
    inputs = keras.Input((3,))
    bn = keras.layers.BatchNormalization(momentum=0.99, name="bn")
    frozen = keras.layers.BatchNormalization(name="frozen_bn")
    model = keras.Model(inputs, frozen(bn(inputs)))
    frozen.trainable = False
    rng = np.random.default_rng(0)
    batches = [
        rng.normal(loc, scale, (16, 3)).astype("float32")
        for loc, scale in ((0.0, 1.0), (5.0, 2.0), (-3.0, 0.5))
    ]
    labels = np.zeros(16)
    frozen_before = frozen.moving_variance.numpy().copy()

    used = recalibrate_batchnorm(
        model, [(b, labels) for b in batches] * 2, num_batches=3
    )

    assert used == 3
    np.testing.assert_allclose(
        bn.moving_mean.numpy(),
        np.mean([b.mean(axis=0) for b in batches], axis=0),
        rtol=1e-5,
        atol=1e-6,
    )
    np.testing.assert_allclose(
        bn.moving_variance.numpy(),
        np.mean([b.var(axis=0) for b in batches], axis=0),
        rtol=1e-4,
    )
    assert bn.momentum == 0.99 and bn.trainable
    assert not frozen.trainable
    np.testing.assert_array_equal(frozen.moving_variance.numpy(), frozen_before)

    recalibrate_batchnorm(model, batches, num_batches=3, include_frozen=True)
    assert not frozen.trainable
    assert not np.array_equal(frozen.moving_variance.numpy(), frozen_before)


def test_recalibration_needs_data():
    model = _nested_model()
    with pytest.raises(ValueError, match="no batch"):
        recalibrate_batchnorm(model, [], num_batches=2)
    with pytest.raises(ValueError, match="num_batches must be >= 1"):
        recalibrate_batchnorm(model, [], num_batches=0)


def test_bn_gap_leaves_statistics_and_dropout_alone():
    keras.utils.set_random_seed(0)
    model = build_classifier((8, 8, 1), 3, width=4, dropout=0.5)
    x = np.random.default_rng(0).random((12, 8, 8, 1)).astype("float32")
    before = [v.numpy().copy() for v in model.non_trainable_weights]
    report = bn_gap(model, x, np.zeros(12, "int64"), batch_size=4)
    assert set(report) == {
        "train_mode_accuracy",
        "inference_mode_accuracy",
        "gap",
    }
    after = [v.numpy() for v in model.non_trainable_weights]
    for old, new in zip(before, after, strict=True):
        np.testing.assert_array_equal(old, new)
    assert model.get_layer("dropout").rate == 0.5


def test_bn_gap_warning():
    assert bn_gap_warning(0.01) is None
    message = bn_gap_warning(0.4)
    assert "momentum: 0.9" in message and "recalibrate: true" in message
    assert "\n" not in message
    assert bn_gap_warning(-0.2, threshold=0.1) is not None
    assert bn_gap_warning(0.08, threshold=0.1) is None


def _digits():
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    order = np.random.default_rng(0).permutation(len(x))
    return x[order], digits.target[order]


def _train(momentum, x, y, steps):
    keras.utils.set_random_seed(0)
    model = build_classifier((8, 8, 1), 10, width=8)
    apply_batchnorm_policy(model, momentum=momentum)
    model.compile(
        keras.optimizers.Adam(3e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,  # an XLA compile costs more than the steps
    )
    reps = -(-64 * steps // len(x))
    xs, ys = np.concatenate([x] * reps), np.concatenate([y] * reps)
    model.fit(xs[: 64 * steps], ys[: 64 * steps], batch_size=64, epochs=1, verbose=0)
    return model


def test_seed_reproduction_short_run_bn_gap():
    """A short run at momentum 0.99 leaves a large train/inference gap; the
    momentum override (0.9) or recalibration closes it to within 2 points."""
    x, y = _digits()
    x_train, y_train, x_val, y_val = x[:1297], y[:1297], x[1297:], y[1297:]
    steps = 60

    stale = _train(0.99, x_train, y_train, steps)
    before = bn_gap(stale, x_val, y_val, batch_size=64)
    batches = [
        (x_train[i : i + 64], y_train[i : i + 64])
        for i in range(0, len(x_train) - 63, 64)
    ]
    recalibrate_batchnorm(stale, batches, num_batches=20)
    recalibrated = bn_gap(stale, x_val, y_val, batch_size=64)

    fast = _train(0.9, x_train, y_train, steps)
    momentum_09 = bn_gap(fast, x_val, y_val, batch_size=64)

    print(
        f"\nbn_gap momentum 0.99: {before}\n"
        f"bn_gap after recalibration: {recalibrated}\n"
        f"bn_gap momentum 0.9: {momentum_09}"
    )
    assert before["train_mode_accuracy"] > 0.8
    assert before["gap"] > 0.3
    assert bn_gap_warning(before["gap"]) is not None
    assert abs(recalibrated["gap"]) <= 0.02
    assert abs(momentum_09["gap"]) <= 0.02
    assert recalibrated["inference_mode_accuracy"] > 0.8
