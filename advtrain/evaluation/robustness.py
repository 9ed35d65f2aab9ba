"""Robust evaluation: the AutoAttack-grade worst case as the headline;
clean, FGSM, PGD, APGD, FAB-T and Square accuracy, macro F1, eps sweeps.

The headline `robust_accuracy` counts an example robust only if it is
classified right clean and under every attack that ran: the listed
attacks, then AutoAttack's standard set (APGD-CE, APGD-T, FAB-T, Square)
as a cascade, each attack only on the examples every earlier one failed to
break (Croce and Hein 2020), so the cost falls on the robust examples.
"""

from __future__ import annotations

import contextlib
import math
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Optional, Union

import keras
import numpy as np

from advtrain import backend
from advtrain.attacks import Attack, canonical_norm
from advtrain.attacks.common import HOST_CHUNK, Pieces
from advtrain.attacks.pgd import (
    default_step_size,
    outcome,
    pgd_start,
    pgd_steps,
    worst_of_restarts,
)
from advtrain.evaluation.examples import ExampleRecorder, concat, smallest_keys
from advtrain.evaluation.report import CASCADE_LABELS
from advtrain.evaluation.verdict import run_verdict
from advtrain.utils.errors import ArgumentError, did_you_mean
from advtrain.utils.io import atomic_path
from advtrain.utils.keywords import check_keywords
from advtrain.utils.progress import Echo, Progress


