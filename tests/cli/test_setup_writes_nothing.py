"""Bad input found while a run is set up writes nothing: settings that only
the runtime's placement, the model or the attack's first call can refuse
(each on the backend this tier runs) end in one line and exit 2, and the
run folder is as it was (none, or the empty folder it was given), so a
rerun with the setting fixed is not refused as "a run of a different
recipe". In process (CliRunner), on the digits.
"""

from __future__ import annotations

import sys
from pathlib import Path

import keras
import pytest
import yaml
from helpers import SMALL_RUN
from typer.testing import CliRunner

from advtrain import backend
from advtrain.cli.commands import app

runner = CliRunner()

RECIPE = {
    **SMALL_RUN,
    "name": "setup",
    "data": {"source": "digits", "limit_train": 64, "limit_test": 32},
    "model": {"backbone": "small_cnn", "width": 4},
    "attack": {"method": "fgsm", "eps": 0.1},
    "train": {"epochs": 1, "batch_size": 32},
    "eval": {"attacks": ["pgd"], "pgd_steps": 1, "sanity_examples": 0},
}

# A model whose training pass refuses its input (bad input, found at the
# first step), and one whose training pass crashes (not the user's input).
BUILDER = """
import keras


class Refuses(keras.layers.Layer):
    error = ValueError

    def call(self, x, training=False):
        if training:
            raise self.error("Refuses: no training pass. Received: training=True")
        return x


class Crashes(Refuses):
    error = RuntimeError


def _build(layer, image_shape, num_classes):
    inputs = keras.Input(image_shape)
    x = layer()(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


def build(image_shape, num_classes, cfg):
    return _build(Refuses, image_shape, num_classes)


def crash(image_shape, num_classes, cfg):
    return _build(Crashes, image_shape, num_classes)
"""

# Where `expect` is found on each backend: the cause differs by backend.
CASES = {
    # At the attack's first call. TensorFlow: cleverhans needs step_size
    # <= eps; JAX: the cleverhans backend needs TensorFlow tensors.
    "cleverhans-attack": (
        {
            "attack": {
                "method": "pgd",
                "backend": "cleverhans",
                "eps": 0.1,
                "steps": 1,
                "step_size": 0.2,
            }
        },
        "cleverhans",
    ),
    # TensorFlow: no cluster to place on; JAX: a TensorFlow-only strategy.
    "placement": (
        {"runtime": {**RECIPE["runtime"], "strategy": "multi_worker"}},
        "runtime.strategy",
    ),
    "model-first-step": ({"model": {"builder": "refusing:build"}}, "Refuses"),
}


def _recipe(tmp_path: Path, changes: dict) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({**RECIPE, **changes}))
    (tmp_path / "refusing.py").write_text(BUILDER)
    return path


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def plugin_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("refusing", None)


@pytest.mark.backend_neutral
@pytest.mark.parametrize("given", ["absent", "empty"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_setup_leaves_the_run_folder_as_it_was(case, given, tmp_path, plugin_path):
    changes, expect = CASES[case]
    out = tmp_path / "run"
    if given == "empty":
        out.mkdir()
    path = _recipe(tmp_path, changes)
    result = runner.invoke(app, ["run", str(path), "-o", str(out)])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2, result.output[-3000:]
    assert len(errors) == 1 and expect in errors[0], result.output[-3000:]
    assert "Traceback" not in result.output
    if given == "absent":
        assert not out.exists(), _listing(out)
    else:
        assert _listing(out) == []


@pytest.mark.backend_neutral
def test_a_rerun_with_the_setting_fixed_uses_the_same_folder(tmp_path, plugin_path):
    out = tmp_path / "run"
    bad = _recipe(tmp_path, {"model": {"builder": "refusing:build"}})
    assert runner.invoke(app, ["run", str(bad), "-o", str(out)]).exit_code == 2
    fixed = _recipe(tmp_path, {"train": {"epochs": 1, "batch_size": 32}})
    result = runner.invoke(app, ["run", str(fixed), "-o", str(out)])
    assert result.exit_code == 0, result.output[-3000:]
    assert (out / "metrics.json").is_file()


@pytest.mark.backend_neutral
@pytest.mark.parametrize("key", ["tensorboard", "export_saved_model"])
def test_a_tensorflow_output_asked_for_without_tensorflow_writes_nothing(
    key, tmp_path, plugin_path, monkeypatch
):
    # The JAX tier has no TensorFlow; here every tier is made to lack it.
    monkeypatch.setattr(backend, "HAS_TENSORFLOW", False)
    out = tmp_path / "run"
    path = _recipe(tmp_path, {})
    result = runner.invoke(
        app, ["run", str(path), "-o", str(out), "--set", f"output.{key}=true"]
    )
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2, result.output[-3000:]
    assert len(errors) == 1, result.output
    assert f"output.{key}:" in errors[0] and "advtrain[tensorflow]" in errors[0]
    name = keras.backend.backend()
    assert f"Received: output.{key}=true, runtime.backend={name}" in errors[0]
    assert not out.exists()


@pytest.mark.backend_neutral
def test_a_crash_before_the_first_checkpoint_keeps_what_it_wrote(tmp_path, plugin_path):
    # Not the user's input (exit 1): the folder stays to be looked at.
    out = tmp_path / "run"
    path = _recipe(tmp_path, {"model": {"builder": "refusing:crash"}})
    result = runner.invoke(app, ["run", str(path), "-o", str(out)])
    assert result.exit_code == 1, result.output[-3000:]
    assert "RuntimeError" in result.output
    assert (out / "recipe.yaml").is_file(), _listing(out) if out.exists() else None


@pytest.mark.backend_neutral
def test_cleverhans_off_tensorflow_is_refused_before_the_setup(
    tmp_path, plugin_path, monkeypatch
):
    # The JAX tier's Keras is not on TensorFlow; here every tier is made so.
    monkeypatch.setattr(backend, "IMPORTS_TENSORFLOW", False)
    out = tmp_path / "run"
    attack = {"method": "fgsm", "backend": "cleverhans", "eps": 0.1}
    path = _recipe(tmp_path, {"attack": attack})
    result = runner.invoke(app, ["run", str(path), "-o", str(out)])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2, result.output[-3000:]
    assert len(errors) == 1 and "attack.backend: the cleverhans" in errors[0]
    # Nothing was set up (no data read, no model built): no progress lines.
    assert result.output.strip() == errors[0], result.output
    assert not out.exists()
