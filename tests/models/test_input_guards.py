"""Pixels outside the attack's range and labels the loss cannot use stop
training at the first batch with one clear line, through
`AdversarialModel.fit` and `advtrain.fit`, in graph, XLA and eager steps,
under mixed precision and on two CPU replicas."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import bn_classifier, dense_classifier, on_replicas

import advtrain
from advtrain.attacks import Attack
from advtrain.models import AdversarialModel
from advtrain.models.input_checks import (
    InputChecks,
    LabelError,
    PixelRangeError,
    label_kind,
)

RNG = np.random.default_rng(0)
X = RNG.random((64, 8, 8, 1), dtype=np.float32)
Y = RNG.integers(0, 10, 64)
SPARSE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
CATEGORICAL = keras.losses.CategoricalCrossentropy(from_logits=True)


def _model(attack=None, loss=SPARSE, reuse_gradient="auto", **compile_kwargs):
    model = AdversarialModel(
        bn_classifier(),
        attack or Attack("fgsm", eps=0.1),
        0.5,
        reuse_gradient=reuse_gradient,
    )
    model.compile(optimizer="sgd", loss=loss, **compile_kwargs)
    return model


def _one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message and "Graph execution" not in message
    return message


def _received(message: str) -> tuple[float, float]:
    """The (low, high) a message's "Received: ... range [low, high]" names."""
    low, high = message.rsplit("range [", 1)[1].rstrip("]").split(", ")
    return float(low), float(high)


# ---------------------------------------------------------------- pixels

