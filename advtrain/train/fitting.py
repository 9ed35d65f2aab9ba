"""`advtrain.fit`: any Keras model (a regressor, a sequence model, a
classifier), adversarially trained or not, through advtrain's runtime:
strategy, precision, XLA, batch arithmetic, phases, checkpoints and resume.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import Callable, Mapping
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
from advtrain.train.options import PlanOptions, RuntimeOptions
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
from advtrain.utils.keywords import check_keywords
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
        evaluation: with `test_data`, `advtrain.evaluate`'s result.
        train_seconds: the seconds this process spent in the phases.
    """

    model: keras.Model
    history: dict[str, list[float]]
    plan: BatchPlan
    runtime: Runtime
    bn_gap: Optional[dict[str, Any]] = None
    evaluation: Optional[dict[str, Any]] = None
    train_seconds: float = 0.0


def fit(
    model: ModelOrBuilder,
    data: Any,
    *,
    runtime: Union[Runtime, RuntimeOptions, dict, None] = None,
    attack: Any = None,
    adv_weight: float = 0.5,
    reuse_gradient: Union[bool, str] = "auto",
    loss: Any = None,
    metrics: Optional[list] = None,
    optimizer: Any = "adam",
    learning_rate: float = 1e-3,
    lr_schedule: str = "constant",
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    batch_size: Optional[int] = None,
    epochs: int = 1,
    steps_per_epoch: Optional[int] = None,
    scale_lr: bool = False,
    reference_batch: int = 256,
    warmup_epochs: float = 0.0,
    phases: Optional[list[Phase]] = None,
    shuffle: bool = True,
    seed: int = 0,
    batchnorm: Union[BatchNormOptions, dict, None] = None,
    validation_data: Any = None,
    callbacks: Optional[list] = None,
    verbose: Union[int, str] = 0,
    echo: Optional[Echo] = print,
    test_data: Any = None,
    evaluation: Optional[dict[str, Any]] = None,
    checkpoints: Optional[TrainingState] = None,
    batchnorm_data: Any = None,
    setting_names: Optional[Mapping[str, str]] = None,
    **renamed: Any,
) -> FitResult:
    """Trains any Keras model under advtrain's runtime; adversarial or not.

    The batch is global (split across replicas), epochs are never divided,
    and the arithmetic is printed first. With `attack`, the model (logits
    out) is wrapped in an `AdversarialModel`.

    Args:
        model: a Keras model, a function of no arguments building one, or
            an `AdversarialModel` built in the runtime's scope (used as is).
        data: `(x, y)` arrays or memory maps, a `tf.data.Dataset`, a
            function of no arguments building a dataset of global batches
            (called anew, after the global seed is reset to `seed`), or a
            function of `skip` returning the endless stream of global
            batches without its first `skip` (with `batch_size` and
            `steps_per_epoch`).
        runtime: a `RuntimeOptions`, its dict or a `Runtime`; default auto.
        attack: an `Attack`, its config dict, a method name, or None.
        adv_weight: the adversarial loss weight.
        reuse_gradient: `AdversarialModel`'s step ("auto", True, False).
        loss: a Keras loss (with an attack: cross-entropy from logits).
        metrics: Keras metrics.
        optimizer: "adam", "sgd", "adamw" or a Keras optimizer.
        learning_rate: as `PlanOptions` (advtrain.train.options).
        lr_schedule: as `PlanOptions`.
        momentum: as `PlanOptions`.
        weight_decay: as `PlanOptions`.
        epochs: as `PlanOptions`.
        steps_per_epoch: as `PlanOptions`.
        scale_lr: as `PlanOptions`.
        reference_batch: as `PlanOptions`.
        warmup_epochs: as `PlanOptions`.
        seed: as `PlanOptions`.
        batch_size: the global batch; required for arrays.
        phases: `advtrain.models.freezing.phases(epochs, ...)` (each phase
            a fresh optimizer, so `optimizer` by name); None: one phase.
        shuffle: shuffle arrays and examples anew each epoch.
        batchnorm: `BatchNormOptions` or its dict (the BatchNorm policy).
        validation_data: passed to `Model.fit`.
        callbacks: passed to `Model.fit`; a `CatastrophicOverfittingGuard`
            among them finishes once, after the last phase.
        verbose: passed to `Model.fit`.
        echo: receives the runtime, batch and BatchNorm lines (None: silent).
        test_data: evaluated after training into `FitResult.evaluation`.
        evaluation: `advtrain.evaluate`'s keywords (eps: the attack's).
        checkpoints: a `TrainingState`, restored and opened: training
            resumes where it stopped, checkpoints, stops on NaN and
            checkpoints on SIGTERM.
        batchnorm_data: `(held_out, train_batches)` for the BatchNorm gap
            and recalibration (default: `validation_data` or `data`, and
            the training stream).
        setting_names: how warnings name `fit`'s settings for the user.
        **renamed: refused; a renamed keyword names its new name.

    Example:

    ```python
    result = advtrain.fit(build, (x, y), loss="mse", batch_size=20, epochs=3)
    ```
    """
    _refuse_unknown(renamed, evaluation)
    say = echo or (lambda line: None)
    rt, bn = _as_runtime(runtime), _batchnorm_options(batchnorm)
    stream, size, batch = _training_data(
        data, batch_size, shuffle, seed, steps_per_epoch
    )
    schedule = dict(
        optimizer=optimizer,
        learning_rate=learning_rate,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        scale_lr=scale_lr,
        reference_batch=reference_batch,
        warmup_epochs=warmup_epochs,
        seed=seed,
        lr_schedule=lr_schedule,
        momentum=momentum,
        weight_decay=weight_decay,
    )
    plan, train = _plan(rt, size, batch, schedule, say)
    freeze, phases = phases is not None, _checked_phases(phases, plan.epochs)
    net, classifier = _built_model(
        model,
        rt,
        plan,
        bn,
        say,
        attack=_as_attack(attack),
        adv_weight=adv_weight,
        seed=seed,
        reuse_gradient=reuse_gradient,
    )
    loss = _default_loss(net, classifier, loss)
    stream, checks = _label_checked(stream, net, classifier, loss)
    from advtrain.train.guards import CatastrophicOverfittingGuard

    callbacks = list(callbacks or [])
    guards = [c for c in callbacks if isinstance(c, CatastrophicOverfittingGuard)]
    for guard in guards:
        guard.finish_on_train_end = False  # one Model.fit per phase
    if checkpoints is not None:
        callbacks = checkpoints.callbacks(net, _input_shape(classifier), callbacks)
    with checks.clean_errors():  # a bad batch's error in one line
        history, seconds = _fit_phases(
            net,
            stream,
            runtime=rt,
            plan=plan,
            phases=phases,
            loss=loss,
            metrics=metrics,
            optimizer=optimizer if not isinstance(optimizer, str) else train.optimizer,
            optimizer_options=train.model_dump(include=set(OPTIMIZER_KEYS[1:])),
            seed=seed,
            callbacks=callbacks,
            state=checkpoints,
            freeze=classifier if freeze else None,
            validation_data=validation_data,
            verbose=verbose,
            echo=say,
        )
    for guard in guards:
        guard.set_model(net)
        guard.finish()
    if checkpoints is not None:
        history = checkpoints.history(history)
    if batchnorm_data is None:
        held_out = validation_data if validation_data is not None else data
        batchnorm_data = (None if callable(held_out) else held_out, stream(0))
    gap = _settle_trained_batchnorm(
        classifier,
        *batchnorm_data,
        plan.per_replica_batch,
        bn,
        say,
        _settle_names(setting_names),
    )
    evaluated = _evaluate(classifier, test_data, evaluation, attack, say)
    return FitResult(net, history, plan, rt, gap, evaluated, seconds)


