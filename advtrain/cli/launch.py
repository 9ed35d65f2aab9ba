"""`advtrain launch`: N local workers of one data-parallel run.

Each worker is an `advtrain run` process whose environment names the same
loopback cluster, as the backend asks (`advtrain.backend.worker_environments`:
a `TF_CONFIG` for MultiWorkerMirroredStrategy on TensorFlow, Keras's
`KERAS_DISTRIBUTION_*` for `keras.distribution.initialize` on JAX); worker
0, the chief, writes the run folder. The launcher owns its workers: each in
its own process group; SIGTERM/SIGINT forwarded (they checkpoint and exit
75), stragglers killed after `_SHUTDOWN_GRACE`; a dead worker named in one
line and the others stopped (or all restarted, `max_restarts`); output to
log files, the chief's progress echoed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Optional

from advtrain import backend as backends
from advtrain.evaluation.verdict import EXIT_CODES
from advtrain.recipe.loader import load_recipe
from advtrain.recipe.run_folder import (
    RESUME_COMMAND_ENV,
    check_run_dir,
    holds_run,
    output_dir,
)
from advtrain.train.preemption import LAUNCHER_PID_ENV, PREEMPTED_EXIT_CODE
from advtrain.utils.progress import Echo

# After a worker is lost the others block in a collective until the
# backend's coordination service notices; they get this long to exit on
# their own.
_LOST_WORKER_GRACE = 5.0
# After a forwarded SIGTERM, workers get this long to reach the agreed step,
# checkpoint and exit. Below the 30 s that SLURM (KillWait) and Kubernetes
# (terminationGracePeriodSeconds) give by default before their SIGKILL.
_SHUTDOWN_GRACE = 25.0
# How a worker may end without having failed: finished (soundly or with an
# unsound verdict: a restart would not change it), or checkpointed on a signal.
_ENDED = (*EXIT_CODES.values(), PREEMPTED_EXIT_CODE)
_VERDICTS = {code: kind for kind, code in EXIT_CODES.items() if code}


@dataclasses.dataclass
class WorkerResult:
    """How one worker ended and what it reported."""

    index: int
    exit_code: int
    run_folder: Optional[str] = None
    weights: Optional[str] = None
    log_tail: list[str] = dataclasses.field(default_factory=list)
    pid: Optional[int] = None

    @property
    def ending(self) -> str:
        """ "exit code 1", "killed by SIGKILL", ..."""
        if self.exit_code < 0:
            try:
                return f"killed by {signal.Signals(-self.exit_code).name}"
            except ValueError:
                return f"killed by signal {-self.exit_code}"
        if self.exit_code == PREEMPTED_EXIT_CODE:
            return f"exit code {self.exit_code} (checkpointed on a signal)"
        if self.exit_code in _VERDICTS:
            kind = _VERDICTS[self.exit_code].replace("_", " ")
            return f"exit code {self.exit_code} (finished, but unsound: {kind})"
        return f"exit code {self.exit_code}"

    @property
    def error_line(self) -> Optional[str]:
        """The worker's own one-line error, if it printed one."""
        for line in reversed(self.log_tail):
            if line.startswith(("error:", "preempted by")):
                return line
        return None


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free on `host` right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def exit_code(results: list[WorkerResult]) -> int:
    """0 when all finished soundly, else the first failure's code (1 for a
    signal), else 75 when they checkpointed on a signal, else the first
    unsound verdict's code (3, 4)."""
    codes = [r.exit_code for r in results]
    if all(c == 0 for c in codes):
        return 0
    failed = [c for c in codes if c not in _ENDED]
    if failed:
        return failed[0] if failed[0] > 0 else 1
    if PREEMPTED_EXIT_CODE in codes:
        return PREEMPTED_EXIT_CODE
    return next(c for c in codes if c)


