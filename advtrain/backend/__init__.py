"""What differs between Keras backends for advtrain's core, in one place.

The attacks and the training step are written once in `keras.ops`. What
Keras does not offer backend-neutrally lives in one small module per
backend (`tensorflow.py`, `jax.py`), chosen by `keras.backend.backend()`
when this package is imported; only that module is imported, so the JAX
backend never imports TensorFlow. Each provides the functions below and
`HOST_LOOPS`: True where an evaluation should run long attack loops from
the host over compiled, unrolled chunks (JAX: XLA:CPU's while loops miss
the fast convolution path, see `counted_loop`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional

import keras

NAME = keras.backend.backend()
SUPPORTED = ("tensorflow", "jax")

if NAME == "tensorflow":
    from advtrain.backend import tensorflow as _impl
elif NAME == "jax":
    from advtrain.backend import jax as _impl
else:
    _impl = None

HOST_LOOPS = bool(getattr(_impl, "HOST_LOOPS", False))


def _module():
    if _impl is None:
        raise NotImplementedError(
            f"advtrain's core runs on the Keras backends {', '.join(SUPPORTED)}; "
            f"set KERAS_BACKEND to one of them. Received: KERAS_BACKEND={NAME!r}"
        )
    return _impl


def value_and_grad(fn: Callable[[Any], tuple[Any, Any]], x: Any):
    """`((value, aux), gradient)` of `fn(x) -> (scalar value, aux)` with
    respect to the tensor `x`, on the current Keras backend."""
    return _module().value_and_grad(fn, x)


def stateless_uniform(shape: Any, seed: Any, dtype: str = "float32") -> Any:
    """Uniform draws in [0, 1) from a `(2,)` int32 seed tensor: the same
    seed gives the same draws, inside compiled loops too."""
    return _module().stateless_uniform(shape, seed, dtype)


def active_indices(mask: Any) -> Any:
    """Positions (int32) to compute on for the boolean vector `mask`: its
    True entries on a backend with dynamic shapes, every position on one
    without; the caller ignores the results of the False ones."""
    return _module().active_indices(mask)


def counted_loop(body: Callable[..., Any], loop_vars: Sequence[Any], count: Any):
    """`loop_vars` after `count` calls of `body(*loop_vars) -> loop_vars`;
    `count` is an int (unrolled on JAX: an XLA:CPU while loop makes the input
    gradient's convolutions miss their fast path) or a scalar int tensor."""
    return _module().counted_loop(body, tuple(loop_vars), count)


def compile_function(
    fn: Callable[..., Any],
    signature: Sequence[tuple[tuple[Optional[int], ...], str]],
    variables: Sequence[keras.Variable] = (),
    updated: Sequence[keras.Variable] = (),
) -> Callable[..., Any]:
    """`fn(*arrays)` compiled on the current backend, called with arrays
    (numpy or the backend's tensors) that match `signature`, one
    `(shape, dtype)` per argument, None for a dimension that may vary.

    TensorFlow traces it once for the whole signature (a `tf.function`
    with that input signature, which reads and updates variables itself);
    JAX compiles it per concrete shape (`jax.jit`), with the values of
    `variables` (those `fn` reads: the model's, a `SeedGenerator`'s state)
    as arguments, and assigns the new values of `updated` (a subset of
    `variables`, e.g. the random stream's state) after each call.
    """
    return _module().compile_function(fn, signature, variables, updated)


def finite_or_zero(grad: Any) -> Any:
    """`grad` with its inf and NaN entries set to zero."""
    return keras.ops.where(keras.ops.isfinite(grad), grad, keras.ops.zeros_like(grad))


def input_gradient(
    model_fn: Callable[[Any], Any],
    x: Any,
    y: Any,
    loss_fn: Callable[[Any, Any], Any],
    loss_scale: Optional[Any] = None,
) -> Any:
    """Gradient of the summed per-example `loss_fn(y, model_fn(x))` with
    respect to `x`, its non-finite entries set to zero.

    `loss_scale` multiplies the loss before differentiating, as mixed
    precision training does for weight gradients: a float16 backward pass
    would otherwise underflow to zero. An overflowing scaled loss yields
    inf/NaN entries, which become zero: no step beats a NaN image.
    """

    def total(z):
        loss = keras.ops.sum(keras.ops.cast(loss_fn(y, model_fn(z)), "float32"))
        if loss_scale is not None:
            loss = loss * keras.ops.cast(loss_scale, "float32")
        return loss, None

    _, grad = value_and_grad(total, x)
    return finite_or_zero(grad)
