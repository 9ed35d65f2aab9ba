"""How an error becomes the one line a user reads.

Library code raises `ValueError`/`TypeError` (or a subclass) whose message
says what was expected, then `Received: name=value`. Only the CLI turns an
error into its one-line, exit-2 form; it and the places that quote another
library's error (a TensorFlow or pydantic message of many lines) use
`one_line`. This module imports nothing from advtrain or TensorFlow.
"""

from __future__ import annotations

from typing import Optional


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
