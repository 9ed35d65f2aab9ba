"""The `advtrain` command line: a thin Typer layer over `advtrain.experiment`.

Bad input (recipe, override, path) exits with code 2 and one line on
stderr; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import contextlib
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
UnsafeLoadOption = Annotated[
    bool,
    typer.Option(
        "--unsafe-load",
        help="Load a model file that holds Python code (Lambda layers). "
        "That code runs: only for files you trust.",
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
    raise _BadInput(f"{name}: recipe file not found (shipped recipes: {known}).")


class _BadInput(Exception):
    pass


@contextlib.contextmanager
def _naming(recipe_path: Path):
    """Prefixes the recipe file to errors found while the run starts
    (runtime.strategy, train.batch_size, output.monitor, data.path ...)."""
    from advtrain.config import RecipeError

    try:
        yield
    except RecipeError as exc:
        text = str(exc)
        if text.startswith((str(recipe_path), "--")):
            raise
        raise RecipeError(f"{recipe_path}: {text}") from None


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
        if type(exc).__name__ == "NonFiniteLossError":
            # The run stopped on NaN/Inf; its message says where and why.
            _fail(str(exc), 1)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        _fail(f"{type(exc).__name__}: {first} (rerun with --debug for details)", 1)


def _train(path: Path, resolved, output: Optional[Path]) -> None:
    """Runs a loaded recipe into `output` and prints the summary."""
    from advtrain.experiment import run as run_recipe
    from advtrain.experiment import summary_table

    _echo(f"recipe: {path} ({resolved.name})")
    with _naming(path):
        result = run_recipe(resolved, output, echo=_echo)
    _echo(f"run folder: {result.output_dir}")
    _echo(summary_table(result.metrics))


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
        _train(path, load_recipe(path, set_ or []), output)

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
    unsafe_load: UnsafeLoadOption = False,
    debug: DebugOption = False,
) -> None:
    """Evaluate a trained classifier: clean, FGSM and PGD accuracy, and
    the gradient-masking sanity checks."""
    _quiet_tensorflow()

    def action():
        from advtrain.config import load_recipe

        if target.is_dir():
            model_path = target / "model.keras"
            recipe_path = (
                resolve_recipe_path(recipe) if recipe else target / "recipe.yaml"
            )
        else:
            model_path = target
            if recipe is None:
                raise _BadInput(f"{target}: evaluating a model file needs --recipe.")
            recipe_path = resolve_recipe_path(recipe)
        if not model_path.is_file():
            raise _BadInput(f"{model_path}: model file not found.")
        resolved = load_recipe(recipe_path, set_ or [])
        from advtrain.experiment import evaluate_saved, summary_table

        metrics = evaluate_saved(
            model_path, resolved, echo=_echo, safe_mode=not unsafe_load
        )
        _echo(summary_table(metrics))
        from advtrain.sanity import format_sanity_checks

        _echo(format_sanity_checks(metrics["sanity_checks"]))

    _guarded(debug, action)


@app.command()
def export(
    target: Annotated[
        Path,
        typer.Argument(help="A run folder or a saved .keras classifier."),
    ],
    output: Annotated[
        Optional[Path],
        typer.Option(
            "--output",
            "-o",
            help="SavedModel folder (default: RUN_DIR/export/saved_model).",
        ),
    ] = None,
    unsafe_load: UnsafeLoadOption = False,
    debug: DebugOption = False,
) -> None:
    """Export a classifier as a TensorFlow SavedModel for TF Serving.

    Its serving_default signature takes uint8 images [N, H, W, C] (0..255)
    and returns logits and probabilities.
    """
    _quiet_tensorflow()

    def action():
        if target.is_dir():
            model_path = target / "model.keras"
            default = target / "export" / "saved_model"
        else:
            model_path = target
            default = target.with_name(f"{target.stem}_saved_model")
        if not model_path.is_file():
            raise _BadInput(f"{model_path}: model file not found.")
        path = output or default
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise _BadInput(
                f"--output {path}: exists and is not empty; choose a new "
                "folder so an earlier export is never overwritten."
            )
        from advtrain.experiment import load_classifier
        from advtrain.export import export_saved_model

        classifier = load_classifier(model_path, safe_mode=not unsafe_load)
        export_saved_model(classifier, path)
        shape = ", ".join(str(d) for d in classifier.input_shape[1:])
        _echo(f"exported {model_path} to {path}")
        _echo(
            f"signature serving_default: images uint8 [N, {shape}] -> "
            "logits, probabilities"
        )

    _guarded(debug, action)


@app.command()
def resume(
    run_dir: Annotated[
        Path, typer.Argument(help="The run folder of an interrupted run.")
    ],
    debug: DebugOption = False,
) -> None:
    """Continue an interrupted run from its last checkpoint.

    Reads RUN_DIR/recipe.yaml (the resolved recipe); the same as
    `advtrain run RUN_DIR/recipe.yaml --output RUN_DIR`.
    """
    _quiet_tensorflow()

    def action():
        from advtrain.config import load_recipe

        if not run_dir.is_dir():
            raise _BadInput(f"{run_dir}: run folder not found.")
        recipe_path = run_dir / "recipe.yaml"
        if not recipe_path.is_file():
            raise _BadInput(
                f"{run_dir}: not a run folder (no recipe.yaml); start a run "
                "with `advtrain run RECIPE --output DIR`."
            )
        if (run_dir / "metrics.json").is_file():
            raise _BadInput(
                f"{run_dir}: the run is finished (metrics.json); nothing to resume."
            )
        _train(recipe_path, load_recipe(recipe_path), run_dir)

    _guarded(debug, action)


@app.command()
def profile(
    recipe: Annotated[str, typer.Argument(help="Recipe file or shipped name.")],
    set_: SetOption = None,
    steps: Annotated[
        Optional[int],
        typer.Option(min=1, help="Steps per timed round (default >= 20)."),
    ] = None,
    debug: DebugOption = False,
) -> None:
    """Time the input pipeline, the train step and both; say which bounds.

    Writes nothing: prints the three timings, whether the run is
    input-bound or compute-bound and by how much, and what to change.
    """
    _quiet_tensorflow()

    def action():
        from advtrain.config import load_recipe

        path = resolve_recipe_path(recipe)
        resolved = load_recipe(path, set_ or [])
        from advtrain.profiling import profile as run_profile

        _echo(f"recipe: {path} ({resolved.name})")
        run_profile(resolved, steps=steps, echo=_echo)

    _guarded(debug, action)


@app.command()
def launch(
    recipe: Annotated[str, typer.Argument(help="Recipe file or shipped name.")],
    workers: Annotated[
        int, typer.Option("--workers", "-n", min=2, help="Local workers.")
    ] = 2,
    set_: SetOption = None,
    output: Annotated[
        Optional[Path], typer.Option("--output", "-o", help="Run folder.")
    ] = None,
    debug: DebugOption = False,
) -> None:
    """Run a recipe on N local workers (MultiWorkerMirroredStrategy).

    Starts N `advtrain run` processes on 127.0.0.1 with a TF_CONFIG each;
    worker 0 (the chief) writes the run folder. Reports each exit code;
    exits 0 when all succeed, else with the first failure's code.
    """
    _quiet_tensorflow()

    def action():
        from advtrain.launch import launch as run_launch

        path = resolve_recipe_path(recipe)
        results = run_launch(
            str(path),
            workers,
            overrides=set_ or [],
            output=output,
            echo=_echo,
        )
        failed = [r.exit_code for r in results if r.exit_code != 0]
        if failed:
            raise typer.Exit(code=failed[0] if failed[0] > 0 else 1)

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
