"""A registered attack method runs wherever `Attack` runs: training and
evaluation; `Attack.from_config` builds the `Attack` a config describes."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml
from helpers import dense_classifier

from advtrain.attacks import Attack, register_attack
from advtrain.attacks.attack import attack_settings
from advtrain.attacks.common import attack_inputs, clip_pixels, input_gradient
from advtrain.models import AdversarialModel
from advtrain.utils.errors import ArgumentError

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
    predicted = np.asarray(runner(Attack("test_half_step", eps=0.2), x, y))
    # The runner's verdicts are the model's on the method's own points.
    f = lambda z: trained_dense(z, training=False)  # noqa: E731
    x_adv = Attack("test_half_step", eps=0.2)(f, x, y)
    np.testing.assert_array_equal(predicted, np.argmax(f(x_adv), axis=-1))
    assert np.mean(predicted == y.numpy()) < np.mean(np.argmax(f(x), -1) == y.numpy())


@pytest.fixture
def batch_of_digits(digits):
    return tf.constant(digits[0][:32], tf.float32), tf.constant(digits[1][:32])


def test_from_config_builds_registered_methods():
    # TRADES is an objective now (attack.objective), not an attack.
    with pytest.raises(ValueError, match="Unknown attack 'trades'"):
        Attack.from_config({"method": "trades", "eps": 0.3})
    config = {"method": "fgsm_rs", "eps": 0.1, "clip_start": False}
    assert Attack.from_config(config) == Attack("fgsm_rs", eps=0.1, clip_start=False)
    assert Attack.from_config({"method": "test_half_step"}).method == "test_half_step"


def test_from_config_refuses_unknown_keys_methods_and_non_mappings():
    with pytest.raises(ArgumentError, match=r"Received: adv_weight=0\.5"):
        Attack.from_config({"method": "pgd", "eps": 0.1, "adv_weight": 0.5})
    with pytest.raises(ValueError, match="Unknown attack 'pgdd'"):
        Attack.from_config({"method": "pgdd", "eps": 0.1})
    with pytest.raises(TypeError, match="Received: config='pgd'"):
        Attack.from_config("pgd")


def test_an_unset_setting_has_the_function_default_in_python_and_recipes():
    from advtrain.recipe.build import attack_from_config
    from advtrain.recipe.loader import recipe_from_dict

    assert Attack("pgd").steps == 10 == attack_settings("pgd")["steps"]
    recipe = recipe_from_dict({"attack": {"method": "pgd"}})
    assert attack_from_config(recipe.attack).steps == 10
    # The resolved recipe states it, and no key pgd does not take.
    assert recipe.to_dict()["attack"]["steps"] == 10
    assert "alpha" not in recipe.to_dict()["attack"]


# ---------------------------------------------------------------- options

SCALES = []
SEEN = []


@register_attack("test_scaled_step")
def scaled_step(model_fn, x, y=None, *, eps, scale=1.0, loss_fn=None, loss_scale=None):
    """`scale` x an FGSM step; records the scale it was given (when traced)."""
    SCALES.append(scale)
    x, y = attack_inputs(model_fn, x, y)
    grad = input_gradient(model_fn, x, y, loss_fn, loss_scale)
    return clip_pixels(x + scale * eps * tf.sign(grad), 0.0, 1.0)


@register_attack("test_any_options")
def any_options(model_fn, x, y=None, *, eps, **kwargs):
    """Takes any keyword; records them."""
    SEEN.append(kwargs)
    return tf.convert_to_tensor(x)


def test_attack_settings_are_its_own_keyword_arguments():
    assert attack_settings("test_scaled_step") == {"scale": 1.0}
    assert attack_settings("apgd_ce") == {
        "steps": 100, "restarts": 1, "rho": 0.75, "momentum": 0.75
    }  # fmt: skip
    assert attack_settings("fgsm") == {}
    assert attack_settings("test_any_options") is None


def test_an_attack_receives_its_settings(trained_dense, batch_of_digits):
    x, y = batch_of_digits
    f = lambda z: trained_dense(z, training=False)  # noqa: E731
    SCALES.clear()
    attack = Attack("test_scaled_step", eps=0.2, scale=0.25)
    assert attack == Attack("test_scaled_step", eps=0.2, options={"scale": 0.25})
    moved = np.abs(attack(f, x, y).numpy() - x.numpy())
    assert SCALES == [0.25]
    assert 0.04 < moved.max() <= 0.05 + 1e-6
    SEEN.clear()
    Attack("test_any_options", eps=0.1, options={"anything": 3})(f, x, y)
    # What it was given, and no other method's settings.
    assert SEEN[-1]["anything"] == 3 and "steps" not in SEEN[-1]


def test_a_setting_the_attack_does_not_take_is_refused():
    with pytest.raises(ArgumentError) as info:
        Attack("test_scaled_step", eps=0.1, scal=2)
    assert str(info.value) == (
        "scal: test_scaled_step does not take scal; it takes eps, scale. Did "
        "you mean 'scale'? Received: scal=2"
    )
    with pytest.raises(ArgumentError, match="given both as a keyword and in"):
        Attack("pgd", steps=2, options={"steps": 3})
    # A per-call keyword is never a setting, **kwargs or not.
    with pytest.raises(ArgumentError, match="seed: is given per call"):
        Attack("test_any_options", options={"seed": 3})
    with pytest.raises(ArgumentError, match="options: must map setting names"):
        Attack("test_scaled_step", options=[("scale", 2)])


def test_options_survive_config_replace_and_the_training_model(digits):
    x, y = digits[0][:64], digits[1][:64]
    attack = Attack("test_scaled_step", eps=0.2, options={"scale": 0.5})
    assert Attack.from_config(attack.get_config()) == attack
    assert attack.replace(eps=0.1).settings == {"scale": 0.5}
    model = AdversarialModel(
        dense_classifier(seed=1), attack, adv_weight=1.0, eps_ramp_steps=2
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    SCALES.clear()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert SCALES and set(SCALES) == {0.5}  # the train step, eps ramped
    SCALES.clear()
    model.evaluate(x, y, batch_size=32, verbose=0)
    assert SCALES and set(SCALES) == {0.5}  # the test step (validation)
    restored = AdversarialModel.from_config(model.get_config())
    assert restored.attack.settings == {"scale": 0.5}


def test_a_recipe_passes_attack_options_to_the_training_attack(tmp_path):
    from advtrain.recipe.build import build_training_model
    from advtrain.recipe.loader import load_recipe

    path = tmp_path / "r.yaml"
    path.write_text("attack: {method: test_scaled_step, eps: 0.2}\n")
    recipe = load_recipe(path, ["attack.options.scale=0.5"])
    model = build_training_model(recipe, dense_classifier())
    assert model.attack.settings == {"scale": 0.5}
    saved = yaml.safe_load(recipe.to_yaml())
    assert saved["attack"]["options"] == {"scale": 0.5}


def test_a_recipe_with_an_unknown_attack_option_fails_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from advtrain.cli.commands import app

    path = tmp_path / "r.yaml"
    path.write_text(
        "attack: {method: test_scaled_step, eps: 0.2, options: {scal: 2}}\n"
    )
    result = CliRunner().invoke(app, ["run", str(path), "-o", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0, result.output
    assert (
        "attack.options.scal: test_scaled_step does not take scal; it takes eps, "
        "scale. Did you mean 'scale'? Received: scal=2"
    ) in result.output
    assert not (tmp_path / "o").exists()
