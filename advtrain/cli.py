"""The `advtrain` command line: a thin Typer layer over `advtrain.experiment`.

Bad input (recipe, override, path) exits with code 2 and one line on
stderr; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Adversarial training and transfer learning for Keras 3.",
)

RECIPES_DIR = Path(__file__).parent / "recipes"

SetOption = Annotated[
    Optional[list[str]],
    typer.Option(
        "--set",
        "-s",
        help="Override a recipe value: section.key=value (repeatable).",
    ),
]
DebugOption = Annotated[
    bool, typer.Option("--debug", help="Show tracebacks instead of one line.")
]


def _echo(line: str) -> None:
    typer.echo(line)


def _fail(message: str, code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


def _quiet_tensorflow() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def resolve_recipe_path(name: str) -> Path:
    """A recipe path, or the name of a shipped recipe ("quickstart")."""
    path = Path(name)
    if path.is_file():
        return path
    shipped = RECIPES_DIR / f"{name}.yaml"
    if path.suffix == "" and shipped.is_file():
        return shipped
    known = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
    raise _BadInput(
        f"{name}: recipe file not found (shipped recipes: {known})."
    )


class _BadInput(Exception):
    pass


def _guarded(debug: bool, action):
    from advtrain.config import RecipeError

    try:
        return action()
    except (RecipeError, _BadInput) as exc:
        if debug:
            raise
        _fail(str(exc), 2)
    except KeyboardInterrupt:
        _fail("interrupted; completed checkpoints are kept.", 130)
    except typer.Exit:
        raise
    except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence
        if debug:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        _fail(f"{type(exc).__name__}: {first} (rerun with --debug for details)", 1)


@app.command()
def run(
    recipe: Annotated[str, typer.Argument(help="Recipe file or shipped name.")],
    set_: SetOption = None,
    output: Annotated[
        Optional[Path], typer.Option("--output", "-o", help="Run folder.")
    ] = None,
    debug: DebugOption = False,
) -> None:
    """Train a recipe adversarially, evaluate it, and write the run folder."""
    _quiet_tensorflow()

    def action():
        from advtrain.config import load_recipe

        path = resolve_recipe_path(recipe)
        resolved = load_recipe(path, set_ or [])
        from advtrain.experiment import run as run_recipe, summary_table

        _echo(f"recipe: {path} ({resolved.name})")
        result = run_recipe(resolved, output, echo=_echo)
        _echo(f"run folder: {result.output_dir}")
        _echo(summary_table(result.metrics))

    _guarded(debug, action)


@app.command("eval")
def eval_(
    target: Annotated[
        Path,
        typer.Argument(help="A run folder or a saved .keras classifier."),
    ],
    recipe: Annotated[
        Optional[str],
        typer.Option("--recipe", "-r", help="Recipe (default: the run's)."),
    ] = None,
    set_: SetOption = None,
    debug: DebugOption = False,
) -> None:
    """Evaluate a trained classifier: clean, FGSM and PGD accuracy."""
    _quiet_tensorflow()

    def action():
        from advtrain.config import load_recipe

        if target.is_dir():
            model_path = target / "model.keras"
            recipe_path = resolve_recipe_path(recipe) if recipe else target / "recipe.yaml"
        else:
            model_path = target
            if recipe is None:
                raise _BadInput(
                    f"{target}: evaluating a model file needs --recipe."
                )
            recipe_path = resolve_recipe_path(recipe)
        if not model_path.is_file():
            raise _BadInput(f"{model_path}: model file not found.")
        resolved = load_recipe(recipe_path, set_ or [])
        from advtrain.experiment import evaluate_saved, summary_table

        metrics = evaluate_saved(model_path, resolved, echo=_echo)
        _echo(summary_table(metrics))

    _guarded(debug, action)


@app.command()
def recipes() -> None:
    """List the recipes shipped with advtrain."""
    import yaml

    for path in sorted(RECIPES_DIR.glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            description = str(data.get("description", "")).strip().splitlines()
        except yaml.YAMLError:
            description = ["(unreadable)"]
        first = description[0] if description else ""
        typer.echo(f"{path.stem:<20} {first}")


def main() -> None:  # pragma: no cover - console script entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
