"""`run(recipe)`: a recipe's run in three stages (prepare, train, finish),
writing its run folder. The recipe's keys become library calls in
`advtrain.recipe.build`; the folder's rules live in `run_folder`, and
docs/index.md lists its files.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional, Union

import keras

from advtrain.recipe import build
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
from advtrain.train.preemption import restores_signal_handlers, watch_launcher
from advtrain.train.runtime import OPTIMIZER_KEYS, PLAN_KEYS
from advtrain.train.training_state import TrainingState
from advtrain.utils.io import atomic_path, atomic_write_json
from advtrain.utils.progress import Echo


@dataclasses.dataclass
class RunSetup:
    """What the prepare stage built: the parts a run trains and evaluates."""

    runtime: Any  # advtrain.train.runtime.Runtime
    splits: Any  # advtrain.data.DataSplits
    plan: Any  # advtrain.train.runtime.BatchPlan
    classifier: keras.Model  # what is saved: [0, 1] pixels in, logits out
    model: keras.Model  # the training model around it
    data: dict[str, Any]  # make_input's data keys, for the training stream
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


def prepare(recipe: Recipe, run_dir: Path, *, echo: Echo = print) -> RunSetup:
    """Stage 1: the runtime, the data and the model, restored from the run
    folder's last checkpoint when it holds one; the checkpoint store and
    callbacks (`advtrain.train.training_state.TrainingState`)."""
    keras.utils.set_random_seed(recipe.train.seed)
    runtime = build.recipe_runtime(recipe)
    state = TrainingState(
        run_dir,
        resuming=holds_run(run_dir),
        workers=runtime.workers,
        resume_hint=resume_hint(run_dir, runtime.workers),
        echo=echo,
    )
    splits = build.recipe_splits(recipe)
    plan = build.recipe_plan(recipe, runtime, splits.train_size)
    describe(recipe, splits, echo)
    with runtime.scope():
        classifier, model = build.build_run_model(
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
    data = build.input_options(recipe, training=True)
    return RunSetup(runtime, splits, plan, classifier, model, data, state)


def _monitor(recipe: Recipe, model: keras.Model, has_val: bool) -> tuple[str, str]:
    # "auto": robust accuracy, on the validation split only if the model's
    # test_step attacks (else val_adv_accuracy would stay 0).
    monitor, mode = recipe.output.monitor, recipe.output.monitor_mode
    attacks = recipe.attack.method != "none"
    if monitor == "auto":
        if not attacks:
            monitor = "val_accuracy" if has_val else "accuracy"
        elif has_val and type(model).test_step is not keras.Model.test_step:
            monitor = "val_adv_accuracy"
        else:
            monitor = "adv_accuracy"
    elif monitor.startswith("val_") and not has_val:
        raise RecipeError(
            "output.monitor: a validation metric needs a validation split; set "
            "val_fraction > 0 or monitor a training metric. "
            f"Received: monitor={monitor}"
        )
    if mode == "auto":
        mode = "min" if monitor.endswith("loss") else "max"
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


@dataclasses.dataclass
class Trained:
    """What the train stage hands to `finish`."""

    history: dict[str, list[float]]
    seconds: float
    epoch_seconds: list[float]
    co_guard: Optional[dict[str, Any]] = None
    bn_gap: Optional[dict[str, Any]] = None


def train(recipe: Recipe, setup: RunSetup, *, echo: Echo, verbose: int) -> Trained:
    """Stage 2: `advtrain.fit` once, with the run's checkpoints, NaN guard
    and preemption (`setup.state`), progress lines, TensorBoard, the
    catastrophic-overfitting guard and the BatchNorm settle."""
    from advtrain.data import make_input
    from advtrain.train.callbacks import ProgressLine
    from advtrain.train.fitting import fit
    from advtrain.utils.progress import EpochProgress

    state, plan, splits = setup.state, setup.plan, setup.splits
    data = build.input_options(recipe)

    def batches(split, batch_size: int):
        return make_input(split, batch_size=batch_size, training=False, **data)

    val_ds = None if splits.val is None else batches(splits.val, recipe.eval.batch_size)
    progress = ProgressLine(echo, plan.epochs, plan.steps_per_epoch * plan.global_batch)
    co_guard = _co_guard(recipe, setup, echo) if recipe.train.co_guard else None
    callbacks = [
        # First: its live bar is cleared before any epoch-end line prints.
        EpochProgress(plan.epochs),
        *([co_guard] if co_guard else []),  # before the logs see the epoch
        progress,
    ]
    if recipe.output.tensorboard:
        logs = str(state.out / "logs")
        callbacks.append(keras.callbacks.TensorBoard(logs, write_graph=False))
    seed, strategy = recipe.train.seed, setup.runtime.input_strategy()
    held_out = splits.val if splits.val is not None else splits.test
    settings = build._keys(recipe.train, *PLAN_KEYS, *OPTIMIZER_KEYS, "seed")
    settings["steps_per_epoch"] = plan.steps_per_epoch
    # A model.builder model has no backbone to freeze; it trains whole
    # (build_from_builder refuses freezing settings).
    phases = None if recipe.model.builder else build.recipe_phases(recipe, plan.epochs)
    names = recipe_keys("train")  # of fit's settings, for its warnings
    names.update(
        {f"batchnorm.{k}": v for k, v in recipe_keys("model.batchnorm").items()}
    )
    with recipe_keys("train"):
        result = fit(
            setup.model,
            lambda skip: train_stream(splits, setup.data, plan, seed, skip, strategy),
            runtime=setup.runtime,
            **settings,
            phases=phases,
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            batchnorm=recipe.model.batchnorm.model_dump(),
            batchnorm_data=(
                batches(held_out, 512),
                batches(splits.train, plan.global_batch),
            ),
            setting_names=names,
            validation_data=val_ds,
            callbacks=callbacks,
            checkpoints=state,
            verbose=verbose,
            echo=echo,
        )
    summary = co_guard.summary() if co_guard is not None else None
    return Trained(
        result.history,
        result.train_seconds,
        progress.epoch_seconds,
        summary,
        result.bn_gap,
    )


def train_stream(splits, data: dict[str, Any], plan, seed: int, skip: int, strategy):
    """A fresh training stream for one `Model.fit`, its first `skip` steps
    dropped; built after resetting the global seed, so its order depends on
    the recipe alone (a resumed process replays it). With several replicas
    each worker builds its own shard, batched per replica."""
    from advtrain.data import make_distributed_input, make_input

    keras.utils.set_random_seed(seed)
    if strategy is None or strategy.num_replicas_in_sync == 1:
        ds = make_input(
            splits.fresh_train(), batch_size=plan.global_batch, training=True, **data
        ).repeat()
        return ds.skip(skip) if skip else ds
    return make_distributed_input(
        splits.fresh_train,
        strategy,
        global_batch=plan.global_batch,
        training=True,
        repeat=True,
        skip_steps=skip,
        **data,
    )


def _co_guard(recipe: Recipe, setup: RunSetup, echo: Echo):
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
    return guard


def finish(
    recipe: Recipe, setup: RunSetup, trained: Trained, *, echo: Echo = print
) -> RunResult:
    """Stage 3: save model.keras, evaluate, run the sanity checks, write the
    report and the export, and metrics.json last (it marks a finished run)."""
    import shutil

    from advtrain.evaluation.examples import GRID_CANDIDATES, GRID_SIZE, log_examples
    from advtrain.evaluation.export import export_saved_model
    from advtrain.evaluation.robustness import plot_eps_sweep
    from advtrain.evaluation.verdict import verdict_metrics
    from advtrain.recipe.report import write_report

    classifier, runtime, out = setup.classifier, setup.runtime, setup.state.out
    splits, output = setup.splits, recipe.output
    _assert_finite(classifier, "model.keras")
    if runtime.workers > 1:
        from advtrain.train.runtime import weights_fingerprint

        # `advtrain launch` compares these across workers.
        echo(f"weights: sha256 {weights_fingerprint(classifier)}")
    # After the BatchNorm settle (in `advtrain.fit`): model.keras,
    # metrics.json and the SavedModel hold the same weights.
    with atomic_path(out / "model.keras") as tmp:
        classifier.save(tmp)
    echo("evaluating on the test split ...")
    # A seeded subset to draw the report's grid from, not every image.
    grid = GRID_CANDIDATES if output.plots or output.tensorboard else False
    with runtime.scope():
        test_ds, evaluation, examples = build.recipe_evaluation(
            recipe, classifier, splits, return_examples=grid
        )
    samples = setup.state.samples_trained(setup.plan.epochs, setup.plan.global_batch)
    history, seconds, co_guard = trained.history, trained.seconds, trained.co_guard
    # The verdict goes beside the headline; it is set once the checks ran.
    metrics: dict[str, Any] = {"recipe": recipe.name, "verdict": None}
    metrics.update(evaluation)
    metrics.update(
        bn_gap=trained.bn_gap,
        train_seconds=round(seconds, 2),
        train_samples_per_second=round(samples / max(seconds, 1e-9), 1),
        epoch_seconds=[round(s, 2) for s in trained.epoch_seconds],
        final_train_metrics={k: float(v[-1]) for k, v in history.items() if v},
    )
    metrics["sanity_checks"] = build.recipe_sanity_checks(
        classifier, test_ds, recipe, echo, runtime.strategy, evaluation
    )
    if co_guard is not None:
        metrics["co_guard"] = co_guard
    # One verdict from the guard and the checks (`evaluate` gave its own).
    metrics.update(verdict_metrics(co_guard, evaluation, metrics["sanity_checks"]))
    if output.plots and evaluation.get("eps_sweep"):
        plot_eps_sweep(
            evaluation["eps_sweep"], out / "eps_sweep.png", title=recipe.name
        )
    if examples is not None:
        examples = examples.pick(GRID_SIZE, seed=recipe.eval.seed)
        if output.tensorboard and len(examples):  # at the last epoch
            logs = out / "logs" / "evaluation"
            log_examples(examples, logs, setup.plan.epochs, splits.class_names)
    write_report(
        out,
        recipe.to_dict(),
        metrics,
        history,
        class_names=splits.class_names,
        plots=output.plots,
        examples=examples,
    )
    if output.export_saved_model:
        target = out / "export" / "saved_model"
        shutil.rmtree(target, ignore_errors=True)  # a resumed run re-exports
        export_saved_model(classifier, target)
        echo(f"exported SavedModel (uint8 images in) to {target}")
    atomic_write_json(out / FINISHED_FILE, metrics)
    return RunResult(out, metrics, history)


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
