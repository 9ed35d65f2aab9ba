"""`advtrain.fit` and `model.builder`: any Keras model through the runtime."""

import json
import sys
import textwrap
import threading
import time

import keras
import numpy as np
import pytest
import yaml
from helpers import on_replicas, run_fresh
from typer.testing import CliRunner

import advtrain
from advtrain.cli.commands import app
from advtrain.data.streaming import array_batches
from advtrain.recipe.build import build_from_builder, load_builder
from advtrain.recipe.schema import ModelConfig

runner = CliRunner()


def tiny_regressor():
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(1),
        ]
    )


@pytest.fixture(scope="module")
def tiny_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32"))[:, None]
    return x, y


# ---------------------------------------------------------------- tiny model


def test_tiny_model_auto_steps_per_execution(tiny_data):
    lines = []
    result = advtrain.fit(
        tiny_regressor,
        tiny_data,
        loss="mse",
        batch_size=20,
        epochs=3,
        train={"learning_rate": 0.01},
        runtime={"strategy": "default"},
        echo=lines.append,
    )
    # 400 / 20 = 20 steps per epoch, all in one host call.
    assert result.plan.steps_per_epoch == 20
    assert result.plan.steps_per_execution == 20
    assert result.model.steps_per_execution == 20
    assert int(result.model.optimizer.iterations.numpy()) == 60
    assert result.history["loss"][-1] < result.history["loss"][0]
    assert lines[0].startswith("runtime: default strategy on cpu")
    assert result.bn_gap is None  # no BatchNorm, not a classifier
    assert "global 20 = 1 replica(s) x 20; 20 steps/epoch x 3" in lines[1]


def test_host_calls_never_overshoot_the_epoch(tiny_data):
    # Keras runs whole host calls: 4 per call for 10 steps would train 12.
    result = advtrain.fit(
        tiny_regressor(),
        tiny_data,
        loss="mse",
        batch_size=20,
        epochs=2,
        train={"steps_per_epoch": 10},
        runtime={"steps_per_execution": 4},
        echo=None,
    )
    assert result.plan.steps_per_execution == 2
    assert int(result.model.optimizer.iterations.numpy()) == 20


def test_fit_adversarially_wraps_the_classifier(digits):
    x, y = digits
    result = advtrain.fit(
        lambda: keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                keras.layers.Flatten(),
                keras.layers.Dense(10),
            ]
        ),
        (x[:256], y[:256]),
        attack=advtrain.Attack("fgsm", eps=0.1),
        batch_size=64,
        runtime={"strategy": "default"},
        echo=None,
    )
    assert type(result.model).__name__ == "AdversarialModel"
    assert {"clean_loss", "adv_loss"} <= set(result.history)


def test_fit_rejects_arrays_without_batch_size(tiny_data):
    with pytest.raises(ValueError, match="Arrays need batch_size="):
        advtrain.fit(tiny_regressor, tiny_data, loss="mse", echo=None)


def test_fit_takes_a_stream_function_of_skip(tiny_data):
    """The caller's stream: fit asks it for the batches from `skip` on."""
    x, y = tiny_data
    skips = []

    def stream(skip):
        skips.append(skip)
        return array_batches(x, y, 20, shuffle=False, repeat=True).skip(skip)

    with pytest.raises(ValueError, match="needs batch_size= .* steps_per_epoch="):
        advtrain.fit(tiny_regressor, stream, loss="mse", batch_size=20, echo=None)
    result = advtrain.fit(
        tiny_regressor,
        stream,
        loss="mse",
        batch_size=20,
        epochs=2,
        train={"steps_per_epoch": 5},
        echo=None,
    )
    assert skips[0] == 0 and len(result.history["loss"]) == 2
    assert result.plan.steps_per_epoch == 5 and result.train_seconds > 0


def test_a_built_adversarial_model_brings_its_attack(digits):
    x, y = digits
    classifier = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten()])
    model = advtrain.AdversarialModel(classifier, advtrain.Attack("fgsm", eps=0.1))
    with pytest.raises(TypeError, match="brings its attack"):
        advtrain.fit(model, (x, y), attack="fgsm", batch_size=64, echo=None)


# ---------------------------------------------------------------- memmap


