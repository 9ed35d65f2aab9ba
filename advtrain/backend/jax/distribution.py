"""Device placement on JAX: data parallelism over the local devices with
`keras.distribution.DataParallel` (Keras shards each global batch and
replicates the variables), where TensorFlow has `tf.distribute`; over
several processes (`multi_worker`, one process per worker) after
`keras.distribution.initialize`, JAX's own multi-process runtime.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import jax
import keras
import numpy as np

from advtrain.backend.placement import Placement, split_cpu
from advtrain.utils.errors import ArgumentError

# The other strategies are data parallel over every local device.
_ONE_DEVICE = ("default", "one_device")
SINGLE_STEP_STRATEGIES = ()
DATA_PARALLEL = " (keras.distribution.DataParallel)"
# What `keras.distribution.initialize` reads when called without arguments.
_ADDRESSES_ENV = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
_PROCESSES_ENV = "KERAS_DISTRIBUTION_NUM_PROCESSES"
_PROCESS_ID_ENV = "KERAS_DISTRIBUTION_PROCESS_ID"


def worker_environments(addresses: list[str]) -> list[dict[str, str]]:
    """The environment of each process of a cluster at `addresses` (the
    first is JAX's coordinator): Keras's `KERAS_DISTRIBUTION_*` variables,
    which `keras.distribution.initialize()` reads."""
    return [
        {
            _ADDRESSES_ENV: ",".join(addresses),
            _PROCESSES_ENV: str(len(addresses)),
            _PROCESS_ID_ENV: str(index),
        }
        for index in range(len(addresses))
    ]


def _cluster_processes() -> int:
    raw = os.environ.get(_PROCESSES_ENV, "").strip()
    return int(raw) if raw.isdigit() else 0


def _join_processes() -> None:
    # JAX's multi-process runtime, from Keras's environment variables; on
    # CPUs the processes' collectives run over gloo (TCP).
    if jax.distributed.is_initialized():
        return
    if _cluster_processes() < 2 or not os.environ.get(_ADDRESSES_ENV):
        raise ArgumentError(
            "strategy",
            f"multi_worker on JAX needs a cluster: {_ADDRESSES_ENV}, "
            f"{_PROCESSES_ENV} (2 or more) and {_PROCESS_ID_ENV}, as "
            "a launcher sets them for each process; found none. "
            "Received: strategy=multi_worker",
        )
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # advtrain's own handlers stop the run on SIGTERM (`any_process` agrees
    # on the step); JAX's preemption service would take SIGTERM from them.
    jax.config.update("jax_enable_preemption_service", False)
    try:
        keras.distribution.initialize()
    except (RuntimeError, ValueError) as exc:
        raise ArgumentError(
            "strategy",
            "cannot join the JAX processes at "
            f"{os.environ[_ADDRESSES_ENV].split(',')[0]} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}). "
            "Received: strategy=multi_worker",
        ) from None


def place(strategy: str, cpu_replicas: Optional[int], deterministic: bool) -> Placement:
    """A `keras.distribution.DataParallel` over the local devices (over
    every process's with `multi_worker`), set globally, or None on one
    device. Call it before any JAX work (`cpu_replicas` splits the CPU)."""
    if strategy == "auto" and _cluster_processes() > 1:
        strategy = "multi_worker"
    if cpu_replicas:
        split_cpu(
            lambda: jax.config.update("jax_num_cpu_devices", cpu_replicas),
            lambda: len(jax.local_devices(backend="cpu")),
            cpu_replicas,
            "JAX",
        )
    if strategy == "multi_worker":
        _join_processes()
    # XLA's CPU kernels are deterministic already (on GPUs, set
    # XLA_FLAGS=--xla_gpu_deterministic_ops=true).
    del deterministic
    devices = jax.local_devices()
    kind = devices[0].platform
    if strategy == "tpu" and kind != "tpu":
        raise ArgumentError(
            "strategy",
            f"no TPU found (JAX sees {kind} devices). Use auto, default, "
            "one_device, mirrored or multi_worker. Received: strategy=tpu",
        )
    auto = "mirrored" if len(devices) > 1 else "default"
    name = auto if strategy == "auto" else strategy
    if name in _ONE_DEVICE:
        keras.distribution.set_distribution(None)
        return Placement(None, name, 1, 1, "", kind)
    distribution = keras.distribution.DataParallel(
        devices=keras.distribution.list_devices(kind)
    )
    processes, index = jax.process_count(), jax.process_index()
    # Each process feeds its own share of every global batch (`process_share`).
    distribution.auto_shard_dataset = processes == 1
    keras.distribution.set_distribution(distribution)
    task = f"process {index}" if processes > 1 else ""
    return Placement(
        distribution, name, len(jax.devices()), processes, task, kind, index == 0
    )


def any_process(flag: bool) -> bool:
    """Whether `flag` is set in any process of the cluster: a collective
    that every process calls at the same point (one process: `flag`)."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.asarray([flag]))
    return bool(np.any(gathered))


def process_share(batches: Any) -> Any:
    """This process's share of the global `batches`: of n processes, the
    i-th keeps the i-th n-th of each batch's rows, so the processes
    together feed the global batch that one process would (Keras assembles
    it: `jax.make_array_from_process_local_data`); `batches` itself in one
    process. `batches`: a `keras.utils.PyDataset`, a `tf.data.Dataset` or
    an iterable of `(x, y, ...)` tuples."""
    count = jax.process_count()
    if count == 1:
        return batches
    index = jax.process_index()
    if isinstance(batches, keras.utils.PyDataset):
        return _Share(batches, index, count)
    if hasattr(batches, "element_spec"):  # a tf.data.Dataset
        return batches.map(lambda *parts: _rows(parts, index, count))
    return (_rows(batch, index, count) for batch in batches)


def _rows(batch, index: int, count: int):
    def share(part):
        size = part.shape[0] // count
        return part[index * size : (index + 1) * size]

    return tuple(share(part) for part in batch)


class _Share(keras.utils.PyDataset):
    """`process_share` of a `PyDataset`."""

    def __init__(self, batches: keras.utils.PyDataset, index: int, count: int):
        super().__init__()
        self.batches, self.index, self.count = batches, index, count

    def __len__(self) -> int:
        return len(self.batches)

    @property
    def num_batches(self) -> Optional[int]:
        return self.batches.num_batches

    def __getitem__(self, index: int):
        return _rows(self.batches[index], self.index, self.count)

    def on_epoch_end(self) -> None:
        self.batches.on_epoch_end()


def leave_processes(strategy: Any, variables) -> None:
    """After training over several processes: the distribution unset and
    each of `variables` (replicated) given its value on this process's
    device, so that what follows (evaluation, saving) runs in each process
    alone. Nothing in one process."""
    if strategy is None or jax.process_count() == 1:
        return
    keras.distribution.set_distribution(None)
    for variable in variables:
        value = np.asarray(variable.value)  # replicated: whole on every process
        # Keras places an assigned value by the variable's layout (the
        # processes' mesh); without one it stays on this process.
        variable._layout = None
        variable.assign(value)


def _on_every_device(variables, replicas: int) -> bool:
    return all(len(v.value.sharding.device_set) == replicas for v in variables)


def holds_variables(strategy, variables, replicas: int) -> bool:
    del strategy
    return _on_every_device(variables, replicas)


def prepare_model(model, runtime):
    optimizer = model.optimizer
    if runtime.strategy is None or _on_every_device(
        optimizer.variables, runtime.replicas
    ):
        return model
    raise ArgumentError(
        "optimizer",
        f"made outside the runtime's scope, so its variables live on one "
        f"of the {runtime.replicas} devices; pass its name (e.g. 'sgd') or "
        "make it inside `with runtime.scope():`. "
        f"Received: optimizer={type(optimizer).__name__}",
    )
