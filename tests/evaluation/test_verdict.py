"""One verdict per run, from the guard's summary, the evaluation and the
sanity checks: each rule, on the figures measured for it."""

import pytest

from advtrain.evaluation.sanity import masking_threshold
from advtrain.evaluation.verdict import (
    CATASTROPHIC_OVERFITTING,
    EVALUATION_UNRELIABLE,
    EXIT_CODES,
    SOUND,
    run_verdict,
    significant_count,
    verdict_exit_code,
    verdict_line,
    verdict_metrics,
)
from advtrain.train.guards import COLLAPSED_EXIT_CODE

ENSEMBLE = "AutoAttack (APGD-CE, APGD-T, FAB-T, Square), standard budget"


def _evaluation(fgsm=0.955, pgd=0.889, free_only=29, n=1000, ensemble=ENSEMBLE):
    # Defaults: the shipped mnist_fgsm_rs, seed 2 (docs/results.md): the
    # healthy run with the most Square-only breaks (2.9%).
    return {
        "examples": n,
        "fgsm_accuracy": fgsm,
        "pgd_accuracy": pgd,
        "gradient_free_only": free_only,
        "robust_accuracy_ensemble": ensemble,
    }


def _check(name, passed, detail="d"):
    return {"name": name, "passed": passed, "detail": detail}


def test_exit_codes_are_documented_ones():
    assert EXIT_CODES == {
        SOUND: 0,
        CATASTROPHIC_OVERFITTING: 3,
        EVALUATION_UNRELIABLE: 4,
    }
    assert EXIT_CODES[CATASTROPHIC_OVERFITTING] == COLLAPSED_EXIT_CODE
    assert verdict_exit_code(None) == 0


def test_a_healthy_run_is_sound_though_its_masking_check_fires():
    # The shipped recipes fail the strict masking check (1-3% Square-only)
    # and PGD's convergence checks by a few points.
    checks = [
        _check(
            "more_steps_do_not_help_model", False, "PGD-100x10 85.0% vs PGD-50x10 89.0%"
        ),
        _check(
            "more_restarts_do_not_help_model",
            False,
            "PGD-50x20 86.5% vs PGD-50x10 89.0%",
        ),
        _check("gradient_free_not_stronger", False),
    ]
    verdict = run_verdict({"unsound": None}, _evaluation(), checks)
    assert verdict == {"kind": SOUND, "reasons": []}
    assert verdict_line(verdict) == "sound"
    assert 29 >= masking_threshold(1000)  # the strict check does fire


def test_the_guard_calling_a_run_unsound_is_catastrophic_overfitting():
    message = "catastrophic overfitting: no epoch the guard could keep was sound"
    verdict = run_verdict({"unsound": {"message": message}}, _evaluation(), [])
    assert verdict["kind"] == CATASTROPHIC_OVERFITTING
    assert verdict_exit_code(verdict) == 3
    assert verdict_line(verdict) == message  # the guard's own line
    assert (
        verdict_metrics({"unsound": {"message": message}}, _evaluation(), [])[
            "catastrophic_overfitting"
        ]
        == message
    )


def test_fgsm_far_above_pgd_is_the_collapse_without_a_guard():
    # Healthy shipped runs: FGSM at most 7.6 points above PGD-50x10.
    assert run_verdict(None, _evaluation(fgsm=0.96, pgd=0.884))["kind"] == SOUND
    verdict = run_verdict(None, _evaluation(fgsm=0.95, pgd=0.337))
    assert verdict["kind"] == CATASTROPHIC_OVERFITTING
    assert "61.3 points above PGD's 33.7%" in verdict["reasons"][0]


@pytest.mark.parametrize("n", [300, 1000])
def test_square_breaking_clearly_more_than_healthy_runs_is_masking(n):
    limit = significant_count(n, 0.03)
    assert 0.03 * n < limit <= 0.05 * n
    below = run_verdict(None, _evaluation(free_only=limit - 1, n=n))
    assert below["kind"] == SOUND
    verdict = run_verdict(None, _evaluation(free_only=limit, n=n))
    assert verdict["kind"] == EVALUATION_UNRELIABLE
    assert verdict_exit_code(verdict) == 4
    assert verdict["reasons"][0].startswith("gradient masking: Square broke")


def _steps(pgd, doubled):
    # The sanity check's own detail, which `overstatement` reads back.
    detail = f"PGD-100x10 {100 * doubled:.1f}% vs PGD-50x10 {100 * pgd:.1f}%: x"
    return _check("more_steps_do_not_help_model", doubled >= pgd - 0.02, detail)


def test_pgd_far_from_converged_is_unreliable_with_autoattack_or_not():
    # FGSM-RS with a step of 0.6 (2026-12-07, seed 0, 300 images): PGD-100
    # 18 points under PGD-50, worst case 29 points under PGD. The shipped
    # mnist_fgsm_rs: 1.5-4 points, the check fails, the verdict stays sound.
    for evaluation in (_evaluation(), _evaluation(ensemble=None)):
        assert run_verdict(None, evaluation, [_steps(0.89, 0.85)])["kind"] == SOUND
        verdict = run_verdict(None, evaluation, [_steps(0.68, 0.50)])
        assert verdict["kind"] == EVALUATION_UNRELIABLE
        assert verdict["reasons"] == [
            "not converged: twice PGD's steps lower its accuracy by 18.0 points "
            "(limit 10; healthy runs: at most 4): PGD-100x10 50.0% vs "
            "PGD-50x10 68.0%: x"
        ]
    # One image of 32 (a tiny test run) is noise, in either direction.
    assert run_verdict(None, _evaluation(), [_steps(0.031, 0.062)])["kind"] == SOUND
    assert run_verdict(None, _evaluation(), [_steps(0.062, 0.031)])["kind"] == SOUND


def test_pgd_clearly_above_fgsm_is_masking():
    def versus(pgd, fgsm):
        detail = f"PGD-1x1 {100 * pgd:.1f}% vs FGSM {100 * fgsm:.1f}% (eps=0.3 inf)"
        return [_check("pgd_not_above_fgsm", pgd <= fgsm + 0.02, detail)]

    assert run_verdict(None, _evaluation(), versus(0.66, 0.60))["kind"] == SOUND
    verdict = run_verdict(None, _evaluation(), versus(0.812, 0.016))
    assert verdict["kind"] == EVALUATION_UNRELIABLE
    assert verdict["reasons"][0].startswith(
        "gradient masking: PGD's accuracy is 79.6 points above FGSM's (limit 10"
    )


@pytest.mark.parametrize("name", ["input_gradients_nonzero", "large_eps_breaks_model"])
def test_a_check_that_the_attacks_work_failing_is_unreliable(name):
    verdict = run_verdict(None, _evaluation(), [_check(name, False)])
    assert verdict["kind"] == EVALUATION_UNRELIABLE
    line = verdict_line(verdict)
    assert line.startswith(f"evaluation unreliable: sanity check {name} failed")


def test_catastrophic_overfitting_outranks_and_keeps_the_other_reasons():
    verdict = run_verdict(
        {"unsound": {"message": "catastrophic overfitting: x"}},
        _evaluation(free_only=200),
    )
    assert verdict["kind"] == CATASTROPHIC_OVERFITTING
    assert verdict["reasons"][0] == "x"
    assert verdict["reasons"][1].startswith("gradient masking")
