"""A registered attack method runs wherever `Attack` runs: training and
evaluation; `make_attack` builds the `Attack` a recipe's keys describe."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import dense_classifier

from advtrain.attacks import Attack, make_attack, register_attack
from advtrain.attacks.common import attack_inputs, clip_pixels, input_gradient
from advtrain.models import AdversarialModel

CALLS = []


@register_attack("test_half_step")
def half_step(model_fn, x, y, *, eps, loss_fn=None, loss_scale=None, clip_max=1.0):
    """Half an FGSM step; records what `Attack` passed in."""
    CALLS.append({"eps": eps, "clip_max": clip_max, "scaled": loss_scale is not None})
    x, y = attack_inputs(model_fn, x, y)
    grad = input_gradient(model_fn, x, y, loss_fn, loss_scale)
    return clip_pixels(x + 0.5 * eps * tf.sign(grad), 0.0, clip_max)


def test_registered_method_trains_two_steps(digits):
    x, y = digits[0][:64], digits[1][:64]
    CALLS.clear()
    model = AdversarialModel(
        dense_classifier(seed=1), Attack("test_half_step", eps=0.2), adv_weight=1.0
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    assert len(history.history["loss"]) == 1
    assert np.isfinite(history.history["loss"][0])
    # Traced into the step with the Attack's own fields.
    assert CALLS and CALLS[0]["eps"] == 0.2 and CALLS[0]["clip_max"] == 1.0


def test_registered_method_perturbs_by_its_own_rule(trained_dense, batch_of_digits):
    x, y = batch_of_digits
    f = lambda z: trained_dense(z, training=False)  # noqa: E731
    x_adv = Attack("test_half_step", eps=0.2)(f, x, y).numpy()
    moved = np.abs(x_adv - x.numpy())
    assert moved.max() <= 0.1 + 1e-6
    assert moved.max() > 0.09


def test_registered_method_runs_in_evaluation(trained_dense, batch_of_digits):
    from advtrain.evaluation.robustness import AttackRunner

    x, y = batch_of_digits
    runner = AttackRunner(trained_dense, seed=0)
    predicted = runner(Attack("test_half_step", eps=0.2), x, y).numpy()
    # The runner's verdicts are the model's on the method's own points.
    f = lambda z: trained_dense(z, training=False)  # noqa: E731
    x_adv = Attack("test_half_step", eps=0.2)(f, x, y)
    np.testing.assert_array_equal(predicted, np.argmax(f(x_adv), axis=-1))
    assert np.mean(predicted == y.numpy()) < np.mean(np.argmax(f(x), -1) == y.numpy())


@pytest.fixture
def batch_of_digits(digits):
    return tf.constant(digits[0][:32], tf.float32), tf.constant(digits[1][:32])


def test_make_attack_maps_recipe_methods():
    assert make_attack("none") is None
    assert make_attack("trades", eps=0.3, steps=5) == Attack("pgd", eps=0.3, steps=5)
    assert make_attack("fgsm_rs", eps=0.1, clip_start=False) == Attack(
        "fgsm_rs", eps=0.1, clip_start=False
    )
    assert make_attack("test_half_step", eps=0.2).method == "test_half_step"


def test_make_attack_rejects_unknown_keys_and_methods():
    with pytest.raises(TypeError, match=r"Received: adv_weight=0\.5"):
        make_attack("pgd", eps=0.1, adv_weight=0.5)
    with pytest.raises(ValueError, match="Unknown attack 'pgdd'"):
        make_attack("pgdd", eps=0.1)


def test_training_pgd_defaults_to_seven_steps():
    # One default with the recipe's attack.steps.
    assert Attack("pgd").steps == 7
