"""The BatchNorm policy's typed options, shared by `advtrain.fit`
(`batchnorm=`) and the recipe's `model.batchnorm` section.
"""

from __future__ import annotations

from typing import Optional, Union

from pydantic import Field, model_validator

from advtrain.models.batchnorm.policy import check_momentum
from advtrain.utils.options import Options


class BatchNormOptions(Options):
    """BatchNorm policy (advtrain.models.batchnorm.policy, advtrain.models.freezing).

    momentum: the BatchNormalization layers' momentum, nested ones
        included (advtrain.models.batchnorm.policy; docs/batchnorm.md):
        auto (default) gives the layers still at Keras's default 0.99 a
        momentum chosen from the run's length, so the moving average spans
        about 5% of its training steps, clamped to [0.9, 0.99], and keeps
        a momentum someone set; a number sets every layer; None keeps each
        layer's own.
    trainable: whether the backbone's BN layers train while the backbone
        (or its top_k layers) does. Trained BN uses batch statistics and
        updates its moving statistics; frozen BN runs in inference mode and
        nothing in it changes. None (default) means: trained under
        freeze=all_trainable, frozen under top_k; freeze=frozen always
        freezes them.
    recalibrate: after training, re-estimate the moving statistics of the
        trained BN layers on recalibrate_batches clean training batches:
        auto (default) when the measured gap exceeds gap_threshold, true
        always, false never. metrics.json reports the gap before and after.
    gap_threshold: warn when train-mode and inference-mode accuracy differ
        by more than this.
    fused_kernel: compute the plain Keras BatchNormalization layers with
        TensorFlow's fused kernel (advtrain.models.batchnorm.fused): the
        same results to float rounding, faster training (scripts/bench_step
        measures it). false keeps Keras's own computation.
    """

    momentum: Union[float, str, None] = "auto"
    trainable: Optional[bool] = None
    recalibrate: Union[bool, str] = "auto"
    recalibrate_batches: int = Field(50, ge=1)
    gap_threshold: float = Field(0.05, ge=0.0, le=1.0)
    fused_kernel: bool = True

    @model_validator(mode="after")
    def _auto_or_value(self) -> BatchNormOptions:
        # One readable line instead of pydantic's per-union-member errors.
        check_momentum(self.momentum)
        if isinstance(self.recalibrate, str) and self.recalibrate != "auto":
            raise ValueError(
                "recalibrate: expected auto, true or false. "
                f"Received: recalibrate={self.recalibrate!r}"
            )
        return self
