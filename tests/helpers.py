"""Small models and measures shared by the tests (import as `helpers`)."""

import keras
import numpy as np


def dense_classifier(input_shape=(8, 8, 1), classes=10, seed=0):
    """A BatchNorm-free classifier: deterministic and order-independent."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input(input_shape)
    h = keras.layers.Flatten()(inputs)
    h = keras.layers.Dense(32, activation="relu")(h)
    outputs = keras.layers.Dense(classes)(h)
    return keras.Model(inputs, outputs)


def bn_classifier(input_shape=(8, 8, 1), classes=10, seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input(input_shape)
    h = keras.layers.Conv2D(8, 3, padding="same")(inputs)
    h = keras.layers.BatchNormalization(momentum=0.9)(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    outputs = keras.layers.Dense(classes)(h)
    return keras.Model(inputs, outputs)


def accuracy(model, x, y) -> float:
    return float(np.mean(np.argmax(model(x, training=False), axis=-1) == y))
