"""The options a registered function or class takes by keyword, and the one
check that a mapping of options names only those (an attack's `options`,
an objective's keyword arguments).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Optional

from advtrain.utils.errors import did_you_mean


@functools.cache
def keyword_names(fn: Callable, skip: int = 0) -> Optional[tuple[str, ...]]:
    """The names `fn` accepts by keyword after its first `skip` parameters,
    in order; None when it takes `**kwargs` (any name goes).

    Example:

    ```python
    def attack(model_fn, x, y, *, eps, scale=1.0): ...

    keyword_names(attack, skip=3)  # ("eps", "scale")
    ```
    """
    parameters = list(inspect.signature(fn).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    by_keyword = (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )
    return tuple(p.name for p in parameters[skip:] if p.kind in by_keyword)


def check_options(
    owner: str,
    options: Any,
    accepted: Optional[Sequence[str]],
    reserved: Iterable[str] = (),
    received: str = "options",
) -> dict[str, Any]:
    """`options` as a dict, if each name is one `owner` accepts.

    Args:
        owner: what takes the options, for the message ("attack 'pgd'").
        options: a mapping of option names to values.
        accepted: the names `owner` accepts; None accepts any name.
        reserved: names `owner` takes as arguments of their own, never as
            options (they would be passed twice).
        received: the name `options` came in as ("attack.options").

    Raises:
        TypeError: naming the first option `owner` does not accept, the
            closest accepted name and all of them.
    """
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
    """Refuses a keyword argument `owner` does not take, as Keras refuses
    "Unrecognized keyword arguments": a TypeError naming it, the closest
    accepted name and all of them.

    Example:

    ```python
    check_keywords("evaluate", {"pgd_stpes": 3}, ("pgd_steps", "fgsm"))
    # TypeError: evaluate got an unknown keyword argument 'pgd_stpes'. Did
    # you mean 'pgd_steps'? It takes: pgd_steps, fgsm. Received: pgd_stpes=3
    ```
    """
    accepted = list(accepted)
    for name, value in given.items():
        if name not in accepted:
            raise TypeError(
                f"{owner} got an unknown keyword argument '{name}'."
                f"{did_you_mean(name, accepted)} It takes: {', '.join(accepted)}. "
                f"Received: {name}={value!r}"
            )
