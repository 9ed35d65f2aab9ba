"""BatchNormalization on TensorFlow's fused kernel.

Keras 3 computes BatchNorm from separate ops (mean, variance, then
`tf.nn.batch_normalization`) on every backend. TensorFlow has one fused
kernel for it (`FusedBatchNormV3`, oneDNN on CPUs, cuDNN on GPUs) that
tf-keras 2 used by default; on this project's CPU it makes a small BN CNN
train markedly faster (`scripts/bench_step` measures it side by side).

`FusedBatchNormalization` is a `keras.layers.BatchNormalization` whose
`call` uses that kernel where it applies (TensorFlow backend, 4-D NHWC
inputs, no mask, no renorm, not synchronized) and falls back to Keras's
own computation elsewhere. Its semantics are Keras's: normalisation by
the biased batch variance, moving statistics updated as
`moving = momentum * moving + (1 - momentum) * batch` with the biased
variance (the kernel's Bessel-corrected variance is converted back), the
same variables, so weights and checkpoints move freely between the two.
Float16/bfloat16 inputs go into the kernel as they are (it accumulates in
float32) instead of being upcast first.

`fused_kernel(layers)` computes the plain Keras BatchNormalization layers
among `layers` with this class while its block runs and gives them their
class back after: `AdversarialModel`'s TensorFlow trainer runs every
train and test step inside it (`fused_batchnorm=True`, the default), so
the user's model trains fast and still saves as plain Keras layers that
load without advtrain. `fuse_batchnorm(model)` switches the layers for
good (the recipe policy, `policy.apply_batchnorm_policy(fused_kernel=True)`).
TensorFlow is imported only where the kernel runs: on another backend the
class computes as Keras's own layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import keras
from keras import ops

from advtrain.models.batchnorm.walk import batchnorm_layers

_FUSED_DTYPES = ("float16", "bfloat16", "float32")


@keras.saving.register_keras_serializable(package="advtrain")
class FusedBatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` computed by `FusedBatchNormV3`.

    Same arguments, variables and results as the Keras layer (to float
    rounding); see the module docstring for where the fused kernel is used.

    Example:

    ```python
    x = keras.layers.Conv2D(32, 3)(inputs)
    x = FusedBatchNormalization(momentum=0.9)(x)
    ```
    """

    def _fusable(self, inputs, mask) -> bool:
        return (
            keras.backend.backend() == "tensorflow"
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
        import tensorflow as tf

        channels = inputs.shape[-1]
        scale = (
            ops.cast(self.gamma, "float32")
            if self.scale
            else tf.ones([channels], tf.float32)
        )
        offset = (
            ops.cast(self.beta, "float32")
            if self.center
            else tf.zeros([channels], tf.float32)
        )
        moving_mean = ops.cast(self.moving_mean, "float32")
        moving_variance = ops.cast(self.moving_variance, "float32")
        if training and self.trainable:
            outputs, mean, variance = tf.compat.v1.nn.fused_batch_norm(
                inputs,
                scale,
                offset,
                epsilon=self.epsilon,
                data_format="NHWC",
                is_training=True,
            )
            # The kernel reports the unbiased variance (n / (n - 1) times
            # the one it normalised with); Keras tracks the biased one.
            shape = tf.shape(inputs)
            n = tf.cast(shape[0] * shape[1] * shape[2], tf.float32)
            variance = variance * ((n - 1.0) / tf.maximum(n, 1.0))
            momentum = self.momentum
            self.moving_mean.assign(
                ops.cast(
                    moving_mean * momentum + mean * (1.0 - momentum),
                    self.moving_mean.dtype,
                )
            )
            self.moving_variance.assign(
                ops.cast(
                    moving_variance * momentum + variance * (1.0 - momentum),
                    self.moving_variance.dtype,
                )
            )
        else:
            outputs, _, _ = tf.compat.v1.nn.fused_batch_norm(
                inputs,
                scale,
                offset,
                mean=moving_mean,
                variance=moving_variance,
                epsilon=self.epsilon,
                data_format="NHWC",
                is_training=False,
            )
        return ops.cast(outputs, self.compute_dtype)


def fuse_batchnorm(model: keras.layers.Layer) -> int:
    """Switches every plain Keras BatchNormalization layer of `model` to
    `FusedBatchNormalization`, in place; returns how many it switched.

    Only layers whose class is exactly `keras.layers.BatchNormalization`
    change (subclasses keep their own `call`); variables, names and
    weights stay as they are. Call it before `compile`/`fit`: a traced step
    keeps the layers it was traced with.

    Example:

    ```python
    base = keras.applications.ResNet50(weights=None)
    fuse_batchnorm(base)  # 53
    ```
    """
    switched = 0
    for layer in batchnorm_layers(model):
        if type(layer) is keras.layers.BatchNormalization:
            layer.__class__ = FusedBatchNormalization
            switched += 1
    return switched


@contextlib.contextmanager
def fused_kernel(layers: Iterable[keras.layers.Layer]) -> Iterator[None]:
    """Inside, the plain Keras BatchNormalization layers among `layers`
    compute with the fused kernel; on exit they are plain Keras layers
    again (what a traced step computes stays as it was traced).

    Example:

    ```python
    with fused_kernel(batchnorm_layers(model)):
        logs = train_function(iterator)
    ```
    """
    switched = [
        layer for layer in layers if type(layer) is keras.layers.BatchNormalization
    ]
    for layer in switched:
        layer.__class__ = FusedBatchNormalization
    try:
        yield
    finally:
        for layer in switched:
            layer.__class__ = keras.layers.BatchNormalization
