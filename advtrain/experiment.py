"""`run(recipe)`: wires data, model, attack and runtime; owns the run folder.

This module is the recipe boundary: it translates the recipe's sections
into plain calls of the parts. `run` is three stages:

    prepare   runtime, data, model; resume point and checkpoint callbacks
              (`advtrain.training.TrainingState`)
    train     the phases (`advtrain.training.fit_phases`)
    finish    recalibrate BatchNorm, save model.keras, evaluate
              (`advtrain.evaluation`), sanity checks (`advtrain.sanity`),
              report (`advtrain.report`), export (`advtrain.export`),
              metrics.json last

A run folder holds:
    recipe.yaml      the resolved recipe (after --set overrides)
    checkpoints/     atomic checkpoints: model, optimizer and metric variables
                     (advtrain.checkpointing)
    logs/            TensorBoard logs
    history.csv      one row per epoch
    model.keras      the trained classifier: raw [0, 1] pixels in, logits out
    metrics.json     clean / FGSM / PGD accuracy, macro F1, timing
    eps_sweep.png    accuracy against eps (when eval.eps_sweep is set)
    report.md        recipe, curves, per-class table, sanity checks, timing
    training_curves.png  clean and adversarial accuracy per epoch
    export/saved_model/  TF Serving SavedModel, uint8 images in (export.py)
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, Union

import keras

from advtrain.attacks import Attack, make_attack
from advtrain.checkpointing import RunFolderError
from advtrain.config import (
    AttackConfig,
    Recipe,
    RecipeError,
    parse_yaml,
    recipe_from_dict,
)
from advtrain.errors import one_line
from advtrain.io import atomic_path, atomic_write_json
from advtrain.preemption import restores_signal_handlers, watch_launcher
from advtrain.training import RunSetup, TrainingState, fit_phases

Echo = Callable[[str], None]


@dataclasses.dataclass
class RunResult:
    output_dir: Path
    metrics: dict[str, Any]
    history: dict[str, list[float]]


def attack_from_config(cfg: AttackConfig) -> Optional[Attack]:
    """The training attack a recipe's attack section describes (None for
    `method: none`; TRADES's is PGD)."""
    from advtrain.attacks.attack import OPTION_KEYS

    return make_attack(cfg.method, **_keys(cfg, *OPTION_KEYS))


def _keys(section, *names: str) -> dict[str, Any]:
    """The recipe keys `names` of `section`, as keyword arguments."""
    return section.model_dump(include=set(names))


# ---------------------------------------------------------------- boundary
# The recipe turned into the parts' keyword arguments, once, for `run`,
# `advtrain show` and `advtrain profile`.


def recipe_splits(recipe: Recipe):
    """`load_splits` with the recipe's data keys."""
    from advtrain.data import LOAD_OPTIONS, load_splits

    return load_splits(recipe.data.source, **_keys(recipe.data, *LOAD_OPTIONS))


def recipe_runtime(recipe: Recipe):
    """`make_runtime` with the recipe's runtime keys."""
    from advtrain.runtime import make_runtime

    return make_runtime(**recipe.runtime.model_dump())


def recipe_plan(recipe: Recipe, runtime, train_size: int):
    """`plan_batches` with the recipe's train keys."""
    from advtrain.runtime import PLAN_KEYS, plan_batches

    return plan_batches(runtime, train_size, **_keys(recipe.train, *PLAN_KEYS))


def recipe_phases(recipe: Recipe, epochs: int) -> list:
    """`phases` with the recipe's model keys."""
    from advtrain.models.freezing import phases

    return phases(
        epochs,
        **_keys(recipe.model, *_PHASE_KEYS),
        bn_trainable=recipe.model.batchnorm.trainable,
    )


def recipe_optimizer(recipe: Recipe, plan, lr_factor: float = 1.0):
    """`make_optimizer` for a phase whose learning rate is `lr_factor` x
    the plan's."""
    from advtrain.runtime import OPTIMIZER_KEYS, make_optimizer

    phase_plan = dataclasses.replace(plan, learning_rate=plan.learning_rate * lr_factor)
    return make_optimizer(phase_plan, **_keys(recipe.train, *OPTIMIZER_KEYS))


