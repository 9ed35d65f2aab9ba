"""A small decorator registry shared by attacks, backbones and datasets."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects; registration is done with a decorator.

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
        known = ", ".join(sorted(self._entries))
        hint = difflib.get_close_matches(str(name), self._entries, n=1)
        did_you_mean = f" Did you mean '{hint[0]}'?" if hint else ""
        return f"Unknown {self.kind} '{name}'.{did_you_mean} Known: {known}."

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
