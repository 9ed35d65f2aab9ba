"""Atomic file writes, and up-front checks on the paths users hand in.

The checks run before anything heavy is imported or anything is written,
so a bad path costs a second and leaves no run folder behind. Each raises
one `RecipeError` line naming the key (or option), the path and what is
wrong with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional, Union

from advtrain.config import Recipe, RecipeError

PathLike = Union[str, Path]

_SYSTEM_DIRS = (Path("/proc"), Path("/sys"), Path("/dev"))
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
# Sources whose data.path names a folder (arrays: a folder or a prefix).
_FOLDER_SOURCES = ("mnist", "gtsrb", "folder")


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


def check_writable_dir(path: PathLike, what: str) -> None:
    """Refuses a folder that cannot be created and written: under a file,
    under /proc, /sys or /dev, or under a folder without write access.

    Args:
        path: the folder (it may not exist yet).
        what: the option or recipe key it came from, e.g. "--output".

    Raises:
        RecipeError: naming `what`, the path and the problem.
    """
    path = Path(path)
    real = Path(os.path.realpath(path))
    for system in _SYSTEM_DIRS:
        if real == system or system in real.parents:
            raise RecipeError(
                f"{what} {path}: under {system}, a system folder; choose a "
                "folder on disk."
            )
    if path.exists() and not path.is_dir():
        raise RecipeError(f"{what} {path}: exists and is not a folder.")
    ancestor = real
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise RecipeError(
            f"{what} {path}: {ancestor} is a file, so no folder can be made under it."
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise RecipeError(f"{what} {path}: {ancestor} is not writable.")


def check_readable_file(path: PathLike, what: str) -> Path:
    """Refuses a path that is missing, a folder, empty or unreadable; a
    `.h5` must start with the HDF5 signature, a `.keras` must be one (see
    `check_keras_file`)."""
    path = Path(path)
    if path.is_dir():
        raise RecipeError(f"{what} {path}: is a folder, expected a file.")
    if not path.exists():
        raise RecipeError(f"{what} {path}: file not found.")
    if not path.is_file():
        raise RecipeError(f"{what} {path}: not a regular file.")
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(_HDF5_SIGNATURE))
    except OSError as exc:
        raise RecipeError(f"{what} {path}: cannot read ({exc.strerror}).") from None
    if not head:
        raise RecipeError(f"{what} {path}: the file is empty.")
    if path.suffix == ".h5" and head != _HDF5_SIGNATURE:
        raise RecipeError(
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
        raise RecipeError(f"{what} {path}: is a folder, expected a .keras file.")
    if not path.is_file():
        raise RecipeError(f"{what} {path}: file not found.")
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
        raise RecipeError(f"{what} {path}: {problem}; truncated or another file?")
    return path


def check_recipe_paths(
    recipe: Recipe, output: Optional[PathLike] = None, *, writes: bool = True
) -> None:
    """Checks every path a recipe names before a run starts: data.path
    exists, model.weights is a readable weights file, data.cache and
    data.tfds_data_dir can be written, and, when `writes`, so can the run
    folder (`output`, else output.dir, else runs/).

    Raises:
        RecipeError: naming the recipe key, the path and the problem.
    """
    data = recipe.data
    if data.path is not None and data.source in (*_FOLDER_SOURCES, "arrays"):
        path = Path(data.path)
        prefix = Path(f"{data.path}_x.npy")
        if data.source == "arrays" and not path.is_dir() and not prefix.is_file():
            raise RecipeError(
                f"data.path {path}: not found (arrays: a folder with "
                f"x_train.npy, or a prefix with {prefix.name})."
            )
        if data.source != "arrays" and not path.is_dir():
            problem = "is a file, expected a folder" if path.exists() else "not found"
            raise RecipeError(f"data.path {path}: {problem}.")
    if data.tfds_data_dir is not None:
        check_writable_dir(data.tfds_data_dir, "data.tfds_data_dir")
    if data.cache not in ("auto", "memory", "none"):
        parent = Path(data.cache).parent
        if not parent.is_dir():
            problem = "is a file" if parent.exists() else "not found"
            raise RecipeError(
                f"data.cache {data.cache}: folder {parent} {problem} (the "
                "cache is a file prefix in an existing folder)."
            )
        check_writable_dir(parent, "data.cache")
    weights = recipe.model.weights
    if weights is not None and weights != "imagenet":
        check_readable_file(weights, "model.weights")
    if not writes:
        return
    if output is None:
        output = recipe.output.dir or "runs"
        check_writable_dir(output, "output.dir" if recipe.output.dir else "runs/")
    else:
        check_writable_dir(output, "--output")
