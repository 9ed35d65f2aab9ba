"""Strategy, precision, XLA and batch arithmetic, resolved from the recipe.

Everything here is decided once at the start of a run and printed, so the
user sees how the batch is split and what the machine will do.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import keras
import tensorflow as tf

from advtrain.config import RecipeError, RuntimeConfig, TrainConfig


@dataclasses.dataclass
class Runtime:
    """A resolved runtime: what `runtime:` in the recipe turned into."""

    strategy: tf.distribute.Strategy
    strategy_name: str
    replicas: int
    device_kind: str
    precision: str
    jit_compile: bool
    steps_per_execution_setting: object

    @property
    def is_chief(self) -> bool:
        resolver = getattr(self.strategy, "cluster_resolver", None)
        if resolver is None or not getattr(resolver, "task_type", None):
            return True
        task_type, task_id = resolver.task_type, resolver.task_id
        return task_type == "chief" or (task_type == "worker" and task_id == 0)


def _device_kind() -> str:
    if tf.config.list_logical_devices("TPU"):
        return "tpu"
    if tf.config.list_physical_devices("GPU"):
        return "gpu"
    return "cpu"


def _split_cpu(replicas: int) -> None:
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * replicas
        )
    except RuntimeError:
        existing = len(tf.config.list_logical_devices("CPU"))
        if existing != replicas:
            raise RecipeError(
                f"runtime.cpu_replicas={replicas}: TensorFlow already started "
                f"with {existing} CPU device(s) in this process; set it before "
                "any TensorFlow work (a fresh `advtrain run`)."
            ) from None


def make_runtime(cfg: RuntimeConfig) -> Runtime:
    """Creates the strategy and sets the precision policy.

    `strategy: auto` picks MirroredStrategy over several GPUs or CPU
    replicas, one device otherwise. `jit_compile: auto` stays off: on CPUs
    XLA made every adversarial step slower (0.3x to 0.7x, measured), and no
    GPU measurement has been made yet to justify switching it on there.
    """
    if cfg.cpu_replicas:
        _split_cpu(cfg.cpu_replicas)
    if cfg.deterministic:
        tf.config.experimental.enable_op_determinism()
    kind = _device_kind()
    name = cfg.strategy
    if name == "tpu" and kind != "tpu":
        raise RecipeError(
            "runtime.strategy=tpu but no TPU is attached. Use auto, default, "
            "one_device or mirrored."
        )
    gpus = tf.config.list_logical_devices("GPU")
    cpus = tf.config.list_logical_devices("CPU")
    if name == "auto":
        if len(gpus) > 1 or (not gpus and len(cpus) > 1):
            name = "mirrored"
        else:
            name = "default"
    if name == "default":
        strategy = tf.distribute.get_strategy()
    elif name == "one_device":
        device = gpus[0].name if gpus else cpus[0].name
        strategy = tf.distribute.OneDeviceStrategy(device)
    elif name == "mirrored":
        devices = [d.name for d in gpus] if gpus else [d.name for d in cpus]
        strategy = tf.distribute.MirroredStrategy(devices)
    elif name == "multi_worker":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:  # tpu
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
    keras.mixed_precision.set_global_policy(cfg.precision)
    jit = cfg.jit_compile if isinstance(cfg.jit_compile, bool) else False
    return Runtime(
        strategy=strategy,
        strategy_name=name,
        replicas=strategy.num_replicas_in_sync,
        device_kind=kind,
        precision=cfg.precision,
        jit_compile=jit,
        steps_per_execution_setting=cfg.steps_per_execution,
    )


@dataclasses.dataclass
class BatchPlan:
    """How the global batch and the epoch are divided."""

    global_batch: int
    replicas: int
    per_replica_batch: int
    steps_per_epoch: int
    epochs: int
    steps_per_execution: int
    learning_rate: float
    base_learning_rate: float

    def describe(self) -> str:
        lr = f"learning rate {self.learning_rate:g}"
        if self.learning_rate != self.base_learning_rate:
            lr += (
                f" (scaled from {self.base_learning_rate:g} by "
                f"{self.global_batch}/reference batch)"
            )
        return (
            f"batch: global {self.global_batch} = {self.replicas} replica(s) x "
            f"{self.per_replica_batch}; {self.steps_per_epoch} steps/epoch x "
            f"{self.epochs} epochs; {self.steps_per_execution} steps per "
            f"host call; {lr}"
        )


def plan_batches(
    train: TrainConfig,
    runtime: Runtime,
    train_size: int,
) -> BatchPlan:
    """Batch arithmetic: the recipe's batch is global; epochs never shrink.

    Raises:
        RecipeError: the global batch does not divide across replicas, or
            is larger than the training set.
    """
    replicas = runtime.replicas
    if train.batch_size % replicas:
        raise RecipeError(
            f"train.batch_size={train.batch_size} does not divide across "
            f"{replicas} replicas; use a multiple of {replicas}."
        )
    if train.steps_per_epoch is not None:
        steps = train.steps_per_epoch
    else:
        steps = train_size // train.batch_size
    if steps < 1:
        raise RecipeError(
            f"train.batch_size={train.batch_size} is larger than the training "
            f"set ({train_size} examples); lower it."
        )
    setting = runtime.steps_per_execution_setting
    if setting == "auto":
        # One host round trip per step dominates small models; a few dozen
        # steps per call amortise it while progress still updates often.
        spe = max(1, min(steps, 32))
    else:
        spe = max(1, min(int(setting), steps))
    lr = train.learning_rate
    if train.scale_lr:
        lr = lr * train.batch_size / train.reference_batch
    return BatchPlan(
        global_batch=train.batch_size,
        replicas=replicas,
        per_replica_batch=train.batch_size // replicas,
        steps_per_epoch=steps,
        epochs=train.epochs,
        steps_per_execution=spe,
        learning_rate=lr,
        base_learning_rate=train.learning_rate,
    )


def make_optimizer(train: TrainConfig, plan: BatchPlan) -> keras.optimizers.Optimizer:
    """The recipe's optimizer with its learning-rate schedule."""
    total = max(1, plan.steps_per_epoch * max(plan.epochs, 1))
    warmup = int(math.ceil(train.warmup_epochs * plan.steps_per_epoch))
    lr: object = plan.learning_rate
    if train.lr_schedule in ("cosine", "onecycle") or warmup:
        decay_steps = max(1, total - warmup)
        if train.lr_schedule == "constant":
            # Warm-up then constant: a cosine with alpha=1 never decays.
            schedule_alpha = 1.0
        else:
            schedule_alpha = 0.0
        lr = keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=plan.learning_rate if not warmup else 0.0,
            decay_steps=decay_steps,
            alpha=schedule_alpha,
            warmup_target=plan.learning_rate if warmup else None,
            warmup_steps=warmup,
        )
    if train.optimizer == "sgd":
        return keras.optimizers.SGD(
            learning_rate=lr, momentum=train.momentum, nesterov=True,
            weight_decay=train.weight_decay or None,
        )
    if train.optimizer == "adamw":
        return keras.optimizers.AdamW(
            learning_rate=lr, weight_decay=train.weight_decay or 0.004
        )
    return keras.optimizers.Adam(
        learning_rate=lr, weight_decay=train.weight_decay or None
    )
