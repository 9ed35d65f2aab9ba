"""Robust evaluation: clean, FGSM and PGD accuracy, macro F1, eps sweeps."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Optional

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


class AttackRunner:
    """Runs `Attack`s on a model in-graph and returns predicted labels.

    One traced function per attack *shape* (method, steps, restarts...);
    eps is a tensor argument, so an eps sweep costs one trace, not one per
    value, and a smaller last batch does not retrace (reduce_retracing).
    The random starts come from one seeded generator, so a run with the
    same seed, examples and batch size attacks with the same noise.

    Example:

    ```python
    runner = AttackRunner(model, seed=0)
    predictions = runner(Attack("pgd", eps=0.1, steps=20), x, y)
    ```
    """

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


def seeded_subset(
    batches: Iterable, count: int, seed: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """A uniformly random subset of `count` examples, in their stream order.

    Each example draws a key from a generator seeded with `seed`, in stream
    order, and the `count` smallest keys win. So the subset depends only on
    the seed and the order of the examples, not on the batch size; it takes
    one pass and holds at most `count` examples plus one batch.

    Returns:
        `(x, y, total)`: the chosen pixels and labels as numpy arrays and
        the number of examples the stream held.
    """
    rng = np.random.default_rng(seed)
    kept: Optional[tuple[np.ndarray, ...]] = None
    total = 0
    for x, y in batches:
        x, y = np.asarray(x), np.asarray(y)
        keys = rng.random(len(y))
        index = np.arange(total, total + len(y))
        total += len(y)
        batch = (keys, index, x, y)
        if kept is None:
            kept = batch
        else:
            pairs = zip(kept, batch, strict=True)
            kept = tuple(np.concatenate(pair) for pair in pairs)
        if len(kept[0]) > count:
            best = np.argpartition(kept[0], count - 1)[:count]
            kept = tuple(part[best] for part in kept)
    if kept is None:
        return np.zeros((0,)), np.zeros((0,), np.int64), 0
    order = np.argsort(kept[1])
    return kept[2][order], kept[3][order], total


def _array_batches(x: np.ndarray, y: np.ndarray, batch_size: int):
    for start in range(0, len(y), batch_size):
        yield (
            tf.convert_to_tensor(x[start : start + batch_size]),
            tf.convert_to_tensor(y[start : start + batch_size]),
        )


def evaluate_robustness(
    model: keras.Model,
    batches: Iterable,
    cfg: EvalConfig,
    *,
    default_eps: float,
    num_classes: int,
    progress: Optional[Callable[[str], None]] = None,
    strategy: Optional[tf.distribute.Strategy] = None,
) -> dict[str, Any]:
    """Accuracy of `model` on clean and attacked batches.

    With `cfg.max_examples` set, a seeded random subset of that many
    examples is evaluated (`seeded_subset` with `cfg.seed`), not the first
    N: test splits stored in class order would otherwise be judged on a
    few classes. The same seed gives the same subset and the same random
    starts, so two models are compared on identical examples.

    Args:
        model: maps [0, 1] pixels to logits.
        batches: `(x, y)` batches (float pixels, integer labels).
        cfg: the recipe's eval section.
        default_eps: eps used when `cfg.eps` is None (the training eps).
        num_classes: for macro F1 and the per-class table.
        progress: called with a short line after each batch.
        strategy: the run's `tf.distribute` strategy; the attack functions
            are traced and run in its scope (default: the current one).

    Returns:
        A JSON-ready dict: `clean_accuracy`, `fgsm_accuracy`,
        `pgd_accuracy`, `macro_f1`, `eps_sweep` ([{eps, accuracy}]), the
        attacks' settings, per-class support and clean / PGD accuracy, and
        the number of examples (`subset_of`: the split size, when a subset
        was drawn).
    """
    total = None
    if cfg.max_examples is not None:
        x_all, y_all, total = seeded_subset(batches, cfg.max_examples, cfg.seed)
        batches = _array_batches(x_all, y_all, cfg.batch_size)
    attacks = evaluation_attacks(cfg, default_eps)
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        runners = AttackRunner(model, cfg.seed)
        predict = tf.function(
            lambda x: tf.argmax(model(x, training=False), axis=-1),
            reduce_retracing=True,
        )
        acc = _Accumulator()
        seen = 0
        start = time.perf_counter()
        for x, y in batches:
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
        "class_support": np.bincount(labels, minlength=num_classes)
        .astype(int)
        .tolist(),
        "seconds": round(time.perf_counter() - start, 2),
    }
    if total is not None:
        result["subset_of"] = total
        result["subset_seed"] = cfg.seed
    for name in ("fgsm", "pgd"):
        if name in attacks:
            preds = acc.get(name)
            result[f"{name}_accuracy"] = float(np.mean(preds == labels))
            result[f"{name}_attack"] = attacks[name].get_config()
    if "pgd" in attacks:
        pgd_preds = acc.get("pgd")
        result["pgd_macro_f1"] = macro_f1(labels, pgd_preds, num_classes)
        result["pgd_per_class_accuracy"] = per_class_accuracy(
            labels, pgd_preds, num_classes
        )
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
