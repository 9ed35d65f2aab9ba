"""The runtime on Keras's PyTorch backend: a recipe naming
`runtime.backend: torch` trains on in-memory digits, one step per host
call, and evaluates; the PyTorch tier (scripts/test_torch) runs it in an
environment without TensorFlow or JAX."""

import csv
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from helpers import run_fresh

pytestmark = [
    pytest.mark.backend_neutral,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None, reason="PyTorch is not installed"
    ),
]


def test_recipe_on_torch_trains_and_evaluates_with_keras_backend_unset(tmp_path):
    # KERAS_BACKEND unset: advtrain starts on the first installed backend
    # and, where that is not PyTorch, restarts the run on it.
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "name": "tiny-torch",
                "data": {"source": "digits", "limit_train": 256, "limit_test": 32},
                "model": {"width": 4},
                "attack": {"method": "fgsm_rs", "eps": 0.02},
                "train": {
                    "epochs": 10,
                    "batch_size": 64,
                    "learning_rate": 0.01,
                    "co_guard": True,
                },
                "runtime": {"backend": "torch"},
                "eval": {"attacks": ["pgd"], "pgd_steps": 1, "sanity_examples": 0},
                "output": {"tensorboard": False, "plots": False},
            }
        )
    )
    out = tmp_path / "run"
    sets = [
        "--set",
        "train.co_guard_examples=32",
        "--set",
        "train.co_guard_pgd_steps=1",
    ]
    env = {k: v for k, v in os.environ.items() if not k.endswith("KERAS_BACKEND")}
    env["KERAS_HOME"] = str(tmp_path)  # no keras.json naming another backend
    console = Path(sys.executable).parent / "advtrain"
    done = run_fresh([console, "run", recipe, "--output", out, *sets], tmp_path, **env)
    assert "XLA off, backend torch" in done.stdout, done.stdout[-3000:]
    assert "4 steps/epoch x 10 epochs; 1 step(s) per host call" in done.stdout
    assert yaml.safe_load((out / "recipe.yaml").read_text())["runtime"]["backend"] == (
        "torch"
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["examples"] == 32
    assert 0.0 <= metrics["robust_accuracy"] <= metrics["clean_accuracy"] <= 1.0
    # 81% measured; labels out of step with the images give about 10%.
    assert metrics["clean_accuracy"] >= 0.5, metrics
    guard = metrics["co_guard"]  # the guard's PGD measured every epoch
    assert [row["epoch"] for row in guard["pgd_accuracy"]] == list(range(1, 11))
    with open(out / "history.csv") as rows:
        losses = [float(row["clean_loss"]) for row in csv.DictReader(rows)]
    assert len(losses) == 10 and losses[-1] < losses[0], losses
    assert (out / "model.keras").is_file()
