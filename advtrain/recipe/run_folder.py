"""The run folder's rules: a new folder, or an unfinished run of the same
resolved recipe (resumed); anything else is refused before a byte is
written. A run folder holds `RECIPE_FILE`, written first; it is finished
once it holds `FINISHED_FILE`, written last. What a run writes before its
first checkpoint is taken back when bad input stops it (`RunFolderClaim`).
"""

from __future__ import annotations

import datetime
import os
import shutil
from pathlib import Path
from typing import Any, Optional, Union

from advtrain.recipe.keys import recipe_keys
from advtrain.recipe.loader import parse_yaml, recipe_from_dict
from advtrain.recipe.schema import Recipe, RecipeError
from advtrain.train.checkpoint import TMP_PREFIX
from advtrain.utils.io import (
    PathLike,
    check_data_paths,
    check_readable_file,
    check_writable_dir,
)

RECIPE_FILE = "recipe.yaml"
FINISHED_FILE = "metrics.json"
HISTORY_FILE = "history.csv"
CHECKPOINTS = "checkpoints"
# Set by `advtrain launch` in each worker's environment.
RESUME_COMMAND_ENV = "ADVTRAIN_RESUME_COMMAND"


def holds_run(out: Path) -> bool:
    return (out / RECIPE_FILE).is_file()


def is_finished(out: Path) -> bool:
    return (out / FINISHED_FILE).is_file()


def resumable_recipe(run_dir: Path) -> Path:
    """The saved recipe of the interrupted run in `run_dir` (`advtrain
    resume`); a missing folder, one holding no run, or a finished run is a
    RecipeError."""
    if not run_dir.is_dir():
        raise RecipeError(f"{run_dir}: run folder not found.")
    if not holds_run(run_dir):
        raise RecipeError(
            f"{run_dir}: not a run folder (no {RECIPE_FILE}); start a run "
            "with `advtrain run RECIPE --output DIR`."
        )
    if is_finished(run_dir):
        raise RecipeError(
            f"{run_dir}: the run is finished ({FINISHED_FILE}); nothing to resume."
        )
    return run_dir / RECIPE_FILE


def resume_hint(run_dir: Path, workers: int = 1) -> str:
    """How to continue the run in `run_dir`: "resume with `COMMAND`"."""
    given = os.environ.get(RESUME_COMMAND_ENV)  # set by `advtrain launch`
    if given:
        return f"resume with `{given}`"
    if workers > 1:
        return (
            f"resume with `advtrain run {run_dir}/{RECIPE_FILE} --output "
            f"{run_dir}` on every worker of the cluster"
        )
    return f"resume with `advtrain resume {run_dir}`"


