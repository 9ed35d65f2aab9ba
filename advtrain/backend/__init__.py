"""Everything that differs between Keras backends, in one place.

One package per backend, as Keras's own `keras/src/backend/<name>/`:
`tensorflow/`, `jax/` and `torch/`, each with `ops` (an input gradient, stateless
random draws, loops, compiled functions), `trainer` (`AdversarialModel`'s
step) and `distribution` (device placement); `other.py` stands in for a
backend advtrain does not train on. Only the current backend's package is
imported. The rest of advtrain asks this module what the backend can do
and never compares backend names (tests/test_backend_home.py holds that):

- `HOST_LOOPS`: long attack loops run from the host over compiled,
  unrolled chunks (`counted_loop`).
- `IMPORTS_TENSORFLOW`: the backend loads TensorFlow itself, so its
  TensorFlow-only features (tf.function tensors, cleverhans, the fused
  BatchNorm kernel) apply.
- `HAS_TENSORFLOW`: TensorFlow is installed, as a library (tf.data,
  TFDS, TensorBoard) on any backend; `is_dataset`, `tensorflow_or_none`,
  `exports_saved_model`.
- `GLOBAL_BATCHES`: a step sees the global batch, which the distribution
  shards (JAX), rather than each replica its own (`tf.distribute`).

Importing it chooses Keras's backend first, as Keras would but among the
installed ones (`choose_backend`), and sets KERAS_BACKEND to it so that
Keras and the processes this one starts agree.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Optional

from advtrain.backend._tfimport import import_tensorflow
from advtrain.utils.errors import ArgumentError, BackendNotInstalled

# The Keras backends this package runs on, in the order it prefers them when
# neither KERAS_BACKEND nor keras.json names an installed one. Each is a
# module of its name and an extra of its name: pip install "advtrain[jax]".
SUPPORTED = ("tensorflow", "jax", "torch")
# Set beside KERAS_BACKEND when advtrain chose it: a process started from
# this one then takes it as chosen for it, not by the user (`must_restart`).
_CHOSEN_MARK = "ADVTRAIN_CHOSEN_KERAS_BACKEND"


def installed(name: str) -> bool:
    """Whether the Keras backend `name` (its module) can be imported."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def install_command(names: Sequence[str] = SUPPORTED) -> str:
    """The `pip install` line for the extras of `names`, one of them."""
    return " or ".join(f'pip install "advtrain[{name}]"' for name in names)


def _keras_json_backend() -> Optional[str]:
    # Where Keras reads its settings (keras/src/backend/config.py):
    # KERAS_HOME, else ~/.keras, else /tmp/.keras for a read-only home.
    home = os.environ.get("KERAS_HOME")
    if home is None:
        base = os.path.expanduser("~")
        home = os.path.join(base if os.access(base, os.W_OK) else "/tmp", ".keras")
    try:
        with open(os.path.join(os.path.expanduser(home), "keras.json")) as file:
            name = json.load(file).get("backend")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and name else None


def choose_backend() -> Optional[str]:
    """Chooses Keras's backend before Keras is imported; returns the one the
    user named (KERAS_BACKEND), or None when advtrain chose it.

    KERAS_BACKEND when set (`BackendNotInstalled` for a supported one that
    is not installed); else, unless Keras is imported already, the backend
    keras.json names if it is installed, else the first installed of
    `SUPPORTED`, written to KERAS_BACKEND for Keras and child processes;
    `BackendNotInstalled` when there is none.
    """
    named = os.environ.get("KERAS_BACKEND") or None
    if named is not None:
        if named in SUPPORTED and not installed(named):
            raise BackendNotInstalled(
                f"KERAS_BACKEND={named} is not installed: "
                f"{install_command([named])}, or unset KERAS_BACKEND",
                f"KERAS_BACKEND={named}",
            )
        return None if os.environ.get(_CHOSEN_MARK) == named else named
    if "keras" in sys.modules:
        return None  # Keras chose already
    configured = _keras_json_backend()
    candidates = [configured, *SUPPORTED] if configured else SUPPORTED
    chosen = next((name for name in candidates if installed(name)), None)
    if chosen is None:
        raise BackendNotInstalled(
            f"no Keras backend is installed: {install_command()}",
            "KERAS_BACKEND=<unset>",
        )
    os.environ["KERAS_BACKEND"] = os.environ[_CHOSEN_MARK] = chosen
    return None


# KERAS_BACKEND as the user set it (None: unset, or chosen by advtrain).
NAMED = choose_backend()
HAS_TENSORFLOW = installed("tensorflow")

# Keras imports TensorFlow on its default backend: quietly, first.
if HAS_TENSORFLOW and os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
    import_tensorflow()