class ToFloat(keras.layers.Layer):
    def call(self, x):
        return keras.ops.cast(x, "float32")


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def test_wide_binary_inputs_stream_from_a_memory_map(tmp_path):
    psutil = pytest.importorskip("psutil")
    del psutil
    rows, width = 12_000, 100_000
    path = tmp_path / "x.npy"
    # A sparse file: only each row's first 64 bytes are written, so 1.2 GB
    # of logical data costs little disk. Labels depend on those bytes.
    x = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(rows, width))
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2, size=(rows, 64), dtype=np.uint8)
    x[:, :64] = bits
    x.flush()
    del x
    y = (bits[:, :32].sum(axis=1) > bits[:, 32:].sum(axis=1)).astype("int32")
    size = path.stat().st_size
    assert size > 1.1e9

    x = np.load(path, mmap_mode="r")

    def build():
        inputs = keras.Input((width,), dtype="uint8")
        h = keras.layers.Dense(8, activation="relu")(ToFloat()(inputs))
        return keras.Model(inputs, keras.layers.Dense(2)(h))

    baseline = _rss()
    peak = [baseline]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = advtrain.fit(
            build,
            (x, y),
            batch_size=100,
            epochs=1,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            runtime={"strategy": "default"},
            echo=None,
        )
    finally:
        done.set()
        sampler.join()
    assert result.plan.steps_per_epoch == 120  # the whole file, once
    assert np.isfinite(result.history["loss"][0])
    # Streaming: the process grows by a few batches and the model's state
    # (about 190 MB measured), not by the 1.2 GB it read.
    assert peak[0] - baseline < size / 4, (peak[0] - baseline, size)


def test_array_batches_streams_blocks_in_shuffled_order(tmp_path):
    x = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    np.save(tmp_path / "x.npy", x)
    mm = np.load(tmp_path / "x.npy", mmap_mode="r")
    ds = array_batches(mm, np.arange(40), 10, shuffle=True, seed=1)
    batches = [(bx.numpy(), by.numpy()) for bx, by in ds]
    assert len(batches) == 4
    got = np.concatenate([b[1] for b in batches])
    assert sorted(got.tolist()) == list(range(40))
    for bx, by in batches:  # rows stay paired with their labels
        np.testing.assert_array_equal(bx, x[by])


# ---------------------------------------------------------------- LSTM


LSTM_SCRIPT = on_replicas(
    "fit_lstm",
    """
    import json
    from advtrain.train.fitting import fit

    def build():
        import keras
        return keras.Sequential([
            keras.Input((5, 8)),
            keras.layers.LSTM(180, dropout=0.2, return_sequences=True),
            keras.layers.LSTM(180, dropout=0.2, return_sequences=True),
            keras.layers.LSTM(180, dropout=0.2),
            keras.layers.Dense(4),
        ])

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 5, 8)).astype("float32")
    y = rng.normal(size=(64, 4)).astype("float32")
    lines = []
    result = fit(build, (x, y), loss="mse", batch_size=64, epochs=1,
                 runtime=runtime, echo=lines.append)
    np.savez(out, echo="\\n".join(lines), summary=json.dumps({
        "replicas": result.runtime.replicas,
        "per_replica": result.plan.per_replica_batch,
        "steps": int(result.model.optimizer.iterations.numpy()),
        "loss": result.history["loss"][-1],
        "units": [l.units for l in result.model.layers[:3]],
    }))
""",
    replicas=(2,),
)


@pytest.mark.replicas(LSTM_SCRIPT)
def test_lstm_regressor_under_two_cpu_replicas(replica_runs):
    result = replica_runs(LSTM_SCRIPT)[2]
    assert "runtime: mirrored strategy on cpu, 2 replica(s)" in str(result["echo"])
    summary = json.loads(str(result["summary"]))
    assert summary["replicas"] == 2
    assert summary["per_replica"] == 32
    assert summary["steps"] == 1
    assert summary["units"] == [180, 180, 180]
    assert np.isfinite(summary["loss"])


# ---------------------------------------------------------------- shuffle

SHUFFLE_SCRIPT = on_replicas(
    "fit_shuffle",
    """
    import keras
    import tensorflow as tf
    import advtrain

    def build():  # BatchNorm-free: the order alone decides the weights
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((8,)),
                                 keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dense(3)])

    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 8)).astype("float32")
    y = rng.integers(0, 3, 128)
    sources = {"arrays": (x, y),
               "dataset": tf.data.Dataset.from_tensor_slices((x, y))}
    arrays = {}
    for name, data in sources.items():
        result = advtrain.fit(
            build, data, runtime=runtime, batch_size=32, epochs=2,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            train={"optimizer": "sgd", "learning_rate": 0.5}, echo=None)
        for i, w in enumerate(result.model.get_weights()):
            arrays[f"{name}/w{i}"] = w
    np.savez(out, **arrays)
""",
)


@pytest.mark.replicas(SHUFFLE_SCRIPT)
def test_shuffled_fit_trains_alike_on_one_and_two_replicas(replica_runs):
    # Keras opens an extra iterator under a strategy (to build the model);
    # a stream that reshuffled per iterator trained on another order.
    arrays = replica_runs(SHUFFLE_SCRIPT)
    one, two = arrays[1], arrays[2]
    assert sorted(one.files) == sorted(two.files) and len(one.files) == 8
    for key in one.files:
        np.testing.assert_allclose(two[key], one[key], atol=1e-5, err_msg=key)


