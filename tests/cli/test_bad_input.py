"""Bad input, tried as an adversary would.

Every case runs the `advtrain` command line in its own folder (the cwd)
and must: exit 2 (1 for a diverged run), print at most three lines on
stderr, no traceback, a message naming the file, key or path, and write
nothing (no run folder, no `runs/`, no file changed).

The whole table runs in-process, through the CLI entry point with a fresh
working folder per case; there a bad-input case must also fail before
anything heavy: no run reaches its data and model stage, and it costs
under 3 CPU seconds (about 0.02 s measured; a valid run of this table's
recipe costs 4-8 s in-process, TensorFlow already imported).
A dozen cases, one per kind of error, also run `python -m advtrain.cli`
in a fresh interpreter: that is where TensorFlow's start-up lines count
against the three-line budget and import order can bite.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Optional, Union

import keras
import numpy as np
import pytest
import yaml

from advtrain.train.callbacks import NaNGuard, NonFiniteLossError

VALID = {
    "name": "t",
    "data": {"source": "digits", "limit_train": 128, "limit_test": 32},
    "model": {"backbone": "small_cnn", "width": 4},
    "attack": {"method": "fgsm", "eps": 0.1},
    "train": {"epochs": 1, "batch_size": 32},
    "eval": {"pgd_steps": 1, "sanity_examples": 0, "fgsm": False},
    "output": {"tensorboard": False, "plots": False, "export_saved_model": False},
}
Files = dict[str, Union[str, bytes, None]]  # None: a folder


def recipe_text(**sections) -> str:
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in VALID.items()}
    for key, value in sections.items():
        if isinstance(value, dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return yaml.safe_dump(data, sort_keys=False)


def fake_keras(truncate: bool = False, config: bool = True) -> bytes:
    """A zip shaped like a .keras file (TensorFlow-free to make)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        if config:
            archive.writestr("config.json", '{"class_name": "Functional"}')
        archive.writestr("model.weights.h5", b"\x89HDF\r\n\x1a\n" + bytes(4000))
    data = buffer.getvalue()
    return data[: len(data) // 2] if truncate else data


@dataclasses.dataclass
class Case:
    id: str
    args: list[str]
    expect: list[str]  # fragments of the error line (file, key, path)
    files: Files = dataclasses.field(default_factory=dict)
    code: int = 2
    check: Optional[Callable[[Path], None]] = None  # extra check (code 1)


def run_case(args: list[str], recipe: str = "r.yaml", **kwargs) -> Case:
    return Case(args=["run", recipe, "-o", "out", *args], **kwargs)


def with_set(id: str, override: str, *expect: str) -> Case:
    key = override.split("=", 1)[0]
    return run_case(
        ["--set", override],
        id=id,
        expect=[key, *expect],
        files={"r.yaml": recipe_text()},
    )


def with_recipe(id: str, text: str, *expect: str, name: str = "r.yaml") -> Case:
    return run_case([], recipe=name, id=id, expect=[name, *expect], files={name: text})


def yaml_sections(id: str, *expect: str, **sections) -> Case:
    return with_recipe(id, recipe_text(**sections), *expect)


BOOLEANS = [
    yaml_sections("bool-eps-yes", "attack.eps", "boolean", attack={"eps": True}),
    with_recipe(
        "bool-eps-yes-literal",
        recipe_text().replace("eps: 0.1", "eps: yes"),
        "attack.eps",
        "boolean",
    ),
    yaml_sections("bool-batch-true", "train.batch_size", train={"batch_size": True}),
    with_set("bool-set-eps", "attack.eps=true", "boolean"),
    with_set("bool-set-epochs", "train.epochs=no", "boolean"),
    with_set("bool-adv-weight", "attack.adv_weight=off"),
    with_set("bool-image-size", "data.image_size=[true,8]"),
    with_set("bool-eps-sweep", "eval.eps_sweep=[0.1,true]"),
    with_set("bool-bn-momentum", "model.batchnorm.momentum=yes"),
]

ENUMS = [
    yaml_sections("enum-norm-2.5", "attack.norm", "2.5", attack={"norm": 2.5}),
    with_set("enum-norm-1", "attack.norm=1"),
    with_set("enum-norm-true", "attack.norm=true"),
    with_set("enum-norm-2-plus", "attack.norm=2.0000001"),
    with_set("enum-eval-norm-3", "eval.norm=3"),
    with_set("enum-method-case", "attack.method=FGSM"),
    with_set("enum-method-unknown", "attack.method=pgd2"),
    with_set("enum-precision", "runtime.precision=float16"),
    with_set("enum-source", "data.source=cifar"),
]

NUMBERS = [
    with_set("inf-eps", "attack.eps=.inf", "finite"),
    with_set("nan-eps", "attack.eps=.nan", "finite"),
    with_set("inf-warmup", "train.warmup_epochs=.inf", "finite"),
    with_set("inf-epochs", "train.epochs=.inf"),
    with_set("nan-sweep", "eval.eps_sweep=[.nan]", "finite"),
    with_set("inf-alpha", "attack.alpha=.inf", "finite"),
    with_set("huge-epochs", "train.epochs=99999999999999999999"),
    with_set("negative-batch", "train.batch_size=-1"),
    with_set("eps-above-1", "attack.eps=1.5"),
    with_set("huge-image-size", "data.image_size=[99999999999,8]"),
    with_set("string-batch", "train.batch_size=lots"),
]

SEEDS = [
    with_set("seed-negative", "train.seed=-1"),
    with_set("seed-2-32", "train.seed=4294967296"),
    with_set("seed-eval-2-31", "eval.seed=2147483648"),
    with_set("seed-bool", "train.seed=true"),
]

NAMES = [
    yaml_sections("name-parent", "name", "../../x", name="../../x"),
    yaml_sections("name-absolute", "name", name="/tmp/advtrain-abs"),
    yaml_sections("name-slash", "name", name="a/b"),
    yaml_sections("name-dotdot", "name", name=".."),
    yaml_sections("name-empty", "name", name=""),
    yaml_sections("name-int", "name", name=12),
    with_recipe("name-nul", 'name: "a\\0b"\n', "name", "NUL"),
    with_recipe("name-surrogate", 'name: "\\ud800"\n', "name", "surrogate"),
    with_recipe("name-newline", 'name: "a\\nb"\n', "name"),
    with_recipe("description-nul", 'description: "x\\0"\n', "description", "NUL"),
    with_recipe("path-nul", 'data: {source: mnist, path: "a\\0b"}\n', "data.path"),
    with_set("set-name-parent", "name=../escape"),
]

NESTED_LISTS = "name: t\ndata: " + "[" * 5000 + "]" * 5000 + "\n"
NESTED_MAPS = "data:\n" + "".join(f"{'  ' * i}k{i}:\n" for i in range(1, 40))
LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n"
    for p, c in zip("abcdefg", "bcdefgh", strict=True)
)
YAML = [
    with_recipe("yaml-complex-key-list", "? [a, b]\n: 1\n", "plain name"),
    with_recipe("yaml-complex-key-map", "data:\n  ? {a: 1}\n  : 2\n", "plain name"),
    with_recipe("yaml-deep-lists", NESTED_LISTS, "nested"),
    with_recipe("yaml-deep-maps", NESTED_MAPS + "    x: 1\n", "nested"),
    with_recipe("yaml-billion-laughs", LAUGHS, "too many values"),
    with_recipe("yaml-duplicate-key", "name: a\nname: b\n", "duplicate"),
    with_recipe(
        "yaml-python-tag", "name: !!python/object/apply:os.system [ls]\n", "tags"
    ),
    with_recipe("yaml-syntax", "data: [1,\n", "invalid YAML"),
    with_recipe("yaml-top-list", "- a\n- b\n", "mapping"),
    with_recipe("yaml-unknown-section", "trian: {epochs: 1}\n", "trian", "train"),
    with_recipe("yaml-unknown-key", "attack: {epss: 0.1}\n", "attack.epss"),
    with_recipe("yaml-bad-date", "name: 2024-13-45\n", "invalid YAML"),
    with_recipe("yaml-set", "eval: {eps_sweep: !!set {0.1}}\n", "eval.eps_sweep"),
    Case(
        "yaml-not-utf8",
        ["run", "r.yaml", "-o", "out"],
        ["r.yaml", "UTF-8"],
        {"r.yaml": "name: caf\xe9\n".encode("latin-1")},
    ),
    with_set("set-empty-key", "attack..eps=1", "empty key"),
    with_set("set-into-value", "attack.eps.x=1", "not a section"),
    run_case(
        ["--set", "attack"],
        id="set-no-equals",
        expect=["--set", "section.key=value"],
        files={"r.yaml": recipe_text()},
    ),
]

