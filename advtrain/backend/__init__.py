"""What differs between Keras backends for advtrain's core, in one place.

Attacks and the training step are written once in `keras.ops`; what Keras
does not offer backend-neutrally lives in one module per backend
(`tensorflow.py`, `jax.py`), of which only the current one is imported.
`HOST_LOOPS`: whether an evaluation runs long attack loops from the host
over compiled, unrolled chunks (JAX, see `counted_loop`).
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
    respect to the tensor `x`."""
    return _module().value_and_grad(fn, x)


def stateless_uniform(shape: Any, seed: Any, dtype: str = "float32") -> Any:
    """Uniform draws in [0, 1) from a `(2,)` int32 seed tensor: the same
    seed gives the same draws, inside compiled loops too."""
    return _module().stateless_uniform(shape, seed, dtype)


def active_indices(mask: Any) -> Any:
    """Positions (int32) to compute on for the boolean vector `mask`: its
    True entries with dynamic shapes, every position without (the caller
    ignores the results of the False ones)."""
    return _module().active_indices(mask)


def counted_loop(body: Callable[..., Any], loop_vars: Sequence[Any], count: Any):
    """`loop_vars` after `count` calls of `body(*loop_vars) -> loop_vars`;
    `count` is an int (unrolled on JAX: in an XLA:CPU while loop the input
    gradient's convolutions miss their fast path) or a scalar int tensor."""
    return _module().counted_loop(body, tuple(loop_vars), count)


def compile_function(
    fn: Callable[..., Any],
    signature: Sequence[tuple[tuple[Optional[int], ...], str]],
    variables: Sequence[keras.Variable] = (),
    updated: Sequence[keras.Variable] = (),
) -> Callable[..., Any]:
    """`fn(*arrays)` compiled, for arrays matching `signature` (one
    `(shape, dtype)` per argument, None for a dimension that may vary).

    TensorFlow traces one `tf.function` for the signature; JAX jits per
    concrete shape, passing the values of `variables` (those `fn` reads)
    and assigning the new values of `updated` (a subset) after each call.
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
    respect to `x`, non-finite entries set to zero.

    `loss_scale` multiplies the loss first, as mixed precision does for
    weight gradients (a float16 backward pass would underflow); an
    overflow's inf/NaN entries become zero: no step beats a NaN image.
    """

    def total(z):
        loss = keras.ops.sum(keras.ops.cast(loss_fn(y, model_fn(z)), "float32"))
        if loss_scale is not None:
            loss = loss * keras.ops.cast(loss_scale, "float32")
        return loss, None

    _, grad = value_and_grad(total, x)
    return finite_or_zero(grad)
