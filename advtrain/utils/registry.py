"""A small decorator registry shared by attacks, backbones and datasets."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from advtrain.utils.errors import did_you_mean

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects, registered with a decorator.

    Example:

    ```python
    backbones = Registry("backbone")

    @backbones.register("tiny")
    def tiny(**kwargs): ...

    backbones.get("tiny")
    ```
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"A {self.kind} named '{name}' is already registered.")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(self.unknown_message(name)) from None

    def unknown_message(self, name: Any) -> str:
        known = self.names()
        hint = did_you_mean(name, known)
        return f"Unknown {self.kind} '{name}'.{hint} Known: {', '.join(known)}."

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
