"""One verdict per run: whether its robustness figure can be trusted.

`run_verdict` is a pure function of what the catastrophic-overfitting
guard saw (its `summary()`), the evaluation's result (`evaluate`) and the
gradient-masking sanity checks (`run_sanity_checks`, `masking_check`).
It says one of:

- `sound`: nothing below fired; the headline is the figure to quote.
- `catastrophic_overfitting`: no epoch the guard could keep was sound, or
  the evaluation shows the collapse's signature (FGSM accuracy far above
  PGD's: the model beats the single-step attack only).
- `evaluation_unreliable`: the headline may overstate robustness: the
  gradient-free attack breaks clearly more than healthy runs show, or PGD
  does clearly worse than FGSM (gradient masking); the input gradients
  vanish, or eps 0.5 does not break the model; or twice PGD's steps or
  restarts find clearly more (far from converged).

A run exits with `EXIT_CODES[kind]`: 0, 3 and 4. The thresholds are set
from measured healthy and broken runs: docs/robustness.md, "The run's
verdict".

Example:

```python
verdict = run_verdict(guard.summary(), evaluation, checks)
if verdict["kind"] != SOUND:
    print(verdict_line(verdict))
```
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional

SOUND = "sound"
CATASTROPHIC_OVERFITTING = "catastrophic_overfitting"
EVALUATION_UNRELIABLE = "evaluation_unreliable"
KINDS = (SOUND, CATASTROPHIC_OVERFITTING, EVALUATION_UNRELIABLE)

# The command line's exit code per kind.
EXIT_CODES = {SOUND: 0, CATASTROPHIC_OVERFITTING: 3, EVALUATION_UNRELIABLE: 4}

# FGSM accuracy above PGD's on the test images. The healthy MNIST runs
# measured show at most 8.2 points (docs/results.md); a model that collapsed beats
# FGSM and loses to PGD by tens of points.
MAX_FGSM_ABOVE_PGD = 0.3

# The share of images only the gradient-free attack broke, in the healthy
# MNIST runs measured: at most 3.0% (mnist_fast and mnist_fgsm_rs, 1,000
# images; mnist_pgd 2.7% on all 10,000). The verdict calls it masking when
# a run's share is significantly above that (one-sided binomial test), not
# when it is above `sanity.MASKING_BASE_RATE` (what the sanity check flags).
HEALTHY_GRADIENT_FREE_RATE = 0.03
SIGNIFICANCE = 0.05

# How far a sanity check comparing two attacks may say PGD overstates
# robustness (`sanity.overstatement`: PGD above FGSM, or twice its steps or
# restarts lower) before the evaluation counts as unreliable, AutoAttack in
# the headline or not. The shipped mnist_fgsm_rs: PGD-100 1.5-4 points
# under PGD-50 (docs/results.md), 20 restarts 2.5 points under 10 once;
# FGSM-RS with a step of 0.6, whose worst case is 29-42 points under PGD:
# 18 and 19 points. Smaller failures are the checks' business, not the
# verdict's: on a small subset they are a few images.
CLEAR_OVERSTATEMENT = 0.1

# Sanity checks whose failure alone means the gradient attacks do not work.
_BROKEN_ATTACK_CHECKS = ("input_gradients_nonzero", "large_eps_breaks_model")

# Per comparison: what its overstatement means, and the healthy runs'.
_COMPARED = {
    "pgd_not_above_fgsm": (
        "gradient masking: PGD's accuracy is {} points above FGSM's",
        "healthy runs: 3 to 8 points below",
    ),
    "more_steps_do_not_help_model": (
        "not converged: twice PGD's steps lower its accuracy by {} points",
        "healthy runs: at most 4",
    ),
    "more_restarts_do_not_help_model": (
        "not converged: twice PGD's restarts lower its accuracy by {} points",
        "healthy runs: at most 2.5",
    ),
}

_LABELS = {
    CATASTROPHIC_OVERFITTING: "catastrophic overfitting",
    EVALUATION_UNRELIABLE: "evaluation unreliable",
}


def significant_count(n: int, base_rate: float, significance: float = 0.05) -> int:
    """The fewest events among `n` trials significantly above `base_rate`
    (one-sided binomial test at `significance`)."""
    from scipy.stats import binom

    k = 1
    while binom.sf(k - 1, n, base_rate) >= significance:
        k += 1
    return k


# The checks that compare two attacks: their details (`sanity._checks`) give the
# two accuracies first, and whether the first is the headline's PGD (+1)
# or its stronger variant (-1).
_SIGNS = {
    "pgd_not_above_fgsm": 1,
    "more_steps_do_not_help_model": -1,
    "more_restarts_do_not_help_model": -1,
}


def overstatement(check: dict[str, Any]) -> Optional[float]:
    """By how much a check comparing two attacks says PGD's accuracy
    overstates robustness (PGD's minus FGSM's, or minus PGD's with twice the
    steps or restarts; negative when PGD was the stronger); None for the
    other checks."""
    sign = _SIGNS.get(check["name"])
    found = re.findall(r"(\d+(?:\.\d+)?)%", check["detail"])
    if sign is None or len(found) < 2:
        return None
    first, second = (float(value) / 100 for value in found[:2])
    return round(sign * (first - second), 6)


def run_verdict(
    guard: Optional[Mapping[str, Any]] = None,
    evaluation: Optional[Mapping[str, Any]] = None,
    checks: Optional[Sequence[Mapping[str, Any]]] = None,
) -> dict[str, Any]:
    """The run's verdict: `{"kind": ..., "reasons": [...]}`, JSON-ready.

    Args:
        guard: the catastrophic-overfitting guard's `summary()` (a run's
            `co_guard` record), or None without a guard.
        evaluation: `advtrain.evaluate`'s result, or None.
        checks: the sanity checks (`{name, passed, detail}` dicts).

    Returns:
        `kind` (one of `KINDS`; catastrophic overfitting outranks an
        unreliable evaluation) and `reasons`, one sentence each (empty
        when sound).
    """
    collapsed = _collapse_reasons(guard or {}, evaluation or {})
    unreliable = _unreliable_reasons(evaluation or {}, checks or [])
    if collapsed:
        return {"kind": CATASTROPHIC_OVERFITTING, "reasons": collapsed + unreliable}
    if unreliable:
        return {"kind": EVALUATION_UNRELIABLE, "reasons": unreliable}
    return {"kind": SOUND, "reasons": []}


def verdict_exit_code(verdict: Optional[Mapping[str, Any]]) -> int:
    """The command line's exit code for `verdict` (0 when None)."""
    return EXIT_CODES[verdict["kind"]] if verdict else 0