def macro_f1(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> float:
    """scikit-learn's macro F1 over the classes (below `num_classes`)
    present in labels or predictions."""
    from sklearn.metrics import f1_score  # scipy's import: only when used

    present = np.union1d(labels, predictions)
    present = present[(present >= 0) & (present < num_classes)]
    if len(present) == 0:
        return 0.0
    return float(
        f1_score(labels, predictions, labels=present, average="macro", zero_division=0)
    )


def per_class_accuracy(
    labels: np.ndarray, predictions: np.ndarray, num_classes: int
) -> list[Optional[float]]:
    """Accuracy per class (its recall); None where it has no examples."""
    from sklearn.metrics import recall_score

    recall = recall_score(
        labels,
        predictions,
        labels=np.arange(num_classes),
        average=None,
        zero_division=np.nan,
    )
    return [None if np.isnan(r) else float(r) for r in recall]


# AutoAttack's budgets (Croce and Hein 2020; fra31/auto-attack's
# "standard" version for L-inf, and its earlier "cheap" flag): APGD
# iterations and runs, APGD-T's target classes, FAB-T's target classes
# (100 iterations, one run each; 0 leaves FAB-T out), Square's queries.
BUDGETS = {
    "standard": dict(
        apgd_steps=100, apgd_restarts=1, targets=9, fab_targets=9, queries=5000
    ),
    "cheap": dict(
        apgd_steps=100, apgd_restarts=1, targets=9, fab_targets=0, queries=1000
    ),
}

# Gradient-free attacks (for the masking check): they read logits only.
GRADIENT_FREE = ("square",)

EVALUATION_ATTACKS = (
    "fgsm",
    "pgd",
    "apgd_ce",
    "apgd_dlr",
    "fab_t",
    "square",
    "autoattack",
)

# The keyword arguments that choose an evaluation's attacks.
ATTACK_KEYS = (
    "eps",
    "norm",
    "attacks",
    "fgsm",
    "pgd_steps",
    "pgd_step_size",
    "pgd_restarts",
    "apgd_steps",
    "apgd_restarts",
    "square_queries",
    "eps_sweep",
)


def listed_attacks(attacks: Any, fgsm: bool, pgd_steps: int) -> list[str]:
    """The attack names an evaluation runs: `attacks` as given, or by
    default FGSM when `fgsm`, PGD when `pgd_steps > 0`, and "autoattack"."""
    if attacks is None:
        return ["fgsm"] * fgsm + ["pgd"] * (pgd_steps > 0) + ["autoattack"]
    names = [attacks] if isinstance(attacks, str) else list(attacks)
    for name in names:
        if name not in EVALUATION_ATTACKS:
            raise ArgumentError(
                "attacks",
                f"unknown attack '{name}'.{did_you_mean(name, EVALUATION_ATTACKS)}"
                f" Known: {', '.join(EVALUATION_ATTACKS)}. Received: "
                f"attacks={attacks!r}",
            )
    return names


def ensemble_attacks(
    eps: float,
    norm: str = "inf",
    budget: str = "standard",
    queries: Optional[int] = None,
    num_classes: Optional[int] = None,
) -> dict[str, Attack]:
    """AutoAttack's ensemble at `budget`, in cascade order: APGD-CE,
    APGD-T (targeted DLR over the 9 most likely wrong classes; left out
    below 4 classes, as AutoAttack does), FAB-T (same targets; standard
    budget and L-inf only) and Square (`queries` overrides its budget)."""
    if budget not in BUDGETS:
        raise ValueError(
            f"budget must be one of {', '.join(BUDGETS)}. Received: budget={budget!r}"
        )
    b = BUDGETS[budget]
    apgd = dict(eps=eps, norm=norm, steps=b["apgd_steps"], restarts=b["apgd_restarts"])
    members = {
        "apgd_ce": Attack("apgd_ce", **apgd),
        "apgd_t": Attack("apgd_dlr", **apgd, targets=b["targets"]),
        "fab_t": Attack("fab_t", eps=eps, targets=max(b["fab_targets"], 1)),
        "square": Attack("square", eps=eps, norm=norm, queries=queries or b["queries"]),
    }
    if num_classes is not None and num_classes < 4:
        del members["apgd_t"]
    if not b["fab_targets"] or canonical_norm(norm) != "inf":
        del members["fab_t"]
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
) -> dict[str, Attack]:
    """The attacks an evaluation runs on every example, by report name
    (AutoAttack's cascade is `ensemble_attacks`). `eps` None means
    `default_eps`; each `eps_sweep` value adds a PGD attack `sweep_<eps>`."""
    eps = default_eps if eps is None else eps
    apgd = dict(steps=apgd_steps, restarts=apgd_restarts)
    settings = {
        "fgsm": {},
        "pgd": dict(
            steps=pgd_steps,
            step_size=pgd_step_size,
            random_start=True,
            restarts=pgd_restarts,
        ),
        "apgd_ce": apgd,
        "apgd_dlr": apgd,
        "fab_t": {},
        "square": dict(queries=square_queries or 5000),
    }
    chosen = {
        name: Attack(name, eps=eps, norm=norm, **settings[name])
        for name in listed_attacks(attacks, fgsm, pgd_steps)
        if name != "autoattack"
    }
    for value in eps_sweep:
        chosen[f"sweep_{value:g}"] = Attack(
            "pgd",
            eps=value,
            norm=norm,
            steps=max(pgd_steps, 1),
            random_start=True,
            restarts=1,
        )
    return chosen


