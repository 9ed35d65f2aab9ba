"""Evaluating someone else's saved Keras model: its robust accuracy, the
worst case per example over FGSM, PGD and AutoAttack.

    python examples/evaluate_saved_model.py          # seconds: 100 test digits
    python examples/evaluate_saved_model.py --full   # 360, standard budget

First it plays "someone else": plain Keras, no advtrain, a clean model
that takes 0..255 pixels and ends in a softmax, saved to `theirs.keras` in
the current folder. Then it evaluates that file as you would.

Runs on: TensorFlow, JAX (`KERAS_BACKEND=jax`; TensorFlow not needed).
"""

import argparse

import keras
import numpy as np
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--full", action="store_true", help="all test digits, full budget")
args = parser.parse_args()

digits = load_digits()
x = np.round(digits.images * (255 / 16)).astype("float32")[..., None]  # 0..255
y = digits.target.astype("int64")
order = np.random.default_rng(0).permutation(len(y))
x, y = x[order], y[order]
x_train, y_train, x_test, y_test = x[:1437], y[:1437], x[1437:], y[1437:]


def someone_elses_model(path):
    """Plain Keras, as it reaches you: 0..255 pixels in, probabilities out."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_train, y_train, batch_size=64, epochs=8, verbose=0)
    model.save(path)


someone_elses_model("theirs.keras")

import advtrain  # noqa: E402  (after "someone else": their file holds no advtrain)

theirs = keras.saving.load_model("theirs.keras")

# advtrain's attacks work in [0, 1] pixels on logits. Adapt the model
# instead of the data: scale [0, 1] up to the 0..255 it expects, and take
# the softmax's output back to logits (log-probabilities are logits up to
# a constant, so the losses and the attacks' gradients are the same).
# eps 0.1 is then 25.5 grey levels of the original images.
inputs = keras.Input((8, 8, 1))
probabilities = theirs(keras.layers.Rescaling(255.0)(inputs))
logits = keras.layers.Lambda(lambda p: keras.ops.log(p + 1e-12))(probabilities)
model = keras.Model(inputs, logits)

quick = {} if args.full else dict(max_examples=100, apgd_steps=10, square_queries=100)
result = advtrain.evaluate(
    model,
    (x_test / 255.0, y_test),
    eps=0.1,
    budget="standard" if args.full else "cheap",
    pgd_steps=20 if args.full else 10,
    **quick,
)

low, high = result["robust_accuracy_ci95"]
print(
    f"headline: robust accuracy {result['robust_accuracy']:.1%} "
    f"(95% CI {low:.1%}-{high:.1%}, {result['examples']} digits, eps 0.1 L-inf, "
    f"worst case over {', '.join(result['robust_accuracy_over'])})"
)
# The table: each attack run on every digit, then AutoAttack's cascade,
# where each member attacks only the digits every earlier attack left.
print(f"  {'clean':<32} {result['clean_accuracy']:7.1%}")
for name in ("fgsm", "pgd"):
    print(f"  {name.upper():<32} {result[f'{name}_accuracy']:7.1%}")
for step in result["autoattack"]["steps"]:
    row = f"after {step['attack']} (broke {step['broken']} of {step['attacked']})"
    print(f"  {row:<32} {step['robust_accuracy_after']:7.1%}")
# Square needs no gradient: when it breaks what the gradient attacks left
# standing, the gradients mislead them (masking), and PGD alone overstates.
print(f"  broken by Square alone: {result.get('gradient_free_only', 0)} digits")
