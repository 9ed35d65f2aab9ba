"""Gradient-masking checks: an honest model passes, a masked one fails."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from advtrain.evaluation.sanity import format_sanity_checks, run_sanity_checks

NAMES = [
    "pgd_not_above_fgsm",
    "large_eps_breaks_model",
    "more_steps_do_not_help_model",
    "more_restarts_do_not_help_model",
    "input_gradients_nonzero",
]
EVAL = dict(pgd_steps=5, pgd_restarts=1, batch_size=128)


def _batches(digits):
    x, y = digits[0][1500:], digits[1][1500:]
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(100)


def test_undefended_model_passes_the_checks(trained_dense, digits):
    checks = run_sanity_checks(
        trained_dense, _batches(digits), **EVAL, default_eps=0.1, max_examples=128
    )
    assert [c["name"] for c in checks] == NAMES
    by_name = {c["name"]: c for c in checks}
    for name in (
        "pgd_not_above_fgsm",
        "large_eps_breaks_model",
        "input_gradients_nonzero",
    ):
        assert by_name[name]["passed"], by_name[name]
    assert "128 examples" in by_name["pgd_not_above_fgsm"]["detail"]
    assert "eps=0.5" in by_name["large_eps_breaks_model"]["detail"]
    text = format_sanity_checks(checks)
    assert text.splitlines()[0].startswith("sanity checks: ")
    assert "[PASS] large_eps_breaks_model" in text


def test_saturated_logits_are_flagged(trained_dense, digits):
    # Scaling the logits saturates the softmax: the cross-entropy gradient
    # is exactly zero for confident examples, the classic masked model.
    inputs = keras.Input((8, 8, 1))
    masked = keras.Model(inputs, trained_dense(inputs) * 1e4)
    checks = run_sanity_checks(
        masked, _batches(digits), **EVAL, default_eps=0.1, max_examples=128
    )
    by_name = {c["name"]: c for c in checks}
    assert not by_name["input_gradients_nonzero"]["passed"]
    text = format_sanity_checks(checks)
    assert "[FAIL] input_gradients_nonzero" in text
    assert "overestimate" in text


def test_l2_uses_a_ball_that_holds_the_linf_one(trained_dense, digits):
    checks = run_sanity_checks(
        trained_dense,
        _batches(digits),
        pgd_steps=2,
        norm="2",
        batch_size=128,
        default_eps=0.5,
        max_examples=64,
    )
    detail = {c["name"]: c for c in checks}["large_eps_breaks_model"]["detail"]
    assert "eps=4 2" in detail  # 0.5 * sqrt(64)


def test_a_difference_of_exactly_the_tolerance_passes():
    from advtrain.evaluation.sanity import steps_verdict

    # 0.85 - 0.83 is 0.020000000000000018 in binary: still "within".
    assert steps_verdict(0.83, 0.85, 0.02) == (True, "within tolerance")
    assert steps_verdict(0.87, 0.85, 0.02) == (True, "within tolerance")
    passed, verdict = steps_verdict(0.825, 0.85, 0.02, "PGD-50x10")
    assert not passed and verdict.startswith("PGD-50x10 has not converged")
    passed, verdict = steps_verdict(0.875, 0.85, 0.02)
    assert not passed and "more steps helped" in verdict


def test_overstatement_reads_back_the_accuracies_the_checks_compare():
    from advtrain.evaluation.sanity import _checks
    from advtrain.evaluation.verdict import overstatement

    n = 200
    hit = {
        "fgsm": np.arange(n) < 120,  # 60%
        "pgd": np.arange(n) < 136,  # 68%
        "pgd_2x_steps": np.arange(n) < 100,  # 50%
        "pgd_more_restarts": np.arange(n) < 130,  # with pgd: 65%
        "large_eps": np.zeros(n, bool),
    }
    limits = dict(tolerance=0.02, large_eps_max_accuracy=0.05)
    checks = _checks(
        hit, 0.0, 50, 10, 0.5, "inf", "w", **limits, max_zero_gradient_fraction=0.01
    )
    found = {c["name"]: overstatement(c) for c in checks}
    assert found == {
        "pgd_not_above_fgsm": pytest.approx(0.08),
        "large_eps_breaks_model": None,
        "more_steps_do_not_help_model": pytest.approx(0.18),
        "more_restarts_do_not_help_model": pytest.approx(0.03),
        "input_gradients_nonzero": None,
    }
    assert all(set(c) == {"name", "passed", "detail"} for c in checks)
