"""The runtime on Keras's JAX backend: `keras.distribution.DataParallel`
over two CPU devices trains as one device does; a recipe chooses its
backend, and a `KERAS_BACKEND` that disagrees is one line, exit 2.

JAX's device count is fixed when it starts, so each configuration runs in
a fresh interpreter (`XLA_FLAGS=--xla_force_host_platform_device_count=N`).
"""

import importlib.util
import itertools
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.backend_neutral,
    pytest.mark.skipif(
        importlib.util.find_spec("jax") is None, reason="JAX is not installed"
    ),
]

# Four steps of a global batch of 32 with three training steps (FGSM, fused
# FGSM, PGD without random start), two steps per host call, on numpy
# arrays: the weights and epoch metrics, on how many devices the first
# weight lives and over how many the batches are sharded; and `advtrain.fit`
# (PGD) on the same arrays (tf.data input with TensorFlow, numpy without).
REPLICAS = """
import importlib.util
import sys
import keras
import numpy as np
from advtrain.attacks import Attack
from advtrain.models.adversarial import AdversarialModel
from advtrain.train.runtime import make_runtime
from helpers import dense_classifier

runtime = make_runtime(strategy="auto", steps_per_execution=2)
rng = np.random.default_rng(0)
x = rng.random((128, 8, 8, 1), dtype=np.float32)
y = rng.integers(0, 10, 128)
cases = {
    "fgsm": (Attack("fgsm", eps=0.1), False),
    "fused": (Attack("fgsm", eps=0.1), True),
    "pgd": (Attack("pgd", eps=0.1, steps=2, random_start=False), False),
}
arrays = {"replicas": runtime.replicas}
for name, (attack, fused) in cases.items():
    with runtime.scope():
        classifier = dense_classifier(seed=0)
        model = AdversarialModel(classifier, attack, 0.5, seed=0,
                                 reuse_gradient=fused)
        model.compile(
            optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=2,
            jit_compile=runtime.jit_compile,
        )
    # What Keras's JAX trainer shards each batch with, at fit time.
    spread = keras.distribution.distribution()
    arrays[f"{name}/shards"] = 1 if spread is None else len(spread.device_mesh.devices)
    history = model.fit(x, y, batch_size=32, epochs=1, verbose=0,
                        shuffle=False).history
    trained = classifier.weights[0].value
    arrays[f"{name}/devices"] = len(trained.sharding.device_set)
    for i, w in enumerate(classifier.get_weights()):
        arrays[f"{name}/w{i}"] = w
    for key, values in history.items():
        arrays[f"{name}/metric/{key}"] = np.array(values[-1])
import advtrain

pgd = {"method": "pgd", "eps": 0.1, "steps": 2, "random_start": False}
result = advtrain.fit(
    lambda: dense_classifier(seed=0), (x, y), attack=pgd, batch_size=32,
    train={"shuffle": False, "optimizer": "sgd", "learning_rate": 0.1},
    runtime=runtime,
    echo=None,
)
for i, w in enumerate(result.model.classifier.get_weights()):
    arrays[f"fit/w{i}"] = w
np.savez(sys.argv[1], **arrays)
"""


def _on_devices(tmp_path: Path, devices: int) -> subprocess.Popen:
    import os

    env = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "PYTHONPATH": str(ROOT / "tests"),
        "OMP_NUM_THREADS": "1",
    }
    out = tmp_path / f"{devices}.npz"
    return subprocess.Popen(
        [sys.executable, "-c", REPLICAS, str(out)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_two_jax_devices_match_one_device(tmp_path):
    procs = {n: _on_devices(tmp_path, n) for n in (1, 2)}
    for n, proc in procs.items():
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{n} device(s):\n{output[-3000:]}"
    one, two = (np.load(tmp_path / f"{n}.npz") for n in (1, 2))
    assert (int(one["replicas"]), int(two["replicas"])) == (1, 2)
    for name in ("fgsm", "fused", "pgd"):  # replicated, batches sharded
        for key in (f"{name}/devices", f"{name}/shards"):
            assert (int(one[key]), int(two[key])) == (1, 2), key
    weights = [k for k in one.files if "/w" in k]
    metrics = [k for k in one.files if "/metric/" in k]
    assert sorted(one.files) == sorted(two.files)
    assert len(weights) == 16 and metrics  # 3 steps and fit, 4 weights each
    for key in weights + metrics:
        np.testing.assert_allclose(two[key], one[key], atol=1e-5, err_msg=key)


def _tiny_recipe(folder: Path, backend: str) -> Path:
    recipe = folder / "tiny.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "name": "tiny-jax",
                "data": {"source": "digits", "limit_train": 256, "limit_test": 32},
                "model": {"width": 4},
                "attack": {"method": "fgsm_rs", "eps": 0.1},
                "train": {"epochs": 1, "batch_size": 64},
                "runtime": {"backend": backend},
                "eval": {"attacks": ["pgd"], "pgd_steps": 1, "sanity_examples": 0},
                "output": {"tensorboard": False, "plots": False},
            }
        )
    )
    return recipe


