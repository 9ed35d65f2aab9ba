"""What every backend's device placement shares: its result, and splitting
the CPU into several devices."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from advtrain.utils.errors import ArgumentError


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a run is placed (`advtrain.backend.place`).

    Attributes:
        strategy: the `tf.distribute.Strategy`, or on JAX the
            `keras.distribution.DataParallel` set globally, or None.
        name: the strategy's name, `auto` resolved.
        replicas: replicas in sync, over all workers.
        workers: worker processes (multi_worker), else 1.
        task: this process's cluster task ("worker 0"), or "".
        device_kind: cpu, gpu or tpu.
        chief: whether this process writes the run folder (on TensorFlow
            the `Runtime` asks the strategy's cluster).
    """

    strategy: Any
    name: str
    replicas: int
    workers: int
    task: str
    device_kind: str
    chief: bool = True


def split_cpu(
    split: Callable[[], None], devices: Callable[[], int], replicas: int, library: str
):
    """Runs `split` (which fails once the backend started) unless the CPU
    already holds `replicas` devices (on both backends)."""
    try:
        split()
    except RuntimeError:
        existing = devices()
        if existing != replicas:
            raise ArgumentError(
                "cpu_replicas",
                f"{library} already started with {existing} CPU device(s) in "
                f"this process; set it before any {library} work (a fresh "
                f"process). Received: cpu_replicas={replicas}",
            ) from None
