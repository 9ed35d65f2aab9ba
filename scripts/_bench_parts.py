"""Pieces shared by scripts/bench_backends and scripts/gpu_check: MNIST,
the `mnist_fast` recipe's model, step timing on Keras's own compiled train
function, and the standard AutoAttack set through the attacks API.

Backend-neutral (TensorFlow or JAX, set before import). Where a library
piece still imports TensorFlow (the MNIST reader's package, the recipe's
model builder, `OneCycle`, `ensemble_attacks`, `seeded_subset`), the
library's own is used when it imports and a small stand-in otherwise: the
stand-ins go once `advtrain.data`, `advtrain.recipe.build`,
`advtrain.train.runtime` and `advtrain.evaluation.robustness` import
without TensorFlow.
"""

from __future__ import annotations

import gzip
import statistics
import time
from pathlib import Path

import keras
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "advtrain" / "recipes" / "mnist_fast.yaml"
STANDARD = {"apgd_steps": 100, "targets": 9, "fab_steps": 100, "queries": 5000}


def mnist_folder(explicit=None) -> Path:
    """`explicit`, else the GPU bundle's copy, else the shared MNIST."""
    if explicit:
        return Path(explicit)
    bundled = ROOT / ".gpu_bundle" / "mnist"
    return bundled if bundled.is_dir() else ROOT.parent / "shared" / "data" / "mnist"


def read_mnist(folder: Path):
    """(x_train, y_train, x_test, y_test): float32 pixels in [0, 1] of shape
    (N, 28, 28, 1), int64 labels, from the four IDX files in `folder`."""
    try:
        from advtrain.data.mnist import load_mnist_idx
    except ImportError:  # advtrain.data imports TensorFlow (datasets)
        splits = {s: (_idx(folder, s, "images"), _idx(folder, s, "labels"))
                  for s in ("train", "t10k")}  # fmt: skip
        splits["test"] = splits.pop("t10k")
    else:
        splits, _ = load_mnist_idx(folder)
    out = []
    for split in ("train", "test"):
        x, y = splits[split]
        x = np.asarray(x, np.float32).reshape(-1, 28, 28, 1) / 255.0
        out += [x, np.asarray(y, np.int64)]
    return tuple(out)


def _idx(folder: Path, split: str, kind: str) -> np.ndarray:
    name = f"{split}-{kind}-idx{3 if kind == 'images' else 1}-ubyte"
    path = folder / name
    raw = path.read_bytes() if path.is_file() else gzip.open(f"{path}.gz").read()
    dims = raw[3]
    shape = np.frombuffer(raw, ">u4", dims, 4)
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)


def mnist_fast_recipe(overrides=()):
    """The recipe, validated; where validation cannot import (it checks the
    data source in `advtrain.data`, which imports TensorFlow), its YAML as
    sections of attributes with `overrides` (`section.key=value`) applied."""
    try:
        from advtrain.recipe.loader import load_recipe

        return load_recipe(RECIPE, list(overrides))
    except ImportError:
        import types

        import yaml

        raw = yaml.safe_load(RECIPE.read_text())
        for item in overrides:
            key, value = item.split("=", 1)
            section, name = key.split(".")
            raw[section][name] = yaml.safe_load(value)
        raw["train"].setdefault("seed", 0)
        return types.SimpleNamespace(
            **{
                k: types.SimpleNamespace(**v)
                for k, v in raw.items()
                if isinstance(v, dict)
            }
        )


def mnist_classifier(recipe) -> keras.Model:
    from advtrain.models.classifier import build_classifier

    return build_classifier(
        (28, 28, 1), 10, backbone=recipe.model.backbone, width=recipe.model.width
    )


