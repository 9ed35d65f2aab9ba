"""`advtrain.evaluate` on every Keras backend: its inputs (arrays, a
`PyDataset`, an iterable of batches), its random stream, the masking
checks, and one `.keras` model measured alike on TensorFlow and on JAX.
The JAX tier runs the ones marked `backend_neutral`, without TensorFlow."""

import importlib.util
import json
import sys

import keras
import numpy as np
import pytest
from helpers import bn_classifier, record_while_loops, run_fresh

import advtrain
from advtrain.attacks import Attack
from advtrain.evaluation.robustness import AttackRunner
from advtrain.evaluation.sanity import run_sanity_checks

EPS = 0.1
# FGSM and a short PGD: cheap, and FGSM is deterministic.
QUICK = dict(eps=EPS, attacks=["fgsm", "pgd"], pgd_steps=3, batch_size=32)


class _Digits(keras.utils.PyDataset):
    def __init__(self, x, y, batch_size):
        super().__init__()
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return -(-len(self.y) // self.batch_size)

    def __getitem__(self, index):
        part = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return self.x[part], self.y[part]


@pytest.mark.backend_neutral
def test_arrays_pydataset_and_batches_evaluate_alike(trained_dense, test_digits):
    x, y = test_digits[0][:80], test_digits[1][:80]
    arrays = advtrain.evaluate(trained_dense, (x, y), **QUICK)
    sequence = advtrain.evaluate(trained_dense, _Digits(x, y, 32), **QUICK)
    batches = [(x[i : i + 32], y[i : i + 32]) for i in range(0, 80, 32)]
    iterable = advtrain.evaluate(trained_dense, iter(batches), **QUICK)
    assert arrays["examples"] == sequence["examples"] == iterable["examples"] == 80
    # The same batches and seed: the same random starts, the same verdicts.
    for key in ("clean_accuracy", "fgsm_accuracy", "pgd_accuracy", "macro_f1"):
        assert arrays[key] == sequence[key] == iterable[key], key
    assert arrays["pgd_accuracy"] <= arrays["fgsm_accuracy"] < arrays["clean_accuracy"]
    assert arrays["per_class_accuracy"] == sequence["per_class_accuracy"]
    clean = np.argmax(keras.ops.convert_to_numpy(trained_dense(x)), axis=-1)
    assert arrays["clean_accuracy"] == pytest.approx(np.mean(clean == y))
    with pytest.raises(TypeError, match="Received: data of type ndarray"):
        advtrain.evaluate(trained_dense, x, **QUICK)


@pytest.mark.backend_neutral
def test_random_stream_advances_and_the_model_is_left_alone(digits):
    model = bn_classifier()
    model(digits[0][:64], training=True)  # moving statistics away from 0, 1
    before = [keras.ops.convert_to_numpy(v).copy() for v in model.variables]
    runner = AttackRunner(model, seed=0)
    x, y = digits[0][:16], digits[1][:16]
    attack = Attack("fgsm_rs", eps=EPS)
    first, _ = runner.adversarial(attack, x, y)
    second, _ = runner.adversarial(attack, x, y)
    assert not np.array_equal(first, second)  # fresh random starts
    again, _ = AttackRunner(model, seed=0).adversarial(attack, x, y)
    np.testing.assert_array_equal(first, again)  # and seeded
    assert np.max(np.abs(first - x)) <= EPS + 1e-6
    after = [keras.ops.convert_to_numpy(v) for v in model.variables]
    for old, new in zip(before, after, strict=True):
        np.testing.assert_array_equal(old, new)  # no BatchNorm update


@pytest.mark.backend_neutral
def test_masking_checks_run_on_arrays(trained_dense, test_digits):
    x, y = test_digits[0][:64], test_digits[1][:64]
    checks = run_sanity_checks(
        trained_dense, [(x, y)], default_eps=EPS, pgd_steps=2, max_examples=64
    )
    by_name = {c["name"]: c for c in checks}
    assert len(checks) == 5
    assert by_name["large_eps_breaks_model"]["passed"], by_name
    assert by_name["input_gradients_nonzero"]["passed"], by_name
    # Shattered gradients (Athalye et al. 2018): exactly zero on every
    # backend. (Saturated logits, test_sanity's case, leave XLA's fused
    # softmax gradient tiny but not zero on JAX.)
    inputs = keras.Input((8, 8, 1))
    masked = keras.Model(inputs, trained_dense(_BlindQuantize()(inputs)))
    checks = run_sanity_checks(
        masked, [(x, y)], default_eps=EPS, pgd_steps=2, max_examples=64
    )
    assert not {c["name"]: c for c in checks}["input_gradients_nonzero"]["passed"]


@pytest.mark.backend_neutral
def test_a_second_evaluation_compiles_nothing_and_jax_pgd_has_no_while_loop(
    monkeypatch,
):
    """The attack functions are compiled once per model, not per evaluation;
    on JAX, PGD's steps run as unrolled chunks driven from the host: an
    XLA:CPU while loop around its input gradient misses the fast
    convolution kernels (issue 36)."""
    loops = []
    if keras.backend.backend() == "jax":
        import jax

        def counted(cond, body, init):
            loops.append(body)
            return while_loop(cond, body, init)

        while_loop = jax.lax.while_loop
        monkeypatch.setattr(jax.lax, "while_loop", counted)
    model = bn_classifier()
    x = np.random.default_rng(0).random((24, 8, 8, 1)).astype("float32")
    y = np.arange(24) % 10
    keys = dict(eps=EPS, attacks=["pgd"], pgd_steps=12, pgd_restarts=2)
    first = advtrain.evaluate(model, (x, y), batch_size=16, **keys)
    traces = AttackRunner(model, seed=0).tracing_count
    assert traces > 0
    again = advtrain.evaluate(model, (x, y), batch_size=16, **keys)
    # PyTorch runs the attack functions eagerly (advtrain/backend/torch/
    # ops.py, compile_function): every call runs them anew, none traces.
    if keras.backend.backend() != "torch":
        assert AttackRunner(model, seed=0).tracing_count == traces
    assert again["pgd_accuracy"] == first["pgd_accuracy"]
    assert loops == []


@pytest.mark.backend_neutral
def test_pgd_run_by_the_runner_matches_the_attack_function():
    """The runner's PGD (on JAX: chunks of unrolled steps from the host)
    gives the points of `pgd` itself, and a runner does not keep its
    model alive."""
    import gc
    import weakref

    model = bn_classifier()
    x = np.random.default_rng(1).random((8, 8, 8, 1)).astype("float32")
    y = np.arange(8) % 10
    attack = Attack("pgd", eps=EPS, steps=13, random_start=False)
    expected = attack(model, x, y)  # a Keras call: inference mode
    x_adv, labels = AttackRunner(model, seed=0).adversarial(attack, x, y)
    np.testing.assert_allclose(x_adv, keras.ops.convert_to_numpy(expected), atol=1e-6)
    clean = AttackRunner(model, seed=0).predict(x_adv)
    np.testing.assert_array_equal(labels, clean)
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None


@pytest.mark.backend_neutral
@pytest.mark.parametrize("norm,eps", [("inf", EPS), (2, 1.0)])
def test_the_runners_pgd_restarts_start_where_pgds_do(norm, eps):
    """One PGD: the runner's restarts (on JAX, compiled pieces driven from
    the host) are seeded as `pgd`'s for the same seed, so its points are
    `pgd`'s, restart for restart."""
    model = bn_classifier()
    x = np.random.default_rng(2).random((8, 8, 8, 1)).astype("float32")
    y = np.arange(8) % 10
    attack = Attack("pgd", eps=eps, norm=norm, steps=3, restarts=3)
    x_adv, _ = AttackRunner(model, seed=5).adversarial(attack, x, y)
    expected = attack(
        lambda z: model(z, training=False), x, y, seed=keras.random.SeedGenerator(5)
    )
    np.testing.assert_allclose(x_adv, keras.ops.convert_to_numpy(expected), atol=1e-5)


# AutoAttack's members with budgets that span several host chunks (APGD
# and FAB: 10 steps; Square: 20 queries), restarts and targets.
HOST_DRIVEN = [
    Attack("apgd_ce", eps=EPS, steps=13, restarts=2),
    Attack("apgd_dlr", eps=EPS, steps=12, targets=3),
    Attack("fab_t", eps=EPS, steps=12, targets=2, restarts=2),
    Attack("square", eps=EPS, queries=45, restarts=2),
    Attack("square", eps=1.0, norm=2, queries=25),
]


@pytest.mark.backend_neutral
@pytest.mark.parametrize("attack", HOST_DRIVEN, ids=lambda a: a.method)
def test_the_runners_autoattack_members_are_the_attack_functions(attack, monkeypatch):
    """One implementation, one seeding: the runner's APGD, FAB-T and Square
    (on JAX: compiled pieces driven from the host, no while loop around a
    gradient) give the points of the attack compiled whole for the same
    seed."""
    from advtrain.evaluation.robustness import compile_on, signature

    model = bn_classifier()
    x = np.random.default_rng(3).random((8, 8, 8, 1)).astype("float32")
    y = np.arange(8) % 10

    stream = keras.random.SeedGenerator(4)

    def whole(x, y):
        return attack(lambda z: model(z, training=False), x, y, seed=stream)

    expected = compile_on(model, whole, signature(x, y), stream)(x, y)
    loops = record_while_loops(monkeypatch)
    x_adv, labels = AttackRunner(model, seed=4).adversarial(attack, x, y)
    np.testing.assert_allclose(x_adv, keras.ops.convert_to_numpy(expected), atol=1e-6)
    np.testing.assert_array_equal(labels, AttackRunner(model, seed=0).predict(x_adv))
    assert set(loops) <= {"_queries"}  # Square's, around no gradient


@pytest.mark.backend_neutral
def test_evaluate_runs_the_autoattack_cascade_from_the_host_on_jax(
    monkeypatch,
):
    """On JAX the standard cascade's gradient attacks run from the host
    over compiled chunks (an XLA:CPU while loop around an input gradient
    misses the fast convolutions), Square as one compiled loop; only the
    still-robust examples go on."""
    model = bn_classifier()
    x = np.random.default_rng(4).random((24, 8, 8, 1)).astype("float32")
    y = np.arange(24) % 10
    loops = record_while_loops(monkeypatch)
    budget = dict(apgd_steps=12, square_queries=30, batch_size=16)
    result = advtrain.evaluate(model, (x, y), eps=EPS, attacks=["autoattack"], **budget)
    steps = result["autoattack"]["steps"]
    assert [s["attack"] for s in steps] == ["apgd_ce", "apgd_t", "fab_t", "square"]
    for before, after in zip(steps[:-1], steps[1:], strict=True):
        assert after["attacked"] == before["attacked"] - before["broken"]
    assert set(loops) <= {"_queries"}  # Square's, around no gradient


class _BlindQuantize(keras.layers.Layer):
    """Rounds pixels to 1/4 steps and passes no gradient back."""

    def call(self, x):
        return keras.ops.stop_gradient(keras.ops.round(x * 4) / 4)


EVALUATE = """
import json, sys
import keras, numpy as np
import advtrain
data = np.load(sys.argv[2])
model = keras.saving.load_model(sys.argv[1])
result = advtrain.evaluate(
    model, (data["x"], data["y"]), eps=0.1, attacks=["fgsm", "autoattack"],
    budget="cheap", square_queries=200, batch_size=64,
)
print(json.dumps({
    "backend": keras.backend.backend(),
    "tensorflow": "tensorflow" in sys.modules,
    **{k: result[k] for k in (
        "clean_accuracy", "fgsm_accuracy", "robust_accuracy", "examples")},
}))
"""


@pytest.mark.skipif(
    importlib.util.find_spec("jax") is None, reason="JAX is not installed"
)
def test_a_keras_file_evaluates_alike_on_tensorflow_and_jax(
    digits_cnn, test_digits, tmp_path
):
    """The digits CNN trained on TensorFlow, saved, and evaluated in a fresh
    interpreter per backend: the same clean and FGSM verdicts, and robust
    accuracies within the attacks' randomness (their random draws differ
    between backends); the JAX run imports no TensorFlow."""
    digits_cnn.save(tmp_path / "cnn.keras")
    x, y = test_digits[0][:96], test_digits[1][:96]
    np.savez(tmp_path / "digits.npz", x=x, y=y)
    script = tmp_path / "evaluate.py"
    script.write_text(EVALUATE)
    results = {}
    for name in ("tensorflow", "jax"):
        done = run_fresh(
            [sys.executable, script, "cnn.keras", "digits.npz"],
            tmp_path,
            KERAS_BACKEND=name,
        )
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    tf_side, jax_side = results["tensorflow"], results["jax"]
    assert jax_side["backend"] == "jax" and not jax_side["tensorflow"]
    assert tf_side["examples"] == jax_side["examples"] == 96
    assert tf_side["clean_accuracy"] == jax_side["clean_accuracy"] > 0.9
    assert abs(tf_side["fgsm_accuracy"] - jax_side["fgsm_accuracy"]) <= 1 / 96
    assert 0.1 < tf_side["robust_accuracy"] < tf_side["fgsm_accuracy"]
    assert abs(tf_side["robust_accuracy"] - jax_side["robust_accuracy"]) <= 3 / 96
