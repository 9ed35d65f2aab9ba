"""`import advtrain` on Keras's JAX backend loads the core without
TensorFlow; the TensorFlow-only parts say what to install in one line."""

import importlib.util
import sys

import pytest
from helpers import run_fresh

pytestmark = pytest.mark.backend_neutral

SCRIPT = """
import sys
import advtrain
assert "tensorflow" not in sys.modules, "tensorflow was imported"
assert advtrain.AdversarialModel and advtrain.Attack and advtrain.TRADES
import keras
import numpy as np
model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                          keras.layers.Dense(10)])
x, y = np.zeros((4, 8, 8, 1), "float32"), np.zeros(4, "int64")
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
advtrain.fit(model, (x, y), batch_size=2, echo=None, loss=loss)
print("fit: trained")
try:  # a function building a tf.data.Dataset: TensorFlow's
    advtrain.fit(model, lambda: None, echo=None, loss=loss)
except (ImportError, TypeError) as exc:
    print("error:", type(exc).__name__, exc)
"""


@pytest.mark.skipif(
    importlib.util.find_spec("jax") is None, reason="JAX is not installed"
)
def test_import_on_jax_loads_no_tensorflow(tmp_path):
    done = run_fresh([sys.executable, "-c", SCRIPT], tmp_path, KERAS_BACKEND="jax")
    lines = done.stdout.strip().splitlines()
    assert "fit: trained" in lines, done.stdout  # arrays: numpy batches
    if importlib.util.find_spec("tensorflow") is None:
        assert lines[-1] == (
            "error: ImportError advtrain.fit takes a tf.data.Dataset or a "
            "function building one only with TensorFlow, which is not "
            'installed: pip install "advtrain[tensorflow]", or pass (x, y) '
            "arrays or a stream function of skip. "
            "Received: function"
        )
