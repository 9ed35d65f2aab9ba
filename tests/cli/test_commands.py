"""Every command README.md shows, run as users run it: a subprocess from a
fresh interpreter, against a run folder an earlier command wrote.

In-process CLI tests (test_cli.py) share the test process's imports, so
they cannot see what a fresh `advtrain eval RUN` has not imported. These
check the exit code, that stderr stays within the one-line error budget
(no traceback, no TensorFlow start-up log) and the artifacts.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from sklearn.metrics import f1_score

# The quickstart, as small as `--set` makes it: 2 steps per epoch, a few
# test images, the cheapest PGD, no sanity checks and no plots.
SMALL = [
    "data.limit_train=128",
    "data.limit_test=32",
    "model.width=4",
    "eval.pgd_steps=2",
    "eval.pgd_restarts=1",
    "eval.eps_sweep=[0.0,0.1]",
    "eval.sanity_examples=0",
    "output.plots=false",
    "output.tensorboard=false",
]
MAX_STDERR_LINES = 3


def advtrain(*args, timeout=300):
    """Runs `python -m advtrain.cli ARGS` in a fresh interpreter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}
    env.pop("ADVTRAIN_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "advtrain.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def sets(items):
    return [arg for item in items for arg in ("--set", item)]


def ok(result):
    """Exit 0 and at most MAX_STDERR_LINES quiet lines on stderr."""
    where = f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    assert result.returncode == 0, where
    assert "Traceback" not in result.stderr, where
    assert len(result.stderr.splitlines()) <= MAX_STDERR_LINES, where
    return result


def one_error_line(result, code, text):
    lines = result.stderr.splitlines()
    assert result.returncode == code, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and text in lines[0], lines[0]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """`advtrain run quickstart ... -o DIR`: 2 epochs, so a copy without
    the second epoch's checkpoint is an interrupted run."""
    out = tmp_path_factory.mktemp("commands") / "mine"
    overrides = [*SMALL, "train.epochs=2"]
    result = ok(advtrain("run", "quickstart", *sets(overrides), "-o", out))
    assert f"run folder: {out}" in result.stdout
    return out


@pytest.fixture(scope="module")
def digits_uint8():
    from advtrain.data.digits import load_digits_arrays

    x, _ = load_digits_arrays()
    return np.round(x[:16] * 255).astype(np.uint8)


def test_recipes_lists_each_shipped_recipe():
    result = ok(advtrain("recipes"))
    assert result.stderr == ""
    names = [line.split()[0] for line in result.stdout.splitlines()]
    assert "quickstart" in names and "mnist_fgsm_rs" in names


def test_run_writes_the_run_folder(run_dir):
    for name in ("recipe.yaml", "model.keras", "metrics.json", "history.csv"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "checkpoints" / "epoch-0002").is_dir()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    # The clean accuracy is the saved model's on the run's test split,
    # recomputed here from the files the run wrote.
    from advtrain.recipe.build import recipe_splits
    from advtrain.recipe.loader import load_recipe
    from advtrain.recipe.saved import load_classifier

    test = recipe_splits(load_recipe(run_dir / "recipe.yaml")).test
    x, y = (np.stack(a) for a in zip(*test.as_numpy_iterator(), strict=True))
    assert metrics["examples"] == len(y) == 32
    logits = load_classifier(run_dir / "model.keras").predict(x, verbose=0)
    predicted = np.argmax(logits, axis=-1)
    assert metrics["clean_accuracy"] == pytest.approx(np.mean(predicted == y))
    f1 = f1_score(y, predicted, average="macro")
    assert metrics["macro_f1"] == pytest.approx(f1)
    for key in ("fgsm_accuracy", "pgd_accuracy"):
        correct = metrics[key] * len(y)  # a share of the test images
        assert correct == pytest.approx(round(correct)), key
    # The headline is the worst case: at most every attack's accuracy.
    worst = metrics["robust_accuracy"]
    assert worst <= min(metrics["fgsm_accuracy"], metrics["pgd_accuracy"])
    assert metrics["pgd_accuracy"] <= metrics["clean_accuracy"]
    # PGD-based checks are off (sanity_examples=0); the gradient-free one
    # reads the evaluation and always runs.
    names = [c["name"] for c in metrics["sanity_checks"]]
    assert names == ["gradient_free_not_stronger"]
    assert metrics["examples"] == 32
    assert [p["eps"] for p in metrics["eps_sweep"]] == [0.0, 0.1]


def test_eval_run_folder(run_dir):
    result = ok(advtrain("eval", run_dir))
    assert "clean accuracy" in result.stdout
    metrics = json.loads((run_dir / "eval-metrics.json").read_text())
    trained = json.loads((run_dir / "metrics.json").read_text())
    # The same model on the same examples: the same clean verdicts, and the
    # headline printed first.
    assert metrics["clean_accuracy"] == trained["clean_accuracy"]
    assert metrics["robust_accuracy"] <= metrics["pgd_accuracy"]
    lines = [line.strip() for line in result.stdout.splitlines()]
    first = [i for i, line in enumerate(lines) if line.startswith("robust accuracy")]
    assert first and first[0] < lines.index(
        next(x for x in lines if x.startswith("clean accuracy"))
    )
    assert metrics["examples"] == 32


def test_eval_save_examples_writes_them_to_the_run_folder(run_dir):
    # FGSM alone keeps it quick; the examples are under test, not the attacks.
    fgsm = sets(["eval.attacks=[fgsm]"])
    result = ok(advtrain("eval", run_dir, "--save-examples", *fgsm))
    path = run_dir / "adversarial_examples.npz"
    assert f"broken) written to {path}" in result.stdout
    with np.load(path) as saved:
        x, x_adv, attack = saved["x"], saved["x_adv"], saved["attack"]
        assert x.shape == x_adv.shape == (32, 8, 8, 1)
        for key in ("y", "predicted", "robust"):
            assert saved[key].shape == (32,), key
        assert np.max(np.abs(x_adv - x)) <= float(saved["eps"]) + 1e-6
        np.testing.assert_array_equal(saved["robust"], attack == "")
        assert set(attack) <= {"", "clean", "fgsm"}
    assert "adversarial_examples" not in (run_dir / "eval-metrics.json").read_text()


def test_eval_model_file_with_shipped_recipe(run_dir):
    # The quickstart recipe's data with the run's model; the --set keeps
    # the evaluation small (the README's example raises pgd_restarts).
    model = run_dir / "model.keras"
    result = ok(advtrain("eval", model, "--recipe", "quickstart", *sets(SMALL)))
    assert f"evaluating {model} on 32 test examples" in result.stdout
    assert "PGD accuracy" in result.stdout


def test_export_run_folder_and_to_another_folder(run_dir, tmp_path, digits_uint8):
    import keras
    import tensorflow as tf

    # `run` exported already: `export RUN` refreshes the run's own export.
    served = run_dir / "export" / "saved_model"
    assert (served / "saved_model.pb").is_file()
    before = (served / "saved_model.pb").stat().st_mtime_ns
    ok(advtrain("export", run_dir))
    assert (served / "saved_model.pb").stat().st_mtime_ns != before
    assert not list(served.parent.glob(".*"))  # no temporary folders left
    other = tmp_path / "served" / "1"
    result = ok(advtrain("export", run_dir, "-o", other))
    assert f"exported {run_dir / 'model.keras'} to {other}" in result.stdout
    # A folder named with -o is never overwritten.
    one_error_line(advtrain("export", run_dir, "-o", other), 2, "not empty")
    expected = keras.saving.load_model(run_dir / "model.keras")(
        digits_uint8.astype("float32") / 255
    )
    for path in (run_dir / "export" / "saved_model", other):
        serve = tf.saved_model.load(str(path)).signatures["serving_default"]
        out = serve(tf.constant(digits_uint8))
        np.testing.assert_allclose(out["logits"], expected, atol=1e-4)
        np.testing.assert_allclose(
            np.sum(out["probabilities"], axis=-1), 1.0, atol=1e-5
        )


def test_resume_finished_run_is_refused(run_dir):
    before = (run_dir / "metrics.json").read_bytes()
    one_error_line(advtrain("resume", run_dir), 2, "finished")
    assert (run_dir / "metrics.json").read_bytes() == before


def test_resume_interrupted_run(run_dir, tmp_path):
    # The state of a run stopped after its first epoch's checkpoint.
    out = tmp_path / "interrupted"
    shutil.copytree(run_dir / "checkpoints", out / "checkpoints")
    shutil.copy(run_dir / "recipe.yaml", out)
    shutil.copy(run_dir / "history.csv", out)
    for path in (out / "checkpoints").iterdir():
        if path.is_dir() and path.name != "epoch-0001":
            shutil.rmtree(path)
    result = ok(advtrain("resume", out))
    assert "from epoch-0001: epoch 2" in result.stdout
    assert "epoch 2/2" in result.stdout and "epoch 1/2" not in result.stdout
    assert (out / "model.keras").is_file()
    assert json.loads((out / "metrics.json").read_text())["examples"] == 32


@pytest.mark.backend_neutral  # the JAX tier: without TensorFlow too
def test_profile_shipped_recipe():
    result = ok(advtrain("profile", "quickstart", *sets(SMALL), "--steps", "2"))
    assert "input pipeline alone" in result.stdout
    assert "train step alone" in result.stdout
    assert "verdict: " in result.stdout


def test_version():
    import keras

    from advtrain import __version__

    result = ok(advtrain("--version"))
    running = f"Keras {keras.__version__} on {keras.backend.backend()}"
    assert result.stdout.strip() == f"advtrain {__version__} ({running})"
    assert result.stderr == ""


def test_debug_shows_the_traceback(tmp_path):
    # The README's `advtrain --debug run ...`, on a run that fails at once.
    result = advtrain("--debug", "run", tmp_path / "missing.yaml")
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "recipe file not found" in result.stderr


def test_bad_recipe_name_is_one_line():
    result = advtrain("run", "missing.yaml")
    one_error_line(result, 2, "missing.yaml: recipe file not found")
