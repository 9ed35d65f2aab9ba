"""AdversarialModel keeps Keras semantics and mixes the two losses."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import bn_classifier, dense_classifier

from advtrain.attacks import Attack, fgsm
from advtrain.models import AdversarialModel


def _compile(model, lr=0.05):
    model.compile(
        optimizer=keras.optimizers.SGD(lr),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _same_weights(a, b, atol=0.0):
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_allclose(wa, wb, atol=atol, rtol=0)


def test_adv_weight_zero_matches_plain_keras_step_for_step(digits):
    x, y = digits[0][:256], digits[1][:256]
    plain = _compile(bn_classifier(seed=3))
    wrapped_clf = bn_classifier(seed=3)
    wrapped = _compile(AdversarialModel(wrapped_clf, Attack("fgsm", eps=0.1), 0.0))
    _same_weights(plain, wrapped_clf)
    for step in range(4):
        xb, yb = x[step * 64 : (step + 1) * 64], y[step * 64 : (step + 1) * 64]
        logs_plain = plain.train_on_batch(xb, yb, return_dict=True)
        logs_adv = wrapped.train_on_batch(xb, yb, return_dict=True)
        _same_weights(plain, wrapped_clf, atol=1e-6)
        assert logs_adv["loss"] == pytest.approx(logs_plain["loss"], rel=1e-5)


@pytest.mark.parametrize("w", [0.3, 1.0])
def test_loss_is_the_weighted_mix(digits, w):
    x, y = tf.constant(digits[0][:64]), tf.constant(digits[1][:64])
    clf = dense_classifier(seed=1)
    model = _compile(AdversarialModel(clf, Attack("fgsm", eps=0.1), w))
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x_adv = fgsm(lambda z: clf(z, training=False), x, y, eps=0.1)
    clean_loss, adv_loss = float(ce(y, clf(x))), float(ce(y, clf(x_adv)))
    adv_accuracy = float(np.mean(np.argmax(clf(x_adv), -1) == y.numpy()))
    model.reset_metrics()
    logs = model.train_on_batch(x, y, return_dict=True)
    assert logs["loss"] == pytest.approx((1 - w) * clean_loss + w * adv_loss, rel=1e-5)
    assert logs["adv_loss"] == pytest.approx(adv_loss, rel=1e-5)
    # The accuracy on this batch's adversarial examples, before the update.
    assert logs["adv_accuracy"] == pytest.approx(adv_accuracy)


def test_attack_in_inference_mode_leaves_batchnorm_statistics(digits):
    x, y = tf.constant(digits[0][:64]), tf.constant(digits[1][:64])
    clf = bn_classifier()
    bn = next(
        layer
        for layer in clf.layers
        if isinstance(layer, keras.layers.BatchNormalization)
    )
    before = [v.numpy().copy() for v in (bn.moving_mean, bn.moving_variance)]
    model = AdversarialModel(clf, Attack("pgd", eps=0.1, steps=3), 0.5)
    model.generate_adversarial(x, y)
    after = [v.numpy() for v in (bn.moving_mean, bn.moving_variance)]
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    # The research option does update them: the test can tell the modes apart.
    train_mode = AdversarialModel(
        clf, Attack("pgd", eps=0.1, steps=3), 0.5, attack_mode="train"
    )
    train_mode.generate_adversarial(x, y)
    assert not np.allclose(before[0], bn.moving_mean.numpy())


def test_zero_sample_weights_leave_weights_unchanged(digits):
    x, y = digits[0][:32], digits[1][:32]
    clf = dense_classifier()
    model = _compile(AdversarialModel(clf, Attack("fgsm_rs", eps=0.1), 0.5))
    before = [w.copy() for w in clf.get_weights()]
    model.train_on_batch(x, y, sample_weight=np.zeros(32, "float32"))
    for a, b in zip(before, clf.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_fit_reports_clean_and_adversarial_metrics(digits):
    x, y = digits
    model = _compile(
        AdversarialModel(dense_classifier(), Attack("fgsm_rs", eps=0.1), 0.5), lr=0.3
    )
    history = model.fit(x[:512], y[:512], batch_size=32, epochs=4, verbose=0)
    for key in ("loss", "accuracy", "adv_accuracy", "clean_loss", "adv_loss"):
        assert key in history.history
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert history.history["accuracy"][-1] > history.history["adv_accuracy"][-1] - 0.05
    results = model.evaluate(x[512:640], y[512:640], verbose=0, return_dict=True)
    assert results["accuracy"] > 0.5
    assert model.predict(x[:5], verbose=0).shape == (5, 10)


def test_keras_round_trip(tmp_path, digits):
    x, y = digits
    model = _compile(
        AdversarialModel(bn_classifier(), Attack("pgd", eps=0.2, steps=2), 0.7)
    )
    model.fit(x[:128], y[:128], batch_size=64, epochs=1, verbose=0)
    path = tmp_path / "adv.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, AdversarialModel)
    assert loaded.adv_weight == 0.7
    assert loaded.attack == Attack("pgd", eps=0.2, steps=2)
    np.testing.assert_allclose(
        loaded.predict(x[:16], verbose=0), model.predict(x[:16], verbose=0), atol=1e-6
    )
    loaded.fit(x[:128], y[:128], batch_size=64, epochs=1, verbose=0)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(adv_weight=1.5), "adv_weight: must be between 0.0 and 1.0"),
        (dict(adv_weight=0.5, attack=None), "needs an attack"),
        (dict(attack_mode="eval"), "attack_mode: must be one of"),
        (dict(attack="fgsm"), "attack must be an advtrain.attacks.Attack"),
    ],
)
def test_constructor_validates(kwargs, message):
    args = dict(attack=Attack("fgsm", eps=0.1), adv_weight=0.5)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=message):
        AdversarialModel(dense_classifier(), **args)


def test_generate_adversarial_output_is_what_the_step_trains_on(digits):
    x, y = tf.constant(digits[0][:64]), tf.constant(digits[1][:64])

    class Brightened(AdversarialModel):
        def generate_adversarial(self, x, y, attack=None):
            return tf.clip_by_value(x + 0.3, 0.0, 1.0)

    clf = dense_classifier(seed=4)
    model = _compile(Brightened(clf, Attack("fgsm", eps=0.1), 0.5))
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    hooked = float(ce(y, clf(tf.clip_by_value(x + 0.3, 0.0, 1.0))))
    attacked = float(ce(y, clf(fgsm(lambda z: clf(z), x, y, eps=0.1))))
    assert abs(hooked - attacked) > 0.1  # the two are told apart
    clean = float(ce(y, clf(x)))
    logs = model.train_on_batch(x, y, return_dict=True)
    assert logs["adv_loss"] == pytest.approx(hooked, rel=1e-5)
    assert logs["loss"] == pytest.approx(0.5 * clean + 0.5 * hooked, rel=1e-5)


def test_adversarial_loss_output_is_the_loss_differentiated(digits):
    x, y = digits[0][:64], digits[1][:64]

    class Doubled(AdversarialModel):
        def adversarial_loss(self, *args):
            return 2.0 * super().adversarial_loss(*args)

    steps = {}
    for cls in (AdversarialModel, Doubled):
        clf = dense_classifier(seed=4)
        before = clf.get_weights()
        model = _compile(cls(clf, Attack("fgsm", eps=0.1), 0.5), lr=0.01)
        logs = model.train_on_batch(x, y, return_dict=True)
        steps[cls] = [a - b for a, b in zip(clf.get_weights(), before, strict=True)]
        steps[cls, "loss"] = logs["loss"]
    # SGD: twice the loss, twice the step.
    for single, double in zip(steps[AdversarialModel], steps[Doubled], strict=True):
        np.testing.assert_allclose(double, 2 * single, rtol=1e-4, atol=1e-7)
    assert steps[Doubled, "loss"] == pytest.approx(2 * steps[AdversarialModel, "loss"])


def test_fused_step_matches_unfused_on_batchnorm_free_model(digits):
    x, y = digits[0][:64], digits[1][:64]
    a = _compile(
        AdversarialModel(
            dense_classifier(seed=5), Attack("fgsm", eps=0.1), 0.5, reuse_gradient=False
        )
    )
    b = _compile(
        AdversarialModel(
            dense_classifier(seed=5), Attack("fgsm", eps=0.1), 0.5, reuse_gradient=True
        )
    )
    for _ in range(3):
        la = a.train_on_batch(x, y, return_dict=True)
        lb = b.train_on_batch(x, y, return_dict=True)
        _same_weights(a, b, atol=1e-5)
    assert la["loss"] == pytest.approx(lb["loss"], rel=1e-5)
    assert 0.0 <= lb["zero_grad_fraction"] < 0.5


def test_fused_needs_a_single_step_attack():
    with pytest.raises(
        ValueError, match="reuse_gradient=True needs a single-step attack"
    ):
        AdversarialModel(
            dense_classifier(), Attack("pgd", eps=0.1), 0.5, reuse_gradient=True
        )


def _confident_classifier():
    """At pixels near 0.5 logit 0 is 22 and logit 1 is 3.2: class 1's
    cross-entropy gradient (7e-9) underflows in float16 without a loss
    scale, and it is the only one that reaches the pixels."""
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Flatten()(inputs)
    kernel = np.zeros((64, 10), "float32")
    kernel[:, 0] = 22.0 / 32.0
    kernel[:, 1] = 0.1
    outputs = keras.layers.Dense(
        10, kernel_initializer=keras.initializers.Constant(kernel)
    )(h)
    return keras.Model(inputs, outputs)


@pytest.fixture
def float16_policy():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("backend", ["advtrain", "cleverhans"])
def test_float16_attack_uses_the_loss_scale(float16_policy, backend):
    rng = np.random.default_rng(0)
    x = tf.constant(0.5 + rng.uniform(-0.05, 0.05, (32, 8, 8, 1)), tf.float32)
    y = tf.zeros((32,), tf.int32)
    model = _compile(
        AdversarialModel(
            _confident_classifier(), Attack("fgsm", eps=0.1, backend=backend), 0.5
        )
    )
    assert float(model.attack_loss_scale()) > 1000
    x_adv = model.generate_adversarial(x, y)
    # Every pixel moves by eps (none sits at a clip bound): the float16
    # gradient did not underflow to zero.
    moved = np.isclose(np.abs(x_adv.numpy() - x.numpy()), 0.1, atol=1e-3)
    assert moved.mean() > 0.99
    if backend == "advtrain":
        logs = model.train_on_batch(x, y, return_dict=True)
        assert logs["zero_grad_fraction"] < 0.01


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("kind", ["pgd", "trades"])
def test_mixed_precision_pgd_and_trades_train(digits, policy, kind):
    from advtrain.models import TRADES

    x, y = digits[0][:256], digits[1][:256]
    keras.mixed_precision.set_global_policy(policy)
    try:
        attack = Attack("pgd", eps=0.1, steps=3)
        clf = dense_classifier(seed=2)
        if kind == "pgd":
            model = AdversarialModel(clf, attack, 0.5, seed=0)
        else:
            model = TRADES(clf, attack, beta=1.0, seed=0)
        model.compile(
            optimizer=keras.optimizers.Adam(3e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        history = model.fit(x, y, batch_size=64, epochs=2, verbose=0).history
        for key in ("loss", "clean_loss", "adv_loss"):
            assert np.isfinite(history[key]).all(), key
        assert history["loss"][-1] < history["loss"][0]
        xb = tf.constant(x[:64])
        delta = (model.generate_adversarial(xb, tf.constant(y[:64])) - xb).numpy()
        # Three sign steps of 2.5 * eps / 3 from a random start reach the
        # eps bound (or a pixel bound) only where the input gradient is
        # non-zero; zero gradients leave the start, strictly inside.
        at_bound = (
            np.isclose(np.abs(delta), 0.1, atol=2e-3)
            | np.isclose(xb.numpy() + delta, 0.0)
            | np.isclose(xb.numpy() + delta, 1.0)
        )
        assert at_bound.mean() > 0.8
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_cleverhans_backend_in_the_training_step(digits, monkeypatch):
    import cleverhans.tf2.attacks.projected_gradient_descent as ch_pgd

    calls = []
    original = ch_pgd.projected_gradient_descent

    def spy(*args, **kwargs):
        calls.append(kwargs.get("rand_init"))
        return original(*args, **kwargs)

    monkeypatch.setattr(ch_pgd, "projected_gradient_descent", spy)
    x, y = digits[0][:128], digits[1][:128]
    weights = {}
    for backend in ("advtrain", "cleverhans"):
        attack = Attack(
            "pgd", eps=0.1, steps=3, step_size=0.05, random_start=False, backend=backend
        )
        clf = dense_classifier(seed=6)
        model = _compile(AdversarialModel(clf, attack, 0.5))
        traced = len(calls)
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
        weights[backend] = clf.get_weights()
        # cleverhans runs (when the step is traced) for its backend only.
        assert (len(calls) > traced) == (backend == "cleverhans")
    assert set(calls) == {False}
    for a, b in zip(weights["advtrain"], weights["cleverhans"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_validation_reports_robust_accuracy(digits):
    x, y = digits
    model = _compile(
        AdversarialModel(dense_classifier(), Attack("fgsm", eps=0.03), 0.5), lr=0.3
    )
    history = model.fit(
        x[:512],
        y[:512],
        batch_size=64,
        epochs=2,
        verbose=0,
        validation_data=(x[512:768], y[512:768]),
    )
    val_clean = history.history["val_accuracy"][-1]
    val_adv = history.history["val_adv_accuracy"][-1]
    assert 0.0 < val_adv < val_clean


def test_train_and_validation_each_log_the_metrics_their_step_feeds(digits):
    # adv_weight=0 with an attack: training never attacks, validation does.
    x, y = digits[0][:64], digits[1][:64]
    model = _compile(AdversarialModel(dense_classifier(), Attack("fgsm", eps=0.1), 0.0))
    history = model.fit(
        x, y, batch_size=32, epochs=2, validation_data=(x, y), verbose=0
    ).history
    train = {"loss", "accuracy", "clean_loss"}
    val = train | {"adv_loss", "adv_accuracy", "zero_grad_fraction"}
    assert set(history) == train | {f"val_{k}" for k in val}
    # The epoch's values are the metrics' own, whichever phase ran last.
    assert set(model.get_metrics_result()) == val
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert set(model.get_metrics_result()) == train


def test_a_generate_adversarial_hook_must_take_the_steps_attack():
    class OldHook(AdversarialModel):
        def generate_adversarial(self, x, y):
            return x

    with pytest.raises(TypeError) as caught:
        OldHook(dense_classifier(), Attack("fgsm", eps=0.1))
    assert str(caught.value) == (
        "OldHook.generate_adversarial must take the step's attack, as "
        "`def generate_adversarial(self, x, y, attack=None)` (the training "
        "step passes the eps-ramped attack; 0.3's hook took x, y). "
        "Received: generate_adversarial(self, x, y)"
    )
    with pytest.raises(TypeError, match="OldHook.generate_adversarial must"):
        OldHook.check_arguments(Attack("fgsm", eps=0.1))
