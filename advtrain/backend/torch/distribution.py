"""Device placement on PyTorch: one device, the one Keras picks (a GPU
when PyTorch sees one, else the CPU). Keras 3 has no data-parallel
distribution for PyTorch, and its PyTorch trainer runs one step per call.
"""

from __future__ import annotations

from typing import Optional

import torch

from advtrain.backend.placement import Placement
from advtrain.utils.errors import ArgumentError

_ONE_DEVICE = ("auto", "default", "one_device")
# Keras's PyTorch trainer refuses steps_per_execution > 1: every strategy.
SINGLE_STEP_STRATEGIES = ("default", "one_device")
DATA_PARALLEL = ""


def place(strategy: str, cpu_replicas: Optional[int], deterministic: bool) -> Placement:
    """One device (`auto` is `default`); several replicas are refused."""
    if strategy not in _ONE_DEVICE:
        raise ArgumentError(
            "strategy",
            "on PyTorch advtrain trains on one device (Keras 3 has no "
            "data-parallel distribution for it); use auto, default or "
            f"one_device, or TensorFlow or JAX. Received: strategy={strategy}",
        )
    if cpu_replicas and cpu_replicas > 1:
        raise ArgumentError(
            "cpu_replicas",
            "on PyTorch advtrain trains on one device; leave it unset. "
            f"Received: cpu_replicas={cpu_replicas}",
        )
    if deterministic:
        # CPU kernels are deterministic already; this covers CUDA's.
        torch.use_deterministic_algorithms(True, warn_only=True)
    kind = "gpu" if torch.cuda.is_available() else "cpu"
    name = "default" if strategy == "auto" else strategy
    return Placement(None, name, 1, 1, "", kind)


def holds_variables(strategy, variables, replicas: int) -> bool:
    del strategy, variables, replicas
    return True  # one device holds everything


def prepare_model(model, runtime):
    del runtime
    return model


def worker_environments(addresses: list[str]) -> list[dict[str, str]]:
    raise ArgumentError(
        "backend",
        "several worker processes train on TensorFlow or JAX; on PyTorch "
        "training runs on one device in one process. "
        f"Received: {len(addresses)} workers on KERAS_BACKEND=torch",
    )


def any_process(flag: bool) -> bool:
    return flag  # one process


def process_share(batches):
    return batches  # one process feeds every batch


def leave_processes(strategy, variables) -> None:
    del strategy, variables  # one process