def _input_shape(model: keras.Model) -> Optional[tuple]:
    inputs = getattr(model, "inputs", None)
    return tuple(inputs[0].shape[1:]) if inputs else None


def _settle_names(names: Optional[Mapping[str, str]]) -> Optional[dict[str, str]]:
    if not names:
        return None
    keys = {"batch_size": "batch_size"}
    keys.update({key: f"batchnorm.{key}" for key in ("momentum", "recalibrate")})
    return {own: names.get(ours, ours) for own, ours in keys.items()}


def _refuse_unknown(given: dict[str, Any], evaluation: Any) -> None:
    from advtrain.evaluation.robustness import evaluate_keywords

    if isinstance(evaluation, dict):
        check_keywords("fit: evaluation", evaluation, evaluate_keywords())
    if "fused" in given:
        raise TypeError(
            "fit: `fused` was renamed `reuse_gradient` in 0.3. Received: "
            f"fused={given['fused']!r}"
        )
    check_keywords("fit", given, list(inspect.signature(fit).parameters)[:-1])


def _evaluate(classifier, test_data, evaluation, attack, say: Echo):
    if test_data is None:
        return None
    from advtrain.evaluation.report import robustness_headline
    from advtrain.evaluation.robustness import evaluate

    keys = dict(evaluation or {})
    if "eps" not in keys:
        attack = _as_attack(attack)
        if attack is None:
            raise ValueError(
                "fit needs evaluation={'eps': ...} to evaluate test_data when "
                f"no attack is given. Received: evaluation={evaluation!r}"
            )
        keys["eps"] = attack.eps
    result = evaluate(classifier, test_data, **keys)
    label, value = robustness_headline(result)
    say(f"{label}: {value}")
    return result


def _plan(rt: Runtime, size: Optional[int], batch: int, options: dict, say: Echo):
    if size is None and options["steps_per_epoch"] is None:
        raise ValueError(
            "The training data's length is unknown (a generator or repeated "
            "dataset): pass steps_per_epoch. Received: steps_per_epoch=None"
        )
    optimizer = options["optimizer"]
    named = optimizer if isinstance(optimizer, str) else "adam"
    train = _validated(PlanOptions, dict(options, batch_size=batch, optimizer=named))
    size = size if size is not None else batch
    plan = plan_batches(rt, size, **train.model_dump(include=set(PLAN_KEYS)))
    say(rt.describe())
    say(plan.describe())
    return plan, train


