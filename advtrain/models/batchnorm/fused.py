"""BatchNormalization on TensorFlow's fused kernel (`FusedBatchNormV3`).

Keras 3 computes BatchNorm from separate ops on every backend; the fused
kernel (oneDNN, cuDNN) trains a BN CNN markedly faster (`scripts/bench_step`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import keras
from keras import ops

from advtrain import backend
from advtrain.models.batchnorm.walk import batchnorm_layers

_FUSED_DTYPES = ("float16", "bfloat16", "float32")


@keras.saving.register_keras_serializable(package="advtrain")
class FusedBatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` computed by `FusedBatchNormV3`.

    The kernel runs on TensorFlow for 4-D NHWC inputs without mask, renorm
    or synchronization; elsewhere Keras's own computation does. Same
    arguments, variables and results (to float rounding), so weights move
    freely between the two classes.

    Example:

    ```python
    x = keras.layers.Conv2D(32, 3)(inputs)
    x = FusedBatchNormalization(momentum=0.9)(x)
    ```
    """

    def _fusable(self, inputs, mask) -> bool:
        return (
            backend.FUSED_BATCHNORM
            and mask is None
            and not self.renorm
            and not self.synchronized
            and len(inputs.shape) == 4
            and self.axis in (3, -1)
            and inputs.shape[-1] is not None
            and keras.backend.standardize_dtype(inputs.dtype) in _FUSED_DTYPES
        )

    def call(self, inputs, training=None, mask=None):
        if not self._fusable(inputs, mask):
            return super().call(inputs, training=training, mask=mask)
        training = bool(training and self.trainable)
        moving_mean = ops.cast(self.moving_mean, "float32")
        moving_variance = ops.cast(self.moving_variance, "float32")
        outputs, mean, variance = backend.fused_batch_norm(
            inputs,
            ops.cast(self.gamma, "float32") if self.scale else None,
            ops.cast(self.beta, "float32") if self.center else None,
            moving_mean,
            moving_variance,
            self.epsilon,
            training,
        )
        if training:
            momentum = self.momentum
            for variable, moving, batch in (
                (self.moving_mean, moving_mean, mean),
                (self.moving_variance, moving_variance, variance),
            ):
                update = moving * momentum + batch * (1.0 - momentum)
                variable.assign(ops.cast(update, variable.dtype))
        return ops.cast(outputs, self.compute_dtype)


def switch_batchnorm(
    layers: Iterable[keras.layers.Layer], fused: bool
) -> list[keras.layers.Layer]:
    """Switches the plain Keras BatchNormalization layers among `layers` to
    `FusedBatchNormalization` (`fused=True`), or the fused ones back, in
    place; returns those switched. Subclasses keep their class. Switch
    before `compile`/`fit`: a traced step keeps the layers it traced."""
    plain, other = keras.layers.BatchNormalization, FusedBatchNormalization
    source, target = (plain, other) if fused else (other, plain)
    switched = [layer for layer in layers if type(layer) is source]
    for layer in switched:
        layer.__class__ = target
    return switched


def fuse_batchnorm(model: keras.layers.Layer) -> int:
    """Switches `model`'s plain Keras BatchNormalization layers, nested
    ones included, to the fused kernel for good; returns how many."""
    return len(switch_batchnorm(batchnorm_layers(model), fused=True))


@contextlib.contextmanager
def fused_kernel(layers: Iterable[keras.layers.Layer]) -> Iterator[None]:
    """Inside, the plain Keras BatchNormalization layers among `layers`
    compute with the fused kernel; on exit they are plain again, so the
    model still saves as Keras layers."""
    switched = switch_batchnorm(layers, fused=True)
    try:
        yield
    finally:
        switch_batchnorm(switched, fused=False)
