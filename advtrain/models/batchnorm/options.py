"""The BatchNorm policy's typed options (`advtrain.fit(batchnorm=...)`)."""

from __future__ import annotations

from typing import Optional, Union

from pydantic import Field, model_validator

from advtrain.models.batchnorm.policy import check_momentum
from advtrain.utils.options import Options


class BatchNormOptions(Options):
    """BatchNorm policy (`advtrain.models.batchnorm.policy`, docs/batchnorm.md).

    momentum: "auto" (layers still at Keras's 0.99 follow the run's
        length), a number for every layer, or None (keep).
    trainable: whether the backbone's BN layers train while it does; None:
        under freeze=all_trainable only.
    recalibrate: re-estimate the trained BN layers' statistics after
        training: "auto" (when the gap exceeds gap_threshold), true, false.
    fused_kernel: compute plain Keras BN layers with TensorFlow's fused
        kernel (same results to float rounding, faster).
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