BIG = "name: t\n" + ("# " + "x" * 1022 + "\n") * (52 * 1024)
FILES = [
    with_recipe("size-52mb", BIG, "larger than"),
    with_recipe("size-1.5mb-list", "a: [" + "1, " * 500_000 + "1]\n", "larger than"),
    Case("recipe-missing", ["run", "nope.yaml"], ["nope.yaml", "not found"]),
    Case("recipe-folder", ["run", "d"], ["d", "folder"], {"d": None}),
    Case("recipe-dev-null", ["run", "/dev/null"], ["/dev/null", "regular file"]),
    Case(
        "show-unknown-key",
        ["show", "r.yaml"],
        ["r.yaml", "unknown key 'attack.epss'"],
        {"r.yaml": "attack: {epss: 0.1}\n"},
    ),
    yaml_sections(
        "weights-missing",
        "model.weights",
        "missing.weights.h5",
        "not found",
        model={"weights": "missing.weights.h5"},
    ),
    Case(
        "weights-random-bytes",
        ["run", "r.yaml", "-o", "out"],
        ["model.weights", "w.weights.h5", "HDF5"],
        {
            "r.yaml": recipe_text(model={"weights": "w.weights.h5"}),
            "w.weights.h5": os.urandom(4096),
        },
    ),
    Case(
        "weights-truncated-keras",
        ["run", "r.yaml", "-o", "out"],
        ["model.weights", "w.keras", "truncated"],
        {
            "r.yaml": recipe_text(model={"weights": "w.keras"}),
            "w.keras": fake_keras(truncate=True),
        },
    ),
    yaml_sections(
        "data-mnist-missing",
        "data.path",
        "no-mnist",
        "not found",
        data={"source": "mnist", "path": "no-mnist"},
    ),
    Case(
        "data-folder-is-file",
        ["run", "r.yaml", "-o", "out"],
        ["data.path", "img", "is a file"],
        {"r.yaml": recipe_text(data={"source": "folder", "path": "img"}), "img": "x"},
    ),
    yaml_sections(
        "data-arrays-missing",
        "data.path",
        "arr_x.npy",
        data={"source": "arrays", "path": "arr"},
    ),
    Case(
        "cache-under-file",
        ["run", "r.yaml", "-o", "out"],
        ["data.cache", "f/cache"],
        {"r.yaml": recipe_text(data={"cache": "f/cache"}), "f": "x"},
    ),
    yaml_sections("cache-proc", "data.cache", "/proc", data={"cache": "/proc/c"}),
    Case(
        "tfds-dir-under-file",
        ["run", "r.yaml", "-o", "out"],
        ["data.tfds_data_dir", "f/tfds", "is a file"],
        {"r.yaml": recipe_text(data={"tfds_data_dir": "f/tfds"}), "f": "x"},
    ),
    yaml_sections(
        "tfds-dir-proc",
        "data.tfds_data_dir",
        "/proc",
        data={"tfds_data_dir": "/proc/advtrain-tfds"},
    ),
    Case(
        "output-under-file",
        ["run", "r.yaml", "-o", "f/out"],
        ["--output", "f/out", "is a file"],
        {"r.yaml": recipe_text(), "f": "x"},
    ),
    Case(
        "output-is-file",
        ["run", "r.yaml", "-o", "f"],
        ["--output", "f", "not a folder"],
        {"r.yaml": recipe_text(), "f": "x"},
    ),
    Case(
        "output-proc",
        ["run", "r.yaml", "-o", "/proc/advtrain-out"],
        ["--output", "/proc"],
        {"r.yaml": recipe_text()},
    ),
    Case(
        "output-dir-under-file",
        ["run", "r.yaml"],
        ["output.dir", "f/run"],
        {"r.yaml": recipe_text(output={"dir": "f/run"}), "f": "x"},
    ),
    Case(
        "runs-under-file",
        ["run", "r.yaml"],
        ["runs", "not a folder"],
        {"r.yaml": recipe_text(), "runs": "x"},
    ),
    Case("eval-missing", ["eval", "nope"], ["nope", "not found"]),
    Case(
        "eval-random-bytes",
        ["eval", "m.keras", "--recipe", "r.yaml"],
        ["m.keras", "not a Keras model"],
        {"r.yaml": recipe_text(), "m.keras": os.urandom(5000)},
    ),
    Case(
        "eval-truncated",
        ["eval", "m.keras", "--recipe", "r.yaml"],
        ["m.keras", "truncated"],
        {"r.yaml": recipe_text(), "m.keras": fake_keras(truncate=True)},
    ),
    Case(
        "eval-fake-keras",
        ["eval", "m.keras", "--recipe", "r.yaml"],
        ["m.keras", "cannot load"],
        {"r.yaml": recipe_text(), "m.keras": fake_keras()},
    ),
    Case(
        "eval-folder-no-model",
        ["eval", "run"],
        ["run", "no model.keras"],
        {"run": None},
    ),
    Case(
        "eval-bad-recipe",
        ["eval", "m.keras", "--recipe", "r.yaml"],
        ["r.yaml", "attack.eps"],
        {"r.yaml": recipe_text(attack={"eps": True}), "m.keras": fake_keras()},
    ),
    Case("export-missing", ["export", "nope.keras"], ["nope.keras", "not found"]),
    Case(
        "export-random-bytes",
        ["export", "m.keras", "-o", "sm"],
        ["m.keras", "not a Keras model"],
        {"m.keras": os.urandom(5000)},
    ),
    Case(
        "export-truncated",
        ["export", "m.keras", "-o", "sm"],
        ["m.keras", "truncated"],
        {"m.keras": fake_keras(truncate=True)},
    ),
    Case(
        "export-output-under-file",
        ["export", "m.keras", "-o", "f/sm"],
        ["--output", "f/sm", "is a file"],
        {"m.keras": fake_keras(), "f": "x"},
    ),
    Case("resume-missing", ["resume", "nope"], ["nope", "not found"]),
    Case("resume-not-a-run", ["resume", "d"], ["d", "no recipe.yaml"], {"d": None}),
    Case(
        "profile-data-missing",
        ["profile", "r.yaml"],
        ["r.yaml", "data.path", "no-mnist"],
        {"r.yaml": recipe_text(data={"source": "mnist", "path": "no-mnist"})},
    ),
]

