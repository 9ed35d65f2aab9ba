"""How a robustness result reads in one line: `robustness_headline`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

ATTACK_LABELS = {
    "fgsm": "FGSM accuracy",
    "pgd": "PGD accuracy",
    "apgd_ce": "APGD-CE accuracy",
    "apgd_dlr": "APGD-DLR accuracy (targeted)",
    "fab_t": "FAB-T accuracy (targeted)",
    "square": "Square accuracy (gradient-free)",
}

# AutoAttack's members, in cascade order, and their labels.
CASCADE_LABELS = {
    "apgd_ce": "APGD-CE",
    "apgd_t": "APGD-T",
    "fab_t": "FAB-T",
    "square": "Square",
}


def robustness_headline(metrics: Mapping[str, Any]) -> tuple[str, str]:
    """(label, value), e.g. ("robust accuracy (worst case over clean, FGSM,
    PGD, AutoAttack (...); eps=0.3 inf)", "84.70% (95% CI 82.3-86.8%, 1000
    examples)")."""
    over, value = headline_parts(metrics)
    return f"robust accuracy (worst case over {over})", value


def headline_parts(metrics: Mapping[str, Any]) -> tuple[str, str]:
    """(what the worst case is over, its value with the 95% interval)."""
    metrics = {  # results written before 0.3 named it differently
        "robust_accuracy": metrics.get("robust_accuracy_worst"),
        "robust_accuracy_over": metrics.get("robust_accuracy_worst_over"),
        **{k: v for k, v in metrics.items() if v is not None},
    }
    ensemble = metrics.get("robust_accuracy_ensemble")
    names = [
        ATTACK_LABELS.get(n, n).split()[0]
        for n in metrics.get("robust_accuracy_over") or ["clean"]
        if n not in CASCADE_LABELS or not ensemble
    ]
    over = ", ".join(names + ([ensemble] if ensemble else [])) + _threat(metrics)
    if not ensemble:
        over += "; no AutoAttack: may overstate robustness"
    low, high = metrics.get("robust_accuracy_ci95", (None, None))
    value = pct(metrics["robust_accuracy"])
    if low is not None:
        value += f" (95% CI {100 * low:.1f}-{100 * high:.1f}%"
        value += f", {metrics.get('examples', '?')} examples)"
    return over, value


def has_headline(metrics: Mapping[str, Any]) -> bool:
    return "robust_accuracy" in metrics or "robust_accuracy_worst" in metrics


def _threat(metrics: Mapping[str, Any]) -> str:
    """ ", eps=0.3 inf" from any attack's settings in `metrics`."""
    for key, value in metrics.items():
        if key.endswith("_attack") and isinstance(value, Mapping):
            return f"; eps={value.get('eps', 0):g} {value.get('norm', '')}"
    steps = (metrics.get("autoattack") or {}).get("steps") or []
    if steps:
        settings = steps[0]["settings"]
        return f"; eps={settings['eps']:g} {settings['norm']}"
    return ""


def pct(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}%"
