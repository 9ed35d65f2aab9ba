"""The attacks' property tests on every Keras backend: eps bound, pixel
range, eps=0 is a no-op, dtype-following, success rate on the digits CNN.
The normal suite runs them on TensorFlow; the JAX tier (scripts/test_jax,
in .venv-jax without TensorFlow) selects them with `-m backend_neutral`.
Every attack runs compiled, as training and evaluation run it."""

import json
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from helpers import run_fresh
from keras import ops

from advtrain.attacks import Attack

pytestmark = pytest.mark.backend_neutral
ROOT = Path(__file__).resolve().parents[2]

# Few steps and queries: the JAX tier keeps to a few minutes on 2 cores.
METHODS = {
    "fgsm": {},
    "fgsm_rs": {},
    "n_fgsm": {"noise": 0.05},
    "zerograd": {},
    "pgd": {"steps": 5, "restarts": 2},
    "apgd_ce": {"steps": 10},
    "apgd_dlr": {"steps": 10, "targets": 3},
    "square": {"queries": 100},
}
EPS = {"inf": 0.1, "2": 0.8}


def compiled(fn):
    """`fn` traced once, as the backend's training step would run it."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(fn)
    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(fn)
    return fn


def _run(model, attack, x, y, dtype="float32"):
    def run(x, y):
        return attack(lambda z: model(z, training=False), x, y, seed=1)

    x_adv = compiled(run)(ops.convert_to_tensor(x, dtype), ops.convert_to_tensor(y))
    return keras.ops.convert_to_numpy(ops.cast(x_adv, "float32"))


def _accuracy(model, x, y) -> float:
    logits = keras.ops.convert_to_numpy(model(x, training=False))
    return float(np.mean(np.argmax(logits, axis=-1) == y))


def _sizes(delta, norm):
    flat = delta.reshape(len(delta), -1)
    return np.abs(flat).max(1) if norm == "inf" else np.linalg.norm(flat, axis=1)


@pytest.mark.parametrize("norm", ["inf", "2"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_within_eps_and_pixel_range(digits_cnn, test_digits, method, norm):
    x, y = test_digits[0][:32], test_digits[1][:32]
    eps = EPS[norm]
    attack = Attack(method, eps=eps, norm=norm, **METHODS[method])
    x_adv = _run(digits_cnn, attack, x, y)
    sizes = _sizes(x_adv - x, norm)
    # N-FGSM is unprojected by design: noise + step.
    bound = eps + METHODS[method].get("noise", 0.0) if method == "n_fgsm" else eps
    assert sizes.max() <= bound + 1e-5
    assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
    assert np.median(sizes) > 0.5 * eps  # it moved: not a silent no-op


@pytest.mark.parametrize("method", sorted(METHODS))
def test_eps_zero_leaves_inputs_unchanged(digits_cnn, test_digits, method):
    x, y = test_digits[0][:16], test_digits[1][:16]
    settings = dict(METHODS[method])
    if method == "n_fgsm":
        settings["noise"] = 0.0
    x_adv = _run(digits_cnn, Attack(method, eps=0.0, **settings), x, y)
    np.testing.assert_allclose(x_adv, x, atol=1e-7)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("method", ["fgsm", "pgd", "apgd_ce", "square"])
def test_follows_the_input_dtype(digits_cnn, test_digits, method, dtype):
    x, y = test_digits[0][:16], test_digits[1][:16]
    attack = Attack(method, eps=0.1, **METHODS[method])

    def run(x, y):
        return attack(lambda z: digits_cnn(z, training=False), x, y, seed=1)

    x_adv = compiled(run)(ops.convert_to_tensor(x, dtype), ops.convert_to_tensor(y))
    assert keras.backend.standardize_dtype(x_adv.dtype) == dtype
    assert tuple(x_adv.shape) == x.shape


@pytest.mark.parametrize(
    "method,settings,drop",
    [
        ("fgsm", {}, 0.3),
        ("pgd", {"steps": 10}, 0.5),
        ("apgd_ce", {"steps": 20}, 0.5),
        ("apgd_dlr", {"steps": 20, "targets": 3}, 0.5),
        ("square", {"queries": 300}, 0.3),
    ],
)
def test_breaks_the_digits_cnn(digits_cnn, test_digits, method, settings, drop):
    x, y = test_digits[0][:128], test_digits[1][:128]
    clean = _accuracy(digits_cnn, x, y)
    x_adv = _run(digits_cnn, Attack(method, eps=0.1, **settings), x, y)
    assert clean > 0.9
    assert _accuracy(digits_cnn, x_adv, y) < clean - drop


_ON_JAX = """
import json, sys
import numpy as np
import advtrain.attacks, advtrain.backend
try:
    advtrain.attacks.cleverhans_fgsm(
        lambda z: z, np.zeros((1, 2), "float32"), np.zeros(1, "int32"), eps=0.1
    )
    refused = None
