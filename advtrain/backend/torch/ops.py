"""PyTorch's ops for `advtrain.backend`: `torch.autograd.grad`, seeded
`torch.Generator`s, dynamic shapes and eager loops (Keras's own PyTorch
trainer runs eagerly unless `jit_compile`)."""

from __future__ import annotations

import contextlib
import contextvars

import keras
import torch

HOST_LOOPS = False  # every loop is the host's already: nothing to chunk
FUSED_BATCHNORM = False
JIT_BY_DEFAULT = False  # torch.compile: see compile_function

# Set while `AdversarialTrainer.value_and_gradients` records the loss: an
# input gradient taken there (GradAlign's) stays differentiable.
_RECORDING = contextvars.ContextVar("advtrain_torch_recording", default=False)


@contextlib.contextmanager
def recording():
    """Marks the loss being recorded for the weights' gradients."""
    token = _RECORDING.set(True)
    try:
        with torch.enable_grad():
            yield
    finally:
        _RECORDING.reset(token)


def value_and_grad(fn, x):
    x = keras.ops.convert_to_tensor(x)
    # Inside a recorded loss the gradient is part of it (double backward);
    # an attack's gradient is a constant, its graph freed at once.
    outer = _RECORDING.get()
    z = x if outer and x.requires_grad else x.detach().requires_grad_(True)
    with torch.enable_grad():
        value, aux = fn(z)
    (grad,) = torch.autograd.grad(value, z, create_graph=outer, allow_unused=True)
    if grad is None:  # the value does not depend on x
        grad = torch.zeros_like(z)
    if outer:
        return (value, aux), grad
    if aux is not None:  # an attack's input gradient has none
        aux = keras.tree.map_structure(_detached, aux)
    return (value.detach(), aux), grad


def _detached(value):
    return value.detach() if isinstance(value, torch.Tensor) else value


def _mixed(high: int, low: int) -> int:
    # splitmix64's finaliser over both words, folded to 32 bits: PyTorch's
    # CPU generator (mt19937) keeps only a seed's low 32 bits, so the two
    # words side by side would lose the high one (a loop's counter).
    z = ((high << 32) | low) + 0x9E3779B97F4A7C15 & _MASK64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK64
    z ^= z >> 31
    return (z ^ (z >> 32)) & 0xFFFFFFFF


_MASK64 = (1 << 64) - 1


def stateless_uniform(shape, seed, dtype="float32"):
    seed = keras.ops.convert_to_tensor(seed)
    high, low = (int(w) & 0xFFFFFFFF for w in seed.tolist())
    generator = torch.Generator(device=seed.device).manual_seed(_mixed(high, low))
    return torch.rand(
        tuple(int(d) for d in shape),
        generator=generator,
        dtype=getattr(torch, keras.backend.standardize_dtype(dtype)),
        device=seed.device,
    )


def active_indices(mask):
    return torch.nonzero(keras.ops.convert_to_tensor(mask))[:, 0].to(torch.int32)


def counted_loop(body, loop_vars, count):
    # Eager: the host's loop, whatever the count's type.
    for _ in range(int(keras.ops.convert_to_numpy(count))):
        loop_vars = tuple(body(*loop_vars))
    return loop_vars


def host_jit(x):
    del x  # eager: the attacks' loops are the host's already
    return None


def compile_function(fn, signature, variables, updated):
    # Eager: `fn` reads and updates the variables itself. torch.compile
    # gains nothing on the attacks' short CPU kernels and recompiles for
    # each eps and step count (they are arguments), so it is not used.
    del signature, variables, updated

    def call(*arrays):
        # As Keras's test step: no graph for the forward passes; each
        # input gradient records its own (`value_and_grad`).
        with torch.no_grad():
            return fn(*(keras.ops.convert_to_tensor(a) for a in arrays))

    return call


def fused_batch_norm(inputs, scale, offset, mean, variance, epsilon, training):
    raise NotImplementedError("the fused BatchNorm kernel is TensorFlow's")
