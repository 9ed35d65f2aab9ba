"""Strategy, precision, XLA and batch arithmetic, resolved and printed once
at the start of a run.

The device placement itself is the backend's (`advtrain.backend.place`:
`tf.distribute` on TensorFlow, `keras.distribution` on JAX).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
from typing import Optional, Union

import keras
import numpy as np

from advtrain import backend as backends
from advtrain.utils.errors import ArgumentError

# Keras 3 traces steps_per_execution > 32 into a loop that tf.data rejects
# (keras-team/keras#20344); more steps per call gains little anyway.
MAX_STEPS_PER_EXECUTION = 32

# The `train` settings that `plan_batches` and `make_optimizer` take,
# e.g. `plan_batches(rt, n, **train.model_dump(include=set(PLAN_KEYS)))`.
PLAN_KEYS = (
    "batch_size",
    "epochs",
    "steps_per_epoch",
    "learning_rate",
    "scale_lr",
    "reference_batch",
    "warmup_epochs",
)
OPTIMIZER_KEYS = ("optimizer", "lr_schedule", "momentum", "weight_decay")


@dataclasses.dataclass
class Runtime:
    """A resolved runtime: what the `runtime` settings turned into.

    Attributes:
        strategy: the `tf.distribute.Strategy`, or on JAX the
            `keras.distribution.DataParallel` set globally or None.
        strategy_name: `auto` resolved.
        replicas: replicas in sync, over all workers.
        device_kind: cpu, gpu or tpu.
        precision: the Keras dtype policy set globally.
        jit_compile: whether train steps compile with XLA.
        steps_per_execution_setting: resolved per run by `plan_batches`.
        workers: worker processes (multi_worker), else 1.
        task: this process's cluster task ("worker 0", "process 0"), or "".
        chief: False in a process that must not write the run folder.
    """

    strategy: object
    strategy_name: str
    replicas: int
    device_kind: str
    precision: str
    jit_compile: bool
    steps_per_execution_setting: object
    workers: int = 1
    task: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)
    backend: str = backends.NAME
    chief: bool = True

    @property
    def is_chief(self) -> bool:
        """Whether this process writes the run folder (the `chief` task,
        else worker 0; on JAX process 0)."""
        if not self.chief:
            return False
        resolver = getattr(self.strategy, "cluster_resolver", None)
        if resolver is None or not getattr(resolver, "task_type", None):
            return True
        task_type, task_id = resolver.task_type, resolver.task_id
        if task_type == "chief":
            return True
        cluster = resolver.cluster_spec().as_dict()
        return "chief" not in cluster and task_type == "worker" and task_id == 0

    def scope(self) -> contextlib.AbstractContextManager:
        """The scope to build and compile models in."""
        if self.strategy is None:
            return contextlib.nullcontext()
        return self.strategy.scope()

    def input_strategy(self):
        """The `tf.distribute` strategy whose replicas each read their own
        batches, or None for whole global batches (one replica, or JAX)."""
        if backends.GLOBAL_BATCHES or self.replicas == 1:
            return None
        return self.strategy

    def process_share(self, batches):
        """This process's share of each of the global `batches` (JAX over
        several processes, where each feeds its own to `Model.fit`), else
        `batches`."""
        return backends.process_share(batches)

    def leave_processes(self, model: keras.Model) -> None:
        """After training over several processes (JAX), readies `model`
        for evaluation and saving in each process alone."""
        optimizer = getattr(model, "optimizer", None)
        variables = list(model.variables) + list(model.metrics_variables)
        variables += list(optimizer.variables) if optimizer is not None else []
        unique = list({id(v): v for v in variables}.values())
        backends.leave_processes(self.strategy, unique)

    def holds_variables_of(self, model: keras.Model) -> bool:
        """Whether `model`'s variables were created under this scope."""
        if self.strategy is None:
            return True
        return backends.holds_variables(self.strategy, model.variables, self.replicas)

    def prepare_model(self, model: keras.Model) -> keras.Model:
        """Readies a model for `fit` after every `compile`: the workaround
        for Keras 3's `fit` under MultiWorkerMirroredStrategy
        (keras-team/keras#20585); on JAX over several devices, an
        `ArgumentError` for an optimizer made outside the scope."""
        return backends.prepare_model(model, self)

    def describe(self) -> str:
        """One line for the start banner."""
        where = f" ({self.workers} workers, this is {self.task})"
        where = where if self.workers > 1 else ""
        how = backends.DATA_PARALLEL if self.replicas > 1 else ""
        return (
            f"runtime: {self.strategy_name} strategy{how} on {self.device_kind}, "
            f"{self.replicas} replica(s){where}, {self.precision}, "
            f"XLA {'on' if self.jit_compile else 'off'}, backend {self.backend}"
        )


