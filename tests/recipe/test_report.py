"""report.md, and a run's report, guard, sanity checks and export end to end."""

import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
from typer.testing import CliRunner

from advtrain.cli.commands import app
from advtrain.recipe.loader import recipe_from_dict
from advtrain.recipe.report import write_report

TINY = {
    "name": "tiny_report",
    "description": "report test",
    "data": {"source": "digits", "limit_train": 256, "limit_test": 64},
    "model": {"backbone": "small_cnn", "width": 4},
    "attack": {"method": "fgsm", "eps": 0.1},
    "train": {
        "epochs": 2,
        "batch_size": 64,
        "co_guard": True,
        "co_guard_examples": 64,
        "co_guard_pgd_steps": 2,
    },
    "eval": {
        "pgd_steps": 2,
        "eps_sweep": [0.0, 0.1],
        "max_examples": 48,
        "attacks": ["fgsm", "pgd", "apgd_ce", "apgd_dlr"],
        "apgd_steps": 2,
    },
    "output": {"tensorboard": False},
}

METRICS = {
    "examples": 3,
    "clean_accuracy": 0.9,
    "fgsm_accuracy": 0.5,
    "fgsm_attack": {"method": "fgsm", "eps": 0.1, "norm": "inf"},
    "pgd_accuracy": 0.4,
    "pgd_attack": {
        "method": "pgd",
        "eps": 0.1,
        "norm": "inf",
        "steps": 20,
        "restarts": 5,
    },
    "macro_f1": 0.88,
    "per_class_accuracy": [1.0, None, 0.5],
    "pgd_per_class_accuracy": [0.5, None, 0.0],
    "class_support": [2, 0, 1],
    "bn_gap": {
        "train_mode_accuracy": 0.8,
        "inference_mode_accuracy": 0.9,
        "gap": -0.1,
    },
    "train_seconds": 12.5,
    "train_samples_per_second": 800.0,
    "epoch_seconds": [6.0, 6.5],
    "sanity_checks": [
        {"name": "pgd_not_above_fgsm", "passed": True, "detail": "ok"},
        {"name": "input_gradients_nonzero", "passed": False, "detail": "50%"},
    ],
}
HISTORY = {"accuracy": [0.5, 0.8], "adv_accuracy": [0.2, 0.4], "loss": [2, 1]}


def test_report_lists_each_attack_and_the_worst_case(tmp_path):
    apgd = {"eps": 0.1, "norm": "inf", "steps": 100, "restarts": 1}
    metrics = {
        **METRICS,
        "apgd_ce_accuracy": 0.35,
        "apgd_ce_attack": {"method": "apgd_ce", **apgd},
        "apgd_dlr_accuracy": 0.3,
        "apgd_dlr_attack": {"method": "apgd_dlr", "targets": 9, **apgd},
        "robust_accuracy": 0.25,
        "robust_accuracy_over": ["clean", "fgsm", "pgd", "apgd_ce", "apgd_dlr"],
        "robust_accuracy_ci95": [0.2, 0.3],
        "robust_accuracy_ensemble": None,
    }
    text = write_report(
        tmp_path, recipe_from_dict(TINY).to_dict(), metrics, HISTORY, plots=False
    ).read_text()
    assert (
        "| APGD-CE accuracy (eps=0.1 norm=inf, 100 steps x 1 restart(s)) | 35.00% |"
        in text
    )
    assert (
        "| APGD-DLR accuracy (targeted) (eps=0.1 norm=inf, 100 steps x 1 "
        "restart(s) x 9 targets) | 30.00% |"
    ) in text
    headline = (
        "robust accuracy (worst case over clean, FGSM, PGD, APGD-CE, APGD-DLR; "
        "eps=0.1 inf; no AutoAttack: may overstate robustness)"
    )
    value = "25.00% (95% CI 20.0-30.0%, 3 examples)"
    assert f"| **{headline}** | **{value}** |" in text
    # The report opens with it.
    assert text.splitlines()[2] == f"**R{headline[1:]}: {value}**"
    rows = [
        line.split(" (")[0]
        for line in text.splitlines()
        if "accuracy (" in line and "worst case" not in line
    ]
    assert rows == [
        "| FGSM accuracy",
        "| PGD accuracy",
        "| APGD-CE accuracy",
        "| APGD-DLR accuracy",
    ]


