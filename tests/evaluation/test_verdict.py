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
    # and, with AutoAttack in the headline, PGD's convergence check.
    checks = [
        _check("more_steps_do_not_help_model", False),
        _check("more_restarts_do_not_help_model", False),
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


def test_unconverged_pgd_counts_only_when_pgd_is_the_headline():
    checks = [_check("more_steps_do_not_help_model", False, "not converged")]
    assert run_verdict(None, _evaluation(), checks)["kind"] == SOUND
    alone = _evaluation(ensemble=None)
    del alone["gradient_free_only"]
    verdict = run_verdict(None, alone, checks)
    assert verdict == {
        "kind": EVALUATION_UNRELIABLE,
        "reasons": ["sanity check more_steps_do_not_help_model failed: not converged"],
    }


@pytest.mark.parametrize(
    "name", ["input_gradients_nonzero", "large_eps_breaks_model", "pgd_not_above_fgsm"]
)
def test_a_check_that_the_attacks_work_failing_is_unreliable(name):
    verdict = run_verdict(None, _evaluation(), [_check(name, False)])
    assert verdict["kind"] == EVALUATION_UNRELIABLE
    assert verdict_line(verdict).startswith(
        f"evaluation unreliable: sanity check {name}"
    )


def test_catastrophic_overfitting_outranks_and_keeps_the_other_reasons():
    verdict = run_verdict(
        {"unsound": {"message": "catastrophic overfitting: x"}},
        _evaluation(free_only=200),
    )
    assert verdict["kind"] == CATASTROPHIC_OVERFITTING
    assert verdict["reasons"][0] == "x"
    assert verdict["reasons"][1].startswith("gradient masking")


def test_pgd_far_from_converged_is_unreliable_even_with_autoattack():
    # FGSM-RS with a step of 0.6 (2026-12-07, seed 0, 300 images): PGD-100
    # 18 points under PGD-50, worst case 29 points under PGD; the shipped
    # mnist_fgsm_rs: 1.5-4 points, which the headline's APGD covers.
    def steps(pgd, more):
        check = _check("more_steps_do_not_help_model", False, "PGD-100 vs PGD-50")
        return [{**check, "pgd_accuracy": pgd, "more_steps_accuracy": more}]

    assert run_verdict(None, _evaluation(), steps(0.89, 0.85))["kind"] == SOUND
    verdict = run_verdict(None, _evaluation(), steps(0.68, 0.50))
    assert verdict["kind"] == EVALUATION_UNRELIABLE
    assert verdict["reasons"] == [
        "not converged: twice PGD's steps lower its accuracy by 18.0 points "
        "(limit 10; healthy runs: at most 4): PGD-100 vs PGD-50"
    ]
