"""advtrain on Keras's PyTorch backend: `ops`, `trainer` (the
`AdversarialModel` step) and `distribution` (one device)."""

from advtrain.backend.torch.distribution import (
    DATA_PARALLEL,
    SINGLE_STEP_STRATEGIES,
    any_process,
    holds_variables,
    leave_processes,
    place,
    prepare_model,
    process_share,
    worker_environments,
)
from advtrain.backend.torch.ops import (
    FUSED_BATCHNORM,
    HOST_LOOPS,
    JIT_BY_DEFAULT,
    active_indices,
    compile_function,
    counted_loop,
    fused_batch_norm,
    host_jit,
    stateless_uniform,
    value_and_grad,
)
from advtrain.backend.torch.trainer import (
    GLOBAL_BATCHES,
    AdversarialTrainer,
    metric_count,
    replicas_in_sync,
)

__all__ = [
    "AdversarialTrainer",
    "DATA_PARALLEL",
    "FUSED_BATCHNORM",
    "GLOBAL_BATCHES",
    "HOST_LOOPS",
    "JIT_BY_DEFAULT",
    "SINGLE_STEP_STRATEGIES",
    "active_indices",
    "any_process",
    "compile_function",
    "counted_loop",
    "fused_batch_norm",
    "holds_variables",
    "host_jit",
    "leave_processes",
    "metric_count",
    "place",
    "prepare_model",
    "process_share",
    "replicas_in_sync",
    "stateless_uniform",
    "value_and_grad",
    "worker_environments",
]
