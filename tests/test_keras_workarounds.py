"""Each workaround in advtrain._keras_workarounds is still needed: these
tests reproduce the Keras bug with the installed Keras. When one FAILS,
the bug is fixed upstream: delete the workaround (and the test). That the
workaround lets `fit` run is what every TensorFlow launch test checks
(tests/train/test_preemption.py)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from advtrain.backend.tensorflow.distribution import tf_configs
from advtrain.cli.launch import free_ports

ROOT = Path(__file__).resolve().parents[1]
# Two workers on free loopback ports: one launch at a time under xdist.
pytestmark = pytest.mark.launch

# Two workers fit a plain Keras model under MultiWorkerMirroredStrategy,
# without advtrain's workaround.
WORKER = textwrap.dedent(
    """
    import numpy as np
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(
            optimizer="sgd",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    x = np.random.default_rng(0).random((64, 4)).astype("float32")
    y = np.arange(64) % 2
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
    model.fit(data, epochs=1, steps_per_epoch=2, verbose=0)
    print("FIT_OK")
    """
)


def _fit_on_two_workers(tmp_path) -> list[tuple[int, str]]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    procs = []
    for config in tf_configs(addresses):
        env = dict(
            os.environ,
            TF_CONFIG=config,
            TF_CPP_MIN_LOG_LEVEL="2",
            PYTHONPATH=str(ROOT),
            CUDA_VISIBLE_DEVICES="",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    results = []
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        results.append((proc.returncode, output))
    return results


@pytest.mark.slow
def test_keras_fit_still_fails_under_multi_worker(tmp_path):
    # keras-team/keras#20585. If this fails, Keras fixed the bug: remove
    # fit_under_multi_worker and Runtime.prepare_model's call to it.
    results = _fit_on_two_workers(tmp_path)
    assert not any("FIT_OK" in output for _, output in results), results[0][1][-2000:]
    # ...and for the known reason: the build batch is a PerReplica value.
    assert any("PerReplica" in output for _, output in results), results[0][1][-2000:]
