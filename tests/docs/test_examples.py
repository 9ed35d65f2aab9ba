"""The scripts in examples/ run as a user runs them, and do what they say.

Each runs in a fresh interpreter (`python examples/X.py`, its quick
default), so nothing imported or registered by the test process helps it.
The working folder is a temporary one: the scripts write their files
there, and their quick runs read nothing relative to it
(`finetune_pretrained.py --full` reads ../shared/data/mnist, so its
docstring says to run it from the repository root). Each test
checks a line that states the example's point and could come out wrong:
the reloaded predictions match, the plugins ran with the recipe's
settings, the pretrained weights were loaded and the head trained alone.

Measured on the 2-core machine under load: 25-55 s per script, about
3 minutes for the six (each pays ~6-12 s of TensorFlow import). Each
docstring says which backends the script runs on; those that say JAX
(without TensorFlow) run in the JAX tier too (`backend_neutral`): 45-130 s
each there under load, 2026-12-07.
"""

import ast
import re
import sys
from pathlib import Path

import pytest
from helpers import run_fresh

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run_example(name, cwd, *args):
    """`python examples/NAME ARGS` in `cwd`; asserts exit 0, returns stdout."""
    done = run_fresh(
        [sys.executable, EXAMPLES / name, *args], cwd, TF_CPP_MIN_LOG_LEVEL=2
    )
    return done.stdout


def percent(pattern, text):
    """The percentage after `pattern` in `text`, as a fraction."""
    match = re.search(pattern + r"\s*([\d.]+)%", text)
    assert match, f"no {pattern!r} in:\n{text}"
    return float(match.group(1)) / 100


@pytest.mark.slow
@pytest.mark.backend_neutral  # its docstring: runs on JAX without TensorFlow
def test_own_model_numpy(tmp_path):
    out = run_example("own_model_numpy.py", tmp_path)
    assert "reloaded own_model.keras: same predictions: True" in out, out
    assert (tmp_path / "own_model.keras").is_file()
    assert 0 <= percent("robust accuracy", out) <= percent("clean accuracy", out)


@pytest.mark.slow
def test_own_tf_data_and_folder(tmp_path):
    out = run_example("own_tf_data_and_folder.py", tmp_path)
    # The PNGs it wrote are what the folder source read: 30 per class.
    assert "folder: 300 train / " in out, out
    assert len(list((tmp_path / "digits_png" / "train").glob("*/*.png"))) == 300
    assert percent("tf.data: robust accuracy", out) > 0
    assert percent("folder: clean accuracy", out) > 0.2  # above chance (10%)


@pytest.mark.slow
@pytest.mark.backend_neutral  # its docstring: runs on JAX without TensorFlow
def test_finetune_pretrained(tmp_path):
    out = run_example("finetune_pretrained.py", tmp_path)
    pretrained = tmp_path / "runs" / "example_pretrain" / "model.keras"
    assert pretrained.is_file()
    # The transfer run loaded those weights and trained the head alone
    # first (`phase warmup`), then everything.
    warmup = "phase warmup: epochs 1-1, freeze=frozen, 0 backbone layer(s) trainable"
    assert warmup in out, out
    assert "phase finetune: epochs 2-2, freeze=all_trainable" in out, out
    assert percent(r"fine-tuned: clean", out) > 0.2


@pytest.mark.slow
def test_research_subclass(tmp_path):
    out = run_example("research_subclass.py", tmp_path)
    gaps = {
        name: float(value)
        for name, value in re.findall(
            r"^(.+?)\s+logit gap under PGD\s+([\d.]+)", out, re.M
        )
    }
    # The custom loss term did what it is for: clean and adversarial
    # logits much closer than with the plain objective.
    assert gaps["logit pairing 0.5"] < 0.5 * gaps["plain adversarial"], out
    assert "reloaded LogitPairing with pairing=0.5" in out, out


@pytest.mark.slow
def test_plugin_attack_and_objective(tmp_path):
    out = run_example("plugin_attack_and_objective.py", tmp_path)
    # Both plugins ran, with the settings the recipe gave them.
    assert "plugin: fgsm_jitter traced with jitter=0.25" in out, out
    assert "plugin: confidence_penalty built with beta=0.2" in out, out
    assert "attack: fgsm_jitter eps=0.1" in out, out
    assert (tmp_path / "runs" / "plugins" / "metrics.json").is_file()


@pytest.mark.slow
@pytest.mark.backend_neutral  # its docstring: runs on JAX without TensorFlow
def test_evaluate_saved_model(tmp_path):
    out = run_example("evaluate_saved_model.py", tmp_path)
    robust = percent("headline: robust accuracy", out)
    rows = {
        k: float(v) / 100 for k, v in re.findall(r"^  (\S.*?)\s+([\d.]+)%$", out, re.M)
    }
    assert rows["clean"] > 0.8, out  # their clean model is good
    # The table's rows: the headline is the worst case, no row below it,
    # and it is where the cascade's last member left it.
    assert {"clean", "FGSM", "PGD"} <= set(rows), out
    assert min(rows.values()) == robust, out
    assert rows[next(k for k in rows if k.startswith("after square"))] == robust


def _runs_on(path: Path) -> str:
    """The "Runs on:" paragraph of a script's docstring ("" if none)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    found = re.search(r"^Runs on: (.+?)(?:\n\n|\Z)", doc, re.M | re.S)
    return " ".join(found.group(1).split()) if found else ""


def test_every_example_says_which_backends_it_runs_on():
    # A script that says it runs on JAX (a "TensorFlow, JAX" claim, not
    # "JAX with TensorFlow installed") is run on JAX by the JAX tier: its
    # test is marked backend_neutral, and only such a script's is.
    for path in sorted(EXAMPLES.glob("*.py")):
        runs_on = _runs_on(path)
        assert runs_on.startswith("TensorFlow"), f"{path.name}: {runs_on!r}"
        test = globals().get(f"test_{path.stem}")
        if test is None:  # a module another example imports (my_plugins)
            continue
        marks = {mark.name for mark in getattr(test, "pytestmark", [])}
        says_jax = runs_on.startswith("TensorFlow, JAX")
        assert says_jax == ("backend_neutral" in marks), (path.name, runs_on)
