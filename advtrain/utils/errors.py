"""Errors as the one line a user reads; an error type carries its exit code
as the class attribute `exit_code`, which the CLI reads."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Optional

BAD_INPUT = 2  # the exit code of input that cannot be used


class ArgumentError(ValueError):
    """A value of the named argument that cannot be used; a caller may
    re-raise `exc.message` under its own name for it (a config key).

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


class BackendNotInstalled(ImportError):
    """No Keras backend advtrain can run on is installed, or KERAS_BACKEND
    names one that is not: `summary` says which and the `pip install`
    that fixes it (`advtrain --version` prints it)."""

    exit_code = BAD_INPUT

    def __init__(self, summary: str, received: str):
        super().__init__(f"{summary}. Received: {received}")
        self.summary = summary
        self.received = received

    def __reduce__(self):
        return type(self), (self.summary, self.received)


def exit_code_of(exc: BaseException) -> int:
    """The exit code of `exc`: its type's `exit_code`; else `BAD_INPUT` for
    the user's input (`ValueError`, `TypeError`, `OSError`), else 1."""
    code = getattr(exc, "exit_code", None)
    if isinstance(code, int):
        return code
    return BAD_INPUT if isinstance(exc, (ValueError, TypeError, OSError)) else 1


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
    """`" Did you mean 'PREFIXCLOSEST'?"`, or "" when no name is close."""
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=cutoff)
    return f" Did you mean '{prefix}{close[0]}'?" if close else ""
