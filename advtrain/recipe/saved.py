"""A saved classifier: loading it safely, and evaluating it (`advtrain eval`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Union

import keras

from advtrain.recipe import build
from advtrain.recipe.run_folder import holds_run
from advtrain.recipe.schema import Recipe, RecipeError
from advtrain.utils.errors import one_line
from advtrain.utils.io import atomic_write_json
from advtrain.utils.progress import Echo


def load_classifier(path: Union[str, Path], safe_mode: bool = True) -> keras.Model:
    """Loads a saved classifier; `safe_mode` refuses Python code (a Lambda
    layer's), which would run on load: turn it off only for trusted files."""
    import advtrain.models  # noqa: F401  (registers advtrain's layers)
    from advtrain.utils.io import check_keras_file

    check_keras_file(path)
    try:
        return keras.models.load_model(path, safe_mode=safe_mode, compile=False)
    except Exception as exc:  # noqa: BLE001 - any failure: the file is bad
        if safe_mode and "safe_mode" in str(exc):
            raise RecipeError(
                f"{path}: refusing to load: the file holds Python code (a "
                "Lambda layer) that would run on load. If you trust it: "
                "`advtrain eval --unsafe-load`, or safe_mode=False."
            ) from None
        raise RecipeError(
            f"model {path}: cannot load it as a Keras classifier "
            f"({one_line(exc)[:200]})."
        ) from None


def evaluate_saved(
    model_path: Union[str, Path],
    recipe: Recipe,
    *,
    echo: Echo = print,
    safe_mode: bool = True,
    save_examples: bool = False,
) -> dict[str, Any]:
    """Evaluates a saved classifier on the recipe's test split; in a run
    folder, also writes `eval-metrics.json` there. `save_examples` writes
    each example's worst case beside the model (`EXAMPLES_FILE`)."""
    model_path = Path(model_path)
    splits = build.recipe_splits(recipe)
    classifier = load_classifier(model_path, safe_mode=safe_mode)
    expected = tuple(classifier.input_shape[1:])
    if expected != tuple(splits.image_shape):
        raise RecipeError(
            f"{model_path}: model takes images {expected} but the recipe's "
            f"data gives {tuple(splits.image_shape)}."
        )
    echo(f"evaluating {model_path} on {splits.test_size} test examples ...")
    test_ds, metrics, examples = build.recipe_evaluation(
        recipe, classifier, splits, return_examples=save_examples
    )
    metrics["sanity_checks"] = build.recipe_sanity_checks(
        classifier, test_ds, recipe, lambda line: None, evaluation=metrics
    )
    if holds_run(model_path.parent):
        atomic_write_json(model_path.parent / "eval-metrics.json", metrics)
    if examples is not None:
        path = examples.save(model_path.parent / EXAMPLES_FILE)
        echo(
            f"adversarial examples: {len(examples)} ({int(sum(~examples.robust))} "
            f"broken) written to {path}"
        )
    return metrics


EXAMPLES_FILE = "adversarial_examples.npz"
