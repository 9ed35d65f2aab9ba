"""Device placement on TensorFlow: a `tf.distribute` strategy over the
local devices, a cluster (TF_CONFIG or SLURM) or a TPU."""

from __future__ import annotations

import json
import os
from typing import Optional

import tensorflow as tf

from advtrain.backend.placement import Placement, split_cpu
from advtrain.utils.errors import ArgumentError, one_line

# Strategies whose replica function calls merge_call: Keras 3's multi-step
# loop (a tf.cond inside a tf.while_loop) fails under them with "You must
# feed a value for placeholder tensor" (keras-team/keras#19246, reproduced
# with TF 2.21 / Keras 3.15), so they run one step per host call.
SINGLE_STEP_STRATEGIES = ("mirrored", "multi_worker")
DATA_PARALLEL = ""  # the strategy's name says it


def place(strategy: str, cpu_replicas: Optional[int], deterministic: bool) -> Placement:
    """The `tf.distribute` strategy `strategy` (`auto` resolved). Call it
    before any other TensorFlow work (`cpu_replicas` splits the CPU)."""
    if cpu_replicas:
        cpus = tf.config.list_physical_devices("CPU")
        split_cpu(
            lambda: tf.config.set_logical_device_configuration(
                cpus[0], [tf.config.LogicalDeviceConfiguration()] * cpu_replicas
            ),
            lambda: len(tf.config.list_logical_devices("CPU")),
            cpu_replicas,
            "TensorFlow",
        )
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    name = _auto_strategy() if strategy == "auto" else strategy
    made, workers, task = _strategy(name)
    replicas = made.num_replicas_in_sync
    return Placement(made, name, replicas, workers, task, _device_kind())


def worker_environments(addresses: list[str]) -> list[dict[str, str]]:
    """The environment of each worker of a cluster at `addresses`: a
    `TF_CONFIG` naming the cluster and the worker's task."""
    return [{"TF_CONFIG": config} for config in tf_configs(addresses)]


def tf_configs(addresses: list[str]) -> list[str]:
    """One TF_CONFIG (JSON) per worker of the cluster `addresses`."""
    return [
        json.dumps(
            {
                "cluster": {"worker": list(addresses)},
                "task": {"type": "worker", "index": index},
            }
        )
        for index in range(len(addresses))
    ]


def any_process(flag: bool) -> bool:
    """`flag`: the workers of a `tf.distribute` cluster agree on a step
    through TensorFlow's `PreemptionCheckpointHandler` (`Preemption.arm`)."""
    return flag


def process_share(batches):
    """`batches`: `tf.distribute` feeds each replica its own batches
    (`Runtime.input_strategy`)."""
    return batches


def leave_processes(strategy, variables) -> None:
    """Nothing: each worker of a `tf.distribute` cluster evaluates and
    saves under its strategy."""
    del strategy, variables


def holds_variables(strategy, variables, replicas: int) -> bool:
    del replicas
    extended = strategy.extended
    return all(
        extended.variable_created_in_scope(getattr(v, "value", v)) for v in variables
    )


def prepare_model(model, runtime):
    # Keras 3's `fit` under MultiWorkerMirroredStrategy (keras-team/keras#20585).
    if runtime.strategy_name != "multi_worker":
        return model
    from advtrain._keras_workarounds import fit_under_multi_worker

    return fit_under_multi_worker(model, runtime.strategy)


def _device_kind() -> str:
    if tf.config.list_logical_devices("TPU"):
        return "tpu"
    if tf.config.list_physical_devices("GPU"):
        return "gpu"
    return "cpu"


def tf_config_tasks() -> int:
    """Number of tasks TF_CONFIG's cluster names (0 without TF_CONFIG);
    ValueError when it is not JSON with a cluster."""
    raw = os.environ.get("TF_CONFIG", "").strip()
    if not raw:
        return 0
    try:
        cluster = json.loads(raw).get("cluster", {})
        return sum(len(v) for k, v in cluster.items() if k != "evaluator")
    except (ValueError, AttributeError, TypeError):
        raise ValueError(
            'TF_CONFIG: expected JSON {"cluster": {...}, "task": {...}}. '
            f"Received: TF_CONFIG={raw[:80]!r}"
        ) from None


def _slurm_tasks() -> int:
    if "SLURM_JOB_ID" not in os.environ:
        return 0
    value = os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get(
        "SLURM_NTASKS", "0"
    )
    try:
        return int(value)
    except ValueError:
        return 0


def _cluster_resolver() -> tf.distribute.cluster_resolver.ClusterResolver:
    """TF_CONFIG first (what a launcher sets), then a SLURM step."""
    if tf_config_tasks():
        return tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if _slurm_tasks() > 1:
        try:
            return tf.distribute.cluster_resolver.SlurmClusterResolver()
        except (RuntimeError, ValueError, OSError) as exc:
            raise ArgumentError(
                "strategy",
                f"cannot read the SLURM job ({type(exc).__name__}: {exc}). "
                "Received: strategy=multi_worker",
            ) from None
    raise ArgumentError(
        "strategy",
        "multi_worker needs a cluster: TF_CONFIG (as a launcher sets it for "
        "each worker) or a SLURM job step with several tasks (srun); found "
        "neither. Received: strategy=multi_worker",
    )


def _tpu_strategy() -> tf.distribute.Strategy:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as exc:
        raise ArgumentError(
            "strategy",
            f"no TPU found ({type(exc).__name__}: {one_line(exc)}). Use auto, "
            "default, one_device or mirrored. Received: strategy=tpu",
        ) from None
    return tf.distribute.TPUStrategy(resolver)


def _strategy(name: str) -> tuple[tf.distribute.Strategy, int, str]:
    """The strategy `name` (auto resolved), its workers and this task."""
    if name == "tpu":
        return _tpu_strategy(), 1, ""
    if name == "multi_worker":
        resolver = _cluster_resolver()
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
        cluster = resolver.cluster_spec().as_dict()
        workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
        return strategy, workers, f"{resolver.task_type} {resolver.task_id}"
    gpus = tf.config.list_logical_devices("GPU")
    cpus = tf.config.list_logical_devices("CPU")
    if name == "default":
        return tf.distribute.get_strategy(), 1, ""
    if name == "one_device":
        device = gpus[0].name if gpus else cpus[0].name
        return tf.distribute.OneDeviceStrategy(device), 1, ""
    devices = [d.name for d in gpus] if gpus else [d.name for d in cpus]
    return tf.distribute.MirroredStrategy(devices), 1, ""  # mirrored


def _auto_strategy() -> str:
    if tf_config_tasks() > 1 or _slurm_tasks() > 1:
        return "multi_worker"
    gpus = tf.config.list_logical_devices("GPU")
    cpus = tf.config.list_logical_devices("CPU")
    if len(gpus) > 1 or (not gpus and len(cpus) > 1):
        return "mirrored"
    return "default"