def make_runtime(
    *,
    backend: str = "auto",
    strategy: str = "auto",
    cpu_replicas: Optional[int] = None,
    precision: str = "float32",
    jit_compile: Union[str, bool] = "auto",
    steps_per_execution: Union[str, int] = "auto",
    deterministic: bool = False,
) -> Runtime:
    """Places the run on the devices and sets the precision policy.

    The arguments are `RuntimeOptions`' keys, with its defaults. Call it
    before any other TensorFlow or JAX work (`cpu_replicas` splits the CPU).
    `jit_compile: auto` is off on TensorFlow, where XLA made every
    adversarial step slower on CPUs (scripts/bench_step), and on on JAX,
    which without jit runs op by op. JAX's CPU kernels are deterministic
    already (on GPUs, set `XLA_FLAGS=--xla_gpu_deterministic_ops=true`).
    Raises `ArgumentError` naming a setting that cannot be set up here.
    """
    backends.check_requested(backend, "backend")
    placed = backends.place(strategy, cpu_replicas, deterministic)
    notes = []
    if precision == "mixed_float16" and placed.device_kind == "cpu":
        notes.append(
            "mixed_float16 on a CPU is emulated and slow; mixed_bfloat16 "
            "runs natively on CPUs with AVX512-BF16 or AMX"
        )
    keras.mixed_precision.set_global_policy(precision)
    if not isinstance(jit_compile, bool):
        jit_compile = backends.JIT_BY_DEFAULT
    return Runtime(
        placed.strategy,
        placed.name,
        placed.replicas,
        placed.device_kind,
        precision,
        jit_compile,
        steps_per_execution,
        workers=placed.workers,
        task=placed.task,
        notes=notes,
        backend=backends.NAME,
        chief=placed.chief,
    )


@dataclasses.dataclass
class BatchPlan:
    """How the global batch and the epoch are divided. `learning_rate` is
    the peak rate after `scale_lr`, `base_learning_rate` the configured one."""

    global_batch: int
    replicas: int
    per_replica_batch: int
    steps_per_epoch: int
    epochs: int
    steps_per_execution: int
    learning_rate: float
    base_learning_rate: float
    reference_batch: Optional[int] = None
    warmup_steps: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)
    workers: int = 1

    def describe(self) -> str:
        """The batch arithmetic, as printed at the start of a run."""
        undivided = " (every replica trains every epoch)" if self.replicas > 1 else ""
        fed = ""
        if self.workers > 1:
            share = self.global_batch // self.workers
            fed = f", {share} from each of {self.workers} worker processes"
        lines = [
            f"batch: global {self.global_batch} = {self.replicas} replica(s) "
            f"x {self.per_replica_batch}{fed}; {self.steps_per_epoch} steps/epoch "
            f"x {self.epochs} epochs{undivided}; {self.steps_per_execution} "
            "step(s) per host call"
        ]
        lr = f"learning rate {self.learning_rate:g}"
        if self.reference_batch is not None:
            lr += (
                f" = {self.base_learning_rate:g} x {self.global_batch}/"
                f"{self.reference_batch} (scale_lr: linear in the "
                "global batch)"
            )
        if self.warmup_steps:
            lr += (
                f", linear warm-up from 0 over {self.warmup_steps} steps "
                f"({self.warmup_steps / self.steps_per_epoch:g} epochs)"
            )
        lines.append(lr)
        lines.extend(f"note: {note}" for note in self.notes)
        return "\n".join(lines)


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


def resolve_steps_per_execution(
    setting: object, steps_per_epoch: int, runtime: Runtime
) -> tuple[int, list[str]]:
    """Steps per host call, and why it differs from the setting if it does.

    It always divides the epoch: Keras runs whole host calls, so 10 steps
    per epoch at 4 per call would train 12 (Keras 3.15). `auto` is the
    largest divisor up to 32 (scripts/bench_spe).
    """
    if runtime.strategy_name in backends.SINGLE_STEP_STRATEGIES:
        note = (
            f"1 step per host call under {runtime.strategy_name} (Keras 3 "
            "cannot loop several steps per call under it: keras-team/keras#19246)"
        )
        return 1, [note] if setting != 1 else []
    auto = setting == "auto"
    cap = min(MAX_STEPS_PER_EXECUTION, steps_per_epoch if auto else int(setting))
    spe = _largest_divisor(steps_per_epoch, cap)
    if auto and spe < 4 <= steps_per_epoch:
        return spe, [
            f"{steps_per_epoch} steps per epoch have no divisor from 4 to "
            f"{MAX_STEPS_PER_EXECUTION}: {spe} step(s) per host call; set "
            "steps_per_epoch to a multiple of 8 or 16 for speed"
        ]
    if not auto and spe != int(setting):
        return spe, [
            f"steps_per_execution={int(setting)} -> {spe}, the largest value up "
            f"to {cap} that divides the {steps_per_epoch} steps per epoch"
        ]
    return spe, []


