"""The CLI end to end on a tiny recipe, and its bad-input behaviour."""

import json

import keras
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from advtrain.cli.commands import app

runner = CliRunner()

TINY = {
    "name": "tiny",
    "description": "test",
    "data": {"source": "digits", "limit_train": 256, "limit_test": 64},
    "model": {"backbone": "small_cnn", "width": 4},
    "attack": {"method": "fgsm_rs", "eps": 0.1},
    "train": {"epochs": 2, "batch_size": 64},
    "eval": {"pgd_steps": 2, "pgd_restarts": 2, "eps_sweep": [0.0, 0.1]},
    "output": {"tensorboard": True},
}


def write_recipe(tmp_path, data, name="recipe.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    recipe = write_recipe(tmp, TINY)
    out = tmp / "out"
    result = runner.invoke(app, ["run", str(recipe), "--output", str(out)])
    assert result.exit_code == 0, result.output
    return out, result.output


def test_run_writes_every_artifact(finished_run):
    out, output = finished_run
    for name in (
        "recipe.yaml",
        "model.keras",
        "metrics.json",
        "history.csv",
        "eps_sweep.png",
    ):
        assert (out / name).is_file(), name
    assert (out / "checkpoints" / "epoch-0002" / "state.json").is_file()
    assert list((out / "logs").rglob("*tfevents*"))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["examples"] == 64
    for key in ("clean_accuracy", "fgsm_accuracy", "pgd_accuracy"):
        correct = metrics[key] * 64  # a share of the 64 test images
        assert correct == pytest.approx(round(correct)), key
    worst = metrics["robust_accuracy"]
    assert worst <= min(metrics["fgsm_accuracy"], metrics["pgd_accuracy"])
    assert [p["eps"] for p in metrics["eps_sweep"]] == [0.0, 0.1]
    assert "batch: global 64 = 1 replica(s) x 64" in output
    assert "epoch 2/2" in output
    assert "PGD accuracy" in output


def test_resolved_recipe_is_saved_with_overrides(tmp_path):
    recipe = write_recipe(tmp_path, TINY)
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "run",
            str(recipe),
            "-o",
            str(out),
            "--set",
            "train.epochs=1",
            "--set",
            "eval.pgd_steps=0",
            "--set",
            "eval.eps_sweep=[]",
        ],
    )
    assert result.exit_code == 0, result.output
    saved = yaml.safe_load((out / "recipe.yaml").read_text())
    assert saved["train"]["epochs"] == 1
    assert saved["attack"]["eps"] == 0.1
    assert saved["eval"]["pgd_steps"] == 0
    assert "pgd_accuracy" not in json.loads((out / "metrics.json").read_text())


def test_saved_model_round_trip_serves_raw_pixels(finished_run, digits):
    out, _ = finished_run
    import tensorflow as tf

    from advtrain.recipe.saved import load_classifier

    # The run's own SavedModel, served uint8 pixels, against model.keras.
    model = load_classifier(out / "model.keras")
    x = np.round(digits[0][:8] * 255).astype("uint8")
    served = tf.saved_model.load(str(out / "export" / "saved_model"))
    logits = served.signatures["serving_default"](images=tf.constant(x))["logits"]
    np.testing.assert_allclose(
        logits, model.predict(x.astype("float32") / 255, verbose=0), atol=1e-4
    )
    assert model.input_shape == (None, 8, 8, 1)
    assert model.output_shape == (None, 10)


def test_eval_command_on_run_folder(finished_run):
    out, _ = finished_run
    result = runner.invoke(app, ["eval", str(out), "--set", "eval.pgd_restarts=1"])
    assert result.exit_code == 0, result.output
    assert "clean accuracy" in result.output
    metrics = json.loads((out / "eval-metrics.json").read_text())
    assert metrics["pgd_attack"]["restarts"] == 1


def test_eval_of_model_file_needs_recipe(finished_run):
    out, _ = finished_run
    result = runner.invoke(app, ["eval", str(out / "model.keras")])
    assert result.exit_code == 2
    assert "needs --recipe" in result.output


def test_eval_of_missing_path_says_not_found(tmp_path):
    result = runner.invoke(app, ["eval", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "nope: not found" in result.output
    assert "--recipe" not in result.output


def test_version_debug_and_completion_are_global_options():
    from advtrain import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    running = f"Keras {keras.__version__} on {keras.backend.backend()}"
    assert result.output.strip() == f"advtrain {__version__} ({running})"
    top = runner.invoke(app, ["--help"]).output
    assert "--debug" in top and "--install-completion" in top
    assert "--debug" not in runner.invoke(app, ["run", "--help"]).output


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["run", "quickstart", "--bogus"], "No such option: --bogus"),
        (["trian"], "No such command 'trian'"),
        (["profile", "quickstart", "--steps", "0"], "--steps"),
    ],
)
def test_usage_errors_are_one_line(args, fragment):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and fragment in lines[0]
    assert "--help" in lines[0]


def test_recipes_lists_shipped_recipes():
    result = runner.invoke(app, ["recipes"])
    assert result.exit_code == 0
    assert "quickstart" in result.output
    assert "digits" in result.output


def test_existing_run_folder_is_never_overwritten(finished_run, tmp_path):
    out, _ = finished_run
    before = (out / "metrics.json").read_bytes()
    recipe = write_recipe(tmp_path, TINY)
    result = runner.invoke(app, ["run", str(recipe), "--output", str(out)])
    assert result.exit_code == 2
    assert "not empty" in result.output
    assert (out / "metrics.json").read_bytes() == before


def test_unexpected_errors_are_one_line_without_traceback(tmp_path, monkeypatch):
    import advtrain.recipe.run as experiment

    def boom(*args, **kwargs):
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setattr(experiment, "run", boom)
    recipe = write_recipe(tmp_path, TINY)
    result = runner.invoke(app, ["run", str(recipe), "-o", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "RuntimeError: disk on fire (rerun as `advtrain --debug" in result.output
    assert "Traceback" not in result.output
    assert "second line" not in result.output
    with pytest.raises(RuntimeError):
        runner.invoke(
            app,
            ["--debug", "run", str(recipe), "-o", str(tmp_path / "o")],
            catch_exceptions=False,
        )


def test_classifier_keras_file_refuses_lambda_layers(tmp_path):
    from advtrain.recipe.saved import load_classifier

    inputs = keras.Input((4,))
    outputs = keras.layers.Lambda(lambda t: t * 2)(inputs)
    path = tmp_path / "lambda.keras"
    keras.Model(inputs, outputs).save(path)
    with pytest.raises(ValueError, match="safe_mode"):
        load_classifier(path)