def recipe_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key: old -> new` for every dotted key whose value differs."""
    old, new = _flatten(saved), _flatten(current)
    pairs = {k: (old.get(k, "<unset>"), new.get(k, "<unset>")) for k in {*old, *new}}
    return [f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(pairs.items()) if a != b]


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        flat: dict[str, Any] = {}
        for key, value in data.items():
            flat.update(_flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: data}


def check_run_dir(out: Path, recipe: Recipe) -> bool:
    """False for a new folder, True for an unfinished run of the same
    resolved recipe (resumed); a RecipeError for anything else."""
    if out.exists() and not out.is_dir():
        raise RecipeError(f"--output {out}: exists and is not a folder.")
    # A kill between creating the folder and writing recipe.yaml leaves at
    # most a temporary file: still a new folder.
    if not out.is_dir() or all(p.name.startswith(TMP_PREFIX) for p in out.iterdir()):
        return False
    saved_path = out / RECIPE_FILE
    if not saved_path.is_file():
        raise RecipeError(
            f"--output {out}: folder is not empty and holds no advtrain run "
            f"(no {RECIPE_FILE}); choose a new folder so nothing in it is "
            "overwritten."
        )
    try:
        text = saved_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"{saved_path}: cannot read: {exc}") from None
    saved = recipe_from_dict(parse_yaml(text, str(saved_path)), str(saved_path))
    differences = recipe_differences(saved.to_dict(), recipe.to_dict())
    if differences:
        shown = "; ".join(differences[:4])
        if len(differences) > 4:
            shown += f"; and {len(differences) - 4} more"
        raise RecipeError(
            f"--output {out}: folder is not empty: it holds a run of a "
            f"different recipe ({shown}). Choose a new folder, or continue "
            f"that run with `advtrain resume {out}`."
        )
    if is_finished(out):
        raise RecipeError(
            f"--output {out}: folder is not empty: it holds a finished run "
            f"of this recipe ({FINISHED_FILE}); nothing to resume. Choose a "
            "new folder."
        )
    return True


def check_recipe_paths(
    recipe: Recipe, output: Optional[PathLike] = None, *, writes: bool = True
) -> None:
    """Checks every path `recipe` names before a run starts (the data's,
    model.weights and, when `writes`, the run folder's); errors name the key.
    """
    fields = {"source", "path", "tfds_data_dir", "cache"}
    check_data_paths(
        **recipe.data.model_dump(include=fields), names=recipe_keys("data")
    )
    weights = recipe.model.weights
    if weights is not None and weights != "imagenet":
        check_readable_file(weights, recipe_keys("model")["weights"])
    if not writes:
        return
    if output is not None:
        check_writable_dir(output, "--output")
    elif recipe.output.dir:
        check_writable_dir(recipe.output.dir, recipe_keys("output")["dir"])
    else:
        check_writable_dir("runs", "runs/")


def output_dir(recipe: Recipe, output: Optional[Union[str, Path]]) -> Path:
    """The run folder's path: `output`, else output.dir, else
    runs/NAME-TIMESTAMP (nothing checked)."""
    if output is None and not recipe.output.dir:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        return Path("runs") / f"{recipe.name}-{stamp}"
    return Path(output if output is not None else recipe.output.dir)


def resolve_output_dir(recipe: Recipe, output: Optional[Union[str, Path]]) -> Path:
    """The run folder, checked (`Recipe.check_runnable`, `check_recipe_paths`,
    `check_run_dir`)."""
    recipe.check_runnable()
    output = output_dir(recipe, output)
    check_recipe_paths(recipe, output)
    check_run_dir(output, recipe)
    return output


class RunFolderClaim:
    """The run folder as a run found it, so that a run which bad input
    stops before it holds a checkpoint of its own leaves the folder as it
    was (none, if it made it): a setting that fails at the run's setup or
    first step (the model, the attack's first call) writes nothing a rerun
    would refuse as "a run of a different recipe". The caller decides what
    is bad input (`run`: exit code 2); a crash keeps what it wrote.

    Only the chief's claim takes anything back (`owner`, set once the
    runtime says which worker this is): the others write elsewhere.

    Example:

    ```python
    claim = RunFolderClaim(run_dir)
    try:
        train_the_run()
    except ValueError:
        claim.release()
        raise
    ```
    """

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.existed = run_dir.exists()
        self.owner = False
        self.before = set(self._entries()) if self.existed else set()
        # The files a run rewrites in place (a resume truncates the history).
        self.texts = {
            name: (run_dir / name).read_bytes()
            for name in (RECIPE_FILE, HISTORY_FILE)
            if (run_dir / name).is_file()
        }

    def _entries(self) -> list[Path]:
        return list(self.run_dir.rglob("*")) if self.run_dir.is_dir() else []

    def checkpointed(self) -> bool:
        """Whether the run wrote a checkpoint (the folder holds progress)."""
        folder = self.run_dir / CHECKPOINTS
        if not folder.is_dir():
            return False
        return any(
            p not in self.before and not p.name.startswith(TMP_PREFIX)
            for p in folder.iterdir()
        )

    def release(self) -> bool:
        """Takes back what the run wrote, unless it holds a checkpoint or
        is not the chief's; True if it did."""
        if not self.owner or self.checkpointed():
            return False
        if not self.existed:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            return True
        # Deepest first, so a new folder is empty when its turn comes.
        for path in sorted(set(self._entries()) - self.before, reverse=True):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        for name, data in self.texts.items():
            path = self.run_dir / name
            if not path.is_file() or path.read_bytes() != data:
                path.write_bytes(data)
        return True
