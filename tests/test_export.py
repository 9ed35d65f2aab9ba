"""SavedModel export: raw uint8 images in, the classifier's predictions out."""

import numpy as np
import pytest
import tensorflow as tf

from advtrain.export import export_saved_model


def test_saved_model_serves_uint8_images_like_the_classifier(
    trained_dense, digits, tmp_path
):
    path = export_saved_model(trained_dense, tmp_path / "export" / "saved_model")
    assert (path / "saved_model.pb").is_file()
    assert not list(path.parent.glob(".tmp-*"))
    served = tf.saved_model.load(str(path))
    signature = served.signatures["serving_default"]
    spec = signature.structured_input_signature[1]["images"]
    assert spec.dtype == tf.uint8 and spec.shape.as_list() == [None, 8, 8, 1]

    images = np.round(digits[0][:32] * 255).astype(np.uint8)
    out = signature(images=tf.constant(images))
    expected = trained_dense(images.astype("float32") / 255.0).numpy()
    np.testing.assert_allclose(out["logits"].numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(out["probabilities"].numpy().sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(
        out["probabilities"].numpy().argmax(1), expected.argmax(1)
    )


def test_export_refuses_a_non_empty_folder(trained_dense, tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="already exists"):
        export_saved_model(trained_dense, tmp_path)
