"""Research hooks under tf.distribute: a subclass's loss and logs are the
same on 1 and 2 replicas, and a metric the step did not measure is absent.

Logical CPU devices must be configured before TensorFlow starts, so each
replica count runs in its own process (as in test_distributed.py).
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import dense_classifier, on_replicas, sgd_compiled

from advtrain.attacks import Attack
from advtrain.models import TRADES, AdversarialModel

# Three subclasses trained on a BN-free classifier with SGD + momentum;
# weights and epoch logs saved per case. The attacks are deterministic.
# TRADES's own PGD without a random start begins at the KL's minimum, where
# the input gradient is rounding noise: its sign follows 1e-8 weight
# differences, so it runs one step only ("trades_pgd"); "trades" trains
# TRADES's loss for 4 steps on a fixed perturbation.
TRAIN = on_replicas(
    "hooks_subclasses",
    """
    import keras
    import tensorflow as tf
    from advtrain.attacks import Attack
    from advtrain.models import TRADES, AdversarialModel
    from helpers import dense_classifier

    class LogitPairing(AdversarialModel):
        def adversarial_loss(self, x, y, y_pred, x_adv, y_pred_adv, sw):
            loss = super().adversarial_loss(x, y, y_pred, x_adv, y_pred_adv, sw)
            gap = tf.reduce_sum(tf.square(y_pred - y_pred_adv), axis=-1)
            return loss + 0.5 * self.reduce_per_example(gap, sw)

    class FixedTRADES(TRADES):
        def generate_adversarial(self, x, y, attack=None):
            return tf.clip_by_value(x + 0.1 * tf.sign(0.5 - x), 0.0, 1.0)

    rng = np.random.default_rng(0)
    x = rng.random((128, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, 10, 128)
    weights = rng.random(128).astype("float32")
    pgd = Attack("pgd", eps=0.1, steps=2, random_start=False)
    cases = {
        "pairing": (LogitPairing, Attack("fgsm", eps=0.1), 128),
        "trades": (FixedTRADES, pgd, 128),
        "trades_pgd": (TRADES, pgd, 32),
    }
    arrays = {}
    for name, (cls, attack, n) in cases.items():
        with runtime.strategy.scope():
            classifier = dense_classifier(seed=0)
            model = cls(classifier, attack, seed=0)
            model.compile(
                optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True),
            )
        ds = tf.data.Dataset.from_tensor_slices(
            (x[:n], y[:n], weights[:n])).batch(32)
        history = model.fit(ds, epochs=1, verbose=0, shuffle=False).history
        for i, w in enumerate(classifier.get_weights()):
            arrays[f"{name}/w{i}"] = w
        for key, values in history.items():
            arrays[f"{name}/metric/{key}"] = np.array(values[-1])
    np.savez(out, **arrays)
