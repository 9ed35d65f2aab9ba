"""`write_report`: a run's `report.md` (Markdown) and its PNG figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from advtrain.evaluation.report import (
    ATTACK_LABELS,
    CASCADE_LABELS,
    has_headline,
    pct,
    robustness_headline,
)
from advtrain.utils.io import atomic_path, atomic_write_text

CURVES = (
    ("accuracy", "clean (train)"),
    ("adv_accuracy", "adversarial (train)"),
    ("val_accuracy", "clean (validation)"),
    ("co_guard_pgd_accuracy", "PGD (guard batch)"),
)

EXAMPLES_PNG = "adversarial_examples.png"


def _headline(metrics: Mapping[str, Any]) -> list[str]:
    rows = []
    if has_headline(metrics):
        label, value = robustness_headline(metrics)
        rows.append((f"**{label}**", f"**{value}**"))
    rows.append(("clean accuracy", pct(metrics.get("clean_accuracy"))))
    for key, label in ATTACK_LABELS.items():
        if f"{key}_accuracy" not in metrics:
            continue
        attack = metrics.get(f"{key}_attack", {})
        detail = f"eps={attack.get('eps', 0):g} norm={attack.get('norm', '?')}"
        if attack.get("method") in ("pgd", "apgd_ce", "apgd_dlr", "fab_t"):
            detail += f", {attack['steps']} steps x {attack['restarts']} restart(s)"
        if attack.get("method") == "square":
            detail += f", {attack['queries']} queries"
        if "targets" in attack:
            detail += f" x {attack['targets']} targets"
        rows.append((f"{label} ({detail})", pct(metrics[f"{key}_accuracy"])))
    for step in (metrics.get("autoattack") or {}).get("steps", []):
        name = CASCADE_LABELS.get(step["attack"], step["attack"])
        ran = f"ran on {step['attacked']}, broke {step['broken']}"
        after = pct(step["robust_accuracy_after"])
        rows.append((f"after AutoAttack's {name} ({ran})", after))
    for key, on in (("macro_f1", "clean"), ("pgd_macro_f1", "PGD")):
        if key in metrics:
            rows.append((f"macro F1 ({on})", f"{metrics[key]:.4f}"))
    examples = f"{metrics.get('examples', '?')}"
    if "subset_of" in metrics:
        examples += (
            f" (seeded random subset of {metrics['subset_of']}, "
            f"seed {metrics.get('subset_seed')})"
        )
    rows.append(("test examples", examples))
    lines = ["| metric | value |", "|---|---|"]
    lines += [f"| {label} | {value} |" for label, value in rows]
    return lines


def _sanity(checks: Sequence[Mapping[str, Any]]) -> list[str]:
    passed = sum(bool(c["passed"]) for c in checks)
    lines = [
        f"{passed} of {len(checks)} checks passed. A failed check means the "
        "robust accuracy may be overestimated (gradient masking).",
        "",
        "| check | result | detail |",
        "|---|---|---|",
    ]
    for c in checks:
        mark = "pass" if c["passed"] else "**FAIL**"
        lines.append(f"| {c['name']} | {mark} | {c['detail']} |")
    return lines


def _per_class(
    metrics: Mapping[str, Any], class_names: Optional[Sequence[str]]
) -> list[str]:
    clean = metrics.get("per_class_accuracy") or []
    robust = metrics.get("pgd_per_class_accuracy")
    support = metrics.get("class_support")
    header = "| class | examples | clean |" + (" PGD |" if robust else "")
    lines = [header, "|---|---|---|" + ("---|" if robust else "")]
    for c, value in enumerate(clean):
        name = str(c)
        if class_names and c < len(class_names) and class_names[c] != str(c):
            name = f"{c} ({class_names[c]})"
        count = support[c] if support and c < len(support) else "?"
        row = f"| {name} | {count} | {pct(value)} |"
        if robust:
            row += f" {pct(robust[c])} |"
        lines.append(row)
    return lines


def _timing(metrics: Mapping[str, Any]) -> list[str]:
    lines = []
    if "train_seconds" in metrics:
        lines.append(f"- training time: {metrics['train_seconds']} s")
    if "train_samples_per_second" in metrics:
        lines.append(
            f"- throughput: {metrics['train_samples_per_second']} samples/s "
            "(clean + adversarial example count as one)"
        )
    epochs = metrics.get("epoch_seconds") or []
    if epochs:
        mean = sum(epochs) / len(epochs)
        lines.append(
            f"- time per epoch: {mean:.2f} s on average "
            f"({', '.join(f'{s:g}' for s in epochs)})"
        )
    if "seconds" in metrics:
        lines.append(f"- evaluation: {metrics['seconds']} s")
    return lines


def _verdict(metrics: Mapping[str, Any]) -> list[str]:
    """The run's verdict under the headline: a warning unless sound."""
    from advtrain.evaluation.verdict import verdict_line

    verdict = metrics.get("verdict")
    if not verdict:  # a run folder written before the verdict
        collapse = metrics.get("catastrophic_overfitting")
        return [f"**Warning: {collapse}.**", ""] if collapse else []
    if verdict["kind"] == "sound":
        return ["Verdict: sound (no collapse; the evaluation's checks hold).", ""]
    return [f"**Warning: {verdict_line(verdict)}.**", ""]


