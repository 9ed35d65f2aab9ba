"""The JAX side of `advtrain.backend`: `jax.value_and_grad`, JAX's
counter-based random keys, and static shapes."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def value_and_grad(fn, x):
    return jax.value_and_grad(fn, has_aux=True)(x)


def stateless_uniform(shape, seed, dtype="float32"):
    key = jnp.asarray(seed).astype(jnp.uint32)  # a raw threefry key
    return jax.random.uniform(key, shape=tuple(shape), dtype=dtype)


def active_indices(mask):
    # A compiled JAX loop keeps its shapes: compute on every position.
    return jnp.arange(mask.shape[0], dtype=jnp.int32)
