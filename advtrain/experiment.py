"""`run(recipe)`: wires data, model, attack and runtime; owns the run folder.

A run folder holds:
    recipe.yaml      the resolved recipe (after --set overrides)
    checkpoints/     atomic `.keras` checkpoints (model + optimizer)
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, Union

import keras

from advtrain.attacks import Attack
from advtrain.config import AttackConfig, Recipe, RecipeError
from advtrain.io import atomic_path, atomic_write_json, atomic_write_text
from advtrain.preemption import restores_signal_handlers, watch_launcher

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
        clip_start=cfg.clip_start,
    )


def build_training_model(
    recipe: Recipe, classifier: keras.Model, steps_per_epoch: Optional[int] = None
) -> keras.Model:
    """AdversarialModel (or TRADES) around `classifier` per the recipe.
    `steps_per_epoch` turns `attack.eps_ramp_epochs` into steps (without
    it there is no ramp)."""
    from advtrain.models.adversarial import AdversarialModel
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
    return AdversarialModel(
        classifier,
        attack,
        adv_weight=cfg.adv_weight if attack is not None else 0.0,
        attack_mode=cfg.mode,
        seed=recipe.train.seed,
        fused=cfg.fused_step and attack is not None,
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
            recipe.model, splits.image_shape, splits.num_classes
        )
    apply_batchnorm_policy(classifier, recipe.model.batchnorm, total_steps)
    return classifier, build_training_model(recipe, classifier, steps_per_epoch)


def resolve_output_dir(recipe: Recipe, output: Optional[Union[str, Path]]) -> Path:
    """The run folder: new, or an unfinished run of the same resolved recipe
    (which `run` resumes). Refuses anything else with a RecipeError naming
    the differing keys (`advtrain.checkpointing.check_run_dir`)."""
    from advtrain.checkpointing import check_run_dir
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


def _train_stream(splits, data_cfg, plan, seed: int, skip: int, strategy):
    """A fresh training stream for one `fit`, with its first `skip` steps
    dropped.

    Built after resetting the global seed, so its order depends on the
    recipe alone; reusing one dataset would not do: each new iterator of a
    dataset that reshuffles draws a new order, which a resumed process
    cannot reproduce. Skipping costs input-pipeline work, no model work.

    With several replicas each input pipeline (one per worker) builds its
    own shard, batched per replica (`make_distributed_input`): a worker
    decodes and augments only the examples its replicas train on, instead
    of the whole stream with Keras's rebatching; on one worker the replicas
    of a step together see the same examples as one device would.
    """
    from advtrain.data import make_distributed_input, make_input

    keras.utils.set_random_seed(seed)
    if strategy.num_replicas_in_sync == 1:
        ds = make_input(
            splits.fresh_train(),
            data_cfg,
            batch_size=plan.global_batch,
            training=True,
        ).repeat()
        return ds.skip(skip) if skip else ds

    return make_distributed_input(
        splits.fresh_train,
        data_cfg,
        strategy,
        plan.global_batch,
        training=True,
        repeat=True,
        skip_steps=skip,
    )


def _known_metrics(model: keras.Model, has_validation: bool) -> list[str]:
    names = ["loss", "accuracy"] + [
        m.name for m in model.metrics if m.name not in ("loss", "compile_metrics")
    ]
    return names + [f"val_{n}" for n in names] if has_validation else names


def _restore_epoch_metrics(model, checkpoint, image_shape, echo: Echo) -> None:
    """Continues the running epoch metrics of an interrupted epoch."""
    import numpy as np

    from advtrain.checkpointing import CheckpointError, restore_variables

    try:
        # Compiled metrics create their variables on first use; one update
        # on a dummy batch (then reset) creates them before the restore.
        x = np.zeros((1, *image_shape), "float32")
        model.compute_metrics(x, np.zeros((1,), "int32"), model(x))
        model.reset_metrics()
        restore_variables(model, checkpoint, "metrics")
    except (CheckpointError, ValueError, RuntimeError) as exc:
        model.reset_metrics()
        echo(
            f"warning: the resumed epoch's logged metrics cover only the "
            f"steps after the resume ({exc})"
        )


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


def _compile(model: keras.Model, optimizer, plan, runtime) -> None:
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        steps_per_execution=plan.steps_per_execution,
        jit_compile=runtime.jit_compile,
    )


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
    from advtrain.config import load_recipe
    result = run(load_recipe("recipes/quickstart.yaml"), "runs/demo")
    result.metrics["pgd_accuracy"]
    ```
    """
    from advtrain.callbacks import (
        AtomicCheckpoint,
        NaNGuard,
        Preemption,
        ProgressLine,
    )
    from advtrain.checkpointing import (
        CheckpointError,
        CheckpointStore,
        find_resume_point,
        read_history,
        resolve_monitor,
        restore_variables,
        truncate_history,
        writable_dir,
    )
    from advtrain.data import load_splits, make_input
    from advtrain.evaluation import evaluate_robustness, plot_eps_sweep
    from advtrain.models.batchnorm import layer_momentum
    from advtrain.models.freezing import apply_phase, phases
    from advtrain.progress import EpochProgress
    from advtrain.runtime import make_optimizer, make_runtime, plan_batches

    run_dir = resolve_output_dir(recipe, output)
    watch_launcher()  # a worker of `advtrain launch` ends with its launcher
    resuming = (run_dir / "recipe.yaml").is_file()
    keras.utils.set_random_seed(recipe.train.seed)
    runtime = make_runtime(recipe.runtime)
    # SIGTERM/SIGINT: checkpoint and exit 75 (advtrain.preemption).
    preemption = Preemption(run_dir, workers=runtime.workers)
    data_cfg = recipe.data
    if recipe.runtime.deterministic and not data_cfg.deterministic:
        # A resumed run replays its batches only if tf.data's order is fixed.
        data_cfg = data_cfg.model_copy(update={"deterministic": True})
    splits = load_splits(recipe.data)
    plan = plan_batches(recipe.train, runtime, splits.train_size)
    attack = attack_from_config(recipe.attack)
    echo(
        f"data: {recipe.data.source} {splits.train_size} train / "
        f"{splits.val_size} val / {splits.test_size} test, image "
        f"{'x'.join(map(str, splits.image_shape))}, {splits.num_classes} classes"
    )
    echo(runtime.describe())
    echo(plan.describe())
    echo(
        "attack: none (clean training)"
        if attack is None
        else f"attack: {recipe.attack.method} eps={attack.eps:g} "
        f"norm={attack.norm} adv_weight={recipe.attack.adv_weight:g} "
        f"backend={attack.backend} mode={recipe.attack.mode}"
        + (
            f" eps_ramp_epochs={recipe.attack.eps_ramp_epochs:g}"
            if recipe.attack.eps_ramp_epochs
            else ""
        )
    )

    with runtime.strategy.scope():
        classifier, model = build_run_model(
            recipe,
            splits,
            plan.epochs * plan.steps_per_epoch,
            steps_per_epoch=plan.steps_per_epoch,
        )
    momentum = layer_momentum(classifier)
    if momentum is not None:
        echo(
            f"batchnorm: momentum {momentum:g} "
            "(model.batchnorm.momentum: "
            f"{recipe.model.batchnorm.momentum or 'null'})"
        )

    has_val = splits.val is not None
    monitor, monitor_mode = resolve_monitor(
        recipe.output.monitor,
        recipe.output.monitor_mode,
        has_validation=has_val,
        attacks=attack is not None,
        validates_adversarially=(type(model).test_step is not keras.Model.test_step),
    )
    known = _known_metrics(model, has_val)
    if monitor not in known:
        raise RecipeError(
            f"output.monitor={monitor}: not a metric of this run. "
            f"Known: {', '.join(known)}."
        )
    spe = plan.steps_per_epoch
    resume = None
    if resuming:
        resume = find_resume_point(run_dir / "checkpoints", echo=echo)
        if resume is None:
            echo(f"resuming {run_dir}: no usable checkpoint; from epoch 1")
        else:
            saved_spe = resume.state.get("steps_per_epoch")
            if saved_spe not in (None, spe):
                raise CheckpointError(
                    f"{resume.path}: written with {saved_spe} steps per "
                    f"epoch, the data now gives {spe}; the training data "
                    "changed, so the run cannot continue where it stopped"
                )
            restore_variables(model, resume, "model")
            echo(
                f"resuming {run_dir} from {resume.path.name}: epoch "
                f"{resume.epoch + 1}, after step {resume.step}/{spe}"
                + (
                    " (the interrupted epoch's remaining steps are trained "
                    "with the same batches)"
                    if resume.step
                    else ""
                )
            )
    # Only the chief writes into the run folder; other workers run the same
    # code against a private temporary folder.
    out = writable_dir(run_dir, runtime.is_chief)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "recipe.yaml", recipe.to_yaml())
    start_epoch = resume.epoch if resume else 0
    start_step = resume.step if resume else 0
    if resuming:
        truncate_history(out / "history.csv", start_epoch)
    store = CheckpointStore(
        out / "checkpoints",
        keep=recipe.output.keep_checkpoints,
        monitor=monitor,
        mode=monitor_mode,
    )
    store.remove_temporaries()
    val_ds = None
    if splits.val is not None:
        val_ds = make_input(
            splits.val,
            recipe.data,
            batch_size=recipe.eval.batch_size,
            training=False,
        )
    progress = ProgressLine(echo, plan.epochs, plan.steps_per_epoch * plan.global_batch)
    guard = NaNGuard(
        spe,
        hint=f"train.learning_rate={recipe.train.learning_rate:g}, "
        f"attack.eps={recipe.attack.eps:g}, "
        f"runtime.precision={recipe.runtime.precision}",
        last_good=store.latest,
        # Step checkpoints read every variable anyway: check them first.
        check_state_every_batch=bool(recipe.output.checkpoint_every_steps),
    )
    checkpoint = AtomicCheckpoint(
        store,
        steps_per_epoch=spe,
        epochs=plan.epochs,
        every_epochs=recipe.output.checkpoint_every_epochs,
        every_steps=recipe.output.checkpoint_every_steps,
        global_step=start_epoch * spe + start_step,
    )
    # Epoch metrics of an interrupted epoch continue from the checkpoint's
    # running values (Keras resets them just before on_epoch_begin).
    pending_metrics = [resume] if resume is not None and start_step else []

    def on_epoch_begin(epoch, logs=None):
        # Host-side randomness of epoch e depends on (seed, e) only.
        keras.utils.set_random_seed(recipe.train.seed + epoch)
        if pending_metrics:
            _restore_epoch_metrics(
                model, pending_metrics.pop(), splits.image_shape, echo
            )

    callbacks: list[keras.callbacks.Callback] = [
        # First: its live bar is cleared before any epoch-end line prints.
        EpochProgress(plan.epochs),
        keras.callbacks.LambdaCallback(on_epoch_begin=on_epoch_begin),
        progress,
        guard,
        keras.callbacks.CSVLogger(str(out / "history.csv"), append=True),
        checkpoint,
    ]
    co_guard = None
    if recipe.train.co_guard:
        co_guard = _co_guard(
            recipe,
            splits,
            data_cfg,
            echo,
            state_path=out / "checkpoints" / "co_guard.npz",
        )
        if resuming and co_guard.load_state(co_guard.state_path, start_epoch):
            echo(
                f"catastrophic-overfitting guard: resumed with its record of "
                f"{len(co_guard.accuracies)} epoch(s), best PGD accuracy "
                f"{100 * co_guard.best_accuracy:.1f}% (epoch "
                f"{co_guard.best_epoch})"
            )
        co_guard.finish_on_train_end = False  # one fit per phase: see below
        callbacks.insert(1, co_guard)  # before the logs see the epoch
    if recipe.output.tensorboard:
        callbacks.append(
            keras.callbacks.TensorBoard(str(out / "logs"), write_graph=False)
        )
    callbacks.append(preemption)  # last: it may checkpoint the epoch's end
    preemption.arm(checkpoint, runtime.strategy)
    start = time.perf_counter()
    history: dict[str, list[float]] = {}
    for phase in phases(recipe.model, plan.epochs):
        if phase.epochs <= 0:
            continue
        # A model.builder model has no backbone to freeze; it trains whole
        # (build_from_builder refuses freezing settings).
        trainable = [] if recipe.model.builder else apply_phase(classifier, phase)
        if phase.end_epoch <= start_epoch:
            continue  # done before the interruption
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
            runtime.prepare_model(model)
            if (
                resume is not None
                and resume.phase == phase.name
                and resume.global_step > phase.start_epoch * spe
            ):
                # Same phase: continue its optimizer (slots, iterations and
                # so the learning-rate schedule, loss scale). A new phase
                # starts a fresh one, as an uninterrupted run does.
                model.optimizer.build(model.trainable_variables)
                restore_variables(model, resume, "optimizer")
        epoch = max(phase.start_epoch, start_epoch)
        step = start_step if epoch == start_epoch else 0
        while epoch < phase.end_epoch:
            # An interrupted epoch is fitted alone, for its remaining steps.
            end = epoch + 1 if step else phase.end_epoch
            guard.begin_fit(step, spe - step)
            checkpoint.begin_fit(phase.name, step, spe - step)
            result = model.fit(
                _train_stream(
                    splits,
                    data_cfg,
                    plan,
                    recipe.train.seed,
                    (epoch - phase.start_epoch) * spe + step,
                    runtime.strategy,
                ),
                initial_epoch=epoch,
                epochs=end,
                steps_per_epoch=spe - step,
                validation_data=val_ds,
                callbacks=callbacks,
                verbose=verbose,
                shuffle=False,  # the tf.data pipeline shuffles
            )
            for key, values in result.history.items():
                history.setdefault(key, []).extend(values)
            epoch, step = end, 0
    preemption.disarm()
    train_seconds = time.perf_counter() - start
    if co_guard is not None:
        co_guard.set_model(model)
        co_guard.finish()
    if resuming:
        history = read_history(out / "history.csv") or history
    _assert_finite(classifier, "model.keras")
    if runtime.workers > 1:
        # `advtrain launch` compares these across workers.
        from advtrain.runtime import weights_fingerprint

        echo(f"weights: sha256 {weights_fingerprint(classifier)}")
    gap = _settle_batchnorm(classifier, recipe, splits, plan, echo)
    # After recalibration: model.keras, metrics.json and the SavedModel
    # hold the same weights.
    with atomic_path(out / "model.keras") as tmp:
        classifier.save(tmp)

    echo("evaluating on the test split ...")
    test_ds = make_input(
        splits.test,
        recipe.data,
        batch_size=recipe.eval.batch_size,
        training=False,
    )
    default_eps = recipe.attack.eps
    evaluation = evaluate_robustness(
        classifier,
        test_ds,
        recipe.eval,
        default_eps=default_eps,
        num_classes=splits.num_classes,
        strategy=runtime.strategy,
    )
    # Samples trained by this process (a resumed run skips the others).
    samples = plan.global_batch * max(
        0, plan.epochs * spe - (start_epoch * spe + start_step)
    )
    metrics: dict[str, Any] = {
        "recipe": recipe.name,
        **{k: v for k, v in evaluation.items()},
        "bn_gap": gap,
        "train_seconds": round(train_seconds, 2),
        "train_samples_per_second": round(samples / max(train_seconds, 1e-9), 1),
        "epoch_seconds": [round(s, 2) for s in progress.epoch_seconds],
        "final_train_metrics": {k: float(v[-1]) for k, v in history.items() if v},
    }
    metrics["sanity_checks"] = _sanity_checks(
        classifier, test_ds, recipe, echo, runtime.strategy
    )
    if co_guard is not None:
        metrics["co_guard"] = co_guard.summary()
    if recipe.output.plots and evaluation.get("eps_sweep"):
        plot_eps_sweep(
            evaluation["eps_sweep"], out / "eps_sweep.png", title=recipe.name
        )
    # metrics.json last: its presence marks a finished run.
    _report_and_export(out, recipe, metrics, history, classifier, splits, echo)
    atomic_write_json(out / "metrics.json", metrics)
    return RunResult(out, metrics, history)


