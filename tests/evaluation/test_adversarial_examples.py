"""The adversarial examples an evaluation returns, their grid PNG and its
TensorBoard image (advtrain/evaluation/examples.py). All but the
TensorBoard one are backend-neutral (the JAX tier runs them)."""

import itertools
import json

import keras
import numpy as np
import pytest

from advtrain import backend
from advtrain.evaluation import evaluate
from advtrain.evaluation.examples import (
    FIELDS,
    AdversarialExamples,
    log_examples,
    plot_examples,
)

PNG = b"\x89PNG\r\n\x1a\n"
EPS = 0.1


@pytest.fixture(scope="module")
def found(trained_dense, test_digits):
    """FGSM, an eps sweep, then AutoAttack's cascade (cheap, Square at 30
    queries), on 48 held-out digits, with the examples; and the
    `AttackRunner`s it made."""
    from advtrain.evaluation import robustness

    runners = []

    class Recorded(robustness.AttackRunner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            runners.append(self)

    # Each trace: (which compiled function, the shapes it was traced for).
    traced, compile, numbers = [], robustness._Compiled.compile, itertools.count()

    def recording(self, fn, spec):
        number = next(numbers)

        def recorded(model, *arrays):
            traced.append((number, tuple(tuple(a.shape) for a in arrays)))
            return fn(model, *arrays)

        return compile(self, recorded, spec)

    x, y = test_digits[0][:48], test_digits[1][:48]
    # A copy: the model's compiled functions start empty (runners share them).
    model = keras.models.clone_model(trained_dense)
    model.set_weights(trained_dense.get_weights())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(robustness, "AttackRunner", Recorded)
        patch.setattr(robustness._Compiled, "compile", recording)
        result = evaluate(
            model, (x, y), eps=EPS, attacks=["fgsm", "autoattack"],
            eps_sweep=[0.05], budget="cheap", square_queries=30, seed=1,
            return_examples=True,
        )  # fmt: skip
    return x, y, result, runners, traced


@pytest.mark.backend_neutral
def test_evaluate_returns_the_worst_case_example_of_each(trained_dense, found):
    x, y, result, *_ = found
    result = dict(result)
    examples = result.pop("adversarial_examples")
    json.dumps(result)  # the rest stays JSON
    assert len(examples) == 48 and examples.x_adv.shape == x.shape
    for name in ("y", "attack", "predicted", "robust", "index"):
        assert getattr(examples, name).shape == (48,), name
    np.testing.assert_array_equal(examples.x, x)
    np.testing.assert_array_equal(examples.y, y)
    assert np.max(np.abs(examples.x_adv - x)) <= EPS + 1e-6
    # The verdicts are the headline's, and each names what broke it.
    assert np.mean(examples.robust) == pytest.approx(result["robust_accuracy"])
    np.testing.assert_array_equal(examples.robust, examples.attack == "")
    broken = ~examples.robust
    logits = trained_dense(examples.x_adv, training=False)
    on_adv = np.argmax(keras.ops.convert_to_numpy(logits), axis=-1)
    assert (on_adv[broken] != y[broken]).all()
    np.testing.assert_array_equal(on_adv, examples.predicted)
    # The first attack that broke an example keeps it: FGSM's go first,
    # and the cascade's members fill in the examples FGSM left standing.
    names = set(examples.attack[broken])
    assert "fgsm" in names and names & {"apgd_ce", "apgd_t", "square"}, names
    assert np.sum(examples.attack == "fgsm") == round(
        48 * (result["clean_accuracy"] - result["fgsm_accuracy"])
    )


def _name(key: tuple) -> str:
    if key[0] == "piece":  # ("piece", the attack's module, ...)
        return key[1].rsplit(".", 1)[-1]
    return key[0] if isinstance(key[0], str) else key[0].method


@pytest.mark.backend_neutral
def test_returning_examples_still_traces_each_attack_kind_once(found):
    runners, traced = found[3:]
    functions = runners[0]._functions
    assert len(runners) == 2
    assert all(r._functions is functions for r in runners)
    # Every function traced once for each shape it met (TensorFlow leaves
    # the batch open: once; JAX compiles per batch size), never again.
    assert runners[0].tracing_count == len(traced) >= len(functions)
    assert len(set(traced)) == len(traced), sorted(traced)
    assert len({number for number, _ in traced}) == len(functions)
    # clean labels, fgsm and the sweep's pgd; the cascade's apgd_ce, apgd_t
    # and square (on JAX, PGD, APGD and Square run as compiled pieces, named
    # by their attack's module)
    names = {_name(key) for key in functions}
    cascade = (
        {"apgd", "square"} if backend.HOST_LOOPS else {"apgd_ce", "apgd_dlr", "square"}
    )
    assert {"predict", "fgsm", *cascade} <= names, names
    assert "pgd" in names or "pgd_steps" in names


@pytest.mark.backend_neutral
def test_return_examples_can_keep_a_seeded_subset(trained_dense, test_digits):
    x, y = test_digits[0][:48], test_digits[1][:48]
    keys = dict(eps=EPS, attacks=["fgsm"], seed=3)
    every = evaluate(trained_dense, (x, y), **keys, return_examples=True)
    some = evaluate(trained_dense, (x, y), **keys, return_examples=6, batch_size=16)
    assert "adversarial_examples" not in evaluate(trained_dense, (x, y), **keys)
    every, some = every["adversarial_examples"], some["adversarial_examples"]
    assert len(some) == 6 and list(some.index) == sorted(some.index)
    np.testing.assert_array_equal(some.x_adv, every.x_adv[some.index])
    np.testing.assert_array_equal(some.attack, every.attack[some.index])


def _examples(channels, count=6):
    rng = np.random.default_rng(0)
    x = rng.random((count, 10, 10, channels)).astype("float32")
    x_adv = np.clip(x + rng.uniform(-EPS, EPS, x.shape), 0, 1).astype("float32")
    robust = np.arange(count) % 2 == 0
    attack = np.where(robust, "", "pgd").astype("<U5")
    attack[1] = "clean"
    y = np.arange(count) % 3
    return AdversarialExamples(
        x=x,
        y=y,
        x_adv=x_adv,
        attack=attack,
        predicted=np.where(robust, y, (y + 1) % 3),
        robust=robust,
        index=np.arange(count),
        eps=EPS,
    )


@pytest.mark.backend_neutral
@pytest.mark.parametrize("channels", [1, 3])
def test_grid_is_a_png_for_grey_and_colour_images(tmp_path, channels):
    examples = _examples(channels)
    path = plot_examples(examples.pick(4, seed=0), tmp_path / "grid.png")
    assert path.read_bytes()[:8] == PNG
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.backend_neutral
def test_pick_mixes_broken_and_robust_examples():
    examples = _examples(1, count=12)
    picked = examples.pick(4, seed=0)
    assert sorted(picked.attack) == ["", "", "pgd", "pgd"]
    assert list(picked.index) == sorted(picked.index)
    again = examples.pick(4, seed=0)
    np.testing.assert_array_equal(picked.index, again.index)
    # Only robust ones left: filled up from what there is.
    only = examples.subset(examples.robust).pick(4, seed=0)
    assert len(only) == 4 and only.robust.all()


@pytest.mark.backend_neutral
def test_saved_examples_load_with_numpy(tmp_path):
    examples = _examples(1)
    path = examples.save(tmp_path / "adversarial_examples.npz")
    with np.load(path) as saved:
        assert set(FIELDS) <= set(saved.files)
        np.testing.assert_array_equal(saved["x_adv"], examples.x_adv)
        assert list(saved["attack"]) == list(examples.attack)
        assert float(saved["eps"]) == EPS


def test_tensorboard_gets_the_grid(tmp_path):
    import tensorflow as tf

    log_examples(_examples(3).pick(2), tmp_path, step=3)
    (events,) = tmp_path.glob("events.out.tfevents.*")
    images = [
        (event.step, value.tag, value.tensor.string_val[2][:8])
        for event in tf.compat.v1.train.summary_iterator(str(events))
        for value in event.summary.value
    ]
    assert images == [(3, "adversarial_examples", PNG)]
