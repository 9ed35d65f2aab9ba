"""Without network, downloads stop within seconds with the offline advice.

Every URL here is on `.invalid`, which never resolves (RFC 6761), or on
localhost: no test contacts a real host, even when the code under test is
broken.
"""

import os
import socket
import subprocess
import sys
import time

import pytest
import tensorflow_datasets as tfds

from advtrain.data import load_splits
from advtrain.utils.downloads import check_reachable

OFFLINE_URL = "http://advtrain-offline.invalid/gtsrb/"
# Far below the 3 min 24 s of TFDS retries this replaces.
FAST_S = 10.0


class OfflineProbeDataset(tfds.core.GeneratorBasedBuilder):
    """A TFDS dataset whose only file lives on a host that never resolves."""

    VERSION = tfds.core.Version("1.0.0")
    URL = "http://advtrain-offline.invalid/data/images.npz"

    @property
    def url_infos(self):
        # Stands in for the registered checksums of a catalog dataset.
        return {self.URL: None}

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(4, 4, 3)),
                    "label": tfds.features.ClassLabel(num_classes=2),
                }
            ),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        dl_manager.download(self.URL)
        return {"train": self._generate_examples()}

    def _generate_examples(self):  # pragma: no cover (never reached)
        yield from ()


def _timed_error(call) -> tuple[str, float]:
    start = time.monotonic()
    with pytest.raises(ValueError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message
    return message, time.monotonic() - start


def test_unresolvable_host_fails_at_once():
    start = time.monotonic()
    with pytest.raises(OSError, match="cannot resolve advtrain-offline.invalid"):
        check_reachable("https://advtrain-offline.invalid/x.zip")
    assert time.monotonic() - start < FAST_S


def test_refused_connection_fails_and_listening_host_passes():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        check_reachable(f"http://127.0.0.1:{port}/file")
    # Closed now: nothing listens there.
    with pytest.raises(OSError, match=f"cannot connect to 127.0.0.1:{port}"):
        check_reachable(f"http://127.0.0.1:{port}/file")


def test_gtsrb_download_fails_in_seconds(monkeypatch, tmp_path):
    monkeypatch.setenv("ADVTRAIN_GTSRB_URL", OFFLINE_URL)
    message, seconds = _timed_error(
        lambda: load_splits("gtsrb", image_size=(8, 8), tfds_data_dir=str(tmp_path))
    )
    assert seconds < FAST_S
    assert message.startswith(
        f"path: no GTSRB files given, and gtsrb could not download {OFFLINE_URL} ("
    )
    assert "GTSRB_Final_Training_Images.zip" in message
    assert "in a directory and name it here" in message


def test_tfds_download_fails_in_seconds(tmp_path):
    message, seconds = _timed_error(
        lambda: load_splits(
            "tfds", tfds_name="offline_probe_dataset", tfds_data_dir=str(tmp_path)
        )
    )
    assert seconds < FAST_S
    assert "tfds offline_probe_dataset: could not download" in message
    assert "cannot resolve advtrain-offline.invalid" in message
    assert "Offline? Prepare it on a machine with network" in message


def test_imagenet_weights_fail_in_seconds(monkeypatch, tmp_path):
    from keras.src.backend import config as keras_config
    from keras.src.utils import file_utils

    from advtrain.models import weights
    from advtrain.models.classifier import build_classifier

    def real_download(*args, **kwargs):
        raise AssertionError("Keras started a real download")

    monkeypatch.setattr(keras_config, "_KERAS_DIR", str(tmp_path))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    monkeypatch.setattr(file_utils, "urlretrieve", real_download)
    monkeypatch.setattr(weights, "WEIGHTS_URL", "https://advtrain-offline.invalid/")
    message, seconds = _timed_error(
        lambda: build_classifier(
            (32, 32, 3), 4, backbone="resnet50", weights="imagenet"
        )
    )
    assert seconds < FAST_S
    assert "cannot resolve advtrain-offline.invalid" in message
    assert "resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5" in message
    assert str(tmp_path / "models") in message
    assert message.startswith("weights: ") and "None (null)" in message


def test_cli_run_gtsrb_offline_fails_fast(tmp_path):
    # The clock starts once the CLI module (and TensorFlow) is imported:
    # start-up on a busy machine is not the download's time.
    script = (
        "import atexit, runpy, sys, time\n"
        "import advtrain.cli.commands\n"
        "start = time.monotonic()\n"
        "atexit.register(lambda: print(f'elapsed {time.monotonic() - start:.2f}',"
        " file=sys.stderr))\n"
        "sys.argv = ['advtrain', *sys.argv[1:]]\n"
        "runpy.run_module('advtrain.cli', run_name='__main__')\n"
    )
    args = ["run", "gtsrb_resnet", "--set", f"data.tfds_data_dir={tmp_path / 'tfds'}"]
    result = subprocess.run(
        [sys.executable, "-c", script, *args, "--output", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=dict(os.environ, ADVTRAIN_GTSRB_URL=OFFLINE_URL),
        timeout=200,  # TFDS's retries alone took 204 s
    )
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-2000:]
    # The library's `path` error, reported under the recipe key.
    head = "data.path: no GTSRB files given, and gtsrb could not download"
    assert f"{head} {OFFLINE_URL}" in errors[0]
    assert "GTSRB_Final_Training_Images.zip" in errors[0]
    assert not (tmp_path / "run").exists()
    seconds = float(lines[-1].removeprefix("elapsed "))
    assert seconds < FAST_S, seconds
