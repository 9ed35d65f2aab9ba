"""Device placement on JAX: data parallelism over the local devices with
`keras.distribution.DataParallel` (Keras shards each global batch and
replicates the variables), where TensorFlow has `tf.distribute`.
"""

from __future__ import annotations

from typing import Optional

import jax
import keras

from advtrain.backend.placement import Placement, split_cpu
from advtrain.utils.errors import ArgumentError

# The other strategies are data parallel over every local device.
_ONE_DEVICE = ("default", "one_device")
SINGLE_STEP_STRATEGIES = ()
DATA_PARALLEL = " (keras.distribution.DataParallel)"


def place(strategy: str, cpu_replicas: Optional[int], deterministic: bool) -> Placement:
    """A `keras.distribution.DataParallel` over the local devices, set
    globally, or None on one device. Call it before any JAX work
    (`cpu_replicas` splits the CPU)."""
    if strategy == "multi_worker":
        raise ArgumentError(
            "strategy",
            f"{strategy} runs on TensorFlow only; on JAX use auto, default, "
            "one_device or mirrored (keras.distribution.DataParallel over "
            f"the local devices). Received: strategy={strategy}",
        )
    if cpu_replicas:
        split_cpu(
            lambda: jax.config.update("jax_num_cpu_devices", cpu_replicas),
            lambda: len(jax.devices("cpu")),
            cpu_replicas,
            "JAX",
        )
    # XLA's CPU kernels are deterministic already (on GPUs, set
    # XLA_FLAGS=--xla_gpu_deterministic_ops=true).
    del deterministic
    devices = jax.local_devices()
    kind = devices[0].platform
    if strategy == "tpu" and kind != "tpu":
        raise ArgumentError(
            "strategy",
            f"no TPU found (JAX sees {kind} devices). Use auto, default, "
            "one_device or mirrored. Received: strategy=tpu",
        )
    auto = "mirrored" if len(devices) > 1 else "default"
    name = auto if strategy == "auto" else strategy
    if name in _ONE_DEVICE:
        keras.distribution.set_distribution(None)
        return Placement(None, name, 1, 1, "", kind)
    distribution = keras.distribution.DataParallel(
        devices=keras.distribution.list_devices(kind)
    )
    keras.distribution.set_distribution(distribution)
    return Placement(distribution, name, len(devices), 1, "", kind)


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