def _guard(guard: Mapping[str, Any]) -> list[str]:
    if not guard.get("triggers"):
        return ["- no collapse detected"]
    lines = []
    for t in guard["triggers"]:
        pgd = pct(t["pgd_accuracy"])
        if t.get("reason") == "gap":
            what = f"training attack's accuracy {pct(t['attack_accuracy'])}, "
            what += f"PGD accuracy on the guard batch {pgd}"
        else:
            what = f"PGD accuracy on the guard batch fell to {pgd} from "
            what += pct(t["best_accuracy"])
        restored = t["best_epoch"]
        back = f"epoch {restored} restored" if restored else "nothing to restore"
        lines.append(f"- epoch {t['epoch']}: {what}; {back}; action: {t['action']}")
    if guard.get("unsound"):
        lines.append(f"- **{guard['unsound']['message']}**")
    return lines


def _curves(
    run_dir: Path, history: Mapping[str, Sequence[float]], plots: bool, title: str
) -> list[str]:
    """Draws training_curves.png (accuracy per epoch) when `plots` and the
    history has a curve; the section showing it and eps_sweep.png."""
    curves = [(key, label) for key, label in CURVES if plots and history.get(key)]
    if curves:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker  # noqa: F401  (matplotlib.ticker below)

        fig, ax = plt.subplots(figsize=(5.5, 3.5), dpi=120)
        for key, label in curves:
            values = list(history[key])
            ax.plot(range(1, len(values) + 1), values, marker="o", label=label)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set(xlabel="epoch", ylabel="accuracy", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
        if title:
            ax.set_title(title)
        fig.tight_layout()
        with atomic_path(run_dir / "training_curves.png") as tmp:
            fig.savefig(tmp, format="png")
        plt.close(fig)
    sweep_png = (run_dir / "eps_sweep.png").is_file()
    if not curves and not sweep_png:
        return []
    lines = ["## Curves", ""]
    if curves:
        lines += ["![training curves](training_curves.png)", ""]
    if sweep_png:
        lines += ["![accuracy against eps](eps_sweep.png)", ""]
    return lines


def _examples(
    run_dir: Path, examples, class_names: Optional[Sequence[str]], title: str
) -> list[str]:
    """Draws `adversarial_examples.png` and the section that shows it."""
    from advtrain.evaluation.examples import plot_examples

    plot_examples(examples, run_dir / EXAMPLES_PNG, class_names, title=title)
    broken = int(sum(~examples.robust))
    return [
        "## Adversarial examples",
        "",
        f"{len(examples)} test images drawn with the evaluation's seed "
        f"({broken} broken, {len(examples) - broken} robust). Per image: the "
        "clean image with its label; the worst-case adversarial image (the "
        "first attack that broke it, else the last attack's point) with the "
        "attack and the model's label there; the perturbation x_adv - x, "
        f"mapped from [-eps, eps] to [0, 1] (grey: unchanged; "
        f"eps={examples.eps:g} {examples.norm}).",
        "",
        f"![adversarial examples]({EXAMPLES_PNG})",
        "",
    ]


def write_report(
    run_dir: Union[str, Path],
    recipe: Mapping[str, Any],
    metrics: Mapping[str, Any],
    history: Mapping[str, Sequence[float]],
    class_names: Optional[Sequence[str]] = None,
    plots: bool = True,
    examples: Optional[Any] = None,
) -> Path:
    """Writes `report.md` into `run_dir`, and with `plots` its figures
    (`examples`: a few `AdversarialExamples` to draw); returns its path.
    `recipe` is the resolved recipe as a dict, `metrics` metrics.json's.

    Example:

    ```python
    result = run(recipe, "runs/demo")
    write_report(result.output_dir, recipe.to_dict(), result.metrics,
                 result.history)
    ```
    """
    run_dir = Path(run_dir)
    name = recipe.get("name", "")
    out = [f"# Run report: {name}", ""]
    if has_headline(metrics):
        label, value = robustness_headline(metrics)
        out += [f"**{label[0].upper()}{label[1:]}: {value}**", ""]
    out += _verdict(metrics)
    if recipe.get("description"):
        out += [recipe["description"], ""]
    out += ["## Results", ""] + _headline(metrics) + [""]
    if metrics.get("sanity_checks"):
        out += ["## Sanity checks", ""] + _sanity(metrics["sanity_checks"]) + [""]
    if metrics.get("co_guard"):
        out += ["## Catastrophic-overfitting guard", ""]
        out += _guard(metrics["co_guard"]) + [""]
    out += _curves(run_dir, history, plots, name)
    sweep = metrics.get("eps_sweep")
    if sweep:
        out += ["| eps | PGD accuracy |", "|---|---|"]
        out += [f"| {p['eps']:g} | {pct(p['accuracy'])} |" for p in sweep]
        out.append("")
    if plots and examples is not None and len(examples):
        out += _examples(run_dir, examples, class_names, name)
    if metrics.get("per_class_accuracy"):
        out += ["## Per-class accuracy", ""]
        out += _per_class(metrics, class_names) + [""]
    gap = metrics.get("bn_gap")
    if gap:
        out += [
            "## BatchNorm gap",
            "",
            f"- train-mode accuracy: {pct(gap.get('train_mode_accuracy'))}",
            f"- inference-mode accuracy: {pct(gap.get('inference_mode_accuracy'))}",
            f"- gap: {100 * gap.get('gap', 0.0):+.2f} points",
            "",
        ]
    timing = _timing(metrics)
    if timing:
        out += ["## Timing", ""] + timing + [""]
    text = yaml.safe_dump(dict(recipe), sort_keys=False).rstrip()
    out += ["## Recipe (resolved)", "", "```yaml", text, "```", ""]
    return atomic_write_text(run_dir / "report.md", "\n".join(out))
