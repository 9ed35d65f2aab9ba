"""`advtrain launch` on Keras's JAX backend: two local processes joined by
`keras.distribution.initialize` train one run, each feeding half of every
global batch; only the chief writes the run folder; SIGTERM to the launcher
stops both after one checkpoint at a step they agree on (exit 75), and
launching again resumes from it.

The launches run in fresh interpreters with KERAS_BACKEND=jax (the recipe
says `runtime.backend: jax`), in the JAX tier only: there without
TensorFlow, as a JAX user runs them (the TensorFlow tier's launch group
holds TensorFlow's launches). Every process is bounded in time and killed
in a `finally`.
"""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import kill_everything, processes_of

from advtrain.train.preemption import PREEMPTED_EXIT_CODE

pytestmark = [
    pytest.mark.backend_neutral,
    pytest.mark.skipif(
        importlib.util.find_spec("jax") is None, reason="JAX is not installed"
    ),
]
# The launches themselves: the JAX tier (no TensorFlow) runs them.
jax_tier_only = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is not None,
    reason="TensorFlow is installed (the JAX tier runs this)",
)

# 256 examples / global batch 16: 16 steps per epoch, 2 epochs.
TINY = {
    "name": "launch-jax",
    "data": {"source": "digits", "limit_train": 256, "limit_test": 32},
    "model": {"backbone": "small_cnn", "width": 4},
    "attack": {"method": "fgsm_rs", "eps": 0.1},
    "train": {"epochs": 2, "batch_size": 16},
    "eval": {"attacks": ["pgd"], "pgd_steps": 1, "sanity_examples": 0},
    "runtime": {"backend": "jax", "steps_per_execution": 1},
    "output": {"tensorboard": False, "plots": False, "export_saved_model": False},
}
# Global batch 8: 64 steps per epoch, 3 epochs, so a signal sent when the
# first epoch's checkpoint appears reaches the processes inside training.
LONGER = {
    **TINY,
    "name": "launch-jax-preempted",
    "data": {"source": "digits", "limit_train": 512, "limit_test": 32},
    "train": {"epochs": 3, "batch_size": 8},
}


def write_recipe(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def jax_env() -> dict:
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONUNBUFFERED="1")
    for name in ("TF_CONFIG", "KERAS_DISTRIBUTION_JOB_ADDRESSES"):
        env.pop(name, None)
    return env


def advtrain_command(*args) -> list[str]:
    return [sys.executable, "-m", "advtrain.cli", *map(str, args)]


def test_each_process_feeds_its_share_of_the_global_batch(monkeypatch):
    # `process_share` on a fake cluster of 2: the shares, in process order,
    # are the global batch (a PyDataset and any iterable of batches).
    import jax
    import keras

    from advtrain.backend.jax.distribution import process_share

    x = np.arange(8 * 3, dtype="float32").reshape(8, 3)
    y = np.arange(8)

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, index):
            return x + index, y + index

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    shares = {}
    for index in (0, 1):
        monkeypatch.setattr(jax, "process_index", lambda index=index: index)
        shares[index] = (process_share(Batches()), process_share([(x, y)]))
    for step in (0, 1):
        parts = [shares[i][0][step] for i in (0, 1)]
        assert [len(p[0]) for p in parts] == [4, 4]
        np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x + step)
        np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y + step)
    parts = [next(iter(shares[i][1])) for i in (0, 1)]
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x)


def test_the_cluster_is_named_as_keras_distribution_initialize_reads_it():
    from advtrain.backend.jax.distribution import worker_environments

    envs = worker_environments(["127.0.0.1:1", "127.0.0.1:2"])
    assert envs == [
        {
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": "127.0.0.1:1,127.0.0.1:2",
            "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
            "KERAS_DISTRIBUTION_PROCESS_ID": str(index),
        }
        for index in (0, 1)
    ]


def test_multi_worker_without_a_cluster_is_one_line(monkeypatch):
    from advtrain.backend.jax.distribution import place
    from advtrain.utils.errors import ArgumentError

    monkeypatch.delenv("KERAS_DISTRIBUTION_NUM_PROCESSES", raising=False)
    with pytest.raises(ArgumentError, match="multi_worker on JAX needs a cluster"):
        place("multi_worker", None, False)


