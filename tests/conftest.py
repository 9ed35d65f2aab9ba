"""Shared fixtures: small models trained once per session on real digits."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from helpers import dense_classifier  # noqa: E402


@pytest.fixture(scope="session")
def digits():
    """scikit-learn's digits as float [0, 1] arrays (N, 8, 8, 1), shuffled
    once with a fixed seed (the file is ordered by writer)."""
    if keras.backend.backend() == "tensorflow":
        from advtrain.data.digits import load_digits_arrays

        x, y = load_digits_arrays()
    else:  # advtrain.data imports TensorFlow: the same arrays, read here
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = (bunch.images.astype(np.float32) / 16.0)[..., None]
        y = bunch.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    return x[order], y[order]


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


@pytest.fixture(scope="session")
def digits_cnn(digits):
    """A tiny CNN trained cleanly on 1,500 digits (about 97% test accuracy):
    the model the attack tests and their ART comparisons share."""
    x, y = digits
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(h)
    h = keras.layers.Flatten()(h)
    outputs = keras.layers.Dense(10)(h)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(x[:1500], y[:1500], epochs=10, batch_size=64, verbose=0)
    return model


@pytest.fixture(scope="session")
def test_digits(digits):
    """The digits the training fixtures never saw (297)."""
    x, y = digits
    return x[1500:], y[1500:]


@pytest.fixture(scope="session")
def replica_runs(request, tmp_path_factory):
    """`replica_runs(name)` -> {replicas: arrays} for a script registered
    with `helpers.on_replicas`. The first call runs every script the
    session's selected tests name (`@pytest.mark.replicas(NAME)`) in one
    process per replica count."""
    from helpers import REPLICA_SCRIPTS, run_replica_scripts

    names = {
        mark.args[0]
        for item in request.session.items
        for mark in item.iter_markers("replicas")
    }
    unknown = names - set(REPLICA_SCRIPTS)
    assert not unknown, f"no script registered for {sorted(unknown)}"
    results = {}

    def get(name: str) -> dict:
        assert name in names, f"mark the test @pytest.mark.replicas({name!r})"
        if not results:
            folder = tmp_path_factory.mktemp("replicas")
            results.update(run_replica_scripts(folder, sorted(names)))
        found = {r: results[name, r] for r in REPLICA_SCRIPTS[name][1]}
        for r, value in found.items():
            assert not isinstance(value, str), f"{name} on {r} replica(s):\n{value}"
        return found

    return get


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Groups for `pytest -n 2 --dist loadgroup` (scripts/test): tests that
    start a launch (workers on free loopback ports) run one after another;
    the replica checks share one pair of processes; the tests of a module
    with a module-scoped run share one worker, so the run happens once.
    Then the order: the longest work first."""
    for item in items:
        if item.get_closest_marker("launch"):
            group = "launch"
        elif item.get_closest_marker("replicas"):
            group = "replicas"
        elif any(
            fixture.scope == "module"
            for defs in item._fixtureinfo.name2fixturedefs.values()
            for fixture in defs
        ):
            group = item.module.__name__
        else:
            continue
        item.add_marker(pytest.mark.xdist_group(group))
    # Longest first, so no long group is left for the end: the launches,
    # the replica processes, then the slow tests and shared runs.
    items.sort(key=_start_order)


def _start_order(item) -> int:
    if item.get_closest_marker("launch"):
        return 0
    if item.get_closest_marker("replicas"):
        return 1
    if item.get_closest_marker("slow") or item.get_closest_marker("xdist_group"):
        return 2
    return 3


@pytest.fixture
def sparse_ce():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.fixture(autouse=True)
def _no_leaked_op_determinism():
    """`runtime.deterministic` turns on TF op determinism for the process;
    it also makes Keras silently drop XLA. Keep tests independent."""
    yield
    if "tensorflow" not in sys.modules:
        return  # the JAX tier: no TensorFlow to leak from
    from tensorflow.python.framework import config as tf_config

    if tf_config.is_op_determinism_enabled():
        tf_config.disable_op_determinism()


@pytest.fixture(autouse=True)
def _no_leaked_debug_flag():
    """`advtrain --debug` sets ADVTRAIN_DEBUG=1 for the process (and the
    workers it starts); an in-process CLI test must not pass it on to the
    fresh interpreters of later tests."""
    before = os.environ.get("ADVTRAIN_DEBUG")
    yield
    if before is None:
        os.environ.pop("ADVTRAIN_DEBUG", None)
    else:
        os.environ["ADVTRAIN_DEBUG"] = before


def pytest_ignore_collect(collection_path, config):
    """Off TensorFlow (the JAX tier) only the test modules that hold
    backend-neutral tests, and the folders with one, are collected: the
    others import TensorFlow."""
    if keras.backend.backend() == "tensorflow":
        return None
    if collection_path.is_dir():
        modules = list(collection_path.rglob("test_*.py"))
    elif collection_path.name.startswith("test_") and collection_path.suffix == ".py":
        modules = [collection_path]
    else:
        return None
    return not any("backend_neutral" in m.read_text(encoding="utf-8") for m in modules)
