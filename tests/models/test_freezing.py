"""Freezing policy: frozen means bit-identical after fit (keras#20285)."""

import keras
import numpy as np
import pytest

from advtrain.models.classifier import build_classifier
from advtrain.models.freezing import (
    Phase,
    apply_freeze,
    apply_phase,
    get_backbone,
    phases,
)


def _data(shape, n=16, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.random((n, *shape)).astype("float32")
    return x, rng.integers(0, classes, n)


def _snapshot(model):
    return {v.path: v.numpy().copy() for v in model.weights}


def _changed(model, before):
    return {
        v.path for v in model.weights if not np.array_equal(v.numpy(), before[v.path])
    }


def _fit(model, x, y, lr=1e-2, **compile_kwargs):
    model.compile(
        keras.optimizers.SGD(lr),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        **compile_kwargs,
    )
    return model.fit(x, y, batch_size=8, epochs=1, verbose=0)


def _small(shape=(8, 8, 1)):
    keras.utils.set_random_seed(0)
    return build_classifier(shape, 3, width=4)


def test_frozen_small_cnn_is_bit_identical_after_fit():
    model = _small()
    apply_freeze(model, "frozen")
    before = _snapshot(model)
    history = _fit(model, *_data((8, 8, 1)))
    assert np.isfinite(history.history["loss"]).all()
    assert _changed(model, before) == {"logits/kernel", "logits/bias"}


def test_trainable_backbone_with_frozen_batchnorm():
    # The keras#20285 case: the backbone trains, so `training=True` reaches
    # its BN layers; only their own trainable=False keeps them frozen.
    model = _small()
    apply_freeze(model, "all_trainable", bn_trainable=False)
    before = _snapshot(model)
    _fit(model, *_data((8, 8, 1)))
    changed = _changed(model, before)
    assert {"conv0/kernel", "conv1/kernel", "conv2/kernel"} <= changed
    assert not any(path.startswith("bn") for path in changed)


def test_all_trainable_trains_batchnorm_by_default():
    model = _small()
    apply_freeze(model, "all_trainable")
    before = _snapshot(model)
    _fit(model, *_data((8, 8, 1)))
    changed = _changed(model, before)
    assert {"bn0/moving_mean", "bn2/gamma", "conv0/kernel"} <= changed


@pytest.mark.parametrize(
    "bn_trainable, expected",
    [
        (None, {"conv2/kernel"}),
        (
            True,
            {
                "conv2/kernel",
                "bn2/gamma",
                "bn2/beta",
                "bn2/moving_mean",
                "bn2/moving_variance",
            },
        ),
    ],
)
def test_top_k_changes_only_the_top_layers(bn_trainable, expected):
    model = _small()
    # Weighted layers: conv0 bn0 conv1 bn1 conv2 bn2; the top 2 are conv2
    # and bn2, and BN stays frozen unless asked.
    trainable = apply_freeze(model, "top_k", top_k=2, bn_trainable=bn_trainable)
    assert trainable == (["conv2", "bn2"] if bn_trainable else ["conv2"])
    before = _snapshot(model)
    _fit(model, *_data((8, 8, 1)))
    assert _changed(model, before) == expected | {
        "logits/kernel",
        "logits/bias",
    }


def test_phases_schedule():
    cfg = dict(freeze="top_k", top_k=10, head_only_epochs=2, finetune_lr_factor=0.1)
    warmup, finetune = phases(5, **cfg)
    assert (warmup.name, warmup.start_epoch, warmup.end_epoch) == (
        "warmup",
        0,
        2,
    )
    assert warmup.freeze == "frozen" and warmup.lr_factor == 1.0
    assert (finetune.start_epoch, finetune.end_epoch) == (2, 5)
    assert finetune.freeze == "top_k" and finetune.top_k == 10
    assert finetune.lr_factor == 0.1 and finetune.bn_trainable is False
    assert [p.name for p in phases(2, **cfg)] == ["warmup"]
    single = phases(3, freeze="all_trainable")
    assert single == [Phase("train", 0, 3, "all_trainable", 0, True, 1.0)]
    frozen = phases(3, freeze="frozen", head_only_epochs=2)
    assert [(p.name, p.freeze) for p in frozen] == [("train", "frozen")]
    bn = phases(3, freeze="all_trainable", head_only_epochs=1, bn_trainable=False)
    assert bn[1].bn_trainable is False


def test_two_phase_fit():
    model = _small()
    x, y = _data((8, 8, 1))
    schedule = phases(2, freeze="all_trainable", head_only_epochs=1)
    backbone = get_backbone(model)
    for phase in schedule:
        apply_phase(model, phase)
        before = _snapshot(model)
        model.compile(
            keras.optimizers.SGD(1e-2 * phase.lr_factor),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        model.fit(
            x,
            y,
            batch_size=8,
            initial_epoch=phase.start_epoch,
            epochs=phase.end_epoch,
            verbose=0,
        )
        changed = _changed(model, before)
        backbone_changed = {p for p in changed if not p.startswith("logits")}
        if phase.name == "warmup":
            assert not backbone.trainable and not backbone_changed
        else:
            assert backbone.trainable and "conv0/kernel" in backbone_changed


def test_get_backbone_through_a_wrapper():
    model = _small()

    class Wrapper:
        classifier = model

    assert get_backbone(Wrapper()) is get_backbone(model)
    with pytest.raises(ValueError, match="exactly one nested backbone"):
        get_backbone(keras.Sequential([keras.layers.Dense(2)]))
