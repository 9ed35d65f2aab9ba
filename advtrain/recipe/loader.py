"""Reading a recipe: strict YAML (no duplicate keys, bounded size and
depth), `--set` overrides, and errors as one line naming the file and key.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Optional, Union

import pydantic
import yaml

from advtrain.recipe.schema import Recipe, RecipeError
from advtrain.utils.errors import one_line
from advtrain.utils.options import format_validation_error

# Hostile or mistaken files fail fast: a recipe is a few KB of YAML.
MAX_RECIPE_BYTES = 1_000_000
MAX_DEPTH = 16
MAX_VALUES = 100_000


# Keys renamed in 0.2 and 0.3: this line instead of "unknown key".
_REUSE = "(the clean pass's gradient gives the attack's)"
RENAMED_KEYS = {
    "model.warmup_epochs": "'model.head_only_epochs' (head-only epochs before "
    "fine-tuning; train.warmup_epochs is the learning-rate warm-up)",
    "attack.fused": f"'attack.reuse_gradient' {_REUSE}",
    "attack.fused_step": f"'attack.reuse_gradient' in 0.3 {_REUSE}",
    "model.batchnorm.fused": "'model.batchnorm.fused_kernel' (TensorFlow's "
    "fused BatchNorm kernel)",
    "attack.grad_align": "'attack.objective: grad_align' with the weight in "
    "'attack.objective_options.grad_align' (default 0.2)",
    "attack.beta": "'attack.objective_options.beta' (attack.objective: trades)",
}

# Values renamed in 0.3.
RENAMED_VALUES = {
    ("attack.method", "trades"): (
        "'attack.objective: trades' with 'attack.method: pgd' (TRADES is a "
        "training objective; PGD maximises its KL term)"
    ),
}


class _StrictLoader(yaml.SafeLoader):
    """Safe loader that also rejects duplicate keys."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode):
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        problem = None
        if not isinstance(key_node, yaml.ScalarNode):
            problem = "a key must be a plain name, not a list or mapping"
        elif (key := loader.construct_object(key_node, deep=True)) in mapping:
            problem = f"duplicate key '{key}'"
        if problem:
            raise yaml.constructor.ConstructorError(
                None, None, problem, key_node.start_mark
            )
        mapping[key] = loader.construct_object(value_node, deep=True)
    return mapping


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping
)


def _check_shape(data: Any, source: str) -> None:
    """Refuses documents deeper than MAX_DEPTH or with more than MAX_VALUES
    values, aliases counted at each use ("billion laughs")."""
    stack = [(data, 1)]
    count = 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise RecipeError(
                f"{source}: too many values (more than {MAX_VALUES}, aliases "
                "counted at each use); a recipe holds a few dozen."
            )
        if isinstance(node, (dict, list)):
            if depth > MAX_DEPTH:
                raise RecipeError(
                    f"{source}: nested deeper than {MAX_DEPTH} levels; a "
                    "recipe is section.key: value."
                )
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)


