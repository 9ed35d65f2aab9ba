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
try:
    advtrain.fit
except ImportError as exc:
    print("error:", exc)
else:
    print("fit: imported")
"""


@pytest.mark.skipif(
    importlib.util.find_spec("jax") is None, reason="JAX is not installed"
)
def test_import_on_jax_loads_no_tensorflow(tmp_path):
    done = run_fresh([sys.executable, "-c", SCRIPT], tmp_path, KERAS_BACKEND="jax")
    if importlib.util.find_spec("tensorflow") is None:
        assert done.stdout.strip() == (
            "error: advtrain.fit needs TensorFlow, which is not installed: "
            "pip install tensorflow. "
            "Received: KERAS_BACKEND=jax"
        )
    else:
        assert done.stdout.strip() == "fit: imported"
