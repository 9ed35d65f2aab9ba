"""reuse_gradient="auto": the gradient-reusing step exactly for plain FGSM
with a clean loss term, never for a subclass overriding a hook it bypasses."""

import keras
import numpy as np
import pytest
from helpers import bn_classifier, dense_classifier, sgd_compiled

import advtrain
from advtrain.attacks import Attack
from advtrain.models import TRADES, AdversarialModel, GradAlign
from advtrain.models.reuse_gradient import REUSE_GRADIENT_BYPASSES
from advtrain.recipe.build import build_training_model
from advtrain.recipe.loader import recipe_from_dict
from advtrain.recipe.schema import AttackConfig
from advtrain.utils.errors import ArgumentError


@pytest.mark.parametrize(
    "attack, adv_weight, fused, why",
    [
        (Attack("fgsm", eps=0.1), 0.5, True, "plain FGSM"),
        (Attack("fgsm", eps=0.1), 0.3, True, "plain FGSM"),
        (Attack("fgsm_rs", eps=0.1), 0.5, False, "method fgsm_rs"),
        (Attack("n_fgsm", eps=0.1), 0.5, False, "method n_fgsm"),
        (Attack("pgd", eps=0.1, steps=2), 0.5, False, "method pgd"),
        (Attack("fgsm", eps=0.1, backend="cleverhans"), 0.5, False, "cleverhans"),
        (Attack("fgsm", eps=0.1), 1.0, False, "no clean loss term"),
        (Attack("fgsm", eps=0.1), 0.0, False, "no attack"),
    ],
)
def test_auto_uses_the_fused_step_exactly_for_plain_fgsm_with_a_clean_term(
    attack, adv_weight, fused, why
):
    model = AdversarialModel(dense_classifier(), attack, adv_weight)
    assert model.reuse_gradient_step is fused
    assert why in model.step_note and "auto" in model.step_note
    assert model.step_note.startswith(
        "gradient-reusing step" if fused else ("attack", "clean")
    )


class GenerateHook(AdversarialModel):
    def generate_adversarial(self, x, y, attack=None):
        self.called = True
        return super().generate_adversarial(x, y, attack)


class LossHook(AdversarialModel):
    def adversarial_loss(self, x, y, y_pred, x_adv, y_pred_adv, sample_weight):
        self.called = True
        return super().adversarial_loss(x, y, y_pred, x_adv, y_pred_adv, sample_weight)


class ModelFnHook(AdversarialModel):
    def attack_model_fn(self, inputs):
        self.called = True
        return super().attack_model_fn(inputs)


class LossScaleHook(AdversarialModel):
    def attack_loss_scale(self):
        self.called = True
        return super().attack_loss_scale()


SUBCLASSES = {
    "generate_adversarial": GenerateHook,
    "adversarial_loss": LossHook,
    "attack_model_fn": ModelFnHook,
    "attack_loss_scale": LossScaleHook,
}


@pytest.mark.parametrize("hook", REUSE_GRADIENT_BYPASSES)
def test_a_subclass_overriding_a_bypassed_hook_gets_the_inference_step(hook):
    cls = SUBCLASSES[hook]
    model = sgd_compiled(cls(dense_classifier(), Attack("fgsm", eps=0.1), 0.5))
    assert model.reuse_gradient_step is False
    assert f"{cls.__name__} overrides {hook}" in model.step_note
    model.called = False
    rng = np.random.default_rng(0)
    model.train_on_batch(rng.random((8, 8, 8, 1), "float32"), np.arange(8) % 10)
    assert model.called  # its hook ran: the step it trains with is not fused
    with pytest.raises(ValueError, match=f"overrides {hook}"):
        cls(dense_classifier(), Attack("fgsm", eps=0.1), 0.5, reuse_gradient=True)


def test_trades_and_grad_align_keep_their_own_step():
    for model in (
        TRADES(dense_classifier(), Attack("fgsm", eps=0.1)),
        GradAlign(dense_classifier(), Attack("fgsm", eps=0.1), adv_weight=0.5),
    ):
        assert model.reuse_gradient_step is False
        assert "overrides" in model.step_note


def test_true_and_false_still_force_and_other_values_are_refused():
    forced = AdversarialModel(
        dense_classifier(), Attack("fgsm_rs", eps=0.1), 0.5, reuse_gradient=True
    )
    assert (
        forced.reuse_gradient_step is True and "reuse_gradient=True" in forced.step_note
    )
    off = AdversarialModel(
        dense_classifier(), Attack("fgsm", eps=0.1), 0.5, reuse_gradient=False
    )
    assert off.reuse_gradient_step is False and "reuse_gradient=False" in off.step_note
    with pytest.raises(
        ValueError, match="reuse_gradient: must be True, False or 'auto'"
    ):
        AdversarialModel(
            dense_classifier(), Attack("fgsm", eps=0.1), reuse_gradient="yes"
        )


