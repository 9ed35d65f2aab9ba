"""Sanity checks that flag gradient masking in a robustness evaluation.

Models that mask their gradients (catastrophic overfitting after FGSM
training is the common case) look robust to gradient attacks without being
so. The checks follow Athalye, Carlini and Wagner (2018) and Croce and
Hein (2020), on one seeded random subset of the test split:
`pgd_not_above_fgsm`, `large_eps_breaks_model` (eps 0.5 L-inf: every image
can be moved to mid-gray), `more_steps_do_not_help_model`,
`more_restarts_do_not_help_model`, `input_gradients_nonzero`; and, from an
evaluation that ran Square, `gradient_free_not_stronger` (`masking_check`).

Example:

```python
checks = run_sanity_checks(model, test_ds, default_eps=0.1, pgd_steps=20)
print(format_sanity_checks(checks))
```
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Optional

import keras
import numpy as np

from advtrain.attacks import Attack
from advtrain.attacks.common import input_gradient
from advtrain.evaluation.robustness import (
    AttackRunner,
    compile_on,
    evaluation_attacks,
    seeded_subset,
    signature,
    strategy_scope,
)
from advtrain.evaluation.verdict import significant_count
from advtrain.utils.progress import Progress

DEFAULT_EXAMPLES = 500
LARGE_EPS = 0.5
LARGE_EPS_STEPS = 10


# Accuracies are multiples of 1/n: a difference of exactly `tolerance` must
# pass whatever the float rounding (0.85 - 0.83 > 0.02 in binary).
_ROUNDING = 1e-9


def steps_verdict(
    doubled: float, pgd: float, tolerance: float, shape: str = "PGD"
) -> tuple[bool, str]:
    """Whether twice the PGD steps changed the accuracy by more than
    `tolerance`, and what that means."""
    tol = tolerance + _ROUNDING
    if doubled > pgd + tol:
        return False, "more steps helped the model: unreliable gradients"
    if doubled < pgd - tol:
        return False, f"{shape} has not converged: it overstates robustness"
    return True, "within tolerance"


def _check(name: str, passed: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "passed": bool(passed), "detail": detail}


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def run_sanity_checks(
    model: keras.Model,
    batches: Iterable,
    *,
    default_eps: float,
    eps: Optional[float] = None,
    norm: str = "inf",
    pgd_steps: int = 20,
    pgd_step_size: Optional[float] = None,
    pgd_restarts: int = 1,
    seed: int = 0,
    batch_size: int = 256,
    max_examples: Optional[int] = None,
    tolerance: float = 0.02,
    large_eps_max_accuracy: float = 0.05,
    max_zero_gradient_fraction: float = 0.01,
    strategy: Optional[Any] = None,
) -> list[dict[str, Any]]:
    """Runs the gradient-masking checks on a seeded subset of `batches`.

    The base attack is the evaluation's PGD (`pgd_steps`, at least 1;
    `pgd_step_size`; `pgd_restarts`) at `eps` (or `default_eps`) in
    `norm`: `evaluate`'s arguments of the same names.

    Args:
        model: maps [0, 1] pixels to logits.
        batches: `(x, y)` batches of the test split.
        default_eps: eps when `eps` is None.
        seed: seed of the subset and of the random starts; with the
            evaluation's seed the subset is part of the one
            `evaluate_robustness` drew.
        batch_size: batch size the attacks run with.
        max_examples: size of the seeded random subset (default 500).
        tolerance: accuracy difference (absolute) allowed between an attack
            and its stronger variant before a check fails.
        large_eps_max_accuracy: accuracy allowed at eps 0.5.
        max_zero_gradient_fraction: share of all-zero input gradients
            allowed.
        strategy: TensorFlow: traced and run in this `tf.distribute`
            strategy's scope.

    Returns:
        A list of `{name, passed, detail}` dicts, JSON-ready (for the
        checks that compare two attacks,
        `advtrain.evaluation.verdict.overstatement` reads the accuracies
        back from `detail`).
    """
    x_all, y_all, _ = seeded_subset(batches, max_examples or DEFAULT_EXAMPLES, seed)
    if len(y_all) == 0:
        raise ValueError("Sanity checks got no examples: the test split is empty.")
    eps = default_eps if eps is None else eps
    steps = max(pgd_steps, 1)
    dims = int(np.prod(x_all.shape[1:]))
    # The L2 ball of radius 0.5 * sqrt(d) holds the L-inf ball of radius 0.5.
    large = LARGE_EPS if norm == "inf" else LARGE_EPS * math.sqrt(dims)
    attacks = _sanity_attacks(eps, norm, steps, pgd_step_size, pgd_restarts, large)
    with strategy_scope(strategy):
        hit, zero = _measure(model, x_all, y_all, attacks, seed, batch_size)
    limits = {
        "tolerance": tolerance,
        "large_eps_max_accuracy": large_eps_max_accuracy,
        "max_zero_gradient_fraction": max_zero_gradient_fraction,
    }
    where = f"eps={eps:g} {norm}, {len(y_all)} examples"
    return _checks(hit, zero, steps, pgd_restarts, large, norm, where, **limits)


def _sanity_attacks(eps, norm, steps, pgd_step_size, pgd_restarts, large) -> dict:
    """The evaluation's FGSM and PGD, PGD with twice the steps, PGD again
    (fresh starts), and PGD-10 at the large eps."""
    attacks = evaluation_attacks(
        default_eps=eps,
        norm=norm,
        attacks=["fgsm", "pgd"],
        pgd_steps=steps,
        pgd_step_size=pgd_step_size,
        pgd_restarts=pgd_restarts,
    )
    attacks["pgd_2x_steps"] = attacks["pgd"].replace(steps=2 * steps)
    attacks["pgd_more_restarts"] = attacks["pgd"]  # a second run: fresh starts
    attacks["large_eps"] = Attack(
        "pgd", eps=large, norm=norm, steps=LARGE_EPS_STEPS, restarts=1
    )
    return attacks


def _checks(
    hit: dict[str, np.ndarray],
    zero: float,
    steps: int,
    pgd_restarts: int,
    large: float,
    norm: str,
    where: str,
    *,
    tolerance: float,
    large_eps_max_accuracy: float,
    max_zero_gradient_fraction: float,
) -> list[dict[str, Any]]:
    """The five checks from which examples each attack left right (`hit`)
    and the share of all-zero input gradients (`zero`)."""
    acc = {name: float(np.mean(v)) for name, v in hit.items()}
    tol = tolerance + _ROUNDING
    both_runs = float(np.mean(hit["pgd"] & hit["pgd_more_restarts"]))
    shape, pgd = f"PGD-{steps}x{pgd_restarts}", f"{_pct(acc['pgd'])}"
    doubled = acc["pgd_2x_steps"]
    steps_passed, verdict = steps_verdict(doubled, acc["pgd"], tolerance, shape)
    restarts_passed = both_runs >= acc["pgd"] - tol
    return [
        _check(
            "pgd_not_above_fgsm",
            acc["pgd"] <= acc["fgsm"] + tol,
            f"{shape} {pgd} vs FGSM {_pct(acc['fgsm'])} ({where})",
        ),
        _check(
            "large_eps_breaks_model",
            acc["large_eps"] <= large_eps_max_accuracy,
            f"PGD-{LARGE_EPS_STEPS} at eps={large:g} {norm}: "
            f"{_pct(acc['large_eps'])} (must be <= {_pct(large_eps_max_accuracy)})",
        ),
        _check(
            "more_steps_do_not_help_model",
            steps_passed,
            f"PGD-{2 * steps}x{pgd_restarts} {_pct(doubled)} vs {shape} {pgd}: "
            f"{verdict}",
        ),
        _check(
            "more_restarts_do_not_help_model",
            restarts_passed,
            f"PGD-{steps}x{2 * pgd_restarts} (worst case kept) {_pct(both_runs)} "
            f"vs {shape} {pgd}"
            + (
                ""
                if restarts_passed
                else ": restarts keep finding adversarial examples (rough loss "
                "surface, or the evaluation needs more restarts)"
            ),
        ),
        _check(
            "input_gradients_nonzero",
            zero <= max_zero_gradient_fraction,
            f"{_pct(zero)} of examples have an all-zero input "
            f"gradient (must be <= {_pct(max_zero_gradient_fraction)})",
        ),
    ]


def _measure(model, x_all, y_all, attacks, seed: int, batch_size: int):
    """Per attack, which examples stay right; and the share of examples
    with an all-zero input gradient."""
    correct: dict[str, list[np.ndarray]] = {name: [] for name in attacks}
    zero: list[np.ndarray] = []
    runner = AttackRunner(model, seed)
    y_all = y_all.astype(np.int32)

    def zero_gradient(x, y):
        grad = input_gradient(lambda z: model(z, training=False), x, y)
        flat = keras.ops.reshape(keras.ops.abs(grad), (keras.ops.shape(grad)[0], -1))
        return keras.ops.equal(keras.ops.max(flat, axis=1), 0.0)

    zero_fn = compile_on(model, zero_gradient, signature(x_all, y_all))
    starts = range(0, len(y_all), batch_size)
    bar = Progress("sanity checks", len(starts) * len(attacks), unit="attacks")
    for i, start in enumerate(starts):
        x = x_all[start : start + batch_size]
        y = y_all[start : start + batch_size]
        for j, (name, attack) in enumerate(attacks.items(), 1):
            correct[name].append(runner(attack, x, y) == y)
            bar.update(i * len(attacks) + j, name)
        zero.append(keras.ops.convert_to_numpy(zero_fn(x, y)))
    bar.close()
    hit = {name: np.concatenate(parts) for name, parts in correct.items()}
    return hit, float(np.mean(np.concatenate(zero)))


# Under no masking, a gradient-free attack run after APGD-CE and APGD-T
# still breaks a few examples the gradient attacks missed (AutoAttack's
# own tables: Square adds about 0 to 0.3 points on well-behaved models).
# The check fires when its share is significantly above this rate.
MASKING_BASE_RATE = 0.005
MASKING_SIGNIFICANCE = 0.05


def masking_threshold(n: int) -> int:
    """The fewest gradient-free-only breaks among `n` examples that are
    significantly above `MASKING_BASE_RATE` (one-sided binomial test)."""
    return significant_count(n, MASKING_BASE_RATE, MASKING_SIGNIFICANCE)


def masking_check(evaluation: dict[str, Any]) -> Optional[dict[str, Any]]:
    """Flags gradient masking from an evaluation that ran a gradient-free
    attack: the examples only it broke (`gradient_free_only`, out of
    `examples`) against the count expected without masking, a tolerance
    that follows from the sample size (`masking_threshold`). None when no
    gradient-free attack ran."""
    if "gradient_free_only" not in evaluation:
        return None
    n, k = int(evaluation["examples"]), int(evaluation["gradient_free_only"])
    limit = masking_threshold(n)
    passed = k < limit
    detail = (
        f"Square broke {k} of {n} examples ({_pct(k / n)}) that every "
        f"gradient attack left standing (masking if >= {limit}, "
        f"{_pct(limit / n)})"
    )
    if not passed:
        detail += (
            ": the gradients mislead the gradient attacks (gradient masking). "
            "Quote the worst case, not PGD; train with a stronger or multi-step "
            "attack (PGD or TRADES), a longer eps ramp, or "
            "GradAlign"
        )
    return _check("gradient_free_not_stronger", passed, detail)


def format_sanity_checks(checks: list[dict[str, Any]]) -> str:
    """Human-readable lines: a count, then one PASS/FAIL line per check."""
    passed = sum(c["passed"] for c in checks)
    lines = [f"sanity checks: {passed}/{len(checks)} passed"]
    for c in checks:
        mark = "PASS" if c["passed"] else "FAIL"
        lines.append(f"  [{mark}] {c['name']}: {c['detail']}")
    if passed < len(checks):
        lines.append(
            "  a failed check means the robust accuracy above may be an "
            "overestimate (gradient masking); see advtrain.evaluation.sanity"
        )
    return "\n".join(lines)
