"""Never lose a run, never accept bad input silently (issue #6).

Crash and resume (SIGKILL mid-epoch, then `advtrain resume`; an epoch
boundary, then `advtrain run` on the same folder), atomic checkpoint
writes, the NaN guard, refusing another recipe's folder, safe loading.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml
from typer.testing import CliRunner

from advtrain.cli.commands import app
from advtrain.train.callbacks import AtomicCheckpoint
from advtrain.train.checkpoint import (
    CheckpointStore,
    find_resume_point,
    load_checkpoint,
    restore_variables,
    truncate_history,
    writable_dir,
)

runner = CliRunner()

# 128 examples / batch 32: 4 steps per epoch, 3 epochs; host calls of 2
# steps and a step checkpoint period of 3 put step checkpoints at global
# steps 6 (epoch 2, step 2) and 10 (epoch 3, step 2); epoch checkpoints at
# 4, 8 and 12.
TINY = {
    "name": "reliability",
    "data": {"source": "digits", "limit_train": 128, "limit_test": 32},
    "model": {"backbone": "small_cnn", "width": 4},
    "attack": {"method": "fgsm_rs", "eps": 0.1},
    "train": {"epochs": 3, "batch_size": 32},
    "eval": {"attacks": ["pgd"], "pgd_steps": 1},
    "runtime": {"deterministic": True, "steps_per_execution": 2},
    "output": {
        "tensorboard": False,
        "plots": False,
        "export_saved_model": False,
        "checkpoint_every_steps": 3,
    },
}


def write_recipe(tmp_path, data=None, name="recipe.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data or TINY))
    return path


def max_weight_difference(a, b) -> float:
    from advtrain.recipe.saved import load_classifier

    wa = load_classifier(a).get_weights()
    wb = load_classifier(b).get_weights()
    assert len(wa) == len(wb)
    return max(float(np.max(np.abs(x - y))) for x, y in zip(wa, wb, strict=True))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of TINY."""
    tmp = tmp_path_factory.mktemp("reference")
    out = tmp / "out"
    result = runner.invoke(app, ["run", str(write_recipe(tmp)), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


# ---------------------------------------------------------------- resume


def test_sigkill_mid_epoch_then_resume_matches_uninterrupted(tmp_path, reference):
    recipe = write_recipe(tmp_path)
    out = tmp_path / "killed"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    log = open(tmp_path / "killed.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "advtrain.cli",
            "run",
            str(recipe),
            "-o",
            str(out),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    target = out / "checkpoints" / "step-00000006"
    deadline = time.monotonic() + 600
    while not target.is_dir():
        assert proc.poll() is None, (tmp_path / "killed.log").read_text()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    log.close()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "metrics.json").exists()
    # The kill may land a moment after the target; dropping any newer
    # checkpoint gives the state of a kill right after it was written.
    for path in (out / "checkpoints").iterdir():
        if (
            path.is_dir()
            and path.name > "step-00000006"
            and path.name.startswith("step")
        ):
            shutil.rmtree(path)
    shutil.rmtree(out / "checkpoints" / "epoch-0002", ignore_errors=True)
    shutil.rmtree(out / "checkpoints" / "epoch-0003", ignore_errors=True)

    result = runner.invoke(app, ["resume", str(out)])
    assert result.exit_code == 0, result.output
    assert "from step-00000006: epoch 2, after step 2/4" in result.output

    difference = max_weight_difference(reference / "model.keras", out / "model.keras")
    print(f"max abs weight difference after SIGKILL + resume: {difference}")
    assert difference == 0.0
    history = (out / "history.csv").read_bytes()
    assert history == (reference / "history.csv").read_bytes()
    # Optimizer slots and iterations, BN statistics, the attack's RNG state
    # and the epoch metrics match too: the last checkpoints are identical.
    mine = load_checkpoint(out / "checkpoints" / "epoch-0003").arrays()
    theirs = load_checkpoint(reference / "checkpoints" / "epoch-0003").arrays()
    assert mine.keys() == theirs.keys()
    for key in mine:
        np.testing.assert_array_equal(mine[key], theirs[key], err_msg=key)


def test_same_recipe_on_same_folder_resumes_at_epoch_boundary(tmp_path, reference):
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    for name in os.listdir(out):
        if name not in ("recipe.yaml", "history.csv", "checkpoints"):
            path = out / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for name in ("epoch-0003", "step-00000010"):
        shutil.rmtree(out / "checkpoints" / name, ignore_errors=True)
    result = runner.invoke(
        app, ["run", str(write_recipe(tmp_path)), "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "from epoch-0002: epoch 3, after step 0/4" in result.output
    assert "epoch 1/3" not in result.output
    assert max_weight_difference(reference / "model.keras", out / "model.keras") == 0.0
    history = (out / "history.csv").read_bytes()
    assert history == (reference / "history.csv").read_bytes()


def test_different_recipe_is_refused_naming_the_keys(tmp_path, reference):
    before = {p.name: p.stat().st_mtime_ns for p in reference.iterdir()}
    result = runner.invoke(
        app,
        [
            "run",
            str(write_recipe(tmp_path)),
            "-o",
            str(reference),
            "--set",
            "train.epochs=4",
            "--set",
            "attack.eps=0.2",
        ],
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    assert "different recipe" in lines[0]
    assert "attack.eps: 0.1 -> 0.2" in lines[0]
    assert "train.epochs: 3 -> 4" in lines[0]
    assert {p.name: p.stat().st_mtime_ns for p in reference.iterdir()} == before


def test_finished_run_is_neither_resumed_nor_overwritten(reference):
    before = (reference / "metrics.json").read_bytes()
    result = runner.invoke(app, ["resume", str(reference)])
    assert result.exit_code == 2
    assert "finished" in result.output
    assert (reference / "metrics.json").read_bytes() == before


# ---------------------------------------------------------------- NaN guard


def test_nan_loss_stops_at_that_step_and_keeps_the_last_good_checkpoint(
    tmp_path, monkeypatch
):
    from advtrain.models.adversarial import AdversarialModel

    original = AdversarialModel.adversarial_loss

    def poisoned(self, *args):
        loss = original(self, *args)
        # From the 6th step (epoch 2, step 2) on, the loss is NaN.
        return tf.where(self.optimizer.iterations >= 5, float("nan"), loss)

    monkeypatch.setattr(AdversarialModel, "adversarial_loss", poisoned)
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(write_recipe(tmp_path)), "-o", str(out)])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    assert "loss became nan at epoch 2, step 2 (global step 6)" in lines[0]
    assert "epoch-0001" in lines[0]
    assert "learning rate" in lines[0] and "eps" in lines[0]
    assert "Traceback" not in result.output
    # Nothing written from the NaN weights; the good checkpoint loads.
    assert not (out / "model.keras").exists()
    assert not (out / "metrics.json").exists()
    names = sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_dir())
    assert names == ["epoch-0001"]
    arrays = load_checkpoint(out / "checkpoints" / "epoch-0001").arrays()
    assert all(np.isfinite(a).all() for a in arrays.values() if a.dtype.kind == "f")


# ---------------------------------------------------------------- atomicity


def small_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(
        optimizer=keras.optimizers.Adam(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    x = np.random.default_rng(seed).random((8, 4)).astype("float32")
    model.fit(x, np.arange(8) % 3, epochs=1, verbose=0)
    return model, x


def test_crash_between_write_and_rename_keeps_the_previous_checkpoint(
    tmp_path, monkeypatch
):
    import advtrain.train.checkpoint as checkpointing

    model, x = small_model()
    store = CheckpointStore(tmp_path / "checkpoints", keep=3)
    first = store.save(
        model, kind="epoch", epoch=1, step=0, global_step=4, phase="train"
    )
    saved = [w.copy() for w in model.get_weights()]
    model.fit(x, np.arange(8) % 3, epochs=1, verbose=0)

    def crash(*args, **kwargs):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(checkpointing.os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        store.save(model, kind="epoch", epoch=2, step=0, global_step=8, phase="train")
    monkeypatch.undo()
    # A SIGKILL would also have skipped the cleanup: leave a half-written
    # temporary checkpoint behind as it would.
    leftover = tmp_path / "checkpoints" / ".tmp-999-epoch-0002"
    leftover.mkdir()
    (leftover / "variables.npz").write_bytes(b"PK\x03\x04 truncated")
    assert [p.name for p in store.paths()] == [first.name]

    point = find_resume_point(tmp_path / "checkpoints")
    assert point is not None and point.path == first
    fresh, _ = small_model(seed=1)
    restore_variables(fresh, point, "model")
    for got, want in zip(fresh.get_weights(), saved, strict=True):
        np.testing.assert_array_equal(got, want)
    assert store.remove_temporaries() == [leftover]


def test_final_model_write_is_atomic(tmp_path, monkeypatch):
    import advtrain.utils.io as io

    model, x = small_model()
    target = tmp_path / "model.keras"
    with io.atomic_path(target) as tmp:
        model.save(tmp)
    before = target.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(io.os, "replace", crash)
    with pytest.raises(OSError):
        with io.atomic_path(target) as tmp:
            keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]).save(tmp)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.keras"]


def test_unreadable_newest_checkpoint_falls_back_with_a_warning(tmp_path):
    model, _ = small_model()
    store = CheckpointStore(tmp_path, keep=5)
    first = store.save(
        model, kind="step", epoch=0, step=1, global_step=1, phase="train"
    )
    second = store.save(
        model, kind="step", epoch=0, step=2, global_step=2, phase="train"
    )
    third = store.save(
        model, kind="step", epoch=0, step=3, global_step=3, phase="train"
    )
    data = (third / "variables.npz").read_bytes()
    (third / "variables.npz").write_bytes(data[: len(data) // 2])
    (second / "state.json").write_text("{not json")
    warnings = []
    point = find_resume_point(tmp_path, echo=warnings.append)
    assert point.path == first
    assert len(warnings) == 2
    assert all(w.startswith("warning: skipping checkpoint") for w in warnings)
    # A flipped byte that still unzips is caught by the recorded hash.
    state = json.loads((first / "state.json").read_text())
    state["variables_sha256"] = "0" * 64
    (first / "state.json").write_text(json.dumps(state))
    assert find_resume_point(tmp_path, echo=warnings.append) is None


def test_keeps_last_k_plus_the_best_and_step_checkpoint_spacing(tmp_path):
    model, _ = small_model()
    store = CheckpointStore(tmp_path, keep=2, monitor="adv_accuracy", mode="max")
    callback = AtomicCheckpoint(store, steps_per_epoch=6, epochs=5, every_steps=4)
    callback.set_model(model)
    for epoch, value in enumerate([0.1, 0.9, 0.3, 0.4, 0.5]):
        callback.on_epoch_begin(epoch)
        for batch in (1, 3, 5):  # host calls of 2 steps
            callback.on_train_batch_end(batch, {"loss": 1.0})
        callback.on_epoch_end(epoch, {"adv_accuracy": value})
    names = [p.name for p in store.paths()]
    assert names == ["epoch-0002", "step-00000028", "epoch-0005"]
    assert store.best()["checkpoint"] == "epoch-0002"
    assert store.best()["value"] == pytest.approx(0.9)
    # Step checkpoints: the first host call at or after each multiple of 4,
    # never on an epoch's last step (6, 12, ...).
    saved_steps = [p.name for p in callback.saved if p.name.startswith("step")]
    assert saved_steps[:3] == [
        "step-00000004",
        "step-00000008",
        "step-00000016",
    ]


def test_truncate_history_drops_unfinished_epochs(tmp_path):
    path = tmp_path / "history.csv"
    # CSVLogger's own line ends (CRLF) are kept: a resumed run's file equals
    # an uninterrupted run's byte for byte.
    path.write_bytes(b"epoch,loss\r\n0,1.5\r\n1,1.2\r\n2,1.1\r\n3,0.")
    truncate_history(path, 2)
    assert path.read_bytes() == b"epoch,loss\r\n0,1.5\r\n1,1.2\r\n"
    path.write_bytes(b"epoch,loss\r\n0,1.5\r\n1,1.")
    truncate_history(path, 5)
    assert path.read_bytes() == b"epoch,loss\r\n0,1.5\r\n"


def test_only_the_chief_writes_into_the_run_folder(tmp_path):
    out = tmp_path / "run"
    assert writable_dir(out, is_chief=True) == out
    scratch = writable_dir(out, is_chief=False)
    assert scratch.is_dir() and out not in scratch.parents and scratch != out
    assert not out.exists()


# ---------------------------------------------------------------- loading


def test_python_object_tag_in_a_recipe_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    recipe = tmp_path / "evil.yaml"
    recipe.write_text(f"attack: !!python/object/apply:os.system ['touch {marker}']\n")
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(recipe), "-o", str(out)])
    assert result.exit_code == 2
    assert "tags that build Python objects are not allowed" in result.output
    assert not marker.exists() and not out.exists()


def test_lambda_model_needs_explicit_unsafe_load(tmp_path):
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Dense(10)(keras.layers.Flatten()(inputs))
    outputs = keras.layers.Lambda(lambda t: t * 1.0)(h)
    path = tmp_path / "lambda.keras"
    keras.Model(inputs, outputs).save(path)
    recipe = write_recipe(tmp_path)

    refused = runner.invoke(app, ["eval", str(path), "--recipe", str(recipe)])
    assert refused.exit_code == 2, refused.output
    assert "holds Python code" in refused.output
    assert "--unsafe-load" in refused.output

    accepted = runner.invoke(
        app, ["eval", str(path), "--recipe", str(recipe), "--unsafe-load"]
    )
    assert accepted.exit_code == 0, accepted.output
    assert "clean accuracy" in accepted.output


def test_optimizer_state_and_loss_scale_round_trip(tmp_path):
    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        model.compile(
            optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.1)),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model

    x = np.random.default_rng(0).random((8, 4)).astype("float32")
    y = np.arange(8) % 3
    model = build()
    model.fit(x, y, epochs=2, batch_size=4, verbose=0)
    path = CheckpointStore(tmp_path).save(
        model, kind="epoch", epoch=2, step=0, global_step=4, phase="train"
    )
    fresh = build()
    fresh.optimizer.build(fresh.trainable_variables)
    point = load_checkpoint(path)
    restore_variables(fresh, point, "model")
    restore_variables(fresh, point, "optimizer")
    assert int(fresh.optimizer.iterations) == 4
    assert float(fresh.optimizer.dynamic_scale) == float(model.optimizer.dynamic_scale)
    # Both continue identically.
    model.fit(x, y, epochs=1, batch_size=4, verbose=0)
    fresh.fit(x, y, epochs=1, batch_size=4, verbose=0)
    for a, b in zip(model.get_weights(), fresh.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
