"""`import advtrain` in a fresh interpreter: quiet, and enough to load
anything a run saved (custom Keras objects, the `gtsrb` TFDS builder)."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "advtrain"

# Run in a fresh interpreter; prints one JSON object.
FRESH = """
import json, sys
import numpy as np
import advtrain
import keras
import tensorflow_datasets as tfds

model_path, names, data_dir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
# Before any public name is used: the application's are imported lazily.
undir = [n for n in advtrain.__all__ if n not in dir(advtrain)]
from advtrain import run
model = keras.saving.load_model(model_path)
x = np.linspace(0.0, 1.0, 2 * 8 * 8).reshape(2, 8, 8, 1).astype("float32")
print(json.dumps({
    "logits": np.asarray(model(x)).tolist(),
    "layers": sorted({type(layer).__name__ for layer in model.layers}),
    "unregistered": [
        n for n in names
        if keras.saving.get_registered_object(f"advtrain>{n}") is None
    ],
    "builder": type(tfds.builder("gtsrb", data_dir=data_dir)).__module__,
    "missing": [n for n in advtrain.__all__ if not hasattr(advtrain, n)],
    "undir": undir,
    "run": f"{run.__module__}.{run.__name__}",
    "fit": type(advtrain.fit).__name__,
    "version": advtrain.__version__,
}))
"""


def fresh_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}
    env.pop("ADVTRAIN_DEBUG", None)
    return env


def registered_names():
    """Classes under advtrain/ decorated with register_keras_serializable."""
    names = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                "register_keras_serializable" in ast.unparse(d)
                for d in node.decorator_list
            ):
                names.append(node.name)
    return sorted(names)


def saved_classifier(path):
    """A classifier holding each advtrain layer, compiled with OneCycle."""
    from advtrain.models.batchnorm.fused import FusedBatchNormalization
    from advtrain.models.layers import BackbonePreprocess, ResizeTo, ToChannels
    from advtrain.train.runtime import OneCycle

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    h = ToChannels(3)(inputs)
    h = ResizeTo(8, 8)(h)
    h = BackbonePreprocess("tf")(h)
    h = keras.layers.Conv2D(4, 3, padding="same")(h)
    h = FusedBatchNormalization(momentum=0.9)(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(10)(h))
    model.compile(
        optimizer=keras.optimizers.Adam(OneCycle(0.01, 2, 10)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x = np.random.default_rng(0).random((16, 8, 8, 1), dtype=np.float32)
    model.fit(x, np.arange(16) % 10, epochs=1, verbose=0)
    model.save(path)
    return model


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fresh")
    path = tmp / "model.keras"
    model = saved_classifier(path)
    names = registered_names()
    result = subprocess.run(
        [sys.executable, "-c", FRESH, path, json.dumps(names), tmp / "tfds"],
        capture_output=True,
        text=True,
        env=fresh_env(),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    x = np.linspace(0.0, 1.0, 2 * 8 * 8).reshape(2, 8, 8, 1).astype("float32")
    return json.loads(result.stdout), np.asarray(model(x)), names, result.stderr


def test_model_saved_elsewhere_loads_after_import_advtrain(fresh):
    out, expected, _, stderr = fresh
    assert "FusedBatchNormalization" in out["layers"]
    np.testing.assert_allclose(out["logits"], expected, atol=1e-5)
    assert stderr == ""


def test_import_registers_every_serializable_class(fresh):
    out, _, names, _ = fresh
    assert {"FusedBatchNormalization", "AdversarialModel", "TRADES"} <= set(names)
    assert "OneCycle" in names and len(names) >= 7
    assert out["unregistered"] == []


def test_tfds_gtsrb_is_advtrains_builder(fresh):
    assert fresh[0]["builder"] == "advtrain.data.gtsrb.builder"


def test_public_names_resolve(fresh):
    out = fresh[0]
    assert out["missing"] == [] and out["undir"] == []
    assert out["run"] == "advtrain.recipe.run.run"  # from advtrain import run
    assert out["fit"] == "function"  # not the advtrain.train.fitting module
    assert out["version"]


def test_import_advtrain_is_silent_on_stderr():
    result = subprocess.run(
        [sys.executable, "-c", "import advtrain.recipe.schema"],
        capture_output=True,
        text=True,
        env=fresh_env(),
        timeout=300,
    )
    assert result.returncode == 0
    assert result.stderr == ""


# ------------------------------------------------ start-up line filter

STARTUP = [
    "WARNING: All log messages before absl::InitializeLog() is called are "
    "written to STDERR\n",
    "I0000 00:00:1796121565.764004    6730 port.cc:153] oneDNN custom "
    "operations are on.\n",
    "I0000 00:00:1796121565.764324    6730 cudart_stub.cc:31] Could not find "
    "cuda drivers on your machine, GPU will not be used.\n",
    "I0000 00:00:1796121565.870976    6730 cpu_feature_guard.cc:227] This "
    "TensorFlow binary is optimized to use available CPU instructions.\n",
    "To enable the following instructions: AVX2 FMA, in other operations, "
    "rebuild TensorFlow with the appropriate compiler flags.\n",
    "E0000 00:00:1796121556.503050    6584 cuda_platform.cc:52] failed call "
    "to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR\n",
    "E0000 00:00:1718000000.000000    1234 cuda_dnn.cc:8310] Unable to "
    "register cuDNN factory: Attempting to register factory for plugin "
    "cuDNN when one has already been registered\n",
]
REAL = [
    "E0000 00:00:1796121556.503050    6584 op_kernel.cc:1] disk full\n",
    "  second line of that error\n",
    "/x.py:3: UserWarning: something the user should see\n",
]


def test_filter_drops_startup_lines_and_keeps_the_rest():
    from advtrain.backend._tfimport import filter_startup_lines

    assert filter_startup_lines(STARTUP, 2) == []
    mixed = [STARTUP[0], REAL[0], REAL[1], STARTUP[1], STARTUP[3], STARTUP[4]]
    assert filter_startup_lines(mixed + [REAL[2]], 2) == REAL
    assert filter_startup_lines([STARTUP[2], REAL[2]], 2) == [REAL[2]]
    # Warnings show at level 1; cuInit failing is news when a driver exists.
    warning = "W0000 00:00:1.0  1 x.cc:1] a warning\n"
    assert filter_startup_lines([warning], 1) == [warning]
    assert filter_startup_lines([warning], 2) == []
    assert filter_startup_lines([STARTUP[5]], 2) == [STARTUP[5]]
