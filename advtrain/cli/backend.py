"""Starts a recipe's command on the recipe's Keras backend.

Keras reads its backend once, when it is imported, and importing any part
of advtrain (this CLI included) imports Keras: by the time a recipe is read
the backend is fixed. So when `runtime.backend` names another backend than
the one Keras started on, and `KERAS_BACKEND` does not choose one, the
command starts again in a fresh interpreter with `KERAS_BACKEND` set to the
recipe's (the process is replaced: its exit code, signals and output are
the command's own). `KERAS_BACKEND=jax advtrain run ...` skips the restart.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from advtrain.utils.errors import ArgumentError

# `python -m advtrain.cli`: `sys.argv[0]` is this file's neighbour.
_MAIN = Path(__file__).with_name("__main__.py")


def start_on_backend(backend: str) -> None:
    """Returns when Keras runs on `backend`; else restarts the command on
    it, or raises when that cannot be done.

    Raises:
        ArgumentError: naming `runtime.backend`, when `KERAS_BACKEND` names
            another backend, or when this process is not the command (a
            test's in-process runner) and Keras runs on another backend.
    """
    import keras

    chosen = os.environ.get("KERAS_BACKEND")
    if chosen and chosen != backend:
        raise ArgumentError(
            "runtime.backend",
            f"the recipe runs on {backend} but KERAS_BACKEND={chosen}; unset "
            "KERAS_BACKEND or make the two agree. "
            f"Received: runtime.backend={backend}, KERAS_BACKEND={chosen}",
        )
    running = keras.backend.backend()
    if running == backend:
        return
    if not _is_the_command():
        raise ArgumentError(
            "runtime.backend",
            f"Keras already runs on {running} in this process; set "
            f"KERAS_BACKEND={backend} before it starts. "
            f"Received: runtime.backend={backend}",
        )
    os.environ["KERAS_BACKEND"] = backend
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "advtrain.cli", *sys.argv[1:]])


def _is_the_command() -> bool:
    """Whether this process is the command itself (the console script, or
    `python -m advtrain.cli`), which can restart as itself; not a test
    runner or a notebook calling the app in process."""
    started = Path(sys.argv[0])
    if started.stem == "advtrain" and started.suffix in ("", ".exe"):
        return True
    return started.suffix == ".py" and started.resolve() == _MAIN.resolve()