# The model keys of `phases`.
_PHASE_KEYS = ("head_only_epochs", "freeze", "top_k", "finetune_lr_factor")


def input_options(recipe: Recipe, training: bool = False) -> dict[str, Any]:
    """`make_input`'s data keys (`advtrain.data.INPUT_OPTIONS`)."""
    from advtrain.data import INPUT_OPTIONS

    options = _keys(recipe.data, *INPUT_OPTIONS)
    if training and recipe.runtime.deterministic:
        # A resumed run replays its batches only if tf.data's order is fixed.
        options["deterministic"] = True
    return options


def build_training_model(
    recipe: Recipe, classifier: keras.Model, steps_per_epoch: Optional[int] = None
) -> keras.Model:
    """AdversarialModel (or TRADES, GradAlign) around `classifier` per the recipe.
    `steps_per_epoch` turns `attack.eps_ramp_epochs` into steps (without
    it there is no ramp)."""
    from advtrain.models.adversarial import AdversarialModel
    from advtrain.models.grad_align import GradAlign
    from advtrain.models.trades import TRADES

    cfg = recipe.attack
    attack = attack_from_config(cfg)
    ramp = 0
    if attack is not None and cfg.eps_ramp_epochs and steps_per_epoch:
        ramp = max(1, round(cfg.eps_ramp_epochs * steps_per_epoch))
    if cfg.method == "trades":
        return TRADES(
            classifier,
            attack,
            beta=cfg.beta,
            attack_mode=cfg.mode,
            seed=recipe.train.seed,
            eps_ramp_steps=ramp,
            **_RECIPE_OWNS_BATCHNORM,
        )
    extra = {"grad_align": cfg.grad_align} if cfg.grad_align else {}
    return (GradAlign if cfg.grad_align else AdversarialModel)(
        classifier,
        attack,
        **extra,
        adv_weight=cfg.adv_weight if attack is not None else 0.0,
        attack_mode=cfg.mode,
        seed=recipe.train.seed,
        fused=cfg.fused_step if attack is not None else False,
        eps_ramp_steps=ramp,
        **_RECIPE_OWNS_BATCHNORM,
    )


# `model.batchnorm` (fused kernel, momentum for the whole run) is applied by
# `build_run_model`; a fit-time policy would see one phase, not the run.
_RECIPE_OWNS_BATCHNORM = {"fused_batchnorm": False, "batchnorm_momentum": None}


def build_run_model(
    recipe: Recipe,
    splits,
    total_steps: Optional[int] = None,
    steps_per_epoch: Optional[int] = None,
) -> tuple[keras.Model, keras.Model]:
    """The classifier (backbone or `model.builder`, BatchNorm policy
    applied) and the training model around it, as `run` and `profile`
    build them. Call it inside the runtime's strategy scope.
    `total_steps` (epochs x steps per epoch) sets `momentum: auto`;
    `steps_per_epoch` sets the length of `attack.eps_ramp_epochs`.
    """
    from advtrain.models.batchnorm import apply_batchnorm_policy
    from advtrain.models.classifier import build_classifier

    if recipe.model.builder:
        from advtrain.fitting import build_from_builder

        classifier = build_from_builder(
            recipe.model.builder,
            splits.image_shape,
            splits.num_classes,
            recipe.model,
        )
    else:
        classifier = build_classifier(
            splits.image_shape,
            splits.num_classes,
            **_keys(
                recipe.model, "backbone", "weights", "input_size", "width", "dropout"
            ),
        )
    apply_batchnorm_policy(
        classifier,
        total_steps=total_steps,
        **_keys(recipe.model.batchnorm, "momentum", "fused_kernel"),
    )
    return classifier, build_training_model(recipe, classifier, steps_per_epoch)


