"""GradAlign: the gradient-alignment penalty on top of AdversarialModel."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from advtrain.attacks import Attack
from advtrain.models import AdversarialModel, GradAlign
from advtrain.models.objectives.grad_align import _cosine
from advtrain.recipe.loader import load_recipe
from advtrain.recipe.schema import RecipeError


def _classifier(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((4, 4, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(3),
        ]
    )


def _data():
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(32, 4, 4, 1)).astype("float32")
    return x, rng.integers(0, 3, 32).astype("int32")


def _compiled(model):
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
    return model


def test_cosine_per_example():
    a = tf.constant([[1.0, 0.0], [1.0, 1.0]])
    b = tf.constant([[0.0, 2.0], [3.0, 3.0]])
    np.testing.assert_allclose(_cosine(a, b), [0.0, 1.0], atol=1e-6)


def test_penalty_is_within_0_and_2_and_its_gradient_reaches_the_weights():
    model = _compiled(GradAlign(_classifier(), Attack("fgsm", eps=0.3),
                                adv_weight=1.0, grad_align=1.0, seed=1))  # fmt: skip
    x, y = _data()
    model(x)
    logits = model(x, training=True)
    total = model.adversarial_loss(x, y, None, x, logits, None)
    base = AdversarialModel.adversarial_loss(model, x, y, None, x, logits, None)
    penalty = float(total - base)
    assert 0.0 < penalty <= 2.0
    # Double backpropagation: the penalty alone has a gradient w.r.t. the
    # first layer's kernel (the input gradient depends on it).
    with tf.GradientTape() as tape:
        model(x, training=True)
        only = model.adversarial_loss(x, y, None, x, model(x), None) - (
            AdversarialModel.adversarial_loss(model, x, y, None, x, model(x), None)
        )
    kernel = model.classifier.layers[1].kernel
    grad = tape.gradient(only, kernel)
    assert grad is not None and float(tf.reduce_max(tf.abs(grad))) > 0


def test_weight_zero_is_plain_adversarial_training():
    x, y = _data()
    plain = _compiled(AdversarialModel(_classifier(), Attack("fgsm", eps=0.1),
                                       adv_weight=1.0, seed=1))  # fmt: skip
    aligned = _compiled(GradAlign(_classifier(), Attack("fgsm", eps=0.1),
                                  adv_weight=1.0, grad_align=0.0, seed=1))  # fmt: skip
    h1 = plain.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    h2 = aligned.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    np.testing.assert_allclose(h1.history["loss"], h2.history["loss"], rtol=1e-5)


def test_training_logs_the_penalty_and_round_trips_through_keras_saving(tmp_path):
    x, y = _data()
    model = _compiled(GradAlign(_classifier(), Attack("fgsm_rs", eps=0.2),
                                adv_weight=1.0, grad_align=0.5, seed=1))  # fmt: skip
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    logged = history.history["grad_align_loss"]
    assert (
        all(0.0 <= v <= 2.0 for v in logged)
        and np.isfinite(history.history["loss"]).all()
    )
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, GradAlign) and loaded.grad_align == 0.5
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-5
    )


def test_bad_weights_are_refused():
    with pytest.raises(ValueError, match="grad_align must be >= 0"):
        GradAlign(_classifier(), Attack("fgsm", eps=0.1), grad_align=-1.0)
    with pytest.raises(ValueError, match="GradAlign needs an attack"):
        GradAlign(_classifier(), None, adv_weight=0.0)


def test_recipe_builds_gradalign_and_refuses_it_without_an_attack(tmp_path):
    from advtrain.recipe.build import build_training_model

    path = tmp_path / "r.yaml"
    path.write_text(
        "attack: {method: fgsm, eps: 0.1, objective: grad_align,"
        " objective_options: {grad_align: 0.3}}\n"
    )
    model = build_training_model(load_recipe(path), _classifier())
    assert isinstance(model, GradAlign) and model.grad_align == 0.3
    path.write_text("attack: {method: none, objective: grad_align}\n")
    with pytest.raises(RecipeError, match="objective grad_align needs a training"):
        load_recipe(path)


@pytest.mark.parametrize("clip_noise", [False, True])
def test_clip_noise_keeps_the_noisy_point_in_the_pixel_range(clip_noise):
    model = _compiled(GradAlign(_classifier(), Attack("fgsm", eps=0.3),
                                adv_weight=1.0, grad_align=1.0, seed=1,
                                clip_noise=clip_noise))  # fmt: skip
    x, y = _data()
    x[:16] = 0.0  # at the range's edge: half of eta points outside it
    seen = []
    gradient = model._input_gradient
    model._input_gradient = lambda inputs, labels: (
        seen.append(inputs.numpy()) or gradient(inputs, labels)
    )
    model(x)
    model.adversarial_loss(x, y, None, x, model(x, training=True), None)
    noisy = seen[1]  # the clean gradient first, then the noisy point's
    assert noisy.min() >= 0.0 if clip_noise else noisy.min() < -0.1
    assert noisy.max() <= 1.0 if clip_noise else noisy.max() > 1.0
    again = GradAlign.from_config(model.get_config())
    assert again.clip_noise is clip_noise
