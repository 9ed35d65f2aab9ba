"""Imports TensorFlow once, without its C++ start-up log on stderr.

TensorFlow's native libraries log about five lines before absl's logging
starts (`TF_CPP_MIN_LOG_LEVEL` cannot hide them), more than the one line bad
input costs. The import runs with fd 2 captured and every other line is
written back; `TF_CPP_MIN_LOG_LEVEL=0` or `ADVTRAIN_DEBUG=1` shows all.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

# A native (glog/absl) log line: severity, date, time, thread, file:line].
_NATIVE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [^\]]*\] ?(.*)$")
# The second line of the CPU feature guard's message.
_CONTINUATION = "To enable the following instructions:"
_BANNER = "WARNING: All log messages before absl::InitializeLog() is called"
# Harmless errors of TensorFlow's CUDA plugins (each registers twice).
_KNOWN_ERRORS = re.compile(
    r"Unable to register cu(DNN|FFT|BLAS) factory|"
    r"computation placer already registered"
)
_NO_DRIVER = "Could not find cuda drivers on your machine"
_CUINIT = "failed call to cuInit"


def import_tensorflow() -> None:
    """Imports TensorFlow (once per process) without its start-up lines."""
    if "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    level = os.environ["TF_CPP_MIN_LOG_LEVEL"].strip()
    quiet = level != "0" and os.environ.get("ADVTRAIN_DEBUG") != "1"
    captured: list[str] = []
    try:
        with _captured_stderr(captured) if quiet else contextlib.nullcontext():
            import tensorflow as tf

            # Probing the devices now keeps the cuInit line inside the capture.
            tf.config.list_physical_devices()
    finally:
        min_level = int(level) if level in ("1", "2", "3") else 2
        sys.stderr.write("".join(filter_startup_lines(captured, min_level)))
        sys.stderr.flush()


def filter_startup_lines(lines: list[str], min_level: int = 2) -> list[str]:
    """The captured lines worth showing; see the module docstring."""
    no_driver = any(_NO_DRIVER in line for line in lines)
    kept, dropping = [], False
    for line in lines:
        match = _NATIVE.match(line)
        if match is None:
            if not (line.startswith(_BANNER) or (dropping and _CONTINUATION in line)):
                kept.append(line)
            continue
        severity, message = "IWEF".index(match.group(1)), match.group(2)
        dropping = (
            severity < min_level
            or (severity < 3 and _KNOWN_ERRORS.search(message) is not None)
            or (no_driver and _CUINIT in message)
        )
        if not dropping:
            kept.append(line)
    return kept


@contextlib.contextmanager
def _captured_stderr(lines: list[str]) -> Iterator[None]:
    try:
        tmp, saved = tempfile.TemporaryFile(), os.dup(2)
    except OSError:  # no temporary file or no usable fd 2: nothing captured
        yield
        return
    with tmp:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", errors="replace")
            lines.extend(text.splitlines(keepends=True))
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n"
