"""JAX's ops for `advtrain.backend`: `jax.value_and_grad`, JAX's
counter-based random keys, static shapes and `jax.jit`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import keras

HOST_LOOPS = True
FUSED_BATCHNORM = False
JIT_BY_DEFAULT = True


def value_and_grad(fn, x):
    return jax.value_and_grad(fn, has_aux=True)(x)


def stateless_uniform(shape, seed, dtype="float32"):
    key = jnp.asarray(seed).astype(jnp.uint32)  # a raw threefry key
    return jax.random.uniform(key, shape=tuple(shape), dtype=dtype)


def active_indices(mask):
    # A compiled JAX loop keeps its shapes: compute on every position.
    return jnp.arange(mask.shape[0], dtype=jnp.int32)


def counted_loop(body, loop_vars, count):
    if isinstance(count, int):
        # Unrolled: inside an XLA:CPU while loop the input gradient's
        # transposed convolutions keep a kernel layout that misses the
        # fast convolution path (PGD-2 about 10x slower than unrolled).
        for _ in range(count):
            loop_vars = tuple(body(*loop_vars))
        return loop_vars
    return keras.ops.while_loop(
        lambda *_: True, body, loop_vars, maximum_iterations=count
    )


def host_jit(x):
    # A tracer means the attack is part of a larger jit: it loops inside.
    return None if isinstance(x, jax.core.Tracer) else jax.jit


def compile_function(fn, signature, variables, updated):
    del signature  # jax.jit compiles per concrete shape
    variables = list(variables)
    ids = [id(v) for v in variables]  # a Variable's == is elementwise
    written = [ids.index(id(v)) for v in updated]

    def pure(values, *arrays):
        mapping = list(zip(variables, values, strict=True))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            outputs = fn(*arrays)
        return outputs, [scope.get_current_value(variables[i]) for i in written]

    compiled = jax.jit(pure)

    def call(*arrays):
        outputs, new = compiled([v.value for v in variables], *arrays)
        for i, value in zip(written, new, strict=True):
            variables[i].assign(value)
        return outputs

    return call


def fused_batch_norm(inputs, scale, offset, mean, variance, epsilon, training):
    raise NotImplementedError("the fused BatchNorm kernel is TensorFlow's")
