"""The source registry: built-ins known before import, plugins by keyword."""

import numpy as np
import pytest

from advtrain.data import load_splits, register_source, sources, splits_from_arrays


def test_builtin_sources_are_known_before_their_module_is_imported():
    assert {"digits", "mnist", "gtsrb", "arrays", "folder", "tfds"} <= set(
        sources.names()
    )
    assert "folder" in sources and "nope" not in sources
    with pytest.raises(ValueError, match="Unknown data source 'foldr'.*'folder'"):
        sources.get("foldr")


def test_registered_source_gets_the_options_its_signature_names():
    calls = []

    @register_source("test_noise_source")
    def noise(*, limit_train=None, seed=0):
        calls.append((limit_train, seed))
        rng = np.random.default_rng(seed)
        x = rng.random((20, 4, 4, 1), dtype=np.float32)
        y = np.arange(20) % 2
        return splits_from_arrays(
            (x[:16], y[:16]), (x[16:], y[16:]), num_classes=2, limit_train=limit_train
        )

    # Recipe keys the source does not take are left out; unknown ones fail.
    splits = load_splits("test_noise_source", limit_train=8, seed=3, path="unused")
    assert calls == [(8, 3)] and splits.train_size == 8
    with pytest.raises(TypeError, match="Received: limit_tran=8"):
        load_splits("test_noise_source", limit_tran=8)
    with pytest.raises(ValueError, match="already registered"):
        register_source("test_noise_source")(noise)