def test_report_holds_every_section(tmp_path):
    recipe = recipe_from_dict(TINY)
    path = write_report(
        tmp_path,
        recipe.to_dict(),
        METRICS,
        HISTORY,
        class_names=["zero", "one", "two"],
    )
    text = path.read_text()
    for heading in (
        "## Results",
        "## Sanity checks",
        "## Curves",
        "## Per-class accuracy",
        "## BatchNorm gap",
        "## Timing",
        "## Recipe (resolved)",
    ):
        assert heading in text, heading
    assert (
        "| PGD accuracy (eps=0.1 norm=inf, 20 steps x 5 restart(s)) | 40.00% |" in text
    )
    assert "1 of 2 checks passed" in text and "**FAIL**" in text
    assert "| 2 (two) | 1 | 50.00% | 0.00% |" in text
    assert "| 1 (one) | 0 | n/a | n/a |" in text
    assert "- gap: -10.00 points" in text
    assert "800.0 samples/s" in text and "6.25 s on average" in text
    assert "co_guard: true" in text  # the resolved recipe
    png = (tmp_path / "training_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".tmp-*"))


def _examples(count=4, eps=0.1):
    from advtrain.evaluation.examples import AdversarialExamples

    x = np.random.default_rng(0).random((count, 8, 8, 1)).astype("float32")
    robust = np.arange(count) % 2 == 0
    return AdversarialExamples(
        x=x,
        y=np.zeros(count, np.int64),
        x_adv=np.clip(x + eps, 0, 1),
        attack=np.where(robust, "", "pgd"),
        predicted=np.where(robust, 0, 2),
        robust=robust,
        index=np.arange(count),
        eps=eps,
    )


@pytest.mark.parametrize("plots", [True, False])
def test_report_embeds_the_adversarial_examples_grid(tmp_path, plots):
    recipe = recipe_from_dict(TINY).to_dict()
    text = write_report(
        tmp_path, recipe, METRICS, HISTORY, plots=plots, examples=_examples()
    ).read_text()
    png = tmp_path / "adversarial_examples.png"
    link = "![adversarial examples](adversarial_examples.png)"
    assert (link in text) == plots == png.is_file()
    if plots:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "4 test images drawn with the evaluation's seed (2 broken" in text


@pytest.fixture(scope="module")
def guarded_run(tmp_path_factory):
    from advtrain.recipe.run import run

    out = tmp_path_factory.mktemp("report") / "run"
    lines = []
    # TensorBoard on: the grid of adversarial examples goes there too.
    recipe = recipe_from_dict({**TINY, "output": {"tensorboard": True}})
    result = run(recipe, out, echo=lines.append)
    return result, "\n".join(lines)


def test_run_writes_report_sanity_guard_and_export(guarded_run, digits):
    result, output = guarded_run
    out = result.output_dir
    metrics = json.loads((out / "metrics.json").read_text())
    assert [c["name"] for c in metrics["sanity_checks"]][0] == "pgd_not_above_fgsm"
    assert all(set(c) == {"name", "passed", "detail"} for c in metrics["sanity_checks"])
    assert metrics["examples"] == 48 and metrics["subset_of"] == 64
    attacked = [
        metrics[f"{n}_accuracy"] for n in ("fgsm", "pgd", "apgd_ce", "apgd_dlr")
    ]
    assert 0 <= metrics["robust_accuracy"] <= min(attacked)
    guard = metrics["co_guard"]
    assert [p["epoch"] for p in guard["pgd_accuracy"]] == [1, 2]
    assert len(result.history["co_guard_pgd_accuracy"]) == 2
    # The guard's record is kept for a resumed run: one more group of the
    # checkpoint, under its hash.
    from advtrain.train.checkpoint import extra_group, find_resume_point

    point = find_resume_point(out / "checkpoints", echo=lambda line: None)
    assert "meta" in extra_group(point, "co_guard")
    assert not (out / "checkpoints" / "co_guard.npz").exists()
    assert "catastrophic-overfitting guard: PGD-2" in output
    assert "sanity checks: " in output
    report = (out / "report.md").read_text()
    assert "![training curves](training_curves.png)" in report
    assert "APGD-DLR accuracy (targeted)" in report
    assert "**Robust accuracy (worst case over" in report.splitlines()[2]
    assert "![accuracy against eps](eps_sweep.png)" in report
    assert (out / "training_curves.png").is_file()

    served = tf.saved_model.load(str(out / "export" / "saved_model"))
    from advtrain.recipe.saved import load_classifier

    classifier = load_classifier(out / "model.keras")
    images = tf.constant((digits[0][:16] * 255).round().astype("uint8"))
    logits = served.signatures["serving_default"](images=images)["logits"]
    expected = classifier(tf.cast(images, tf.float32) / 255.0, training=False)
    assert (logits.numpy().argmax(1) == expected.numpy().argmax(1)).all()


def test_run_shows_adversarial_examples_in_report_and_tensorboard(guarded_run):
    out = guarded_run[0].output_dir
    assert "adversarial_examples" not in json.loads((out / "metrics.json").read_text())
    report = (out / "report.md").read_text()
    assert "![adversarial examples](adversarial_examples.png)" in report
    assert "8 test images drawn with the evaluation's seed" in report
    assert (out / "adversarial_examples.png").read_bytes()[:4] == b"\x89PNG"
    (events,) = (out / "logs" / "evaluation").glob("*tfevents*")
    tags = [
        (event.step, value.tag)
        for event in tf.compat.v1.train.summary_iterator(str(events))
        for value in event.summary.value
    ]
    assert tags == [(2, "adversarial_examples")]  # at the last epoch


def test_cli_export_and_eval_print_what_they_did(guarded_run, tmp_path):
    out = guarded_run[0].output_dir
    runner = CliRunner()
    target = tmp_path / "served"
    result = runner.invoke(app, ["export", str(out), "--output", str(target)])
    assert result.exit_code == 0, result.output
    assert "images uint8 [N, 8, 8, 1] -> logits, probabilities" in result.output
    assert (target / "saved_model.pb").is_file()
    again = runner.invoke(app, ["export", str(out), "--output", str(target)])
    assert again.exit_code == 2 and "not empty" in again.output

    result = runner.invoke(app, ["eval", str(out)])
    assert result.exit_code == 0, result.output
    assert "sanity checks: " in result.output
    assert "large_eps_breaks_model" in result.output


def test_resumed_run_keeps_the_guards_record(tmp_path):
    from advtrain.recipe.run import run

    # Keras's momentum, so that epoch 1 stays the guard's best on this seed
    # and its record is resumable from the epoch-1 checkpoint.
    model = {**TINY["model"], "batchnorm": {"momentum": None}}
    # The guard's record is under test, not the evaluation or the files.
    evaluation = {"attacks": ["fgsm"], "max_examples": 48, "sanity_examples": 0}
    output = {"tensorboard": False, "plots": False, "export_saved_model": False}
    recipe = recipe_from_dict(
        {**TINY, "model": model, "eval": evaluation, "output": output}
    )
    out = tmp_path / "run"
    run(recipe, out, echo=lambda _: None)
    # As if killed after epoch 1: the epoch-2 checkpoint and the final
    # files are gone, the guard's file (written after epoch 2) is not.
    for name in ("metrics.json", "model.keras"):
        (out / name).unlink()
    shutil.rmtree(out / "checkpoints" / "epoch-0002")
    lines = []
    result = run(recipe, out, echo=lines.append)
    assert any("guard: resumed with its record of 1 epoch(s)" in s for s in lines)
    guard = result.metrics["co_guard"]
    assert [p["epoch"] for p in guard["pgd_accuracy"]] == [1, 2]
