"""Robust evaluation: the AutoAttack-grade worst case as the headline;
clean, FGSM, PGD, APGD and Square accuracy, macro F1, eps sweeps.

The headline `robust_accuracy` counts an example robust only if it is
classified right clean and under every attack that ran: the listed
attacks, then AutoAttack's ensemble (APGD-CE, APGD-T, Square) as a
cascade, each attack only on the examples every earlier one failed to
break (Croce and Hein 2020), so the cost falls on the robust examples.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
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
from advtrain.utils.progress import Echo, Progress


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
    # The examples right under every attack so far, for the cascade.
    kept_x: Any = None
    kept_y: Any = None
    cascade: Optional[dict] = None

    def add(self, name: str, preds: np.ndarray) -> None:
        self.predictions.setdefault(name, []).append(preds)

    def get(self, name: str) -> np.ndarray:
        return np.concatenate(self.predictions[name])


# AutoAttack's budgets (Croce and Hein 2020; fra31/auto-attack's
# "standard" version for L-inf and L2, and its earlier "cheap" flag): APGD
# iterations and runs, APGD-T's target classes, Square's queries.
BUDGETS = {
    "standard": dict(apgd_steps=100, apgd_restarts=1, targets=9, queries=5000),
    "cheap": dict(apgd_steps=100, apgd_restarts=1, targets=9, queries=1000),
}

# Names of the ensemble's members, in cascade order, and their labels.
ENSEMBLE = {"apgd_ce": "APGD-CE", "apgd_t": "APGD-T", "square": "Square"}

# Gradient-free attacks (for the masking check): they read logits only.
GRADIENT_FREE = ("square",)


def listed_attacks(attacks: Any, fgsm: bool, pgd_steps: int) -> list[str]:
    """The attack names an evaluation runs: `attacks` as given ("autoattack"
    alone means the list ["autoattack"]), or by default FGSM when `fgsm`,
    PGD when `pgd_steps > 0`, and the AutoAttack ensemble."""
    if attacks is None:
        return ["fgsm"] * fgsm + ["pgd"] * (pgd_steps > 0) + ["autoattack"]
    if isinstance(attacks, str):
        return [attacks]
    return list(attacks)


def ensemble_attacks(
    eps: float,
    norm: str = "inf",
    budget: str = "standard",
    queries: Optional[int] = None,
    num_classes: Optional[int] = None,
) -> dict[str, Attack]:
    """AutoAttack's ensemble at `budget`, in cascade order: APGD-CE,
    APGD-T (targeted DLR over the 9 most likely wrong classes) and Square
    (gradient-free); `queries` overrides Square's budget. With fewer than 4
    classes APGD-T is left out: its loss needs 4 logits (AutoAttack skips
    it there too)."""
    if budget not in BUDGETS:
        raise ValueError(
            f"budget must be one of {', '.join(BUDGETS)}. Received: budget={budget!r}"
        )
    b = BUDGETS[budget]
    apgd = dict(eps=eps, norm=norm, steps=b["apgd_steps"], restarts=b["apgd_restarts"])
    members = {
        "apgd_ce": Attack("apgd_ce", **apgd),
        "apgd_t": Attack("apgd_dlr", **apgd),
        "square": Attack("square", eps=eps, norm=norm, queries=queries or b["queries"]),
    }
    if num_classes is not None and num_classes < 4:
        del members["apgd_t"]
    return members


def evaluation_attacks(
    *,
    default_eps: float,
    eps: Optional[float] = None,
    norm: str = "inf",
    attacks: Any = None,
    fgsm: bool = True,
    pgd_steps: int = 20,
    pgd_step_size: Optional[float] = None,
    pgd_restarts: int = 1,
    apgd_steps: int = 100,
    apgd_restarts: int = 1,
    square_queries: Optional[int] = None,
    eps_sweep: Sequence[float] = (),
    **_ensemble: Any,
) -> dict[str, Attack]:
    """The attacks an evaluation runs one by one on every example, by
    report name (the AutoAttack cascade is `ensemble_attacks`).

    The arguments are the recipe's `eval` keys: `attacks` names them
    (fgsm, pgd, apgd_ce, apgd_dlr, square, autoattack; see
    `listed_attacks` for the default). `eps` None means `default_eps` (the
    training eps). Each `eps_sweep` value adds a PGD attack `sweep_<eps>`.
    """
    eps = default_eps if eps is None else eps
    chosen = [a for a in listed_attacks(attacks, fgsm, pgd_steps) if a != "autoattack"]
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
        "square": lambda: Attack(
            "square", eps=eps, norm=norm, queries=square_queries or 5000
        ),
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
        if key in self._functions:
            return self._functions[key](x, y, *values.values())
        self._functions[key] = self._trace(template, specs, values)
        # TensorFlow counts traces per Python function over the process and
        # warns at 5 in 10 calls; an evaluation traces each attack kind once
        # (`tracing_count`), which its cascade of 5 kinds would trip.
        with _quiet_tracing_warning():
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


class _RetracingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "triggered tf.function retracing" not in record.getMessage()


@contextlib.contextmanager
def _quiet_tracing_warning():
    logger, quiet = tf.get_logger(), _RetracingFilter()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


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
    budget: str = "standard",
    progress: Optional[Echo] = None,
    strategy: Optional[tf.distribute.Strategy] = None,
    **attack_keys: Any,
) -> dict[str, Any]:
    """Accuracy of `model` on clean and attacked batches; the headline is
    the worst case per example over every attack, AutoAttack included.

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
        batch_size: batch size of the subset's batches and the cascade.
        budget: AutoAttack's budget, "standard" or "cheap" (`BUDGETS`).
        progress: called with a short line after each batch.
        strategy: the run's `tf.distribute` strategy; the attack functions
            are traced and run in its scope (default: the current one).
        **attack_keys: the recipe's other `eval` keys, as `evaluation_attacks`
            takes them (eps, norm, attacks, fgsm, pgd_steps, ...).

    Returns:
        A JSON-ready dict. The headline: `robust_accuracy` (right on clean
        and under every attack, per example), `robust_accuracy_ci95`
        (Wilson interval), `robust_accuracy_over` (the attacks),
        `robust_accuracy_ensemble` (AutoAttack's name and budget, or None
        when it did not run) and `examples`. Then `clean_accuracy`,
        `<attack>_accuracy` and `<attack>_attack` (its settings) for each
        attack run on every example; `autoattack` (per cascade step: the
        examples attacked and broken, the robust accuracy after it) and
        `autoattack_<member>_accuracy`; `gradient_free_only` (examples only
        a gradient-free attack broke: the masking check's count);
        `macro_f1`, `eps_sweep`, per-class support and accuracy, and
        `subset_of` when a subset was drawn. `robust_accuracy_worst` is the
        headline's former name.
    """
    total = None
    batch_count = _batch_count(batches)
    if max_examples is not None:
        x_all, y_all, total = seeded_subset(batches, max_examples, seed)
        batches = _array_batches(x_all, y_all, batch_size)
        batch_count = -(-len(y_all) // batch_size)
    chosen = evaluation_attacks(default_eps=default_eps, **attack_keys)
    names = listed_attacks(
        attack_keys.get("attacks"),
        attack_keys.get("fgsm", True),
        attack_keys.get("pgd_steps", 20),
    )
    ensemble = {}
    if "autoattack" in names:
        eps = attack_keys.get("eps")
        ensemble = ensemble_attacks(
            default_eps if eps is None else eps,
            attack_keys.get("norm", "inf"),
            budget,
            attack_keys.get("square_queries"),
            num_classes,
        )
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        acc = _predict(
            model, batches, chosen, seed, batch_count, progress, keep=bool(ensemble)
        )
        if ensemble:
            acc.cascade = run_cascade(
                AttackRunner(model, seed + 1),
                ensemble,
                acc.kept_x,
                acc.kept_y,
                batch_size=batch_size,
                label=f"AutoAttack ({budget})",
            )
    result = _summary(acc, chosen, num_classes)
    if ensemble:
        _ensemble_summary(result, acc, ensemble, budget)
    _finish_headline(result, acc)
    if total is not None:
        result["subset_of"] = total
        result["subset_seed"] = seed
    return result


def evaluate(
    model: keras.Model,
    data: Any,
    *,
    eps: float,
    norm: str = "inf",
    attacks: Any = None,
    budget: str = "standard",
    batch_size: int = 256,
    max_examples: Optional[int] = None,
    seed: int = 0,
    num_classes: Optional[int] = None,
    **keys: Any,
) -> dict[str, Any]:
    """Robust accuracy of a classifier as a reviewer would measure it.

    The Python face of a recipe's evaluation: `robust_accuracy` is the
    worst case per example over clean, FGSM, PGD and AutoAttack (APGD-CE,
    APGD-T, Square as a cascade) at `eps`, with its 95% interval; the
    other keys are `evaluate_robustness`'s.

    Args:
        model: maps [0, 1] pixels to logits (an `AdversarialModel` is
            evaluated through its classifier).
        data: `(x, y)` arrays (float pixels in [0, 1], integer labels) or a
            `tf.data.Dataset` of such batches.
        eps: the threat model's radius, in pixel units.
        norm: the threat model's norm, "inf" or 2.
        attacks: as the recipe's `eval` key; None runs FGSM, PGD and
            AutoAttack.
        budget: as the recipe's `eval` key.
        batch_size: as the recipe's `eval` key.
        max_examples: as the recipe's `eval` key.
        seed: as the recipe's `eval` key.
        num_classes: default: the model's number of logits.
        **keys: other `eval` keys (pgd_steps, pgd_restarts, square_queries).

    Example:

    ```python
    result = advtrain.evaluate(model, (x_test, y_test), eps=0.3)
    print(result["robust_accuracy"], result["robust_accuracy_ci95"])
    ```
    """
    model = getattr(model, "classifier", model)
    if isinstance(data, tuple):
        x, y = (np.asarray(part) for part in data)
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)
    if num_classes is None:
        num_classes = int(model.output_shape[-1])
    return evaluate_robustness(
        model, data, default_eps=eps, num_classes=num_classes, norm=norm,
        attacks=attacks, budget=budget, batch_size=batch_size,
        max_examples=max_examples, seed=seed, **keys,
    )  # fmt: skip


def run_cascade(
    runner: AttackRunner,
    attacks: dict[str, Attack],
    x: np.ndarray,
    y: np.ndarray,
    *,
    batch_size: int = 256,
    label: str = "cascade",
) -> dict[str, Any]:
    """Runs `attacks` in order, each only on the examples every earlier one
    left correctly classified (AutoAttack's cascade).

    `x`, `y` are the examples still standing (classified right so far).
    Returns `robust` (a boolean per example: right after every attack) and
    `steps`: per attack its name, settings, the examples it `attacked` and
    `broken`, and `seconds`.
    """
    robust = np.ones(len(y), bool)
    steps = []
    for name, attack in attacks.items():
        start = time.perf_counter()
        standing = np.flatnonzero(robust)
        bar = Progress(
            f"{label}: {name} on {len(standing)} examples",
            -(-len(standing) // batch_size),
            unit="batches",
            keep=True,
        )
        for done, first in enumerate(range(0, len(standing), batch_size), 1):
            index = standing[first : first + batch_size]
            xb = tf.convert_to_tensor(x[index])
            yb = tf.convert_to_tensor(y[index].astype(np.int64))
            robust[index] = runner(attack, xb, yb).numpy() == y[index]
            bar.update(
                done, f"{int(np.sum(~robust[standing[: first + len(index)]]))} broken"
            )
        bar.close()
        steps.append(
            {
                "attack": name,
                "settings": attack.get_config(),
                "attacked": int(len(standing)),
                "broken": int(len(standing) - np.sum(robust[standing])),
                "seconds": round(time.perf_counter() - start, 2),
            }
        )
    return {"robust": robust, "steps": steps}


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion (sound near 0 and 1)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _predict(
    model, batches, attacks, seed, batch_count, progress, keep: bool = False
) -> _Accumulator:
    """Labels, and predicted labels on clean and attacked inputs; with
    `keep`, the examples still classified right under every attack."""
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
    kept_x, kept_y = [], []
    for x, y in batches:
        y = tf.cast(y, tf.int64)
        labels = y.numpy()
        acc.labels.append(labels)
        right = predict(x).numpy()
        acc.add("clean", right)
        right = right == labels
        for name, attack in attacks.items():
            predicted = runners(attack, x, y).numpy()
            acc.add(name, predicted)
            if not name.startswith("sweep_"):
                right &= predicted == labels
        if keep:
            kept_x.append(np.asarray(x)[right])
            kept_y.append(labels[right])
        acc.seen += int(y.shape[0])
        bar.update(len(acc.labels), f"{acc.seen} examples")
        if progress is not None:
            progress(f"evaluated {acc.seen} examples")
    bar.close()
    if acc.seen == 0:
        raise ValueError("Evaluation got no examples: the test split is empty.")
    if keep:
        acc.kept_x, acc.kept_y = np.concatenate(kept_x), np.concatenate(kept_y)
    return acc


def _summary(acc: _Accumulator, attacks, num_classes: int) -> dict[str, Any]:
    """The JSON-ready result of `evaluate_robustness`."""
    labels = np.concatenate(acc.labels)
    clean = acc.get("clean")
    robust = clean == labels
    result: dict[str, Any] = {
        "robust_accuracy": float(np.mean(robust)),
        "robust_accuracy_over": ["clean"],
        "robust_accuracy_ensemble": None,
        "examples": acc.seen,
        "clean_accuracy": float(np.mean(clean == labels)),
        "macro_f1": macro_f1(labels, clean, num_classes),
        "per_class_accuracy": per_class_accuracy(labels, clean, num_classes),
        "class_support": np.bincount(labels, minlength=num_classes)
        .astype(int)
        .tolist(),
    }
    gradient_robust = robust.copy()
    chosen = [name for name in attacks if not name.startswith("sweep_")]
    for name in chosen:
        right = acc.get(name) == labels
        robust &= right
        if name not in GRADIENT_FREE:
            gradient_robust &= right
        result[f"{name}_accuracy"] = float(np.mean(right))
        result[f"{name}_attack"] = attacks[name].get_config()
        if name == "apgd_dlr":
            result[f"{name}_attack"]["targets"] = APGD_TARGETS
    result["robust_accuracy_over"] += chosen
    result["robust_accuracy"] = float(np.mean(robust))
    if any(name in GRADIENT_FREE for name in chosen):
        result["gradient_free_only"] = int(np.sum(gradient_robust & ~robust))
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


def _ensemble_summary(result, acc: _Accumulator, ensemble, budget: str) -> None:
    """Adds the AutoAttack cascade to `result`: the steps, the robust
    accuracy after each, and the headline over everything."""
    n = acc.seen
    standing = len(acc.kept_y)
    steps = acc.cascade["steps"]
    for step in steps:
        standing -= step["broken"]
        step["robust_accuracy_after"] = standing / n
        result[f"autoattack_{step['attack']}_accuracy"] = standing / n
    result["autoattack"] = {"budget": budget, "steps": steps}
    result["robust_accuracy"] = standing / n
    result["robust_accuracy_over"] += list(ensemble)
    result["robust_accuracy_ensemble"] = (
        f"AutoAttack ({', '.join(ENSEMBLE[m] for m in ensemble)}), {budget} budget"
    )
    # In the cascade the gradient-free attack only sees the examples every
    # gradient attack failed on: what it breaks, only it broke.
    free = sum(s["broken"] for s in steps if s["attack"] in GRADIENT_FREE)
    result["gradient_free_only"] = result.get("gradient_free_only", 0) + free


def _finish_headline(result: dict[str, Any], acc: _Accumulator) -> None:
    """The headline's interval and alias, and the evaluation's seconds,
    once every attack (the cascade included) has run."""
    n = acc.seen
    low, high = wilson_interval(round(result["robust_accuracy"] * n), n)
    result["robust_accuracy_ci95"] = [low, high]
    result["robust_accuracy_worst"] = result["robust_accuracy"]
    result["robust_accuracy_worst_over"] = result["robust_accuracy_over"]
    result["seconds"] = round(time.perf_counter() - acc.start, 2)


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
