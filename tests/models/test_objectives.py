"""Objectives by name (issue 23): the registry, and a recipe that picks
TRADES, GradAlign or a registered subclass with `attack.objective` and
passes it `attack.objective_options`, checked against its signature."""

import csv

import keras
import pytest
import tensorflow as tf
import yaml
from helpers import dense_classifier, run_console

import advtrain
from advtrain.models import TRADES, AdversarialModel, GradAlign
from advtrain.models.objectives import objective_options, objectives
from advtrain.recipe.build import build_training_model
from advtrain.recipe.loader import recipe_from_dict
from advtrain.recipe.schema import RecipeError


@advtrain.register_objective("test_logit_pairing")
class LogitPairing(AdversarialModel):
    """The mixed loss plus `pairing` x the squared logit gap."""

    def __init__(self, classifier, attack=None, pairing=0.5, **kwargs):
        super().__init__(classifier, attack, **kwargs)
        self.pairing = pairing

    def adversarial_loss(self, x, y, y_pred, x_adv, y_pred_adv, sample_weight):
        loss = super().adversarial_loss(x, y, y_pred, x_adv, y_pred_adv, sample_weight)
        gap = tf.reduce_sum(tf.square(y_pred - y_pred_adv), axis=-1)
        return loss + self.pairing * self.reduce_per_example(gap, sample_weight)


class SharperTRADES(TRADES):
    """Adds an option of its own to TRADES's, which it passes on."""

    def __init__(self, classifier, attack=None, sharpness=1.0, **kwargs):
        super().__init__(classifier, attack, **kwargs)
        self.sharpness = sharpness


def _attack_section(**keys):
    return recipe_from_dict({"attack": keys}, "r.yaml")


# ---------------------------------------------------------------- registry


def test_the_builtin_objectives_are_registered_by_name():
    assert objectives.get("adversarial") is AdversarialModel
    assert objectives.get("trades") is TRADES
    assert objectives.get("grad_align") is GradAlign
    assert "register_objective" in advtrain.__all__


def test_a_duplicate_name_is_an_error():
    with pytest.raises(ValueError, match="objective named 'trades' is already"):
        advtrain.register_objective("trades")(LogitPairing)
    assert objectives.get("trades") is TRADES


def test_only_adversarial_model_subclasses_register():
    with pytest.raises(TypeError, match="takes an AdversarialModel subclass"):
        advtrain.register_objective("test_not_a_model")(keras.Model)
    assert "test_not_a_model" not in objectives


def test_an_unknown_name_suggests_the_closest_and_lists_all():
    with pytest.raises(ValueError) as info:
        objectives.get("trade")
    message = str(info.value)
    assert "Unknown objective 'trade'. Did you mean 'trades'?" in message
    assert "Known: adversarial, grad_align," in message


def test_options_are_the_keyword_arguments_an_objective_adds():
    assert objective_options(AdversarialModel) == ()
    assert objective_options(TRADES) == ("beta",)
    assert objective_options(GradAlign) == ("grad_align", "clip_noise")
    assert objective_options(LogitPairing) == ("pairing",)
    # Up the chain for as long as each `__init__` passes **kwargs on.
    assert objective_options(SharperTRADES) == ("sharpness", "beta")


# ---------------------------------------------------------------- recipe


@pytest.mark.parametrize(
    "keys, cls, attribute, value",
    [
        ({"method": "fgsm"}, AdversarialModel, "adv_weight", 0.5),
        (
            {
                "method": "pgd",
                "objective": "trades",
                "objective_options": {"beta": 2.0},
            },
            TRADES,
            "beta",
            2.0,
        ),
        (
            {
                "method": "fgsm",
                "objective": "grad_align",
                "objective_options": {"grad_align": 0.5},
            },
            GradAlign,
            "grad_align",
            0.5,
        ),
        ({"method": "fgsm", "objective": "grad_align"}, GradAlign, "grad_align", 0.2),
        (
            {
                "method": "fgsm_rs",
                "objective": "test_logit_pairing",
                "objective_options": {"pairing": 0.25},
            },
            LogitPairing,
            "pairing",
            0.25,
        ),
    ],
)
def test_a_recipe_builds_the_objective_it_names(keys, cls, attribute, value):
    model = build_training_model(_attack_section(**keys), dense_classifier())
    assert type(model) is cls
    assert getattr(model, attribute) == value


