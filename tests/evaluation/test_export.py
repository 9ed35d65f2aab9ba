"""SavedModel export: raw uint8 images in, the classifier's predictions out."""

import numpy as np
import pytest
import tensorflow as tf

from advtrain.evaluation.export import export_saved_model


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


# ---------------------------------------------------------------- a run's export

TRADES_RECIPE = {
    "name": "tiny-trades",
    "data": {"source": "digits", "limit_train": 128, "limit_test": 32},
    "model": {"backbone": "small_cnn", "width": 4},
    "attack": {
        "method": "pgd",
        "eps": 0.1,
        "steps": 2,
        "objective": "trades",
        "objective_options": {"beta": 1.0},
    },
    "train": {"epochs": 1, "batch_size": 32},
    "eval": {"attacks": ["pgd"], "pgd_steps": 1, "sanity_examples": 0},
    "output": {"tensorboard": False, "plots": False, "export_saved_model": True},
}


@pytest.fixture(scope="module")
def trades_run(tmp_path_factory):
    from advtrain.recipe.loader import recipe_from_dict
    from advtrain.recipe.run import run

    out = tmp_path_factory.mktemp("trades") / "run"
    result = run(recipe_from_dict(TRADES_RECIPE), out, echo=lambda line: None)
    return result


def test_objective_trades_runs_through_run(trades_run):
    history, metrics = trades_run.history, trades_run.metrics
    # clean_loss is the cross-entropy, adv_loss TRADES's KL term.
    for key in ("loss", "clean_loss", "adv_loss", "adv_accuracy"):
        assert np.isfinite(history[key]).all(), key
    assert 0.0 < history["adv_loss"][-1] < history["clean_loss"][-1]
    assert "zero_grad_fraction" not in history  # PGD measures none
    assert metrics["pgd_accuracy"] <= metrics["clean_accuracy"]
    assert metrics["examples"] == 32  # data.limit_test
    saved = (trades_run.output_dir / "recipe.yaml").read_text()
    assert "objective: trades" in saved and "beta: 1.0" in saved


def test_run_saved_model_serves_what_model_keras_predicts(trades_run, digits):
    from advtrain.recipe.saved import load_classifier

    out = trades_run.output_dir
    served = tf.saved_model.load(str(out / "export" / "saved_model"))
    images = np.round(digits[0][:16] * 255).astype(np.uint8)
    logits = served.signatures["serving_default"](images=tf.constant(images))
    classifier = load_classifier(out / "model.keras")
    expected = classifier(images.astype("float32") / 255.0, training=False)
    np.testing.assert_allclose(logits["logits"].numpy(), expected, atol=1e-5)
