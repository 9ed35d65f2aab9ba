"""How an error becomes the one line a user reads.

Library code raises `ValueError`/`TypeError` (or a subclass) whose message
says what was expected, then `Received: name=value`; a bad value of a named
argument is an `ArgumentError`, which callers may report under their own
name for that argument (a recipe key). Only the CLI turns an
error into its one-line exit form; it and the places that quote another
library's error (a TensorFlow or pydantic message of many lines) use
`one_line`. This module imports nothing from advtrain or TensorFlow.

An error type carries its exit code as the class attribute `exit_code`
(`BAD_INPUT` here; 75 for `Preempted`; 1 for `NonFiniteLossError`); the CLI
reads it, and gives any other `ValueError`, `TypeError` or `OSError` exit 2
and anything else exit 1. A new outcome is a new type with its own code.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Optional

BAD_INPUT = 2  # the exit code of input that cannot be used


class ArgumentError(ValueError):
    """A value of the named argument that cannot be used; `str(exc)` is
    "argument: message".

    The library names its own arguments (`weights`, `batch_size`). Code
    that filled the argument from elsewhere re-raises `exc.message` under
    its own name for it (`advtrain.recipe.keys`: the recipe key).

    Example:

    ```python
    raise ArgumentError("batch_size", "must be positive. Received: batch_size=0")
    # ArgumentError: batch_size: must be positive. Received: batch_size=0
    ```
    """

    exit_code = BAD_INPUT

    def __init__(self, argument: str, message: str):
        super().__init__(f"{argument}: {message}")
        self.argument = argument
        self.message = message

    def __reduce__(self):
        return type(self), (self.argument, self.message)


def one_line(exc: BaseException, limit: Optional[int] = None) -> str:
    """The first non-empty line of `exc`'s message, stripped; the exception's
    class name when the message is empty. With `limit`, a longer line is cut
    to `limit` characters ending in "...".

    Example:

    ```python
    one_line(ValueError("\\nbad shape\\n  at layer 3"))  # "bad shape"
    ```
    """
    line = next((t.strip() for t in str(exc).splitlines() if t.strip()), None)
    line = line or type(exc).__name__
    if limit is not None and len(line) > limit:
        line = line[: limit - 3] + "..."
    return line


def did_you_mean(
    name: object, known: Iterable[str], cutoff: float = 0.6, prefix: str = ""
) -> str:
    """`" Did you mean 'PREFIXCLOSEST'?"` for the known name closest to
    `name`, or "" when none is close: the one hint every failed lookup
    (registries, recipe keys) appends to its message. `prefix` goes before
    the suggestion (a recipe key's section, say).

    Example:

    ```python
    did_you_mean("pgdd", ["fgsm", "pgd"])  # " Did you mean 'pgd'?"
    did_you_mean("epoch", ["epochs"], prefix="train.")  # "... 'train.epochs'?"
    ```
    """
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=cutoff)
    return f" Did you mean '{prefix}{close[0]}'?" if close else ""
