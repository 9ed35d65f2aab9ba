"""Which recipe key filled which library argument: the one translation of
the library's `ArgumentError` (`batch_size: ...`) into a `RecipeError`
naming the key (`train.batch_size: ...`)."""

from __future__ import annotations

from advtrain.recipe.schema import Recipe, RecipeError
from advtrain.utils.errors import ArgumentError


class RecipeKeys(dict):
    """Recipe key by library argument; a context that renames the
    argument of an `ArgumentError` raised inside it."""

    def __enter__(self) -> RecipeKeys:
        return self

    def __exit__(self, kind, exc, traceback) -> None:
        if isinstance(exc, ArgumentError) and exc.argument in self:
            raise RecipeError(f"{self[exc.argument]}: {exc.message}") from None


def recipe_keys(section: str, **elsewhere: str) -> RecipeKeys:
    """The keys of `section` ("model", "model.batchnorm") by argument name;
    `elsewhere` adds arguments filled from other keys. Others keep their name.

    Example:

    ```python
    with recipe_keys("train"):
        plan_batches(runtime, 100, batch_size=128)
    # RecipeError: train.batch_size: larger than the training set ...
    recipe_keys("model.batchnorm")["momentum"]  # "model.batchnorm.momentum"
    ```
    """
    model = Recipe
    for part in section.split("."):
        model = model.model_fields[part].annotation
    keys = RecipeKeys({name: f"{section}.{name}" for name in model.model_fields})
    keys.update(elsewhere)
    return keys
