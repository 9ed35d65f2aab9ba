"""Pieces every attack shares: norms, input gradients, steps, projections;
in `keras.ops`, following the dtype of the input images."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Optional, Union

import keras
import numpy as np
from keras import ops

from advtrain import backend
from advtrain.utils.errors import ArgumentError

Norm = Union[str, int, float]
ModelFn = Callable[[Any], Any]
LossFn = Callable[[Any, Any], Any]

_TINY = 1e-12


def canonical_norm(norm: Norm) -> str:
    """Returns "inf" or "2"; accepts np.inf, "inf", "linf", 2 and "2"."""
    text = str(norm).lower()
    if text in ("inf", "linf", "l_inf", "np.inf"):
        return "inf"
    if text in ("2", "2.0", "l2"):
        return "2"
    raise ArgumentError(
        "norm", f"must be 'inf' (L-infinity) or 2 (L2). Received: norm={norm!r}"
    )


def is_tensor(value: Any) -> bool:
    """A tensor or variable of the Keras backend, not a Python number."""
    return ops.is_tensor(value) or isinstance(value, keras.Variable)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_eps(
    name: str, value: Any, upper: Optional[float] = None, why: str = ""
) -> None:
    """Validates a finite number >= 0 (<= `upper`, `why` saying why)."""
    if is_tensor(value):
        return
    if not is_number(value):
        raise TypeError(f"{name} must be a number. Received: {name}={value!r}")
    if not math.isfinite(value) or value < 0:
        raise ArgumentError(
            name, f"must be a finite number >= 0. Received: {name}={value}"
        )
    if upper is not None and value > upper:
        raise ArgumentError(
            name, f"must be <= {upper:g}{why}. Received: {name}={value}"
        )


def check_count(name: str, value: Any, tensor: bool = True) -> None:
    """Validates an int >= 1 (or, with `tensor`, a scalar integer tensor)."""
    if tensor and is_tensor(value):
        dtype = keras.backend.standardize_dtype(value.dtype)
        if "int" in dtype and len(value.shape) == 0:
            return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        what = " or a scalar integer tensor" if tensor else ""
        raise ArgumentError(
            name, f"must be an int >= 1{what}. Received: {name}={value!r}"
        )


def check_fraction(name: str, value: Any) -> None:
    if not 0.0 <= value < 1.0:
        raise ArgumentError(name, f"must be in [0, 1). Received: {name}={value!r}")


def per_example_cross_entropy(labels: Any, logits: Any) -> Any:
    """Cross-entropy per example; sparse int labels or probability rows."""
    logits = ops.cast(logits, "float32")
    if ops.ndim(labels) == ops.ndim(logits):
        return ops.categorical_crossentropy(
            ops.cast(labels, "float32"), logits, from_logits=True
        )
    labels = ops.cast(ops.reshape(labels, (-1,)), "int32")
    return ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def input_gradient(
    model_fn: ModelFn,
    x: Any,
    y: Any,
    loss_fn: Optional[LossFn] = None,
    loss_scale: Optional[Any] = None,
) -> Any:
    """Gradient of the summed per-example loss (cross-entropy unless
    `loss_fn` is given) with respect to `x`, non-finite entries zeroed.

    `loss_scale` multiplies the loss before differentiating (mixed
    precision: a float16 backward pass would otherwise underflow to zero);
    attack steps only use the gradient's direction, so it cancels.
    """
    loss_fn = loss_fn or per_example_cross_entropy
    return backend.input_gradient(model_fn, x, y, loss_fn, loss_scale)


def reduce_axes(x: Any) -> tuple[int, ...]:
    return tuple(range(1, ops.ndim(x)))


def per_example(mask: Any, rank: int) -> Any:
    # A per-example vector shaped to broadcast over examples of `rank`.
    return ops.reshape(mask, (-1,) + (1,) * (rank - 1))


def worse_of(best: tuple, candidate: tuple) -> tuple:
    """Per example the worse case (for the model) of two `(x_adv, wrong,
    loss)` results: misclassified beats correct, among equals the higher
    loss."""
    (best_x, best_wrong, best_loss), (x_adv, wrong, loss) = best, candidate
    better = (wrong & ~best_wrong) | ((wrong == best_wrong) & (loss > best_loss))
    return (
        ops.where(per_example(better, ops.ndim(best_x)), x_adv, best_x),
        best_wrong | wrong,
        ops.where(better, loss, best_loss),
    )


def steepest_step(grad: Any, size: Any, norm: str) -> Any:
    """The step of length `size` (in `norm`) that most increases the loss."""
    size = ops.cast(size, grad.dtype)
    if norm == "inf":
        return size * ops.stop_gradient(ops.sign(grad))
    sq = ops.sum(ops.square(grad), axis=reduce_axes(grad), keepdims=True)
    return size * grad / ops.sqrt(ops.maximum(sq, ops.cast(_TINY, grad.dtype)))


def project(delta: Any, eps: Any, norm: str) -> Any:
    """Projects a perturbation onto the eps-ball of `norm`."""
    eps = ops.cast(eps, delta.dtype)
    if norm == "inf":
        return ops.clip(delta, -eps, eps)
    sq = ops.sum(ops.square(delta), axis=reduce_axes(delta), keepdims=True)
    length = ops.sqrt(ops.maximum(sq, ops.cast(_TINY, delta.dtype)))
    return delta * ops.minimum(ops.cast(1.0, delta.dtype), eps / length)


def seed_pair(seed: Any) -> Any:
    """Two int32 words drawn from `seed`: the seed of the stateless draws
    inside loops (`fold_seed`), where a `SeedGenerator` cannot advance."""
    return keras.random.randint((2,), 0, 2**31 - 1, dtype="int32", seed=seed)


def fold_seed(pair: Any, i: Any, salt: int = 0) -> Any:
    """A distinct seed pair per loop iteration `i` and use `salt`."""
    i = ops.cast(i, "int32")
    return pair + ops.stack([i + 1, ops.cast(salt * 7_919, "int32")])


def uniform(shape: Any, seed: Any, minval: float = 0.0, maxval: float = 1.0):
    """Float32 uniform draws; stateless for a seed pair tensor."""
    if is_tensor(seed):
        unit = backend.stateless_uniform(shape, seed, "float32")
        return minval + (maxval - minval) * unit
    return keras.random.uniform(
        shape, minval=minval, maxval=maxval, dtype="float32", seed=seed
    )


def normal(shape: Any, seed: Any) -> Any:
    """Float32 standard normal draws, seeded as `uniform`."""
    if not is_tensor(seed):
        return keras.random.normal(shape, dtype="float32", seed=seed)
    # Box-Muller from two stateless uniform draws.
    u = backend.stateless_uniform((2, *shape), seed, "float32")
    radius = ops.sqrt(-2.0 * ops.log(ops.maximum(1.0 - u[0], _TINY)))
    return radius * ops.cos(2.0 * math.pi * u[1])


def random_in_ball(x: Any, eps: Any, norm: str, seed: Any = None) -> Any:
    """A perturbation drawn uniformly from the eps-ball of `norm`; `seed`
    as `keras.random` takes it, or a seed pair tensor (`fold_seed`)."""
    eps = ops.cast(eps, x.dtype)
    shape = ops.shape(x)
    if norm == "inf":
        return ops.cast(uniform(shape, seed, -1.0, 1.0), x.dtype) * eps
    flat_dim = math.prod(shape[1:])
    direction = normal((shape[0], flat_dim), seed)
    direction /= ops.norm(direction, axis=1, keepdims=True) + _TINY
    # Radius r = eps * u^(1/d) gives a uniform density inside the ball.
    u = uniform((shape[0], 1), fold_seed(seed, 0, 1) if is_tensor(seed) else seed)
    radius = ops.power(u, 1.0 / flat_dim)
    return ops.cast(ops.reshape(direction * radius, shape), x.dtype) * eps


def int_labels(y: Any) -> Any:
    """Int32 class labels from integer labels or probability rows."""
    if ops.ndim(y) > 1:
        return ops.cast(ops.argmax(y, axis=-1), "int32")
    return ops.cast(ops.reshape(y, (-1,)), "int32")


def logit_of(logits: Any, labels: Any) -> Any:
    """Per example, the float32 logit of its class in `labels` (int32)."""
    logits = ops.cast(logits, "float32")
    return ops.take_along_axis(logits, ops.expand_dims(labels, -1), axis=-1)[:, 0]


def predicted(logits: Any) -> Any:
    """The predicted class per example, int32."""
    return ops.cast(ops.argmax(logits, axis=-1), "int32")


def attack_inputs(model_fn: ModelFn, x: Any, y: Any) -> tuple[Any, Any]:
    """`x` as a float tensor and the labels to attack: the model's own
    predictions when `y` is None (no label leaking, Kurakin et al. 2016)."""
    x = as_float_tensor(x)
    return x, predicted(model_fn(x)) if y is None else ops.convert_to_tensor(y)


def checked_norm(norm: Norm, eps: Any) -> str:
    """Validates `eps` and returns the canonical `norm`."""
    check_eps("eps", eps)
    return canonical_norm(norm)


def clip_pixels(x: Any, clip_min: Optional[float], clip_max: Optional[float]):
    """`x` inside the pixel range; a None end leaves that side open."""
    if clip_min is None and clip_max is None:
        return x
    low = ops.cast(-math.inf if clip_min is None else clip_min, x.dtype)
    high = ops.cast(math.inf if clip_max is None else clip_max, x.dtype)
    return ops.clip(x, low, high)


def as_float_tensor(x: Any) -> Any:
    x = ops.convert_to_tensor(x)
    dtype = keras.backend.standardize_dtype(x.dtype)
    if not keras.backend.is_float_dtype(dtype):
        raise TypeError(
            "Attacks work on float pixels in [0, 1]; convert uint8 images "
            f"(divide by 255) first. Received: dtype={dtype}"
        )
    return x


# Iterations per compiled call of an attack's loop run from the host:
# each call costs well under a step, and XLA:CPU compiles an unrolled
# chunk of 4 APGD or FAB steps in about half the time of 10 (APGD-T on 54
# MNIST images, 20 steps, 9 targets, cold: 9.7 s at 4, 18.3 s at 10;
# warm: 1.7 s and 1.9 s).
HOST_CHUNK = 4

# `Pieces.run`'s compiler: `(key, fn, *arrays) -> fn(model_fn, *arrays)`,
# compiled once per `key` (and shapes).
Compiler = Callable[..., Any]


class Pieces:
    """Where a multi-step attack's pieces run, and a model function.

    `Pieces(model_fn)` calls them inline: traced into the caller's graph
    or jit, or eager, with the attack's loops as compiled loops (the
    iteration count a tensor). With `compile` (`Compiler`), each piece is
    compiled once per key and shapes and the attack drives its loops from
    the host in chunks of `chunk` unrolled iterations, stopping early
    between chunks (`HOST_LOOPS` backends: an XLA:CPU while loop around an
    input gradient misses the fast convolutions). One attack, one seeding:
    the pieces are the same code either way. Called on `z`, it is the
    model: `model_fn(z)`, compiled where the pieces are.
    """

    def __init__(
        self,
        model_fn: Optional[ModelFn] = None,
        compile: Optional[Compiler] = None,
        chunk: int = HOST_CHUNK,
    ):
        self.model_fn, self._compile, self.chunk = model_fn, compile, chunk

    def chunked(self, chunk: int) -> Pieces:
        """These pieces, with loops from the host in chunks of `chunk`."""
        return Pieces(self.model_fn, self._compile, chunk)

    @property
    def host(self) -> bool:
        """Whether the loops run from the host over compiled pieces."""
        return self._compile is not None

    @classmethod
    def of(cls, model_fn: Any, x: Any) -> Pieces:
        """`model_fn` itself when it is `Pieces`; else inline pieces, or
        pieces compiled per call where `backend.host_jit(x)` offers it
        (a `HOST_LOOPS` backend, `x` concrete)."""
        if isinstance(model_fn, Pieces):
            return model_fn
        jit = backend.host_jit(x)
        if jit is None:
            return cls(model_fn)
        cache = {}  # no annotation: AutoGraph cannot convert one on a nonlocal

        def compile(key, fn, *arrays):
            if key not in cache:
                cache[key] = jit(lambda *a: fn(model_fn, *a))
            return cache[key](*arrays)

        return cls(model_fn, compile)

    def __call__(self, z: Any) -> Any:
        return self.run(_model_of, z)

    def run(self, fn: Callable[..., Any], *args: Any, **static: Any) -> Any:
        """`fn(model_fn, *args, **static)`: inline, or compiled once per
        `fn` and `static` (hashable settings) with `args` (tensors, or
        tuples and dicts of them) its arguments."""
        if not self.host:
            return fn(self.model_fn, *args, **static)
        flat = [_as_array(v) for v in keras.tree.flatten(args)]
        shape = keras.tree.map_structure(lambda _: 0, args)

        def traced(model_fn, *values):
            return fn(model_fn, *keras.tree.pack_sequence_as(shape, values), **static)

        key = ("piece", fn.__module__, fn.__qualname__, len(flat))
        return self._compile((*key, *sorted(static.items())), traced, *flat)

    def spans(self, count: int) -> list[tuple[int, Any]]:
        """`(first, count)` per call of a loop of `count` iterations: one
        call with a tensor count inline, chunks of ints from the host."""
        if not self.host:
            return [(0, ops.convert_to_tensor(count, "int32"))]
        return [(i, min(self.chunk, count - i)) for i in range(0, count, self.chunk)]


def _model_of(model_fn, z):
    return model_fn(z)


def _as_array(value: Any) -> Any:
    # Python numbers as the arrays a compiled piece takes.
    if isinstance(value, (bool, np.bool_)):
        return np.asarray(value)
    if isinstance(value, int):
        return np.asarray(value, np.int32)
    if isinstance(value, float):
        return np.asarray(value, np.float32)
    return value


def runs_until_fooled(pieces: Pieces, body: Callable[..., tuple], state: tuple, runs):
    """`state` (`(run, best, fooled, ...)`) after `body(*state)` per run,
    up to `runs` runs, stopping once every example is `fooled`: a compiled
    loop inline, a Python loop from the host."""

    def more(run, _, fooled, *__):
        return (run < runs) & ~ops.all(fooled)

    if not pieces.host:
        return ops.while_loop(more, body, state, maximum_iterations=runs)
    for _ in range(runs):
        if not bool(ops.convert_to_numpy(more(*state))):
            break
        state = tuple(body(*state))
    return state