def test_the_default_trains_exactly_as_the_fused_step(digits):
    # BatchNorm in training mode tells the steps apart: the fused step's
    # input gradient sees batch statistics, the other step's moving ones.
    x, y = digits[0][:64], digits[1][:64]
    models = {
        fused: sgd_compiled(
            AdversarialModel(bn_classifier(seed=2), Attack("fgsm", eps=0.1), 0.5, **kw)
        )
        for fused, kw in (
            ("auto", {}),
            (True, {"reuse_gradient": True}),
            (False, {"reuse_gradient": False}),
        )
    }
    for _ in range(2):
        for model in models.values():
            model.train_on_batch(x, y)
    weights = {k: m.classifier.get_weights() for k, m in models.items()}
    for a, b in zip(weights["auto"], weights[True], strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(
        not np.allclose(a, b, atol=1e-6)
        for a, b in zip(weights["auto"], weights[False], strict=True)
    )


def test_without_batchnorm_the_two_steps_are_the_same_algorithm(digits):
    # No BatchNorm, no dropout: the clean pass's input gradient is the one
    # the inference-mode attack computes, so the two steps agree up to float
    # rounding (README: why MNIST runs of the two still drift apart).
    x, y = digits[0][:64], digits[1][:64]
    weights = []
    for fused in (True, False):
        model = sgd_compiled(
            AdversarialModel(
                dense_classifier(seed=3),
                Attack("fgsm", eps=0.1),
                0.5,
                reuse_gradient=fused,
            )
        )
        for _ in range(3):
            model.train_on_batch(x, y)
        weights.append(model.classifier.get_weights())
    for a, b in zip(*weights, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_config_round_trip_keeps_the_choices(tmp_path):
    model = sgd_compiled(
        AdversarialModel(
            dense_classifier(), Attack("fgsm", eps=0.1), check_inputs=False
        )
    )
    model.train_on_batch(np.zeros((4, 8, 8, 1), "float32"), np.zeros(4, "int32"))
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.reuse_gradient == "auto" and loaded.reuse_gradient_step is True
    assert loaded.check_inputs is False


@pytest.mark.parametrize(
    "attack, fused",
    [
        ({"method": "fgsm"}, True),
        ({"method": "fgsm", "reuse_gradient": False}, False),
        ({"method": "fgsm_rs"}, False),
        ({"method": "fgsm_rs", "reuse_gradient": True}, True),
        ({"method": "fgsm", "adv_weight": 1.0}, False),
        ({"method": "fgsm", "objective": "grad_align"}, False),
        ({"method": "pgd", "objective": "trades"}, False),
    ],
)
def test_recipe_fused_step_auto(attack, fused):
    recipe = recipe_from_dict({"name": "t", "attack": attack})
    assert AttackConfig().reuse_gradient == "auto"
    model = build_training_model(recipe, dense_classifier())
    assert model.reuse_gradient_step is fused


def test_recipe_refuses_forcing_the_fused_step_for_pgd():
    with pytest.raises(
        ValueError, match="attack.reuse_gradient: reuse_gradient=True needs a"
    ):
        recipe_from_dict(
            {"name": "t", "attack": {"method": "pgd", "reuse_gradient": True}}
        )


def test_fit_prints_the_step_and_why():
    lines = []
    rng = np.random.default_rng(0)
    advtrain.fit(
        dense_classifier,
        (rng.random((32, 8, 8, 1), "float32"), np.arange(32) % 10),
        attack=Attack("fgsm", eps=0.1),
        batch_size=16,
        runtime={"strategy": "default"},
        echo=lines.append,
    )
    step = [line for line in lines if line.startswith("step: ")]
    assert step == [
        "step: gradient-reusing step, 2 forward + 2 backward passes (auto: "
        "plain FGSM from the clean point, 0 < adv_weight < 1)"
    ]


def test_the_old_fused_keyword_is_refused_naming_its_new_name():
    with pytest.raises(TypeError, match="`fused` was renamed `reuse_gradient` in 0.3"):
        AdversarialModel(dense_classifier(), Attack("fgsm", eps=0.1), fused=True)
    with pytest.raises(TypeError, match="`fused` was renamed `reuse_gradient`"):
        AdversarialModel.check_arguments(Attack("fgsm", eps=0.1), fused=False)


def test_an_unknown_keyword_is_refused_with_did_you_mean():
    with pytest.raises(TypeError, match="Did you mean 'reuse_gradient'"):
        AdversarialModel(
            dense_classifier(), Attack("fgsm", eps=0.1), reuse_gradiant=True
        )


def test_a_config_saved_by_0_2_with_fused_loads():
    model = AdversarialModel(dense_classifier(), Attack("fgsm", eps=0.1))
    config = model.get_config()
    config["fused"] = config.pop("reuse_gradient")
    config["fused"] = False
    loaded = AdversarialModel.from_config(config)
    assert loaded.reuse_gradient is False and loaded.reuse_gradient_step is False
    assert "fused" not in loaded.get_config()


def test_a_0_2_attack_config_drops_the_fields_its_method_never_took():
    model = AdversarialModel(dense_classifier(), Attack("fgsm", eps=0.1))
    config = model.get_config()
    # 0.2 saved every method's fields, most at defaults fgsm never took.
    config["attack"].update(alpha=None, steps=10, restarts=1, options={})
    loaded = AdversarialModel.from_config(config)
    assert loaded.attack == Attack("fgsm", eps=0.1)
    with pytest.raises(ArgumentError, match="fgsm does not take alpha"):
        Attack.from_config(config["attack"])  # strict outside a saved model