def _built_model(model, rt, plan, bn, say, *, attack, **adversarial):
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
        net = classifier = _model_in_scope(model, rt)
        steps = plan.epochs * plan.steps_per_epoch
        # The fused kernel is the training step's, below.
        note = apply_batchnorm_policy(
            net, total_steps=steps, momentum=bn["momentum"], fused_kernel=False
        )
        if note:
            say(note)
        if attack is not None:
            # BatchNorm momentum is set above for the whole run.
            net = AdversarialModel(
                net,
                attack,
                **adversarial,
                fused_batchnorm=bn["fused_kernel"],
                batchnorm_momentum=None,
            )
            say(f"step: {net.step_note}")
    return net, classifier


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


def _label_checked(stream, net, classifier, loss):
    """(`stream(skip)`, `InputChecks`): a plain model's labels are checked
    in the stream against the loss and the model's output."""
    from advtrain.models import input_checks as ic

    checks = ic.InputChecks(
        logits_shape=ic.output_shape(classifier),
        labels=ic.label_kind(loss),
        loss_name=ic.loss_name(loss),
    )
    if net is not classifier:  # AdversarialModel: its fit checks the data
        return stream, checks
    return lambda skip: checks.checked(stream(skip)), checks


def _phase_optimizer(optimizer, plan, phase, options: dict[str, Any]):
    # A name makes a fresh optimizer per phase; an object serves one phase.
    if isinstance(optimizer, str):
        rate = plan.learning_rate * phase.lr_factor
        phase_plan = dataclasses.replace(plan, learning_rate=rate)
        return make_optimizer(phase_plan, optimizer=optimizer, **options)
    if phase.lr_factor != 1.0 or phase.name != "train":
        raise ValueError(
            "Phases with their own learning rates need the optimizer by name "
            "(each phase starts a fresh one). Received: "
            f"optimizer={type(optimizer).__name__}, phase={phase.name}"
        )
    return optimizer


def _fit_phases(
    model: keras.Model,
    stream: Callable[[int], Any],
    *,
    runtime,
    plan,
    phases: list[Phase],
    loss,
    metrics,
    optimizer,
    optimizer_options: dict,
    seed: int,
    callbacks: list,
    state: Optional[TrainingState],
    freeze: Optional[keras.Model],
    validation_data,
    verbose,
    echo: Echo,
) -> tuple[dict[str, list[float]], float]:
    """Fits the phases (from where `state` resumes); returns this process's
    history and training seconds. Each `Model.fit` continues the stream
    (`stream(skip)`: without its first `skip` global batches)."""
    from advtrain.models.freezing import apply_phase

    spe, start = plan.steps_per_epoch, time.perf_counter()
    start_epoch = state.start_epoch if state else 0
    reseed = lambda epoch, logs=None: keras.utils.set_random_seed(seed + epoch)  # noqa: E731
    seeding = keras.callbacks.LambdaCallback(on_epoch_begin=reseed)
    history: dict[str, list[float]] = {}
    if state:
        state.preemption.arm(state.checkpoint, runtime.strategy)
    for phase in phases:
        if phase.epochs <= 0:
            continue
        trainable = apply_phase(freeze, phase) if freeze is not None else []
        if phase.end_epoch <= start_epoch:
            continue  # done before the interruption
        if phase.name != "train":
            echo(
                f"phase {phase.name}: epochs {phase.start_epoch + 1}-"
                f"{phase.end_epoch}, freeze={phase.freeze}, "
                f"{len(trainable)} backbone layer(s) trainable, "
                f"lr x{phase.lr_factor:g}"
            )
        with runtime.scope():
            model.compile(
                optimizer=_phase_optimizer(optimizer, plan, phase, optimizer_options),
                loss=loss,
                metrics=metrics,
                jit_compile=runtime.jit_compile,
                steps_per_execution=plan.steps_per_execution,
            )
            runtime.prepare_model(model)
            if state:
                state.restore_optimizer(model, phase)
                state.checkpoint.phase = phase.name
        epoch = max(phase.start_epoch, start_epoch)
        step = state.start_step if state and epoch == start_epoch else 0
        while epoch < phase.end_epoch:
            # An interrupted epoch is fitted alone, for its remaining steps.
            end = epoch + 1 if step else phase.end_epoch
            result = model.fit(
                stream(epoch * spe + step),
                initial_epoch=epoch,
                epochs=end,
                steps_per_epoch=spe - step,
                validation_data=validation_data,
                callbacks=[seeding, *callbacks],
                verbose=verbose,
                shuffle=False,  # the input pipeline shuffles
            )
            for key, values in result.history.items():
                history.setdefault(key, []).extend(values)
            epoch, step = end, 0
    if state:
        state.preemption.disarm()
    return history, time.perf_counter() - start


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
            "only with TensorFlow, which is not installed: pip install "
            "tensorflow, or pass (x, y) arrays or a stream function of skip. "
            f"Received: {type(data).__name__}"
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