class AttackRunner:
    """Runs `Attack`s on a model compiled and returns predicted labels.

    One compiled function per attack kind (method, norm, random start):
    eps, and PGD's steps, step size and restarts, are arguments, so an eps
    sweep and the sanity checks' variants trace nothing new. Every runner
    of a model shares its functions (held weakly), so a second evaluation
    compiles nothing. TensorFlow leaves the batch dimension open; JAX
    compiles per batch shape and drives PGD's iterations from the host in
    compiled chunks (`advtrain.backend.HOST_LOOPS`). The random starts come
    from one generator seeded per runner.

    Example:

    ```python
    runner = AttackRunner(model, seed=0)
    predictions = runner(Attack("pgd", eps=0.1, steps=20), x, y)
    ```
    """

    def __init__(self, model: keras.Model, seed: int):
        self.model = model
        self.generator = keras.random.SeedGenerator(seed)
        if model not in _COMPILED:
            _COMPILED[model] = _Compiled(model)
        self._compiled = _COMPILED[model]
        self._functions = self._compiled.functions

    @property
    def tracing_count(self) -> int:
        """Traces of this model's attack functions over every runner."""
        return self._compiled.traces

    def __call__(self, attack: Attack, x, y) -> np.ndarray:
        """The model's labels on `attack`'s points for `(x, y)`."""
        return self._run(attack, x, y, points=False)

    def adversarial(self, attack: Attack, x, y) -> tuple[np.ndarray, np.ndarray]:
        """`(x_adv, labels)`: `attack`'s points and the model's labels there."""
        return self._run(attack, x, y, points=True)

    def predict(self, x) -> np.ndarray:
        """The model's labels on the clean `x`."""
        labels = self._call(("predict",), _labels, np.asarray(x))
        return keras.ops.convert_to_numpy(labels)

    def _run(self, attack: Attack, x, y, points: bool):
        x, y = np.asarray(x), np.asarray(y).astype(np.int32)
        values = _graph_arguments(attack, x.dtype)
        if backend.HOST_LOOPS and "steps" in values:
            outputs = self._pgd_on_host(attack, x, y, values)
            outputs = outputs if points else outputs[1]
        elif backend.HOST_LOOPS and attack.method in HOST_DRIVEN:
            outputs = self._on_host(attack, x, y)
            outputs = outputs if points else outputs[1]
        else:
            template = attack.replace(**{name: _UNSET[name] for name in values})
            names, generator = tuple(values), self._compiled.generator

            def run(model, x, y, *arguments):
                attack = template.replace(**dict(zip(names, arguments, strict=True)))
                x_adv = attack(_inference(model), x, y, seed=generator)
                labels = _labels(model, x_adv)
                return (x_adv, labels) if points else labels

            outputs = self._call((template, points), run, x, y, *values.values())
        if points:
            return tuple(keras.ops.convert_to_numpy(t) for t in outputs)
        return keras.ops.convert_to_numpy(outputs)

    def _pgd_on_host(self, attack: Attack, x, y, values: dict) -> tuple:
        # `pgd` itself, its pieces compiled and driven from the host: the
        # start, chunks of HOST_CHUNK unrolled steps and the verdict between
        # restarts, joined by `worst_of_restarts` (one seeding of restarts).
        eps, step_size = values["eps"], values["step_size"]
        threat = dict(
            norm=attack.norm, clip_min=attack.clip_min, clip_max=attack.clip_max
        )
        kind, generator = tuple(threat.values()), self._compiled.generator
        random_start = attack.random_start

        def start_at(model, x, eps, *pair):
            # Run 0 draws from the runner's stream, later runs from a pair.
            seed = pair[0] if pair else generator
            return pgd_start(x, eps=eps, random_start=random_start, seed=seed, **threat)

        def start(seed):
            from_stream = seed is None or seed is self.generator
            pair = () if from_stream else (np.asarray(seed),)
            key = ("pgd_start", random_start, *kind)
            return self._call(key, start_at, x, eps, *pair)

        def chunk(steps):
            def run(model, x, y, x_adv, eps, step_size):
                return pgd_steps(
                    _inference(model),
                    x,
                    y,
                    x_adv,
                    steps=steps,
                    eps=eps,
                    step_size=step_size,
                    loss_fn=None,
                    loss_scale=None,
                    **threat,
                )

            return run

        def advance(x_adv):
            full, rest = divmod(attack.steps, HOST_CHUNK)
            for steps in [HOST_CHUNK] * full + [rest] * (rest > 0):
                key = ("pgd_steps", steps, *kind)
                x_adv = self._call(key, chunk(steps), x, y, x_adv, eps, step_size)
            return x_adv

        def result(model, x_adv, y):
            return outcome(_inference(model), x_adv, y)

        def judge(x_adv):
            return tuple(self._call(("pgd_result",), result, x_adv, y))

        best = worst_of_restarts(
            start,
            advance,
            judge,
            restarts=int(attack.restarts),
            seed=self.generator,
            random_start=random_start,
        )
        return best, self._call(("predict",), _labels, best)

    def _on_host(self, attack: Attack, x, y) -> tuple:
        # The attack itself, on `Pieces` compiled for this model: its loops
        # run from the host over compiled chunks, its draws from the
        # runner's stream as in the compiled attack.
        def compile(key, fn, *arrays):
            return self._call(key, lambda model, *a: fn(_inference(model), *a), *arrays)

        x_adv = attack(Pieces(compile=compile), x, y, seed=self.generator)
        x_adv = keras.ops.convert_to_numpy(x_adv)
        return x_adv, self._call(("predict",), _labels, x_adv)

    def _call(self, key: tuple, fn: Callable, *arrays):
        """`fn(model, *arrays)` compiled once per `key` and signature for
        this model, run on this runner's random stream."""
        key = (*key, signature(*arrays))
        compiled = self._compiled
        if key not in compiled.functions:
            compiled.functions[key] = compiled.compile(fn, key[-1])
        compiled.generator.state.assign(self.generator.state.value)
        outputs = compiled.functions[key](*arrays)
        self.generator.state.assign(compiled.generator.state.value)
        return outputs


