"""`export_saved_model`: a trained classifier as a TF Serving SavedModel,
from TensorFlow or JAX (Keras's export converts a JAX model with jax2tf);
either needs TensorFlow installed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Union

import keras

from advtrain import backend

SIGNATURE = "serving_default"


def check_exportable() -> None:
    """Raises the one-line `ValueError` where this process cannot write a
    SavedModel: TensorFlow missing, or a backend Keras exports none from."""
    if backend.exports_saved_model(backend.NAME):
        return
    why = (
        f"TensorFlow: {backend.install_command(['tensorflow'])}"
        if not backend.HAS_TENSORFLOW
        else "a model on TensorFlow or JAX"
    )
    raise ValueError(
        f"The SavedModel export needs {why} (model.keras loads on every "
        f"backend). Received: backend={backend.NAME}, "
        f"tensorflow_installed={backend.HAS_TENSORFLOW}"
    )


def export_saved_model(
    classifier: keras.Model, path: Union[str, Path], *, replace: bool = False
) -> Path:
    """Writes `classifier` as a SavedModel that serves raw uint8 images.

    Its `serving_default` signature takes `images`, uint8 `[None, H, W, C]`,
    and returns float32 `logits` and `probabilities`: no preprocessing or
    advtrain install needed to serve it. Written under a temporary name and
    renamed, so a crash leaves the old export or the new, never a mix.
    Runs on TensorFlow and on JAX, with TensorFlow installed.

    Args:
        classifier: maps [0, 1] float pixels `[N, H, W, C]` to logits.
        path: the SavedModel folder; must not exist or be empty.
        replace: replace an existing SavedModel at `path` instead.

    Example:

    ```python
    export_saved_model(classifier, "runs/demo/export/saved_model")
    served = tf.saved_model.load("runs/demo/export/saved_model")
    out = served.signatures["serving_default"](images=uint8_batch)
    out["probabilities"]
    ```
    """
    check_exportable()
    tf = backend.tensorflow_or_none()
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path}: exists and is not a folder.")
    if not replace and path.exists() and any(path.iterdir()):
        raise FileExistsError(
            f"{path}: already exists; choose a new folder for the export."
        )
    shape = tuple(classifier.input_shape[1:])
    if len(shape) != 3 or any(d is None for d in shape):
        raise ValueError(
            "export_saved_model needs a classifier with a fixed image input "
            f"[H, W, C]. Received: input_shape={classifier.input_shape}"
        )

    def serve(images):  # keras.ops: on JAX, jax2tf traces it with JAX arrays
        pixels = keras.ops.cast(images, "float32") / 255.0
        logits = keras.ops.cast(classifier(pixels, training=False), "float32")
        return {"logits": logits, "probabilities": keras.ops.softmax(logits)}

    archive = keras.export.ExportArchive()
    archive.track(classifier)
    archive.add_endpoint(
        name=SIGNATURE,
        fn=serve,
        input_signature=[tf.TensorSpec((None, *shape), tf.uint8, name="images")],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    old = path.with_name(f".old-{os.getpid()}-{path.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        archive.write_out(str(tmp), verbose=False)
        if path.exists():
            os.replace(path, old)  # empty unless replace=True
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return path
