"""Robust evaluation numbers, the eps-sweep plot, and the MNIST seeds
benchmark (scripts/bench_mnist_robust) that reports them."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from advtrain.attacks import Attack
from advtrain.evaluation.robustness import (
    evaluate,
    evaluate_robustness,
    macro_f1,
    per_class_accuracy,
    plot_eps_sweep,
)
from advtrain.recipe.schema import EvalConfig
from advtrain.utils.errors import ArgumentError


def _batches(x, y, size=100):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(size)


def test_macro_f1_matches_hand_computation():
    labels = np.array([0, 0, 1, 1, 2])
    preds = np.array([0, 1, 1, 1, 0])
    # class 0: tp1 fp1 fn1 -> 0.5; class 1: tp2 fp1 fn0 -> 0.8; class 2: 0
    assert macro_f1(labels, preds, 3) == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    # Classes neither seen nor predicted do not count.
    assert macro_f1(labels, preds, 5) == macro_f1(labels, preds, 3)
    assert macro_f1(labels, labels, 3) == 1.0
    assert per_class_accuracy(labels, preds, 4) == [0.5, 1.0, 0.0, None]


def test_evaluation_orders_clean_fgsm_pgd(trained_dense, digits):
    x, y = digits[0][1500:1700], digits[1][1500:1700]
    result = evaluate_robustness(
        trained_dense,
        _batches(x, y),
        pgd_steps=10,
        pgd_restarts=2,
        eps_sweep=[0.0, 0.1, 0.5],
        default_eps=0.1,
        num_classes=10,
    )
    assert result["examples"] == 200
    assert result["pgd_accuracy"] <= result["fgsm_accuracy"] <= result["clean_accuracy"]
    sweep = {p["eps"]: p["accuracy"] for p in result["eps_sweep"]}
    assert sweep[0.0] == pytest.approx(result["clean_accuracy"])
    assert sweep[0.5] < 0.05  # a large eps must break an undefended model
    assert result["pgd_attack"]["restarts"] == 2
    assert len(result["per_class_accuracy"]) == 10


def test_max_examples_limits_the_subset(trained_dense, digits):
    x, y = digits[0][:300], digits[1][:300]
    result = evaluate_robustness(
        trained_dense,
        _batches(x, y, 64),
        pgd_steps=1,
        fgsm=False,
        max_examples=150,
        default_eps=0.1,
        num_classes=10,
    )
    assert result["examples"] == 150
    assert "fgsm_accuracy" not in result


def test_empty_test_split_is_an_error(trained_dense):
    empty = _batches(np.zeros((0, 8, 8, 1), "float32"), np.zeros((0,), "int64"))
    with pytest.raises(ValueError, match="no examples"):
        evaluate_robustness(trained_dense, empty, default_eps=0.1, num_classes=10)


def test_plot_is_a_png(tmp_path):
    path = plot_eps_sweep(
        [{"eps": 0.0, "accuracy": 0.9}, {"eps": 0.1, "accuracy": 0.5}],
        tmp_path / "s.png",
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp*"))


def test_max_examples_is_a_seeded_random_subset(trained_dense, digits):
    from advtrain.evaluation.robustness import seeded_subset

    x, y = digits[0][:300], digits[1][:300]
    xa, ya, total = seeded_subset(_batches(x, y, 64), 50, seed=3)
    xb, yb, _ = seeded_subset(_batches(x, y, 7), 50, seed=3)
    assert total == 300 and len(ya) == 50
    np.testing.assert_array_equal(xa, xb)  # batch size does not matter
    assert not np.array_equal(ya, y[:50])  # not the first 50
    xc, _, _ = seeded_subset(_batches(x, y, 64), 50, seed=4)
    assert not np.array_equal(xa, xc)
    # In stream order, and really drawn from the stream.
    index = [int(np.flatnonzero((x == row).all(axis=(1, 2, 3)))[0]) for row in xa]
    assert index == sorted(index) and index[-1] > 50

    result = evaluate_robustness(
        trained_dense,
        _batches(x, y, 64),
        pgd_steps=2,
        fgsm=False,
        max_examples=50,
        seed=3,
        default_eps=0.1,
        num_classes=10,
    )
    assert result["subset_of"] == 300 and result["subset_seed"] == 3
    assert sum(result["class_support"]) == 50
    assert np.bincount(ya, minlength=10).tolist() == result["class_support"]
    assert len(result["pgd_per_class_accuracy"]) == 10


def test_default_attacks_are_fgsm_pgd_and_autoattack(trained_dense, digits):
    x, y = digits[0][1500:1600], digits[1][1500:1600]
    result = evaluate_robustness(
        trained_dense, _batches(x, y), pgd_steps=3, default_eps=0.1,
        num_classes=10, square_queries=100,
    )  # fmt: skip
    assert not [key for key in result if key.startswith("apgd")]
    assert result["robust_accuracy_over"] == [
        "clean", "fgsm", "pgd", "apgd_ce", "apgd_t", "fab_t", "square",
    ]  # fmt: skip
    assert result["robust_accuracy"] <= result["pgd_accuracy"]
    assert result["robust_accuracy_worst"] == result["robust_accuracy"]


def test_apgd_attacks_are_selectable_and_no_weaker_than_pgd(trained_dense, digits):
    x, y = digits[0][1500:1700], digits[1][1500:1700]
    result = evaluate_robustness(
        trained_dense,
        _batches(x, y),
        attacks=["pgd", "apgd_ce", "apgd_dlr"],
        pgd_steps=10,
        apgd_steps=10,
        default_eps=0.1,
        num_classes=10,
    )
    assert "fgsm_accuracy" not in result  # the list alone decides
    assert result["apgd_ce_attack"]["steps"] == 10
    assert result["apgd_dlr_attack"]["targets"] == 9
    assert result["apgd_ce_accuracy"] <= result["pgd_accuracy"]
    assert result["apgd_dlr_accuracy"] < result["clean_accuracy"] - 0.2
    worst = result["robust_accuracy_worst"]
    names = ("pgd", "apgd_ce", "apgd_dlr")
    assert worst <= min(result[f"{n}_accuracy"] for n in names)
    assert result["robust_accuracy_worst_over"] == ["clean", *names]


def test_worst_case_is_taken_per_example(trained_dense, digits, monkeypatch):
    """Two attacks that each fool a different half leave nothing robust,
    though each alone reports 50%."""
    from advtrain.evaluation import robustness as evaluation

    x = digits[0][1500:1600]
    y = np.argmax(trained_dense(x, training=False), axis=-1)  # clean: 100%
    fooled_by = {"pgd": slice(0, 50), "apgd_ce": slice(50, 100)}

    def fake_runner(self, attack, xb, yb):
        predictions = np.array(yb)
        predictions[fooled_by[attack.method]] += 1
        return predictions

    monkeypatch.setattr(evaluation.AttackRunner, "__call__", fake_runner)
    result = evaluate_robustness(
        trained_dense,
        _batches(x, y),
        attacks=["pgd", "apgd_ce"],
        default_eps=0.1,
        num_classes=10,
    )
    assert result["clean_accuracy"] == 1.0
    assert result["pgd_accuracy"] == result["apgd_ce_accuracy"] == 0.5
    assert result["robust_accuracy_worst"] == 0.0


@pytest.mark.parametrize(
    "settings,message",
    [
        (dict(attacks=["pgd", "pgd"]), "each attack once"),
        (dict(attacks=["pgd"], pgd_steps=0), "needs eval.pgd_steps >= 1"),
        (dict(attacks=["deepfool"]), "apgd_dlr"),
    ],
)
def test_eval_attacks_are_checked(settings, message):
    with pytest.raises(ValueError, match=message):
        EvalConfig(**settings)


ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "scripts" / "bench_mnist_robust"


def _bench_module():
    import importlib.util
    from importlib.machinery import SourceFileLoader

    loader = SourceFileLoader("bench_mnist_robust", str(BENCH))
    module = importlib.util.module_from_spec(
        importlib.util.spec_from_loader(loader.name, loader)
    )
    loader.exec_module(module)
    return module


def test_bench_table_has_mean_worst_and_time_ratio():
    bench = _bench_module()
    metrics = [
        {"train_seconds": 10.0, "clean_accuracy": 0.9, "pgd_accuracy": 0.8,
         "co_guard": {"triggers": []}},
        {"train_seconds": 14.0, "clean_accuracy": 0.7, "pgd_accuracy": 0.2,
         "co_guard": {"triggers": [{}, {}]}, "catastrophic_overfitting": "no epoch"},
    ]  # fmt: skip
    fast = [bench.row_of("fgsm_rs", s, m) for s, m in enumerate(metrics)]
    slow = [dict(r, method="pgd", train_seconds=3 * r["train_seconds"]) for r in fast]
    table = fast + bench.summarise(fast, "fgsm_rs") + slow
    table += bench.summarise(slow, "pgd")
    assert bench.add_time_ratios(table)
    mean, worst = table[2], table[3]
    assert mean["clean_accuracy"] == pytest.approx(0.8)
    assert worst["pgd_accuracy"] == 0.2 and worst["train_seconds"] == 14.0
    assert worst["guard_events"] == 2 and mean["guard_events"] == 1.0
    assert [r["time_ratio"] for r in table[4:]] == pytest.approx([3, 3, 3, 3])
    text = bench.format_table(table)
    assert text.splitlines()[0].split()[:4] == ["method", "seed", "train", "s"]
    assert "  worst  " in text and "n/a" in text  # no FGSM/APGD numbers here
    assert text.count("2, collapsed") == 2  # seed 1's verdict, fgsm_rs and pgd
    assert bench.parse_method("pgd") == ("pgd", ["attack.method=pgd"], None)
    spec = "pgd_at:attack.method=pgd; attack.steps=10"
    assert bench.parse_method(spec) == (
        "pgd_at",
        ["attack.method=pgd", "attack.steps=10"],
        None,
    )
    spec = "ref@recipes/mnist_fgsm_rs.yaml:train.epochs=2"
    assert bench.parse_method(spec) == (
        "ref",
        ["train.epochs=2"],
        Path("recipes/mnist_fgsm_rs.yaml"),
    )
    assert bench.parse_seeds("0,1,2") == [0, 1, 2]


@pytest.mark.slow
def test_bench_quick_mode_runs_on_real_mnist(tmp_path):
    """The benchmark's --quick mode end to end, smaller still (`--set`
    reaches every row: 1,024 training and 80 test images). The real MNIST
    must be there: a missing dataset is a failure."""
    data = ROOT.parent / "shared" / "data" / "mnist"
    found = sorted(p.name for p in data.glob("*-ubyte*"))
    assert len(found) == 4, f"MNIST IDX files expected in {data}. Received: {found}"
    out = tmp_path / "bench"
    fast = ROOT / "advtrain" / "recipes" / "mnist_fast.yaml"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--seeds", "0", "--output", str(out),
         "--recipe", str(fast),
         "--set", "data.limit_train=1024", "--set", "eval.max_examples=80",
         "--set", "eval.sanity_examples=16"],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    # Another recipe's default: the shipped mnist_fgsm_rs as the time
    # reference (FGSM and PGD only), and the recipe.
    reference, row = summary["rows"]
    assert (reference["method"], row["method"]) == ("fgsm_rs", "mnist_fast")
    assert reference["autoattack_square_accuracy"] is None
    assert row["seed"] == 0
    assert row["time_ratio"] == pytest.approx(
        row["train_seconds"] / reference["train_seconds"]
    )
    cascade = [f"autoattack_{a}_accuracy" for a in ("apgd_ce", "apgd_t", "square")]
    # The cascade only removes examples: each column at most the one before.
    columns = [row[k] for k in ("clean_accuracy", "pgd_accuracy", *cascade)]
    assert columns == sorted(columns, reverse=True) and columns[0] > 0.5
    assert row["robust_accuracy"] == row[cascade[-1]]
    assert "80 test images" in summary["title"]
    assert "AutoAttack (APGD-CE, APGD-T, Square), cheap budget" in summary["title"]
    assert row["gradient_free_only"] >= 0 and len(row["robust_accuracy_ci95"]) == 2
    metrics = json.loads((out / "mnist_fast-seed0" / "metrics.json").read_text())
    assert metrics["examples"] == 80
    assert metrics["autoattack"]["steps"][-1]["settings"]["queries"] == 100
    assert "| method | seed |" in (out / "table.md").read_text()
    assert "guard events" in proc.stdout and "Square-only" in proc.stdout


@pytest.mark.parametrize(
    ("keywords", "error", "message"),
    [
        (
            {"pgd_stpes": 3},
            TypeError,
            "evaluate got an unknown keyword argument 'pgd_stpes'. Did you mean "
            "'pgd_steps'?",
        ),
        (
            {"attacks": ["pgd", "sqaure"]},
            ArgumentError,
            "attacks: unknown attack 'sqaure'. Did you mean 'square'?",
        ),
    ],
)
def test_evaluate_refuses_what_it_does_not_know(
    trained_dense, keywords, error, message
):
    # Refused before any attack runs: a typo is never an evaluation that
    # silently used the default.
    x = np.zeros((4, 8, 8, 1), np.float32)
    with pytest.raises(error) as info:
        evaluate(trained_dense, (x, np.zeros(4, int)), eps=0.1, **keywords)
    assert str(info.value).startswith(message)


def test_an_attack_records_only_its_own_settings():
    # What eval-metrics.json shows for Square: no steps, no random start.
    config = Attack("square", eps=0.1, queries=100).get_config()
    assert set(config) == {
        "method", "backend", "eps", "norm", "clip_min", "clip_max",
        "queries", "restarts", "p_init", "rescale_schedule",
    }  # fmt: skip
    assert "steps" not in repr(Attack("square", eps=0.1))