def parse_yaml(text: str, source: str) -> Any:
    """Parses YAML with a safe loader; any error becomes one RecipeError line."""
    if len(text) > MAX_RECIPE_BYTES:
        raise RecipeError(
            f"{source}: larger than {MAX_RECIPE_BYTES} bytes; a recipe is a "
            f"few KB. Received: {len(text)} characters"
        )
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (safe)
    except RecursionError:
        raise RecipeError(
            f"{source}: invalid YAML: nested too deeply (limit {MAX_DEPTH})"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or one_line(exc)
        if "could not determine a constructor" in str(exc):
            problem = f"{problem}; tags that build Python objects are not allowed"
        raise RecipeError(f"{source}:{where}: invalid YAML: {problem}") from None
    except (ValueError, TypeError, OverflowError) as exc:
        # Scalars the YAML constructors choke on (a timestamp out of range).
        raise RecipeError(f"{source}: invalid YAML: {exc}") from None
    _check_shape(data, source)
    return data


def _first_error(exc: pydantic.ValidationError, source: str) -> RecipeError:
    for error in exc.errors(include_url=False):
        key = ".".join(str(part) for part in error["loc"])
        value = error.get("input")
        if isinstance(value, str) and (key, value) in RENAMED_VALUES:
            renamed = RENAMED_VALUES[key, value]
            return RecipeError(f"{source}: '{key}: {value}' was renamed {renamed}.")
    return RecipeError(format_validation_error(exc, source, Recipe, RENAMED_KEYS))


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Applies `section.key=value` overrides; values are parsed as YAML."""
    data = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise RecipeError(f"--set: expected section.key=value. Received: {item!r}")
        path, raw = item.split("=", 1)
        keys = path.strip().split(".")
        if not all(keys):
            raise RecipeError(
                f"--set: empty key in {path!r}. Expected section.key=value."
            )
        value = parse_yaml(raw, f"--set {path}") if raw.strip() else None
        node = data
        for key in keys[:-1]:
            if node.get(key) is None:
                node[key] = {}
            if not isinstance(node[key], dict):
                raise RecipeError(f"--set {path}: '{key}' is a value, not a section.")
            node = node[key]
        node[keys[-1]] = value
    return data


def _sections(data: Any, source: str) -> dict:
    """A parsed recipe as its mapping of sections (an empty file is {})."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(
            f"{source}: a recipe must be a mapping of sections. "
            f"Received: {type(data).__name__}"
        )
    return data


def from_resolved_0_2(data: dict[str, Any]) -> dict[str, Any]:
    """A run folder's recipe.yaml written by 0.2 as 0.3 reads it (others
    unchanged): 0.2 wrote every attack key, so those its method does not
    take are dropped, and `fused_step` is `reuse_gradient`."""
    from advtrain.recipe.schema import METHOD_KEYS, without_untaken_keys

    attack = data.get("attack") if isinstance(data, dict) else None
    if not isinstance(attack, dict) or not {*METHOD_KEYS, "fused_step"} <= set(attack):
        return data
    attack = dict(attack)
    attack["reuse_gradient"] = attack.pop("fused_step")
    return {**data, "attack": without_untaken_keys(attack)}


def recipe_from_dict(data: Any, source: str = "recipe") -> Recipe:
    """Validates a parsed recipe; errors are one-line RecipeErrors."""
    try:
        recipe = Recipe.model_validate(from_resolved_0_2(_sections(data, source)))
    except pydantic.ValidationError as exc:
        raise _first_error(exc, source) from None
    from advtrain.recipe.build import check_attack_section

    try:
        check_attack_section(recipe)
    except (TypeError, ValueError) as exc:
        where = "" if isinstance(exc, RecipeError) else "attack: "
        raise RecipeError(f"{source}: {where}{one_line(exc)}") from None
    return recipe


def load_recipe(
    path: Union[str, Path], overrides: Optional[list[str]] = None
) -> Recipe:
    """Reads a YAML recipe, applies `section.key=value` overrides and
    validates it; errors are one-line RecipeErrors naming file and key.

    Example:

    ```python
    recipe = load_recipe("recipes/quickstart.yaml", ["train.epochs=2"])
    ```
    """
    path = Path(path)
    if path.is_dir():
        raise RecipeError(f"{path}: is a folder, expected a recipe file.")
    if not path.is_file():
        raise RecipeError(f"{path}: recipe file not found.")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_RECIPE_BYTES + 1)
        if len(raw) > MAX_RECIPE_BYTES:
            raise RecipeError(
                f"{path}: larger than {MAX_RECIPE_BYTES} bytes; a recipe is a few KB."
            )
        text = raw.decode("utf-8")
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read recipe: {exc.strerror}.") from None
    except UnicodeDecodeError as exc:
        raise RecipeError(
            f"{path}: not UTF-8 text (byte {exc.start}); a recipe is YAML."
        ) from None
    data = _sections(parse_yaml(text, str(path)), str(path))
    data = apply_overrides(data, overrides or [])
    return recipe_from_dict(data, str(path))
