"""`run(recipe)`: wires data, model, attack and runtime; owns the run folder.

A run folder holds:
    recipe.yaml      the resolved recipe (after --set overrides)
    checkpoints/     atomic `.keras` checkpoints (model + optimizer)
    logs/            TensorBoard logs
    history.csv      one row per epoch
    model.keras      the trained classifier: raw [0, 1] pixels in, logits out
    metrics.json     clean / FGSM / PGD accuracy, macro F1, timing
    eps_sweep.png    accuracy against eps (when eval.eps_sweep is set)
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from pathlib import Path
from typing import Any, Callable, Optional, Union

import keras

from advtrain.attacks import Attack
from advtrain.config import AttackConfig, Recipe, RecipeError
from advtrain.io import atomic_path, atomic_write_json, atomic_write_text

Echo = Callable[[str], None]


@dataclasses.dataclass
class RunResult:
    output_dir: Path
    metrics: dict[str, Any]
    history: dict[str, list[float]]


def attack_from_config(cfg: AttackConfig) -> Optional[Attack]:
    """The training attack a recipe's attack section describes."""
    if cfg.method == "none":
        return None
    method = "pgd" if cfg.method == "trades" else cfg.method
    return Attack(
        method,
        eps=cfg.eps,
        norm=cfg.norm,
        alpha=cfg.alpha,
        steps=cfg.steps,
        step_size=cfg.step_size,
        random_start=cfg.random_start,
        backend=cfg.backend,
    )


def build_training_model(recipe: Recipe, classifier: keras.Model) -> keras.Model:
    """AdversarialModel (or TRADES) around `classifier` per the recipe."""
    from advtrain.models.adversarial import AdversarialModel
    from advtrain.models.trades import TRADES

    cfg = recipe.attack
    attack = attack_from_config(cfg)
    if cfg.method == "trades":
        return TRADES(
            classifier, attack, beta=cfg.beta, attack_mode=cfg.mode,
            seed=recipe.train.seed,
        )
    return AdversarialModel(
        classifier,
        attack,
        adv_weight=cfg.adv_weight if attack is not None else 0.0,
        attack_mode=cfg.mode,
        seed=recipe.train.seed,
    )


def resolve_output_dir(recipe: Recipe, output: Optional[Union[str, Path]]) -> Path:
    """The run folder; refuses one that already holds another run."""
    if output is None and recipe.output.dir:
        output = recipe.output.dir
    if output is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        output = Path("runs") / f"{recipe.name}-{stamp}"
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise RecipeError(f"--output {output}: exists and is not a folder.")
    if output.is_dir() and any(output.iterdir()):
        raise RecipeError(
            f"--output {output}: folder is not empty; choose a new folder so "
            "an earlier run is never overwritten."
        )
    return output


def _compile(model: keras.Model, optimizer, plan, runtime) -> None:
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        steps_per_execution=plan.steps_per_execution,
        jit_compile=runtime.jit_compile,
    )


