"""Atomic file writes: write to a temporary name, then rename."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union

PathLike = Union[str, Path]


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yields a temporary path beside `path`; renames it into place on
    success, removes it on failure. A crash never leaves a truncated `path`.

    The temporary name keeps the suffix, so writers that dispatch on it
    (`.keras`, `.weights.h5`, `.png`) still work.
    """
    path = Path(path)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        yield tmp
        if tmp.is_file():
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_text(path: PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def atomic_write_json(path: PathLike, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
