"""Property tests every attack deserves, and agreement with cleverhans."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import accuracy

from advtrain.attacks import (
    Attack,
    cleverhans_fgsm,
    cleverhans_pgd,
    fgsm,
    fgsm_random_start,
    pgd,
)

EPS = 0.1


@pytest.fixture(scope="module")
def batch(digits):
    x, y = digits
    return tf.constant(x[1500:1628]), tf.constant(y[1500:1628])


def _model_fn(model):
    return lambda x: model(x, training=False)


ATTACKS = {
    "fgsm": lambda f, x, y, eps, norm: fgsm(f, x, y, eps=eps, norm=norm),
    "fgsm_rs": lambda f, x, y, eps, norm: fgsm_random_start(
        f, x, y, eps=eps, norm=norm, seed=1
    ),
    "pgd": lambda f, x, y, eps, norm: pgd(
        f, x, y, eps=eps, norm=norm, steps=5, restarts=2, seed=1
    ),
}


def _norms(delta, norm):
    flat = tf.reshape(delta, [delta.shape[0], -1]).numpy()
    if norm == "inf":
        return np.abs(flat).max(axis=1)
    return np.linalg.norm(flat, axis=1)


@pytest.mark.parametrize("name", sorted(ATTACKS))
@pytest.mark.parametrize("norm,eps", [("inf", EPS), (2, 0.8)])
def test_perturbation_within_eps_and_pixel_range(trained_dense, batch, name, norm, eps):
    x, y = batch
    x_adv = ATTACKS[name](_model_fn(trained_dense), x, y, eps, norm)
    key = "inf" if norm == "inf" else "2"
    assert np.all(_norms(x_adv - x, key) <= eps + 1e-5)
    assert float(tf.reduce_min(x_adv)) >= 0.0
    assert float(tf.reduce_max(x_adv)) <= 1.0
    # The attack used its budget: not a silent no-op (an attack returning
    # its input, or a tiny step, fails here).
    assert np.median(_norms(x_adv - x, key)) > 0.5 * eps


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_eps_zero_leaves_inputs_unchanged(trained_dense, batch, name):
    x, y = batch
    x_adv = ATTACKS[name](_model_fn(trained_dense), x, y, 0.0, "inf")
    np.testing.assert_array_equal(x_adv.numpy(), x.numpy())


def test_pgd_le_fgsm_le_clean_on_trained_model(trained_dense, batch):
    x, y = batch
    f = _model_fn(trained_dense)
    clean = accuracy(trained_dense, x, y.numpy())
    acc_fgsm = accuracy(trained_dense, fgsm(f, x, y, eps=EPS), y.numpy())
    acc_pgd = accuracy(
        trained_dense, pgd(f, x, y, eps=EPS, steps=10, seed=0), y.numpy()
    )
    assert clean > 0.9
    assert acc_pgd <= acc_fgsm <= clean
    assert acc_pgd < clean - 0.1  # the attack has teeth


def test_more_restarts_never_increase_pgd_accuracy(trained_dense, batch):
    x, y = batch
    f = _model_fn(trained_dense)
    previous = 1.0
    for restarts in (1, 3, 6):
        gen = keras.random.SeedGenerator(7)  # same first start every time
        x_adv = pgd(f, x, y, eps=0.05, steps=3, restarts=restarts, seed=gen)
        acc = accuracy(trained_dense, x_adv, y.numpy())
        assert acc <= previous
        previous = acc


@pytest.mark.parametrize("norm", ["inf", 2])
def test_fgsm_agrees_with_cleverhans(trained_dense, batch, norm):
    x, y = batch
    f = _model_fn(trained_dense)
    ours = fgsm(f, x, y, eps=EPS, norm=norm)
    theirs = cleverhans_fgsm(f, x, y, eps=EPS, norm=norm)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-6)


@pytest.mark.parametrize("norm,eps", [("inf", EPS), (2, 0.8)])
def test_pgd_agrees_with_cleverhans(trained_dense, batch, norm, eps):
    x, y = batch
    f = _model_fn(trained_dense)
    kwargs = dict(eps=eps, norm=norm, steps=5, step_size=eps / 4, random_start=False)
    ours = pgd(f, x, y, **kwargs)
    theirs = cleverhans_pgd(f, x, y, **kwargs)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-5)


@pytest.mark.parametrize(
    "method,module,name",
    [
        ("fgsm", "fast_gradient_method", "fast_gradient_method"),
        ("pgd", "projected_gradient_descent", "projected_gradient_descent"),
    ],
)
def test_attack_spec_selects_cleverhans_backend(
    trained_dense, batch, monkeypatch, method, module, name
):
    import importlib

    x, y = batch
    f = _model_fn(trained_dense)
    target = importlib.import_module(f"cleverhans.tf2.attacks.{module}")
    calls = []
    original = getattr(target, name)

    def spy(*args, **kwargs):
        calls.append(kwargs["loss_fn"])
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, spy)
    settings = dict(eps=EPS)
    if method == "pgd":
        settings.update(steps=3, step_size=EPS / 2, random_start=False)
    ours = Attack(method, **settings)(f, x, y)
    assert calls == []
    theirs = Attack(method, backend="cleverhans", **settings)(f, x, y)
    assert len(calls) == 1
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-5)


def test_attacks_run_in_graph_and_follow_dtype(trained_dense, batch):
    x, y = batch
    model64 = lambda z: tf.cast(trained_dense(tf.cast(z, tf.float32)), tf.float64)  # noqa: E731

    @tf.function
    def run(x64, y):
        return (
            fgsm(model64, x64, y, eps=EPS),
            fgsm_random_start(model64, x64, y, eps=EPS),
            pgd(model64, x64, y, eps=EPS, steps=3, restarts=2),
        )

    for out in run(tf.cast(x, tf.float64), y):
        assert out.dtype == tf.float64
        assert out.shape == x.shape


def test_fgsm_random_start_differs_from_fgsm(trained_dense, batch):
    x, y = batch
    f = _model_fn(trained_dense)
    a = fgsm(f, x, y, eps=EPS)
    b = fgsm_random_start(f, x, y, eps=EPS, alpha=1.25 * EPS, seed=3)
    assert not np.allclose(a.numpy(), b.numpy())


def test_labels_default_to_predictions(trained_dense, batch):
    x, _ = batch
    f = _model_fn(trained_dense)
    predicted = tf.argmax(f(x), axis=-1)
    np.testing.assert_array_equal(
        fgsm(f, x, eps=EPS).numpy(), fgsm(f, x, predicted, eps=EPS).numpy()
    )


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda f, x: fgsm(f, x, eps=-0.1), "eps: must be a finite number >= 0"),
        (lambda f, x: fgsm(f, x, eps=0.1, norm=1), "norm: must be 'inf'"),
        (lambda f, x: pgd(f, x, eps=0.1, steps=0), "steps: must be an int >= 1"),
        (lambda f, x: pgd(f, x, eps=0.1, restarts=0), "restarts: must be"),
        (
            lambda f, x: fgsm(f, tf.cast(x * 255, tf.uint8), eps=0.1),
            "Attacks work on float pixels",
        ),
        (
            lambda f, x: cleverhans_pgd(f, x, eps=0.1, steps=1, step_size=0.2),
            "step_size <= eps",
        ),
        (lambda f, x: Attack("fgsm_rs", backend="cleverhans"), "cleverhans backend"),
        (
            lambda f, x: Attack("pgd", backend="cleverhans", restarts=3),
            "one start per example",
        ),
        (lambda f, x: Attack("pgdd"), "Did you mean 'pgd'"),
    ],
)
def test_bad_hyperparameters_fail_clearly(trained_dense, batch, call, message):
    x, _ = batch
    with pytest.raises((ValueError, TypeError), match=message):
        call(_model_fn(trained_dense), x)


def test_attack_config_round_trip():
    attack = Attack("pgd", eps=0.2, norm=2, steps=7, restarts=3)
    assert Attack.from_config(attack.get_config()) == attack
    assert attack.norm == "2"


def test_unclipped_random_start_takes_the_gradient_outside_the_pixel_range():
    # The loss grows with (z + 0.1)^2: its gradient points up at every
    # pixel >= 0 and down below -0.1, so the step shows where it was taken.
    def model_fn(z):
        score = tf.reduce_sum(tf.square(z + 0.1), axis=[1, 2, 3])
        return tf.stack([score, -score], axis=1)

    x = tf.zeros((4, 6, 6, 1))  # black background: every pixel at 0
    y = tf.ones((4,), tf.int32)
    common = dict(eps=0.3, alpha=0.375, seed=3)
    clipped = fgsm_random_start(model_fn, x, y, **common)
    free = fgsm_random_start(model_fn, x, y, clip_start=False, **common)
    for x_adv in (clipped, free):
        assert float(tf.reduce_min(x_adv)) >= 0.0
        assert float(tf.reduce_max(x_adv)) <= 0.3 + 1e-6
    # Clipped, every start sits at 0 or above and steps up to eps;
    # unclipped, starts below -0.1 (a third) step down and end at 0.
    assert np.mean(np.isclose(clipped.numpy(), 0.3)) > 0.99
    assert np.mean(np.isclose(free.numpy(), 0.3)) < 0.8
    attack = Attack("fgsm_rs", eps=0.3, alpha=0.375, clip_start=False)
    np.testing.assert_allclose(attack(model_fn, x, y, seed=3), free)
