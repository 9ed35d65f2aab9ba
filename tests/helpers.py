"""Small models and measures shared by the tests (import as `helpers`)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np

# A small recipe run on the digits (the tier's Keras backend), for the
# end-to-end tests of a run's verdict.
SMALL_RUN = {
    "data": {"source": "digits", "limit_train": 512, "limit_test": 64},
    "model": {"backbone": "small_cnn", "width": 8},
    "output": {"tensorboard": False, "plots": False, "export_saved_model": False},
    "runtime": {"backend": keras.backend.backend()},
}


def never_robust_recipe() -> dict:
    """Trains at eps 0.3 in name only (one PGD step of 0.001): the guard's
    PGD-3 takes every epoch's batch to about 0% while the training attack's
    accuracy climbs, the signature of a run that was never robust."""
    return {
        **SMALL_RUN,
        "name": "never_robust",
        "attack": {
            "method": "pgd",
            "eps": 0.3,
            "steps": 1,
            "step_size": 0.001,
            "random_start": False,
            "adv_weight": 1.0,
        },
        "train": {
            "epochs": 2,
            "batch_size": 64,
            "learning_rate": 0.01,
            "co_guard": True,
            "co_guard_examples": 64,
            "co_guard_pgd_steps": 3,
        },
        "eval": {
            "attacks": ["pgd"],
            "pgd_steps": 2,
            "max_examples": 32,
            "sanity_examples": 32,
            "budget": "cheap",
        },
    }


def dense_classifier(input_shape=(8, 8, 1), classes=10, seed=0):
    """A BatchNorm-free classifier: deterministic and order-independent."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input(input_shape)
    h = keras.layers.Flatten()(inputs)
    h = keras.layers.Dense(32, activation="relu")(h)
    outputs = keras.layers.Dense(classes)(h)
    return keras.Model(inputs, outputs)


