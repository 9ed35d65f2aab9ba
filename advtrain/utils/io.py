"""Atomic file writes, and up-front checks on the paths users hand in: one
line naming the argument, the path and the problem (`FileNotFoundError` for
a missing path, else `ValueError`)."""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Optional, Union

PathLike = Union[str, Path]

_SYSTEM_DIRS = (Path("/proc"), Path("/sys"), Path("/dev"))
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
# Sources whose `path` names a folder (arrays: a folder or a prefix).
_FOLDER_SOURCES = ("mnist", "gtsrb", "folder")


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """A temporary path beside `path` (same suffix), renamed into place on
    success and removed on failure: never a truncated `path`."""
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
        tmp.write_text(text, encoding="utf-8", newline="")
    return Path(path)


def atomic_write_json(path: PathLike, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def check_writable_dir(path: PathLike, what: str) -> None:
    """Refuses a folder (existing or not) that cannot be created and
    written: under a file, a system folder, or a read-only one."""
    path = Path(path)
    real = Path(os.path.realpath(path))
    for system in _SYSTEM_DIRS:
        if real == system or system in real.parents:
            raise ValueError(
                f"{what} {path}: under {system}, a system folder; choose a "
                "folder on disk."
            )
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {path}: exists and is not a folder.")
    ancestor = real
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(
            f"{what} {path}: {ancestor} is a file, so no folder can be made under it."
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {path}: {ancestor} is not writable.")


def check_readable_file(path: PathLike, what: str) -> Path:
    """Refuses a missing, empty or unreadable file, a `.h5` without the
    HDF5 signature and a `.keras` that is not one."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {path}: is a folder, expected a file.")
    if not path.exists():
        raise FileNotFoundError(f"{what} {path}: file not found.")
    if not path.is_file():
        raise ValueError(f"{what} {path}: not a regular file.")
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(_HDF5_SIGNATURE))
    except OSError as exc:
        raise ValueError(f"{what} {path}: cannot read ({exc.strerror}).") from None
    if not head:
        raise ValueError(f"{what} {path}: the file is empty.")
    if path.suffix == ".h5" and head != _HDF5_SIGNATURE:
        raise ValueError(
            f"{what} {path}: not an HDF5 weights file (no HDF5 signature); "
            "truncated, or another format."
        )
    if path.suffix == ".keras":
        check_keras_file(path, what)
    return path


def check_keras_file(path: PathLike, what: str = "model") -> Path:
    """Refuses a `.keras` file that is missing, truncated or not a Keras
    archive (a zip holding config.json), without loading it."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {path}: is a folder, expected a .keras file.")
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path}: file not found.")
    problem: Optional[str] = None
    try:
        if not zipfile.is_zipfile(path):
            problem = "not a Keras model archive (a .keras file is a zip)"
        else:
            with zipfile.ZipFile(path) as archive:
                if "config.json" not in archive.namelist():
                    problem = "a zip without config.json, not a Keras model"
                elif archive.testzip() is not None:
                    problem = "corrupt (a member fails its checksum)"
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as exc:
        problem = f"unreadable ({exc})"
    if problem:
        raise ValueError(f"{what} {path}: {problem}; truncated or another file?")
    return path


def check_data_paths(
    *,
    source: str = "digits",
    path: Optional[PathLike] = None,
    tfds_data_dir: Optional[PathLike] = None,
    cache: str = "auto",
    names: Optional[Mapping[str, str]] = None,
) -> None:
    """Checks the paths `load_splits` and `make_input` take (their keyword
    names); errors name each argument as `names` maps it."""
    names = names or {}
    if path is not None and source in (*_FOLDER_SOURCES, "arrays"):
        what = names.get("path", "path")
        folder = Path(path)
        prefix = Path(f"{path}_x.npy")
        if source == "arrays":
            if not folder.is_dir() and not prefix.is_file():
                raise FileNotFoundError(
                    f"{what} {folder}: not found (arrays: a folder with "
                    f"x_train.npy, or a prefix with {prefix.name})."
                )
        elif folder.exists() and not folder.is_dir():
            raise ValueError(f"{what} {folder}: is a file, expected a folder.")
        elif not folder.is_dir():
            raise FileNotFoundError(f"{what} {folder}: not found.")
    if tfds_data_dir is not None:
        check_writable_dir(tfds_data_dir, names.get("tfds_data_dir", "tfds_data_dir"))
    if cache not in ("auto", "memory", "none"):
        what = names.get("cache", "cache")
        parent = Path(cache).parent
        why = "(the cache is a file prefix in an existing folder)."
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"{what} {cache}: folder {parent} is a file {why}")
        if not parent.is_dir():
            raise FileNotFoundError(f"{what} {cache}: folder {parent} not found {why}")
        check_writable_dir(parent, what)
