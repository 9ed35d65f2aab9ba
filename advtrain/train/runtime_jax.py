"""The runtime on JAX: data parallelism over the local devices with
`keras.distribution.DataParallel` (Keras shards each global batch and
replicates the variables), where TensorFlow has `tf.distribute`.
"""

from __future__ import annotations

from typing import Optional

import jax
import keras

from advtrain.train.options import split_cpu
from advtrain.utils.errors import ArgumentError

# The other strategies are data parallel over every local device.
_ONE_DEVICE = ("default", "one_device")


def jax_placement(
    strategy: str, cpu_replicas: Optional[int], deterministic: bool
) -> tuple[Optional[keras.distribution.DataParallel], str, int, int, str, str]:
    """(distribution or None, strategy name with auto resolved, replicas,
    workers, this task, device kind), the distribution set globally. Call
    it before any JAX work (`cpu_replicas` splits the CPU)."""
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
    del deterministic  # XLA's CPU kernels are deterministic; see make_runtime
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
        return None, name, 1, 1, "", kind
    distribution = keras.distribution.DataParallel(
        devices=keras.distribution.list_devices(kind)
    )
    keras.distribution.set_distribution(distribution)
    return distribution, name, len(devices), 1, "", kind
