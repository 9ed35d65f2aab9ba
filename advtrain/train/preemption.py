"""Preemption: on SIGTERM or SIGINT, finish the step, checkpoint, exit 75.

Beyond TensorFlow's PreemptionCheckpointHandler (which only agrees on a
step; on JAX the processes agree through `advtrain.backend.any_process`):
advtrain's checkpoint, exit 75 (`EX_TEMPFAIL`) on every worker, orphans
ended. The callback is `advtrain.train.callbacks.Preemption`; this
module holds what the launcher and the CLI need too, without TensorFlow.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Optional

PREEMPTED_EXIT_CODE = 75

# Set by the launcher in each worker's environment.
LAUNCHER_PID_ENV = "ADVTRAIN_LAUNCHER_PID"

# How long a worker whose launcher vanished may take to checkpoint and exit
# after the SIGTERM it sends itself, before it ends itself.
_ORPHAN_GRACE_SECONDS = 30.0


class Preempted(Exception):
    """Training was stopped by a signal; the state is in `checkpoint`.
    `scratch`: a non-chief worker's private folder, or None."""

    exit_code = PREEMPTED_EXIT_CODE

    def __init__(
        self,
        message: str,
        checkpoint: Optional[Path] = None,
        *,
        multi_worker: bool = False,
        scratch: Optional[Path] = None,
    ):
        super().__init__(message)
        self.checkpoint = checkpoint
        self.multi_worker = multi_worker
        self.scratch = scratch


def exit_preempted(exc: Preempted) -> None:
    """Ends a multi-worker process at once after `Preempted` (exit 75),
    removing its private folder: the interpreter's teardown would block in
    TensorFlow's destructors (TF 2.21: 25 s and more) past the scheduler's
    grace period, or on JAX in `jax.distributed`'s shutdown barrier, which
    waits for processes that may have exited already. Does nothing for a
    single-process run."""
    import shutil
    import sys

    if not exc.multi_worker:
        return
    if exc.scratch is not None:
        shutil.rmtree(exc.scratch, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(PREEMPTED_EXIT_CODE)


def watch_launcher() -> None:
    """Ends this worker when the launcher named in the environment is gone:
    a daemon thread polls the parent pid (portable, unlike
    `PR_SET_PDEATHSIG`), then sends SIGTERM, and after
    `_ORPHAN_GRACE_SECONDS` ends a worker stuck in a collective."""
    raw = os.environ.get(LAUNCHER_PID_ENV)
    if not raw or not raw.isdigit():
        return
    launcher = int(raw)

    def watch():
        while os.getppid() == launcher:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(_ORPHAN_GRACE_SECONDS)
        os._exit(PREEMPTED_EXIT_CODE)

    threading.Thread(target=watch, name="advtrain-launcher-watch", daemon=True).start()


def restores_signal_handlers(fn):
    """Restores the caller's SIGTERM and SIGINT handlers when `fn` (which
    installs `Preemption`'s) returns or raises."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            return fn(*args, **kwargs)
        saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            return fn(*args, **kwargs)
        finally:
            for signum, handler in saved.items():
                if handler is not None:
                    signal.signal(signum, handler)

    return wrapper
