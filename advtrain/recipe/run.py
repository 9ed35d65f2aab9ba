"""`run(recipe)`: a recipe's run in three stages, writing its run folder.

The recipe's keys become library calls in `advtrain.recipe.build`; the
folder's rules live in `advtrain.recipe.run_folder`. The stages:

    prepare   runtime, data, model; resume point and checkpoint callbacks
              (`advtrain.train.loop.TrainingState`)
    train     the phases (`advtrain.train.loop.fit_phases`)
    finish    recalibrate BatchNorm, save model.keras, evaluate
              (`advtrain.evaluation`: robustness, sanity checks, report,
              export), metrics.json last

A run folder holds:
    recipe.yaml      the resolved recipe (after --set overrides)
    checkpoints/     atomic checkpoints: model, optimizer and metric variables
                     (advtrain.train.checkpoint)
    logs/            TensorBoard logs
    history.csv      one row per epoch
    model.keras      the trained classifier: raw [0, 1] pixels in, logits out
    metrics.json     clean / FGSM / PGD accuracy, macro F1, timing
    eps_sweep.png    accuracy against eps (when eval.eps_sweep is set)
    adversarial_examples.png  clean, worst-case adversarial and perturbation
                     of 8 seeded test images (in report.md and TensorBoard)
    report.md        recipe, curves, per-class table, sanity checks, timing
    training_curves.png  clean and adversarial accuracy per epoch
    export/saved_model/  TF Serving SavedModel, uint8 images in (export.py)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional, Union

import keras

from advtrain.recipe.build import (
    _keys,
    build_run_model,
    evaluation_keys,
    input_options,
    recipe_phases,
    recipe_plan,
    recipe_runtime,
    recipe_sanity_checks,
    recipe_splits,
)
from advtrain.recipe.keys import recipe_keys
from advtrain.recipe.run_folder import (
    FINISHED_FILE,
    RECIPE_FILE,
    holds_run,
    resolve_output_dir,
    resume_hint,
)
from advtrain.recipe.schema import Recipe, RecipeError
from advtrain.recipe.summary import describe, describe_momentum
from advtrain.train.loop import TrainingState, fit_phases, train_stream
from advtrain.train.preemption import restores_signal_handlers, watch_launcher
from advtrain.train.runtime import OPTIMIZER_KEYS
from advtrain.utils.io import atomic_path, atomic_write_json
from advtrain.utils.progress import Echo


@dataclasses.dataclass
class RunSetup:
    """What the prepare stage built: the parts a run trains and evaluates.

    Attributes:
        runtime: `advtrain.train.runtime.Runtime` (strategy, workers, chief).
        splits: `advtrain.data.DataSplits`.
        plan: `advtrain.train.runtime.BatchPlan` (global batch, steps, epochs).
        classifier: the model that is saved: [0, 1] pixels in, logits out.
        model: the training model around it (AdversarialModel, TRADES).
        data: the data keys `make_input` takes, for the training stream.
        state: the run's `TrainingState`.
    """

    runtime: Any
    splits: Any
    plan: Any
    classifier: keras.Model
    model: keras.Model
    data: dict[str, Any]
    state: TrainingState


@dataclasses.dataclass
class RunResult:
    output_dir: Path
    metrics: dict[str, Any]
    history: dict[str, list[float]]


@restores_signal_handlers
def run(
    recipe: Recipe,
    output: Optional[Union[str, Path]] = None,
    *,
    echo: Echo = print,
    verbose: int = 0,
) -> RunResult:
    """Trains and evaluates a recipe; returns the metrics written to disk.

    The stages: `prepare` (runtime, data, model, resume point), `train`
    (the phases, checkpointed), `finish` (recalibrate, save, evaluate,
    report, export; metrics.json last).

    Args:
        recipe: a validated recipe.
        output: run folder (default `output.dir` or `runs/NAME-TIMESTAMP`).
        echo: receives progress lines.
        verbose: Keras progress bar level (0: one line per epoch via echo).

    Example:

    ```python
    from advtrain.recipe.loader import load_recipe
    result = run(load_recipe("recipes/quickstart.yaml"), "runs/demo")
    result.metrics["pgd_accuracy"]
    ```
    """
    run_dir = resolve_output_dir(recipe, output)
    watch_launcher()  # a worker of `advtrain launch` ends with its launcher
    setup = prepare(recipe, run_dir, echo=echo)
    trained = train(recipe, setup, echo=echo, verbose=verbose)
    return finish(recipe, setup, trained, echo=echo)


# ---------------------------------------------------------------- prepare


def prepare(recipe: Recipe, run_dir: Path, *, echo: Echo = print) -> RunSetup:
    """Stage 1: the runtime, the data and the model, restored from the run
    folder's last checkpoint when it holds one; the checkpoint store and
    callbacks (`advtrain.train.loop.TrainingState`)."""
    keras.utils.set_random_seed(recipe.train.seed)
    runtime = recipe_runtime(recipe)
    state = TrainingState(
        run_dir,
        resuming=holds_run(run_dir),
        workers=runtime.workers,
        resume_hint=resume_hint(run_dir, runtime.workers),
        echo=echo,
    )
    splits = recipe_splits(recipe)
    plan = recipe_plan(recipe, runtime, splits.train_size)
    describe(recipe, splits, runtime, plan, echo)
    with runtime.scope():
        classifier, model = build_run_model(
            recipe,
            splits,
            plan.epochs * plan.steps_per_epoch,
            steps_per_epoch=plan.steps_per_epoch,
        )
    describe_momentum(recipe, classifier, echo)
    if recipe.attack.method != "none":
        reuse = str(recipe.attack.reuse_gradient).lower()
        echo(f"step: {model.step_note}; attack.reuse_gradient: {reuse}")
    monitor, monitor_mode = _monitor(recipe, model, splits.val is not None)
    state.restore(model, steps_per_epoch=plan.steps_per_epoch)
    state.open(
        is_chief=runtime.is_chief,
        epochs=plan.epochs,
        files={RECIPE_FILE: recipe.to_yaml()},
        keep_checkpoints=recipe.output.keep_checkpoints,
        monitor=monitor,
        monitor_mode=monitor_mode,
        checkpoint_every_epochs=recipe.output.checkpoint_every_epochs,
        checkpoint_every_steps=recipe.output.checkpoint_every_steps,
        nan_hint=f"train.learning_rate={recipe.train.learning_rate:g}, "
        f"attack.eps={recipe.attack.eps:g}, "
        f"runtime.precision={recipe.runtime.precision}",
    )
    data = input_options(recipe, training=True)
    return RunSetup(runtime, splits, plan, classifier, model, data, state)


def _monitor(recipe: Recipe, model: keras.Model, has_val: bool) -> tuple[str, str]:
    """`output.monitor` and `output.monitor_mode` resolved for this run."""
    from advtrain.train.checkpoint import resolve_monitor

    with recipe_keys("output"):
        monitor, mode = resolve_monitor(
            recipe.output.monitor,
            recipe.output.monitor_mode,
            has_validation=has_val,
            attacks=recipe.attack.method != "none",
            validates_adversarially=(
                type(model).test_step is not keras.Model.test_step
            ),
        )
    names = ["loss", "accuracy"] + [
        m.name for m in model.metrics if m.name not in ("loss", "compile_metrics")
    ]
    known = names + [f"val_{n}" for n in names] if has_val else names
    if monitor not in known:
        raise RecipeError(
            f"output.monitor={monitor}: not a metric of this run. "
            f"Known: {', '.join(known)}."
        )
    return monitor, mode


# ---------------------------------------------------------------- train


@dataclasses.dataclass
class Trained:
    """What the train stage hands to `finish`."""

    history: dict[str, list[float]]
    seconds: float
    epoch_seconds: list[float]
    co_guard: Optional[dict[str, Any]] = None


def train(recipe: Recipe, setup: RunSetup, *, echo: Echo, verbose: int) -> Trained:
    """Stage 2: the phases (`advtrain.train.loop.fit_phases`), with the
    run's checkpoints, NaN guard and preemption (`setup.state`), progress
    lines, TensorBoard and the catastrophic-overfitting guard."""
    from advtrain.data import make_input
    from advtrain.train.callbacks import ProgressLine
    from advtrain.utils.progress import EpochProgress

    state, plan, splits = setup.state, setup.plan, setup.splits
    val_ds = None
    if splits.val is not None:
        val_ds = make_input(
            splits.val,
            batch_size=recipe.eval.batch_size,
            training=False,
            **input_options(recipe),
        )
    progress = ProgressLine(echo, plan.epochs, plan.steps_per_epoch * plan.global_batch)
    co_guard = _co_guard(recipe, setup, echo) if recipe.train.co_guard else None
    seed = recipe.train.seed
    before = [
        # First: its live bar is cleared before any epoch-end line prints.
        EpochProgress(plan.epochs),
        *([co_guard] if co_guard else []),  # before the logs see the epoch
        state.epoch_start(setup.model, image_shape=splits.image_shape),
        progress,
    ]
    after = []
    if recipe.output.tensorboard:
        logs = str(state.out / "logs")
        after.append(keras.callbacks.TensorBoard(logs, write_graph=False))

    def stream(skip: int):
        return train_stream(
            splits, setup.data, plan, seed, skip, setup.runtime.input_strategy()
        )

    history, seconds = fit_phases(
        setup.model,
        stream,
        runtime=setup.runtime,
        plan=plan,
        phases=recipe_phases(recipe, plan.epochs),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        **_keys(recipe.train, *OPTIMIZER_KEYS[:1]),
        optimizer_options=_keys(recipe.train, *OPTIMIZER_KEYS[1:]),
        seed=seed,
        callbacks=state.callbacks(before, after),
        state=state,
        # A model.builder model has no backbone to freeze; it trains whole
        # (build_from_builder refuses freezing settings).
        freeze=None if recipe.model.builder else setup.classifier,
        validation_data=val_ds,
        verbose=verbose,
        echo=echo,
    )
    summary = None
    if co_guard is not None:
        co_guard.set_model(setup.model)
        co_guard.finish()
        summary = co_guard.summary()
    return Trained(state.history(history), seconds, progress.epoch_seconds, summary)


def _co_guard(recipe: Recipe, setup: RunSetup, echo: Echo):
    """The catastrophic-overfitting guard on a fixed clean training batch,
    with its record from before the interruption when the run resumes."""
    from advtrain.data import make_input
    from advtrain.train.guards import CatastrophicOverfittingGuard

    cfg, state = recipe.train, setup.state
    batches = make_input(
        setup.splits.train,
        batch_size=cfg.co_guard_examples,
        training=False,
        **setup.data,
    )
    x, y = next(iter(batches))
    gap = cfg.co_guard_gap
    echo(
        f"catastrophic-overfitting guard: PGD-{cfg.co_guard_pgd_steps} at "
        f"eps={recipe.attack.eps:g} on {len(y)} training examples each "
        f"epoch; a drop > {cfg.co_guard_drop:g}"
        + ("" if gap is None else f", or a training attack > {gap:g} above it")
        + f" triggers {cfg.co_guard_action}"
    )
    guard = CatastrophicOverfittingGuard(
        keras.ops.convert_to_numpy(x),
        keras.ops.convert_to_numpy(y),
        eps=recipe.attack.eps,
        norm=recipe.attack.norm,
        steps=cfg.co_guard_pgd_steps,
        drop=cfg.co_guard_drop,
        max_gap=gap,
        action=cfg.co_guard_action,
        echo=echo,
        seed=cfg.seed,
        state_path=state.out / "checkpoints" / "co_guard.npz",
        keep=cfg.co_guard_keep,
    )
    if state.resuming and guard.load_state(guard.state_path, state.start_epoch):
        echo(
            f"catastrophic-overfitting guard: resumed with its record of "
            f"{len(guard.accuracies)} epoch(s), best PGD accuracy "
            f"{100 * guard.best_accuracy:.1f}% (epoch {guard.best_epoch})"
        )
    guard.finish_on_train_end = False  # one fit per phase: `train` finishes
    return guard


# ---------------------------------------------------------------- finish


def finish(
    recipe: Recipe, setup: RunSetup, trained: Trained, *, echo: Echo = print
) -> RunResult:
    """Stage 3: recalibrate BatchNorm, save model.keras, evaluate, run the
    sanity checks, write the report and the export, and metrics.json last
    (its presence marks a finished run)."""
    from advtrain.data import make_input
    from advtrain.evaluation.examples import GRID_CANDIDATES, GRID_SIZE
    from advtrain.evaluation.robustness import evaluate_robustness, plot_eps_sweep

    classifier, runtime, out = setup.classifier, setup.runtime, setup.state.out
    _assert_finite(classifier, "model.keras")
    if runtime.workers > 1:
        from advtrain.train.runtime import weights_fingerprint

        # `advtrain launch` compares these across workers.
        echo(f"weights: sha256 {weights_fingerprint(classifier)}")
    gap = _settle_batchnorm(classifier, recipe, setup.splits, setup.plan, echo)
    # After recalibration: model.keras, metrics.json and the SavedModel
    # hold the same weights.
    with atomic_path(out / "model.keras") as tmp:
        classifier.save(tmp)
    echo("evaluating on the test split ...")
    test_ds = make_input(
        setup.splits.test,
        batch_size=recipe.eval.batch_size,
        training=False,
        **input_options(recipe),
    )
    shows_examples = recipe.output.plots or recipe.output.tensorboard
    evaluation = evaluate_robustness(
        classifier,
        test_ds,
        **evaluation_keys(recipe),
        num_classes=setup.splits.num_classes,
        strategy=runtime.strategy,
        # A seeded subset to draw the report's grid from, not every image.
        return_examples=GRID_CANDIDATES if shows_examples else False,
    )
    examples = evaluation.pop("adversarial_examples", None)
    samples = setup.state.samples_trained(setup.plan.epochs, setup.plan.global_batch)
    history, seconds = trained.history, trained.seconds
    metrics: dict[str, Any] = {
        "recipe": recipe.name,
        **_collapse(trained.co_guard),
        **evaluation,
        "bn_gap": gap,
        "train_seconds": round(seconds, 2),
        "train_samples_per_second": round(samples / max(seconds, 1e-9), 1),
        "epoch_seconds": [round(s, 2) for s in trained.epoch_seconds],
        "final_train_metrics": {k: float(v[-1]) for k, v in history.items() if v},
    }
    metrics["sanity_checks"] = recipe_sanity_checks(
        classifier, test_ds, recipe, echo, runtime.strategy, evaluation
    )
    if trained.co_guard is not None:
        metrics["co_guard"] = trained.co_guard
    if recipe.output.plots and evaluation.get("eps_sweep"):
        plot_eps_sweep(
            evaluation["eps_sweep"], out / "eps_sweep.png", title=recipe.name
        )
    if examples is not None:
        examples = examples.pick(GRID_SIZE, seed=recipe.eval.seed)
    _log_examples(out, recipe, examples, setup.splits, setup.plan.epochs)
    _report_and_export(
        out, recipe, metrics, history, classifier, setup.splits, echo, examples
    )
    atomic_write_json(out / FINISHED_FILE, metrics)
    return RunResult(out, metrics, history)


def _collapse(co_guard: Optional[dict[str, Any]]) -> dict[str, Any]:
    """metrics.json's `catastrophic_overfitting`, beside the headline: the
    guard's line when no epoch it could keep was sound, else None (absent
    without the guard)."""
    if co_guard is None:
        return {}
    unsound = co_guard.get("unsound")
    return {"catastrophic_overfitting": unsound["message"] if unsound else None}


def _assert_finite(model: keras.Model, what: str) -> None:
    from advtrain.train.callbacks import NonFiniteLossError
    from advtrain.train.guards import first_nonfinite_variable

    name = first_nonfinite_variable(model)
    if name is not None:
        raise NonFiniteLossError(
            f"{name} holds NaN or Inf after training; {what} "
            "was not written. Likely causes: learning rate too high, eps "
            "too large, or float16 overflow."
        )


def _settle_batchnorm(classifier, recipe: Recipe, splits, plan, echo: Echo):
    """`advtrain.train.fitting.settle_trained_batchnorm` on the recipe's
    held-out split (val, else test) and clean training batches."""
    from advtrain.data import make_input
    from advtrain.train.fitting import settle_trained_batchnorm

    data = input_options(recipe)
    held_out = splits.val if splits.val is not None else splits.test
    return settle_trained_batchnorm(
        classifier,
        make_input(held_out, batch_size=512, training=False, **data),
        make_input(splits.train, batch_size=plan.global_batch, training=False, **data),
        per_replica_batch=plan.per_replica_batch,
        batchnorm=recipe.model.batchnorm.model_dump(),
        echo=echo,
        names=recipe_keys("model.batchnorm", batch_size="train.batch_size"),
    )


def _log_examples(out: Path, recipe: Recipe, examples, splits, step: int) -> None:
    """The report's grid of adversarial examples in TensorBoard too
    (logs/evaluation, at the last epoch), with `output.tensorboard`."""
    from advtrain.evaluation.examples import log_examples

    if recipe.output.tensorboard and examples is not None and len(examples):
        log_examples(examples, out / "logs" / "evaluation", step, splits.class_names)


def _report_and_export(
    out, recipe, metrics, history, classifier, splits, echo, examples=None
):
    import shutil

    from advtrain.evaluation.export import export_saved_model
    from advtrain.recipe.report import write_report

    write_report(
        out,
        recipe.to_dict(),
        metrics,
        history,
        class_names=splits.class_names,
        plots=recipe.output.plots,
        examples=examples,
    )
    if recipe.output.export_saved_model:
        target = out / "export" / "saved_model"
        shutil.rmtree(target, ignore_errors=True)  # a resumed run re-exports
        export_saved_model(classifier, target)
        echo(f"exported SavedModel (uint8 images in) to {target}")
