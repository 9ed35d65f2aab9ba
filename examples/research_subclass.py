"""Research: your own adversarial loss, by subclassing `AdversarialModel`.

    python examples/research_subclass.py          # seconds: 3 epochs each
    python examples/research_subclass.py --full   # 15 epochs each

Adversarial logit pairing (Kannan et al. 2018): the usual adversarial
cross-entropy plus a penalty on the distance between the clean and the
adversarial logits. The example trains the plain objective and the paired
one from the same start and prints how far apart their logits end up.
Data: scikit-learn's digits (no download).

Runs on: TensorFlow (the loss uses `tf` ops; written with `keras.ops` it
runs on JAX too).
"""

import argparse

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from advtrain import AdversarialModel, Attack

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--full", action="store_true", help="15 epochs")
args = parser.parse_args()
epochs = 15 if args.full else 3

digits = load_digits()
x = (digits.images / 16.0).astype("float32")[..., None]
y = digits.target.astype("int64")
order = np.random.default_rng(0).permutation(len(y))
x, y = x[order], y[order]
x_train, y_train, x_test, y_test = x[:1437], y[:1437], x[1437:], y[1437:]


@keras.saving.register_keras_serializable(package="examples")
class LogitPairing(AdversarialModel):
    """The mixed clean/adversarial loss plus `pairing` x the squared gap
    between clean and adversarial logits."""

    # The pairing term needs the clean logits even if adv_weight is 1.
    needs_clean_logits = True

    def __init__(self, classifier, attack=None, pairing=0.5, **kwargs):
        super().__init__(classifier, attack, **kwargs)
        self.pairing = pairing

    def adversarial_loss(self, x, y, y_pred, x_adv, y_pred_adv, sample_weight):
        loss = super().adversarial_loss(x, y, y_pred, x_adv, y_pred_adv, sample_weight)
        gap = tf.reduce_sum(tf.square(y_pred - y_pred_adv), axis=-1)
        # reduce_per_example, not tf.reduce_mean: each replica returns its
        # share of the global batch's loss, so the term is right on 1 or N
        # devices (the hook's docstring says why).
        return loss + self.pairing * self.reduce_per_example(gap, sample_weight)

    def get_config(self):  # so a saved .keras file rebuilds it with `pairing`
        return {**super().get_config(), "pairing": self.pairing}


def classifier():
    keras.utils.set_random_seed(0)  # both objectives start from the same weights
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu")(h)
    h = keras.layers.Flatten()(h)
    return keras.Model(inputs, keras.layers.Dense(10)(h))


def train(model_class, **options):
    model = model_class(
        classifier(), Attack("pgd", eps=0.1, steps=3), seed=0, **options
    )
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(x_train, y_train, batch_size=64, epochs=epochs, verbose=0)
    return model


def logit_gap(model):
    """Mean squared distance between clean and PGD logits on the test digits."""
    x_adv = model.attack(model.classifier, x_test, y_test, seed=1)
    clean = model.classifier.predict(x_test, verbose=0)
    adversarial = model.classifier.predict(x_adv, verbose=0)
    right = np.mean(np.argmax(adversarial, axis=-1) == y_test)
    return float(np.mean(np.sum((clean - adversarial) ** 2, axis=-1))), right


plain = train(AdversarialModel)
paired = train(LogitPairing, pairing=0.5)
for name, model in (("plain adversarial", plain), ("logit pairing 0.5", paired)):
    gap, right = logit_gap(model)
    print(f"{name:<18} logit gap under PGD {gap:7.3f}, PGD accuracy {right:.1%}")

# The subclass saves and reloads like any Keras model.
paired.save("paired.keras")
reloaded = keras.saving.load_model("paired.keras")
print(f"reloaded {type(reloaded).__name__} with pairing={reloaded.pairing}")
