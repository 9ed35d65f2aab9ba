"""Shared fixtures: small models trained once per session on real digits."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def digits():
    """scikit-learn's digits as float [0, 1] arrays (N, 8, 8, 1), shuffled
    once with a fixed seed (the file is ordered by writer)."""
    from advtrain.data.digits import load_digits_arrays

    x, y = load_digits_arrays()
    order = np.random.default_rng(0).permutation(len(y))
    return x[order], y[order]


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


@pytest.fixture(scope="session")
def trained_dense(digits):
    """A dense classifier trained cleanly to high accuracy on digits."""
    x, y = digits
    model = dense_classifier()
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(x[:1500], y[:1500], epochs=15, batch_size=64, verbose=0)
    return model


@pytest.fixture
def sparse_ce():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def accuracy(model, x, y) -> float:
    return float(np.mean(np.argmax(model(x, training=False), axis=-1) == y))