def test_an_unknown_objective_option_names_the_key_and_the_options():
    with pytest.raises(RecipeError) as info:
        _attack_section(method="pgd", objective="trades", objective_options={"bta": 1})
    message = str(info.value)
    assert "'attack.objective_options'" in message
    assert "objective 'trades' takes no option 'bta'. Did you mean 'beta'?" in message
    assert "Its options: beta. Received: attack.objective_options.bta=1" in message
    assert "\n" not in message


def test_an_objective_option_cannot_stand_in_for_an_attack_key():
    with pytest.raises(RecipeError, match="'adv_weight' is not an option"):
        _attack_section(
            method="fgsm", objective="grad_align", objective_options={"adv_weight": 1}
        )


def test_trades_needs_its_pgd_and_every_objective_an_attack():
    with pytest.raises(RecipeError, match="objective trades maximises its loss"):
        _attack_section(method="fgsm_rs", objective="trades")
    with pytest.raises(RecipeError, match="objective trades needs a training attack"):
        _attack_section(method="none", objective="trades")


def test_an_objective_that_refuses_its_options_names_the_recipe_key():
    recipe = _attack_section(
        method="pgd", objective="trades", objective_options={"beta": -1.0}
    )
    with pytest.raises(RecipeError) as info:
        build_training_model(recipe, dense_classifier())
    assert str(info.value).startswith("attack.objective: trades: beta must be >= 0")


@pytest.mark.parametrize(
    "keys, renamed",
    [
        ({"method": "trades"}, "'attack.method: trades' was renamed 'attack.objective"),
        ({"beta": 1.0}, "'attack.beta' was renamed 'attack.objective_options.beta'"),
        (
            {"grad_align": 0.2},
            "'attack.grad_align' was renamed 'attack.objective: grad_align'",
        ),
    ],
)
def test_the_old_spellings_say_their_new_names(keys, renamed):
    with pytest.raises(RecipeError) as info:
        _attack_section(**keys)
    assert str(info.value).startswith(f"r.yaml: {renamed}")


# ---------------------------------------------------------------- as users run it


@pytest.mark.parametrize(
    "objective, method, options, banner, step",
    [
        ("trades", "pgd", {"beta": 2.0}, "objective=trades beta=2", "TRADES overrides"),
        (
            "grad_align",
            "fgsm",
            {"grad_align": 0.5},
            "objective=grad_align grad_align=0.5",
            "GradAlign overrides adversarial_loss",
        ),
    ],
)
def test_advtrain_run_trains_the_objective_a_recipe_names(
    tmp_path, objective, method, options, banner, step
):
    recipe = {
        "name": objective,
        "data": {"source": "digits", "limit_train": 64, "limit_test": 32},
        "model": {"backbone": "small_cnn", "width": 4},
        "attack": {
            "method": method,
            "eps": 0.1,
            **({"steps": 1} if method == "pgd" else {}),
            "objective": objective,
            "objective_options": options,
        },
        "train": {"epochs": 1, "batch_size": 32},
        "eval": {"attacks": ["fgsm"], "sanity_examples": 0},
        "output": {"tensorboard": False, "plots": False, "export_saved_model": False},
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    done = run_console(tmp_path, "run", "r.yaml", "-o", "out")
    assert banner in done.stdout
    assert step in done.stdout
    with open(tmp_path / "out" / "history.csv") as handle:
        logged = next(csv.DictReader(handle))
    # TRADES logs its KL term as adv_loss; GradAlign its penalty too.
    assert float(logged["adv_loss"]) >= 0.0
    if objective == "grad_align":
        assert float(logged["grad_align_loss"]) >= 0.0
    saved = yaml.safe_load((tmp_path / "out" / "recipe.yaml").read_text())
    assert saved["attack"]["objective"] == objective
    assert saved["attack"]["objective_options"] == options