def test_repeated_array_stream_replays_from_every_iterator(tmp_path):
    y = np.arange(40)
    np.save(tmp_path / "x.npy", np.arange(40 * 2, dtype=np.float32).reshape(40, 2))
    mm = np.load(tmp_path / "x.npy", mmap_mode="r")
    for x in (mm, np.asarray(mm)):  # streamed and in-memory
        ds = array_batches(x, y, 10, seed=3, repeat=True)
        first, second = (
            np.concatenate([b.numpy() for _, b in ds.take(8)]) for _ in range(2)
        )
        np.testing.assert_array_equal(first, second)
        epochs = first.reshape(2, 40)
        assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(40))
        assert not np.array_equal(epochs[0], epochs[1])  # reshuffled per epoch
        assert not np.array_equal(epochs[0], y)


# ---------------------------------------------------------------- BatchNorm


def _bn_cnn():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(16, 3, padding="same")(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.Conv2D(32, 3, strides=2, padding="same")(h)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, keras.layers.Dense(10)(h))


# Loads the saved model where advtrain cannot be imported; same logits.
KERAS_ALONE = textwrap.dedent("""
    import sys
    sys.modules["advtrain"] = None  # any import of advtrain fails
    import keras, numpy as np
    model = keras.models.load_model("m.keras")
    out = model.predict(np.load("x.npy"), verbose=0)
    np.testing.assert_allclose(out, np.load("logits.npy"), rtol=1e-5, atol=1e-5)
""")


def test_fit_rejects_a_bad_batchnorm_policy_in_one_line(tiny_data):
    for bad, message in (
        ({"momentum": 2.0}, "batchnorm: .*momentum: must be 'auto', a number in"),
        ({"recalibrate": "sometimes"}, "Received: recalibrate='sometimes'"),
        ({"momentun": 0.9}, "batchnorm: unknown key 'momentun'"),
    ):
        with pytest.raises(ValueError, match=message) as info:
            advtrain.fit(
                tiny_regressor, tiny_data, loss="mse", batch_size=20, batchnorm=bad
            )
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"runtime": {"strategy": 5}}, "runtime: invalid value for 'strategy'"),
        ({"train": {"learning_rate": -1.0}}, "invalid value for 'learning_rate'"),
        ({"epochs": "x"}, "Received: epochs='x'"),
    ],
)
def test_fit_rejects_a_bad_argument_value_in_one_line(tiny_data, bad, message):
    with pytest.raises(ValueError, match=message) as info:
        advtrain.fit(tiny_regressor, tiny_data, loss="mse", batch_size=20, **bad)
    text = str(info.value)
    assert "\n" not in text and "For further information" not in text
    assert not isinstance(info.value, advtrain.RecipeError)


def test_fit_applies_the_batchnorm_policy_and_reports_the_gap(digits, tmp_path):
    x, y = digits
    common = dict(
        attack=advtrain.Attack("fgsm", eps=0.1),
        batch_size=64,
        epochs=3,
        train={"learning_rate": 3e-3},
        validation_data=(x[1400:], y[1400:]),
        runtime={"strategy": "default"},
    )
    lines = []
    result = advtrain.fit(_bn_cnn, (x[:1400], y[:1400]), echo=lines.append, **common)
    gap = result.bn_gap
    print(f"\nadvtrain.fit bn_gap: {gap}")
    assert any("0.99 (Keras's default) -> 0.9 on 2 layer(s)" in line for line in lines)
    # The fused kernel runs inside the training step; the layers keep
    # their class, so the model saves and loads with Keras alone.
    classifier = result.model.classifier
    assert type(classifier.layers[2]) is keras.layers.BatchNormalization
    classifier.save(tmp_path / "m.keras")
    np.save(tmp_path / "x.npy", x[:32])
    np.save(tmp_path / "logits.npy", classifier.predict(x[:32], verbose=0))
    run_fresh([sys.executable, "-c", KERAS_ALONE], tmp_path)
    assert gap["recalibrated"] == 0 and abs(gap["gap"]) <= 0.02
    assert gap["inference_mode_accuracy"] > 0.6
    assert lines[-1] == f"bn_gap: {100 * gap['gap']:+.2f} points"

    # Momentum kept at 0.99: the gap is measured, then recalibrated away.
    stale = advtrain.fit(
        _bn_cnn, (x[:1400], y[:1400]), batchnorm={"momentum": None}, echo=None, **common
    )
    print(f"advtrain.fit bn_gap at momentum 0.99: {stale.bn_gap}")
    assert stale.bn_gap["before"]["gap"] > 0.05
    assert stale.bn_gap["recalibrated"] > 0 and abs(stale.bn_gap["gap"]) <= 0.02


