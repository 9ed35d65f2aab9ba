"""Robust evaluation: clean, FGSM and PGD accuracy, macro F1, eps sweeps."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import keras
import numpy as np
import tensorflow as tf

from advtrain.attacks import Attack
from advtrain.config import EvalConfig

log = logging.getLogger(__name__)


def macro_f1(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> float:
    """Unweighted mean of per-class F1 over classes present in labels or
    predictions (a class never seen nor predicted does not count)."""
    scores = []
    for c in range(num_classes):
        tp = np.sum((predictions == c) & (labels == c))
        fp = np.sum((predictions == c) & (labels != c))
        fn = np.sum((predictions != c) & (labels == c))
        if tp + fp + fn == 0:
            continue
        scores.append(2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores)) if scores else 0.0


def per_class_accuracy(
    labels: np.ndarray, predictions: np.ndarray, num_classes: int
) -> list[Optional[float]]:
    """Accuracy per class; None where the class has no examples."""
    out: list[Optional[float]] = []
    for c in range(num_classes):
        mask = labels == c
        out.append(float(np.mean(predictions[mask] == c)) if mask.any() else None)
    return out


@dataclasses.dataclass
class _Accumulator:
    labels: list = dataclasses.field(default_factory=list)
    predictions: dict = dataclasses.field(default_factory=dict)

    def add(self, name: str, preds: np.ndarray) -> None:
        self.predictions.setdefault(name, []).append(preds)

    def get(self, name: str) -> np.ndarray:
        return np.concatenate(self.predictions[name])


def evaluation_attacks(cfg: EvalConfig, default_eps: float) -> dict[str, Attack]:
    """The attacks a recipe's eval section asks for, by report name."""
    eps = default_eps if cfg.eps is None else cfg.eps
    attacks: dict[str, Attack] = {}
    if cfg.fgsm:
        attacks["fgsm"] = Attack("fgsm", eps=eps, norm=cfg.norm)
    if cfg.pgd_steps > 0:
        attacks["pgd"] = Attack(
            "pgd",
            eps=eps,
            norm=cfg.norm,
            steps=cfg.pgd_steps,
            step_size=cfg.pgd_step_size,
            random_start=True,
            restarts=cfg.pgd_restarts,
        )
    for value in cfg.eps_sweep:
        attacks[f"sweep_{value:g}"] = Attack(
            "pgd",
            eps=value,
            norm=cfg.norm,
            steps=max(cfg.pgd_steps, 1),
            random_start=True,
            restarts=1,
        )
    return attacks


class _AttackRunners:
    """One traced function per attack *shape* (method, steps, restarts...);
    eps is a tensor argument, so an eps sweep costs one trace, not one per
    value, and a smaller last batch does not retrace (reduce_retracing)."""

    def __init__(self, model: keras.Model, seed: int):
        self.model = model
        self.generator = keras.random.SeedGenerator(seed)
        self._functions: dict[Attack, Callable] = {}

    def __call__(self, attack: Attack, x, y) -> tf.Tensor:
        key = attack.replace(eps=0.0)
        if key not in self._functions:
            self._functions[key] = self._trace(key)
        return self._functions[key](x, y, tf.constant(attack.eps, x.dtype))

    def _trace(self, template: Attack) -> Callable:
        model, generator = self.model, self.generator

        @tf.function(reduce_retracing=True)
        def run(x, y, eps):
            attack = template.replace(eps=eps)
            x_adv = attack(lambda z: model(z, training=False), x, y, seed=generator)
            return tf.argmax(model(x_adv, training=False), axis=-1)

        return run


def evaluate_robustness(
    model: keras.Model,
    batches: Iterable,
    cfg: EvalConfig,
    *,
    default_eps: float,
    num_classes: int,
    progress: Optional[Callable[[str], None]] = None,
) -> dict[str, Any]:
    """Accuracy of `model` on clean and attacked batches.

    Args:
        model: maps [0, 1] pixels to logits.
        batches: `(x, y)` batches (float pixels, integer labels).
        cfg: the recipe's eval section.
        default_eps: eps used when `cfg.eps` is None (the training eps).
        num_classes: for macro F1 and the per-class table.
        progress: called with a short line after each batch.

    Returns:
        A JSON-ready dict: `clean_accuracy`, `fgsm_accuracy`,
        `pgd_accuracy`, `macro_f1`, `eps_sweep` ([{eps, accuracy}]), the
        attacks' settings, per-class accuracy and the number of examples.
    """
    attacks = evaluation_attacks(cfg, default_eps)
    runners = _AttackRunners(model, cfg.seed)
    predict = tf.function(
        lambda x: tf.argmax(model(x, training=False), axis=-1),
        reduce_retracing=True,
    )
    acc = _Accumulator()
    seen = 0
    start = time.perf_counter()
    for x, y in batches:
        if cfg.max_examples is not None:
            remaining = cfg.max_examples - seen
            if remaining <= 0:
                break
            x, y = x[:remaining], y[:remaining]
        y = tf.cast(y, tf.int64)
        acc.labels.append(y.numpy())
        acc.add("clean", predict(x).numpy())
        for name, attack in attacks.items():
            acc.add(name, runners(attack, x, y).numpy())
        seen += int(y.shape[0])
        if progress is not None:
            progress(f"evaluated {seen} examples")
    if seen == 0:
        raise ValueError("Evaluation got no examples: the test split is empty.")
    labels = np.concatenate(acc.labels)
    clean = acc.get("clean")
    result: dict[str, Any] = {
        "examples": seen,
        "clean_accuracy": float(np.mean(clean == labels)),
        "macro_f1": macro_f1(labels, clean, num_classes),
        "per_class_accuracy": per_class_accuracy(labels, clean, num_classes),
        "seconds": round(time.perf_counter() - start, 2),
    }
    for name in ("fgsm", "pgd"):
        if name in attacks:
            preds = acc.get(name)
            result[f"{name}_accuracy"] = float(np.mean(preds == labels))
            result[f"{name}_attack"] = attacks[name].get_config()
    if "pgd" in attacks:
        result["pgd_macro_f1"] = macro_f1(labels, acc.get("pgd"), num_classes)
    sweep = [
        {
            "eps": attacks[name].eps,
            "accuracy": float(np.mean(acc.get(name) == labels)),
        }
        for name in attacks
        if name.startswith("sweep_")
    ]
    if sweep:
        result["eps_sweep"] = sweep
    return result


def plot_eps_sweep(sweep: list[dict[str, float]], path: Path, title: str = "") -> Path:
    """Writes accuracy against eps as a PNG (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=120)
    eps = [p["eps"] for p in sweep]
    accuracy = [p["accuracy"] for p in sweep]
    ax.plot(eps, accuracy, marker="o")
    ax.set_xlabel("eps (pixel units, [0, 1] scale)")
    ax.set_ylabel("accuracy under PGD")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
    return path
