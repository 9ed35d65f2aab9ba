"""`advtrain.fit` owns its checkpoints and leaves no trace: a second call
with the same folder resumes where the first stopped, bit for bit, and the
caller's random state and signal handlers are as they were."""

import random
import signal

import keras
import numpy as np
import pytest

import advtrain

pytestmark = pytest.mark.backend_neutral


def seeded_regressor():
    """Its initial weights depend on the seeds here alone."""
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(
                16,
                activation="relu",
                kernel_initializer=keras.initializers.GlorotUniform(seed=1),
            ),
            keras.layers.Dense(
                1, kernel_initializer=keras.initializers.GlorotUniform(seed=2)
            ),
        ]
    )


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32"))[:, None]
    return x, y


def deterministic_fit(data, epochs, checkpoints=None, **changed):
    arguments = dict(
        loss="mse",
        batch_size=20,
        epochs=epochs,
        train={"seed": 3, "learning_rate": 0.01},
        runtime={"deterministic": True, "strategy": "default"},
        checkpoints=checkpoints,
        echo=None,
    )
    return advtrain.fit(seeded_regressor, data, **{**arguments, **changed})


def same(a: list, b: list) -> bool:
    assert len(a) == len(b)
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_second_fit_on_the_same_folder_continues_the_first(data, tmp_path):
    whole = deterministic_fit(data, 2)
    first = deterministic_fit(data, 1, checkpoints=tmp_path / "run")
    assert not same(first.model.get_weights(), whole.model.get_weights())
    lines = []
    second = deterministic_fit(data, 2, checkpoints=tmp_path / "run", echo=lines.append)
    assert any("from epoch-0001: epoch 2, after step 0" in line for line in lines)
    # One more epoch trained, not two: the first was restored.
    assert int(second.model.optimizer.iterations.numpy()) == 20
    assert same(second.model.get_weights(), whole.model.get_weights())
    assert len(second.history["loss"]) == 2  # the whole run's, from its file
    assert second.history["loss"][0] == pytest.approx(first.history["loss"][0])


def _global_random_state():
    from keras.src.backend.common import global_state
    from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR

    generator = global_state.get_global_attribute(GLOBAL_SEED_GENERATOR)
    keras_state = None
    if generator is not None:
        keras_state = keras.ops.convert_to_numpy(generator.state).tolist()
    return {
        "numpy": np.random.get_state()[1].tolist(),
        "random": random.getstate(),
        "keras": keras_state,
    }


def test_fit_leaves_the_callers_random_state_and_signal_handlers(data, tmp_path):
    np.random.seed(11)
    random.seed(11)
    keras.random.uniform((1,))  # the global SeedGenerator exists
    before = _global_random_state()

    def handler(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        deterministic_fit(data, 1, checkpoints=tmp_path / "run")
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert _global_random_state() == before
