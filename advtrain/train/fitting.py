"""`advtrain.fit`: any Keras model (a regressor, a sequence model, a
classifier), adversarially trained or not, through advtrain's runtime:
strategy, precision, XLA, batch arithmetic, phases, checkpoints and resume.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, Union

import keras
import numpy as np
import pydantic

from advtrain.data.errors import tensorflow_or_none
from advtrain.models.batchnorm.options import BatchNormOptions
from advtrain.models.batchnorm.policy import (
    SETTLE_KEYS,
    apply_batchnorm_policy,
    batchnorm_layers,
    settle_batchnorm,
)
from advtrain.models.freezing import Phase
from advtrain.train.options import CheckpointOptions, PlanOptions, RuntimeOptions
from advtrain.train.preemption import restores_signal_handlers
from advtrain.train.runtime import (
    OPTIMIZER_KEYS,
    PLAN_KEYS,
    BatchPlan,
    Runtime,
    make_optimizer,
    make_runtime,
    plan_batches,
)
from advtrain.train.training_state import TrainingState
from advtrain.utils.options import format_validation_error
from advtrain.utils.progress import Echo

ModelOrBuilder = Union[keras.Model, Callable[[], keras.Model]]

tf = tensorflow_or_none()  # None: `fit` needs it, the BatchNorm settle not

# Held-out examples for the BatchNorm gap.
_GAP_EXAMPLES = 512


@dataclasses.dataclass
class FitResult:
    """What `fit` returns.

    Attributes:
        model: the trained model (with an attack, the `AdversarialModel`
            whose `.classifier` is yours).
        history: `History.history`; with `checkpoints`, the whole run's.
        plan: the batch arithmetic that was printed.
        runtime: the strategy and settings that ran.
        bn_gap: for a classifier with BatchNorm, `settle_batchnorm`'s
            train-mode vs inference-mode accuracy after training.
        train_seconds: the seconds this process spent in the phases.
        samples_trained: the examples this process trained on (a resumed
            run skips those trained before).
        output_dir: with `checkpoints`, the folder this process wrote
            (another worker's: a private temporary one).
        verdict: with a `CatastrophicOverfittingGuard` among the callbacks,
            `advtrain.evaluation.verdict.run_verdict` of its record
            (`{"kind", "reasons"}`); `advtrain.evaluate` gives the
            evaluation's own. None without a guard.
    """

    model: keras.Model
    history: dict[str, list[float]]
    plan: BatchPlan
    runtime: Runtime
    bn_gap: Optional[dict[str, Any]] = None
    train_seconds: float = 0.0
    samples_trained: int = 0
    output_dir: Optional[Path] = None
    verdict: Optional[dict[str, Any]] = None


@dataclasses.dataclass
class Stream:
    """Training data as a function of `skip` (the endless stream of global
    batches without its first `skip`), with the examples one epoch covers
    and, for the BatchNorm gap, held-out data and plain training batches.

    Example:

    ```python
    data = Stream(lambda skip: batches(x, y).repeat().skip(skip), len(x), 64)
    advtrain.fit(build, data, loss="mse")
    ```
    """

    batches: Callable[[int], Any]
    examples: int
    batch_size: int
    held_out: Any = None
    plain: Any = None


@dataclasses.dataclass
class Setup:
    """A run set up once (`prepare`): what `fit` trains, and what a caller
    times or describes without training.

    Attributes:
        runtime: the strategy and settings.
        plan: the batch arithmetic.
        classifier: the user's model (logits out), in the runtime's scope.
        model: the training model around it (the classifier, or its
            `AdversarialModel`).
        stream: `stream(skip)`, the global batches without the first `skip`.
        train: the validated `PlanOptions`.
        loss: the loss `fit` compiles.
        phases: the phases `fit` trains (one without freezing).
        batchnorm: the BatchNorm policy (`BatchNormOptions`' dict).
    """

    runtime: Runtime
    plan: BatchPlan
    classifier: keras.Model
    model: keras.Model
    stream: Callable[[int], Any]
    train: PlanOptions
    loss: Any
    phases: list[Phase]
    batchnorm: dict[str, Any]
    freeze: bool = False
    checks: Any = None
    settle: tuple = (None, None)  # held-out data and plain training batches
    echo: Echo = print
    train_data: Any = None  # for the BatchNorm gap without held-out data
    resume_hint: str = ""  # how to resume, in the preemption message
    # How warnings name the BatchNorm settle's settings (a caller's keys).
    names: dict[str, str] = dataclasses.field(default_factory=lambda: SETTLE_NAMES)


def prepare(
    model: ModelOrBuilder,
    data: Any,
    *,
    batch_size: Optional[int] = None,
    epochs: Union[int, list[Phase], None] = None,
    loss: Any = None,
    attack: Any = None,
    train: Union[PlanOptions, dict, None] = None,
    runtime: Union[Runtime, RuntimeOptions, dict, None] = None,
    batchnorm: Union[BatchNormOptions, dict, None] = None,
    echo: Optional[Echo] = print,
) -> Setup:
    """Sets a run up once: the runtime, the batch plan (printed), the model
    in the strategy's scope with its BatchNorm policy and attack, and the
    training stream. `fit` takes the arguments of the same names.

    Example:

    ```python
    setup = advtrain.prepare(build, (x, y), batch_size=64, loss="mse")
    result = advtrain.fit(setup)
    ```
    """
    say = echo or _silent
    rt, bn = _as_runtime(runtime), _batchnorm_options(batchnorm)
    phases = epochs if isinstance(epochs, list) else None
    if phases is not None:
        epochs = phases[-1].end_epoch if phases else 0
    options = _train_options(train, batch_size=batch_size, epochs=epochs)
    stream, size, batch, settle = _stream(data, options)
    plan, options = _plan(rt, size, batch, options, say)
    net, classifier = _built_model(model, rt, plan, bn, say, attack, options.seed)
    loss = _default_loss(net, classifier, loss)
    stream, checks = _label_checked(stream, net, classifier, loss, data)
    return Setup(
        rt,
        plan,
        classifier,
        net,
        stream,
        options,
        loss,
        _checked_phases(phases, plan.epochs),
        bn,
        freeze=phases is not None,
        checks=checks,
        settle=settle or (None, None),
        echo=say,
        train_data=None if callable(data) or settle else data,
    )


def fit(
    model: Union[ModelOrBuilder, Setup],
    data: Any = None,
    *,
    batch_size: Optional[int] = None,
    epochs: Union[int, list[Phase], None] = None,
    loss: Any = None,
    metrics: Optional[list] = None,
    attack: Any = None,
    train: Union[PlanOptions, dict, None] = None,
    runtime: Union[Runtime, RuntimeOptions, dict, None] = None,
    batchnorm: Union[BatchNormOptions, dict, None] = None,
    checkpoints: Union[str, Path, CheckpointOptions, dict, None] = None,
    validation_data: Any = None,
    callbacks: Optional[list] = None,
    verbose: Union[int, str] = 0,
    echo: Optional[Echo] = print,
) -> FitResult:
    """Trains any Keras model under advtrain's runtime; adversarial or not.

    The batch is global (split across replicas), epochs are never divided;
    no global state changes (random streams are seeded by `train.seed`,
    the SIGTERM handler is installed only while it runs).

    Args:
        model: a Keras model, a function of no arguments building one, an
            `AdversarialModel` (used as is), or a `Setup` from `prepare`
            (which holds `data` to `batchnorm` and `echo`: leave them out).
        data: `(x, y)` arrays or memory maps, a `tf.data.Dataset`, a
            function building one, a `Stream`, or a function of `skip`
            returning the endless global batches without the first `skip`.
        batch_size: the global batch (`train.batch_size`).
        epochs: `train.epochs`, or the phases ending at it
            (`advtrain.models.freezing.phases`, each a fresh optimizer).
        loss: a Keras loss (with an attack: cross-entropy from logits).
        metrics: Keras metrics.
        attack: an `Attack`, a method name, or a dict of its config and
            the training model's keys (`adv_weight`, `reuse_gradient`, ...).
        train: `PlanOptions` or its dict.
        runtime: `RuntimeOptions`, its dict or a `Runtime`; default auto.
        batchnorm: `BatchNormOptions` or its dict (`model.batchnorm`).
        checkpoints: a folder or `CheckpointOptions` (`output`'s keys):
            resumes from its newest usable checkpoint, checkpoints, stops
            on NaN; a second call with the same folder continues.
        validation_data: passed to `Model.fit`.
        callbacks: passed to `Model.fit`.
        verbose: passed to `Model.fit`.
        echo: receives the runtime, batch and BatchNorm lines (None: silent).

    Example:

    ```python
    train = {"learning_rate": 1e-3, "seed": 0}
    result = advtrain.fit(build, (x, y), batch_size=64, attack="pgd", train=train)
    ```
    """
    setup = model
    if not isinstance(setup, Setup):
        setup = prepare(
            model,
            data,
            batch_size=batch_size,
            epochs=epochs,
            loss=loss,
            attack=attack,
            train=train,
            runtime=runtime,
            batchnorm=batchnorm,
            echo=echo,
        )
    else:
        _refuse_setup_arguments(locals())
    return _fit_setup(
        setup,
        metrics=metrics,
        checkpoints=_checkpoint_options(checkpoints),
        validation_data=validation_data,
        callbacks=list(callbacks or []),
        verbose=verbose,
    )


@restores_signal_handlers
def _fit_setup(
    setup: Setup, *, metrics, checkpoints, validation_data, callbacks, verbose
):
    from advtrain.train.guards import CatastrophicOverfittingGuard

    net, plan = setup.model, setup.plan
    guards = [c for c in callbacks if isinstance(c, CatastrophicOverfittingGuard)]
    for guard in guards:
        guard.finish_on_train_end = False  # one Model.fit per phase
    state = None
    if checkpoints.dir is not None:
        state = _opened_state(setup, checkpoints, validation_data is not None)
        callbacks = state.callbacks(net, _input_shape(setup.classifier), callbacks)
    with setup.checks.clean_errors():  # a bad batch's error in one line
        history, seconds = _fit_phases(
            setup, metrics, callbacks, state, validation_data, verbose
        )
    for guard in guards:
        guard.set_model(net)
        guard.finish()
    if state is not None:
        history = state.history(history)
        samples = state.samples_trained(plan.epochs, plan.global_batch)
    else:
        samples = plan.epochs * plan.steps_per_epoch * plan.global_batch
    gap = _settle(setup, validation_data)
    out = state.out if state is not None else None
    verdict = _guard_verdict(guards)
    return FitResult(
        net, history, plan, setup.runtime, gap, seconds, samples, out, verdict
    )


def _guard_verdict(guards: list) -> Optional[dict[str, Any]]:
    # The guard has said its warning as it fired; this is the record.
    if not guards:
        return None
    from advtrain.evaluation.verdict import run_verdict

    return run_verdict(guards[0].summary())


def _refuse_setup_arguments(given: dict[str, Any]) -> None:
    names = ("data", "batch_size", "epochs", "loss", "attack", "train")
    names += ("runtime", "batchnorm")
    passed = [name for name in names if given[name] is not None]
    if passed:
        raise TypeError(
            "A Setup holds the data and the run's settings: leave them out "
            f"of fit. Received: {', '.join(f'{n}=...' for n in passed)}"
        )


def _silent(line: str) -> None:
    pass


def _settle(setup: Setup, validation_data: Any):
    held_out, plain = setup.settle
    if held_out is None:
        held_out = validation_data if validation_data is not None else setup.train_data
    if plain is None:
        plain = setup.stream(0)
    return _settle_trained_batchnorm(
        setup.classifier,
        held_out,
        plain,
        setup.plan.per_replica_batch,
        setup.batchnorm,
        setup.echo,
        setup.names,
    )


# How fit's warnings name the BatchNorm settle's settings: by option group.
SETTLE_NAMES = {
    "batch_size": "train.batch_size",
    "momentum": "batchnorm.momentum",
    "recalibrate": "batchnorm.recalibrate",
}


def _input_shape(model: keras.Model) -> Optional[tuple]:
    inputs = getattr(model, "inputs", None)
    return tuple(inputs[0].shape[1:]) if inputs else None


def _train_options(train: Any, **given: Any) -> dict[str, Any]:
    """`train` as a dict, with fit's `batch_size` and `epochs` filled in;
    one value given twice differently is refused."""
    if train is None:
        options = {}
    elif isinstance(train, PlanOptions):
        options = train.model_dump(include=set(PlanOptions.model_fields))
    elif isinstance(train, dict):
        options = dict(train)
    else:
        raise TypeError(
            f"train must be a PlanOptions, its dict or None. Received: train={train!r}"
        )
    for name, value in given.items():
        if value is None:
            continue
        if name in options and options[name] != value:
            raise ValueError(
                f"{name} is given twice: set it once, as {name}= or "
                f"train.{name}. Received: {name}={value!r}, "
                f"train.{name}={options[name]!r}"
            )
        options[name] = value
    return options


def _stream(data: Any, options: dict[str, Any]):
    """(stream(skip), examples or None, global batch, BatchNorm settle data
    or None)."""
    if isinstance(data, Stream):
        settle = (data.held_out, data.plain)
        return data.batches, data.examples, data.batch_size, settle
    stream, size, batch = _training_data(
        data,
        options.get("batch_size"),
        options.get("shuffle", True),
        options.get("seed", 0),
        options.get("steps_per_epoch"),
    )
    return stream, size, batch, None


def _plan(rt: Runtime, size: Optional[int], batch: int, options: dict, say: Echo):
    if size is None and options.get("steps_per_epoch") is None:
        raise ValueError(
            "The training data's length is unknown (a generator or repeated "
            "dataset): pass train.steps_per_epoch. Received: "
            "steps_per_epoch=None"
        )
    train = _validated(PlanOptions, dict(options, batch_size=batch), "train")
    size = size if size is not None else batch
    plan = plan_batches(rt, size, **train.model_dump(include=set(PLAN_KEYS)))
    say(rt.describe())
    say(plan.describe())
    return plan, train


def _built_model(model, rt, plan, bn, say, attack, seed):
    """(training model, the user's model in it): built in the strategy's
    scope, BatchNorm momentum set for the run, wrapped for the attack."""
    from advtrain.models.adversarial import AdversarialModel

    if isinstance(model, AdversarialModel):
        if attack is not None:
            raise TypeError(
                "An AdversarialModel brings its attack: leave attack out. "
                f"Received: attack={attack!r}"
            )
        return model, model.classifier
    with rt.scope():
        classifier = _model_in_scope(model, rt)
        steps = plan.epochs * plan.steps_per_epoch
        # The fused kernel is the training step's, below.
        note = apply_batchnorm_policy(
            classifier, total_steps=steps, momentum=bn["momentum"], fused_kernel=False
        )
        if note:
            say(note)
        net = training_model(
            classifier,
            attack,
            seed=seed,
            steps_per_epoch=plan.steps_per_epoch,
            fused_batchnorm=bn["fused_kernel"],
        )
        if net is not classifier:
            say(f"step: {net.step_note}")
    return net, classifier


# The attack section's keys that set the training model, not the attack.
_MODEL_KEYS = (
    "adv_weight",
    "reuse_gradient",
    "mode",
    "objective",
    "objective_options",
    "eps_ramp_epochs",
)


def training_model(
    classifier: keras.Model,
    attack: Any,
    *,
    seed: int = 0,
    steps_per_epoch: Optional[int] = None,
    fused_batchnorm: Any = "auto",
) -> keras.Model:
    """The objective (default: `AdversarialModel`) around `classifier`, or
    the classifier itself without an attack (unless `attack` names its
    objective: then that model, stepping clean). `attack`: as `fit`'s (a dict
    may hold `adv_weight`, `reuse_gradient`, `mode`, `objective`,
    `objective_options`, `eps_ramp_epochs`); `steps_per_epoch` turns
    `eps_ramp_epochs` into steps (without it, no ramp)."""
    from advtrain.models.objectives import objectives

    settings = {}
    if isinstance(attack, pydantic.BaseModel):
        attack = attack.model_dump()
    if isinstance(attack, dict):
        settings = {k: attack[k] for k in _MODEL_KEYS if k in attack}
        attack = {k: v for k, v in attack.items() if k not in _MODEL_KEYS}
        attack = {k: v for k, v in attack.items() if v is not None}
    attack = _as_attack(attack)
    if attack is None and "objective" not in settings:
        return classifier  # a section naming its objective keeps its model
    ramp = settings.get("eps_ramp_epochs") or 0
    if ramp and steps_per_epoch:
        ramp = max(1, round(ramp * steps_per_epoch))
    else:
        ramp = 0
    return objectives.get(settings.get("objective", "adversarial"))(
        classifier,
        attack,
        seed=seed,
        adv_weight=settings.get("adv_weight", 0.5) if attack is not None else 0.0,
        attack_mode=settings.get("mode", "inference"),
        reuse_gradient=settings.get("reuse_gradient", "auto"),
        eps_ramp_steps=ramp,
        fused_batchnorm=fused_batchnorm,
        batchnorm_momentum=None,  # the caller sets it for the whole run
        **settings.get("objective_options", {}),
    )


def _default_loss(net, classifier, loss):
    if loss is not None:
        return loss
    if net is not classifier:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    raise ValueError(
        "fit needs a loss for clean training (e.g. loss='mse'). Received: loss=None"
    )


def _checked_phases(phases: Optional[list[Phase]], epochs: int) -> list[Phase]:
    from advtrain.models.freezing import phases as one_phase

    if phases is None:
        return one_phase(epochs)
    ends = [phase.end_epoch for phase in phases]
    if not ends or ends[-1] != epochs:
        raise ValueError(
            f"phases must end at epoch {epochs} (epochs). Received: phases "
            f"ending at {ends[-1] if ends else None}"
        )
    return list(phases)


def _label_checked(stream, net, classifier, loss, data):
    """(`stream(skip)`, `InputChecks`): a plain model's labels are checked
    against the loss and the model's output: arrays once, here, a stream
    in its graph."""
    from advtrain.models import input_checks as ic

    checks = ic.InputChecks(
        logits_shape=ic.output_shape(classifier),
        labels=ic.label_kind(loss),
        loss_name=ic.loss_name(loss),
    )
    if net is not classifier:  # AdversarialModel: its fit checks the data
        return stream, checks
    if _are_arrays(data):
        checks.checked(*data)
        return stream, checks
    return lambda skip: checks.checked(stream(skip)), checks


def _checkpoint_options(checkpoints: Any) -> CheckpointOptions:
    if checkpoints is None:
        return CheckpointOptions()
    if isinstance(checkpoints, (str, Path)):
        return CheckpointOptions(dir=str(checkpoints))
    if isinstance(checkpoints, dict):
        return _validated(CheckpointOptions, checkpoints, "checkpoints")
    if isinstance(checkpoints, CheckpointOptions):
        return checkpoints
    raise TypeError(
        "checkpoints must be a folder, CheckpointOptions, its dict or None. "
        f"Received: checkpoints={checkpoints!r}"
    )


def _opened_state(setup: Setup, options: CheckpointOptions, has_val: bool):
    """The folder's `TrainingState`: the model restored from its newest
    usable checkpoint, the checkpoint callbacks ready."""
    run_dir, rt, plan = Path(options.dir), setup.runtime, setup.plan
    state = TrainingState(
        run_dir,
        resuming=(run_dir / "checkpoints").is_dir(),
        workers=rt.workers,
        resume_hint=setup.resume_hint
        or f"resume with advtrain.fit(..., checkpoints={str(run_dir)!r})",
        echo=setup.echo,
    )
    monitor, mode = resolve_monitor(options, setup.model, has_val)
    state.restore(setup.model, steps_per_epoch=plan.steps_per_epoch)
    attack = getattr(getattr(setup.model, "attack", None), "eps", None)
    hint = f"train.learning_rate={setup.train.learning_rate:g}, "
    if attack is not None:
        hint += f"attack.eps={attack:g}, "
    state.open(
        is_chief=rt.is_chief,
        epochs=plan.epochs,
        keep_checkpoints=options.keep_checkpoints,
        monitor=monitor,
        monitor_mode=mode,
        checkpoint_every_epochs=options.checkpoint_every_epochs,
        checkpoint_every_steps=options.checkpoint_every_steps,
        nan_hint=hint + f"runtime.precision={rt.precision}",
    )
    return state


def resolve_monitor(
    options: CheckpointOptions, model: keras.Model, has_val: bool
) -> tuple[str, str]:
    """(metric, mode) for `monitor: auto` and `monitor_mode: auto`: robust
    accuracy, on the validation data only if the model's test_step attacks
    (else val_adv_accuracy would stay 0)."""
    from advtrain.utils.errors import ArgumentError

    monitor, mode = options.monitor, options.monitor_mode
    attacks = hasattr(model, "attack")
    if monitor == "auto":
        if not attacks:
            monitor = "val_accuracy" if has_val else "accuracy"
        elif has_val and type(model).test_step is not keras.Model.test_step:
            monitor = "val_adv_accuracy"
        else:
            monitor = "adv_accuracy"
    elif monitor.startswith("val_") and not has_val:
        raise ArgumentError(
            "monitor",
            "a validation metric needs validation data; pass some, or "
            "monitor a training metric. "
            f"Received: monitor={monitor}",
        )
    if mode == "auto":
        mode = "min" if monitor.endswith("loss") else "max"
    names = ["loss", "accuracy"] + [
        m.name for m in model.metrics if m.name not in ("loss", "compile_metrics")
    ]
    known = names + [f"val_{n}" for n in names] if has_val else names
    if monitor not in known:
        raise ArgumentError(
            "monitor",
            f"not a metric of this run. Known: {', '.join(known)}. "
            f"Received: monitor={monitor}",
        )
    return monitor, mode


def phase_optimizer(setup: Setup, phase: Phase) -> keras.optimizers.Optimizer:
    """The fresh optimizer `fit` compiles for `phase`: the plan's learning
    rate x the phase's factor, on the plan's schedule."""
    rate = setup.plan.learning_rate * phase.lr_factor
    phase_plan = dataclasses.replace(setup.plan, learning_rate=rate)
    options = setup.train.model_dump(include=set(OPTIMIZER_KEYS))
    return make_optimizer(phase_plan, **options)


def _fit_phases(setup: Setup, metrics, callbacks, state, validation_data, verbose):
    """Fits the phases (from where `state` resumes); returns this process's
    history and training seconds. Each `Model.fit` continues the stream
    (`stream(skip)`: without its first `skip` global batches)."""
    from advtrain.models.freezing import apply_phase

    model, plan, runtime = setup.model, setup.plan, setup.runtime
    spe, start = plan.steps_per_epoch, time.perf_counter()
    start_epoch = state.start_epoch if state else 0
    history: dict[str, list[float]] = {}
    if state:
        state.preemption.arm(state.checkpoint, runtime.strategy)
    for phase in setup.phases:
        if phase.epochs <= 0:
            continue
        frozen = setup.classifier if setup.freeze else None
        trainable = apply_phase(frozen, phase) if frozen is not None else []
        if phase.end_epoch <= start_epoch:
            continue  # done before the interruption
        _announce(phase, trainable, setup.echo)
        compile_setup(setup, metrics, phase, state)
        epoch = max(phase.start_epoch, start_epoch)
        step = state.start_step if state and epoch == start_epoch else 0
        while epoch < phase.end_epoch:
            # An interrupted epoch is fitted alone, for its remaining steps.
            end = epoch + 1 if step else phase.end_epoch
            result = model.fit(
                runtime.process_share(setup.stream(epoch * spe + step)),
                initial_epoch=epoch,
                epochs=end,
                steps_per_epoch=spe - step,
                validation_data=validation_data,
                callbacks=callbacks,
                verbose=verbose,
                shuffle=False,  # the input pipeline shuffles
            )
            for key, values in result.history.items():
                history.setdefault(key, []).extend(values)
            epoch, step = end, 0
    if state:
        state.preemption.disarm()
    runtime.leave_processes(model)  # what follows runs in each process alone
    return history, time.perf_counter() - start


def _announce(phase: Phase, trainable: list, echo: Echo) -> None:
    if phase.name != "train":
        echo(
            f"phase {phase.name}: epochs {phase.start_epoch + 1}-"
            f"{phase.end_epoch}, freeze={phase.freeze}, "
            f"{len(trainable)} backbone layer(s) trainable, "
            f"lr x{phase.lr_factor:g}"
        )


def compile_setup(setup: Setup, metrics=None, phase=None, state=None) -> None:
    """Compiles the setup's model as `fit` does for `phase` (default: the
    first): its optimizer, loss, XLA and steps per host call."""
    model, runtime, plan = setup.model, setup.runtime, setup.plan
    phase = phase or setup.phases[0]
    with runtime.scope():
        model.compile(
            optimizer=phase_optimizer(setup, phase),
            loss=setup.loss,
            metrics=metrics,
            jit_compile=runtime.jit_compile,
            steps_per_execution=plan.steps_per_execution,
        )
        runtime.prepare_model(model)
        if state:
            state.restore_optimizer(model, phase)
            state.checkpoint.phase = phase.name


def _batchnorm_options(batchnorm: Any) -> dict[str, Any]:
    if batchnorm is None:
        batchnorm = BatchNormOptions()
    elif isinstance(batchnorm, dict):
        batchnorm = _validated(BatchNormOptions, batchnorm, "batchnorm")
    elif not isinstance(batchnorm, BatchNormOptions):
        raise TypeError(
            "batchnorm must be a BatchNormOptions, its dict or None. "
            f"Received: batchnorm={batchnorm!r}"
        )
    return batchnorm.model_dump()


def _settle_trained_batchnorm(model, held_out, train_batches, batch, bn, echo, names):
    """`settle_batchnorm` after training: the gap on up to 512 `held_out`
    examples (else the training batches'), recalibrated on
    `train_batches`. None without BatchNorm or integer class labels."""
    if not batchnorm_layers(model):
        return None
    examples = _gap_examples(held_out) or _gap_examples(train_batches)
    if examples is None or not _is_classification(model, *examples):
        return None
    x, y = examples
    report = settle_batchnorm(
        model,
        x,
        y,
        batch_size=min(batch, len(y)),
        train_batches=train_batches,
        **{key: bn[key] for key in SETTLE_KEYS},
        echo=echo,
        names=names,
    )
    report.pop("warning")  # echoed; the result keeps the numbers
    return report


def _gap_examples(source: Any) -> Optional[tuple[np.ndarray, np.ndarray]]:
    from advtrain import backend

    if isinstance(source, (tuple, list)) and len(source) in (2, 3):
        x, y = source[0], source[1]
        if isinstance(x, (dict, list, tuple)):
            return None
        return np.asarray(x[:_GAP_EXAMPLES]), np.asarray(y[:_GAP_EXAMPLES])
    if isinstance(source, keras.utils.PyDataset):
        tensor = np.ndarray
    elif backend.is_dataset(source):
        tensor = tf.Tensor
    else:
        return None
    xs, ys, count = [], [], 0
    for batch in source:
        if not isinstance(batch, tuple) or len(batch) < 2:
            return None
        if not all(isinstance(t, tensor) for t in batch[:2]):
            return None
        xs.append(np.asarray(batch[0]))
        ys.append(np.asarray(batch[1]))
        count += len(ys[-1]) if ys[-1].ndim else 1
        if count >= _GAP_EXAMPLES:
            break
    if not ys or ys[0].ndim == 0:
        return None
    return np.concatenate(xs)[:_GAP_EXAMPLES], np.concatenate(ys)[:_GAP_EXAMPLES]


def _is_classification(model: keras.Model, x: np.ndarray, y: np.ndarray) -> bool:
    if not np.issubdtype(y.dtype, np.integer) or y.size != len(y):
        return False
    out = model(x[:1], training=False)
    return not isinstance(out, (list, tuple, dict)) and out.shape[-1] > 1


def _validated(cls, values: dict, source: str = "advtrain.fit"):
    try:
        return cls(**values)
    except pydantic.ValidationError as exc:
        raise ValueError(format_validation_error(exc, source, cls)) from None


def _as_runtime(runtime: Any) -> Runtime:
    if isinstance(runtime, Runtime):
        return runtime
    if runtime is None:
        runtime = RuntimeOptions()
    if isinstance(runtime, dict):
        runtime = _validated(RuntimeOptions, runtime, "runtime")
    if isinstance(runtime, RuntimeOptions):
        return make_runtime(**runtime.model_dump())
    raise TypeError(
        "runtime must be a Runtime, RuntimeOptions, dict or None. "
        f"Received: runtime={runtime!r}"
    )


def _as_attack(attack: Any):
    from advtrain.attacks import Attack

    if isinstance(attack, str):
        attack = {"method": attack}
    if isinstance(attack, dict):
        return None if attack.get("method") == "none" else Attack.from_config(attack)
    if attack is None or isinstance(attack, Attack):
        return attack
    raise TypeError(
        "attack must be an Attack, its config dict, a method name or None. "
        f"Received: attack={attack!r}"
    )


def _model_in_scope(model: ModelOrBuilder, rt: Runtime) -> keras.Model:
    if not isinstance(model, keras.Model):
        if not callable(model):
            raise TypeError(
                "model must be a keras.Model or a function building one. "
                f"Received: model={model!r}"
            )
        built = model()
        if not isinstance(built, keras.Model):
            raise TypeError(
                "The model function must return a keras.Model. "
                f"Received: {type(built).__name__}"
            )
        return built
    if rt.holds_variables_of(model):
        return model
    try:
        clone = keras.models.clone_model(model)
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise ValueError(
            f"The model was built outside the {rt.strategy_name} strategy's "
            "scope and cannot be cloned into it "
            f"({type(exc).__name__}); pass a function that builds it. "
            f"Received: model={model.name}"
        ) from None
    clone.set_weights(model.get_weights())
    return clone


def _training_data(
    data: Any,
    batch_size: Optional[int],
    shuffle: bool,
    seed: int,
    steps_per_epoch: Optional[int] = None,
) -> tuple[Callable[[int], Any], Optional[int], int]:
    """(`stream(skip)`: the endless stream of global batches without its
    first `skip`, number of examples or None, global batch).

    Every new iterator replays the same stream: Keras under a strategy
    opens an extra iterator before training, and per-iterator reshuffling
    would give N replicas another order than one device.
    """
    from advtrain import backend

    is_dataset = backend.is_dataset(data)
    if callable(data) and not is_dataset and _takes_skip(data):
        if batch_size is None or steps_per_epoch is None:
            raise ValueError(
                "A stream function of skip needs batch_size= (its global "
                "batch) and steps_per_epoch=. Received: "
                f"batch_size={batch_size}, steps_per_epoch={steps_per_epoch}"
            )
        return data, None, batch_size
    if not backend.HAS_TENSORFLOW and not _are_arrays(data):
        raise ImportError(
            "advtrain.fit takes a tf.data.Dataset or a function building one "
            "only with TensorFlow, which is not installed: "
            f"{backend.install_command(['tensorflow'])}, or pass (x, y) arrays "
            f"or a stream function of skip. Received: {type(data).__name__}"
        )
    if callable(data) and not is_dataset:
        return _dataset_function(data, batch_size, seed)
    if is_dataset:
        ds, size, batch = _dataset_data(data, batch_size, shuffle, seed)
        return ds.skip, size, batch
    if _are_arrays(data):
        if batch_size is None:
            raise ValueError(
                "Arrays need batch_size= (the global batch). Received: batch_size=None"
            )
        x, y = data
        if len(x) != len(y):
            raise ValueError(
                "x and y must hold the same number of examples. "
                f"Received: len(x)={len(x)}, len(y)={len(y)}"
            )
        from advtrain.data.in_memory import array_stream

        stream = array_stream(x, y, batch_size, shuffle=shuffle, seed=seed)
        return stream, len(x), batch_size
    raise TypeError(
        "data must be (x, y) arrays, a tf.data.Dataset or a function "
        f"building one. Received: {type(data).__name__}"
    )


def _are_arrays(data: Any) -> bool:
    return isinstance(data, (tuple, list)) and len(data) == 2


def _takes_skip(function: Callable) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        for p in parameters
    )


def _dataset_function(build: Callable[[], Any], batch_size, seed):
    def built() -> tf.data.Dataset:
        keras.utils.set_random_seed(seed)  # the order depends on seed alone
        ds = build()
        if not isinstance(ds, tf.data.Dataset):
            raise TypeError(
                "The data function must return a tf.data.Dataset. "
                f"Received: {type(ds).__name__}"
            )
        return ds

    if batch_size is not None:
        raise ValueError(
            "A data function builds batched datasets: leave batch_size out. "
            f"Received: batch_size={batch_size}"
        )
    _, size, batch = _dataset_data(built(), None, False, seed)
    return lambda skip: built().repeat().skip(skip), size, batch


def _dataset_data(ds, batch_size, shuffle, seed):
    cardinality = int(ds.cardinality())
    known = cardinality if cardinality >= 0 else None
    if batch_size is not None:

        def stream(_):
            examples = ds
            if shuffle:
                examples = examples.shuffle(
                    10_000, seed=seed, reshuffle_each_iteration=True
                )
            return examples.batch(batch_size, drop_remainder=True).repeat()

        # Built inside flat_map, the shuffle's state is created anew for
        # every iterator: each one replays the same stream.
        stream = tf.data.Dataset.range(1).flat_map(stream)
        return stream.prefetch(tf.data.AUTOTUNE), known, batch_size
    first = tf.nest.flatten(ds.element_spec)[0]
    batch = first.shape[0] if first.shape.rank else None
    if batch is None:
        raise ValueError(
            "A batched dataset needs a static batch size (batch with "
            "drop_remainder=True), or pass unbatched examples with "
            "batch_size=. Received: batch dimension None"
        )
    size = None if known is None else known * batch
    return ds.repeat(), size, int(batch)
