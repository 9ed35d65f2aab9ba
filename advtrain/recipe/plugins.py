"""A recipe's `plugins`: the modules imported before the rest of it is
checked, so the attacks, data sources, backbones and objectives they
register can be named in it. Below the schema, which calls it."""

from __future__ import annotations

import re
from typing import Any

from advtrain.utils.errors import one_line

_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def import_plugins(modules: Any) -> None:
    """Imports each module named in a recipe's `plugins` (they register
    attacks, data sources or backbones). The current folder is searched
    last, as `python -m` would. Raises ValueError naming the module."""
    import importlib
    import os
    import sys

    if not isinstance(modules, list) or not all(
        isinstance(m, str) and _MODULE.fullmatch(m) for m in modules
    ):
        raise ValueError(
            "plugins: expected a list of module names such as "
            f"[my_package.attacks]. Received: plugins={modules!r}"
        )
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure is the recipe's
            raise ValueError(
                f"plugins: cannot import '{name}' ({type(exc).__name__}: "
                f"{one_line(exc)})"
            ) from None