USAGE = [
    run_case(["--bogus"], id="usage-unknown-option", expect=["--bogus"]),
    Case("usage-unknown-command", ["trian"], ["trian"]),
    Case("usage-missing-argument", ["run"], ["Missing argument 'recipe'"]),
    Case("usage-steps-zero", ["profile", "r.yaml", "--steps", "0"], ["--steps"]),
    Case("usage-one-worker", ["launch", "r.yaml", "--workers", "1"], ["--workers"]),
    run_case(["--set"], id="usage-set-no-value", expect=["--set"]),
    Case("usage-debug-after-command", ["run", "r.yaml", "--debug"], ["--debug"]),
]

# A layer whose non-trainable state (named like a BatchNorm moving statistic)
# turns NaN in training while its output, and so the loss, stays finite;
# or whose output turns NaN. Four steps per epoch: epoch 2 diverges.
BUILDER = """
import keras
from keras import ops


class Drift(keras.layers.Layer):
    def __init__(self, poison_output=False, **kwargs):
        super().__init__(**kwargs)
        self.poison_output = poison_output

    def build(self, shape):
        self.moving_variance = self.add_weight(
            shape=(), initializer="zeros", trainable=False, name="moving_variance"
        )

    def call(self, x, training=False):
        if training:
            bad = self.moving_variance >= 5.0
            self.moving_variance.assign(
                ops.where(bad, float("nan"), self.moving_variance + 1.0)
            )
            if self.poison_output:
                x = x * ops.where(bad, float("nan"), 1.0)
        return x


def build(image_shape, num_classes, cfg, poison_output=False):
    inputs = keras.Input(image_shape)
    x = keras.layers.Flatten()(inputs)
    x = Drift(poison_output)(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


def build_nan_loss(image_shape, num_classes, cfg):
    return build(image_shape, num_classes, cfg, poison_output=True)
"""


