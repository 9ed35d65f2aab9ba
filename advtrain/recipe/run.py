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
    RunFolderClaim,
    resolve_output_dir,
    resume_hint,
)
from advtrain.recipe.schema import Recipe, RecipeError
from advtrain.recipe.summary import describe, describe_momentum
from advtrain.train.callbacks import Preemption
from advtrain.train.options import CheckpointOptions, PlanOptions
from advtrain.train.preemption import restores_signal_handlers, watch_launcher
from advtrain.utils.errors import BAD_INPUT, exit_code_of
from advtrain.utils.io import atomic_path, atomic_write_json, atomic_write_text
from advtrain.utils.progress import Echo


@dataclasses.dataclass
class RunSetup:
    """What the prepare stage built: the run's `Setup` (runtime, plan,
    classifier, training model, stream) and the data it came from."""

    setup: Any  # advtrain.train.fitting.Setup
    splits: Any  # advtrain.data.DataSplits
    data: dict[str, Any]  # make_input's data keys, for the training stream
    run_dir: Path

    @property
    def runtime(self):
        return self.setup.runtime

    @property
    def plan(self):
        return self.setup.plan

    @property
    def classifier(self) -> keras.Model:  # what is saved: pixels in, logits out
        return self.setup.classifier

    @property
    def model(self) -> keras.Model:  # the training model around it
        return self.setup.model


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
    # Bad input found by the setup or the first step, before a checkpoint,
    # leaves the folder as it found it; any other failure (a NaN loss, a
    # crash) keeps what it wrote to be looked at, a preemption to resume.
    claim = RunFolderClaim(run_dir)
    try:
        setup = prepare(recipe, run_dir, echo=echo, claim=claim)
        trained = train(recipe, setup, echo=echo, verbose=verbose)
    except Exception as exc:
        if exit_code_of(exc) == BAD_INPUT:
            claim.release()
        raise
    return finish(recipe, setup, trained, echo=echo)


def prepare(
    recipe: Recipe,
    run_dir: Path,
    *,
    echo: Echo = print,
    claim: Optional[RunFolderClaim] = None,
) -> RunSetup:
    """Stage 1: the data and `advtrain.prepare` with the recipe's sections
    (the runtime, the batch plan, the model); the resolved recipe written
    into the run folder (the chief's `claim` on it, when given, takes it
    back if bad input stops the run). `advtrain.fit` restores the last
    checkpoint."""
    from advtrain.train.fitting import resolve_monitor

    keras.utils.set_random_seed(recipe.train.seed)
    runtime = build.recipe_runtime(recipe)
    if claim is not None:
        claim.owner = runtime.is_chief
    hint = resume_hint(run_dir, runtime.workers)
    # Outside `advtrain.fit` (data, evaluation) a signal stops the run at
    # once with exit 75; `run` restores the caller's handlers.
    Preemption(run_dir, workers=runtime.workers, resume_hint=hint)
    splits = build.recipe_splits(recipe)
    describe(recipe, splits, echo)
    setup = recipe_setup(recipe, splits, runtime, echo)
    setup.resume_hint = hint
    setup.names = recipe_keys("model.batchnorm", batch_size="train.batch_size")
    describe_momentum(recipe, setup.classifier, echo)
    if recipe.output.monitor.startswith("val_") and splits.val is None:
        raise RecipeError(
            "output.monitor: a validation metric needs a validation split; set "
            "val_fraction > 0 or monitor a training metric. "
            f"Received: monitor={recipe.output.monitor}"
        )
    with recipe_keys("output"):  # refused before anything is written
        resolve_monitor(recipe.output, setup.model, splits.val is not None)
    if runtime.is_chief:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / RECIPE_FILE, recipe.to_yaml())
    return RunSetup(setup, splits, build.input_options(recipe, training=True), run_dir)


