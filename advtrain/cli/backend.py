"""Starts a recipe's command on the recipe's Keras backend.

Keras fixes its backend at import, before a recipe is read; so when
`runtime.backend` differs and `KERAS_BACKEND` is unset, the command execs
itself with `KERAS_BACKEND` set (same exit code, signals and output).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from advtrain.utils.errors import ArgumentError

# `python -m advtrain.cli`: `sys.argv[0]` is this file's neighbour.
_MAIN = Path(__file__).with_name("__main__.py")


def start_on_backend(backend: str) -> None:
    """Returns when Keras runs on `backend`, else restarts the command on
    it; an ArgumentError naming `runtime.backend` where it cannot."""
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
    """Whether this process is the command (console script or `python -m
    advtrain.cli`), not a test runner or notebook calling the app."""
    started = Path(sys.argv[0])
    if started.stem == "advtrain" and started.suffix in ("", ".exe"):
        return True
    return started.suffix == ".py" and started.resolve() == _MAIN.resolve()