def _settle_batchnorm(classifier, recipe: Recipe, splits, plan, echo: Echo) -> dict:
    """`model.batchnorm`'s after-training step: gap on held-out data,
    recalibration per `recalibrate`, the gap again; echoes what it did."""
    from advtrain.data import make_input
    from advtrain.models.batchnorm import settle_batchnorm

    bn_cfg = recipe.model.batchnorm
    held_out = splits.val if splits.val is not None else splits.test
    gap_x, gap_y = next(
        iter(make_input(held_out, recipe.data, batch_size=512, training=False))
    )
    clean_train = make_input(
        splits.train, recipe.data, batch_size=plan.global_batch, training=False
    )
    gap = settle_batchnorm(
        classifier,
        gap_x.numpy(),
        gap_y.numpy(),
        batch_size=min(plan.global_batch, len(gap_y)),
        train_batches=clean_train,
        recalibrate=bn_cfg.recalibrate,
        threshold=bn_cfg.gap_threshold,
        num_batches=bn_cfg.recalibrate_batches,
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


def _co_guard(recipe: Recipe, splits, data_cfg, echo: Echo, state_path):
    """The catastrophic-overfitting guard on a fixed clean training batch."""
    from advtrain.data import make_input
    from advtrain.guards import CatastrophicOverfittingGuard

    cfg = recipe.train
    x, y = next(
        iter(
            make_input(
                splits.train,
                data_cfg,
                batch_size=cfg.co_guard_examples,
                training=False,
            )
        )
    )
    echo(
        f"catastrophic-overfitting guard: PGD-{cfg.co_guard_pgd_steps} at "
        f"eps={recipe.attack.eps:g} on {len(y)} training examples each "
        f"epoch; a drop > {cfg.co_guard_drop:g} triggers {cfg.co_guard_action}"
    )
    return CatastrophicOverfittingGuard(
        x.numpy(),
        y.numpy(),
        eps=recipe.attack.eps,
        norm=recipe.attack.norm,
        steps=cfg.co_guard_pgd_steps,
        drop=cfg.co_guard_drop,
        action=cfg.co_guard_action,
        echo=echo,
        seed=cfg.seed,
        state_path=state_path,
        keep=cfg.co_guard_keep,
    )


def _sanity_checks(classifier, test_ds, recipe: Recipe, echo: Echo, strategy=None):
    from advtrain.sanity import format_sanity_checks, run_sanity_checks

    if recipe.eval.sanity_examples == 0:
        return []
    checks = run_sanity_checks(
        classifier,
        test_ds,
        recipe.eval,
        default_eps=recipe.attack.eps,
        strategy=strategy,
        max_examples=recipe.eval.sanity_examples,
    )
    echo(format_sanity_checks(checks))
    return checks


def _report_and_export(out, recipe, metrics, history, classifier, splits, echo):
    import shutil

    from advtrain.export import export_saved_model
    from advtrain.report import write_report

    write_report(
        out,
        recipe,
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
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RecipeError(
            f"model {path}: cannot load it as a Keras classifier ({first[:200]})."
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
    from advtrain.data import load_splits, make_input
    from advtrain.evaluation import evaluate_robustness

    model_path = Path(model_path)
    splits = load_splits(recipe.data)
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
        recipe.data,
        batch_size=recipe.eval.batch_size,
        training=False,
    )
    metrics = evaluate_robustness(
        classifier,
        test_ds,
        recipe.eval,
        default_eps=recipe.attack.eps,
        num_classes=splits.num_classes,
    )
    metrics["sanity_checks"] = _sanity_checks(
        classifier, test_ds, recipe, lambda line: None
    )
    if (model_path.parent / "recipe.yaml").is_file():
        atomic_write_json(model_path.parent / "eval-metrics.json", metrics)
    return metrics
