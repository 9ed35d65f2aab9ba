"""mixed_float16 on every backend (TensorFlow here; JAX in the JAX tier):
each training step updates the weights, BatchNorm statistics and the
`LossScaleOptimizer`'s dynamic loss scale, and the attack's input gradient
sees the loss scale, in `fit` and in `advtrain.evaluate`'s attacks."""

import keras
import numpy as np
import pytest
from keras import ops

from advtrain.attacks import Attack
from advtrain.models import TRADES, AdversarialModel

pytestmark = pytest.mark.backend_neutral


@pytest.fixture
def float16_policy():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def _cnn():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(8, 3, padding="same")(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.Flatten()(h)
    return keras.Model(inputs, keras.layers.Dense(10, dtype="float32")(h))


def _numpy(variables):
    return [ops.convert_to_numpy(v).astype("float32") for v in variables]


# fgsm: the gradient-reusing step; fgsm_rs: attack, then one training pass;
# TRADES: PGD on the KL, then one pass.
@pytest.mark.parametrize("kind", ["fgsm", "fgsm_rs", "trades"])
def test_mixed_float16_steps_update_weights_and_the_loss_scale(
    digits, float16_policy, kind
):
    x, y = digits[0][:192], digits[1][:192]
    classifier = _cnn()
    if kind == "trades":
        model = TRADES(
            classifier, Attack("pgd", eps=0.1, steps=2), seed=0, batchnorm_momentum=0.9
        )
    else:
        model = AdversarialModel(
            classifier, Attack(kind, eps=0.1), 0.5, seed=0, batchnorm_momentum=0.9
        )
    # The scale doubles after every 2 steps with finite gradients.
    optimizer = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(1e-3), initial_scale=2.0**8, dynamic_growth_steps=2
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    weights = _numpy(classifier.trainable_variables)
    statistics = _numpy(classifier.non_trainable_variables)
    history = model.fit(x, y, batch_size=64, epochs=2, verbose=0).history
    assert int(ops.convert_to_numpy(optimizer.iterations)) == 6
    # 6 finite steps: doubled 3 times (a non-finite one halves it).
    assert float(ops.convert_to_numpy(optimizer.dynamic_scale)) == 2.0**11
    for key in ("loss", "clean_loss", "adv_loss"):
        assert np.isfinite(history[key]).all(), key
    for group, before in (
        (classifier.trainable_variables, weights),
        (classifier.non_trainable_variables, statistics),
    ):
        for old, new in zip(before, _numpy(group), strict=True):
            assert np.isfinite(new).all()
            assert not np.array_equal(old, new)


def _confident_classifier():
    """At pixels near 0.5 logit 0 is 22 and logit 1 is 3.2: class 1's
    cross-entropy gradient (7e-9) underflows in float16 without a loss
    scale, and it is the only one that reaches the pixels."""
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Flatten()(inputs)
    kernel = np.zeros((64, 10), "float32")
    kernel[:, 0] = 22.0 / 32.0
    kernel[:, 1] = 0.1
    outputs = keras.layers.Dense(
        10, kernel_initializer=keras.initializers.Constant(kernel)
    )(h)
    return keras.Model(inputs, outputs)


def _moved_by_eps(x_adv, x, eps=0.1):
    # No pixel sits at a clip bound: each moves by eps unless its float16
    # gradient underflowed to zero.
    delta = np.abs(ops.convert_to_numpy(x_adv) - x)
    return np.isclose(delta, eps, atol=1e-3).mean()


def test_float16_attack_in_the_step_uses_the_loss_scale(float16_policy):
    rng = np.random.default_rng(0)
    x = (0.5 + rng.uniform(-0.05, 0.05, (32, 8, 8, 1))).astype("float32")
    y = np.zeros((32,), "int32")
    model = AdversarialModel(_confident_classifier(), Attack("fgsm", eps=0.1), 0.5)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    assert float(ops.convert_to_numpy(model.attack_loss_scale())) > 1000
    x_adv = model.generate_adversarial(ops.convert_to_tensor(x), ops.array(y))
    assert _moved_by_eps(x_adv, x) > 0.99
    logs = model.train_on_batch(x, y, return_dict=True)
    assert logs["zero_grad_fraction"] < 0.01