def verdict_line(verdict: Mapping[str, Any]) -> str:
    """One line: "sound", or the kind in words and its reasons."""
    if verdict["kind"] == SOUND:
        return "sound"
    return f"{_LABELS[verdict['kind']]}: " + "; ".join(verdict["reasons"])


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _collapse_reasons(guard: Mapping[str, Any], evaluation: Mapping[str, Any]) -> list:
    reasons = []
    unsound = guard.get("unsound")
    if unsound:
        reasons.append(unsound["message"].removeprefix("catastrophic overfitting: "))
    fgsm, pgd = evaluation.get("fgsm_accuracy"), evaluation.get("pgd_accuracy")
    if fgsm is not None and pgd is not None and fgsm - pgd > MAX_FGSM_ABOVE_PGD:
        reasons.append(
            f"FGSM accuracy {_pct(fgsm)} is {100 * (fgsm - pgd):.1f} points above "
            f"PGD's {_pct(pgd)} on the test images (limit "
            f"{100 * MAX_FGSM_ABOVE_PGD:g}): the model beats the single-step "
            "attack only"
        )
    return reasons


def _unreliable_reasons(
    evaluation: Mapping[str, Any], checks: Sequence[Mapping[str, Any]]
) -> list:
    reasons = []
    masked = evaluation.get("gradient_free_only")
    n = int(evaluation.get("examples") or 0)
    if masked is not None and n:
        limit = significant_count(n, HEALTHY_GRADIENT_FREE_RATE, SIGNIFICANCE)
        if masked >= limit:
            reasons.append(
                f"gradient masking: Square broke {masked} of {n} images "
                f"({_pct(masked / n)}) that every gradient attack left standing "
                f"(healthy runs: up to {_pct(HEALTHY_GRADIENT_FREE_RATE)}; "
                f"limit {limit})"
            )
    for check in checks:
        if check["passed"]:
            continue
        if check["name"] in _BROKEN_ATTACK_CHECKS:
            reasons.append(f"sanity check {check['name']} failed: {check['detail']}")
            continue
        over = overstatement(check)
        if over is not None and over > CLEAR_OVERSTATEMENT + 1e-9:
            what, healthy = _COMPARED[check["name"]]
            what = what.format(f"{100 * over:.1f}")
            limit = f"limit {100 * CLEAR_OVERSTATEMENT:g}"
            reasons.append(f"{what} ({limit}; {healthy}): {check['detail']}")
    return reasons


def verdict_metrics(
    guard: Optional[Mapping[str, Any]],
    evaluation: Optional[Mapping[str, Any]],
    checks: Optional[Sequence[Mapping[str, Any]]],
) -> dict[str, Any]:
    """A run's `verdict` (`run_verdict`) and `catastrophic_overfitting` (its
    line when that is the kind, else None), as a run records them."""
    verdict = run_verdict(guard, evaluation, checks)
    collapsed = verdict["kind"] == CATASTROPHIC_OVERFITTING
    return {
        "verdict": verdict,
        "catastrophic_overfitting": verdict_line(verdict) if collapsed else None,
    }