def assert_split_and_only_the_chief_writes(text: str, out: Path, batch: int) -> None:
    """A `--debug` launch's output (worker 1's lines prefixed): each process
    says it is one of two and feeds half of the global `batch`, both end on
    the same metrics and weights, and only the chief wrote `out`."""
    assert "worker 0 (chief): exit code 0" in text
    assert "worker 1 (worker): exit code 0" in text
    for prefix, index in (("", 0), ("[worker 1] ", 1)):
        assert (
            f"\n{prefix}runtime: multi_worker strategy "
            "(keras.distribution.DataParallel) on cpu, 2 replica(s) "
            f"(2 workers, this is process {index})"
        ) in text
        assert (
            f"\n{prefix}batch: global {batch} = 2 replica(s) x {batch // 2}, "
            f"{batch // 2} from each of 2 worker processes;"
        ) in text
    # The epochs' metrics are over the global batch: the same in both.
    epochs = [
        re.findall(rf"\n{re.escape(prefix)}epoch \d+/\d+  (accuracy .*) \(", text)
        for prefix in ("", "[worker 1] ")
    ]
    assert epochs[0] and epochs[0] == epochs[1], epochs
    assert "final weights identical on all workers" in text
    # Only the chief wrote the run folder; worker 1 a temporary one, removed.
    chief = re.search(r"\nrun folder: (.*)", text).group(1)
    worker = re.search(r"\n\[worker 1\] run folder: (.*)", text).group(1)
    assert Path(chief) == out and not Path(worker).is_relative_to(out)
    assert not Path(worker).exists()
    assert "workers 1-1 wrote only to temporary folders, now removed" in text
    assert {p.name for p in out.iterdir()} >= {
        "recipe.yaml",
        "model.keras",
        "metrics.json",
        "checkpoints",
    }
    assert json.loads((out / "metrics.json").read_text())["examples"] == 32


@pytest.mark.slow
@pytest.mark.launch
@jax_tier_only
def test_sigterm_to_launch_stops_both_processes_after_one_checkpoint(tmp_path):
    out = tmp_path / "out"
    log = tmp_path / "launch.log"
    recipe = write_recipe(tmp_path, LONGER)
    proc = subprocess.Popen(
        advtrain_command("launch", "--workers", 2, recipe, "-o", out),
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        env=jax_env(),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 400
        while not (out / "checkpoints" / "epoch-0001").exists():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint epoch-0001"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        # The launcher's grace period is 25 s; the processes need far less.
        proc.wait(timeout=40)
        assert processes_of(str(out)) == []
    finally:
        kill_everything(proc, str(out))
    text = log.read_text()
    assert proc.returncode == PREEMPTED_EXIT_CODE, text[-3000:]
    assert "worker 0 (chief): exit code 75" in text
    assert "worker 1 (worker): exit code 75" in text
    assert f"resume with `advtrain launch --workers 2 {out}/recipe.yaml" in text
    # Both processes stopped after the same step, the one the chief wrote.
    named = []
    for path in sorted((out / "launch-logs").glob("worker-*.log")):
        found = re.search(r"checkpoint ((step|epoch)-\d+) written", path.read_text())
        assert found, path.read_text()[-3000:]
        named.append(found.group(1))
    assert len(named) == 2 and named[0] == named[1], named
    assert (out / "checkpoints" / named[0]).is_dir()
    assert "Traceback" not in text

    # The relaunch resumes; there (`--debug` shows worker 1's lines) each
    # process feeds half of each global batch and only the chief writes.
    resumed = subprocess.run(
        advtrain_command(
            "--debug", "launch", "--workers", 2, out / "recipe.yaml", "-o", out
        ),
        env=jax_env(),
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resuming {out} from {named[0]}" in resumed.stdout
    assert_split_and_only_the_chief_writes(resumed.stdout, out, batch=8)
    assert processes_of(str(out)) == []
