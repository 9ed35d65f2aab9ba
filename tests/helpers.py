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


def art_classifier(model, input_shape=(8, 8, 1), classes=10):
    """`model` wrapped for ART (the independent attack implementations the
    tests compare against): logits out, pixels in [0, 1]."""
    from art.estimators.classification import TensorFlowV2Classifier

    return TensorFlowV2Classifier(
        model=model,
        nb_classes=classes,
        input_shape=input_shape,
        loss_object=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        clip_values=(0.0, 1.0),
    )


def accuracy(model, x, y) -> float:
    return float(np.mean(np.argmax(model(x, training=False), axis=-1) == y))


# ------------------------------------------------- one vs two CPU replicas

# Logical CPU devices must be configured before TensorFlow starts, so each
# replica count trains in its own process. A script starts with this
# prelude (`runtime` is ready, `out` is where it saves its arrays) and
# ends with `np.savez(out, **arrays)`.
REPLICA_PRELUDE = """\
import os, sys
import numpy as np
from advtrain.train.runtime import make_runtime

replicas, out = int(sys.argv[1]), sys.argv[2]
runtime = make_runtime(
    strategy="mirrored" if replicas > 1 else "default",
    cpu_replicas=replicas if replicas > 1 else None,
    steps_per_execution=1,
)
assert runtime.replicas == replicas, runtime.describe()
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
"""


def run_on_replicas(tmp_path, body: str, replicas=(1, 2)) -> dict:
    """Runs REPLICA_PRELUDE + `body` once per replica count, concurrently;
    returns {replicas: the arrays it saved}."""
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "replicas.py"
    script.write_text(REPLICA_PRELUDE + textwrap.dedent(body))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(root))
    env.pop("TF_CONFIG", None)
    procs = {
        r: subprocess.Popen(
            [sys.executable, str(script), str(r), str(tmp_path / f"r{r}.npz")],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in replicas
    }
    for proc in procs.values():
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, output[-3000:]
    return {r: np.load(tmp_path / f"r{r}.npz") for r in replicas}