def diverged(run_dir: Path) -> None:
    rows = (run_dir / "history.csv").read_text().strip().splitlines()
    assert len(rows) == 2, f"only epoch 1's row may be written: {rows}"
    assert not (run_dir / "model.keras").exists()
    assert not (run_dir / "metrics.json").exists()


def diverging(id: str, builder: str, *expect: str) -> Case:
    text = recipe_text(
        model={"builder": builder},
        train={"epochs": 3, "batch_size": 32},
        attack={"method": "none"},
    )
    return Case(
        id,
        ["run", "r.yaml", "-o", "out"],
        ["epoch 2, step 4", "kept", "Likely causes", *expect],
        {"r.yaml": text, "nanmodel.py": BUILDER},
        code=1,
        check=lambda cwd: diverged(cwd / "out"),
    )


DIVERGED = [
    diverging("diverged-bn-state", "nanmodel:build", "moving_variance"),
    diverging("diverged-nan-loss", "nanmodel:build_nan_loss", "loss became nan"),
]

CASES = DIVERGED + BOOLEANS + ENUMS + NUMBERS + SEEDS + NAMES + YAML + FILES + USAGE


# One case per kind of error, also run in a fresh interpreter.
FRESH_INTERPRETER = [
    "diverged-bn-state",  # a run that trains, then stops on NaN (exit 1)
    "enum-method-unknown",  # the recipe's checks (a name not in a registry)
    "yaml-syntax",  # the YAML parser
    "set-no-equals",  # --set overrides
    "weights-random-bytes",  # a damaged file the recipe names
    "eval-fake-keras",  # a model file Keras starts to load (TensorFlow logs)
    "usage-unknown-option",  # click's usage errors
]
# One case per layer that reads the input: the recipe's other checks
# (booleans, non-finite numbers, ranges, control characters, output paths)
# run the same code as enum-method-unknown and are checked in-process.
BY_ID = {c.id: c for c in CASES}
# A bad-input case in-process: the run fails while reading its input, so
# it costs milliseconds; a valid run of VALID costs 4-8 CPU seconds.
IN_PROCESS_CPU_SECONDS = 3.0
# In a fresh interpreter: what importing the CLI costs, plus this margin.
FRESH_CPU_MARGIN_SECONDS = 3.0


