"""The SavedModel export on each backend: `advtrain export` of a model
made on JAX serves what the model predicts (Keras converts it with
jax2tf, TensorFlow installed); without TensorFlow the command is one line,
exit 2, naming the install, and writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from typer.testing import CliRunner

from advtrain import backend
from advtrain.cli.commands import app
from advtrain.models.classifier import build_classifier

runner = CliRunner()

# On JAX (KERAS_BACKEND=jax): an advtrain classifier (its pixel, channel
# and preprocessing layers), saved, exported by the command, and its
# predictions on uint8 images saved for the test to compare.
ON_JAX = """
import sys
import keras
import numpy as np
from advtrain.cli.commands import app
from advtrain.models.classifier import build_classifier

assert keras.backend.backend() == "jax"
model = build_classifier((8, 8, 1), 10, backbone="small_cnn", width=4)
model.save("model.keras")
images = np.random.default_rng(0).integers(0, 256, (5, 8, 8, 1)).astype("uint8")
logits = keras.ops.convert_to_numpy(model(images.astype("float32") / 255.0))
np.savez("expected.npz", images=images, logits=logits)
app(args=["export", "model.keras", "--output", "served"], prog_name="advtrain")
"""


def test_advtrain_export_serves_a_jax_model(tmp_path):
    import tensorflow as tf

    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, "-c", ON_JAX],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "exported model.keras to served" in done.stdout
    saved = np.load(tmp_path / "expected.npz")
    served = tf.saved_model.load(str(tmp_path / "served"))
    signature = served.signatures["serving_default"]
    out = signature(images=tf.constant(saved["images"]))
    np.testing.assert_allclose(out["logits"].numpy(), saved["logits"], atol=1e-5)
    np.testing.assert_allclose(out["probabilities"].numpy().sum(1), 1.0, atol=1e-5)


@pytest.mark.backend_neutral
def test_export_without_tensorflow_is_one_line_and_writes_nothing(
    tmp_path, monkeypatch
):
    # The JAX tier has no TensorFlow; here every tier is made to lack it.
    monkeypatch.setattr(backend, "HAS_TENSORFLOW", False)
    build_classifier((8, 8, 1), 10, width=4).save(tmp_path / "model.keras")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = runner.invoke(app, ["export", str(tmp_path / "model.keras")])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2, result.output
    assert len(errors) == 1 and result.output.strip() == errors[0], result.output
    assert 'pip install "advtrain[tensorflow]"' in errors[0]
    assert f"backend={keras.backend.backend()}" in errors[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before
