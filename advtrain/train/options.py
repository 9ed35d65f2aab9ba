"""`advtrain.fit`'s typed option groups: `runtime`, `train` and
`checkpoints`; a configuration file's sections derive from them, so their
fields are its keys (one definition for both)."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field, model_validator

from advtrain.utils.options import Options, Seed


class RuntimeOptions(Options):
    """Where and how the step runs (advtrain.train.runtime.make_runtime).

    backend: the Keras backend the run expects, tensorflow or jax; auto:
        whichever Keras runs on (advtrain.backend chose it, before Keras
        was imported, from KERAS_BACKEND, keras.json or what is installed).
    strategy: auto (multi_worker when TF_CONFIG or a SLURM step names
        several tasks, mirrored over several GPUs or cpu_replicas, else
        default), default, one_device, mirrored, multi_worker, tpu. On JAX,
        mirrored is keras.distribution.DataParallel and multi_worker is
        refused.
    cpu_replicas: split the CPU into N logical devices (for tests).
    precision: Keras dtype policy; logits and losses stay float32.
    jit_compile: XLA; auto = off on TensorFlow, on on JAX (make_runtime).
    steps_per_execution: train steps per host call; auto = the largest
        divisor of the steps per epoch up to 32 (1 under mirrored and
        multi_worker, where Keras 3 cannot loop steps).
    """

    backend: Literal["auto", "tensorflow", "jax"] = "auto"
    strategy: Literal[
        "auto", "default", "one_device", "mirrored", "multi_worker", "tpu"
    ] = "auto"
    cpu_replicas: Optional[int] = Field(None, ge=1, le=64)
    precision: Literal["float32", "mixed_float16", "mixed_bfloat16"] = "float32"
    jit_compile: Union[Literal["auto"], bool] = "auto"
    steps_per_execution: Union[Literal["auto"], int] = "auto"
    deterministic: bool = False

    @model_validator(mode="after")
    def _positive_steps(self) -> RuntimeOptions:
        spe = self.steps_per_execution
        if isinstance(spe, int) and spe < 1:
            raise ValueError(
                f"steps_per_execution must be 'auto' or >= 1. Received: {spe}"
            )
        return self


class PlanOptions(Options):
    """Optimisation and batch arithmetic (advtrain.train.runtime.plan_batches).

    batch_size is the global batch, split evenly across replicas; epochs
    are never divided by the number of workers. scale_lr: learning_rate x
    batch_size / reference_batch; warmup_epochs: linear warm-up from 0
    over that many epochs (may be fractional). shuffle: shuffle arrays and
    examples anew each epoch (a stream function shuffles as it builds its
    batches).
    """

    epochs: int = Field(10, ge=0)
    batch_size: int = Field(64, ge=1)
    steps_per_epoch: Optional[int] = Field(None, ge=1)
    optimizer: Literal["adam", "sgd", "adamw"] = "adam"
    learning_rate: float = Field(1e-3, gt=0.0, le=10.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    # cosine: cosine decay to 0 after the warm-up; onecycle: linear decay
    # to 0 after the warm-up (triangular, as in Wong et al. 2020).
    lr_schedule: Literal["constant", "cosine", "onecycle"] = "constant"
    scale_lr: bool = False
    reference_batch: int = Field(256, ge=1)
    warmup_epochs: float = Field(0.0, ge=0.0)
    seed: Seed = 0
    shuffle: bool = True


class CheckpointOptions(Options):
    """Where and how often `fit` checkpoints (advtrain.train.training_state).

    dir: the folder (checkpoints/, history.csv); a second `fit` with the
        same dir resumes where the first stopped. None: no checkpoints.
    monitor: the metric the kept checkpoints are ranked by; auto: the
        robust accuracy (val_adv_accuracy with validation data whose step
        attacks, else adv_accuracy), or without an attack val_accuracy /
        accuracy.
    """

    dir: Optional[str] = None
    checkpoint_every_epochs: int = Field(1, ge=1)
    checkpoint_every_steps: Optional[int] = Field(None, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    monitor: str = Field("auto", pattern=r"^(auto|(val_)?[a-z][a-z0-9_]*)$")
    monitor_mode: Literal["auto", "max", "min"] = "auto"
