"""Offline transfer learning: pretrain on MNIST IDX files (mnist_pretrain),
fine-tune on sklearn digits through `model.weights` (digits_transfer)."""

import os
from pathlib import Path

import numpy as np
import pytest

from advtrain.data.synthetic import write_mnist
from advtrain.models.classifier import build_classifier
from advtrain.recipe.loader import load_recipe
from advtrain.recipe.run import run
from advtrain.recipe.saved import load_classifier

RECIPES = Path(__file__).parents[2] / "advtrain" / "recipes"
_TINY = [
    "model.width=4",
    "train.batch_size=32",
    "train.steps_per_epoch=2",
    "eval.fgsm=false",
    "eval.pgd_steps=1",
    "eval.eps_sweep=[]",
    "eval.sanity_examples=0",
    "output.plots=false",
    "output.tensorboard=false",
    "output.export_saved_model=false",
]


def test_shipped_recipes_hand_the_backbone_over():
    pretrain = load_recipe(RECIPES / "mnist_pretrain.yaml")
    transfer = load_recipe(RECIPES / "digits_transfer.yaml")
    assert transfer.model.weights == f"{pretrain.output.dir}/model.keras"
    assert pretrain.data.path == "../shared/data/mnist"  # as mnist_fgsm_rs
    assert (pretrain.model.backbone, pretrain.model.width) == (
        transfer.model.backbone,
        transfer.model.width,
    )
    assert transfer.model.head_only_epochs >= 1
    assert transfer.model.batchnorm.trainable is None  # frozen in the warm-up


@pytest.mark.slow
def test_pretrain_then_fine_tune_loads_the_weights(tmp_path):
    write_mnist(tmp_path / "mnist", n_train=96, n_test=32)
    pretrain = load_recipe(
        RECIPES / "mnist_pretrain.yaml",
        [
            *_TINY,
            f"data.path={tmp_path / 'mnist'}",
            "train.epochs=1",
            f"output.dir={tmp_path / 'pretrain'}",
        ],
    )
    run(pretrain, echo=lambda line: None)
    weights = tmp_path / "pretrain" / "model.keras"
    pretrained = load_classifier(weights)

    transfer = load_recipe(
        RECIPES / "digits_transfer.yaml",
        [*_TINY, f"model.weights={weights}", "train.epochs=2"],
    )
    # MNIST's 28x28 classifier loads into the digits one: 8x8 pixels in,
    # resized to 28x28 inside, the same backbone and head.
    model_keys = {"backbone", "weights", "input_size", "width", "dropout"}
    fresh = build_classifier(
        (8, 8, 1), 10, **transfer.model.model_dump(include=model_keys)
    )
    assert fresh.get_layer("resize").height == 28
    for a, b in zip(fresh.weights, pretrained.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)

    lines = []
    result = run(transfer, tmp_path / "fine_tune", echo=lines.append)
    assert any(
        line.startswith("phase warmup: epochs 1-1, freeze=frozen") for line in lines
    )
    assert any(line.startswith("phase finetune: epochs 2-2") for line in lines)
    assert len(result.history["loss"]) == 2
    assert os.path.isfile(result.output_dir / "model.keras")
    m = result.metrics
    assert m["robust_accuracy"] <= m["pgd_accuracy"] <= m["clean_accuracy"]