def test_keras_backend_disagreeing_with_the_recipe_is_one_line(tmp_path, monkeypatch):
    # The user's KERAS_BACKEND names the backend this process runs on; the
    # recipe asks for the other one: a restart would contradict the user.
    from typer.testing import CliRunner

    from advtrain import backend
    from advtrain.cli.commands import app

    running = keras.backend.backend()
    wanted = "jax" if running == "tensorflow" else "tensorflow"
    monkeypatch.setattr(backend, "NAMED", running)
    recipe = _tiny_recipe(tmp_path, wanted)
    result = CliRunner().invoke(app, ["show", str(recipe)])
    assert result.exit_code == 2, result.output[-2000:]
    assert result.output.strip().splitlines() == [
        f"error: {recipe}: runtime.backend: the recipe runs on {wanted} but "
        f"KERAS_BACKEND={running}; unset KERAS_BACKEND or make the two agree. "
        f"Received: runtime.backend={wanted}, KERAS_BACKEND={running}"
    ]


@pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="a restart needs TensorFlow beside JAX; without it the JAX tier "
    "trains a recipe in test_recipe_without_tensorflow_trains_and_evaluates",
)
def test_recipe_restarts_on_jax_trains_and_saves(tmp_path):
    # KERAS_BACKEND unset: the command starts on Keras's default
    # (TensorFlow) and runs the recipe on its JAX, evaluation too.
    import json
    import os

    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env.pop("PYTHONPATH", None)
    out = tmp_path / "run"
    recipe = _tiny_recipe(tmp_path, "jax")
    done = subprocess.run(
        [_console(), "run", str(recipe), "--output", str(out)],
        cwd=tmp_path,
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    text = done.stdout + done.stderr
    runtime = (
        "runtime: default strategy on cpu, 1 replica(s), float32, XLA on, backend jax"
    )
    assert runtime in done.stdout, text[-3000:]
    assert "batch: global 64 = 1 replica(s) x 64; 4 steps/epoch" in done.stdout
    assert "epoch 1/1" in done.stdout, text[-3000:]
    history = (out / "history.csv").read_text().splitlines()
    assert len(history) == 2 and "adv_loss" in history[0]
    saved = yaml.safe_load((out / "recipe.yaml").read_text())
    assert saved["runtime"]["backend"] == "jax"
    assert (out / "model.keras").is_file()
    assert done.returncode == 0, text[-3000:]
    assert json.loads((out / "metrics.json").read_text())["examples"] == 32


@pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is not None,
    reason="TensorFlow is installed (the JAX tier runs this)",
)
def test_recipe_without_tensorflow_trains_and_evaluates(tmp_path):
    # Keras on JAX alone: the digits are numpy arrays batched by
    # advtrain.data.batches, through training and the evaluation.
    import csv
    import json

    from helpers import run_console

    out = tmp_path / "run"
    recipe = _tiny_recipe(tmp_path, "jax")
    sets = ["--set", "train.epochs=10", "--set", "attack.eps=0.02"]
    # The catastrophic-overfitting guard's batch comes from the numpy input.
    sets += ["--set", "train.co_guard=true", "--set", "train.co_guard_examples=32"]
    sets += ["--set", "train.co_guard_pgd_steps=1"]
    run_console(tmp_path, "run", recipe, "--output", out, *sets, KERAS_BACKEND="jax")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["examples"] == 32
    assert 0.0 <= metrics["robust_accuracy"] <= metrics["clean_accuracy"] <= 1.0
    # 47% measured (seed 0); labels out of step with the images give 16%.
    assert metrics["clean_accuracy"] >= 0.3, metrics
    guard = metrics["co_guard"]  # measured every epoch, PGD accuracy rising
    assert [row["epoch"] for row in guard["pgd_accuracy"]] == list(range(1, 11))
    assert guard["best_accuracy"] > guard["pgd_accuracy"][0]["accuracy"], guard
    with open(out / "history.csv") as rows:
        losses = [float(row["clean_loss"]) for row in csv.DictReader(rows)]
    assert len(losses) == 10 and losses[-1] < losses[0], losses


@pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is not None,
    reason="TensorFlow is installed (the JAX tier runs this)",
)
def test_tensorflow_only_source_says_what_to_install(tmp_path):
    from advtrain.data import DataError, load_splits

    with pytest.raises(DataError) as info:
        load_splits("tfds", tfds_name="cifar10")
    assert str(info.value).splitlines() == [
        "data source tfds needs TensorFlow (tf.data), which is not installed: "
        'pip install "advtrain[tensorflow]". Received: source=tfds'
    ]


def _console() -> str:
    return str(Path(sys.executable).parent / "advtrain")


@pytest.mark.backend_neutral
def test_fit_array_stream_repeats_whole_batches_in_order():
    """Unshuffled arrays: every epoch is the same whole batches (the last
    partial one dropped, as the plan counts steps), with or without
    TensorFlow."""
    from advtrain.train.fitting import _training_data

    x = np.arange(100, dtype=np.float32).reshape(100, 1, 1, 1) / 100
    y = np.arange(100) % 10
    stream, size, batch = _training_data((x, y), 32, False, 0)
    assert (size, batch) == (100, 32)
    batches = itertools.islice(iter(stream(0)), 6)
    firsts = [np.asarray(b[0])[:, 0, 0, 0] for b in batches]
    assert [len(f) for f in firsts] == [32] * 6
    np.testing.assert_array_equal(firsts[3], firsts[0])  # epoch 2 restarts
    np.testing.assert_array_equal(
        np.asarray(next(iter(stream(4)))[0]), np.asarray(firsts[1])[:, None, None, None]
    )
