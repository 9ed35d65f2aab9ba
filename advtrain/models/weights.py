"""Where backbone weights come from: the `weights` argument.

"imagenet": Keras downloads the file once into `$KERAS_HOME/models/`
(offline, a quick check fails within seconds with one line naming the file
and the folder to place it in); a path: a Keras 3 `.weights.h5` / `.keras`
file of the classifier or the backbone, or a legacy `.h5` of the backbone;
None: random initialisation.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import warnings
from pathlib import Path
from typing import Optional

import keras

from advtrain.backbones.registry import BackboneSpec
from advtrain.models.batchnorm.fused import switch_batchnorm
from advtrain.models.batchnorm.walk import batchnorm_layers
from advtrain.utils.downloads import check_reachable
from advtrain.utils.errors import ArgumentError, one_line

# Where keras.applications downloads its ImageNet weights from.
WEIGHTS_URL = "https://storage.googleapis.com/tensorflow/keras-applications/"
# Per socket operation, not for the whole download.
DOWNLOAD_TIMEOUT_S = 30.0
# Sides Keras has MobileNetV2 ImageNet files for; others get the 224 file.
_MOBILENET_SIDES = (96, 128, 160, 192, 224)
# Quoted error lines (a download or h5 failure) are cut to this length.
_QUOTED = 160


def _keras_models_dir() -> str:
    # Resolved as Keras does; it has no public accessor.
    home = os.environ.get("KERAS_HOME")
    if home is None:
        base = os.path.expanduser("~")
        if not os.access(base, os.W_OK):
            base = "/tmp"
        home = os.path.join(base, ".keras")
    return os.path.join(home, "models")


@contextlib.contextmanager
def _socket_timeout(seconds: float):
    # urllib (used by keras.utils.get_file) waits forever without a default
    # timeout when packets are dropped; set one only if the caller has not.
    previous = socket.getdefaulttimeout()
    if previous is None:
        socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        if previous is None:
            socket.setdefaulttimeout(None)


def _download_failure(exc: BaseException) -> Optional[str]:
    # The URL (or "") if `exc` is a failed download, else None.
    match = re.search(r"URL fetch failure on (\S+?): ", str(exc))
    if match:
        return match.group(1)
    if isinstance(exc, OSError):  # timeouts, refused or reset connections
        return ""
    return None


def _weights_file(spec: BackboneSpec, url: str, side: int) -> str:
    if url:
        return url.rsplit("/", 1)[-1]
    if spec.weights_file is None:
        return "its weights file"
    size = side if side in _MOBILENET_SIDES else 224
    return spec.weights_file.format(size=size)


def _offline(name: str, spec: BackboneSpec, exc: BaseException, side: int):
    url = _download_failure(exc) or ""
    file = _weights_file(spec, url, side)
    where = f" from {url}" if url else ""
    return ArgumentError(
        "weights",
        f"cannot download the imagenet weights for {name}"
        f"{where} ({one_line(exc, limit=_QUOTED)}). Place {file} in "
        f"{_keras_models_dir()}/ ($KERAS_HOME/models/, default "
        "~/.keras/models/), or set weights to the path of a weights file, "
        "or to None (null) to train from scratch. "
        "Received: weights=imagenet",
    )


def _check_download(name: str, spec: BackboneSpec, side: int) -> None:
    # Fails in seconds, before Keras tries, if its download cannot start
    # (unless the cached file's name is unknown: that is left to Keras).
    if spec.weights_file is None:
        return
    file = _weights_file(spec, "", side)
    if os.path.isfile(os.path.join(_keras_models_dir(), file)):
        return
    try:
        check_reachable(WEIGHTS_URL)
    except OSError as exc:
        raise _offline(name, spec, exc, side) from None


def is_pretrained_name(weights: Optional[str]) -> bool:
    return weights == "imagenet"


def build_backbone(
    name: str,
    spec: BackboneSpec,
    input_shape: tuple[int, int, int],
    *,
    weights: Optional[str] = None,
    **options,
) -> keras.Model:
    """Builds the backbone, fetching pretrained weights when named (a
    weights path is loaded later, by `load_weights_file`); `options` go to
    `BackboneSpec.build`."""
    if not is_pretrained_name(weights):
        return spec.build(input_shape, weights=None, **options)
    if weights not in spec.pretrained:
        offered = ", ".join(spec.pretrained) or "none"
        raise ArgumentError(
            "weights",
            f"backbone {name} has no '{weights}' weights (pretrained: "
            f"{offered}); use a weights file path or None (null). "
            f"Received: weights={weights}",
        )
    _check_download(name, spec, input_shape[0])
    with _socket_timeout(DOWNLOAD_TIMEOUT_S):
        try:
            return spec.build(input_shape, weights=weights, **options)
        except Exception as exc:  # noqa: BLE001 (get_file raises Exception)
            if _download_failure(exc) is not None:
                raise _offline(name, spec, exc, input_shape[0]) from None
            if "corrupted file" in str(exc):
                raise ArgumentError(
                    "weights",
                    f"the cached imagenet weights for {name} "
                    f"in {_keras_models_dir()}/ are corrupted "
                    f"({one_line(exc, limit=_QUOTED)}); delete the file to download "
                    "it again. Received: weights=imagenet",
                ) from None
            raise


def _strict_load(model: keras.Model, path: str) -> None:
    # A `.keras` file keys a layer's weights by its class name: on a
    # mismatch each BatchNorm layer takes the other class for the load.
    try:
        _load_exactly(model, path)
    except (ValueError, KeyError):
        layers = batchnorm_layers(model)
        plain = [
            layer for layer in layers if type(layer) is keras.layers.BatchNormalization
        ]
        fused = switch_batchnorm(layers, fused=False)
        switch_batchnorm(plain, fused=True)
        if not (plain or fused):
            raise
        try:
            _load_exactly(model, path)
        finally:
            switch_batchnorm(plain, fused=False)
            switch_batchnorm(fused, fused=True)


def _load_exactly(model: keras.Model, path: str) -> None:
    # Keras only warns when a nested container finds nothing to load and
    # leaves those layers freshly initialised; here that is a mismatch.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.load_weights(path)
    for warning in caught:
        text = str(warning.message)
        if "Skipping" in text or "freshly-initialized" in text:
            raise ValueError(text)
        warnings.warn_explicit(
            warning.message, warning.category, warning.filename, warning.lineno
        )


def load_weights_file(classifier: keras.Model, backbone: keras.Model, path: str) -> str:
    """Loads `path` into the classifier or its backbone; returns which (a
    Keras 3 file is tried on the classifier first; a legacy `.h5` goes to
    the backbone)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ArgumentError(
            "weights",
            "expected 'imagenet', a weights file or None (null); "
            f"no such file. Received: weights={path}",
        )
    name = file.name
    if name.endswith((".weights.h5", ".keras")):
        saved = classifier.get_weights()
        try:
            _strict_load(classifier, str(file))
            return "classifier"
        except (ValueError, KeyError) as exc:
            classifier.set_weights(saved)
            first = one_line(exc, limit=_QUOTED)
        try:
            _strict_load(backbone, str(file))
            return "backbone"
        except (ValueError, KeyError) as exc:
            classifier.set_weights(saved)
            raise ArgumentError(
                "weights",
                f"{path} fits neither the classifier "
                f"({first}) nor the {backbone.name} backbone "
                f"({one_line(exc, limit=_QUOTED)}). Received: weights={path}",
            ) from None
    if name.endswith((".h5", ".hdf5")):
        try:
            backbone.load_weights(str(file))
        except (ValueError, KeyError, OSError) as exc:
            raise ArgumentError(
                "weights",
                f"cannot load {path} into the {backbone.name} "
                f"backbone ({one_line(exc, limit=_QUOTED)}). Received: weights={path}",
            ) from None
        return "backbone"
    raise ArgumentError(
        "weights",
        "a weights file must end in .weights.h5, .keras or "
        f".h5. Received: weights={path}",
    )
