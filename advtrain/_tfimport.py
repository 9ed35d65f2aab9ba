"""Imports TensorFlow once, without its C++ start-up log on stderr.

TensorFlow's native libraries log before absl's logging is initialised, so
`TF_CPP_MIN_LOG_LEVEL` does not hide those lines: every process prints
about five (the absl banner, oneDNN, "Could not find cuda drivers", the CPU
feature guard and its continuation line), and the first device probe adds
"failed call to cuInit" on machines without a CUDA driver. Bad input is
meant to cost one line on stderr, and these would outnumber it.

`import_tensorflow()` sets `TF_CPP_MIN_LOG_LEVEL=2` unless the user chose a
level, imports TensorFlow and probes its devices with file descriptor 2
redirected to a temporary file, then writes back every captured line except
those start-up lines: native log lines below the chosen level, the absl
banner, the known duplicate-registration errors of TensorFlow's CUDA
plugins, and the cuInit failure when TensorFlow already said there is no
driver. Anything else (a real error, a Python warning) still reaches
stderr. `TF_CPP_MIN_LOG_LEVEL=0` or `ADVTRAIN_DEBUG=1` shows everything.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

# A native (glog/absl) log line: severity letter, date, time (before absl
# is initialised, seconds since the epoch), thread id, file:line].
_NATIVE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [^\]]*\] ?(.*)$")
# The second line of the CPU feature guard's message.
_CONTINUATION = "To enable the following instructions:"
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
_BANNER = "WARNING: All log messages before absl::InitializeLog() is called"
# Errors TensorFlow's CUDA builds print at import on every machine (each
# plugin registers itself twice); harmless, and not about the user's run.
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
    if level == "0" or os.environ.get("ADVTRAIN_DEBUG") == "1":
        _import()
        return
    min_level = int(level) if level in ("1", "2", "3") else 2
    captured: list[str] = []
    try:
        with _captured_stderr(captured):
            _import()
    finally:
        kept = filter_startup_lines(captured, min_level)
        if kept:
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


def _import() -> None:
    import tensorflow as tf

    # Probing the devices now keeps the cuInit line inside the capture.
    tf.config.list_physical_devices()


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
        severity, message = _SEVERITY[match.group(1)], match.group(2)
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
    """Redirects file descriptor 2 to a temporary file and appends what was
    written to `lines` on exit. Without a usable fd 2 or temporary file (a
    closed stderr, a read-only system) nothing is redirected."""
    try:
        tmp = tempfile.TemporaryFile()
    except OSError:
        yield
        return
    with tmp:
        try:
            saved = os.dup(2)
        except OSError:
            yield
            return
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
