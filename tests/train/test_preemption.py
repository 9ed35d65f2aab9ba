"""Faults a cluster delivers (issue 16): preemption, lost workers, orphans.

SIGTERM to `advtrain run` mid-epoch checkpoints the step and exits 75, and
the resumed run ends bitwise where an uninterrupted one does; SIGTERM to
`advtrain launch` stops every worker after a checkpoint at a step they
agree on, and the relaunch resumes there, splits the global batch across
the two processes and leaves only the chief's files; a worker killed
under `--max-restarts 1` is named and the run completes; no process of a
run outlives its launcher.

Every process runs on loopback, is bounded in time and is killed in a
`finally`.
"""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import kill_everything, processes_of
from typer.testing import CliRunner

from advtrain.cli.commands import app
from advtrain.cli.launch import WorkerResult, exit_code
from advtrain.train.preemption import PREEMPTED_EXIT_CODE

runner = CliRunner()

# 512 examples / batch 16: 32 one-step host calls per epoch, 2 epochs; a
# signal after the first epoch's checkpoint lands inside the second.
SINGLE = {
    "name": "preemption",
    "data": {"source": "digits", "limit_train": 512, "limit_test": 32},
    "model": {"backbone": "small_cnn", "width": 4},
    "attack": {"method": "fgsm_rs", "eps": 0.1},
    "train": {"epochs": 2, "batch_size": 16},
    "eval": {"attacks": ["pgd"], "pgd_steps": 1, "sanity_examples": 0},
    "runtime": {"deterministic": True, "steps_per_execution": 1},
    "output": {"tensorboard": False, "plots": False, "export_saved_model": False},
}
# Two workers, global batch 8: 64 steps per epoch, 3 epochs, so a signal
# sent when the first epoch's checkpoint appears reaches the workers inside
# training (an epoch of 16 steps could end first: seen in CI).
MULTI = {
    **SINGLE,
    "name": "preemption-mw",
    "train": {"epochs": 3, "batch_size": 8},
}


def write_recipe(tmp_path, data) -> Path:
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def start(args, log: Path) -> subprocess.Popen:
    """`advtrain ARGS` from a fresh interpreter, in its own process group."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    return subprocess.Popen(
        [sys.executable, "-m", "advtrain.cli", *map(str, args)],
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def wait_for(path: Path, proc: subprocess.Popen, log: Path, seconds=300) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {path} after {seconds} s"
        time.sleep(0.02)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return pid not in processes_of("advtrain")  # a zombie is gone too


def weights(path: Path) -> list[np.ndarray]:
    from advtrain.recipe.saved import load_classifier

    return load_classifier(path).get_weights()


# ---------------------------------------------------------------- one process


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    out = tmp / "out"
    result = runner.invoke(app, ["run", str(write_recipe(tmp, SINGLE)), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_sigterm_mid_epoch_checkpoints_exits_75_and_resumes_exactly(
    tmp_path, uninterrupted
):
    out = tmp_path / "out"
    log = tmp_path / "run.log"
    proc = start(["run", write_recipe(tmp_path, SINGLE), "-o", out], log)
    try:
        wait_for(out / "checkpoints" / "epoch-0001", proc, log)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        kill_everything(proc, str(out))
    text = log.read_text()
    assert proc.returncode == PREEMPTED_EXIT_CODE, text[-3000:]
    last = text.strip().splitlines()[-1]
    match = re.fullmatch(
        r"preempted by SIGTERM after the current step: checkpoint "
        r"(step-\d{8}) written; resume with `advtrain resume (.+)`",
        last,
    )
    assert match, last
    assert Path(match.group(2)) == out
    state = (out / "checkpoints" / match.group(1) / "state.json").read_text()
    assert '"epoch": 1' in state  # inside the second epoch
    assert not (out / "metrics.json").exists()
    assert "Traceback" not in text

    result = runner.invoke(app, ["resume", str(out)])
    assert result.exit_code == 0, result.output
    assert f"from {match.group(1)}: epoch 2, after step" in result.output
    for a, b in zip(
        weights(uninterrupted / "model.keras"),
        weights(out / "model.keras"),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    history = (out / "history.csv").read_bytes()
    assert history == (uninterrupted / "history.csv").read_bytes()


def test_exit_code_of_a_launch():
    def results(*codes):
        return [WorkerResult(i, code) for i, code in enumerate(codes)]

    assert exit_code(results(0, 0)) == 0
    assert exit_code(results(75, 75)) == 75
    assert exit_code(results(75, -9)) == 1
    assert exit_code(results(1, -9)) == 1
    # A collapsed run finished: named, passed through, not a failure.
    assert exit_code(results(3, 3)) == 3
    assert exit_code(results(3, 1)) == 1
    assert exit_code(results(3, 75)) == 75
    assert "catastrophic overfitting" in WorkerResult(0, 3).ending
    # So does one whose evaluation is unreliable: a restart would not mend it.
    assert exit_code(results(4, 4)) == 4
    assert exit_code(results(0, 4)) == 4
    assert exit_code(results(4, 1)) == 1
    assert "evaluation unreliable" in WorkerResult(0, 4).ending
    assert WorkerResult(1, -9).ending == "killed by SIGKILL"


ORPHAN = textwrap.dedent("""
    import os, subprocess, sys, time
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import time; from advtrain.train.preemption import watch_launcher; "
         "watch_launcher(); open(sys.argv[1], 'w').close(); time.sleep(600)"
         .replace("sys.argv[1]", repr(sys.argv[1]))],
        env=dict(os.environ, ADVTRAIN_LAUNCHER_PID=str(os.getpid())),
    )
    print(child.pid, flush=True)
    time.sleep(600)
