"""N-FGSM and ZeroGrad: the two single-step variants beside FGSM-RS."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from advtrain.attacks import Attack
from advtrain.attacks.fgsm import fgsm_random_start, n_fgsm, zerograd
from advtrain.models import AdversarialModel
from advtrain.models.attack_then_train import scaled_attack
from advtrain.recipe.loader import load_recipe
from advtrain.recipe.schema import RecipeError


def _linear(weights):
    """Logits (s, -s) with s = <weights, z>: the input gradient of the
    label-1 loss is a positive multiple of `weights` in every example."""
    w = tf.constant(weights, tf.float32)

    def model_fn(z):
        score = tf.reduce_sum(z * w, axis=[1, 2, 3])
        return tf.stack([score, -score], axis=1)

    return model_fn


X = tf.fill((8, 4, 4, 1), 0.5)
Y = tf.ones((8,), tf.int32)


def test_n_fgsm_is_not_projected_onto_the_eps_ball():
    model_fn = _linear(np.ones((4, 4, 1)))
    x_adv = n_fgsm(model_fn, X, Y, eps=0.1, seed=1)
    delta = (x_adv - X).numpy()
    # noise up to 2 eps, then a step of eps: beyond eps, within 3 eps.
    assert delta.max() > 0.1 + 1e-3
    assert np.abs(delta).max() <= 0.3 + 1e-6
    # Every pixel stepped up by eps from its start, which lay in [-0.2, 0.2].
    assert delta.min() >= -0.1 - 1e-6
    projected = fgsm_random_start(model_fn, X, Y, eps=0.1, alpha=0.1, seed=1)
    assert np.abs((projected - X).numpy()).max() <= 0.1 + 1e-6


def test_n_fgsm_noise_and_step_are_settable_and_the_pixel_range_holds():
    model_fn = _linear(np.ones((4, 4, 1)))
    x_adv = n_fgsm(model_fn, X, Y, eps=0.3, noise=0.0, alpha=0.05, seed=1)
    np.testing.assert_allclose(x_adv, X + 0.05, atol=1e-6)
    far = n_fgsm(model_fn, X, Y, eps=0.3, noise=0.6, alpha=0.3, seed=2)
    assert float(tf.reduce_min(far)) >= 0.0 and float(tf.reduce_max(far)) <= 1.0
    with pytest.raises(ValueError, match="noise"):
        n_fgsm(model_fn, X, Y, eps=0.3, noise=-0.1)


def test_zerograd_leaves_the_smallest_gradient_entries_at_their_start():
    # Gradient magnitude grows with the pixel index: the lowest 50% of
    # entries (indices 0-7) are zeroed and take no step from the start.
    weights = np.arange(1, 17, dtype=np.float32).reshape(4, 4, 1)
    model_fn = _linear(weights)
    x_adv, grad = zerograd(
        model_fn, X, Y, eps=0.1, alpha=0.5, zero_quantile=0.5, seed=4,
        clip_start=False, return_gradient=True,
    )  # fmt: skip
    flat = tf.reshape(grad, (8, 16)).numpy()
    assert np.all(flat[:, :8] == 0) and np.all(flat[:, 8:] != 0)
    # The large entries step to the edge of the eps-ball (alpha > 2 eps);
    # the zeroed ones keep their random start, strictly inside it.
    delta = tf.reshape(x_adv - X, (8, 16)).numpy()
    np.testing.assert_allclose(delta[:, 8:], 0.1, atol=1e-6)
    assert np.abs(delta[:, :8]).max() < 0.1


def test_zerograd_with_quantile_zero_is_fgsm_rs():
    model_fn = _linear(np.linspace(-1, 1, 16).reshape(4, 4, 1))
    ours = zerograd(model_fn, X, Y, eps=0.2, zero_quantile=0.0, seed=7)
    reference = fgsm_random_start(model_fn, X, Y, eps=0.2, seed=7)
    np.testing.assert_allclose(ours, reference)


def test_attack_fields_reach_the_new_methods_and_the_ramp_scales_noise():
    model_fn = _linear(np.ones((4, 4, 1)))
    attack = Attack("n_fgsm", eps=0.3, noise=0.0, alpha=0.05)
    np.testing.assert_allclose(attack(model_fn, X, Y), X + 0.05, atol=1e-6)
    assert attack.single_step and not attack.fusable
    assert Attack("zerograd", eps=0.1).single_step
    half = scaled_attack(Attack("n_fgsm", eps=0.3, noise=0.2), 0.5)
    assert (half.eps, half.noise) == pytest.approx((0.15, 0.1))
    with pytest.raises(ValueError, match="zero_quantile"):
        Attack("zerograd", eps=0.1, zero_quantile=1.0)


def test_fused_training_refuses_n_fgsm():
    classifier = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(),
                                   keras.layers.Dense(2)])  # fmt: skip
    with pytest.raises(ValueError, match="reuse_gradient=True needs"):
        AdversarialModel(classifier, Attack("n_fgsm", eps=0.1), reuse_gradient=True)


@pytest.mark.parametrize("method", ["n_fgsm", "zerograd"])
def test_adversarial_training_runs_with_each_method(method):
    x = np.random.default_rng(0).uniform(size=(32, 4, 4, 1)).astype("float32")
    y = (x.mean(axis=(1, 2, 3)) > 0.5).astype("int32")

    def trained(attack):
        keras.utils.set_random_seed(0)
        classifier = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(),
                                       keras.layers.Dense(2)])  # fmt: skip
        model = AdversarialModel(classifier, attack, adv_weight=1.0)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
        return history.history, classifier.get_weights()[0]

    history, weights = trained(Attack(method, eps=0.1))
    assert np.isfinite(history["loss"]).all()
    assert 0.0 <= history["zero_grad_fraction"][-1] <= 1.0
    # The step trains on this method's points, not plain FGSM's: from the
    # same start, the weights end elsewhere.
    _, fgsm_weights = trained(Attack("fgsm", eps=0.1))
    assert np.abs(weights - fgsm_weights).max() > 1e-4


def test_recipe_keys_for_the_new_methods(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("attack: {method: n_fgsm, noise: 0.3, clip_start: false}\n")
    recipe = load_recipe(path)
    assert (recipe.attack.noise, recipe.attack.clip_start) == (0.3, False)
    path.write_text("attack: {method: zerograd, zero_quantile: 1.5}\n")
    with pytest.raises(RecipeError, match="zero_quantile"):
        load_recipe(path)


def test_the_run_header_names_each_methods_step_settings():
    from advtrain.recipe.summary import _method_options

    assert _method_options(Attack("fgsm_rs", eps=0.3)) == (
        " alpha=1.25*eps clip_start=True"
    )
    assert _method_options(Attack("n_fgsm", eps=0.3, noise=0.3)) == (
        " alpha=eps noise=0.3 clip_start=True"
    )
    assert _method_options(Attack("zerograd", eps=0.3, alpha=0.3)) == (
        " alpha=0.3 zero_quantile=0.35 clip_start=True"
    )
    assert _method_options(Attack("pgd", eps=0.3, steps=10)) == (
        " steps=10 step_size=auto random_start=True restarts=1"
    )
    assert _method_options(Attack("fgsm", eps=0.3)) == ""
