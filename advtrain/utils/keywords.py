"""The keywords a function takes, and the checks that given ones are known."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Optional

from advtrain.utils.errors import did_you_mean


@functools.cache
def keyword_names(fn: Callable) -> Optional[tuple[str, ...]]:
    """The names `fn` accepts by keyword, in order; None when it takes
    `**kwargs` (any name goes)."""
    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return tuple(
        p.name
        for p in parameters
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )


def check_options(
    owner: str,
    options: Any,
    accepted: Optional[Sequence[str]],
    reserved: Iterable[str] = (),
    received: str = "options",
) -> dict[str, Any]:
    """`options` as a dict, if each name is one `owner` accepts (None: any)
    and none is `reserved`; else a TypeError naming them as `received`."""
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise TypeError(
            f"{received} must map option names to values. "
            f"Received: {received}={options!r}"
        )
    reserved = set(reserved)
    for name, value in options.items():
        where = f"Received: {received}.{name}={value!r}"
        if name in reserved:
            raise TypeError(
                f"'{name}' is not an option of {owner}: it has an argument of "
                f"its own; set it there. {where}"
            )
        if accepted is not None and name not in accepted:
            listed = ", ".join(accepted) if accepted else "none"
            raise TypeError(
                f"{owner} takes no option '{name}'.{did_you_mean(name, accepted)} "
                f"Its options: {listed}. {where}"
            )
    return dict(options)


def check_keywords(owner: str, given: Mapping[str, Any], accepted: Iterable[str]):
    """A TypeError naming a keyword argument `owner` does not take, the
    closest it does and all of them (as Keras's "Unrecognized keyword")."""
    accepted = list(accepted)
    for name, value in given.items():
        if name not in accepted:
            raise TypeError(
                f"{owner} got an unknown keyword argument '{name}'."
                f"{did_you_mean(name, accepted)} It takes: {', '.join(accepted)}. "
                f"Received: {name}={value!r}"
            )
