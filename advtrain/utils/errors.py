"""Errors as the one line a user reads.

An error type carries its exit code as the class attribute `exit_code`
(`BAD_INPUT` here, 75 `Preempted`, 1 `NonFiniteLossError`); the CLI's
`_exits` reads it (other ValueError/TypeError/OSError: 2, the rest: 1).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Optional

BAD_INPUT = 2  # the exit code of input that cannot be used


class ArgumentError(ValueError):
    """A value of the named argument that cannot be used; `str(exc)` is
    "argument: message", and a caller may re-raise `exc.message` under its
    own name for the argument (e.g. a configuration key).

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
    """The first non-empty line of `exc`'s message (else its class name),
    cut to `limit` characters with "..."."""
    line = next((t.strip() for t in str(exc).splitlines() if t.strip()), None)
    line = line or type(exc).__name__
    if limit is not None and len(line) > limit:
        line = line[: limit - 3] + "..."
    return line


def did_you_mean(
    name: object, known: Iterable[str], cutoff: float = 0.6, prefix: str = ""
) -> str:
    """`" Did you mean 'PREFIXCLOSEST'?"`, or "" when no known name is close:
    the hint every failed lookup appends.

    Example:

    ```python
    did_you_mean("pgdd", ["fgsm", "pgd"])  # " Did you mean 'pgd'?"
    ```
    """
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=cutoff)
    return f" Did you mean '{prefix}{close[0]}'?" if close else ""
