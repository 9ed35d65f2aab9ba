"""Fine-tuning a pretrained backbone adversarially, offline, the way the
shipped transfer recipes do it: pretrain, save, load the weights into the
target task's classifier, train the head alone, then everything.

    python examples/finetune_pretrained.py                   # seconds, digits only
    python examples/finetune_pretrained.py --full            # real MNIST (~5 min)
    python examples/finetune_pretrained.py --full --imagenet # MobileNetV2, ImageNet

Run it from the repository root. `--full` runs the two recipes as shipped
(`mnist_pretrain`: 20,000 MNIST images from ../shared/data/mnist; then
`digits_transfer`); the quick run shrinks them and pretrains on the digits
themselves, so it needs no MNIST files. `--imagenet` fine-tunes MobileNetV2
from Keras's ImageNet file instead (downloaded once, or already in
~/.keras/models/). Run folders go to `runs/example_*` in the current folder.

Runs on: TensorFlow, JAX (the recipes' `runtime.backend: auto` runs them
on the backend Keras runs on; TensorFlow not needed, the digits and
MNIST's IDX files are read without it).
"""

import argparse
import shutil
from pathlib import Path

import advtrain

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--full", action="store_true", help="the recipes as shipped")
parser.add_argument("--imagenet", action="store_true", help="with --full: ImageNet")
args = parser.parse_args()
if args.imagenet and not args.full:
    parser.error("--imagenet needs --full (ImageNet-sized runs are not quick)")

RECIPES = Path(advtrain.__file__).parent / "recipes"  # the shipped recipes
# The quick run: a narrow network, few examples and epochs, a small evaluation.
QUICK_MODEL = ["model.width=8", "data.limit_train=500"]
QUICK_EVAL = [
    "eval.pgd_steps=5",
    "eval.max_examples=100",
    "eval.budget=cheap",
    "eval.apgd_steps=10",
    "eval.square_queries=100",
    "eval.sanity_examples=0",
    "output.plots=false",
]


def fresh(folder):
    shutil.rmtree(folder, ignore_errors=True)  # a finished run is not rerun
    return folder


def headline(name, metrics):
    over = ", ".join(metrics["robust_accuracy_over"][1:])  # after "clean"
    print(
        f"{name}: clean {metrics['clean_accuracy']:.1%}, worst case over {over} "
        f"{metrics['robust_accuracy']:.1%} on {metrics['examples']} test images"
    )


if args.imagenet:
    # The backbone's own preprocessing (and the resize to its minimum
    # size) is part of the model, so the digits go in as [0, 1] pixels and
    # eps stays in their units.
    weights = "imagenet"
    overrides = ["model.backbone=mobilenet_v2"]
else:
    # 1. Pretraining: a small BatchNorm CNN, half clean and half FGSM-RS loss.
    pretrain = ["output.dir=runs/example_pretrain"]
    if not args.full:
        # Stand-in source task: the digits at MNIST's 28x28 (no MNIST files).
        pretrain += (
            QUICK_MODEL
            + QUICK_EVAL
            + [
                "data.source=digits",
                "data.path=null",
                "data.limit_train=1000",
                "model.input_size=[28,28]",
                "train.batch_size=64",
                "train.learning_rate=0.005",
                "eval.attacks=[fgsm]",  # a glance
            ]
        )
    recipe = advtrain.load_recipe(RECIPES / "mnist_pretrain.yaml", pretrain)
    result = advtrain.run(recipe, fresh(Path("runs/example_pretrain")), echo=print)
    headline("pretrained", result.metrics)
    weights = str(result.output_dir / "model.keras")
    overrides = []

# 2. Fine-tuning on the digits: `model.weights` loads the whole classifier
# (both tasks are the ten digits; a head of another size would be rebuilt),
# one epoch trains the head alone with the backbone frozen (its BatchNorm in
# inference mode), then the whole network trains with FGSM-RS at eps 0.1.
overrides += [f"model.weights={weights}"]
if not args.full:
    # FGSM and PGD; --full runs the recipe's whole evaluation (the standard
    # AutoAttack set), as examples/evaluate_saved_model.py does.
    overrides += (
        QUICK_MODEL + QUICK_EVAL + ["train.epochs=2", "eval.attacks=[fgsm,pgd]"]
    )
recipe = advtrain.load_recipe(RECIPES / "digits_transfer.yaml", overrides)
result = advtrain.run(recipe, fresh(Path("runs/example_transfer")), echo=print)
headline("fine-tuned", result.metrics)
