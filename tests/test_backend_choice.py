"""The Keras backend is chosen before Keras is imported, among the
installed ones (`advtrain.backend.choose_backend`): KERAS_BACKEND, else
keras.json's if installed, else the first installed. Without one, the
command line says which extra to install, in one line.

Each case runs in a fresh interpreter (the choice is made once, at
import) on this checkout (PYTHONPATH), with KERAS_HOME a temporary
folder so the user's keras.json plays no part. The backends are hidden
from it by a finder placed before every other (`HIDE`): `find_spec`
returns None for them and importing them fails, as when not installed.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import pytest

pytestmark = pytest.mark.backend_neutral

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("tensorflow", "jax")  # advtrain.backend.SUPPORTED's order
INSTALLED = [name for name in BACKENDS if importlib.util.find_spec(name)]
NO_BACKEND = (
    'no Keras backend is installed: pip install "advtrain[tensorflow]" or '
    'pip install "advtrain[jax]"'
)

# python -c HIDE NAMES ARGS: hides the comma-separated top-level modules
# NAMES, then runs `python -c CODE ...` for ARGS `-c CODE ...`, else the
# command line (`python -m advtrain.cli ARGS`).
HIDE = """
import runpy, sys
hidden = set(sys.argv[1].split(","))

class Hidden:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in hidden:
            return None
        return self.finder.find_spec(name, path, target)

sys.meta_path[:] = [Hidden(finder) for finder in sys.meta_path]
if sys.argv[2] == "-c":
    code = sys.argv[3]
    sys.argv[:] = ["-c", *sys.argv[4:]]
    exec(code, {"__name__": "__main__"})
else:
    sys.argv[:] = ["advtrain", *sys.argv[2:]]
    runpy.run_module("advtrain.cli", run_name="__main__", alter_sys=True)
"""


def fresh(tmp_path, *args, hidden=(), keras_json=None, **env):
    """`python -m advtrain.cli ARGS` (or `-c CODE`) in a fresh interpreter
    on this checkout, `hidden` backends hidden, KERAS_BACKEND unset unless
    `env` sets it, keras.json naming `keras_json`'s backend."""
    home = tmp_path / "keras_home"
    home.mkdir(exist_ok=True)
    if keras_json:
        (home / "keras.json").write_text(json.dumps({"backend": keras_json}))
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KERAS_BACKEND", "ADVTRAIN_CHOSEN_KERAS_BACKEND")
    }
    environ.update(
        PYTHONPATH=str(ROOT), KERAS_HOME=str(home), OMP_NUM_THREADS="1", **env
    )
    command = [sys.executable, "-c", HIDE, ",".join(hidden) or "-", *args]
    return subprocess.run(
        command, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=300
    )


# Prints the backend Keras runs on, KERAS_BACKEND as this process leaves it
# for the processes it starts, and whether advtrain took it as the user's.
CHOICE = """
import os
from advtrain import backend
print(backend.NAME, os.environ.get("KERAS_BACKEND"), backend.NAMED)
"""


def test_version_with_keras_backend_unset_names_the_installed_backend(tmp_path):
    # The JAX tier's environment has no TensorFlow, Keras's own default:
    # `advtrain --version` there used to be Keras's 45-line traceback.
    done = fresh(tmp_path, "--version")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        f"advtrain 0.3.0 (Keras {keras.__version__} on {INSTALLED[0]})"
    ]


@pytest.mark.parametrize("configured", BACKENDS)
def test_keras_json_backend_is_chosen_when_installed(tmp_path, configured):
    done = fresh(tmp_path, "-c", CHOICE, keras_json=configured)
    assert done.returncode == 0, done.stderr[-3000:]
    chosen = configured if configured in INSTALLED else INSTALLED[0]
    # Chosen by advtrain, not the user: written to KERAS_BACKEND for Keras
    # and the processes this one starts.
    assert done.stdout.split() == [chosen, chosen, "None"]


def test_keras_backend_set_by_the_user_or_inherited_from_a_choice(tmp_path):
    name = INSTALLED[-1]
    user = fresh(tmp_path, "-c", CHOICE, KERAS_BACKEND=name)
    assert user.stdout.split() == [name, name, name], user.stderr[-3000:]
    # Inherited from a process where advtrain chose it: not the user's, so
    # a recipe naming another backend restarts instead of being refused.
    inherited = fresh(
        tmp_path,
        "-c",
        CHOICE,
        KERAS_BACKEND=name,
        ADVTRAIN_CHOSEN_KERAS_BACKEND=name,
    )
    assert inherited.stdout.split() == [name, name, "None"], inherited.stderr


def test_no_backend_installed_version_is_one_line(tmp_path):
    done = fresh(tmp_path, "--version", hidden=("tensorflow", "jax", "torch"))
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [f"advtrain 0.3.0 ({NO_BACKEND})"]


@pytest.mark.parametrize(
    "command", [["recipes"], ["show", "quickstart"], ["run", "quickstart", "-q"]]
)
def test_no_backend_installed_commands_are_one_line_exit_2(tmp_path, command):
    done = fresh(tmp_path, *command, hidden=("tensorflow", "jax", "torch"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"error: {NO_BACKEND}. Received: KERAS_BACKEND=<unset>"
    ]
    assert done.stdout == "" and not (tmp_path / "runs").exists()


def test_no_backend_installed_library_names_raise_one_line(tmp_path):
    code = (
        "import advtrain\n"
        "print(advtrain.__version__)\n"
        "try:\n"
        "    advtrain.AdversarialModel\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = fresh(tmp_path, "-c", code, hidden=("tensorflow", "jax", "torch"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "0.3.0",
        f"BackendNotInstalled {NO_BACKEND}. Received: KERAS_BACKEND=<unset>",
    ]


def test_keras_backend_naming_a_missing_backend_is_one_line(tmp_path):
    missing = BACKENDS[-1]  # jax, hidden
    done = fresh(
        tmp_path, "show", "quickstart", hidden=(missing,), KERAS_BACKEND=missing
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"error: KERAS_BACKEND={missing} is not installed: pip install "
        f'"advtrain[{missing}]", or unset KERAS_BACKEND. '
        f"Received: KERAS_BACKEND={missing}"
    ]


def test_recipe_naming_a_backend_that_is_not_installed_is_one_line(tmp_path):
    # Instead of restarting on it (where Keras could not start).
    running = INSTALLED[0]
    wanted = next(name for name in BACKENDS if name != running)
    (tmp_path / "r.yaml").write_text(f"runtime: {{backend: {wanted}}}\n")
    done = fresh(tmp_path, "show", "r.yaml", hidden=(wanted,))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"error: r.yaml: runtime.backend: the recipe runs on {wanted}, which is "
        f'not installed: pip install "advtrain[{wanted}]", or runtime.backend: '
        f"auto for {running}. Received: runtime.backend={wanted}"
    ]