def plan_batches(
    runtime: Runtime,
    train_size: int,
    *,
    batch_size: int = 64,
    epochs: int = 10,
    steps_per_epoch: Optional[int] = None,
    learning_rate: float = 1e-3,
    scale_lr: bool = False,
    reference_batch: int = 256,
    warmup_epochs: float = 0.0,
) -> BatchPlan:
    """Batch arithmetic (`PlanOptions`' keys): the batch is global, split
    across replicas; steps per epoch = examples // global batch (or
    `steps_per_epoch`); epochs never shrink. Raises `ArgumentError` naming
    a `batch_size` that does not divide or exceeds the training set.

    Example:

    ```python
    plan = plan_batches(runtime, splits.train_size, batch_size=128, epochs=5)
    print(plan.describe())
    ```
    """
    replicas = runtime.replicas
    if batch_size % replicas:
        lower = batch_size - batch_size % replicas
        raise ArgumentError(
            "batch_size",
            f"does not divide across {replicas} replicas; use a multiple of "
            f"{replicas} (e.g. {max(lower, replicas)} or {lower + replicas}). "
            f"Received: batch_size={batch_size}",
        )
    steps = steps_per_epoch or train_size // batch_size
    if steps < 1:
        raise ArgumentError(
            "batch_size",
            f"larger than the training set ({train_size} examples); lower "
            f"it. Received: batch_size={batch_size}",
        )
    spe, notes = resolve_steps_per_execution(
        runtime.steps_per_execution_setting, steps, runtime
    )
    peak = learning_rate * batch_size / reference_batch if scale_lr else learning_rate
    return BatchPlan(
        global_batch=batch_size,
        replicas=replicas,
        per_replica_batch=batch_size // replicas,
        steps_per_epoch=steps,
        epochs=epochs,
        steps_per_execution=spe,
        learning_rate=peak,
        base_learning_rate=learning_rate,
        reference_batch=reference_batch if scale_lr else None,
        warmup_steps=int(math.ceil(warmup_epochs * steps)),
        notes=runtime.notes + notes,
        workers=runtime.workers,
    )


def weights_fingerprint(model: keras.Model) -> str:
    """sha256 of the weights that replicas keep in sync, in order: not the
    BatchNorm moving statistics, which Keras 3 keeps per worker."""
    from advtrain.models.batchnorm.policy import batchnorm_layers

    local = {
        id(w) for layer in batchnorm_layers(model) for w in layer.non_trainable_weights
    }
    digest = hashlib.sha256()
    for weight in model.weights:
        if id(weight) not in local:
            digest.update(np.ascontiguousarray(np.asarray(weight)).tobytes())
    return digest.hexdigest()


@keras.saving.register_keras_serializable(package="advtrain")
class OneCycle(keras.optimizers.schedules.LearningRateSchedule):
    """Triangular one-cycle schedule (Wong, Rice and Kolter 2020): linear
    from 0 to `peak` over `warmup_steps`, then down to 0 at `total_steps`.

    Example:

    ```python
    lr = OneCycle(peak=0.005, warmup_steps=2400, total_steps=6000)
    float(lr(1200))  # 0.0025
    ```
    """

    def __init__(self, peak: float, warmup_steps: int, total_steps: int):
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = max(int(total_steps), self.warmup_steps + 1)

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        up = step / max(self.warmup_steps, 1)
        down = (self.total_steps - step) / (self.total_steps - self.warmup_steps)
        rate = keras.ops.where(step < self.warmup_steps, up, down)
        return self.peak * keras.ops.clip(rate, 0.0, 1.0)

    def get_config(self):
        return {
            "peak": self.peak,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
        }


def make_optimizer(
    plan: BatchPlan,
    *,
    optimizer: str = "adam",
    lr_schedule: str = "constant",
    momentum: float = 0.9,
    weight_decay: float = 0.0,
) -> keras.optimizers.Optimizer:
    """The optimizer (`PlanOptions`' keys) with its learning-rate schedule."""
    total = max(1, plan.steps_per_epoch * max(plan.epochs, 1))
    warmup = plan.warmup_steps
    lr: object = plan.learning_rate
    if lr_schedule == "onecycle":
        lr = OneCycle(plan.learning_rate, warmup, total)
    elif lr_schedule == "cosine" or warmup:
        lr = keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=plan.learning_rate if not warmup else 0.0,
            decay_steps=max(1, total - warmup),
            # Warm-up then constant: a cosine with alpha=1 never decays.
            alpha=1.0 if lr_schedule == "constant" else 0.0,
            warmup_target=plan.learning_rate if warmup else None,
            warmup_steps=warmup,
        )
    if optimizer == "sgd":
        return keras.optimizers.SGD(
            lr, momentum=momentum, nesterov=True, weight_decay=weight_decay or None
        )
    if optimizer == "adamw":
        return keras.optimizers.AdamW(lr, weight_decay=weight_decay or 0.004)
    return keras.optimizers.Adam(learning_rate=lr, weight_decay=weight_decay or None)
