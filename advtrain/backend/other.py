"""A Keras backend advtrain does not train on (numpy, openvino): models
build, call and save; the attacks, training and placement say which
backends run them, in one line."""

from __future__ import annotations

import keras

from advtrain.backend import SUPPORTED  # set before this module loads
from advtrain.utils.errors import ArgumentError

HOST_LOOPS = False
FUSED_BATCHNORM = False
JIT_BY_DEFAULT = False
GLOBAL_BATCHES = True
SINGLE_STEP_STRATEGIES = ()
DATA_PARALLEL = ""


def _refused(what: str):
    return NotImplementedError(
        f"{what} runs on the Keras backends {', '.join(SUPPORTED)}; set "
        "KERAS_BACKEND to one of them before importing keras. Received: "
        f"KERAS_BACKEND={keras.backend.backend()!r}"
    )


def _core(*args, **kwargs):
    raise _refused("advtrain's core")


value_and_grad = stateless_uniform = active_indices = _core
counted_loop = compile_function = fused_batch_norm = _core


def host_jit(x):
    del x  # loops stay inline, where the core refuses in one line
    return None


class AdversarialTrainer:
    """The model builds, calls and saves; training refuses in one line."""

    def train_step(self, *args, **kwargs):
        raise _refused(f"{type(self).__name__}'s training")

    test_step = train_step


def replicas_in_sync() -> int:
    return 1


def metric_count(metric) -> float:
    return float(keras.ops.convert_to_numpy(metric.count))


def place(strategy, cpu_replicas, deterministic):
    raise ArgumentError(
        "backend",
        f"advtrain's runtime runs on {' or '.join(SUPPORTED)}. "
        f"Received: KERAS_BACKEND={keras.backend.backend()}",
    )


holds_variables = prepare_model = place
worker_environments = place


def any_process(flag: bool) -> bool:
    return flag


def process_share(batches):
    return batches


def leave_processes(strategy, variables) -> None:
    del strategy, variables
