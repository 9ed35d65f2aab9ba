"""The eps ramp scales the training attack only, from the step counter."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import dense_classifier

from advtrain.attacks import Attack
from advtrain.models import AdversarialModel
from advtrain.models.attack_then_train import ramp_scale, scaled_attack
from advtrain.recipe.build import build_training_model
from advtrain.recipe.loader import recipe_from_dict
from advtrain.recipe.schema import RecipeError

EPS = 0.2
RAMP = 4


class Recording(AdversarialModel):
    """Keeps the largest perturbation of the last adversarial batch."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = keras.Variable(0.0, trainable=False, name="seen")

    def generate_adversarial(self, x, y, attack=None):
        x_adv = super().generate_adversarial(x, y, attack)
        self.seen.assign(tf.reduce_max(tf.abs(x_adv - x)))
        return x_adv


def _model(seed=0, ramp=RAMP):
    model = Recording(
        dense_classifier(seed=seed), Attack("fgsm", eps=EPS), 1.0, eps_ramp_steps=ramp
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


@pytest.fixture
def batch(digits):
    # Mid-grey pixels: a full FGSM step never meets the [0, 1] clip.
    x = np.full((16, 8, 8, 1), 0.5, np.float32) + 0.1 * digits[0][:16]
    return x.astype(np.float32), digits[1][:16]


def test_scale_grows_linearly_then_stays_at_one():
    got = [float(ramp_scale(t, RAMP)) for t in (0, 1, 3, 10)]
    assert got == pytest.approx([0.25, 0.5, 1.0, 1.0])


def test_scaled_attack_scales_eps_and_set_step_sizes_only():
    scaled = scaled_attack(Attack("fgsm_rs", eps=0.3, alpha=0.375), 0.5)
    assert float(scaled.eps) == pytest.approx(0.15)
    assert float(scaled.alpha) == pytest.approx(0.1875)
    assert scaled_attack(Attack("pgd", eps=0.3), 0.5).step_size is None


def test_training_perturbation_is_scale_times_eps_evaluation_is_full(batch):
    x, y = batch
    model = _model()
    for step in range(RAMP + 1):
        model.train_on_batch(x, y)
        scale = min(1.0, (step + 1) / RAMP)
        assert float(model.seen) == pytest.approx(scale * EPS, rel=1e-5), step
        if step == 0:
            model.evaluate(x, y, verbose=0)
            assert float(model.seen) == pytest.approx(EPS, rel=1e-5)
    assert model.attack.eps == EPS  # the full attack is back after each step


def test_resumed_model_continues_the_ramp_from_the_step_counter(batch):
    x, y = batch
    first = _model()
    for _ in range(2):
        first.train_on_batch(x, y)
    config = first.get_config()
    assert config["eps_ramp_steps"] == RAMP
    resumed = _model(seed=1, ramp=config["eps_ramp_steps"])
    resumed.train_on_batch(x, y)  # builds the optimizer
    resumed.optimizer.iterations.assign(first.optimizer.iterations)
    resumed.train_on_batch(x, y)
    assert float(resumed.seen) == pytest.approx(3 / RAMP * EPS, rel=1e-5)


def test_no_ramp_trains_at_full_eps_from_the_first_step(batch):
    model = _model(ramp=0)
    model.train_on_batch(*batch)
    assert float(model.seen) == pytest.approx(EPS, rel=1e-5)


def test_recipe_ramp_epochs_become_steps():
    recipe = recipe_from_dict(
        {"attack": {"method": "fgsm_rs", "eps": 0.1, "eps_ramp_epochs": 1.5}}
    )
    model = build_training_model(recipe, dense_classifier(), steps_per_epoch=10)
    assert model.eps_ramp_steps == 15


@pytest.mark.parametrize(
    "attack", [{"method": "none"}, {"method": "pgd", "backend": "cleverhans"}]
)
def test_recipe_ramp_needs_an_advtrain_training_attack(attack):
    with pytest.raises(RecipeError, match="eps_ramp_epochs"):
        recipe_from_dict({"attack": {**attack, "eps_ramp_epochs": 2}})


def test_bad_ramp_steps_is_one_line_error():
    with pytest.raises(ValueError, match="Received: eps_ramp_steps=-1"):
        AdversarialModel(dense_classifier(), Attack("fgsm", eps=0.1), eps_ramp_steps=-1)
