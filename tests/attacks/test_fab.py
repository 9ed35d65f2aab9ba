"""FAB-T: the L-inf projection, the attack's properties on the digits CNN,
its settings and its place in AutoAttack's standard cascade. Compiled on
the backend in use: the JAX tier runs them too (`-m backend_neutral`)."""

import keras
import numpy as np
import pytest
from keras import ops

from advtrain.attacks import Attack, attack_settings, fab_t
from advtrain.attacks.fab import project_linf
from advtrain.utils.errors import ArgumentError

pytestmark = pytest.mark.backend_neutral

EPS = 0.1


def _compiled(fn):
    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(fn)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(fn)
    return fn  # PyTorch: eager, as its trainer runs


@pytest.fixture(scope="module")
def cnn(digits_cnn):
    return digits_cnn


def _in_graph(model, eps=EPS, **settings):
    """FAB-T compiled once, as evaluation runs it; numpy out."""
    run = _compiled(
        lambda x, y: fab_t(
            lambda z: model(z, training=False), x, y, eps=eps, **settings
        )
    )
    return lambda x, y: ops.convert_to_numpy(
        run(ops.convert_to_tensor(x), ops.convert_to_tensor(y))
    )


def _smallest_move(t, w, b):
    """The smallest L-inf move onto w.z = b inside [0, 1], by bisection on
    its length (the projection's definition, solved another way)."""
    down = np.sign(w @ t - b)  # lower w.z when it is above b

    def reach(lam):
        target = np.where(w * down > 0, 0.0, 1.0)
        moved = np.clip(target, t - lam, t + lam)
        return moved, down * (w @ moved - b)

    low, high = 0.0, 1.0
    if reach(high)[1] > 0:
        return None  # the box does not reach the plane
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if reach(mid)[1] > 0 else (low, mid)
    return reach(high)[0] - t


def test_projection_is_the_smallest_move_onto_the_plane_in_the_box():
    rng = np.random.default_rng(0)
    t = rng.uniform(0, 1, (200, 12)).astype(np.float32)
    w = rng.normal(size=(200, 12)).astype(np.float32)
    w[:, :3] *= rng.uniform(size=(200, 1)) < 0.5  # some zero normals
    b = (w * t).sum(1) + rng.normal(scale=1.0, size=200).astype(np.float32)
    d = ops.convert_to_numpy(project_linf(t, w, b, 0.0, 1.0))
    reached = 0
    for i in range(len(t)):
        expected = _smallest_move(t[i], w[i], b[i])
        assert np.all(t[i] + d[i] >= -1e-6) and np.all(t[i] + d[i] <= 1 + 1e-6)
        if expected is None:  # unreachable: the box corner nearest the plane
            corner = np.where(w[i] > 0, 0.0, 1.0) * (w[i] @ t[i] > b[i])
            corner += np.where(w[i] < 0, 0.0, 1.0) * (w[i] @ t[i] <= b[i])
            moved = np.where(w[i] == 0, t[i], corner)
            np.testing.assert_allclose(t[i] + d[i], moved, atol=1e-5)
            continue
        reached += 1
        assert w[i] @ (t[i] + d[i]) == pytest.approx(b[i], abs=1e-4)
        size = np.abs(d[i]).max()
        assert size == pytest.approx(np.abs(expected).max(), abs=1e-4)
    assert 100 < reached < len(t)  # both cases were exercised


def test_within_eps_and_pixel_range_and_misclassified(cnn, test_digits):
    x, y = test_digits[0][:96], test_digits[1][:96]
    x_adv = _in_graph(cnn, steps=20, targets=3)(x, y)
    size = np.abs(x_adv - x).reshape(len(x), -1).max(1)
    assert size.max() <= EPS + 1e-6
    assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
    moved = size > 0
    assert moved.sum() > 10  # it broke some: not a silent no-op
    predicted = np.argmax(ops.convert_to_numpy(cnn(x_adv, training=False)), -1)
    # A moved point is adversarial; an unbroken example comes back as it was.
    assert np.all(predicted[moved] != y[moved])
    np.testing.assert_array_equal(x_adv[~moved], x[~moved])


def test_eps_zero_leaves_inputs_unchanged(cnn, test_digits):
    x, y = test_digits[0][:32], test_digits[1][:32]
    x_adv = _in_graph(cnn, eps=0.0, steps=5, targets=2)(x, y)
    np.testing.assert_array_equal(x_adv, x)


def test_as_strong_as_apgd_t_on_the_digits_cnn(cnn, test_digits):
    # Both AutoAttack members at its settings (9 targets, 100 iterations):
    # on this undefended CNN they break about the same digits.
    x, y = test_digits
    fab = _in_graph(cnn)(x, y)
    apgd_t = _compiled(
        lambda x, y: Attack("apgd_dlr", eps=EPS)(lambda z: cnn(z), x, y, seed=0)
    )(ops.convert_to_tensor(x), ops.convert_to_tensor(y))

    def accuracy(points):
        logits = ops.convert_to_numpy(cnn(points))
        return float(np.mean(np.argmax(logits, -1) == y))

    clean = accuracy(x)
    assert accuracy(fab) < clean - 0.3
    assert abs(accuracy(fab) - accuracy(apgd_t)) <= 0.03


def test_random_restarts_start_inside_the_box(cnn, test_digits):
    x, y = test_digits[0][:32], test_digits[1][:32]
    x_adv = _in_graph(cnn, steps=3, targets=1, restarts=3, seed=1)(x, y)
    assert np.abs(x_adv - x).max() <= EPS + 1e-6
    assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0


def test_settings_and_errors(cnn, test_digits):
    assert attack_settings("fab_t") == dict(
        steps=100, targets=9, restarts=1, alpha_max=0.1, eta=1.05, beta=0.9
    )
    x, y = test_digits[0][:4], test_digits[1][:4]
    model_fn = lambda z: cnn(z, training=False)  # noqa: E731
    with pytest.raises(ArgumentError, match="norm='inf' only. Received: norm='2'"):
        Attack("fab_t", eps=0.5, norm=2)(model_fn, x, y)
    with pytest.raises(ArgumentError, match=r"beta: must be in \(0, 1\]"):
        fab_t(model_fn, x, y, eps=EPS, beta=1.5)
    with pytest.raises(ArgumentError, match="clip_min=None"):
        fab_t(model_fn, x, y, eps=EPS, clip_min=None)
    with pytest.raises(ArgumentError, match="fab_t does not take rho"):
        Attack("fab_t", eps=EPS, rho=0.5)