except ValueError as error:
    refused = str(error)
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow")
print(json.dumps([advtrain.backend.NAME, loaded, refused]))
"""


@pytest.mark.parametrize(
    "settings",
    [
        {"method": "fgsm"},
        {"method": "fgsm_rs", "norm": "inf"},
        {"method": "fgsm_rs", "norm": 2, "eps": 0.8, "alpha": 0.5},
        {"method": "fgsm_rs", "clip_start": False},
    ],
)
def test_step_from_gradient_is_the_attack_given_its_gradient(
    digits_cnn, test_digits, settings
):
    """The gradient-reusing step takes the method's own step: given the
    gradient the attack used and the same seed, it is the attack, to the
    bit (the start clipped per `clip_start`)."""
    attack = Attack(**{"eps": 0.3, **settings})
    x = ops.convert_to_tensor(test_digits[0][:16], "float32")
    y = ops.convert_to_tensor(test_digits[1][:16])

    def both(x, y):
        x_adv, grad = attack(
            lambda z: digits_cnn(z, training=False), x, y, seed=3,
            return_gradient=True,
        )  # fmt: skip
        return x_adv, attack.step_from_gradient(x, grad, seed=3)

    x_adv, reused = compiled(both)(x, y)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(reused), ops.convert_to_numpy(x_adv)
    )


def test_importing_the_attacks_on_jax_leaves_tensorflow_unloaded():
    # The cleverhans backend (TensorFlow-only) refuses in one line, and
    # asking does not import TensorFlow either (on JAX from the TensorFlow
    # tier, on the tier's own backend elsewhere).
    other = (
        "jax" if keras.backend.backend() == "tensorflow" else keras.backend.backend()
    )
    result = run_fresh([sys.executable, "-c", _ON_JAX], ROOT, KERAS_BACKEND=other)
    name, loaded, refused = json.loads(result.stdout.splitlines()[-1])
    assert (name, loaded) == (other, [])
    assert refused.startswith("The cleverhans backend runs on TensorFlow only")
    assert "\n" not in refused


def test_counted_loop_unrolls_an_int_count_on_jax_and_matches_a_tensor_count():
    # JAX: a loop whose count is a Python int is unrolled (inside an XLA:CPU
    # while loop PGD's input gradient misses the fast convolution path).
    from advtrain import backend

    def body(i, x):
        return i + 1, x * 2.0 + 1.0

    start = (ops.convert_to_tensor(0, "int32"), ops.ones((3,)))
    i, unrolled = backend.counted_loop(body, start, 4)
    _, looped = backend.counted_loop(body, start, ops.convert_to_tensor(4, "int32"))
    assert int(ops.convert_to_numpy(i)) == 4
    np.testing.assert_allclose(ops.convert_to_numpy(unrolled), 31.0)
    np.testing.assert_allclose(ops.convert_to_numpy(looped), 31.0)
    if keras.backend.backend() == "jax":
        import jax

        text = str(
            jax.make_jaxpr(lambda x: backend.counted_loop(body, (0, x), 4))(
                np.ones(3, np.float32)
            )
        )
        assert "while" not in text


# Budgets over several host chunks (of 4 here; APGD's and FAB's own are
# 10, Square's 20), with restarts and targets.
HOST_DRIVEN = [
    ("apgd_ce", {"steps": 12, "restarts": 2}),
    ("apgd_dlr", {"steps": 11, "targets": 2}),
    ("apgd_dlr", {"steps": 6, "targets": 0, "restarts": 2}),
    ("fab_t", {"steps": 11, "targets": 2, "restarts": 2}),
    ("square", {"queries": 45, "restarts": 2}),
    ("square", {"queries": 25, "norm": 2, "eps": 1.0}),
]


@pytest.mark.parametrize(
    "method,settings", HOST_DRIVEN, ids=[m for m, _ in HOST_DRIVEN]
)
def test_loops_from_the_host_give_the_points_of_the_compiled_loops(
    method, settings, monkeypatch
):
    """APGD, FAB-T and Square driven from the host in chunks (`Pieces` with
    a compiler: on every backend here, eagerly; on JAX an eager call does
    so itself, over jitted pieces, with no while loop around a gradient)
    give the points they give compiled whole for the same seed."""
    from helpers import bn_classifier, record_while_loops

    from advtrain.attacks.common import Pieces

    model = bn_classifier()
    x = np.random.default_rng(5).random((6, 8, 8, 1)).astype("float32")
    # The model's own labels: every example starts right, so the later
    # runs (restarts, targets) and the early stop between them matter.
    y = np.argmax(keras.ops.convert_to_numpy(model(x, training=False)), -1)
    attack = Attack(method, **{"eps": 0.1, **settings})
    whole = _run(model, attack, x, y)
    f = lambda z: model(z, training=False)  # noqa: E731
    keys = []

    def eager(key, fn, *arrays):
        keys.append(key)
        return fn(f, *arrays)

    host = attack(Pieces(f, compile=eager).chunked(4), x, y, seed=1)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(host), whole, atol=1e-6)
    assert keys  # the pieces ran through the compiler
    loops = record_while_loops(monkeypatch)
    called = keras.ops.convert_to_numpy(attack(f, x, y, seed=1))
    np.testing.assert_allclose(called, whole, atol=1e-6)
    # Square's queries take no gradient: its loop stays one compiled loop.
    assert set(loops) <= {"_queries"}


def test_pieces_run_loops_in_chunks_from_the_host_and_stop_early():
    """`Pieces`: inline, one loop with a tensor count; from the host,
    chunks of `chunk` iterations, and runs stop once every example is
    fooled."""
    from advtrain.attacks.common import Pieces, runs_until_fooled

    inline = Pieces(lambda z: z)
    [(first, count)] = inline.spans(25)
    assert first == 0 and int(ops.convert_to_numpy(count)) == 25
    compiled = []

    def compile(key, fn, *arrays):
        compiled.append(key)
        return fn(lambda z: z, *arrays)

    host = Pieces(compile=compile).chunked(10)
    assert host.spans(25) == [(0, 10), (10, 10), (20, 5)]
    calls = []

    def body(run, best, fooled):
        calls.append(run)
        return run + 1, best, fooled | (ops.arange(3) <= run)

    state = (ops.convert_to_tensor(0, "int32"), ops.zeros(3), ops.zeros(3, "bool"))
    run, _, fooled = runs_until_fooled(host, body, state, 9)
    assert int(ops.convert_to_numpy(run)) == 3 and len(calls) == 3
    assert bool(ops.convert_to_numpy(ops.all(fooled)))
    doubled = host.run(lambda f, z, *, k: f(z) * k, np.ones(2, np.float32), k=2)
    np.testing.assert_allclose(ops.convert_to_numpy(doubled), 2.0)
    assert compiled and compiled[0][-1] == ("k", 2)
