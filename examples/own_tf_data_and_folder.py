"""Your own `tf.data` pipeline, and a folder of images, trained
adversarially with `advtrain.fit` and evaluated.

    python examples/own_tf_data_and_folder.py          # seconds: 2 epochs, small folder
    python examples/own_tf_data_and_folder.py --full   # 12 epochs, every digit as a PNG

Data: scikit-learn's digits (no download). For the folder part the script
writes them as PNG files into `digits_png/` under the current folder, one
folder per class, the layout advtrain's `folder` source reads:
`digits_png/train/<class>/*.png` and `digits_png/test/<class>/*.png`.

Runs on: TensorFlow, and JAX with TensorFlow installed (`tf.data`).
"""

import argparse
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from PIL import Image
from sklearn.datasets import load_digits

import advtrain
from advtrain.data import load_splits

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--full", action="store_true", help="real sizes")
args = parser.parse_args()
epochs = 12 if args.full else 2
quick = {} if args.full else dict(max_examples=100, apgd_steps=10, square_queries=100)
evaluation = dict(budget="cheap", pgd_steps=10, **quick)

digits = load_digits()
images = np.round(digits.images * (255 / 16)).astype("uint8")  # 8-bit, as files are
labels = digits.target.astype("int64")
order = np.random.default_rng(0).permutation(len(labels))
images, labels = images[order], labels[order]
train, test = slice(0, 1437), slice(1437, None)


def build():
    # A function, not a model: advtrain.fit builds it inside its
    # distribution strategy's scope. Logits out.
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, keras.layers.Dense(10)(h))


def to_unit_pixels(image, label):
    # The attack's eps (0.1) and clipping are in [0, 1] pixel units:
    # 8-bit images must be scaled before they reach the model.
    return tf.cast(image, tf.float32) / 255.0, label


# 1. Your own tf.data pipeline: unbatched (image, label) examples; advtrain
# shuffles and batches them (batch_size is the global batch).
examples = tf.data.Dataset.from_tensor_slices((images[train][..., None], labels[train]))
examples = examples.map(to_unit_pixels, num_parallel_calls=tf.data.AUTOTUNE)
result = advtrain.fit(
    build,
    examples,
    attack={"method": "pgd", "eps": 0.1, "steps": 3, "adv_weight": 1.0},
    batch_size=64,
    epochs=epochs,
    train={"learning_rate": 3e-3},
    echo=None,  # quiet: the runtime and batch lines are advtrain run's
)
# Evaluated after training, the worst case over FGSM, PGD, AutoAttack.
test_data = (images[test][..., None] / 255.0, labels[test])
measured = advtrain.evaluate(result.model, test_data, eps=0.1, **evaluation)
print(f"tf.data: robust accuracy {measured['robust_accuracy']:.1%}")

# 2. A folder of images, one subfolder per class (the names are the labels,
# sorted). A few per class for the quick run.
root = Path("digits_png")
per_class = None if args.full else 30
for split, index in (("train", train), ("test", test)):
    counts = {}
    for image, label in zip(images[index], labels[index], strict=True):
        if per_class and counts.get(label, 0) >= per_class:
            continue
        counts[label] = counts.get(label, 0) + 1
        folder = root / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{counts[label]:04d}.png")

# advtrain's folder source checks every file, decodes in parallel and
# gives uint8 (image, label) examples; `advtrain run` reads the same layout
# with `data.source: folder`.
splits = load_splits("folder", path=str(root))
print(
    f"folder: {splits.train_size} train / {splits.test_size} test images, "
    f"{splits.image_shape}, classes {splits.class_names}"
)
result = advtrain.fit(
    build,
    splits.train.map(to_unit_pixels),
    attack={"method": "pgd", "eps": 0.1, "steps": 3, "adv_weight": 1.0},
    batch_size=32,
    epochs=epochs * 3,  # fewer images: more epochs for the same steps
    train={"learning_rate": 3e-3},
    echo=None,
)
test_batches = splits.test.map(to_unit_pixels).batch(128)
measured = advtrain.evaluate(result.model, test_batches, eps=0.1, **evaluation)
print(
    f"folder: clean accuracy {measured['clean_accuracy']:.1%}, robust accuracy "
    f"{measured['robust_accuracy']:.1%} ({measured['examples']} test images)"
)
