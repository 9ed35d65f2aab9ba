"""scripts/gpu_check --smoke: the prepared GPU check runs end to end on
this CPU under JAX, in a fresh interpreter, as it will on a GPU machine
without TensorFlow. The smoke sizes use the small_cnn backbone in place of
ResNet50 (ResNet50's four compilations alone take minutes on 2 cores)."""

import json
import sys
from pathlib import Path

import keras
import pytest
from helpers import run_fresh

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.backend_neutral,
    # The script runs on JAX in its own process; the JAX tier runs it once.
    pytest.mark.skipif(
        keras.backend.backend() != "jax", reason="runs in the JAX tier only"
    ),
]


def test_gpu_check_smoke_runs_on_jax(tmp_path):
    out = tmp_path / "check.json"
    done = run_fresh(
        [sys.executable, ROOT / "scripts" / "gpu_check", "--smoke",
         "--backbone", "small_cnn", "--out", out],
        ROOT,
        KERAS_BACKEND="jax",
    )  # fmt: skip
    report = json.loads(out.read_text())
    rows = {row["row"]: row for row in report["resnet"]["rows"]}
    assert list(rows) == ["clean", "fgsm", "fgsm_rs", "trades"]
    assert [round(r["ceiling"], 2) for r in rows.values()] == [1.0, 0.5, 0.5, 0.23]
    assert rows["clean"]["ratio"] == 1.0
    # XLA's count: an adversarial step does more work than a clean one,
    # TRADES's PGD-2 more than one FGSM pass.
    flops = [r["flops"] for r in rows.values()]
    assert 0 < flops[0] < flops[1] < flops[3], flops
    assert [r["flop_ceiling"] for r in rows.values()] == [flops[0] / f for f in flops]
    assert all(r["images_per_s"] > 0 and r["mfu_matmul"] > 0 for r in rows.values())
    assert report["resnet"]["peak_flops"] is None  # a CPU has no bf16 peak here
    assert report["mnist_fast"]["train_seconds"] > 0
    attack = report["autoattack"]
    assert attack["examples"] == 20
    assert attack["robust_accuracy"] <= attack["clean_accuracy"]
    assert "| (b) AdversarialModel FGSM 50/50" in done.stdout
    assert report["table"] in done.stdout
