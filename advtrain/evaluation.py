"""Robust evaluation: clean, FGSM, PGD and APGD accuracy, the worst case
per example over the attacks, macro F1, eps sweeps."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Optional

import keras
import numpy as np
import tensorflow as tf

from advtrain.attacks import Attack
from advtrain.attacks.apgd import DEFAULT_TARGETS as APGD_TARGETS
from advtrain.attacks.pgd import default_step_size
from advtrain.progress import Progress


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
    seen: int = 0
    start: float = 0.0

    def add(self, name: str, preds: np.ndarray) -> None:
        self.predictions.setdefault(name, []).append(preds)

    def get(self, name: str) -> np.ndarray:
        return np.concatenate(self.predictions[name])


def evaluation_attacks(
    *,
    default_eps: float,
    eps: Optional[float] = None,
    norm: str = "inf",
    attacks: Optional[Sequence[str]] = None,
    fgsm: bool = True,
    pgd_steps: int = 20,
    pgd_step_size: Optional[float] = None,
    pgd_restarts: int = 1,
    apgd_steps: int = 100,
    apgd_restarts: int = 1,
    eps_sweep: Sequence[float] = (),
) -> dict[str, Attack]:
    """The attacks an evaluation runs, by report name.

    The arguments are the recipe's `eval` keys: `attacks` names them
    (fgsm, pgd, apgd_ce, apgd_dlr); when None, FGSM when `fgsm` and PGD
    when `pgd_steps > 0`. `eps` None means `default_eps` (the training
    eps). Each `eps_sweep` value adds a PGD attack `sweep_<eps>`.
    """
    eps = default_eps if eps is None else eps
    chosen = attacks
    if chosen is None:
        chosen = ["fgsm"] * fgsm + ["pgd"] * (pgd_steps > 0)
    apgd = dict(eps=eps, norm=norm, steps=apgd_steps, restarts=apgd_restarts)
    available = {
        "fgsm": lambda: Attack("fgsm", eps=eps, norm=norm),
        "pgd": lambda: Attack(
            "pgd",
            eps=eps,
            norm=norm,
            steps=pgd_steps,
            step_size=pgd_step_size,
            random_start=True,
            restarts=pgd_restarts,
        ),
        "apgd_ce": lambda: Attack("apgd_ce", **apgd),
        "apgd_dlr": lambda: Attack("apgd_dlr", **apgd),
    }
    chosen_attacks = {name: available[name]() for name in chosen}
    for value in eps_sweep:
        chosen_attacks[f"sweep_{value:g}"] = Attack(
            "pgd",
            eps=value,
            norm=norm,
            steps=max(pgd_steps, 1),
            random_start=True,
            restarts=1,
        )
    return chosen_attacks


class AttackRunner:
    """Runs `Attack`s on a model in-graph and returns predicted labels.

    One traced function per attack *kind* (method, norm, random start,
    backend): eps is a tensor argument, and so are PGD's steps, step size
    and restarts, so an eps sweep and the sanity checks' stronger variants
    cost no new trace; the batch dimension is left open, so a smaller last
    batch does not retrace either. The random starts come from one seeded
    generator, so a run with the same seed, examples and batch size
    attacks with the same noise.

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
        x, y = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
        values = _graph_arguments(attack, x.dtype)
        template = attack.replace(**{name: _UNSET[name] for name in values})
        specs = tuple(tf.TensorSpec([None, *t.shape[1:]], t.dtype) for t in (x, y))
        key = (template, specs)
        if key not in self._functions:
            self._functions[key] = self._trace(template, specs, values)
        return self._functions[key](x, y, *values.values())

    @property
    def tracing_count(self) -> int:
        """Graphs traced so far, over all attacks (for tests)."""
        return sum(f.experimental_get_tracing_count() for f in self._functions.values())

    def _trace(self, template: Attack, specs, values: dict) -> Callable:
        model, generator = self.model, self.generator
        names = tuple(values)
        scalars = tuple(tf.TensorSpec([], v.dtype) for v in values.values())

        @tf.function(input_signature=(*specs, *scalars))
        def run(x, y, *arguments):
            attack = template.replace(**dict(zip(names, arguments, strict=True)))
            x_adv = attack(lambda z: model(z, training=False), x, y, seed=generator)
            return tf.argmax(model(x_adv, training=False), axis=-1)

        return run


# Placeholders for the fields AttackRunner passes as tensors.
_UNSET = {"eps": 0.0, "steps": 1, "step_size": None, "restarts": 1}


def _graph_arguments(attack: Attack, dtype) -> dict[str, tf.Tensor]:
    """The attack's numbers that its traced graph takes as arguments."""
    values = {"eps": tf.constant(attack.eps, dtype)}
    if attack.method == "pgd" and attack.backend == "advtrain":
        step_size = attack.step_size
        if step_size is None:
            step_size = default_step_size(attack.eps, attack.steps)
        values["steps"] = tf.constant(attack.steps, tf.int32)
        values["step_size"] = tf.constant(step_size, dtype)
        values["restarts"] = tf.constant(attack.restarts, tf.int32)
    return values


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


def _batch_count(batches: Iterable) -> Optional[int]:
    try:
        return len(batches)  # tf.data with a known cardinality, lists
    except TypeError:
        return None


def _attack_names(attacks: dict[str, Attack]) -> str:
    names = ["clean", *(n for n in attacks if not n.startswith("sweep_"))]
    sweep = sum(n.startswith("sweep_") for n in attacks)
    return ", ".join(names + ([f"eps sweep x{sweep}"] if sweep else []))


