"""Each unsound verdict on a small run: its exit code, the one `warning:`
line, `verdict` in metrics.json and the warning under report.md's
headline. In process (CliRunner), on the digits, a few seconds each."""

import json

import pytest
import yaml
from helpers import SMALL_RUN, never_robust_recipe
from typer.testing import CliRunner

from advtrain.cli.commands import app
from advtrain.evaluation.verdict import EXIT_CODES, verdict_line

runner = CliRunner()

NEVER_ROBUST = never_robust_recipe()

# A sound model, measured by a PGD that cannot reach the eps ball: one step
# of 0.02 at eps 0.3, no AutoAttack. FGSM (one step of 0.3) beats it by far
# more than the verdict's 10 points: the headline overstates robustness.
UNCONVERGED = {
    **SMALL_RUN,
    "name": "unconverged",
    "attack": {"method": "fgsm_rs", "eps": 0.1},
    "train": {"epochs": 2, "batch_size": 64, "learning_rate": 0.01},
    "eval": {
        "eps": 0.3,
        "attacks": ["fgsm", "pgd"],
        "pgd_steps": 1,
        "pgd_step_size": 0.02,
        "pgd_restarts": 1,
        "eps_sweep": [],
        "max_examples": 64,
        "sanity_examples": 64,
    },
}


def _run(tmp_path, recipe):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", str(path), "-o", str(out)])
    metrics = json.loads((out / "metrics.json").read_text())
    report = (out / "report.md").read_text().splitlines()
    assert (out / "model.keras").is_file()  # nothing trained is lost
    return result, metrics, report


def _says_it(result, metrics, report, kind):
    verdict = metrics["verdict"]
    assert verdict["kind"] == kind, verdict
    assert result.exit_code == EXIT_CODES[kind], result.output[-3000:]
    line = verdict_line(verdict)
    warnings = [s for s in result.output.splitlines() if s.startswith("warning: ")]
    assert warnings == [f"warning: {line}"]
    assert report[2].startswith("**Robust accuracy")
    assert report[4] == f"**Warning: {line}.**"
    return verdict


@pytest.mark.backend_neutral
def test_a_run_that_was_never_robust_exits_3(tmp_path):
    verdict = _says_it(*_run(tmp_path, NEVER_ROBUST), "catastrophic_overfitting")
    assert verdict["reasons"][0].startswith("no epoch the guard could keep was sound")
    assert EXIT_CODES["catastrophic_overfitting"] == 3


@pytest.mark.backend_neutral
def test_a_run_whose_pgd_cannot_reach_the_eps_ball_exits_4(tmp_path):
    result, metrics, report = _run(tmp_path, UNCONVERGED)
    verdict = _says_it(result, metrics, report, "evaluation_unreliable")
    assert metrics["catastrophic_overfitting"] is None
    # FGSM, one full step, beats the headline's PGD by tens of points.
    assert verdict["reasons"][0].startswith("gradient masking: PGD's accuracy is")
    assert EXIT_CODES["evaluation_unreliable"] == 4
