"""The BatchNorm policy as users meet it: an empty or minimal recipe, a run
with `recalibrate: true`, and `AdversarialModel` around a user's own CNN."""

import warnings

import keras
import numpy as np
import pytest

from advtrain.attacks import Attack
from advtrain.models.adversarial import AdversarialModel
from advtrain.models.batchnorm.options import BatchNormOptions
from advtrain.models.batchnorm.policy import (
    apply_batchnorm_policy,
    auto_momentum,
    batchnorm_layers,
    bn_gap,
    bn_gap_warning,
    fit_total_steps,
    recalibrate_batchnorm,
    set_momentum,
    settle_batchnorm,
)
from advtrain.recipe.loader import load_recipe, recipe_from_dict
from advtrain.recipe.run import run

# A run small enough for seconds: no PGD, no sanity checks, no artifacts
# beyond model.keras and metrics.json.
QUIET = {
    "eval": {"attacks": ["fgsm"], "sanity_examples": 0},
    "output": {"tensorboard": False, "plots": False, "export_saved_model": False},
}


def user_cnn(seed=0, second_momentum=None):
    """A user's own BN CNN, BN at Keras's default momentum."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(16, 3, padding="same")(inputs)
    h = keras.layers.BatchNormalization(name="bn1")(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.Conv2D(32, 3, strides=2, padding="same")(h)
    kwargs = {} if second_momentum is None else {"momentum": second_momentum}
    h = keras.layers.BatchNormalization(name="bn2", **kwargs)(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, keras.layers.Dense(10)(h))


# ---------------------------------------------------------------- momentum


def test_auto_momentum_follows_the_run_length():
    # Horizon 1 / (1 - m) = 5% of the run, clamped to [0.9, 0.99].
    assert auto_momentum(1_000) == pytest.approx(0.98)
    assert auto_momentum(500) == pytest.approx(0.96)
    assert auto_momentum(220) == pytest.approx(1 - 1 / 11, abs=1e-4)
    assert auto_momentum(66) == 0.9  # 3 epochs of the digits
    assert auto_momentum(2_000) == auto_momentum(10**6) == 0.99
    assert auto_momentum(None) == 0.9
    # Shorter than ~45 steps: the initial statistics fade to 1% by the end.
    assert auto_momentum(20) ** 20 == pytest.approx(0.01, rel=1e-3)
    assert auto_momentum(1) == 0.5
    steps = [1, 5, 20, 45, 100, 300, 1_000, 5_000]
    values = [auto_momentum(s) for s in steps]
    assert values == sorted(values) and max(values) <= 0.99
    with pytest.raises(ValueError, match="Received: total_steps=0"):
        auto_momentum(0)


def test_momentum_auto_number_or_keep():
    model = user_cnn(second_momentum=0.95)
    apply_batchnorm_policy(model, momentum=None, fused_kernel=False)
    assert [bn.momentum for bn in batchnorm_layers(model)] == [0.99, 0.95]
    apply_batchnorm_policy(model, total_steps=500)  # auto, the default
    assert [bn.momentum for bn in batchnorm_layers(model)] == [0.96, 0.95]
    apply_batchnorm_policy(model, momentum=0.8)
    assert [bn.momentum for bn in batchnorm_layers(model)] == [0.8, 0.8]


def test_empty_recipe_is_the_safe_defaults(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    bn = load_recipe(empty).model.batchnorm
    assert (bn.momentum, bn.recalibrate, bn.fused_kernel) == ("auto", "auto", True)


def test_auto_is_the_one_default_everywhere():
    assert BatchNormOptions().momentum == "auto"
    assert recipe_from_dict({}, "empty").model.batchnorm.momentum == "auto"
    assert AdversarialModel(user_cnn(), adv_weight=0).batchnorm_momentum == "auto"
    for bad in ("fast", 1.0, True):
        with pytest.raises(ValueError, match="must be 'auto', a number in"):
            apply_batchnorm_policy(user_cnn(), momentum=bad)
        with pytest.raises(ValueError, match="Received: batchnorm_momentum="):
            AdversarialModel(user_cnn(), adv_weight=0, batchnorm_momentum=bad)
        with pytest.raises(ValueError, match="'model.batchnorm(.momentum)?'"):
            recipe_from_dict({"model": {"batchnorm": {"momentum": bad}}}, "r")


def test_adapt_was_renamed_auto():
    renamed = "'adapt' was renamed 'auto' in 0.3"
    with pytest.raises(ValueError, match=renamed):
        apply_batchnorm_policy(user_cnn(), momentum="adapt")
    with pytest.raises(ValueError, match=renamed):
        BatchNormOptions(momentum="adapt")
    with pytest.raises(ValueError, match=f"batchnorm_momentum: {renamed}"):
        AdversarialModel(user_cnn(), adv_weight=0, batchnorm_momentum="adapt")
    with pytest.raises(ValueError, match=f"'model.batchnorm.*{renamed}"):
        recipe_from_dict({"model": {"batchnorm": {"momentum": "adapt"}}}, "r")
    # A model saved by 0.2 holds "adapt" in its config, and still loads.
    config = AdversarialModel(user_cnn(), adv_weight=0).get_config()
    config["batchnorm_momentum"] = "adapt"
    assert AdversarialModel.from_config(config).batchnorm_momentum == "auto"


def test_auto_keeps_momenta_someone_chose():
    model = user_cnn(second_momentum=0.95)
    note = set_momentum(model, "auto", total_steps=66)
    assert [bn.momentum for bn in batchnorm_layers(model)] == [0.9, 0.95]
    assert "0.99 (Keras's default) -> 0.9 on 1 layer(s)" in note
    assert "66 steps" in note and "\n" not in note
    assert set_momentum(model, "auto", total_steps=66) is None  # none at 0.99
    assert set_momentum(user_cnn(), "auto", total_steps=10**5) is None  # 0.99 suits


def test_fit_total_steps_reads_keras_fit_arguments():
    import tensorflow as tf

    x = np.zeros((100, 2), "float32")
    assert fit_total_steps(x, batch_size=32, epochs=3) == 12
    assert fit_total_steps(x, epochs=2) == 8  # Keras's default batch 32
    assert fit_total_steps(x, batch_size=10, validation_split=0.2) == 8
    assert fit_total_steps(x, epochs=5, initial_epoch=3, steps_per_epoch=7) == 14
    ds = tf.data.Dataset.from_tensor_slices(x).batch(25)
    assert fit_total_steps(ds, epochs=2) == 8
    assert fit_total_steps(ds.repeat(), epochs=2) is None


# ---------------------------------------------------------------- the gap


def test_gap_warning_advice_follows_the_actual_setting():
    keras_default = bn_gap_warning(0.3, momentum=0.99)
    assert "momentum: 0.9 (now 0.99)" in keras_default
    assert "recalibrate: true" in keras_default
    already = bn_gap_warning(0.3, momentum=0.9)
    assert "momentum: 0.9 " not in already and "momentum: 0.8 (now 0.9)" in already
    after = bn_gap_warning(0.3, momentum=0.9, recalibrated=True)
    assert "momentum:" not in after and "recalibrate: true" not in after
    assert "even after recalibration" in after and "batch_size" in after
    noisy = bn_gap_warning(-0.3, momentum=0.9)
    assert "momentum:" not in noisy and "batch_size" in noisy
    for message in (keras_default, already, after, noisy):
        assert "\n" not in message
    assert bn_gap_warning(0.04, momentum=0.99) is None


def _stale_model(digits):
    """60 steps at momentum 0.99: moving statistics far behind."""
    x, y = digits
    model = user_cnn()
    model.compile(
        keras.optimizers.Adam(3e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    model.fit(x[:1280], y[:1280], batch_size=64, epochs=3, verbose=0, shuffle=False)
    return model


def test_settle_recalibrates_when_the_gap_is_large(digits):
    x, y = digits
    model = _stale_model(digits)
    held_out = x[1400:], y[1400:]
    batches = [(x[i : i + 64], y[i : i + 64]) for i in range(0, 1280, 64)]
    stats = [bn.moving_mean.numpy().copy() for bn in batchnorm_layers(model)]

    kept = settle_batchnorm(model, *held_out, 64, batches, recalibrate=False)
    assert kept["recalibrated"] == 0 and kept["gap"] > 0.3
    assert "recalibrate: true" in kept["warning"]
    high = settle_batchnorm(model, *held_out, 64, batches, gap_threshold=0.99)
    assert high["recalibrated"] == 0  # auto, gap under the threshold
    for bn, before in zip(batchnorm_layers(model), stats, strict=True):
        np.testing.assert_array_equal(bn.moving_mean.numpy(), before)

    report = settle_batchnorm(model, *held_out, 64, batches)
    assert report["recalibrated"] == 20
    assert report["before"]["gap"] > 0.3
    assert abs(report["gap"]) <= 0.02 and report["warning"] is None
    assert report["inference_mode_accuracy"] > 0.8


# ---------------------------------------------------------------- runs


def test_minimal_recipe_ends_without_a_gap(tmp_path):
    recipe = recipe_from_dict(
        {"name": "minimal", "train": {"epochs": 3}, **QUIET}, "minimal"
    )
    lines = []
    result = run(recipe, tmp_path / "run", echo=lines.append)
    gap = result.metrics["bn_gap"]
    print(f"\nminimal recipe bn_gap: {gap}")
    assert "batchnorm: momentum 0.9 (model.batchnorm.momentum: auto)" in lines
    # The settle step's own line, as `advtrain.fit` echoes it.
    assert f"bn_gap: {100 * gap['gap']:+.2f} points" in lines
    # Momentum alone closes it; recalibration (auto) was not needed.
    assert gap["recalibrated"] == 0
    assert abs(gap["gap"]) <= 0.02
    assert gap["inference_mode_accuracy"] > 0.9


def test_recalibrate_true_saves_the_recalibrated_model(tmp_path):
    from advtrain.data import make_input
    from advtrain.recipe.build import input_options, recipe_splits
    from advtrain.recipe.saved import load_classifier

    recipe = recipe_from_dict(
        {
            "name": "recal",
            "data": {"limit_train": 256},
            "model": {"width": 8, "batchnorm": {"momentum": 0.99, "recalibrate": True}},
            "train": {"epochs": 1},
            **QUIET,
        },
        "recal",
    )
    lines = []
    result = run(recipe, tmp_path / "run", echo=lines.append)
    gap = result.metrics["bn_gap"]
    assert gap["recalibrated"] == 4  # 256 examples / batch 64
    assert (
        f"bn_gap: {100 * gap['gap']:+.2f} points after recalibrating on 4 clean "
        f"training batch(es) ({100 * gap['before']['gap']:+.2f} before)"
    ) in lines
    assert "warning" not in gap  # echoed, not written to metrics.json
    assert set(gap["before"]) == {
        "train_mode_accuracy",
        "inference_mode_accuracy",
        "gap",
    }

    saved = load_classifier(tmp_path / "run" / "model.keras")
    stats = [
        (bn.moving_mean.numpy().copy(), bn.moving_variance.numpy().copy())
        for bn in batchnorm_layers(saved)
    ]
    # Recalibration depends on the weights and data only, so running it
    # again on the saved model changes nothing if the file was written
    # after it (and a great deal if before).
    splits = recipe_splits(recipe)
    clean = make_input(
        splits.train, batch_size=64, training=False, **input_options(recipe)
    )
    recalibrate_batchnorm(saved, clean, num_batches=50)
    for bn, (mean, variance) in zip(batchnorm_layers(saved), stats, strict=True):
        np.testing.assert_allclose(bn.moving_mean.numpy(), mean, atol=1e-5)
        np.testing.assert_allclose(bn.moving_variance.numpy(), variance, atol=1e-5)


# ---------------------------------------------------------------- Python API


def _compile(model):
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def test_adversarial_model_on_a_user_cnn_ends_without_a_gap(digits, tmp_path):
    x, y = digits
    classifier = user_cnn(second_momentum=0.95)
    weights = [w.copy() for w in classifier.get_weights()]
    model = _compile(AdversarialModel(classifier, Attack("fgsm", eps=0.1), 0.5, seed=0))
    # The user's layers keep their class (the fused kernel runs only
    # inside the steps) and their weights.
    assert all(
        type(bn) is keras.layers.BatchNormalization for bn in batchnorm_layers(model)
    )
    for old, new in zip(weights, classifier.get_weights(), strict=True):
        np.testing.assert_array_equal(old, new)

    with pytest.warns(UserWarning, match=r"0\.99 \(Keras's default\) -> 0\.9 on 1"):
        model.fit(x[:1400], y[:1400], batch_size=64, epochs=3, verbose=0)
    assert [bn.momentum for bn in batchnorm_layers(classifier)] == [0.9, 0.95]
    gap = bn_gap(classifier, x[1400:], y[1400:], batch_size=64)
    print(f"\nAdversarialModel on a user CNN, bn_gap: {gap}")
    assert abs(gap["gap"]) <= 0.02
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, on the first fit only
        model.fit(x[:128], y[:128], batch_size=64, epochs=1, verbose=0)

    assert all(
        type(bn) is keras.layers.BatchNormalization for bn in batchnorm_layers(model)
    )
    # .keras files of the trained model load (the wrapper too) and agree.
    classifier.save(tmp_path / "classifier.keras")
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "classifier.keras")
    wrapper = keras.saving.load_model(tmp_path / "model.keras")
    expected = classifier.predict(x[:32], verbose=0)
    np.testing.assert_allclose(loaded.predict(x[:32], verbose=0), expected, atol=1e-5)
    np.testing.assert_allclose(wrapper.predict(x[:32], verbose=0), expected, atol=1e-5)


def test_adversarial_model_opt_outs():
    classifier = user_cnn()
    model = _compile(
        AdversarialModel(
            classifier,
            Attack("fgsm", eps=0.1),
            fused_batchnorm=False,
            batchnorm_momentum=None,
        )
    )
    x = np.zeros((64, 8, 8, 1), "float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.fit(x, np.zeros(64, "int64"), batch_size=32, epochs=1, verbose=0)
    layers = batchnorm_layers(classifier)
    assert all(type(bn) is keras.layers.BatchNormalization for bn in layers)
    assert [bn.momentum for bn in layers] == [0.99, 0.99]
    config = model.get_config()
    assert not config["fused_batchnorm"] and config["batchnorm_momentum"] is None
    with pytest.raises(ValueError, match="Received: batchnorm_momentum=1.5"):
        AdversarialModel(user_cnn(), Attack("fgsm", eps=0.1), batchnorm_momentum=1.5)
