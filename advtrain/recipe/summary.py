"""What a run prints: the banner before training and the summary table."""

from __future__ import annotations

from typing import Any

import keras

from advtrain.recipe.build import attack_from_config
from advtrain.recipe.schema import Recipe
from advtrain.utils.progress import Echo


def describe(recipe: Recipe, splits, echo: Echo) -> None:
    """The run's data and attack, one line each (`advtrain.fit` prints the
    runtime and the batch arithmetic)."""
    attack = attack_from_config(recipe.attack)
    echo(
        f"data: {recipe.data.source} {splits.train_size} train / "
        f"{splits.val_size} val / {splits.test_size} test, image "
        f"{'x'.join(map(str, splits.image_shape))}, {splits.num_classes} classes"
    )
    if attack is None:
        echo("attack: none (clean training)")
        return
    cfg = recipe.attack
    line = (
        f"attack: {cfg.method} eps={attack.eps:g} norm={attack.norm} "
        f"adv_weight={cfg.adv_weight:g} backend={attack.backend} mode={cfg.mode}"
        + _method_options(attack)
    )
    if cfg.eps_ramp_epochs:
        line += f" eps_ramp_epochs={cfg.eps_ramp_epochs:g}"
    if cfg.objective != "adversarial":
        line += f" objective={cfg.objective}" + _pairs(cfg.objective_options)
    echo(line)


def _pairs(options: dict[str, Any]) -> str:
    return "".join(
        f" {k}={format(v, 'g') if isinstance(v, float) else v}"
        for k, v in options.items()
    )


def _method_options(attack) -> str:
    # The method's settings, e.g. " alpha=1.25*eps clip_start=False".
    alpha = "eps" if attack.method == "n_fgsm" else "1.25*eps"
    derived = {"alpha": alpha, "noise": "2*eps"}
    settings = attack.settings.items()
    return _pairs({k: derived.get(k, "auto") if v is None else v for k, v in settings})


def describe_momentum(recipe: Recipe, classifier: keras.Model, echo: Echo) -> None:
    from advtrain.models.batchnorm.policy import layer_momentum

    momentum = layer_momentum(classifier)
    if momentum is not None:
        echo(
            f"batchnorm: momentum {momentum:g} "
            "(model.batchnorm.momentum: "
            f"{recipe.model.batchnorm.momentum or 'null'})"
        )


SUMMARY_KEYS = (
    ("clean_accuracy", "clean accuracy"),
    ("fgsm_accuracy", "FGSM accuracy"),
    ("pgd_accuracy", "PGD accuracy"),
    ("macro_f1", "macro F1 (clean)"),
    ("examples", "test examples"),
    ("train_seconds", "training time (s)"),
    ("train_samples_per_second", "training samples/s"),
)


def summary_table(metrics: dict[str, Any]) -> str:
    """A two-column text table: the headline first, then the rest."""
    rows = []
    if "robust_accuracy" in metrics:
        from advtrain.evaluation.report import headline_parts

        over, text = headline_parts(metrics)
        rows.append(("robust accuracy (worst case)", text))
        rows.append(("  over", over))
    for key, label in SUMMARY_KEYS:
        if key not in metrics:
            continue
        value = metrics[key]
        if key.endswith("accuracy") or key == "macro_f1":
            text = f"{100 * value:.2f}%" if "accuracy" in key else f"{value:.4f}"
        else:
            text = f"{value}"
        rows.append((label, text))
    for key in ("fgsm_attack", "pgd_attack"):
        if key in metrics:
            a = metrics[key]
            detail = f"eps={a['eps']:g} norm={a['norm']}"
            if a["method"] == "pgd":
                detail += f" steps={a['steps']} restarts={a['restarts']}"
            rows.append((key.replace("_", " "), detail))
    if metrics.get("bn_gap"):
        g = metrics["bn_gap"]
        text = f"{100 * g['gap']:+.2f} points"
        if g.get("recalibrated"):
            text += f" (before recalibration {100 * g['before']['gap']:+.2f})"
        rows.append(("BN gap (train - inference mode)", text))
    width = max(len(label) for label, _ in rows) if rows else 0
    return "\n".join(f"  {label:<{width}}  {text}" for label, text in rows)