# The methods whose loops a `HOST_LOOPS` backend runs from the host, as
# `Pieces` (PGD: `_pgd_on_host`).
HOST_DRIVEN = ("apgd_ce", "apgd_dlr", "fab_t", "square")


def _inference(model):
    return lambda z: model(z, training=False)


def _labels(model, x):
    return keras.ops.argmax(model(x, training=False), axis=-1)


class _Compiled:
    def __init__(self, model: keras.Model):
        self.model = weakref.ref(model)
        self.functions: dict[Any, Callable] = {}
        self.generator = keras.random.SeedGenerator(0)
        self.traces = 0

    def compile(self, fn: Callable, spec: tuple) -> Callable:
        model_ref = self.model

        def traced(*arrays):
            self.traces += 1
            return fn(model_ref(), *arrays)

        return compile_on(model_ref(), traced, spec, self.generator)


_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def signature(*arrays: np.ndarray) -> tuple:
    """`advtrain.backend.compile_function`'s signature for batches like
    `arrays`: the first dimension left open (scalars stay scalars)."""
    return tuple(((None, *a.shape[1:]) if a.ndim else (), a.dtype.name) for a in arrays)


def compile_on(
    model: keras.Model,
    fn: Callable,
    spec: tuple,
    generator: Optional[keras.random.SeedGenerator] = None,
) -> Callable:
    """`fn` compiled for arguments like `spec` (`signature`), reading
    `model`'s variables and advancing `generator`'s stream."""
    state = [] if generator is None else [generator.state]
    return backend.compile_function(fn, spec, [*model.variables, *state], state)


# Placeholders for the fields AttackRunner passes as arguments.
_UNSET = {"eps": 0.0, "steps": 1, "step_size": None, "restarts": 1}


def _graph_arguments(attack: Attack, dtype) -> dict[str, np.ndarray]:
    values = {"eps": np.asarray(attack.eps, dtype)}
    if attack.method == "pgd" and attack.backend == "advtrain":
        step_size = attack.step_size
        if step_size is None:
            step_size = default_step_size(attack.eps, attack.steps)
        values["steps"] = np.asarray(attack.steps, np.int32)
        values["step_size"] = np.asarray(step_size, dtype)
        values["restarts"] = np.asarray(attack.restarts, np.int32)
    return values


