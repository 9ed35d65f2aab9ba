"""TRADES: a subclass that only overrides the two documented hooks."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import dense_classifier

from advtrain.attacks import Attack
from advtrain.models import TRADES
from advtrain.models.objectives.trades import per_example_kl


def _trades(beta=6.0, seed=0, random_start=True):
    attack = Attack("pgd", eps=0.1, steps=3, random_start=random_start)
    model = TRADES(dense_classifier(seed=seed), attack, beta=beta)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _numpy_kl(logits_p, logits_q):
    """KL(softmax(logits_p) || softmax(logits_q)) per row, by hand."""

    def softmax(z):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    p, q = softmax(np.float64(logits_p)), softmax(np.float64(logits_q))
    return np.sum(p * np.log(p / q), axis=1)


def test_kl_matches_a_hand_computed_kl():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 16, 5)).astype("float32") * 3
    kl = per_example_kl(tf.nn.softmax(a), tf.constant(b)).numpy()
    np.testing.assert_allclose(kl, _numpy_kl(a, b), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(
        per_example_kl(tf.nn.softmax(a), tf.constant(a)).numpy(), 0.0, atol=1e-6
    )


def test_adversarial_examples_maximise_kl_within_eps(digits):
    x, y = tf.constant(digits[0][:64]), tf.constant(digits[1][:64])
    model = _trades()
    x_adv = model.generate_adversarial(x, y)
    assert float(tf.reduce_max(tf.abs(x_adv - x))) <= 0.1 + 1e-6
    clf = model.classifier
    kl_pgd = _numpy_kl(clf(x).numpy(), clf(x_adv).numpy()).mean()
    # Random points of the same ball are far less divergent.
    for seed in range(3):
        noise = tf.random.stateless_uniform(x.shape, [seed, 1], -0.1, 0.1)
        x_rand = tf.clip_by_value(x + noise, 0.0, 1.0)
        kl_rand = _numpy_kl(clf(x).numpy(), clf(x_rand).numpy()).mean()
        assert kl_pgd > 3 * kl_rand


def test_loss_and_logs_are_ce_plus_beta_kl(digits):
    x, y = tf.constant(digits[0][:64]), tf.constant(digits[1][:64])
    # No random start: the step's attack gives the x_adv computed here.
    model = _trades(beta=2.0, random_start=False)
    clf = model.classifier
    x_adv = model.generate_adversarial(x, y)
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    natural = float(ce(y, clf(x)))
    robust = float(_numpy_kl(clf(x).numpy(), clf(x_adv).numpy()).mean())
    assert robust > 1e-3
    loss = float(model.adversarial_loss(x, y, clf(x), x_adv, clf(x_adv), None))
    assert loss == pytest.approx(natural + 2.0 * robust, rel=1e-4)
    model.reset_metrics()
    logs = model.train_on_batch(x, y, return_dict=True)
    assert logs["clean_loss"] == pytest.approx(natural, rel=1e-4)
    assert logs["adv_loss"] == pytest.approx(robust, rel=1e-3)
    assert logs["loss"] == pytest.approx(natural + 2.0 * robust, rel=1e-4)
    assert "zero_grad_fraction" not in logs  # PGD measures no zero gradients


def test_trades_trains_and_round_trips(tmp_path, digits):
    x, y = digits
    model = _trades(beta=1.0)
    history = model.fit(x[:512], y[:512], batch_size=64, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert np.isfinite(history.history["adv_loss"]).all()
    path = tmp_path / "trades.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, TRADES) and loaded.beta == 1.0
    np.testing.assert_allclose(
        loaded.predict(x[:8], verbose=0), model.predict(x[:8], verbose=0), atol=1e-6
    )


def test_beta_is_validated():
    with pytest.raises(ValueError, match="beta must be >= 0"):
        TRADES(dense_classifier(), Attack("pgd", eps=0.1), beta=-1)