def _array_batches(x: np.ndarray, y: np.ndarray, batch_size: int):
    for start in range(0, len(y), batch_size):
        yield (
            tf.convert_to_tensor(x[start : start + batch_size]),
            tf.convert_to_tensor(y[start : start + batch_size]),
        )


def evaluate_robustness(
    model: keras.Model,
    batches: Iterable,
    *,
    default_eps: float,
    num_classes: int,
    max_examples: Optional[int] = None,
    seed: int = 0,
    batch_size: int = 256,
    progress: Optional[Callable[[str], None]] = None,
    strategy: Optional[tf.distribute.Strategy] = None,
    **attack_keys: Any,
) -> dict[str, Any]:
    """Accuracy of `model` on clean and attacked batches.

    With `max_examples` set, a seeded random subset of that many examples
    is evaluated (`seeded_subset` with `seed`), not the first N: test
    splits stored in class order would otherwise be judged on a few
    classes. The same seed gives the same subset and the same random
    starts, so two models are compared on identical examples.

    Args:
        model: maps [0, 1] pixels to logits.
        batches: `(x, y)` batches (float pixels, integer labels).
        default_eps: eps used when `eps` is None (the training eps).
        num_classes: for macro F1 and the per-class table.
        max_examples: evaluate a seeded random subset of this size.
        seed: seed of the subset and of the attacks' random starts.
        batch_size: batch size of the subset's batches.
        progress: called with a short line after each batch.
        strategy: the run's `tf.distribute` strategy; the attack functions
            are traced and run in its scope (default: the current one).
        **attack_keys: the recipe's other `eval` keys, as `evaluation_attacks`
            takes them (eps, norm, attacks, fgsm, pgd_steps, ...).

    Returns:
        A JSON-ready dict: `clean_accuracy`, `<attack>_accuracy` and
        `<attack>_attack` (its settings) for each attack (fgsm, pgd,
        apgd_ce, apgd_dlr), `robust_accuracy_worst` (the fraction right on
        clean and under every one of them, per example), `macro_f1`,
        `eps_sweep` ([{eps, accuracy}]), per-class support and clean / PGD
        accuracy, and the number of examples (`subset_of`: the split size,
        when a subset was drawn).
    """
    total = None
    batch_count = _batch_count(batches)
    if max_examples is not None:
        x_all, y_all, total = seeded_subset(batches, max_examples, seed)
        batches = _array_batches(x_all, y_all, batch_size)
        batch_count = -(-len(y_all) // batch_size)
    chosen = evaluation_attacks(default_eps=default_eps, **attack_keys)
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        acc = _predict(model, batches, chosen, seed, batch_count, progress)
    result = _summary(acc, chosen, num_classes)
    if total is not None:
        result["subset_of"] = total
        result["subset_seed"] = seed
    return result


def _predict(model, batches, attacks, seed, batch_count, progress) -> _Accumulator:
    """Labels, and predicted labels on clean and attacked inputs."""
    bar = Progress(
        f"evaluating ({_attack_names(attacks)})",
        batch_count,
        unit="batches",
        keep=True,
    )
    runners = AttackRunner(model, seed)
    predict = tf.function(
        lambda x: tf.argmax(model(x, training=False), axis=-1),
        reduce_retracing=True,
    )
    acc = _Accumulator(start=time.perf_counter())
    for x, y in batches:
        y = tf.cast(y, tf.int64)
        acc.labels.append(y.numpy())
        acc.add("clean", predict(x).numpy())
        for name, attack in attacks.items():
            acc.add(name, runners(attack, x, y).numpy())
        acc.seen += int(y.shape[0])
        bar.update(len(acc.labels), f"{acc.seen} examples")
        if progress is not None:
            progress(f"evaluated {acc.seen} examples")
    bar.close()
    if acc.seen == 0:
        raise ValueError("Evaluation got no examples: the test split is empty.")
    return acc


def _summary(acc: _Accumulator, attacks, num_classes: int) -> dict[str, Any]:
    """The JSON-ready result of `evaluate_robustness`."""
    labels = np.concatenate(acc.labels)
    clean = acc.get("clean")
    result: dict[str, Any] = {
        "examples": acc.seen,
        "clean_accuracy": float(np.mean(clean == labels)),
        "macro_f1": macro_f1(labels, clean, num_classes),
        "per_class_accuracy": per_class_accuracy(labels, clean, num_classes),
        "class_support": np.bincount(labels, minlength=num_classes)
        .astype(int)
        .tolist(),
        "seconds": round(time.perf_counter() - acc.start, 2),
    }
    robust = clean == labels
    chosen = [name for name in attacks if not name.startswith("sweep_")]
    for name in chosen:
        right = acc.get(name) == labels
        robust &= right
        result[f"{name}_accuracy"] = float(np.mean(right))
        result[f"{name}_attack"] = attacks[name].get_config()
        if name == "apgd_dlr":
            result[f"{name}_attack"]["targets"] = APGD_TARGETS
    if chosen:
        # Per example: robust only if clean and every attack get it right.
        result["robust_accuracy_worst"] = float(np.mean(robust))
        result["robust_accuracy_worst_over"] = ["clean", *chosen]
    if "pgd" in attacks:
        pgd_preds = acc.get("pgd")
        result["pgd_macro_f1"] = macro_f1(labels, pgd_preds, num_classes)
        result["pgd_per_class_accuracy"] = per_class_accuracy(
            labels, pgd_preds, num_classes
        )
    sweep = [
        {"eps": attacks[name].eps, "accuracy": float(np.mean(acc.get(name) == labels))}
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
