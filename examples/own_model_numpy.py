"""Your own Keras model on numpy arrays: train it adversarially, measure its
robust accuracy, save it, reload it.

    python examples/own_model_numpy.py          # seconds: 3 epochs, 100 test digits
    python examples/own_model_numpy.py --full   # 15 epochs, all 360 test digits

Data: scikit-learn's 1,797 8x8 handwritten digits (shipped with it, no
download). Writes `own_model.keras` into the current folder.

Runs on: TensorFlow, JAX (`KERAS_BACKEND=jax`; TensorFlow not needed).
"""

import argparse

import keras
import numpy as np
from sklearn.datasets import load_digits

import advtrain
from advtrain import AdversarialModel, Attack

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--full", action="store_true", help="real sizes (a minute)")
args = parser.parse_args()
epochs, test_examples = (15, None) if args.full else (3, 100)

# Pixels must be in [0, 1]: eps, step sizes and clipping are pixel units.
# The digits are 0..16, so divide by 16 (0..255 images: divide by 255).
digits = load_digits()
x = (digits.images / 16.0).astype("float32")[..., None]  # (1797, 8, 8, 1)
y = digits.target.astype("int64")
order = np.random.default_rng(0).permutation(len(y))  # the file is sorted by writer
x, y = x[order], y[order]
x_train, y_train, x_test, y_test = x[:1437], y[:1437], x[1437:], y[1437:]

# Your model: any functional or Sequential model that returns logits (no
# softmax at the end; the losses and the attacks use from_logits=True).
keras.utils.set_random_seed(0)
inputs = keras.Input((8, 8, 1))
h = keras.layers.Conv2D(32, 3, padding="same")(inputs)
h = keras.layers.BatchNormalization()(h)  # momentum left at Keras's 0.99: see below
h = keras.layers.ReLU()(h)
h = keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu")(h)
h = keras.layers.GlobalAveragePooling2D()(h)
logits = keras.layers.Dense(10)(h)
classifier = keras.Model(inputs, logits)

# FGSM with a random start at eps 0.1, trained on adversarial examples only.
# AdversarialModel is a keras.Model: compile and fit as usual. On the first
# fit it lowers the BatchNorm momentum to suit this short run (0.99 would
# leave the moving statistics far from the data; it says so in a warning).
model = AdversarialModel(classifier, Attack("fgsm_rs", eps=0.1), adv_weight=1.0)
model.compile(
    optimizer=keras.optimizers.Adam(3e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
history = model.fit(x_train, y_train, batch_size=64, epochs=epochs, verbose=0)
print(
    f"trained {epochs} epoch(s): adv_accuracy {history.history['adv_accuracy'][-1]:.3f}"
)

# The worst case per digit over FGSM, PGD and AutoAttack is the number to
# quote. The quick run shrinks AutoAttack's budget; --full runs the cheap one.
quick = {} if args.full else {"apgd_steps": 10, "square_queries": 100}
result = advtrain.evaluate(
    classifier,
    (x_test, y_test),
    eps=0.1,
    budget="cheap",
    max_examples=test_examples,
    pgd_steps=10,
    **quick,
)
low, high = result["robust_accuracy_ci95"]
print(
    f"clean accuracy {result['clean_accuracy']:.1%}, robust accuracy "
    f"{result['robust_accuracy']:.1%} (95% CI {low:.1%}-{high:.1%}, "
    f"{result['examples']} digits, eps 0.1)"
)

# Save the classifier itself: raw [0, 1] pixels in, logits out, nothing of
# the training wrapper. `import advtrain` registers the fused BatchNorm
# layer AdversarialModel put in, so any process that imports it can load it.
classifier.save("own_model.keras")
reloaded = keras.saving.load_model("own_model.keras")
before = classifier.predict(x_test, verbose=0)
after = reloaded.predict(x_test, verbose=0)
same = np.allclose(before, after, atol=1e-5)
print(f"reloaded own_model.keras: same predictions: {same}")
if not same:
    raise SystemExit("the reloaded model predicts differently")