def seeded_subset(
    batches: Iterable, count: int, seed: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """A uniformly random subset of `count` examples, in stream order, and
    the number of examples the stream held: `(x, y, total)`.

    Each example draws a key from a generator seeded with `seed` and the
    `count` smallest keys win, so the subset does not depend on the batch
    size; one pass, holding at most `count` examples plus one batch.
    """
    rng = np.random.default_rng(seed)
    kept, total = None, 0
    for x, y in batches:
        batch = {"x": np.asarray(x), "y": np.asarray(y)}
        batch["key"] = rng.random(len(batch["y"]))
        total += len(batch["y"])
        kept = smallest_keys(batch if kept is None else concat([kept, batch]), count)
    if kept is None:
        return np.zeros((0,)), np.zeros((0,), np.int64), 0
    return kept["x"], kept["y"], total


def _batch_count(batches: Iterable) -> Optional[int]:
    try:
        return len(batches)  # tf.data with a known cardinality, lists
    except TypeError:
        return None


def _array_batches(x: np.ndarray, y: np.ndarray, batch_size: int) -> list:
    starts = range(0, len(y), batch_size)
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in starts]


class _PyDatasetBatches:
    def __init__(self, dataset: keras.utils.PyDataset):
        if dataset.num_batches is None:
            raise ValueError(
                "evaluate needs a PyDataset with a length (`__len__`): an "
                f"infinite one never ends. Received: data={dataset!r}"
            )
        self.dataset = dataset

    def __len__(self) -> int:
        return self.dataset.num_batches

    def __iter__(self):
        return (tuple(self.dataset[i])[:2] for i in range(len(self)))