import keras  # noqa: E402

NAME = keras.backend.backend()

_impl = importlib.import_module(
    f"advtrain.backend.{NAME}" if NAME in SUPPORTED else "advtrain.backend.other"
)


def imports_tensorflow(name: str) -> bool:
    """Whether the Keras backend `name` loads TensorFlow itself, so that
    TensorFlow's own features (tf.function tensors, cleverhans, the fused
    BatchNorm kernel, the SavedModel export) apply on it."""
    return name == "tensorflow"


def exports_saved_model(name: str) -> bool:
    """Whether Keras can write a TensorFlow SavedModel from a model on the
    backend `name`: TensorFlow installed, and the backend's own export
    (TensorFlow's, or JAX's through jax2tf; Keras's PyTorch archive takes
    no serving function such as advtrain's, only a whole model)."""
    return HAS_TENSORFLOW and name in ("tensorflow", "jax")


IMPORTS_TENSORFLOW = imports_tensorflow(NAME)
HOST_LOOPS: bool = _impl.HOST_LOOPS
GLOBAL_BATCHES: bool = _impl.GLOBAL_BATCHES
FUSED_BATCHNORM: bool = _impl.FUSED_BATCHNORM
# `jit_compile: auto`: off on TensorFlow, where XLA made every adversarial
# step slower on CPUs (scripts/bench_step); on on JAX, which without jit
# runs op by op.
JIT_BY_DEFAULT: bool = _impl.JIT_BY_DEFAULT
# Strategies that run one step per host call (see the backend's module).
SINGLE_STEP_STRATEGIES: tuple[str, ...] = _impl.SINGLE_STEP_STRATEGIES
# How the runtime's banner names data parallelism over several replicas.
DATA_PARALLEL: str = _impl.DATA_PARALLEL

# `AdversarialModel`'s per-backend half, placed before `keras.Model`, and
# the two questions its metrics ask (see the backend's `trainer` module).
AdversarialTrainer = _impl.AdversarialTrainer
replicas_in_sync: Callable[[], int] = _impl.replicas_in_sync
metric_count: Callable[[Any], float] = _impl.metric_count


def value_and_grad(fn: Callable[[Any], tuple[Any, Any]], x: Any):
    """`((value, aux), gradient)` of `fn(x) -> (scalar value, aux)` with
    respect to the tensor `x`."""
    return _impl.value_and_grad(fn, x)


def stateless_uniform(shape: Any, seed: Any, dtype: str = "float32") -> Any:
    """Uniform draws in [0, 1) from a `(2,)` int32 seed tensor: the same
    seed gives the same draws, inside compiled loops too."""
    return _impl.stateless_uniform(shape, seed, dtype)


def active_indices(mask: Any) -> Any:
    """Positions (int32) to compute on for the boolean vector `mask`: its
    True entries with dynamic shapes, every position without (the caller
    ignores the results of the False ones)."""
    return _impl.active_indices(mask)


def counted_loop(body: Callable[..., Any], loop_vars: Sequence[Any], count: Any):
    """`loop_vars` after `count` calls of `body(*loop_vars) -> loop_vars`;
    `count` is an int (unrolled on JAX: in an XLA:CPU while loop the input
    gradient's convolutions miss their fast path) or a scalar int tensor.
    Called eagerly with an int count and `HOST_LOOPS`, it is the host's
    loop over `body`, which may itself call compiled functions."""
    return _impl.counted_loop(body, tuple(loop_vars), count)


def host_jit(x: Any) -> Optional[Callable[[Callable[..., Any]], Callable[..., Any]]]:
    """A compiler (`fn -> fn compiled`) for an attack called directly on
    the concrete `x` to drive its loops from the host over (`HOST_LOOPS`
    backends); None where `x` is traced or loops compile whole."""
    return _impl.host_jit(x)


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
    return _impl.compile_function(fn, signature, variables, updated)


def fused_batch_norm(inputs, scale, offset, mean, variance, epsilon, training):
    """`(outputs, batch mean, batch variance)` of TensorFlow's fused
    BatchNorm kernel on NHWC `inputs` (`FUSED_BATCHNORM` backends only);
    with `training` the batch's statistics (biased variance), else `mean`
    and `variance` normalise and come back unchanged."""
    return _impl.fused_batch_norm(
        inputs, scale, offset, mean, variance, epsilon, training
    )


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


def place(strategy: str, cpu_replicas: Optional[int], deterministic: bool):
    """Places the run on the devices: a `Placement` (the strategy or
    distribution, its name with `auto` resolved, replicas, workers, this
    task, the device kind). Call it before any other backend work
    (`cpu_replicas` splits the CPU). Raises `ArgumentError` naming a
    setting this backend cannot set up."""
    return _impl.place(strategy, cpu_replicas, deterministic)