def run(
    recipe: Recipe,
    output: Optional[Union[str, Path]] = None,
    *,
    echo: Echo = print,
    verbose: int = 0,
) -> RunResult:
    """Trains and evaluates a recipe; returns the metrics written to disk.

    Args:
        recipe: a validated recipe.
        output: run folder (default `output.dir` or `runs/NAME-TIMESTAMP`).
        echo: receives progress lines.
        verbose: Keras progress bar level (0: one line per epoch via echo).

    Example:

    ```python
    from advtrain.config import load_recipe
    result = run(load_recipe("recipes/quickstart.yaml"), "runs/demo")
    result.metrics["pgd_accuracy"]
    ```
    """
    from advtrain.data import load_splits, make_input
    from advtrain.evaluation import evaluate_robustness, plot_eps_sweep
    from advtrain.models.classifier import build_classifier
    from advtrain.runtime import make_optimizer, make_runtime, plan_batches
    from advtrain.callbacks import AtomicCheckpoint, ProgressLine
    from advtrain.models.batchnorm import (
        apply_batchnorm_policy,
        bn_gap,
        bn_gap_warning,
        recalibrate_batchnorm,
    )
    from advtrain.models.freezing import apply_phase, phases

    out = resolve_output_dir(recipe, output)
    keras.utils.set_random_seed(recipe.train.seed)
    runtime = make_runtime(recipe.runtime)
    splits = load_splits(recipe.data)
    plan = plan_batches(recipe.train, runtime, splits.train_size)
    attack = attack_from_config(recipe.attack)
    echo(
        f"data: {recipe.data.source} {splits.train_size} train / "
        f"{splits.val_size} val / {splits.test_size} test, image "
        f"{'x'.join(map(str, splits.image_shape))}, {splits.num_classes} classes"
    )
    echo(
        f"runtime: {runtime.strategy_name} strategy on {runtime.device_kind}, "
        f"{runtime.replicas} replica(s), {runtime.precision}, "
        f"XLA {'on' if runtime.jit_compile else 'off'}"
    )
    echo(plan.describe())
    echo(
        "attack: none (clean training)"
        if attack is None
        else f"attack: {recipe.attack.method} eps={attack.eps:g} "
        f"norm={attack.norm} adv_weight={recipe.attack.adv_weight:g} "
        f"backend={attack.backend} mode={recipe.attack.mode}"
    )

    with runtime.strategy.scope():
        classifier = build_classifier(
            recipe.model, splits.image_shape, splits.num_classes
        )
        apply_batchnorm_policy(classifier, recipe.model.batchnorm)
        model = build_training_model(recipe, classifier)

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "recipe.yaml", recipe.to_yaml())
    train_ds = make_input(
        splits.train, recipe.data, batch_size=plan.global_batch, training=True
    ).repeat()
    val_ds = None
    if splits.val is not None:
        val_ds = make_input(
            splits.val, recipe.data, batch_size=recipe.eval.batch_size,
            training=False,
        )
    progress = ProgressLine(
        echo, plan.epochs, plan.steps_per_epoch * plan.global_batch
    )
    callbacks: list[keras.callbacks.Callback] = [
        progress,
        keras.callbacks.CSVLogger(str(out / "history.csv"), append=True),
        keras.callbacks.TerminateOnNaN(),
        AtomicCheckpoint(
            out / "checkpoints",
            every_epochs=recipe.output.checkpoint_every_epochs,
            keep=recipe.output.keep_checkpoints,
        ),
    ]
    if recipe.output.tensorboard:
        callbacks.append(
            keras.callbacks.TensorBoard(str(out / "logs"), write_graph=False)
        )
    start = time.perf_counter()
    history: dict[str, list[float]] = {}
    for phase in phases(recipe.model, plan.epochs):
        if phase.epochs <= 0:
            continue
        trainable = apply_phase(classifier, phase)
        if phase.name != "train":
            echo(
                f"phase {phase.name}: epochs {phase.start_epoch + 1}-"
                f"{phase.end_epoch}, freeze={phase.freeze}, "
                f"{len(trainable)} backbone layer(s) trainable, "
                f"lr x{phase.lr_factor:g}"
            )
        phase_plan = dataclasses.replace(
            plan, learning_rate=plan.learning_rate * phase.lr_factor
        )
        with runtime.strategy.scope():
            _compile(model, make_optimizer(recipe.train, phase_plan), plan, runtime)
        result = model.fit(
            train_ds,
            initial_epoch=phase.start_epoch,
            epochs=phase.end_epoch,
            steps_per_epoch=plan.steps_per_epoch,
            validation_data=val_ds,
            callbacks=callbacks,
            verbose=verbose,
            shuffle=False,  # the tf.data pipeline shuffles
        )
        for key, values in result.history.items():
            history.setdefault(key, []).extend(values)
    train_seconds = time.perf_counter() - start
    with atomic_path(out / "model.keras") as tmp:
        classifier.save(tmp)

    bn_cfg = recipe.model.batchnorm
    if bn_cfg.recalibrate:
        clean_train = make_input(
            splits.train, recipe.data, batch_size=plan.global_batch,
            training=False,
        )
        count = recalibrate_batchnorm(
            classifier, clean_train, num_batches=bn_cfg.recalibrate_batches
        )
        echo(f"recalibrated {count} BatchNorm layer(s) on clean training data")

    echo("evaluating on the test split ...")
    test_ds = make_input(
        splits.test, recipe.data, batch_size=recipe.eval.batch_size,
        training=False,
    )
    held_out = splits.val if splits.val is not None else splits.test
    gap_x, gap_y = next(iter(make_input(
        held_out, recipe.data, batch_size=512, training=False
    )))
    gap = bn_gap(
        classifier, gap_x.numpy(), gap_y.numpy(),
        batch_size=min(plan.global_batch, len(gap_y)),
    )
    warning = bn_gap_warning(gap["gap"])
    if warning:
        echo(f"warning: {warning}")
    default_eps = recipe.attack.eps
    evaluation = evaluate_robustness(
        classifier,
        test_ds,
        recipe.eval,
        default_eps=default_eps,
        num_classes=splits.num_classes,
    )
    samples = plan.steps_per_epoch * plan.global_batch * plan.epochs
    metrics: dict[str, Any] = {
        "recipe": recipe.name,
        **{k: v for k, v in evaluation.items()},
        "bn_gap": gap,
        "train_seconds": round(train_seconds, 2),
        "train_samples_per_second": round(samples / max(train_seconds, 1e-9), 1),
        "epoch_seconds": [round(s, 2) for s in progress.epoch_seconds],
        "final_train_metrics": {k: float(v[-1]) for k, v in history.items() if v},
    }
    if recipe.output.plots and evaluation.get("eps_sweep"):
        plot_eps_sweep(
            evaluation["eps_sweep"], out / "eps_sweep.png", title=recipe.name
        )
    atomic_write_json(out / "metrics.json", metrics)
    return RunResult(out, metrics, history)


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
    """A two-column text table of the headline numbers."""
    rows = []
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
    if "bn_gap" in metrics:
        g = metrics["bn_gap"]
        rows.append((
            "BN gap (train - inference mode)",
            f"{100 * g['gap']:+.2f} points",
        ))
    width = max(len(label) for label, _ in rows) if rows else 0
    return "\n".join(f"  {label:<{width}}  {text}" for label, text in rows)