def recipe_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key: old -> new` for every dotted key whose value differs."""
    old, new = _flatten(saved), _flatten(current)
    return [
        f"{key}: {old.get(key, '<unset>')!r} -> {new.get(key, '<unset>')!r}"
        for key in sorted(set(old) | set(new))
        if old.get(key, "<unset>") != new.get(key, "<unset>")
    ]


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        flat: dict[str, Any] = {}
        for key, value in data.items():
            flat.update(_flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: data}


def check_run_dir(out: Path, recipe: Recipe) -> bool:
    """Decides what an output folder may be used for.

    Returns:
        False for a new (missing or empty) folder, True for an unfinished
        run of the same resolved recipe, which is resumed.

    Raises:
        RecipeError: the folder holds something else (not a run, a run of
            another recipe, a finished run); nothing is written.
    """
    from advtrain.checkpointing import check_unfinished, saved_recipe_text

    try:
        text = saved_recipe_text(out)
        if text is None:
            return False
        saved_path = out / "recipe.yaml"
        saved = recipe_from_dict(parse_yaml(text, str(saved_path)), str(saved_path))
        differences = recipe_differences(saved.to_dict(), recipe.to_dict())
        if differences:
            shown = "; ".join(differences[:4])
            more = len(differences) - 4
            if more > 0:
                shown += f"; and {more} more"
            raise RecipeError(
                f"--output {out}: folder is not empty: it holds a run of a "
                f"different recipe ({shown}). Choose a new folder, or continue "
                f"that run with `advtrain resume {out}`."
            )
        check_unfinished(out)
    except RunFolderError as exc:
        raise RecipeError(str(exc)) from None
    return True


def resolve_output_dir(recipe: Recipe, output: Optional[Union[str, Path]]) -> Path:
    """The run folder: new, or an unfinished run of the same resolved recipe
    (which `run` resumes). Refuses anything else with a RecipeError naming
    the differing keys (`check_run_dir`)."""
    from advtrain.io import check_recipe_paths

    if output is None and recipe.output.dir:
        output = recipe.output.dir
    if output is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        output = Path("runs") / f"{recipe.name}-{stamp}"
    output = Path(output)
    check_recipe_paths(recipe, output)
    check_run_dir(output, recipe)
    return output


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
    from advtrain.config import load_recipe
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
    callbacks (`advtrain.training.TrainingState`)."""
    keras.utils.set_random_seed(recipe.train.seed)
    runtime = recipe_runtime(recipe)
    state = TrainingState(run_dir, workers=runtime.workers, echo=echo)
    splits = recipe_splits(recipe)
    plan = recipe_plan(recipe, runtime, splits.train_size)
    _describe(recipe, splits, runtime, plan, echo)
    with runtime.strategy.scope():
        classifier, model = build_run_model(
            recipe,
            splits,
            plan.epochs * plan.steps_per_epoch,
            steps_per_epoch=plan.steps_per_epoch,
        )
    _describe_momentum(recipe, classifier, echo)
    if recipe.attack.method != "none":
        fused = str(recipe.attack.fused_step).lower()
        echo(f"step: {model.step_note}; attack.fused_step: {fused}")
    monitor, monitor_mode = _monitor(recipe, model, splits.val is not None)
    state.restore(model, steps_per_epoch=plan.steps_per_epoch)
    state.open(
        is_chief=runtime.is_chief,
        recipe_yaml=recipe.to_yaml(),
        epochs=plan.epochs,
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


def _describe(recipe: Recipe, splits, runtime, plan, echo: Echo) -> None:
    """The run's data, runtime, batch arithmetic and attack, one line each."""
    attack = attack_from_config(recipe.attack)
    echo(
        f"data: {recipe.data.source} {splits.train_size} train / "
        f"{splits.val_size} val / {splits.test_size} test, image "
        f"{'x'.join(map(str, splits.image_shape))}, {splits.num_classes} classes"
    )
    echo(runtime.describe())
    echo(plan.describe())
    if attack is None:
        echo("attack: none (clean training)")
        return
    ramp = recipe.attack.eps_ramp_epochs
    echo(
        f"attack: {recipe.attack.method} eps={attack.eps:g} "
        f"norm={attack.norm} adv_weight={recipe.attack.adv_weight:g} "
        f"backend={attack.backend} mode={recipe.attack.mode}"
        + _method_options(attack)
        + (f" eps_ramp_epochs={ramp:g}" if ramp else "")
        + (
            f" grad_align={recipe.attack.grad_align:g}"
            if recipe.attack.grad_align
            else ""
        )
    )


def _method_options(attack) -> str:
    """The step settings the attack's method uses, e.g. " alpha=0.375"."""
    if attack.method == "pgd":
        size = "auto" if attack.step_size is None else f"{attack.step_size:g}"
        return f" steps={attack.steps} step_size={size}"
    if attack.method not in ("fgsm_rs", "n_fgsm", "zerograd"):
        return ""
    alpha = "eps" if attack.method == "n_fgsm" else "1.25*eps"
    text = f" alpha={alpha if attack.alpha is None else format(attack.alpha, 'g')}"
    if attack.method == "n_fgsm":
        noise = attack.noise
        text += f" noise={'2*eps' if noise is None else format(noise, 'g')}"
    if attack.method == "zerograd":
        text += f" zero_quantile={attack.zero_quantile:g}"
    return text


def _describe_momentum(recipe: Recipe, classifier: keras.Model, echo: Echo) -> None:
    from advtrain.models.batchnorm import layer_momentum

    momentum = layer_momentum(classifier)
    if momentum is not None:
        echo(
            f"batchnorm: momentum {momentum:g} "
            "(model.batchnorm.momentum: "
            f"{recipe.model.batchnorm.momentum or 'null'})"
        )


def _monitor(recipe: Recipe, model: keras.Model, has_val: bool) -> tuple[str, str]:
    """`output.monitor` and `output.monitor_mode` resolved for this run."""
    from advtrain.checkpointing import resolve_monitor

    try:
        monitor, mode = resolve_monitor(
            recipe.output.monitor,
            recipe.output.monitor_mode,
            has_validation=has_val,
            attacks=recipe.attack.method != "none",
            validates_adversarially=(
                type(model).test_step is not keras.Model.test_step
            ),
        )
    except ValueError as exc:
        raise RecipeError(str(exc)) from None
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
    """Stage 2: the phases (`advtrain.training.fit_phases`), with the
    run's checkpoints, NaN guard and preemption (`setup.state`), progress
    lines, TensorBoard and the catastrophic-overfitting guard."""
    from advtrain.callbacks import ProgressLine
    from advtrain.data import make_input
    from advtrain.progress import EpochProgress

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
        state.epoch_start(setup.model, seed=seed, image_shape=splits.image_shape),
        progress,
    ]
    after = []
    if recipe.output.tensorboard:
        logs = str(state.out / "logs")
        after.append(keras.callbacks.TensorBoard(logs, write_graph=False))

    history, seconds = fit_phases(
        setup,
        phases=recipe_phases(recipe, plan.epochs),
        optimizer=lambda lr_factor: recipe_optimizer(recipe, plan, lr_factor),
        seed=seed,
        callbacks=state.callbacks(before, after),
        validation_data=val_ds,
        # A model.builder model has no backbone to freeze; it trains whole
        # (build_from_builder refuses freezing settings).
        freeze_backbone=not recipe.model.builder,
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
    from advtrain.guards import CatastrophicOverfittingGuard

    cfg, state = recipe.train, setup.state
    batches = make_input(
        setup.splits.train,
        batch_size=cfg.co_guard_examples,
        training=False,
        **setup.data,
    )
    x, y = next(iter(batches))
    echo(
        f"catastrophic-overfitting guard: PGD-{cfg.co_guard_pgd_steps} at "
        f"eps={recipe.attack.eps:g} on {len(y)} training examples each "
        f"epoch; a drop > {cfg.co_guard_drop:g} triggers {cfg.co_guard_action}"
    )
    guard = CatastrophicOverfittingGuard(
        x.numpy(),
        y.numpy(),
        eps=recipe.attack.eps,
        norm=recipe.attack.norm,
        steps=cfg.co_guard_pgd_steps,
        drop=cfg.co_guard_drop,
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
    from advtrain.evaluation import evaluate_robustness, plot_eps_sweep

    classifier, runtime, out = setup.classifier, setup.runtime, setup.state.out
    _assert_finite(classifier, "model.keras")
    if runtime.workers > 1:
        from advtrain.runtime import weights_fingerprint

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
    evaluation = evaluate_robustness(
        classifier,
        test_ds,
        **_evaluation_keys(recipe),
        num_classes=setup.splits.num_classes,
        strategy=runtime.strategy,
    )
    samples = setup.state.samples_trained(setup.plan.epochs, setup.plan.global_batch)
    history, seconds = trained.history, trained.seconds
    metrics: dict[str, Any] = {
        "recipe": recipe.name,
        **evaluation,
        "bn_gap": gap,
        "train_seconds": round(seconds, 2),
        "train_samples_per_second": round(samples / max(seconds, 1e-9), 1),
        "epoch_seconds": [round(s, 2) for s in trained.epoch_seconds],
        "final_train_metrics": {k: float(v[-1]) for k, v in history.items() if v},
    }
    metrics["sanity_checks"] = _sanity_checks(
        classifier, test_ds, recipe, echo, runtime.strategy, evaluation
    )
    if trained.co_guard is not None:
        metrics["co_guard"] = trained.co_guard
    if recipe.output.plots and evaluation.get("eps_sweep"):
        plot_eps_sweep(
            evaluation["eps_sweep"], out / "eps_sweep.png", title=recipe.name
        )
    _report_and_export(out, recipe, metrics, history, classifier, setup.splits, echo)
    atomic_write_json(out / "metrics.json", metrics)
    return RunResult(out, metrics, history)


def _assert_finite(model: keras.Model, what: str) -> None:
    from advtrain.callbacks import NonFiniteLossError
    from advtrain.guards import first_nonfinite_variable

    name = first_nonfinite_variable(model)
    if name is not None:
        raise NonFiniteLossError(
            f"{name} holds NaN or Inf after training; {what} "
            "was not written. Likely causes: learning rate too high, eps "
            "too large, or float16 overflow."
        )


def _evaluation_keys(recipe: Recipe) -> dict[str, Any]:
    """`evaluate_robustness`'s keyword arguments from the recipe."""
    keys = recipe.eval.model_dump(exclude={"sanity_examples"})
    return {**keys, "default_eps": recipe.attack.eps}


def _settle_batchnorm(classifier, recipe: Recipe, splits, plan, echo: Echo) -> dict:
    """`model.batchnorm`'s after-training step: gap on held-out data,
    recalibration per `recalibrate`, the gap again; echoes what it did."""
    from advtrain.data import make_input
    from advtrain.models.batchnorm import settle_batchnorm

    bn_cfg, data = recipe.model.batchnorm, input_options(recipe)
    held_out = splits.val if splits.val is not None else splits.test
    gap_x, gap_y = next(
        iter(make_input(held_out, batch_size=512, training=False, **data))
    )
    clean_train = make_input(
        splits.train, batch_size=plan.global_batch, training=False, **data
    )
    gap = settle_batchnorm(
        classifier,
        gap_x.numpy(),
        gap_y.numpy(),
        batch_size=min(plan.global_batch, len(gap_y)),
        train_batches=clean_train,
        **_keys(bn_cfg, "recalibrate", "gap_threshold", "recalibrate_batches"),
    )
    if gap["recalibrated"]:
        echo(
            "recalibrated BatchNorm moving statistics on "
            f"{gap['recalibrated']} clean training batch(es): gap "
            f"{100 * gap['before']['gap']:+.2f} -> {100 * gap['gap']:+.2f} points"
        )
    warning = gap.pop("warning")
    if warning:
        echo(f"warning: {warning}")
    return gap


def _sanity_checks(
    classifier, test_ds, recipe: Recipe, echo: Echo, strategy=None, evaluation=None
):
    from advtrain.sanity import format_sanity_checks, masking_check, run_sanity_checks

    cfg = recipe.eval
    checks = []
    if cfg.sanity_examples > 0:
        checks = run_sanity_checks(
            classifier,
            test_ds,
            default_eps=recipe.attack.eps,
            eps=cfg.eps,
            norm=cfg.norm,
            pgd_steps=cfg.pgd_steps,
            pgd_step_size=cfg.pgd_step_size,
            pgd_restarts=cfg.pgd_restarts,
            seed=cfg.seed,
            batch_size=cfg.batch_size,
            max_examples=cfg.sanity_examples,
            strategy=strategy,
        )
    # Free: it reads the evaluation's own cascade, so it runs even when the
    # PGD-based checks are off (sanity_examples: 0).
    masking = masking_check(evaluation or {})
    if masking is not None:
        checks.append(masking)
    if checks:
        echo(format_sanity_checks(checks))
    return checks


def _report_and_export(out, recipe, metrics, history, classifier, splits, echo):
    import shutil

    from advtrain.export import export_saved_model
    from advtrain.report import write_report

    write_report(
        out,
        recipe.to_dict(),
        metrics,
        history,
        class_names=splits.class_names,
        plots=recipe.output.plots,
    )
    if recipe.output.export_saved_model:
        target = out / "export" / "saved_model"
        shutil.rmtree(target, ignore_errors=True)  # a resumed run re-exports
        export_saved_model(classifier, target)
        echo(f"exported SavedModel (uint8 images in) to {target}")


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
    """A two-column text table: the headline (`robustness_headline`)
    first, then the secondary numbers."""
    rows = []
    if "robust_accuracy" in metrics:
        from advtrain.report import headline_parts

        over, text = headline_parts(metrics)
        rows.append(("robust accuracy (worst case)", text))
        rows.append(("  over", over))
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
        text = f"{100 * g['gap']:+.2f} points"
        if g.get("recalibrated"):
            text += f" (before recalibration {100 * g['before']['gap']:+.2f})"
        rows.append(("BN gap (train - inference mode)", text))
    width = max(len(label) for label, _ in rows) if rows else 0
    return "\n".join(f"  {label:<{width}}  {text}" for label, text in rows)


def load_classifier(path: Union[str, Path], safe_mode: bool = True) -> keras.Model:
    """Loads a saved classifier; `safe_mode` refuses lambda layers.

    Keras's safe mode refuses to deserialise Python bytecode (a `Lambda`
    layer's function), which would run when loaded. Pass
    `safe_mode=False` only for files you trust (`advtrain eval
    --unsafe-load`).
    """
    import advtrain.models  # noqa: F401  (registers advtrain's layers)
    from advtrain.io import check_keras_file

    check_keras_file(path)
    try:
        return keras.models.load_model(path, safe_mode=safe_mode, compile=False)
    except Exception as exc:  # noqa: BLE001 - any failure: the file is bad
        if safe_mode and "safe_mode" in str(exc):
            raise RecipeError(
                f"{path}: refusing to load: the file holds Python code (a "
                "Lambda layer) that would run on load. If you trust it: "
                "`advtrain eval --unsafe-load`, or safe_mode=False."
            ) from None
        raise RecipeError(
            f"model {path}: cannot load it as a Keras classifier "
            f"({one_line(exc)[:200]})."
        ) from None


def evaluate_saved(
    model_path: Union[str, Path],
    recipe: Recipe,
    *,
    echo: Echo = print,
    safe_mode: bool = True,
) -> dict[str, Any]:
    """Evaluates a saved classifier on the recipe's test split.

    `safe_mode=False` loads files that hold Python code (see
    `load_classifier`); only for trusted files.

    When the model sits in a run folder, the result is also written there
    as `eval-metrics.json` (the training run's metrics.json is untouched).
    """
    from advtrain.data import LOAD_OPTIONS, load_splits, make_input
    from advtrain.evaluation import evaluate_robustness

    model_path = Path(model_path)
    splits = load_splits(recipe.data.source, **_keys(recipe.data, *LOAD_OPTIONS))
    classifier = load_classifier(model_path, safe_mode=safe_mode)
    expected = tuple(classifier.input_shape[1:])
    if expected != tuple(splits.image_shape):
        raise RecipeError(
            f"{model_path}: model takes images {expected} but the recipe's "
            f"data gives {tuple(splits.image_shape)}."
        )
    echo(f"evaluating {model_path} on {splits.test_size} test examples ...")
    test_ds = make_input(
        splits.test,
        batch_size=recipe.eval.batch_size,
        training=False,
        **input_options(recipe),
    )
    metrics = evaluate_robustness(
        classifier, test_ds, **_evaluation_keys(recipe), num_classes=splits.num_classes
    )
    metrics["sanity_checks"] = _sanity_checks(
        classifier, test_ds, recipe, lambda line: None, evaluation=metrics
    )
    if (model_path.parent / "recipe.yaml").is_file():
        atomic_write_json(model_path.parent / "eval-metrics.json", metrics)
    return metrics
