"""The TensorFlow side of `advtrain.backend`: a gradient tape, TensorFlow's
stateless random ops, and dynamic shapes."""

from __future__ import annotations

import tensorflow as tf


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