def load_classifier(path: Union[str, Path], safe_mode: bool = True) -> keras.Model:
    """Loads a saved classifier; `safe_mode` refuses lambda layers."""
    import advtrain.models  # noqa: F401  (registers advtrain's layers)

    return keras.models.load_model(path, safe_mode=safe_mode, compile=False)


def evaluate_saved(
    model_path: Union[str, Path],
    recipe: Recipe,
    *,
    echo: Echo = print,
) -> dict[str, Any]:
    """Evaluates a saved classifier on the recipe's test split.

    When the model sits in a run folder, the result is also written there
    as `eval-metrics.json` (the training run's metrics.json is untouched).
    """
    from advtrain.data import load_splits, make_input
    from advtrain.evaluation import evaluate_robustness

    model_path = Path(model_path)
    splits = load_splits(recipe.data)
    classifier = load_classifier(model_path)
    expected = tuple(classifier.input_shape[1:])
    if expected != tuple(splits.image_shape):
        raise RecipeError(
            f"{model_path}: model takes images {expected} but the recipe's "
            f"data gives {tuple(splits.image_shape)}."
        )
    echo(f"evaluating {model_path} on {splits.test_size} test examples ...")
    test_ds = make_input(
        splits.test, recipe.data, batch_size=recipe.eval.batch_size,
        training=False,
    )
    metrics = evaluate_robustness(
        classifier,
        test_ds,
        recipe.eval,
        default_eps=recipe.attack.eps,
        num_classes=splits.num_classes,
    )
    if (model_path.parent / "recipe.yaml").is_file():
        atomic_write_json(model_path.parent / "eval-metrics.json", metrics)
    return metrics