def _batches_of(data: Any, batch_size: int) -> Iterable:
    if isinstance(data, tuple):
        x, y = (np.asarray(part) for part in data)
        return _array_batches(x, y, batch_size)
    if isinstance(data, keras.utils.PyDataset):
        return _PyDatasetBatches(data)
    if isinstance(data, np.ndarray) or not isinstance(data, Iterable):
        raise TypeError(
            "data must be a tuple (x, y) of arrays, a keras.utils.PyDataset, "
            "a tf.data.Dataset or an iterable of (x, y) batches. "
            f"Received: data of type {type(data).__name__}"
        )
    return data


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
    strategy: Optional[Any] = None,
    return_examples: Union[bool, int] = False,
    **attack_keys: Any,
) -> dict[str, Any]:
    """Accuracy of `model` on clean and attacked batches; the headline is
    the worst case per example over every attack, AutoAttack included.

    `max_examples` evaluates a seeded random subset (`seeded_subset`),
    not the first N (test splits stored in class order). The other
    arguments are `evaluate`'s, plus `default_eps` (eps when `eps` is
    None), `progress` (called with a line per batch) and `strategy` (the
    `tf.distribute` strategy whose scope the attacks run in).

    Returns:
        A JSON-ready dict: `robust_accuracy` (right on clean and under
        every attack, per example), `robust_accuracy_ci95` (Wilson),
        `robust_accuracy_over`, `robust_accuracy_ensemble` (None without
        AutoAttack), `examples`, `clean_accuracy`, `<attack>_accuracy` and
        `<attack>_attack`; `autoattack` (per cascade step) and
        `autoattack_<member>_accuracy`; `gradient_free_only` (the masking
        check's count); `macro_f1`, `eps_sweep`, per-class tables,
        `subset_of`; with `return_examples`, `adversarial_examples`.
    """
    check_keywords("evaluate_robustness", attack_keys, ATTACK_KEYS)
    total, batch_count = None, _batch_count(batches)
    if max_examples is not None:
        x_all, y_all, total = seeded_subset(batches, max_examples, seed)
        batches = _array_batches(x_all, y_all, batch_size)
        batch_count = -(-len(y_all) // batch_size)
    chosen = evaluation_attacks(default_eps=default_eps, **attack_keys)
    keys = {"eps": None, "norm": "inf", "fgsm": True, "pgd_steps": 20, **attack_keys}
    eps = default_eps if keys["eps"] is None else keys["eps"]
    names = listed_attacks(keys.get("attacks"), keys["fgsm"], keys["pgd_steps"])
    ensemble = {}
    if "autoattack" in names:
        ensemble = ensemble_attacks(
            eps, keys["norm"], budget, keys.get("square_queries"), num_classes
        )
    recorder = _recorder(return_examples, seed, eps, keys["norm"])
    start = time.perf_counter()
    with strategy_scope(strategy):
        labels, predicted, standing = _predict(
            model, batches, chosen, seed, batch_count, progress, ensemble, recorder
        )
        if ensemble:
            steps = run_cascade(
                AttackRunner(model, seed + 1),
                ensemble,
                *standing,
                batch_size=batch_size,
                label=f"AutoAttack ({budget})",
                record=None if recorder is None else recorder.cascaded,
            )["steps"]
    result = _summary(labels, predicted, chosen, num_classes)
    n = len(labels)
    if ensemble:
        _ensemble_summary(result, steps, len(standing[1]), n, ensemble, budget)
    low, high = wilson_interval(round(result["robust_accuracy"] * n), n)
    result["robust_accuracy_ci95"] = [low, high]
    result["robust_accuracy_worst"] = result["robust_accuracy"]
    result["robust_accuracy_worst_over"] = result["robust_accuracy_over"]
    result["seconds"] = round(time.perf_counter() - start, 2)
    if total is not None:
        result.update(subset_of=total, subset_seed=seed)
    if recorder is not None:
        result["adversarial_examples"] = recorder.result()
    return result


def strategy_scope(strategy: Optional[Any]):
    """`strategy`'s scope (a `tf.distribute` strategy), or none."""
    return contextlib.nullcontext() if strategy is None else strategy.scope()


def _recorder(return_examples: Union[bool, int], seed: int, eps, norm):
    if return_examples is False or return_examples is None:
        return None
    if return_examples is True:
        return ExampleRecorder(seed=seed, eps=eps, norm=norm)
    if isinstance(return_examples, bool) or not isinstance(return_examples, int):
        raise TypeError(
            "return_examples must be True, False or a number of examples. "
            f"Received: return_examples={return_examples!r}"
        )
    if return_examples < 1:
        raise ValueError(
            "return_examples must be at least 1 when a number. "
            f"Received: return_examples={return_examples!r}"
        )
    return ExampleRecorder(limit=return_examples, seed=seed, eps=eps, norm=norm)


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
    return_examples: Union[bool, int] = False,
    **keys: Any,
) -> dict[str, Any]:
    """Robust accuracy of a classifier as a reviewer would measure it.

    `robust_accuracy` is the worst case per example over clean, FGSM, PGD
    and AutoAttack (APGD-CE, APGD-T, FAB-T, Square as a cascade; the cheap
    budget leaves out FAB-T) at `eps`, with its 95% interval; `verdict`
    says whether to trust it (`advtrain.evaluation.verdict.run_verdict`
    from this result alone); the other keys are `evaluate_robustness`'s.

    Args:
        model: maps [0, 1] pixels to logits (an `AdversarialModel` is
            evaluated through its classifier).
        data: `(x, y)` arrays (float pixels in [0, 1], integer labels), or
            batches of them: a `keras.utils.PyDataset`, a `tf.data.Dataset`
            (TensorFlow) or any iterable of `(x, y)` array pairs.
        eps: the threat model's radius, in pixel units.
        norm: the threat model's norm, "inf" or 2.
        attacks: names from `EVALUATION_ATTACKS`; None runs FGSM, PGD and
            AutoAttack.
        budget: AutoAttack's budget, "standard" or "cheap" (`BUDGETS`).
        batch_size: examples per attacked batch.
        max_examples: evaluate a seeded random subset of this size.
        seed: seed of the subset and of the attacks' random starts.
        num_classes: default: the model's number of logits.
        return_examples: True adds `adversarial_examples` to the result:
            the worst-case adversarial input of every example evaluated,
            with its verdict (`AdversarialExamples`); a number keeps at
            most that many (a random subset drawn with `seed`).
        **keys: the other keywords that choose the attacks (`fgsm`,
            `pgd_steps`, `pgd_step_size`, `pgd_restarts`, `apgd_steps`,
            `apgd_restarts`, `square_queries`, `eps_sweep`); any other
            name is a TypeError naming the closest.

    Example:

    ```python
    result = advtrain.evaluate(model, (x_test, y_test), eps=0.3)
    print(result["robust_accuracy"], result["robust_accuracy_ci95"])

    found = advtrain.evaluate(
        model, (x_test, y_test), eps=0.3, return_examples=True
    )["adversarial_examples"]
    print(found.attack[~found.robust])  # which attack broke each
    ```
    """
    check_keywords("evaluate", keys, [k for k in ATTACK_KEYS if k not in _OWN])
    listed_attacks(attacks, keys.get("fgsm", True), keys.get("pgd_steps", 20))
    model = getattr(model, "classifier", model)
    result = evaluate_robustness(
        model,
        _batches_of(data, batch_size),
        default_eps=eps,
        num_classes=num_classes or int(model.output_shape[-1]),
        norm=norm,
        attacks=attacks,
        budget=budget,
        batch_size=batch_size,
        max_examples=max_examples,
        seed=seed,
        return_examples=return_examples,
        **keys,
    )
    # From the evaluation alone; a run adds its guard and sanity checks.
    result["verdict"] = run_verdict(evaluation=result)
    return result


