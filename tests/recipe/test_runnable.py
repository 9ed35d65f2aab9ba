"""`Recipe.check_runnable`: what this process cannot run is one
`RecipeError` naming the key, raised before a run writes anything.
`output.tensorboard` and `output.export_saved_model` need TensorFlow:
`auto` (the default) resolves to what this environment can write, and the
resolved recipe says it; `true` where it cannot be written is refused;
`false` is always kept. `attack.backend: cleverhans` needs Keras on
TensorFlow."""

import keras
import pytest

from advtrain import backend
from advtrain.recipe.loader import recipe_from_dict
from advtrain.recipe.schema import RecipeError

KEYS = ("tensorboard", "export_saved_model")


def _output(**output):
    return recipe_from_dict({"name": "o", "output": output}).to_dict()["output"]


@pytest.mark.backend_neutral
@pytest.mark.parametrize("installed", [True, False])
def test_auto_resolves_to_what_tensorflow_allows(installed, monkeypatch):
    monkeypatch.setattr(backend, "HAS_TENSORFLOW", installed)
    saved = _output()
    assert {k: saved[k] for k in KEYS} == {k: installed for k in KEYS}
    assert {k: _output(**{k: "auto"})[k] for k in KEYS} == {k: installed for k in KEYS}
    assert {k: _output(**{k: False})[k] for k in KEYS} == {k: False for k in KEYS}


@pytest.mark.backend_neutral
def test_auto_is_what_this_environment_can_write():
    # The real flag, unpatched: the JAX tier has no TensorFlow, the other has.
    saved = _output()
    assert saved["tensorboard"] is backend.HAS_TENSORFLOW
    assert saved["export_saved_model"] is backend.exports_saved_model(backend.NAME)


@pytest.mark.backend_neutral
@pytest.mark.parametrize("key", KEYS)
def test_true_without_tensorflow_is_one_line_naming_the_install(key, monkeypatch):
    monkeypatch.setattr(backend, "HAS_TENSORFLOW", False)
    recipe = recipe_from_dict({"name": "o", "output": {key: True}})
    with pytest.raises(RecipeError) as caught:
        recipe.check_runnable()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"output.{key}: ")
    assert 'pip install "advtrain[tensorflow]"' in message
    name = keras.backend.backend()
    assert message.endswith(f"Received: output.{key}=true, runtime.backend={name}")


@pytest.mark.backend_neutral
@pytest.mark.parametrize("value", [True, "auto", False])
def test_where_tensorflow_is_installed_every_value_runs(value, monkeypatch):
    monkeypatch.setattr(backend, "HAS_TENSORFLOW", True)
    recipe = recipe_from_dict({"name": "o", "output": {k: value for k in KEYS}})
    recipe.check_runnable()  # TensorFlow and JAX both export (JAX: jax2tf)
    assert recipe.output.tensorboard is (value is not False)


@pytest.mark.backend_neutral
@pytest.mark.parametrize("value", ["yes", 1, "on"])
def test_other_values_are_refused(value):
    with pytest.raises(RecipeError, match="output.tensorboard"):
        recipe_from_dict({"name": "o", "output": {"tensorboard": value}})


@pytest.mark.backend_neutral
def test_cleverhans_where_keras_is_not_on_tensorflow_is_one_line(monkeypatch):
    monkeypatch.setattr(backend, "IMPORTS_TENSORFLOW", False)
    attack = {"method": "fgsm", "backend": "cleverhans"}
    recipe = recipe_from_dict({"name": "o", "attack": attack})
    with pytest.raises(RecipeError) as caught:
        recipe.check_runnable()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("attack.backend: the cleverhans backend runs on")
    name = keras.backend.backend()
    assert message.endswith(
        f"Received: attack.backend=cleverhans, runtime.backend={name}"
    )
    monkeypatch.setattr(backend, "IMPORTS_TENSORFLOW", True)
    recipe.check_runnable()
