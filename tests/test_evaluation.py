"""Robust evaluation numbers and the eps-sweep plot."""

import numpy as np
import pytest
import tensorflow as tf

from advtrain.config import EvalConfig
from advtrain.evaluation import (
    evaluate_robustness,
    macro_f1,
    per_class_accuracy,
    plot_eps_sweep,
)


def _batches(x, y, size=100):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(size)


def test_macro_f1_matches_hand_computation():
    labels = np.array([0, 0, 1, 1, 2])
    preds = np.array([0, 1, 1, 1, 0])
    # class 0: tp1 fp1 fn1 -> 0.5; class 1: tp2 fp1 fn0 -> 0.8; class 2: 0
    assert macro_f1(labels, preds, 3) == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    assert macro_f1(labels, labels, 3) == 1.0
    assert per_class_accuracy(labels, preds, 4) == [0.5, 1.0, 0.0, None]


def test_evaluation_orders_clean_fgsm_pgd(trained_dense, digits):
    x, y = digits[0][1500:1700], digits[1][1500:1700]
    cfg = EvalConfig(pgd_steps=10, pgd_restarts=2, eps_sweep=[0.0, 0.1, 0.5])
    result = evaluate_robustness(
        trained_dense, _batches(x, y), cfg, default_eps=0.1, num_classes=10
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
    cfg = EvalConfig(pgd_steps=1, fgsm=False, max_examples=150)
    result = evaluate_robustness(
        trained_dense, _batches(x, y, 64), cfg, default_eps=0.1, num_classes=10
    )
    assert result["examples"] == 150
    assert "fgsm_accuracy" not in result


def test_empty_test_split_is_an_error(trained_dense):
    empty = _batches(np.zeros((0, 8, 8, 1), "float32"), np.zeros((0,), "int64"))
    with pytest.raises(ValueError, match="no examples"):
        evaluate_robustness(
            trained_dense, empty, EvalConfig(), default_eps=0.1, num_classes=10
        )


def test_plot_is_a_png(tmp_path):
    path = plot_eps_sweep(
        [{"eps": 0.0, "accuracy": 0.9}, {"eps": 0.1, "accuracy": 0.5}],
        tmp_path / "s.png",
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp*"))


def test_max_examples_is_a_seeded_random_subset(trained_dense, digits):
    from advtrain.evaluation import seeded_subset

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

    cfg = EvalConfig(pgd_steps=2, fgsm=False, max_examples=50, seed=3)
    result = evaluate_robustness(
        trained_dense, _batches(x, y, 64), cfg, default_eps=0.1, num_classes=10
    )
    assert result["subset_of"] == 300 and result["subset_seed"] == 3
    assert sum(result["class_support"]) == 50
    assert np.bincount(ya, minlength=10).tolist() == result["class_support"]
    assert len(result["pgd_per_class_accuracy"]) == 10