# `evaluate`'s own arguments among `ATTACK_KEYS`.
_OWN = ("eps", "norm", "attacks")


def evaluate_keywords() -> list[str]:
    """The keyword arguments `evaluate` takes, for callers that check
    theirs before a long run (`advtrain.fit`)."""
    import inspect

    own = [p for p in inspect.signature(evaluate).parameters if p not in _SKIP]
    return own + [k for k in ATTACK_KEYS if k not in own]


_SKIP = ("model", "data", "keys")


def run_cascade(
    runner: AttackRunner,
    attacks: dict[str, Attack],
    x: np.ndarray,
    y: np.ndarray,
    *,
    batch_size: int = 256,
    label: str = "cascade",
    record: Optional[Callable] = None,
) -> dict[str, Any]:
    """Runs `attacks` in order, each only on the examples (of `x`, `y`:
    those standing so far) every earlier one left correctly classified
    (AutoAttack's cascade).

    Returns `robust` (a boolean per example: right after every attack) and
    `steps`: per attack its name, settings, the examples it `attacked` and
    `broken`, and `seconds`. `record`, if given, is called per batch with
    the attack's name, the rows attacked, their `x_adv` and labels.
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
            if record is None:
                labels = runner(attack, x[index], y[index])
            else:
                x_adv, labels = runner.adversarial(attack, x[index], y[index])
                record(name, index, x_adv, labels)
            robust[index] = labels == y[index]
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


def _predict(model, batches, attacks, seed, batch_count, progress, keep, recorder):
    """Labels and each attack's predicted labels; with `keep`, the
    examples right under every attack, for the cascade."""
    names = ["clean", *(n for n in attacks if not n.startswith("sweep_"))]
    sweep = sum(n.startswith("sweep_") for n in attacks)
    names += [f"eps sweep x{sweep}"] if sweep else []
    bar = Progress(
        f"evaluating ({', '.join(names)})", batch_count, unit="batches", keep=True
    )
    runner = AttackRunner(model, seed)
    labels, predicted, kept, seen = [], {}, [], 0
    for x, y in batches:
        x, y = np.asarray(x), np.asarray(y).astype(np.int64)
        labels.append(y)
        clean = runner.predict(x).astype(np.int64)
        predicted.setdefault("clean", []).append(clean)
        if recorder is not None:
            recorder.start(x, y, clean)
        right = clean == y
        for name, attack in attacks.items():
            if recorder is None:
                preds = runner(attack, x, y)
            else:
                x_adv, preds = runner.adversarial(attack, x, y)
            predicted.setdefault(name, []).append(preds)
            if not name.startswith("sweep_"):
                right &= preds == y
                if recorder is not None:
                    recorder.attacked(name, x_adv, preds)
        if recorder is not None:
            recorder.keep()
        if keep:
            kept.append((x[right], y[right]))
        seen += len(y)
        bar.update(len(labels), f"{seen} examples")
        if progress is not None:
            progress(f"evaluated {seen} examples")
    bar.close()
    if seen == 0:
        raise ValueError("Evaluation got no examples: the test split is empty.")
    predicted = {name: np.concatenate(p) for name, p in predicted.items()}
    standing = None
    if keep:
        standing = tuple(np.concatenate(part) for part in zip(*kept, strict=True))
    return np.concatenate(labels), predicted, standing


def _summary(labels, predicted, attacks, num_classes: int) -> dict[str, Any]:
    clean = predicted["clean"]
    robust = clean == labels
    result: dict[str, Any] = {
        "robust_accuracy": float(np.mean(robust)),
        "robust_accuracy_over": ["clean"],
        "robust_accuracy_ensemble": None,
        "examples": len(labels),
        "clean_accuracy": float(np.mean(clean == labels)),
        "macro_f1": macro_f1(labels, clean, num_classes),
        "per_class_accuracy": per_class_accuracy(labels, clean, num_classes),
        "class_support": np.bincount(labels, minlength=num_classes).tolist(),
    }
    gradient_robust = robust.copy()
    chosen = [name for name in attacks if not name.startswith("sweep_")]
    for name in chosen:
        right = predicted[name] == labels
        robust &= right
        if name not in GRADIENT_FREE:
            gradient_robust &= right
        result[f"{name}_accuracy"] = float(np.mean(right))
        result[f"{name}_attack"] = attacks[name].get_config()
    result["robust_accuracy_over"] += chosen
    result["robust_accuracy"] = float(np.mean(robust))
    if any(name in GRADIENT_FREE for name in chosen):
        result["gradient_free_only"] = int(np.sum(gradient_robust & ~robust))
    if "pgd" in attacks:
        pgd = predicted["pgd"]
        result["pgd_macro_f1"] = macro_f1(labels, pgd, num_classes)
        result["pgd_per_class_accuracy"] = per_class_accuracy(labels, pgd, num_classes)
    sweep = [
        {"eps": attack.eps, "accuracy": float(np.mean(predicted[name] == labels))}
        for name, attack in attacks.items()
        if name.startswith("sweep_")
    ]
    if sweep:
        result["eps_sweep"] = sweep
    return result


def _ensemble_summary(result, steps, standing: int, n: int, ensemble, budget: str):
    for step in steps:
        standing -= step["broken"]
        step["robust_accuracy_after"] = standing / n
        result[f"autoattack_{step['attack']}_accuracy"] = standing / n
    result["autoattack"] = {"budget": budget, "steps": steps}
    result["robust_accuracy"] = standing / n
    result["robust_accuracy_over"] += list(ensemble)
    members = ", ".join(CASCADE_LABELS[m] for m in ensemble)
    result["robust_accuracy_ensemble"] = f"AutoAttack ({members}), {budget} budget"
    # In the cascade the gradient-free attack only sees the examples every
    # gradient attack failed on: what it breaks, only it broke.
    free = sum(s["broken"] for s in steps if s["attack"] in GRADIENT_FREE)
    result["gradient_free_only"] = result.get("gradient_free_only", 0) + free


def plot_eps_sweep(sweep: list[dict[str, float]], path: Path, title: str = "") -> Path:
    """Writes accuracy against eps as a PNG (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=120)
    ax.plot([p["eps"] for p in sweep], [p["accuracy"] for p in sweep], marker="o")
    ax.set_xlabel("eps (pixel units, [0, 1] scale)")
    ax.set_ylabel("accuracy under PGD")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return Path(path)
