"""Live progress: a redrawn bar on a terminal, plain lines elsewhere, and
`--quiet` silencing both (advtrain.utils.progress)."""

import io
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from helpers import dense_classifier

from advtrain.utils import progress
from advtrain.utils.progress import EpochProgress, Progress


@pytest.fixture(autouse=True)
def _loud(monkeypatch):
    monkeypatch.setenv("ADVTRAIN_PROGRESS_INTERVAL", "0")
    progress.set_quiet(False)
    yield
    progress.set_quiet(False)


def test_plain_mode_writes_whole_lines_with_counts_and_time_left():
    stream = io.StringIO()
    bar = Progress("evaluating (clean, pgd)", 4, unit="batches", stream=stream)
    assert not bar.interactive  # a StringIO is no terminal
    for done in range(1, 5):
        bar.update(done, f"{done * 8} examples")
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("evaluating (clean, pgd)  1/4 batches (25%)  8 ex")
    assert "left" in lines[0] and "left" not in lines[-1]


def test_plain_lines_are_rate_limited(monkeypatch):
    monkeypatch.setenv("ADVTRAIN_PROGRESS_INTERVAL", "3600")
    stream = io.StringIO()
    bar = Progress("epoch 1/1", 100, stream=stream)
    for done in range(1, 101):
        bar.update(done)
    bar.close()
    assert stream.getvalue() == ""


def test_plain_keep_writes_the_last_state_once(monkeypatch):
    # Written at the last update already: close adds no twin line.
    stream = io.StringIO()
    bar = Progress("fab_t on 9 examples", 2, unit="batches", stream=stream, keep=True)
    bar.update(1, "0 broken")
    bar.update(2, "0 broken")
    bar.close()
    assert [line.split("  ")[1] for line in stream.getvalue().splitlines()] == [
        "1/2 batches (50%)",
        "2/2 batches (100%)",
    ]
    # Rate-limited away: close writes the last state.
    monkeypatch.setenv("ADVTRAIN_PROGRESS_INTERVAL", "3600")
    stream = io.StringIO()
    bar = Progress("x", 2, unit="batches", stream=stream, keep=True)
    bar.update(1)
    bar.update(2)
    bar.close()
    assert stream.getvalue().startswith("x  2/2 batches (100%)")
    assert len(stream.getvalue().splitlines()) == 1


def test_terminal_mode_redraws_one_line_and_clears_it():
    stream = io.StringIO()
    bar = Progress("epoch 1/3", 2, stream=stream, interactive=True)
    bar.update(1, "loss 0.5000")
    bar.update(2, "loss 0.4000")  # the last step always draws
    bar.close()
    text = stream.getvalue()
    assert "\n" not in text
    assert text.count("\r\x1b[K") == 3  # two draws and the clearing
    assert "[####################] 2/2 steps (100%)  loss 0.4000" in text
    assert text.endswith("\r\x1b[K")


def test_quiet_writes_nothing():
    progress.set_quiet(True)
    stream = io.StringIO()
    for interactive in (True, False):
        bar = Progress("x", 2, stream=stream, interactive=interactive, keep=True)
        bar.update(1)
        bar.update(2)
        bar.close()
    assert stream.getvalue() == ""


def test_epoch_progress_follows_fit_steps(capsys):
    model = dense_classifier()
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    x = np.zeros((12, 8, 8, 1), "float32")
    y = np.zeros((12,), "int32")
    capsys.readouterr()
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[EpochProgress(2)])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[:2] for line in lines] == [
        ["epoch 1/2", f"{i}/3 steps ({p}%)"] for i, p in ((1, 33), (2, 67), (3, 100))
    ] + [["epoch 2/2", f"{i}/3 steps ({p}%)"] for i, p in ((1, 33), (2, 67), (3, 100))]
    assert "loss " in lines[0] and "accuracy " in lines[0]


# A whole run, as small as it gets, from a fresh interpreter.
_TINY = [
    "data.limit_test=64",
    "train.epochs=1",
    "train.steps_per_epoch=3",
    "runtime.steps_per_execution=1",
    "eval.attacks=[fgsm,pgd]",
    "eval.pgd_steps=1",
    "eval.pgd_restarts=1",
    "eval.eps_sweep=[]",
    "eval.sanity_examples=0",
    "model.width=4",
    "output.plots=false",
    "output.tensorboard=false",
    "output.export_saved_model=false",
]


def _run_args(out, *extra):
    args = [sys.executable, "-m", "advtrain.cli", "run", "quickstart", "-o", str(out)]
    for item in _TINY:
        args += ["--set", item]
    return args + list(extra)


def _env():
    return {**os.environ, "ADVTRAIN_PROGRESS_INTERVAL": "0"}


@pytest.mark.slow
def test_cli_run_prints_plain_progress_lines_and_none_when_quiet(tmp_path):
    loud = subprocess.run(
        _run_args(tmp_path / "loud"), capture_output=True, text=True, env=_env()
    )
    assert loud.returncode == 0, loud.stderr[-2000:]
    assert "\r" not in loud.stdout
    assert "epoch 1/1  1/3 steps (33%)" in loud.stdout
    assert "evaluating (clean, fgsm, pgd)  1/1 batches (100%)  64 examples" in (
        loud.stdout
    )
    # The global form, `advtrain --quiet run ...`; `run --quiet` is the same.
    args = _run_args(tmp_path / "quiet")
    quiet = subprocess.run(
        args[:3] + ["--quiet"] + args[3:],
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert "steps (" not in quiet.stdout and "batches (" not in quiet.stdout
    assert "epoch 1/1  accuracy" in quiet.stdout  # the epoch line stays


@pytest.mark.slow
def test_cli_run_on_a_terminal_redraws_a_bar(tmp_path):
    pty = pytest.importorskip("pty")
    output = bytearray()

    def read(fd):
        data = os.read(fd, 4096)
        output.extend(data)
        return data

    argv = _run_args(tmp_path / "tty")
    env = _env()
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        status = pty.spawn(argv, read)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    text = output.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text[-2000:]
    assert "\r\x1b[Kepoch 1/1  [" in text
    assert "] 3/3 steps (100%)" in text


def test_sanity_checks_show_progress_per_attack(capsys):
    import tensorflow as tf

    from advtrain.evaluation.sanity import run_sanity_checks

    x = np.random.default_rng(0).random((6, 8, 8, 1)).astype("float32")
    batches = tf.data.Dataset.from_tensor_slices((x, np.arange(6) % 10)).batch(3)
    run_sanity_checks(
        dense_classifier(), batches, default_eps=0.1, pgd_steps=1, batch_size=3
    )
    lines = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("sanity checks")
    ]
    # 2 batches x 5 attacks (fgsm, pgd, pgd_2x_steps, pgd_more_restarts, large_eps)
    assert lines[0].startswith("sanity checks  1/10 attacks (10%)  fgsm"), lines
    assert lines[-1].startswith("sanity checks  10/10 attacks (100%)"), lines
