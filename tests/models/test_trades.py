"""TRADES: a subclass that only overrides the two documented hooks."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import dense_classifier

from advtrain.attacks import Attack
from advtrain.models import TRADES
from advtrain.models.trades import per_example_kl


def _trades(beta=6.0, seed=0):
    model = TRADES(
        dense_classifier(seed=seed), Attack("pgd", eps=0.1, steps=3), beta=beta
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def test_kl_is_zero_for_equal_distributions_and_positive_otherwise():
    logits = tf.constant([[1.0, 2.0, 0.5], [0.0, 0.0, 3.0]])
    p = tf.nn.softmax(logits)
    np.testing.assert_allclose(per_example_kl(p, logits).numpy(), 0.0, atol=1e-6)
    assert np.all(per_example_kl(p, logits[:, ::-1]).numpy() > 0)


def test_adversarial_examples_maximise_kl_within_eps(digits):
    x, _ = tf.constant(digits[0][:64]), None
    model = _trades()
    x_adv = model.generate_adversarial(x, tf.constant(digits[1][:64]))
    assert float(tf.reduce_max(tf.abs(x_adv - x))) <= 0.1 + 1e-6
    clf = model.classifier
    p = tf.nn.softmax(clf(x))
    kl_adv = float(tf.reduce_mean(per_example_kl(p, clf(x_adv))))
    assert kl_adv > 0.0


def test_loss_is_ce_plus_beta_kl(digits):
    x, y = tf.constant(digits[0][:64]), tf.constant(digits[1][:64])
    model = _trades(beta=2.0)
    clf = model.classifier
    x_adv = model.generate_adversarial(x, y)
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    natural = float(ce(y, clf(x)))
    robust = float(tf.reduce_mean(per_example_kl(tf.nn.softmax(clf(x)), clf(x_adv))))
    loss = float(model.adversarial_loss(x, y, clf(x), x_adv, clf(x_adv), None))
    assert loss == pytest.approx(natural + 2.0 * robust, rel=1e-4)


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
