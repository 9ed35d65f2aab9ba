"""`advtrain launch`: N local workers under MultiWorkerMirroredStrategy.

Each worker is an `advtrain run` process with its own `TF_CONFIG` naming
the same cluster of loopback addresses, so the multi-worker path (collective
all-reduce, data sharding, chief-only writes) can be exercised on one
machine exactly as it runs on several. Worker 0 is the chief: it writes the
run folder; the others write into a temporary folder they remove.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from advtrain.config import RecipeError, load_recipe

Echo = Callable[[str], None]

# After one worker fails, the others would wait forever in a collective.
_GRACE_SECONDS = 15.0


@dataclasses.dataclass
class WorkerResult:
    """How one worker ended and what it reported."""

    index: int
    exit_code: int
    run_folder: Optional[str] = None
    weights: Optional[str] = None
    log_tail: list[str] = dataclasses.field(default_factory=list)


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


def tf_configs(addresses: list[str]) -> list[str]:
    """One TF_CONFIG (JSON) per worker of the cluster `addresses`.

    Example:

    ```python
    tf_configs(["127.0.0.1:2222", "127.0.0.1:2223"])[1]
    # '{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": 1}}'
    ```
    """
    return [
        json.dumps(
            {
                "cluster": {"worker": list(addresses)},
                "task": {"type": "worker", "index": index},
            }
        )
        for index in range(len(addresses))
    ]


def _pump(stream, index: int, result: WorkerResult, echo: Echo) -> None:
    for raw in stream:
        line = raw.rstrip("\n")
        if line.startswith("run folder: "):
            result.run_folder = line[len("run folder: ") :].strip()
        elif line.startswith("weights: sha256 "):
            result.weights = line.split()[-1]
        result.log_tail = (result.log_tail + [line])[-20:]
        if index == 0:
            echo(line)


def launch(
    recipe: str,
    workers: int,
    *,
    overrides: Optional[list[str]] = None,
    output: Optional[Path] = None,
    echo: Echo = print,
    python: str = sys.executable,
    timeout: Optional[float] = None,
) -> list[WorkerResult]:
    """Runs `recipe` on `workers` local processes; returns their results.

    The recipe is validated and the run folder chosen here, once, so every
    worker agrees on it; each worker then runs `advtrain run RECIPE --set
    runtime.strategy=multi_worker --output DIR` with its TF_CONFIG. The
    chief's output is echoed; another worker's last lines are echoed only
    when it fails. When one worker fails the others are stopped after a
    grace period (they would block in a collective).

    Raises:
        RecipeError: bad recipe or override, fewer than 2 workers, or an
            output folder that cannot be used.

    Example:

    ```python
    results = launch("recipe.yaml", 2, output=Path("runs/two"))
    [r.exit_code for r in results]  # [0, 0]
    ```
    """
    if workers < 2:
        raise RecipeError(
            f"--workers: launch needs at least 2 workers. Received: {workers}"
        )
    overrides = list(overrides or []) + ["runtime.strategy=multi_worker"]
    resolved = load_recipe(recipe, overrides)
    out = _run_folder(resolved, output)
    addresses = [f"127.0.0.1:{port}" for port in free_ports(workers)]
    configs = tf_configs(addresses)
    echo(
        f"launch: {workers} workers at {', '.join(addresses)}; worker 0 is "
        f"the chief and writes {out}"
    )
    command = [python, "-m", "advtrain.cli", "run", str(recipe)]
    for item in overrides:
        command += ["--set", item]
    command += ["--output", str(out)]
    scratch = Path(tempfile.mkdtemp(prefix="advtrain-launch-"))
    procs, threads, results = [], [], []
    try:
        for index, config in enumerate(configs):
            env = dict(os.environ)
            env["TF_CONFIG"] = config
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            # Non-chief workers' temporary run folders land here, so the
            # launcher can check they were removed.
            env["TMPDIR"] = str(scratch)
            proc = subprocess.Popen(
                command,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
            )
            result = WorkerResult(index, -1)
            thread = threading.Thread(
                target=_pump,
                args=(proc.stdout, index, result, echo),
                daemon=True,
            )
            thread.start()
            procs.append(proc)
            threads.append(thread)
            results.append(result)
        _wait(procs, timeout)
        for proc, thread, result in zip(procs, threads, results, strict=True):
            thread.join(timeout=10)
            result.exit_code = proc.returncode
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        leftovers = list(scratch.glob("advtrain-worker-*"))
        _remove(scratch)
    for result in results:
        role = "chief" if result.index == 0 else "worker"
        echo(f"worker {result.index} ({role}): exit code {result.exit_code}")
        if result.exit_code != 0 and result.index != 0:
            for line in result.log_tail[-8:]:
                echo(f"  [worker {result.index}] {line}")
    _report(results, leftovers, echo)
    return results


def _run_folder(recipe, output: Optional[Path]) -> Path:
    """The run folder, as `experiment.resolve_output_dir` picks it, chosen
    once for all workers (without importing TensorFlow here)."""
    import datetime

    from advtrain.checkpointing import check_run_dir

    if output is None and recipe.output.dir:
        output = Path(recipe.output.dir)
    if output is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        output = Path("runs") / f"{recipe.name}-{stamp}"
    output = Path(output).resolve()
    check_run_dir(output, recipe)
    return output


def _wait(procs: list[subprocess.Popen], timeout: Optional[float]) -> None:
    start = time.monotonic()
    failed_at = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
            failed_at = now
        expired = timeout is not None and now - start > timeout
        grace_over = failed_at is not None and now - failed_at > _GRACE_SECONDS
        if expired or grace_over:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            return
        time.sleep(0.2)


def _report(results: list[WorkerResult], leftovers: list[Path], echo: Echo):
    if not all(r.exit_code == 0 for r in results):
        return
    weights = {r.weights for r in results}
    if None not in weights:
        same = len(weights) == 1
        echo(
            "final weights identical on all workers (BatchNorm moving "
            "statistics aside: they are per worker)"
            if same
            else "warning: final weights differ between workers"
        )
    others = [r.run_folder for r in results[1:] if r.run_folder]
    if leftovers:
        echo(
            "warning: a worker's temporary folder was not removed: "
            + ", ".join(map(str, leftovers))
        )
    elif others:
        echo(
            f"workers 1-{len(results) - 1} wrote only to temporary folders, now removed"
        )


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
