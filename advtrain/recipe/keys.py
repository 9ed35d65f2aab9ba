"""Which recipe key filled which library argument.

The library names its own arguments (`weights: ...`, `batch_size: ...`);
a recipe user set keys (`model.weights`, `train.batch_size`). `recipe_keys`
is the one translation, used two ways where the recipe calls the library:

- around the call: an `ArgumentError` about an argument the section filled
  is re-raised as a `RecipeError` naming its key;
- as the `names` a library function shows in its advice or path errors
  (`settle_batchnorm`, `check_data_paths`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from advtrain.recipe.schema import Recipe, RecipeError
from advtrain.utils.errors import ArgumentError


class RecipeKeys(Mapping[str, str]):
    """The recipe key each library argument was filled from: the keys of
    one section (`recipe_keys`), plus arguments filled from elsewhere."""

    def __init__(self, section: str, elsewhere: Mapping[str, str]):
        model = Recipe
        for part in section.split("."):
            model = model.model_fields[part].annotation
        self._keys = {name: f"{section}.{name}" for name in model.model_fields}
        self._keys.update(elsewhere)

    def __getitem__(self, argument: str) -> str:
        return self._keys[argument]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __enter__(self) -> RecipeKeys:
        return self

    def __exit__(self, kind, exc, traceback) -> None:
        if isinstance(exc, ArgumentError) and exc.argument in self._keys:
            raise RecipeError(f"{self._keys[exc.argument]}: {exc.message}") from None


def recipe_keys(section: str, **elsewhere: str) -> RecipeKeys:
    """The keys of the recipe section `section` ("model", "model.batchnorm")
    by argument name; `elsewhere` adds arguments filled from another
    section (`batch_size="train.batch_size"`). An argument that is no key
    here (`image_shape`, from the data) keeps its own name.

    Example:

    ```python
    with recipe_keys("train"):
        plan_batches(runtime, 100, batch_size=128)
    # RecipeError: train.batch_size: larger than the training set ...
    recipe_keys("model.batchnorm")["momentum"]  # "model.batchnorm.momentum"
    ```
    """
    return RecipeKeys(section, elsewhere)