def mnist_fast_model(recipe, classifier, steps_per_epoch: int) -> keras.Model:
    """The recipe's training model (TRADES with PGD-2, eps ramp), compiled
    with its optimizer and one-cycle schedule, as `advtrain run` builds
    them (no catastrophic-overfitting guard)."""
    if hasattr(recipe, "model_dump"):  # validated (`mnist_fast_recipe`)
        from advtrain.recipe.build import build_training_model

        model = build_training_model(recipe, classifier, steps_per_epoch)
    else:
        model = _training_model(recipe, classifier, steps_per_epoch)
    train = recipe.train
    total = steps_per_epoch * train.epochs
    warmup = steps_per_epoch * train.warmup_epochs
    try:
        from advtrain.train.runtime import OneCycle
    except ImportError:  # the runtime imports TensorFlow
        OneCycle = _OneCycle
    model.compile(
        optimizer=keras.optimizers.Adam(OneCycle(train.learning_rate, warmup, total)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _training_model(recipe, classifier, steps_per_epoch: int):
    from advtrain.attacks import Attack
    from advtrain.models.objectives import objectives

    cfg = recipe.attack
    attack = Attack(cfg.method, eps=cfg.eps, steps=cfg.steps,
                    step_size=cfg.step_size, random_start=cfg.random_start)  # fmt: skip
    ramp = max(1, round(cfg.eps_ramp_epochs * steps_per_epoch))
    return objectives.get(cfg.objective)(
        classifier, attack, seed=recipe.train.seed, adv_weight=cfg.adv_weight,
        eps_ramp_steps=ramp if cfg.eps_ramp_epochs else 0,
        **cfg.objective_options,
    )  # fmt: skip


class _OneCycle(keras.optimizers.schedules.LearningRateSchedule):
    """advtrain.train.runtime.OneCycle's triangle, where that module does
    not import (TensorFlow missing)."""

    def __init__(self, peak, warmup_steps, total_steps):
        self.peak, self.warmup, self.total = peak, max(warmup_steps, 1), total_steps

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        down = (self.total - step) / max(self.total - self.warmup, 1)
        rate = keras.ops.where(step < self.warmup, step / self.warmup, down)
        return self.peak * keras.ops.clip(rate, 0.0, 1.0)


# ---------------------------------------------------------------- timing
class StepTimer(keras.callbacks.Callback):
    """Seconds per step between the ends of a fit's first and last steps."""

    def on_train_begin(self, logs=None):
        self.marks = []

    def on_train_batch_end(self, batch, logs=None):
        self.marks.append(time.perf_counter())

    def seconds_per_step(self) -> float:
        return (self.marks[-1] - self.marks[0]) / (len(self.marks) - 1)


def time_fit(model, x, y, batch: int, steps: int, rounds: int) -> float:
    """Median seconds per `fit` step over `rounds` epochs of `steps` steps,
    after one warm-up epoch (tracing, compilation)."""
    timer, times = StepTimer(), []
    n = batch * steps
    for r in range(rounds + 1):
        model.fit(x[:n], y[:n], batch_size=batch, epochs=1, verbose=0,
                  shuffle=False, callbacks=[timer])  # fmt: skip
        if r:
            times.append(timer.seconds_per_step())
    return statistics.median(times)


def compiled(fn):
    """`fn` traced once, as the backend runs a step (PyTorch: eagerly, as
    Keras's torch trainer runs by default)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, reduce_retracing=True)
    if backend == "torch":
        return fn
    import jax

    return jax.jit(fn)


# ------------------------------------------------------------ AutoAttack
def autoattack_set(eps: float, apgd_steps: int, targets: int, fab_steps: int,
                   queries: int) -> dict:  # fmt: skip
    """AutoAttack's standard set in cascade order (APGD-CE, APGD-T, FAB-T,
    Square), as `advtrain.evaluation.robustness.ensemble_attacks` builds it
    at the standard budget (`STANDARD`), smaller where asked."""
    from advtrain.attacks import Attack

    return {
        "APGD-CE": Attack("apgd_ce", eps=eps, steps=apgd_steps),
        "APGD-T": Attack("apgd_dlr", eps=eps, steps=apgd_steps, targets=targets),
        "FAB-T": Attack("fab_t", eps=eps, steps=fab_steps, targets=targets),
        "Square": Attack("square", eps=eps, queries=queries),
    }


def run_attacks(model, attacks: dict, x, y, batch: int, cascade: bool = True):
    """Each attack compiled once and run over `x` in batches: in cascade
    (each on the examples still right) or each on every example. Returns
    (right after all: bool per example, {name: (seconds, examples)})."""
    right = np.argmax(_logits(model, x, batch), -1) == y
    times = {}
    for name, attack in attacks.items():
        fn = compiled(lambda a, b, attack=attack: keras.ops.argmax(
            model(attack(lambda z: model(z, training=False), a, b, seed=0),
                  training=False), -1))  # fmt: skip
        index = np.flatnonzero(right) if cascade else np.arange(len(y))
        start = time.perf_counter()
        for first in range(0, len(index), batch):
            part = index[first : first + batch]
            labels = keras.ops.convert_to_numpy(fn(x[part], y[part]))
            right[part] &= labels == y[part]
        times[name] = (time.perf_counter() - start, len(index))
    return right, times


def _logits(model, x, batch: int) -> np.ndarray:
    return np.concatenate([
        keras.ops.convert_to_numpy(model(x[i : i + batch], training=False))
        for i in range(0, len(x), batch)
    ])  # fmt: skip


def seeded_indices(total: int, count: int, seed: int) -> np.ndarray:
    """The rows `advtrain.evaluation.robustness.seeded_subset` picks from
    `total` examples in one batch, in order."""
    try:
        from advtrain.evaluation.robustness import seeded_subset
    except ImportError:  # evaluation imports TensorFlow until evaljax
        keys = np.random.default_rng(seed).random(total)
        return np.sort(np.argpartition(keys, count - 1)[:count])
    rows = np.arange(total)
    return seeded_subset([(rows, rows)], count, seed)[0]


def evaluate_on_backend() -> bool:
    """Whether `advtrain.evaluate` runs on the current Keras backend: it
    imports and evaluates a two-image, one-layer model with FGSM."""
    import advtrain

    inputs = keras.Input((2, 2, 1))
    probe = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(inputs)))
    x, y = np.zeros((2, 2, 2, 1), np.float32), np.zeros((2,), np.int64)
    try:
        advtrain.evaluate(probe, (x, y), eps=0.1, attacks=["fgsm"], batch_size=2)
    except (ImportError, NotImplementedError, TypeError):
        return False
    return True
