"""What counts is what the user wrote (issue 29): a setting a method does
not take is refused in a recipe, but a run folder's recipe.yaml written by
0.2, every key filled in, still loads as the run it recorded."""

from pathlib import Path

import pytest
import yaml

from advtrain.recipe.build import attack_from_config
from advtrain.recipe.loader import load_recipe, recipe_from_dict
from advtrain.recipe.schema import RecipeError

OLD = Path(__file__).parent / "fixtures" / "recipe_0_2_fgsm.yaml"


def test_a_0_2_resolved_recipe_loads_without_the_keys_it_never_used():
    recipe = load_recipe(OLD)
    attack = attack_from_config(recipe.attack)
    assert repr(attack) == "Attack('fgsm', eps=0.1, norm='inf')"
    assert recipe.attack.reuse_gradient == "auto"  # was attack.fused_step
    resolved = recipe.to_dict()["attack"]
    assert "steps" not in resolved and "fused_step" not in resolved
    # Written again by 0.3, it reads back the same, strictly.
    assert recipe_from_dict(yaml.safe_load(recipe.to_yaml())) == recipe


def test_the_same_keys_written_by_a_user_are_refused(tmp_path):
    data = yaml.safe_load(OLD.read_text())
    del data["attack"]["fused_step"]  # no longer all of 0.2's keys
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value) == (
        f"{path}: attack.steps: fgsm does not take steps; it takes eps, norm, "
        "clip_min, clip_max. Received: steps=50"
    )