def snapshot(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*")}


def write_files(cwd: Path, files: Files) -> None:
    for rel, content in files.items():
        path = cwd / rel
        if content is None:
            path.mkdir(parents=True)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8", errors="surrogatepass")


@dataclasses.dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    cpu_seconds: float  # user + system time: load-independent
    before: dict[str, float]
    after: dict[str, float]
    cwd: Path
    prepared: Optional[bool] = None  # in-process: a run reached `prepare`


def execute_in_process(case: Case, cwd: Path) -> Outcome:
    """`advtrain ARGS` through the entry point, in this interpreter, with
    `cwd` as the working folder (and on sys.path, as a plugin's folder).
    `Outcome.prepared` says whether a run reached its first heavy stage
    (`advtrain.recipe.run.prepare`: runtime, data, model)."""
    from advtrain.cli import app
    from advtrain.recipe import run as run_module

    stages = []
    prepare = run_module.prepare

    def recorded_prepare(*args, **kwargs):
        stages.append("prepare")
        return prepare(*args, **kwargs)

    cwd.mkdir(parents=True)
    write_files(cwd, case.files)
    before = snapshot(cwd)
    stdout, stderr = io.StringIO(), io.StringIO()
    here, modules = os.getcwd(), set(sys.modules)
    os.chdir(cwd)
    sys.path.insert(0, str(cwd))
    run_module.prepare = recorded_prepare
    cpu = time.process_time()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                app(args=case.args, prog_name="advtrain")
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        cpu = time.process_time() - cpu
    finally:
        run_module.prepare = prepare
        os.chdir(here)
        sys.path.remove(str(cwd))
        for name in set(sys.modules) - modules:  # the case's own modules
            if str(getattr(sys.modules[name], "__file__", "")).startswith(str(cwd)):
                del sys.modules[name]
    return Outcome(
        code,
        stdout.getvalue(),
        stderr.getvalue(),
        cpu,
        before,
        snapshot(cwd),
        cwd,
        prepared=bool(stages),
    )


def execute_in_fresh_interpreter(args: list[str], cwd: Path) -> Outcome:
    """`python -m advtrain.cli ARGS` in `cwd`, with the user's default
    logging (TensorFlow's start-up lines count against the budget)."""
    cwd.mkdir(parents=True, exist_ok=True)
    before = snapshot(cwd)
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    env["PYTHONPATH"] = os.pathsep.join([str(cwd), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, "-m", "advtrain.cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    streams: dict[str, bytes] = {}
    readers = [
        threading.Thread(target=lambda n=n, f=f: streams.update({n: f.read()}))
        for n, f in (("out", proc.stdout), ("err", proc.stderr))
    ]
    for reader in readers:
        reader.start()
    watchdog = threading.Timer(600, proc.kill)
    watchdog.start()
    _, status, usage = os.wait4(proc.pid, 0)  # wait4: the child's CPU time
    watchdog.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    for reader in readers:
        reader.join()
    text = {k: v.decode("utf-8", "replace") for k, v in streams.items()}
    cpu = usage.ru_utime + usage.ru_stime
    return Outcome(
        proc.returncode, text["out"], text["err"], cpu, before, snapshot(cwd), cwd
    )


def check_outcome(case: Case, result: Outcome) -> None:
    shown = f"{case.args}: exit {result.code}\nstderr:\n{result.stderr}"
    assert result.code == case.code, shown
    lines = result.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 3, shown
    assert "Traceback" not in result.stderr + result.stdout, shown
    for fragment in case.expect:
        assert fragment in result.stderr, f"{fragment!r} not named. {shown}"
    if case.check is not None:
        case.check(result.cwd)
        return
    assert result.after == result.before, f"something was written. {shown}"


@pytest.fixture(scope="module")
def import_cpu_seconds(tmp_path_factory) -> float:
    """The CPU time of `python -m advtrain.cli --version` (the imports)."""
    result = execute_in_fresh_interpreter(
        ["--version"], tmp_path_factory.mktemp("version")
    )
    assert result.code == 0, result.stderr
    return result.cpu_seconds


def test_the_table_holds_100_distinct_cases_across_the_commands():
    """docs/reliability.md counts them; each id names one case, and every
    command that takes user input has bad-input cases."""
    from advtrain.cli import app

    assert len(CASES) >= 100
    assert len({c.id for c in CASES}) == len(CASES)
    taking_input = {c.name or c.callback.__name__ for c in app.registered_commands}
    taking_input -= {"recipes"}
    covered = {next((a for a in c.args if not a.startswith("-")), "") for c in CASES}
    assert taking_input <= covered, taking_input - covered


def test_the_fresh_interpreter_runs_table_cases_and_a_diverged_run():
    assert set(FRESH_INTERPRETER) <= set(BY_ID)
    assert {c for c in FRESH_INTERPRETER if BY_ID[c].code == 1}, "a diverged run"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_writes_nothing(case, tmp_path):
    result = execute_in_process(case, tmp_path / "cwd")
    check_outcome(case, result)
    if case.code == 2:
        assert not result.prepared, f"{case.id}: a run started (data, model)"
        assert result.cpu_seconds < IN_PROCESS_CPU_SECONDS, (
            f"{case.id}: {result.cpu_seconds:.1f} CPU s; bad input must fail "
            "before anything heavy (data, model, training) starts"
        )
    else:
        assert result.prepared  # the diverged runs: the spy sees a run start


@pytest.mark.parametrize("case_id", FRESH_INTERPRETER)
def test_bad_input_in_a_fresh_interpreter(case_id, tmp_path, import_cpu_seconds):
    case = BY_ID[case_id]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    write_files(cwd, case.files)
    result = execute_in_fresh_interpreter(case.args, cwd)
    check_outcome(case, result)
    if case.code == 2:
        extra = result.cpu_seconds - import_cpu_seconds
        assert extra < FRESH_CPU_MARGIN_SECONDS, (
            f"{case_id}: {extra:.1f} CPU s beyond the imports; bad input must "
            "fail before anything heavy starts"
        )


# -------------------------------------------------------- in-process guard


class _Poison(keras.layers.Layer):
    """Output = input; a non-trainable moving_variance turns NaN at step 3."""

    def build(self, shape):
        self.moving_variance = self.add_weight(
            shape=(), initializer="zeros", trainable=False, name="moving_variance"
        )

    def call(self, x, training=False):
        if training:
            value = self.moving_variance + 1.0
            self.moving_variance.assign(
                keras.ops.where(value >= 3.0, float("nan"), value)
            )
        return x


def test_nan_guard_stops_on_nan_model_state_before_the_csv_row(tmp_path):
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(2)(_Poison()(inputs))
    model = keras.Model(inputs, outputs)
    model.compile("sgd", "sparse_categorical_crossentropy")
    x = np.ones((8, 4), "float32")
    y = np.zeros((8,), "int32")
    csv = tmp_path / "history.csv"
    guard = NaNGuard(steps_per_epoch=2, last_good=lambda: Path("ckpt-1"))
    with pytest.raises(NonFiniteLossError) as info:
        model.fit(
            x,
            y,
            batch_size=4,
            epochs=3,
            verbose=0,
            callbacks=[guard, keras.callbacks.CSVLogger(str(csv))],
        )
    message = str(info.value)
    assert "model state became NaN or Inf" in message
    assert "moving_variance" in message
    assert "epoch 2, step 2 (global step 4)" in message
    assert "kept ckpt-1" in message
    assert len(csv.read_text().strip().splitlines()) == 2  # header + epoch 1
