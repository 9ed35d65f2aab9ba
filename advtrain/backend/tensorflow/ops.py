"""TensorFlow's ops for `advtrain.backend`: a gradient tape, TensorFlow's
stateless random ops, dynamic shapes, `tf.function` and the fused
BatchNorm kernel."""

from __future__ import annotations

import logging

import keras
import tensorflow as tf

HOST_LOOPS = False
FUSED_BATCHNORM = True
JIT_BY_DEFAULT = False


def value_and_grad(fn, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        value, aux = fn(x)
    grad = tape.gradient(value, x)
    if grad is None:  # the value does not depend on x
        grad = tf.zeros_like(x)
    return (value, aux), grad


def stateless_uniform(shape, seed, dtype="float32"):
    return tf.random.stateless_uniform(shape, seed=tf.cast(seed, tf.int32), dtype=dtype)


def active_indices(mask):
    return tf.cast(tf.where(mask)[:, 0], tf.int32)


def counted_loop(body, loop_vars, count):
    return keras.ops.while_loop(
        lambda *_: True, body, loop_vars, maximum_iterations=count
    )


def host_jit(x):
    del x  # a compiled attack's loops stay in its graph
    return None


def compile_function(fn, signature, variables, updated):
    del variables, updated  # a tf.function reads and updates them itself
    specs = [tf.TensorSpec(shape, dtype) for shape, dtype in signature]
    traced = tf.function(fn, input_signature=specs)

    def call(*arrays):
        # TensorFlow warns at 5 traces in 10 calls of one Python function;
        # an evaluation traces each of its attack kinds once (5 in a cascade).
        logger = tf.get_logger()
        logger.addFilter(_not_retracing)
        try:
            return traced(*arrays)
        finally:
            logger.removeFilter(_not_retracing)

    return call


def _not_retracing(record: logging.LogRecord) -> bool:
    return "triggered tf.function retracing" not in record.getMessage()


def fused_batch_norm(inputs, scale, offset, mean, variance, epsilon, training):
    channels = [inputs.shape[-1]]
    scale = tf.ones(channels) if scale is None else scale
    offset = tf.zeros(channels) if offset is None else offset
    kernel = dict(epsilon=epsilon, data_format="NHWC")
    if not training:
        outputs, _, _ = tf.compat.v1.nn.fused_batch_norm(
            inputs,
            scale,
            offset,
            mean=mean,
            variance=variance,
            is_training=False,
            **kernel,
        )
        return outputs, mean, variance
    outputs, mean, variance = tf.compat.v1.nn.fused_batch_norm(
        inputs, scale, offset, is_training=True, **kernel
    )
    # The kernel reports the unbiased variance (n / (n - 1) times the one
    # it normalised with); Keras tracks the biased one.
    shape = tf.shape(inputs)
    n = tf.cast(shape[0] * shape[1] * shape[2], tf.float32)
    return outputs, mean, variance * ((n - 1.0) / tf.maximum(n, 1.0))
