"""`advtrain show`: the resolved recipe, adapter chain, batch plan and
learning-rate schedule, with nothing written (advtrain.cli.show)."""

import os
import subprocess
import sys

from advtrain.cli.show import schedule_lines, show, unprepared_data
from advtrain.recipe.loader import load_recipe
from advtrain.train.runtime import BatchPlan

RECIPES = os.path.join(os.path.dirname(__file__), "..", "..", "advtrain", "recipes")


def _show(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "advtrain.cli", "show", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
    )


def test_show_prints_the_plan_and_writes_nothing(tmp_path):
    result = _show(
        "quickstart", "--set", "model.input_size=[16,16]", "--set", "train.epochs=4",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "resolved recipe:\n  name: quickstart\n" in out
    assert "    epochs: 4\n" in out  # the --set override, resolved
    assert "data: digits, 1438 train / 0 val / 359 test, image 8x8x1" in out
    assert "    backend: tensorflow\n" in out  # auto, resolved: the installed one
    assert ", XLA off, backend tensorflow\n" in out
    assert (
        "model: pixels 8x8x1 -> resize 16x16 -> preprocess none -> backbone "
        "small_cnn -> head (pool, logits: 10)"
    ) in out
    assert "batch: global 64 = 1 replica(s) x 64; 22 steps/epoch x 4 epochs" in out
    assert "phase train: epochs 1-4 (88 steps)" in out
    assert "learning rate (cosine): 0.003 @ 0, " in out
    assert list(tmp_path.iterdir()) == []


def test_show_bad_recipe_exits_2_with_one_line(tmp_path):
    result = _show("quickstart", "--set", "train.batch_sise=8", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "unknown key 'train.batch_sise'" in result.stderr
    assert "Did you mean 'train.batch_size'?" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_show_phases_restart_their_schedule():
    recipe = load_recipe(
        os.path.join(RECIPES, "quickstart.yaml"),
        ["model.head_only_epochs=1", "train.epochs=3", "train.lr_schedule=constant"],
    )

    plan = BatchPlan(
        global_batch=64,
        replicas=1,
        per_replica_batch=64,
        steps_per_epoch=10,
        epochs=3,
        steps_per_execution=10,
        learning_rate=0.003,
        base_learning_rate=0.003,
    )
    lines = schedule_lines(recipe, plan)
    assert lines[0].startswith("phase warmup: epochs 1-1 (10 steps), freeze=frozen")
    assert "0.003 @ 0" in lines[1] and "0.003 @ 9" in lines[1]
    assert lines[2].startswith("phase finetune: epochs 2-3 (20 steps)")
    assert "lr x0.1" in lines[2]
    assert "0.0003 @ 10" in lines[3] and "0.0003 @ 29" in lines[3]


def test_show_does_not_prepare_tfds_data(tmp_path):
    data_dir = tmp_path / "tfds"
    recipe = load_recipe(
        os.path.join(RECIPES, "gtsrb_resnet.yaml"),
        [f"data.tfds_data_dir={data_dir}"],
    )
    assert "gtsrb is not prepared" in unprepared_data(recipe.data)
    lines = []
    show(recipe, echo=lines.append)
    assert lines[-1].startswith("data: gtsrb is not prepared in ")
    assert not data_dir.exists()