def launch(
    recipe: str,
    workers: int,
    *,
    overrides: Optional[list[str]] = None,
    output: Optional[Path] = None,
    echo: Echo = print,
    max_restarts: int = 0,
    debug: bool = False,
) -> list[WorkerResult]:
    """Runs `recipe` on `workers` local processes; returns their results.

    The run folder is chosen once, here; each worker runs `advtrain run
    RECIPE --set runtime.strategy=multi_worker --output DIR`. Logs are kept
    (in DIR/launch-logs) when something failed, or with `debug`, which
    also echoes them.
    """
    overrides = list(overrides or []) + ["runtime.strategy=multi_worker"]
    resolved = load_recipe(recipe, overrides)
    out = output_dir(resolved, output).resolve()
    check_run_dir(out, resolved)
    command = [sys.executable, "-m", "advtrain.cli"] + (["--debug"] if debug else [])
    command += ["run", str(recipe)]
    command += [arg for item in overrides for arg in ("--set", item)]
    command += ["--output", str(out)]
    resume = f"advtrain launch --workers {workers} {out}/recipe.yaml --output {out}"
    if max_restarts:
        resume += f" --max-restarts {max_restarts}"
    logs = Path(tempfile.mkdtemp(prefix="advtrain-launch-logs-"))
    stop = _Stop()
    attempt = 0
    with stop.installed():
        while True:
            tag = f"attempt-{attempt + 1}-" if max_restarts else ""
            results, lost, leftovers = _attempt(
                command, workers, out, resume, logs, tag, stop, echo, debug
            )
            if exit_code(results) == 0 or stop.signum or lost is None:
                break
            if attempt == max_restarts:
                echo(f"launch: {lost}; resume with `{resume}`")
                break
            attempt += 1
            echo(
                f"launch: {lost}; restart {attempt}/{max_restarts}: "
                f"relaunching {workers} workers from {_last_checkpoint(out)}"
            )
    code = exit_code(results)
    logs = _keep_logs(logs, out, keep=debug or code != 0)
    for result in results:
        role = "chief" if result.index == 0 else "worker"
        echo(f"worker {result.index} ({role}): {result.ending}")
        line = result.error_line
        if result.exit_code not in _ENDED and line:
            echo(f"  [worker {result.index}] {line}")
    if logs is not None:
        echo(f"launch: full worker logs in {logs}")
    if code == PREEMPTED_EXIT_CODE:
        echo(
            f"launch: preempted; the workers checkpointed ({_last_checkpoint(out)}) "
            f"and exited; resume with `{resume}`"
        )
    elif code == 0 and attempt:
        echo(f"launch: finished after {attempt} restart(s)")
    if code == 0:
        _report(results, leftovers, echo)
    return results


class _Stop:
    # SIGTERM/SIGINT received by the launcher (forwarded to the workers).
    def __init__(self):
        self.signum: Optional[int] = None
        self.count = 0

    def _handle(self, signum, frame):
        self.signum = self.signum or signum
        self.count += 1

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGTERM, signal.SIGINT)
        saved = {s: signal.signal(s, self._handle) for s in signals}
        try:
            yield
        finally:
            for s, handler in saved.items():
                signal.signal(s, handler)


def _attempt(command, workers, out, resume, logs, tag, stop, echo, debug):
    # Starts the workers once and waits: (results, the lost worker in words
    # or None, leftover temporary folders).
    addresses = [f"127.0.0.1:{port}" for port in free_ports(workers)]
    scratch = Path(tempfile.mkdtemp(prefix="advtrain-launch-"))
    procs, threads, results, handles = [], [], [], []
    lost = None
    try:
        for index, cluster in enumerate(backends.worker_environments(addresses)):
            env = dict(os.environ)
            env.update(cluster)
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            env["PYTHONUNBUFFERED"] = "1"
            env[LAUNCHER_PID_ENV] = str(os.getpid())
            env[RESUME_COMMAND_ENV] = resume
            # Non-chief workers' temporary run folders land here, so the
            # launcher can check they were removed.
            env["TMPDIR"] = str(scratch)
            log = logs / f"{tag}worker-{index}.log"
            handle = open(log, "a", encoding="utf-8", buffering=1)
            handles.append(handle)
            proc = subprocess.Popen(
                command,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
                start_new_session=True,
            )
            result = WorkerResult(index, -1, pid=proc.pid)
            lock = threading.Lock()
            for stream, shown in ((proc.stdout, index == 0), (proc.stderr, False)):
                thread = threading.Thread(
                    target=_pump,
                    args=(stream, result, handle, lock, echo, shown or debug),
                    daemon=True,
                )
                thread.start()
                threads.append(thread)
            procs.append(proc)
            results.append(result)
        echo(
            f"launch: {workers} workers at {', '.join(addresses)} (pids "
            f"{', '.join(str(p.pid) for p in procs)}); worker 0 is the chief "
            f"and writes {out}"
        )
        lost = _wait(procs, results, stop, echo)
        for thread in threads:
            thread.join(timeout=10)
        for proc, result in zip(procs, results, strict=True):
            result.exit_code = proc.returncode
    finally:
        for proc in procs:
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
        for handle in handles:
            handle.close()
        leftovers = list(scratch.glob("advtrain-worker-*"))
        shutil.rmtree(scratch, ignore_errors=True)
    return results, lost, leftovers