def bn_classifier(input_shape=(8, 8, 1), classes=10, seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input(input_shape)
    h = keras.layers.Conv2D(8, 3, padding="same")(inputs)
    h = keras.layers.BatchNormalization(momentum=0.9)(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    outputs = keras.layers.Dense(classes)(h)
    return keras.Model(inputs, outputs)


def sgd_compiled(model):
    """`model` compiled with SGD at 0.1 and cross-entropy on logits."""
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def art_classifier(model, input_shape=(8, 8, 1), classes=10):
    """`model` wrapped for ART (the independent attack implementations the
    tests compare against): logits out, pixels in [0, 1]."""
    from art.estimators.classification import TensorFlowV2Classifier

    return TensorFlowV2Classifier(
        model=model,
        nb_classes=classes,
        input_shape=input_shape,
        loss_object=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        clip_values=(0.0, 1.0),
    )


def accuracy(model, x, y) -> float:
    return float(np.mean(np.argmax(model(x, training=False), axis=-1) == y))


def run_fresh(command, cwd, check=True, **env):
    """`command` (a list) as a user runs it: a fresh interpreter in `cwd`,
    one TensorFlow thread, `env` added, no PYTHONPATH (so nothing the test
    process imported or put on the path helps it). With `check`, asserts
    exit 0 (the output's tail in the message). Returns the process."""
    import os
    import subprocess

    quiet = {"TF_NUM_INTRAOP_THREADS": 1, "OMP_NUM_THREADS": 1}
    environ = {**os.environ, **{k: str(v) for k, v in {**quiet, **env}.items()}}
    environ.pop("PYTHONPATH", None)
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def run_console(cwd, *args, **env):
    """`advtrain ARGS` through the installed console script in `cwd`, as a
    user runs it (`run_fresh`; unlike `python -m`, the script does not put
    the current folder on sys.path). Asserts exit 0; returns the process."""
    import sys
    from pathlib import Path

    return run_fresh([Path(sys.executable).parent / "advtrain", *args], cwd, **env)


# ------------------------------------------------- one vs two CPU replicas

# Logical CPU devices must be configured before TensorFlow starts, so each
# replica count needs its own process. Rather than a pair of processes per
# test, a test module registers its script (`on_replicas`), marks its test
# `@pytest.mark.replicas(NAME)`, and reads the arrays through the session
# fixture `replica_runs` (conftest.py): every selected script runs in one
# 1-replica and one 2-replica process. A script sees `np`, `runtime` (ready
# for its replica count) and `out` (where it saves: `np.savez(out, ...)`);
# an exception in one script fails its own test only.
REPLICA_SCRIPTS: dict[str, tuple[str, tuple[int, ...]]] = {}

REPLICA_RUNNER = """\
import json, os, sys, traceback
import numpy as np
from advtrain.train.runtime import make_runtime

replicas, jobs, folder = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
runtime = make_runtime(
    strategy="mirrored" if replicas > 1 else "default",
    cpu_replicas=replicas if replicas > 1 else None,
    steps_per_execution=1,
)
assert runtime.replicas == replicas, runtime.describe()
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
for name, script in jobs.items():
    out = os.path.join(folder, f"{name}-{replicas}.npz")
    scope = {"__name__": "__replicas__", "np": np, "runtime": runtime, "out": out}
    try:
        exec(compile(script, name, "exec"), scope)
    except BaseException:
        with open(out + ".error", "w") as error:
            error.write(traceback.format_exc())
# Every result is on disk. TensorFlow's teardown under a 2-replica
# MirroredStrategy sometimes never returns after input errors were raised
# from tf.data (seen 2026-12-07: all files written, the process idle for
# minutes), so the runner leaves without it.
sys.stdout.flush()
os._exit(0)
"""


def on_replicas(name: str, script: str, replicas=(1, 2)) -> str:
    """Registers `script` to run once per replica count in the session's
    shared replica processes; returns `name`."""
    import textwrap

    REPLICA_SCRIPTS[name] = (textwrap.dedent(script), tuple(replicas))
    return name


def run_replica_scripts(folder, names) -> dict:
    """Runs the scripts `names` in one process per replica count, at the
    same time; returns {(name, replicas): arrays, or the error text}."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(root))
    env.pop("TF_CONFIG", None)
    counts = sorted({r for n in names for r in REPLICA_SCRIPTS[n][1]})
    procs = {}
    for r in counts:
        jobs = {n: REPLICA_SCRIPTS[n][0] for n in names if r in REPLICA_SCRIPTS[n][1]}
        procs[r] = subprocess.Popen(
            [
                sys.executable,
                "-c",
                REPLICA_RUNNER,
                str(r),
                json.dumps(jobs),
                str(folder),
            ],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    logs = {r: proc.communicate(timeout=900)[0] for r, proc in procs.items()}
    results = {}
    for name in names:
        for r in REPLICA_SCRIPTS[name][1]:
            path = Path(folder) / f"{name}-{r}.npz"
            error = Path(str(path) + ".error")
            if error.exists():
                results[name, r] = error.read_text()
            elif path.exists():
                results[name, r] = np.load(path)
            else:
                code = procs[r].returncode
                results[name, r] = (
                    f"{r}-replica process exit {code}:\n{logs[r][-3000:]}"
                )
    return results


def record_while_loops(monkeypatch) -> list:
    """The advtrain functions that build a JAX while loop from now on, by
    name (on other backends none are recorded): attacks driven from the
    host build none around an input gradient."""
    loops = []
    if keras.backend.backend() == "jax":
        import jax

        import advtrain

        home = os.path.dirname(advtrain.__file__)

        def recorded(cond, body, init):
            frame = sys._getframe(1)
            while frame and not frame.f_code.co_filename.startswith(home):
                frame = frame.f_back
            loops.append(frame.f_code.co_name if frame else "?")
            return while_loop(cond, body, init)

        while_loop = jax.lax.while_loop
        monkeypatch.setattr(jax.lax, "while_loop", recorded)
    return loops


def processes_of(marker: str) -> list[int]:
    """Pids of live processes whose command line mentions `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def kill_everything(proc: subprocess.Popen, marker: str) -> None:
    """SIGKILLs `proc`, its process group and every process of `marker`."""
    for pid in [proc.pid, *processes_of(marker)]:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass
    proc.wait()