# ---------------------------------------------------------------- builder


BUILDERS = textwrap.dedent("""
    import keras

    def dense_logits(image_shape, num_classes, cfg):
        inputs = keras.Input(image_shape)
        h = keras.layers.Flatten()(inputs)
        h = keras.layers.Dense(cfg.width, activation="relu")(h)
        return keras.Model(inputs, keras.layers.Dense(num_classes)(h))

    def no_arguments():
        return keras.Sequential([keras.Input((8, 8, 1)),
                                 keras.layers.Flatten(),
                                 keras.layers.Dense(10)])

    def wrong_outputs(image_shape, num_classes, cfg):
        return keras.Sequential([keras.Input(image_shape),
                                 keras.layers.Flatten(),
                                 keras.layers.Dense(3)])

    def not_a_model():
        return "model"
""")


@pytest.fixture
def builders(tmp_path, monkeypatch):
    (tmp_path / "fit_test_builders.py").write_text(BUILDERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "fit_test_builders"


def test_builder_called_with_shape_classes_and_config(builders):
    model = build_from_builder(
        f"{builders}:dense_logits", (8, 8, 1), 10, ModelConfig(width=5)
    )
    assert model.output_shape == (None, 10)
    assert model.layers[-2].units == 5
    model = build_from_builder(f"{builders}:no_arguments", (8, 8, 1), 10, ModelConfig())
    assert model.output_shape == (None, 10)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "model.builder: expected 'package.module:function'"),
        (
            "missing_module_xyz:fn",
            "model.builder: cannot import module "
            "'missing_module_xyz' (ModuleNotFoundError",
        ),
        ("{m}:absent", "has no attribute 'absent'"),
        ("{m}:wrong_outputs", "returns 3 outputs; the data has 10 classes"),
        ("{m}:not_a_model", "must return a keras.Model. Received: str"),
    ],
)
def test_builder_errors_are_one_line_errors(builders, spec, message):
    with pytest.raises((ValueError, TypeError)) as info:
        build_from_builder(spec.format(m=builders), (8, 8, 1), 10, ModelConfig())
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_builder_refuses_backbone_only_settings(builders):
    with pytest.raises(ValueError, match="model.freeze: applies to"):
        build_from_builder(
            f"{builders}:dense_logits", (8, 8, 1), 10, ModelConfig(freeze="frozen")
        )


def test_builder_recipe_runs_and_bad_import_exits_2(builders, tmp_path):
    recipe = {
        "name": "builder",
        "data": {"source": "digits", "limit_train": 128, "limit_test": 32},
        "model": {"builder": f"{builders}:dense_logits", "width": 8},
        "attack": {"method": "fgsm", "eps": 0.1},
        "train": {"epochs": 1, "batch_size": 32},
        "eval": {"attacks": ["pgd"], "pgd_steps": 1, "sanity_examples": 0},
        "output": {
            "tensorboard": False,
            "plots": False,
            "export_saved_model": False,
        },
    }
    path = tmp_path / "builder.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = runner.invoke(app, ["run", str(path), "-o", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r" / "model.keras").is_file()

    bad = tmp_path / "bad.yaml"
    recipe["model"]["builder"] = "no_such_package_q:build"
    bad.write_text(yaml.safe_dump(recipe))
    result = runner.invoke(app, ["run", str(bad), "-o", str(tmp_path / "b")])
    assert result.exit_code == 2
    assert "model.builder: cannot import module 'no_such_package_q'" in (result.output)
    assert load_builder(f"{builders}:no_arguments")().output_shape == (None, 10)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"atack": "fgsm"}, "unexpected keyword argument 'atack'"),
        ({"learning_rate": 0.1}, "unexpected keyword argument 'learning_rate'"),
        ({"train": {"learning_rat": 0.1}}, "train: unknown key 'learning_rat'"),
    ],
)
def test_fit_refuses_what_it_does_not_take_in_one_line(tiny_data, bad, message):
    # Before training: no keyword is accepted and ignored.
    x, y = tiny_data
    with pytest.raises((TypeError, ValueError), match=message) as info:
        advtrain.fit(tiny_regressor, (x, y), loss="mse", batch_size=20, **bad)
    assert "\n" not in str(info.value)


def test_fit_takes_at_most_keras_fits_16_parameters():
    import inspect

    assert len(inspect.signature(advtrain.fit).parameters) <= 16
    assert len(inspect.signature(keras.Model.fit).parameters) - 1 == 16
