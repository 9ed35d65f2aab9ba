"""Which recipe key filled which library argument: the one translation of
the library's `ArgumentError` (`batch_size: ...`) into a `RecipeError`
naming the key (`train.batch_size: ...`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from advtrain.recipe.schema import Recipe, RecipeError
from advtrain.utils.errors import ArgumentError


class RecipeKeys(Mapping[str, str]):
    """Recipe key by library argument; a context that renames the
    argument of an `ArgumentError` raised inside it."""

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
    return RecipeKeys(section, elsewhere)