""")


def test_a_worker_ends_when_its_launcher_is_killed(tmp_path):
    ready = tmp_path / "ready"
    parent = subprocess.Popen(
        [sys.executable, "-c", ORPHAN, str(ready)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    child = None
    try:
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while not gone(child):
            assert time.monotonic() < deadline, "the worker outlived its launcher"
            time.sleep(0.1)
    finally:
        parent.kill()
        parent.wait()
        if child is not None and not gone(child):
            os.kill(child, signal.SIGKILL)


# ---------------------------------------------------------------- launch


def worker_pids(log: Path) -> list[int]:
    match = re.search(r"\(pids (\d+), (\d+)\)", log.read_text())
    assert match, log.read_text()[-3000:]
    return [int(match.group(1)), int(match.group(2))]


@pytest.mark.slow
@pytest.mark.launch
def test_sigterm_to_launch_stops_all_workers_after_one_checkpoint(tmp_path):
    out = tmp_path / "out"
    log = tmp_path / "launch.log"
    recipe = write_recipe(tmp_path, MULTI)
    proc = start(["launch", "--workers", "2", recipe, "-o", out], log)
    try:
        wait_for(out / "checkpoints" / "epoch-0001", proc, log)
        pids = worker_pids(log)
        proc.send_signal(signal.SIGTERM)
        # The launcher's grace period is 25 s; they need far less.
        proc.wait(timeout=40)
        assert all(gone(pid) for pid in pids)
        assert processes_of(str(out)) == []
    finally:
        kill_everything(proc, str(out))
    text = log.read_text()
    assert proc.returncode == PREEMPTED_EXIT_CODE, text[-3000:]
    assert "worker 1 (worker): exit code 75" in text
    assert f"resume with `advtrain launch --workers 2 {out}/recipe.yaml" in text
    # Both workers checkpointed the same step, the one the chief wrote (a
    # step the workers agreed on, or the end of an epoch when the agreed
    # step is an epoch's last).
    named = []
    for path in sorted((out / "launch-logs").glob("worker-*.log")):
        found = re.search(r"checkpoint ((step|epoch)-\d+) written", path.read_text())
        assert found, path.read_text()[-3000:]
        named.append(found.group(1))
    assert len(named) == 2 and named[0] == named[1], named
    assert (out / "checkpoints" / named[0]).is_dir()
    assert "Traceback" not in text and "E0000" not in text

    resumed = subprocess.run(
        [sys.executable, "-m", "advtrain.cli", "launch", "--workers", "2"]
        + [str(out / "recipe.yaml"), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    text = resumed.stdout
    assert resumed.returncode == 0, text[-3000:] + resumed.stderr[-3000:]
    assert f"resuming {out} from {named[0]}" in text
    # The launch itself, from a fresh interpreter as users run it: both
    # workers finish, the global batch is split across the two processes,
    # the weights agree, and only the chief wrote the run folder.
    assert "worker 0 (chief): exit code 0" in text
    assert "worker 1 (worker): exit code 0" in text
    assert "multi_worker strategy on cpu, 2 replica(s) (2 workers" in text
    assert (
        "batch: global 8 = 2 replica(s) x 4, 4 from each of 2 worker "
        "processes; 64 steps/epoch x 3 epochs"
    ) in text
    assert "final weights identical on all workers (BatchNorm" in text
    assert "workers 1-1 wrote only to temporary folders, now removed" in text
    for name in ("recipe.yaml", "model.keras", "metrics.json", "history.csv"):
        assert (out / name).is_file(), name
    saved = yaml.safe_load((out / "recipe.yaml").read_text())
    assert saved["runtime"]["strategy"] == "multi_worker"
    assert processes_of(str(out)) == []


@pytest.mark.slow
@pytest.mark.launch
def test_lost_worker_is_named_and_the_run_restarts_from_the_checkpoint(tmp_path):
    out = tmp_path / "out"
    log = tmp_path / "launch.log"
    recipe = write_recipe(tmp_path, MULTI)
    proc = start(
        ["launch", "--workers", "2", recipe, "-o", out, "--max-restarts", "1"], log
    )
    try:
        wait_for(out / "checkpoints" / "epoch-0001", proc, log)
        chief, worker = worker_pids(log)
        os.kill(worker, signal.SIGKILL)
        proc.wait(timeout=600)
        assert processes_of(str(out)) == []
    finally:
        kill_everything(proc, str(out))
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert (
        f"launch: worker 1 (pid {worker}) killed by SIGKILL; restart 1/1: "
        "relaunching 2 workers from checkpoint epoch-000" in text
    )
    assert "launch: finished after 1 restart(s)" in text
    assert "final weights identical on all workers" in text
    assert (out / "metrics.json").is_file()
    assert "E0000" not in text and "Traceback" not in text
