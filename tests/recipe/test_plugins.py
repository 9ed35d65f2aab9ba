"""Extension from a recipe: a plugin module registers an attack, a data
source and a training objective, and a recipe names all three and passes
the attack and the objective options of their own (issues 13 and 23).

The recipe runs with the `advtrain` command from a fresh interpreter, so
nothing registered in this process helps it; the plugin is found in the
current folder, as `python -m` would find it. The plugin's functions leave marks
that prove they ran (a file written when the attack is traced and when the
objective is built, with the options each received; the data's size in the
run's own lines).
"""

import json
import textwrap

import yaml
from helpers import run_console
from typer.testing import CliRunner

from advtrain.cli.commands import app

PLUGIN = textwrap.dedent('''
    """A plugin: one attack, one data source and one objective."""
    import os

    import numpy as np
    import tensorflow as tf

    import advtrain
    from advtrain.attacks import register_attack
    from advtrain.data import register_source, splits_from_arrays


    def mark(line):
        open(os.environ["PLUGIN_MARK"], "a").write(line + "\\n")


    @register_attack("sign_noise")
    def sign_noise(model_fn, x, y, *, eps, scale=1.0, seed=None):
        """Moves every pixel by scale * eps in a random direction."""
        mark(f"sign_noise traced scale={scale}")
        noise = tf.sign(tf.random.uniform(tf.shape(x), -1.0, 1.0))
        step = scale * eps * tf.cast(noise, x.dtype)
        return tf.clip_by_value(x + step, 0.0, 1.0)


    @advtrain.register_objective("logit_pairing")
    class LogitPairing(advtrain.AdversarialModel):
        """The mixed loss plus `pairing` x the squared logit gap."""

        def __init__(self, classifier, attack=None, pairing=0.5, **kwargs):
            super().__init__(classifier, attack, **kwargs)
            self.pairing = pairing
            mark(f"logit_pairing built pairing={pairing}")

        def adversarial_loss(self, x, y, y_pred, x_adv, y_pred_adv, weight):
            loss = super().adversarial_loss(x, y, y_pred, x_adv, y_pred_adv, weight)
            gap = tf.reduce_sum(tf.square(y_pred - y_pred_adv), axis=-1)
            return loss + self.pairing * self.reduce_per_example(gap, weight)


    @register_source("stripes")
    def stripes(*, limit_train=None, limit_test=None, seed=0):
        """Vertical (class 0) or horizontal (class 1) stripes, 8x8."""
        rng = np.random.default_rng(seed)
        y = rng.integers(0, 2, 120)
        base = np.zeros((120, 8, 8, 1), np.float32)
        base[y == 0, :, ::2] = 1.0
        base[y == 1, ::2, :] = 1.0
        x = np.clip(base + 0.1 * rng.standard_normal(base.shape), 0, 1)
        x = x.astype(np.float32)
        return splits_from_arrays(
            (x[:96], y[:96]), (x[96:], y[96:]), num_classes=2,
            limit_train=limit_train, limit_test=limit_test, seed=seed,
        )
''')

RECIPE = {
    "name": "plugin",
    "plugins": ["my_plugin"],
    "data": {"source": "stripes"},
    "model": {"backbone": "small_cnn", "width": 4},
    "attack": {
        "method": "sign_noise",
        "eps": 0.1,
        "options": {"scale": 0.5},
        "objective": "logit_pairing",
        "objective_options": {"pairing": 0.25},
    },
    "train": {"epochs": 1, "batch_size": 32},
    "eval": {"pgd_steps": 1, "fgsm": False, "sanity_examples": 0},
    "output": {"tensorboard": False, "plots": False, "export_saved_model": False},
}


def test_a_recipe_uses_a_registered_attack_and_data_source(tmp_path):
    (tmp_path / "my_plugin.py").write_text(PLUGIN)
    recipe = tmp_path / "plugin.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    mark = tmp_path / "mark.txt"
    # The console script does not put the current folder on sys.path;
    # advtrain searches it for plugins.
    done = run_console(tmp_path, "run", "plugin.yaml", "-o", "out", PLUGIN_MARK=mark)
    assert "data: stripes 96 train / 0 val / 24 test" in done.stdout
    assert "attack: sign_noise eps=0.1" in done.stdout
    assert "scale=0.5 objective=logit_pairing pairing=0.25" in done.stdout
    assert "LogitPairing overrides adversarial_loss" in done.stdout
    # Each received its own options from the recipe, in a fresh process.
    marks = mark.read_text().splitlines()
    assert "logit_pairing built pairing=0.25" in marks
    assert "sign_noise traced scale=0.5" in marks
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["robust_accuracy"] <= metrics["pgd_accuracy"]
    assert metrics["pgd_accuracy"] <= metrics["clean_accuracy"]
    # Two classes: AutoAttack runs without APGD-T (its loss needs 4 logits);
    # FAB-T runs with the one other class as its target.
    steps = [s["attack"] for s in metrics["autoattack"]["steps"]]
    assert steps == ["apgd_ce", "fab_t", "square"]
    # The run folder's recipe names the plugin, so a resume imports it too.
    saved = yaml.safe_load((tmp_path / "out" / "recipe.yaml").read_text())
    assert saved["plugins"] == ["my_plugin"]
    assert saved["attack"]["options"] == {"scale": 0.5}
    assert saved["attack"]["objective"] == "logit_pairing"
    assert saved["attack"]["objective_options"] == {"pairing": 0.25}


def test_an_unregistered_name_lists_what_is_known(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "plugins": []}))
    result = CliRunner().invoke(app, ["run", str(recipe), "-o", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert "'data.source': unknown data source 'stripes'" in result.output
    assert "digits" in result.output and "plugins" in result.output
    assert not (tmp_path / "o").exists()


def test_a_plugin_that_cannot_be_imported_is_named(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "plugins": ["no_such_plugin_mod"]}))
    result = CliRunner().invoke(app, ["run", str(recipe), "-o", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert "plugins: cannot import 'no_such_plugin_mod'" in result.output
    assert "ModuleNotFoundError" in result.output