def holds_variables(strategy: Any, variables: Sequence[Any], replicas: int) -> bool:
    """Whether `variables` were created under `strategy` (not None)."""
    return _impl.holds_variables(strategy, variables, replicas)


def prepare_model(model: keras.Model, runtime: Any) -> keras.Model:
    """`model` readied for `fit` under `runtime` after `compile`; raises
    `ArgumentError` for an optimizer the runtime cannot train with."""
    return _impl.prepare_model(model, runtime)


def resolve(requested: str) -> str:
    """`requested` with `auto` replaced by the backend Keras runs on."""
    return NAME if requested == "auto" else requested


def worker_environments(addresses: list[str]) -> list[dict[str, str]]:
    """The environment variables of each process of a cluster whose
    processes listen at `addresses` (`host:port`, the first one the chief
    or coordinator): what a launcher sets for its workers."""
    return _impl.worker_environments(addresses)


def any_process(flag: bool) -> bool:
    """Whether `flag` is set in any process of a multi-process run, where
    the backend agrees on it in a collective that every process calls at
    the same point; `flag` elsewhere."""
    return _impl.any_process(flag)


def process_share(batches: Any) -> Any:
    """This process's share of each of the global `batches`, where each
    process of a multi-process run feeds its own share to `Model.fit`
    (JAX); `batches` itself elsewhere."""
    return _impl.process_share(batches)


def leave_processes(strategy: Any, variables: Sequence[Any]) -> None:
    """After training over several processes, readies `variables` for work
    in this process alone (evaluation, saving) where the backend needs it."""
    _impl.leave_processes(strategy, variables)


def check_requested(requested: Optional[str], key: str = "backend") -> None:
    """Raises `ArgumentError(key)` unless `requested` (`auto` or None: any)
    is the backend Keras runs on: it is chosen before Keras is imported."""
    if requested in (None, "auto") or requested == NAME:
        return
    raise ArgumentError(
        key,
        f"Keras already runs on {NAME} in this process (KERAS_BACKEND="
        f"{os.environ.get('KERAS_BACKEND', '<unset>')}); the backend is "
        "chosen before Keras is imported: set KERAS_BACKEND="
        f"{requested} in a fresh process. Received: {key}={requested}",
    )


def must_restart(requested: str, key: str, asker: str = "the run") -> bool:
    """For a command that can start itself again on `requested`: False when
    Keras runs it already (or `requested` is `auto`), True when advtrain
    chose the backend because KERAS_BACKEND is unset (`select` it, then
    restart); `ArgumentError(key)` when the user's KERAS_BACKEND names
    another backend than `asker` asks for, or `requested` is not installed."""
    if requested == "auto" or requested == NAME:
        return False
    chosen = NAMED
    if chosen and chosen != requested:
        raise ArgumentError(
            key,
            f"{asker} runs on {requested} but KERAS_BACKEND={chosen}; unset "
            "KERAS_BACKEND or make the two agree. "
            f"Received: {key}={requested}, KERAS_BACKEND={chosen}",
        )
    if requested in SUPPORTED and not installed(requested):
        raise ArgumentError(
            key,
            f"{asker} runs on {requested}, which is not installed: "
            f"{install_command([requested])}, or {key}: auto for {NAME}. "
            f"Received: {key}={requested}",
        )
    return True


def select(requested: str) -> None:
    """Names `requested` for the processes this one starts (KERAS_BACKEND),
    as the user would."""
    os.environ["KERAS_BACKEND"] = requested
    os.environ.pop(_CHOSEN_MARK, None)


def tensorflow_or_none() -> Optional[ModuleType]:
    """TensorFlow, imported quietly, where it is installed; else None."""
    if not HAS_TENSORFLOW:
        return None
    import_tensorflow()
    import tensorflow

    return tensorflow


def is_dataset(x: Any) -> bool:
    """Whether `x` is a `tf.data.Dataset` (never importing TensorFlow: a
    dataset needs it loaded already)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(x, tf.data.Dataset)


def require_tensorflow_tensors(what: str, instead: str) -> None:
    """Raises the one-line `ValueError` for `what`, which takes TensorFlow
    tensors, on a backend that does not import TensorFlow (`instead`: what
    to use there)."""
    if IMPORTS_TENSORFLOW:
        return
    raise ValueError(
        f"{what} runs on TensorFlow only; use {instead} or "
        f"KERAS_BACKEND=tensorflow. Received: KERAS_BACKEND={NAME!r}"
    )
