"""The `advtrain` command line: a thin Typer layer over `advtrain.recipe`.

Exit codes: 0 done, 1 failed, 2 bad input (one line, nothing written),
3 catastrophically overfitted, 4 evaluation unreliable (both: weights
saved; the run's verdict), 75 preempted, 130 interrupted; `_exits` turns
an exception into them.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from advtrain.utils.errors import (
    BAD_INPUT,
    ArgumentError,
    BackendNotInstalled,
    exit_code_of,
    one_line,
)


class _OneLineUsage(TyperGroup):  # usage errors: one `error:` line, exit 2
    def main(self, *args, standalone_mode: bool = True, **kwargs):
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except Exception as exc:
            # Typer vendors click in some versions: match the class by name.
            if not any(c.__name__ == "UsageError" for c in type(exc).__mro__):
                raise
            if type(exc).__name__ == "NoArgsIsHelpError":
                exc.show()  # bare `advtrain`: the help text
                sys.exit(exc.exit_code)
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx else ""
            message = " ".join(exc.format_message().split())
            typer.echo(f"error: {message}{hint}", err=True)
            sys.exit(exc.exit_code)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_OneLineUsage,
    no_args_is_help=True,
    help="Adversarial training and transfer learning for Keras 3.",
)

RECIPES_DIR = Path(__file__).parent.parent / "recipes"
# `python -m advtrain.cli`: `sys.argv[0]` is this file's neighbour.
_MAIN = Path(__file__).with_name("__main__.py")

RecipeArgument = Annotated[str, typer.Argument(help="Recipe file or shipped name.")]
TargetArgument = Annotated[
    Path, typer.Argument(help="A run folder or a saved .keras classifier.")
]
OutputOption = Annotated[
    Optional[Path], typer.Option("--output", "-o", help="Run folder.")
]
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
_DEBUG = {"on": False}  # `advtrain --debug COMMAND`, set by _root


def _show_version(value: bool) -> None:
    # One line, exit 0, also without a Keras backend (it says which extra
    # installs one): the question was what is installed, and that answers it.
    if not value:
        return
    from advtrain import __version__

    try:
        from advtrain import backend
    except BackendNotInstalled as exc:
        typer.echo(f"advtrain {__version__} ({exc.summary})")
        raise typer.Exit() from None
    import keras

    typer.echo(f"advtrain {__version__} (Keras {keras.__version__} on {backend.NAME})")
    raise typer.Exit()


def _require_backend() -> None:
    # Before any command imports Keras: without a backend to run on, the
    # one line that says which to install, exit 2 (not Keras's traceback).
    try:
        from advtrain import backend  # noqa: F401 - chooses Keras's backend
    except BackendNotInstalled as exc:
        _fail(str(exc), BAD_INPUT)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="Show tracebacks instead of one line, and TensorFlow's logs.",
        ),
    ] = False,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet",
            "-q",
            help="No live progress in any command (as each command's --quiet).",
        ),
    ] = False,
) -> None:
    """Adversarial training and transfer learning for Keras 3."""
    _require_backend()
    from advtrain.utils.progress import set_quiet

    _DEBUG["on"] = debug
    set_quiet(quiet)
    if debug:
        os.environ["ADVTRAIN_DEBUG"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _quiet(quiet: bool) -> None:  # after _root's
    if quiet:
        from advtrain.utils.progress import set_quiet

        set_quiet(True)


QuietOption = Annotated[
    bool,
    typer.Option(
        "--quiet",
        "-q",
        callback=_quiet,
        help="No live progress (step bars, periodic progress lines); "
        "epoch lines and the summary stay.",
    ),
]


def _fail(message: str, code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


def resolve_recipe_path(name: str) -> Path:
    """A recipe path, or the name of a shipped recipe ("quickstart")."""
    path = Path(name)
    if path.is_file():
        return path
    if path.is_dir():
        raise ValueError(f"{name}: is a folder, expected a recipe file.")
    if path.exists():
        raise ValueError(f"{name}: not a regular file, expected a recipe file.")
    shipped = RECIPES_DIR / f"{name}.yaml"
    if path.suffix == "" and shipped.is_file():
        return shipped
    known = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
    raise ValueError(f"{name}: recipe file not found (shipped recipes: {known}).")


def _load(recipe: str, overrides: Optional[list[str]]):
    from advtrain.recipe.loader import load_recipe

    path = resolve_recipe_path(recipe)
    return path, load_recipe(path, overrides or [])


def _model_file(target: Path) -> Path:
    if not target.exists():
        raise ValueError(
            f"{target}: not found (expected a run folder or a .keras file)."
        )
    if not target.is_dir():
        return target
    if not (target / "model.keras").is_file():
        raise ValueError(
            f"{target}: not a finished run folder (no model.keras); expected "
            "a run folder or a .keras file."
        )
    return target / "model.keras"


@contextlib.contextmanager
def _exits(recipe_path: Optional[Path] = None):
    # One line on stderr (`--debug`: the traceback); bad input is prefixed
    # with `recipe_path`.
    try:
        yield
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        _fail("interrupted; completed checkpoints are kept.", 130)
    except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence
        from advtrain.train.preemption import Preempted, exit_preempted

        code = exit_code_of(exc)
        if isinstance(exc, Preempted):
            typer.echo(str(exc), err=True)
            exit_preempted(exc)  # multi-worker: without teardown (see there)
            raise typer.Exit(code=code) from None
        if _DEBUG["on"]:
            raise
        line = one_line(exc)
        if not hasattr(exc, "exit_code") and code == 1:  # unexpected: say what
            line = f"{type(exc).__name__}: {line} (rerun as `advtrain --debug ...`)"
        elif code == 2 and recipe_path:
            if not line.startswith((str(recipe_path), "--")):  # named already
                line = f"{recipe_path}: {line}"
        _fail(line, code)


def _on_recipe_backend(path: Path, resolved) -> None:
    # Keras fixes its backend at import, before a recipe is read: when
    # `runtime.backend` differs and KERAS_BACKEND is unset, the command execs
    # itself with KERAS_BACKEND set (same exit code, signals and output).
    from advtrain import backend

    requested = resolved.runtime.backend
    with _exits(path):
        if not backend.must_restart(requested, "runtime.backend", "the recipe"):
            return
        # The command (console script or `python -m advtrain.cli`), not a
        # test runner or notebook calling the app.
        started = Path(sys.argv[0])
        if not (
            (started.stem == "advtrain" and started.suffix in ("", ".exe"))
            or (started.suffix == ".py" and started.resolve() == _MAIN.resolve())
        ):
            raise ArgumentError(
                "runtime.backend",
                f"Keras already runs on {backend.NAME} in this process; set "
                f"KERAS_BACKEND={requested} before it starts. "
                f"Received: runtime.backend={requested}",
            )
    backend.select(requested)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "advtrain.cli", *sys.argv[1:]])


def _train(path: Path, resolved, output: Optional[Path]) -> None:
    from advtrain.recipe.run_folder import check_recipe_paths

    _on_recipe_backend(path, resolved)
    with _exits(path):
        resolved.check_runnable()
        check_recipe_paths(resolved, output)
    from advtrain.recipe.run import run as run_recipe
    from advtrain.recipe.summary import summary_table

    typer.echo(f"recipe: {path} ({resolved.name})")
    with _exits(path):
        result = run_recipe(resolved, output, echo=typer.echo)
    typer.echo(f"run folder: {result.output_dir}")
    typer.echo(summary_table(result.metrics))
    verdict = result.metrics.get("verdict")
    if verdict and verdict["kind"] != "sound":
        # Finished and saved, but its figure is not to be trusted: a script
        # must not take it (`advtrain.evaluation.verdict.EXIT_CODES`).
        from advtrain.evaluation.verdict import verdict_exit_code, verdict_line

        typer.echo(f"warning: {verdict_line(verdict)}", err=True)
        raise typer.Exit(code=verdict_exit_code(verdict))


@app.command()
def run(
    recipe: RecipeArgument,
    set_: SetOption = None,
    output: OutputOption = None,
    quiet: QuietOption = False,
) -> None:
    """Train a recipe adversarially, evaluate it, and write the run folder."""
    with _exits():
        _train(*_load(recipe, set_), output)


@app.command("eval")
def eval_(
    target: TargetArgument,
    recipe: Annotated[
        Optional[str],
        typer.Option("--recipe", "-r", help="Recipe (default: the run's)."),
    ] = None,
    set_: SetOption = None,
    unsafe_load: UnsafeLoadOption = False,
    save_examples: Annotated[
        bool,
        typer.Option(
            "--save-examples",
            help="Also write each example's worst-case adversarial input "
            "and verdict to adversarial_examples.npz beside the model.",
        ),
    ] = False,
    quiet: QuietOption = False,
) -> None:
    """Evaluate a trained classifier: clean, FGSM and PGD accuracy, and
    the gradient-masking sanity checks."""
    with _exits():
        from advtrain.recipe.loader import load_recipe
        from advtrain.recipe.run_folder import check_recipe_paths
        from advtrain.utils.io import check_keras_file, check_writable_dir

        model_path = _model_file(target)
        if recipe is None and not target.is_dir():
            raise ValueError(f"{target}: evaluating a model file needs --recipe.")
        recipe_path = resolve_recipe_path(recipe) if recipe else target / "recipe.yaml"
        check_keras_file(model_path)
        resolved = load_recipe(recipe_path, set_ or [])
        with _exits(recipe_path):
            # Writes nothing but eval-metrics.json (and, asked, the
            # adversarial examples) into a run folder.
            check_recipe_paths(resolved, target, writes=target.is_dir())
        if save_examples:
            check_writable_dir(model_path.parent, "--save-examples")
        from advtrain.evaluation.sanity import format_sanity_checks
        from advtrain.recipe.saved import evaluate_saved
        from advtrain.recipe.summary import summary_table

        metrics = evaluate_saved(
            model_path,
            resolved,
            echo=typer.echo,
            safe_mode=not unsafe_load,
            save_examples=save_examples,
        )
        typer.echo(summary_table(metrics))
        typer.echo(format_sanity_checks(metrics["sanity_checks"]))


@app.command()
def export(
    target: TargetArgument,
    output: Annotated[
        Optional[Path],
        typer.Option(
            "--output",
            "-o",
            help="SavedModel folder (default: RUN_DIR/export/saved_model).",
        ),
    ] = None,
    unsafe_load: UnsafeLoadOption = False,
) -> None:
    """Export a classifier as a TensorFlow SavedModel for TF Serving.

    Its serving_default signature takes uint8 images [N, H, W, C] (0..255)
    and returns logits and probabilities. Runs on TensorFlow and JAX, with
    TensorFlow installed.
    """
    with _exits():
        from advtrain.evaluation.export import check_exportable, export_saved_model
        from advtrain.utils.io import check_keras_file, check_writable_dir

        model_path = _model_file(target)
        check_exportable()
        check_keras_file(model_path)
        if output is not None:
            path = output
        elif target.is_dir():
            path = target / "export" / "saved_model"
        else:
            path = target.with_name(f"{target.stem}_saved_model")
        check_writable_dir(path, "--output")
        # The run folder's own export is derived from its model.keras and
        # is refreshed; a folder named with --output is never overwritten.
        refresh = output is None and target.is_dir()
        if not refresh and path.exists() and any(path.iterdir()):
            raise ValueError(
                f"--output {path}: exists and is not empty; choose a new "
                "folder so an earlier export is never overwritten."
            )
        from advtrain.recipe.saved import load_classifier

        classifier = load_classifier(model_path, safe_mode=not unsafe_load)
        export_saved_model(classifier, path, replace=refresh)
        shape = ", ".join(str(d) for d in classifier.input_shape[1:])
        typer.echo(f"exported {model_path} to {path}")
        typer.echo(
            f"signature serving_default: images uint8 [N, {shape}] -> "
            "logits, probabilities"
        )


@app.command()
def resume(
    run_dir: Annotated[
        Path, typer.Argument(help="The run folder of an interrupted run.")
    ],
    quiet: QuietOption = False,
) -> None:
    """Continue an interrupted run from its last checkpoint.

    Reads RUN_DIR/recipe.yaml (the resolved recipe); the same as
    `advtrain run RUN_DIR/recipe.yaml --output RUN_DIR`.
    """
    with _exits():
        from advtrain.recipe.loader import load_recipe
        from advtrain.recipe.run_folder import resumable_recipe

        recipe_path = resumable_recipe(run_dir)
        _train(recipe_path, load_recipe(recipe_path), run_dir)


@app.command()
def profile(
    recipe: RecipeArgument,
    set_: SetOption = None,
    steps: Annotated[
        Optional[int],
        typer.Option(min=1, help="Steps per timed round (default >= 20)."),
    ] = None,
) -> None:
    """Time the input pipeline, the train step and both; say which bounds.

    Writes nothing: prints the three timings, whether the run is
    input-bound or compute-bound and by how much, and what to change.
    """
    with _exits():
        from advtrain.recipe.run_folder import check_recipe_paths

        path, resolved = _load(recipe, set_)
        _on_recipe_backend(path, resolved)
        with _exits(path):
            check_recipe_paths(resolved, writes=False)
        from advtrain.cli.profile import profile as run_profile

        typer.echo(f"recipe: {path} ({resolved.name})")
        run_profile(resolved, steps=steps, echo=typer.echo)


@app.command()
def launch(
    recipe: RecipeArgument,
    workers: Annotated[
        int, typer.Option("--workers", "-n", min=2, help="Local workers.")
    ] = 2,
    set_: SetOption = None,
    output: OutputOption = None,
    max_restarts: Annotated[
        int,
        typer.Option(
            "--max-restarts",
            min=0,
            help="After a worker fails, relaunch all workers from the last "
            "checkpoint, up to this many times.",
        ),
    ] = 0,
) -> None:
    """Run a recipe on N local workers, one data-parallel run.

    Starts N `advtrain run` processes on 127.0.0.1, each with the cluster in
    its environment (TensorFlow: a TF_CONFIG for MultiWorkerMirroredStrategy;
    JAX: KERAS_DISTRIBUTION_* for keras.distribution.initialize);
    worker 0 (the chief) writes the run folder. Reports each exit code;
    exits 0 when all succeed, 75 when SIGTERM/SIGINT stopped them after a
    checkpoint, else with the first failure's code. Workers' full output
    goes to log files (kept on failure, echoed with --debug).
    """
    with _exits():
        from advtrain.cli.launch import exit_code
        from advtrain.cli.launch import launch as run_launch
        from advtrain.recipe.loader import load_recipe
        from advtrain.recipe.run_folder import check_recipe_paths

        path = resolve_recipe_path(recipe)
        with _exits(path):
            resolved = load_recipe(path, set_ or [])
        # The launcher on the recipe's backend, which sets up its workers.
        _on_recipe_backend(path, resolved)
        with _exits(path):
            resolved.check_runnable()  # before N workers each say it
            check_recipe_paths(resolved, output)
        results = run_launch(
            str(path),
            workers,
            overrides=set_ or [],
            output=output,
            echo=typer.echo,
            max_restarts=max_restarts,
            debug=_DEBUG["on"],
        )
        code = exit_code(results)
        if code:
            raise typer.Exit(code=code)


@app.command()
def show(
    recipe: RecipeArgument,
    set_: SetOption = None,
) -> None:
    """Print what `run` would do, and write nothing.

    The resolved recipe, the data, the runtime, the model's input adapter
    chain, the batch plan (global / replicas / per replica, steps per
    epoch and per host call) and each phase's learning-rate schedule.
    """
    with _exits():
        from advtrain.cli.show import show as show_recipe

        path, resolved = _load(recipe, set_)
        _on_recipe_backend(path, resolved)
        typer.echo(f"recipe: {path}")
        with _exits(path):
            show_recipe(resolved, echo=typer.echo)


@app.command()
def recipes() -> None:
    """List the recipes shipped with advtrain."""
    import yaml

    for path in sorted(RECIPES_DIR.glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            description = str(data.get("description", "")).strip()
        except yaml.YAMLError:
            description = "(unreadable)"
        typer.echo(f"{path.stem:<20} {(description.splitlines() or [''])[0]}")