MODES = {
    "graph": {},
    "graph, 2 steps per call": {"steps_per_execution": 2},
    "xla": {"jit_compile": True},
    "eager": {"run_eagerly": True},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fused", ["auto", False])
def test_0_255_pixels_stop_adversarial_model_fit(mode, fused):
    model = _model(reuse_gradient=fused, **MODES[mode])
    before = model.classifier.get_weights()
    with pytest.raises(PixelRangeError) as caught:
        model.fit(X * 255, Y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    message = _one_line(caught)
    assert "attack's range [0, 1]" in message
    assert "scale them to [0, 1] (e.g. x / 255)" in message and "clip_max" in message
    # Arrays are checked whole on the host, before any step.
    assert _received(message) == pytest.approx(((X * 255).min(), (X * 255).max()), 1e-5)
    unchanged = [
        np.array_equal(a, b)
        for a, b in zip(before, model.classifier.get_weights(), strict=True)
    ]
    assert all(unchanged)


def test_0_255_pixels_stop_it_under_mixed_precision():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = _model()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    with pytest.raises(PixelRangeError, match=r"Received: pixel range \[\d"):
        model.fit(X * 255, Y, batch_size=32, epochs=1, verbose=0)


def test_pixels_within_rounding_of_the_range_train():
    model = _model()
    x = np.clip(X, 0.0, 1.0)
    x[0, 0, 0, 0], x[1, 0, 0, 0] = 1.0 + 5e-4, -5e-4
    history = model.fit(x, Y, batch_size=32, epochs=1, verbose=0).history
    assert not any(key.startswith("_advtrain") for key in history)
    with pytest.raises(PixelRangeError):
        _model().fit(X + 0.01, Y, batch_size=32, epochs=1, verbose=0)


def test_the_attack_range_decides_and_none_turns_the_check_off():
    wide = _model(Attack("fgsm", eps=0.1, clip_min=0.0, clip_max=255.0))
    wide.fit(X * 255, Y, batch_size=32, epochs=1, verbose=0)
    with pytest.raises(
        PixelRangeError, match=r"range \[-1, 1\].*scale them to \[-1, 1\],"
    ):
        _model(Attack("fgsm", eps=0.1, clip_min=-1.0, clip_max=1.0)).fit(
            X * 255, Y, batch_size=32, epochs=1, verbose=0
        )
    unclipped = _model(Attack("fgsm", eps=0.1, clip_min=None, clip_max=None))
    unclipped.fit(X * 255, Y, batch_size=32, epochs=1, verbose=0)
    unchecked = AdversarialModel(
        dense_classifier(), Attack("fgsm", eps=0.1), 0.5, check_inputs=False
    )
    unchecked.compile(optimizer="sgd", loss=SPARSE)
    unchecked.fit(X * 255, Y, batch_size=32, epochs=1, verbose=0)


@pytest.mark.parametrize("source", ["arrays", "dataset"])
def test_0_255_pixels_stop_advtrain_fit(source):
    data = (X * 255, Y)
    if source == "dataset":
        data = tf.data.Dataset.from_tensor_slices(data)
    with pytest.raises(PixelRangeError) as caught:
        advtrain.fit(
            dense_classifier,
            data,
            attack=Attack("fgsm", eps=0.1),
            batch_size=32,
            runtime={"strategy": "default"},
            echo=None,
        )
    assert "Received: pixel range [" in _one_line(caught)


# ---------------------------------------------------------------- labels


@pytest.mark.parametrize("mode", MODES)
def test_out_of_range_labels_stop_adversarial_model_fit(mode):
    first = Y[:32] + 6
    with pytest.raises(LabelError) as caught:
        _model(**MODES[mode]).fit(
            X, Y + 6, batch_size=32, epochs=1, verbose=0, shuffle=False
        )
    assert _one_line(caught) == (
        "labels must be integers in [0, 10) for this model's 10 logits "
        "(SparseCategoricalCrossentropy). Received: label range "
        f"[{first.min()}, {first.max()}]"
    )
    with pytest.raises(LabelError, match=r"label range \[-1, "):
        _model(**MODES[mode]).fit(
            X, Y - 1, batch_size=32, epochs=1, verbose=0, shuffle=False
        )


@pytest.mark.parametrize("attack", [None, Attack("fgsm", eps=0.1)])
@pytest.mark.parametrize("source", ["arrays", "dataset"])
def test_out_of_range_labels_stop_advtrain_fit(attack, source):
    data = (X, Y + 6)
    if source == "dataset":
        data = tf.data.Dataset.from_tensor_slices(data)
    with pytest.raises(LabelError, match=r"in \[0, 10\) .*label range \[\d, 1[0-5]\]$"):
        advtrain.fit(
            dense_classifier,
            data,
            attack=attack,
            loss=SPARSE if attack is None else None,
            batch_size=32,
            runtime={"strategy": "default"},
            echo=None,
        )


@pytest.mark.parametrize("attack", [None, Attack("fgsm", eps=0.1)])
def test_one_hot_labels_with_a_sparse_loss_and_the_reverse(attack):
    one_hot = np.eye(10, dtype="float32")[Y]
    # A plain model's arrays are checked once, whole, before training; an
    # AdversarialModel's stream batch by batch.
    batch = "None" if attack is None else "32"
    cases = [
        (one_hot, SPARSE, "look one-hot", f"Received: labels shape=({batch}, 10)"),
        (Y, CATEGORICAL, "takes one-hot labels (rows of 10)", f"shape=({batch},)"),
    ]
    for labels, loss, expected, received in cases:
        with pytest.raises(LabelError) as caught:
            advtrain.fit(
                dense_classifier,
                (X, labels),
                attack=attack,
                loss=loss,
                batch_size=32,
                runtime={"strategy": "default"},
                echo=None,
            )
        assert expected in _one_line(caught) and received in str(caught.value)
    with pytest.raises(LabelError, match=r"look one-hot.*shape=\(None, 10\)"):
        _model().fit(X, one_hot, batch_size=32, epochs=1, verbose=0)
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(32)
    with pytest.raises(LabelError, match=r"takes one-hot labels.*shape=\(None,\)"):
        _model(loss=CATEGORICAL).fit(dataset, epochs=1, verbose=0)


def test_label_kind_knows_keras_cross_entropies():
    assert (
        label_kind(SPARSE)
        == label_kind("sparse_categorical_crossentropy")
        == ("sparse")
    )
    assert label_kind(keras.losses.sparse_categorical_crossentropy) == "sparse"
    assert (
        label_kind(CATEGORICAL)
        == label_kind("categorical_crossentropy")
        == ("categorical")
    )
    ignoring = keras.losses.SparseCategoricalCrossentropy(ignore_class=-1)
    assert label_kind(ignoring) is None and label_kind("mse") is None


# ------------------------------------------------------- cost per step


def test_a_dataset_is_checked_in_the_graph_python_only_for_a_bad_batch():
    """Good batches never call back into Python (steps_per_execution can
    amortise the check); the one bad batch raises the host check's line."""
    checks = InputChecks((0.0, 1.0), logits_shape=(None, 10), labels="sparse")
    called = []
    host_check = checks._check_range
    checks._check_range = lambda *found: called.append(found) or host_check(*found)
    good = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)
    assert sum(1 for _ in checks.checked(good)) == 4
    assert called == []
    bad_x = X.copy()
    bad_x[40] *= 255  # the third batch of 16
    bad = tf.data.Dataset.from_tensor_slices((bad_x, Y)).batch(16)
    with pytest.raises(PixelRangeError) as caught, checks.clean_errors():
        list(checks.checked(bad))
    assert [kind for kind, *_ in called] == ["pixels"]
    assert _received(_one_line(caught)) == pytest.approx(
        (bad_x[32:48].min(), bad_x[32:48].max()), 1e-5
    )


@pytest.mark.parametrize("bad", [(X * 255, Y), (X, Y + 3)], ids=["pixels", "labels"])
def test_a_dataset_fails_with_the_line_its_arrays_fail_with(bad):
    with pytest.raises(ValueError) as from_arrays:
        _model().fit(*bad, batch_size=64, verbose=0)
    dataset = tf.data.Dataset.from_tensor_slices(bad).batch(64)
    with pytest.raises(ValueError) as from_dataset:
        _model().fit(dataset, verbose=0, shuffle=False)
    assert _one_line(from_dataset) == _one_line(from_arrays)
    assert type(from_dataset.value) is type(from_arrays.value)


# ---------------------------------------------------------------- replicas

REPLICAS = on_replicas(
    "input_guards",
    """
    import keras
    import tensorflow as tf
    import advtrain
    from advtrain.attacks import Attack
    from advtrain.models import AdversarialModel
    from helpers import dense_classifier

    rng = np.random.default_rng(0)
    x = rng.random((64, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, 10, 64)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def model_fit(x, y):
        with runtime.strategy.scope():
            model = AdversarialModel(dense_classifier(), Attack("fgsm", eps=0.1))
            model.compile(optimizer="sgd", loss=loss)
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)

    def advtrain_fit(x, y, attack=Attack("fgsm", eps=0.1)):
        advtrain.fit(dense_classifier, tf.data.Dataset.from_tensor_slices((x, y)),
                     attack=attack, loss=loss, batch_size=32, runtime=runtime,
                     echo=None)

    cases = {
        "model_pixels": lambda: model_fit(x * 255, y),
        "model_labels": lambda: model_fit(x, y + 6),
        "model_one_hot": lambda: model_fit(x, np.eye(10)[y]),
        "fit_pixels": lambda: advtrain_fit(x * 255, y),
        "fit_labels_plain": lambda: advtrain_fit(x, y + 6, attack=None),
    }
    arrays = {}
    for name, case in cases.items():
        try:
            case()
            arrays[name] = np.array("no error")
        except Exception as exc:
            arrays[name] = np.array(f"{type(exc).__name__}: {exc}")
    np.savez(out, **arrays)
""",
    replicas=(2,),
)


@pytest.mark.replicas(REPLICAS)
def test_bad_inputs_stop_training_on_two_cpu_replicas(replica_runs):
    found = {k: str(v) for k, v in replica_runs(REPLICAS)[2].items()}
    for name in ("model_pixels", "fit_pixels"):
        assert found[name].startswith("PixelRangeError: Training inputs must be"), found
        assert "Received: pixel range [" in found[name]
    for name in ("model_labels", "fit_labels_plain"):
        assert found[name].startswith("LabelError: labels must be integers in [0, 10)")
        assert "Received: label range [6, " in found[name]
    assert found["model_one_hot"].startswith("LabelError: "), found
    assert "look one-hot" in found["model_one_hot"]
    assert all("\n" not in message for message in found.values())