def recipe_setup(recipe: Recipe, splits, runtime, echo: Echo):
    """`advtrain.prepare` with the recipe's sections: the one setup of a
    run, `advtrain profile` and `advtrain show`."""
    from advtrain.data import make_input
    from advtrain.train.fitting import Stream, prepare

    data = build.input_options(recipe, training=True)
    options = build.input_options(recipe)
    batch, seed = recipe.train.batch_size, recipe.train.seed
    strategy = runtime.input_strategy()
    plan = _Later()

    def batches(split, batch_size: int):
        return make_input(split, batch_size=batch_size, training=False, **options)

    held_out = splits.val if splits.val is not None else splits.test
    stream = Stream(
        lambda skip: train_stream(splits, data, plan.value, seed, skip, strategy),
        splits.train_size,
        batch,
        held_out=batches(held_out, 512),
        plain=batches(splits.train, batch),
    )
    # A model.builder model has no backbone to freeze; it trains whole
    # (build_from_builder refuses freezing settings).
    epochs = recipe.train.epochs
    with recipe_keys("train"):
        setup = prepare(
            lambda: build.recipe_classifier(recipe, splits),
            stream,
            epochs=epochs if recipe.model.builder else _phases(recipe),
            attack=recipe.attack,
            train=recipe.train.model_dump(include=set(PlanOptions.model_fields)),
            runtime=runtime,
            batchnorm=recipe.model.batchnorm,
            echo=echo,
        )
    plan.value = setup.plan
    return setup


class _Later:
    """A value set after the function that reads it was made."""

    value: Any = None


def _phases(recipe: Recipe) -> list:
    """The phases of the model section's freezing keys, over train.epochs
    (the plan keeps the epochs as given)."""
    return build.recipe_phases(recipe, recipe.train.epochs)


@dataclasses.dataclass
class Trained:
    """What the train stage hands to `finish`."""

    history: dict[str, list[float]]
    seconds: float
    epoch_seconds: list[float]
    co_guard: Optional[dict[str, Any]] = None
    bn_gap: Optional[dict[str, Any]] = None
    samples: int = 0
    out: Optional[Path] = None  # the folder this worker wrote


def train(recipe: Recipe, setup: RunSetup, *, echo: Echo, verbose: int) -> Trained:
    """Stage 2: `advtrain.fit` once, with the run folder as its checkpoints
    (resume, NaN guard, preemption), progress lines, TensorBoard, the
    catastrophic-overfitting guard and the BatchNorm settle."""
    from advtrain.data import make_input
    from advtrain.train.callbacks import ProgressLine
    from advtrain.train.fitting import fit
    from advtrain.utils.progress import EpochProgress

    plan, splits = setup.plan, setup.splits
    val_ds = None
    if splits.val is not None:
        options = build.input_options(recipe)
        batch = recipe.eval.batch_size
        val_ds = make_input(splits.val, batch_size=batch, training=False, **options)
    progress = ProgressLine(echo, plan.epochs, plan.steps_per_epoch * plan.global_batch)
    co_guard = _co_guard(recipe, setup, echo) if recipe.train.co_guard else None
    callbacks = [
        # First: its live bar is cleared before any epoch-end line prints.
        EpochProgress(plan.epochs),
        *([co_guard] if co_guard else []),  # before the logs see the epoch
        progress,
    ]
    if recipe.output.tensorboard:
        logs = str(setup.run_dir / "logs")
        callbacks.append(keras.callbacks.TensorBoard(logs, write_graph=False))
    checkpoints = recipe.output.model_dump(include=set(CheckpointOptions.model_fields))
    with recipe_keys("output"):
        result = fit(
            setup.setup,
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            checkpoints={**checkpoints, "dir": str(setup.run_dir)},
            validation_data=val_ds,
            callbacks=callbacks,
            verbose=verbose,
        )
    summary = co_guard.summary() if co_guard is not None else None
    return Trained(
        result.history,
        result.train_seconds,
        progress.epoch_seconds,
        summary,
        result.bn_gap,
        result.samples_trained,
        result.output_dir,
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

    cfg = recipe.train
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
        keep=cfg.co_guard_keep,
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

    classifier, runtime, out = setup.classifier, setup.runtime, trained.out
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
    samples = trained.samples
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