def _pump(stream, result: WorkerResult, log: IO, lock, echo: Echo, shown: bool):
    prefix = "" if result.index == 0 else f"[worker {result.index}] "
    for raw in stream:
        line = raw.rstrip("\n")
        if line.startswith("run folder: "):
            result.run_folder = line[len("run folder: ") :].strip()
        elif line.startswith("weights: sha256 "):
            result.weights = line.split()[-1]
        with lock:
            log.write(raw if raw.endswith("\n") else raw + "\n")
            result.log_tail = (result.log_tail + [line])[-20:]
        if shown:
            echo(prefix + line)


def _kill_group(proc: subprocess.Popen, signum: int) -> None:
    # The worker's process group: the worker and its children.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


def _wait(procs, results, stop: _Stop, echo: Echo) -> Optional[str]:
    # Forwards the launcher's signals and stops the survivors of a lost
    # worker; returns the lost worker in words, or None.
    deadline = None  # when the workers still running are killed
    forwarded = False
    lost = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if stop.signum and not forwarded:
            for proc in procs:
                if proc.poll() is None:
                    _kill_group(proc, stop.signum)
            forwarded = True
            deadline = now + _SHUTDOWN_GRACE
        if stop.count > 1 and deadline != float("inf"):  # a second signal
            deadline = now
        if lost is None and deadline is None:
            lost = _lost(procs, results)
            if lost is not None:
                echo(f"launch: {lost}; stopping the other workers")
                deadline = now + _LOST_WORKER_GRACE
        if deadline is not None and now > deadline:
            running = [
                r.index for p, r in zip(procs, results, strict=True) if p.poll() is None
            ]
            if running:
                echo(
                    "launch: killing worker(s) "
                    f"{', '.join(map(str, running))} (did not exit in time)"
                )
            for proc in procs:
                _kill_group(proc, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.1)
    if lost is None and stop.signum is None:
        lost = _lost(procs, results)
    return lost


def _lost(procs, results) -> Optional[str]:
    # A worker that ended with a failure (not 0, not a checkpointed stop),
    # in words; a death by signal comes before the exit code 1 of a survivor.
    dead = [
        (p.returncode, r)
        for p, r in zip(procs, results, strict=True)
        if p.returncode is not None and p.returncode not in _ENDED
    ]
    if not dead:
        return None
    dead.sort(key=lambda item: (item[0] >= 0, item[1].index))
    code, result = dead[0]
    result.exit_code = code
    return f"worker {result.index} (pid {result.pid}) {result.ending}"


def _last_checkpoint(out: Path) -> str:
    from advtrain.train.checkpoint import CheckpointStore

    latest = CheckpointStore(out / "checkpoints").latest()
    return f"checkpoint {latest.name}" if latest else "the start (no checkpoint yet)"


def _keep_logs(logs: Path, out: Path, keep: bool) -> Optional[Path]:
    # The logs moved into the run folder (if it holds a run), left where
    # they are, or (not `keep`) deleted.
    if not keep:
        shutil.rmtree(logs, ignore_errors=True)
        return None
    if not holds_run(out):
        return logs
    target = out / "launch-logs"
    target.mkdir(exist_ok=True)
    for path in logs.iterdir():
        shutil.move(str(path), target / path.name)
    shutil.rmtree(logs, ignore_errors=True)
    return target


def _report(results: list[WorkerResult], leftovers: list[Path], echo: Echo):
    weights = {r.weights for r in results}
    if None not in weights:
        echo(
            "final weights identical on all workers (BatchNorm moving "
            "statistics aside: they are per worker)"
            if len(weights) == 1
            else "warning: final weights differ between workers"
        )
    if leftovers:
        echo(
            "warning: a worker's temporary folder was not removed: "
            + ", ".join(map(str, leftovers))
        )
    elif any(r.run_folder for r in results[1:]):
        echo(
            f"workers 1-{len(results) - 1} wrote only to temporary folders, now removed"
        )
