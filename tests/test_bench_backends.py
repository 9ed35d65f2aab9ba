"""scripts/bench_backends: its tables (medians over rounds, advtrain over
the hand-written step, JAX's throughput over TensorFlow's, a backend
advtrain does not train on shown as such) and one run on tiny sizes, both
backends, on MNIST files made in the IDX format."""

import argparse
import importlib.util
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_backends"


def _bench():
    loader = SourceFileLoader("bench_backends", str(SCRIPT))
    module = importlib.util.module_from_spec(
        importlib.util.spec_from_loader(loader.name, loader)
    )
    loader.exec_module(module)
    return module


def _run(advtrain, hand, evaluate, robust=0.5, note=None):
    ratio = None if advtrain is None else advtrain / hand
    step = dict(advtrain=advtrain, hand=hand, ratio=ratio, note=note)
    return {
        "steps": {"default": step},
        "throughput": {"evaluate AutoAttack": evaluate, "Square, attacks API": 8.0},
        "robust": robust,
    }


def test_tables_take_medians_and_ratios_and_name_what_does_not_run():
    refused = "trains on tensorflow, jax only"
    results = {
        "tensorflow": [_run(10, 10, 4.0), _run(33, 30, 6.0), _run(22, 20, 5.0)],
        "jax": [_run(6.0, 5.0, 4.0, 0.25)],
        "torch": [_run(None, 50.0, None, None, refused)],
    }
    bench = _bench()
    steps = bench.step_table(results).splitlines()
    assert steps[2] == "| default | TensorFlow | 22.0 | 20.0 | 1.10 |"
    assert steps[3] == "| default | JAX | 6.0 | 5.0 | 1.20 |"
    assert steps[4] == f"| default | PyTorch | {refused} | 50.0 | n/a |"
    args = argparse.Namespace(images=20, quick=True)
    lines = bench.throughput_table(results, args).splitlines()
    assert lines[0] == "| row | TensorFlow | JAX | PyTorch | JAX / TF |"
    assert lines[2] == (
        "| evaluate AutoAttack | 5.0 | 4.0 | not on this backend | 0.80 |"
    )
    assert lines[3] == "| Square, attacks API | 8.0 | 8.0 | 8.0 | 1.00 |"
    assert lines[-1].endswith("TensorFlow 50.0%, JAX 25.0%")


def _idx(path: Path, array: np.ndarray) -> None:
    head = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    path.write_bytes(head + array.astype(np.uint8).tobytes())


@pytest.mark.slow
def test_one_run_on_tiny_sizes_times_both_steps_on_both_backends(tmp_path):
    rng = np.random.default_rng(0)
    for split, count in (("train", 32), ("t10k", 4)):
        _idx(
            tmp_path / f"{split}-images-idx3-ubyte",
            rng.integers(0, 256, (count, 28, 28)),
        )
        _idx(tmp_path / f"{split}-labels-idx1-ubyte", rng.integers(0, 10, (count,)))
    python = sys.executable  # holds TensorFlow and JAX
    done = subprocess.run(
        [
            python,
            str(SCRIPT),
            "--quick",
            "--data",
            str(tmp_path),
            "--batch",
            "8",
            "--steps",
            "3",
            "--timed",
            "1",
            "--images",
            "4",
            "--backends",
            "tensorflow,jax",
            "--tensorflow-python",
            python,
            "--jax-python",
            python,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    for step in ("default", "mnist_fast"):
        for backend in ("TensorFlow", "JAX"):
            row = next(
                line.split(" | ")
                for line in out.splitlines()
                if line.startswith(f"| {step} | {backend} |")
            )
            advtrain, hand, ratio = (float(cell.strip(" |")) for cell in row[2:5])
            assert advtrain > 0 and hand > 0 and ratio > 0
    evaluate = next(line for line in out.splitlines() if "evaluate AutoAttack" in line)
    # evaluate ran on both backends: images/s on each, and JAX's over TF's.
    tf_rate, jax_rate, ratio = (float(c) for c in evaluate.strip("|").split("|")[1:])
    assert tf_rate > 0 and jax_rate > 0 and ratio > 0, out
