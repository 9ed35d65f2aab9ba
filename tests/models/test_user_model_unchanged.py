"""Training through AdversarialModel leaves the user's model a plain Keras
model: its BatchNorm layers keep their class, and a classifier saved after
training loads where advtrain is never imported, predicting the same."""

import sys

import keras
import numpy as np
from helpers import bn_classifier, run_fresh

from advtrain.attacks import Attack
from advtrain.models import AdversarialModel
from advtrain.models.batchnorm.walk import batchnorm_layers

LOAD = """
import sys
import numpy as np
import keras
model = keras.models.load_model(sys.argv[1])
np.save(sys.argv[3], model.predict(np.load(sys.argv[2]), verbose=0))
assert not any(name.startswith("advtrain") for name in sys.modules), "advtrain"
"""


def test_trained_classifier_loads_without_advtrain(digits, tmp_path):
    x, y = digits[0][:256], digits[1][:256]
    classifier = bn_classifier(seed=1)
    model = AdversarialModel(classifier, Attack("fgsm_rs", eps=0.1), 1.0)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    assert [type(bn) for bn in batchnorm_layers(classifier)] == [
        keras.layers.BatchNormalization
    ]
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    assert [type(bn) for bn in batchnorm_layers(classifier)] == [
        keras.layers.BatchNormalization
    ]
    classifier.save(tmp_path / "m.keras")
    np.save(tmp_path / "x.npy", x[:32])
    script = tmp_path / "load.py"
    script.write_text(LOAD)
    run_fresh(
        [sys.executable, script, tmp_path / "m.keras", tmp_path / "x.npy"]
        + [tmp_path / "out.npy"],
        cwd=tmp_path,
    )
    expected = classifier.predict(x[:32], verbose=0)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, atol=1e-5)
