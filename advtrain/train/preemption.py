"""Preemption: on SIGTERM or SIGINT, finish the step, checkpoint, exit 75.

Beyond TensorFlow's PreemptionCheckpointHandler (which only agrees on a
step): advtrain's checkpoint, exit 75 on every worker, orphans ended.

Schedulers (SLURM, Kubernetes, spot VMs) stop a job with SIGTERM, then
SIGKILL. During training the callback `advtrain.train.callbacks.Preemption`
finishes the running step, checkpoints it (the chief into the run folder)
and raises `Preempted`, whose type carries exit code 75 (`EX_TEMPFAIL`:
"try again later"). Outside the training loop the signal raises at once.
A step that ends an epoch is checkpointed at the epoch's end instead
(after validation and the log row), so a resume continues as an
uninterrupted run would.

Under MultiWorkerMirroredStrategy the workers must stop at the same step,
or the next step's collectives hang. TensorFlow's handler agrees on it
through the coordination service (our signal reaches it through
`TerminationConfig.termination_watcher_fn`; each worker polls
`save_checkpoint_if_preempted` after every step, and at the agreed one it
calls our `save_fn`), so a signal reaching one worker stops them all.

This module holds what the launcher and the CLI need too (exit code,
environment, `Preempted`) and imports no TensorFlow.
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

    `scratch`, when set, is this process's private folder (a non-chief
    worker's), removed by `exit_preempted`.
    """

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
    """Ends a multi-worker process at once after `Preempted` (exit 75).

    After `fit` was left mid-epoch under MultiWorkerMirroredStrategy, the
    interpreter's teardown blocks in TensorFlow's destructors (seen with TF
    2.21: the main thread "Garbage-collecting" for 25 s and more, on the
    chief and the other worker alike), so the process would outlive the
    scheduler's grace period. Everything worth keeping is on disk (the
    checkpoint is fsynced), so the process ends here without teardown,
    removing its private folder first. Returns (does nothing) for a
    single-process run.
    """
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
    """Ends this worker when the launcher that started it is gone.

    Reads the launcher's pid from the environment (nothing to do without
    it). A daemon thread polls the parent pid; when the launcher has
    vanished (SIGKILL, crash) it sends this process SIGTERM, so training
    checkpoints and exits, and after `_ORPHAN_GRACE_SECONDS` ends the
    process outright, should it be stuck in a collective with a peer that
    is gone. A polling thread works on every POSIX system, unlike Linux's
    `PR_SET_PDEATHSIG`.
    """
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
    """Decorates a function that installs signal handlers (`Preemption`) so
    the caller's SIGTERM and SIGINT handlers are back when it returns or
    raises."""
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