""",
)


@pytest.mark.replicas(TRAIN)
def test_subclass_losses_and_logs_match_on_one_and_two_replicas(replica_runs):
    arrays = replica_runs(TRAIN)
    one, two = arrays[1], arrays[2]
    assert sorted(one.files) == sorted(two.files)
    for case in ("pairing", "trades", "trades_pgd"):
        assert {
            f"{case}/metric/{k}" for k in ("loss", "clean_loss", "adv_loss")
        } <= set(one.files)
    for key in one.files:
        # Weights, and logs per example: the same whatever the replicas.
        # TRADES's own PGD starts where the KL's input gradient is rounding
        # noise, so a few pixels' signs follow the reduction order: 1.7e-4
        # measured; a loss averaged per replica, not over the global batch,
        # moves these weights by 1.4e-3.
        atol = 5e-4 if key.startswith("trades_pgd/") else 1e-5
        np.testing.assert_allclose(two[key], one[key], atol=atol, err_msg=key)
    # The custom term trained: without it the weights would be another run's.
    assert not np.allclose(one["pairing/w0"], one["trades/w0"])


class LogitPairing(AdversarialModel):
    def adversarial_loss(self, x, y, y_pred, x_adv, y_pred_adv, sample_weight):
        loss = super().adversarial_loss(x, y, y_pred, x_adv, y_pred_adv, sample_weight)
        gap = tf.reduce_sum(tf.square(y_pred - y_pred_adv), axis=-1)
        return loss + 0.5 * self.reduce_per_example(gap, sample_weight)


def test_reduce_per_example_is_the_weighted_batch_mean_on_one_replica(digits):
    x, y = tf.constant(digits[0][:32]), tf.constant(digits[1][:32])
    model = LogitPairing(dense_classifier(), Attack("fgsm", eps=0.1), 0.5)
    values = tf.range(32, dtype=tf.float32)
    weights = tf.cast(tf.range(32) % 2, tf.float32)
    assert float(model.reduce_per_example(values)) == pytest.approx(15.5)
    odd = float(np.sum(np.arange(1, 32, 2)))
    assert float(model.reduce_per_example(values, weights)) == pytest.approx(odd / 32)
    with pytest.raises(ValueError, match="one value per example"):
        model.reduce_per_example(tf.constant(1.0))
    # The term reaches the loss: the logged loss is the mix plus 0.5 * gap.
    clf = model.classifier
    sgd_compiled(model)
    x_adv = model.generate_adversarial(x, y)
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    gap = tf.reduce_sum(tf.square(clf(x) - clf(x_adv)), axis=-1)
    expected = 0.5 * float(ce(y, clf(x))) + 0.5 * float(ce(y, clf(x_adv)))
    expected += 0.5 * float(tf.reduce_mean(gap))
    logs = model.train_on_batch(x, y, return_dict=True)
    assert logs["loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    "make,expected",
    [
        # A multi-step attack measures no input-gradient zeros.
        (
            lambda: AdversarialModel(
                dense_classifier(), Attack("pgd", eps=0.1, steps=2), 0.5
            ),
            {"loss", "clean_loss", "adv_loss", "adv_accuracy"},
        ),
        # Single-step: zeros measured.
        (
            lambda: AdversarialModel(dense_classifier(), Attack("fgsm", eps=0.1), 0.5),
            {"loss", "clean_loss", "adv_loss", "adv_accuracy", "zero_grad_fraction"},
        ),
        # No attack: nothing adversarial to report.
        (
            lambda: AdversarialModel(dense_classifier(), None, 0.0),
            {"loss", "clean_loss"},
        ),
        # A loss hook that feeds no tracker.
        (
            lambda: type(
                "Plain",
                (AdversarialModel,),
                {
                    "adversarial_loss": lambda self, x, y, p, xa, pa, sw: (
                        self.compute_loss(x=xa, y=y, y_pred=pa, sample_weight=sw)
                    )
                },
            )(dense_classifier(), Attack("pgd", eps=0.1, steps=1), 0.5),
            {"loss", "adv_accuracy"},
        ),
    ],
)
def test_only_measured_metrics_are_logged(digits, make, expected):
    x, y = digits[0][:64], digits[1][:64]
    model = sgd_compiled(make())
    history = model.fit(x, y, batch_size=32, epochs=1, verbose=0).history
    assert set(history) == expected


def test_fused_refuses_subclasses_that_override_a_hook():
    with pytest.raises(ValueError, match="TRADES overrides generate_adversarial"):
        TRADES(dense_classifier(), Attack("fgsm", eps=0.1), reuse_gradient=True)
    with pytest.raises(ValueError, match="LogitPairing overrides adversarial_loss"):
        LogitPairing(
            dense_classifier(), Attack("fgsm", eps=0.1), 0.5, reuse_gradient=True
        )
    AdversarialModel(
        dense_classifier(), Attack("fgsm", eps=0.1), 0.5, reuse_gradient=True
    )


@pytest.mark.parametrize(
    "top", [keras.layers.Softmax(), keras.layers.Activation("sigmoid"), None]
)
def test_probability_output_with_a_from_logits_loss_warns(digits, top):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((8, 8, 1)), keras.layers.Flatten()]
    if top is None:
        layers.append(keras.layers.Dense(10, activation="softmax"))
    else:
        layers += [keras.layers.Dense(10), top]
    model = sgd_compiled(
        AdversarialModel(keras.Sequential(layers), Attack("fgsm"), 0.5)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.train_on_batch(digits[0][:8], digits[1][:8])
    # Ours only: on the fused step Keras's own loss warns too.
    messages = [str(w.message) for w in caught if "classifier's" in str(w.message)]
    assert len(messages) == 1 and "\n" not in messages[0]
    assert "remove the final activation" in messages[0]
    # Logits out: no warning.
    plain = sgd_compiled(AdversarialModel(dense_classifier(), Attack("fgsm"), 0.5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain.train_on_batch(digits[0][:8], digits[1][:8])
    assert not [w for w in caught if "from_logits" in str(w.message)]
