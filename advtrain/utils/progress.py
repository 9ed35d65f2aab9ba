"""Live progress; more than `keras.utils.Progbar`, which writes ANSI codes
and a line per update into logs: off a terminal, plain lines at most one
per `PLAIN_INTERVAL_S`, and one `--quiet` for training and evaluation.

Example:

```python
bar = Progress("evaluating", total=40, unit="batches")
for i, batch in enumerate(batches):
    ...
    bar.update(i + 1, f"{(i + 1) * 256} examples")
bar.close()
```
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from typing import Optional, TextIO

import keras

# Where status lines go: `print`, `typer.echo`, a list's append.
Echo = Callable[[str], None]

# Plain (non-TTY) mode: seconds between two lines of one task.
PLAIN_INTERVAL_S = 10.0
# TTY mode: seconds between two redraws (the last one always draws).
REDRAW_INTERVAL_S = 0.1
BAR_WIDTH = 20

_settings = {"quiet": False}


def set_quiet(quiet: bool) -> None:
    """Silences (or restores) every progress bar and progress line."""
    _settings["quiet"] = bool(quiet)


def _interval_from_env() -> float:
    # ADVTRAIN_PROGRESS_INTERVAL: seconds between plain lines (0: all).
    try:
        return max(0.0, float(os.environ["ADVTRAIN_PROGRESS_INTERVAL"]))
    except (KeyError, ValueError):
        return PLAIN_INTERVAL_S


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Progress:
    """Progress of one task of `total` units (None: unknown).

    Args:
        label: what runs, e.g. "epoch 3/10".
        interactive: redraw one line in place (default: `stream` is a TTY).
        keep: at `close`, leave the last state (terminal) or write it
            (plain); else the live line is cleared.
    """

    def __init__(
        self,
        label: str,
        total: Optional[int],
        *,
        unit: str = "steps",
        stream: Optional[TextIO] = None,
        interactive: Optional[bool] = None,
        keep: bool = False,
    ):
        self.label = label
        self.total = total if total and total > 0 else None
        self.unit = unit
        self.stream = stream if stream is not None else sys.stdout
        if interactive is None:
            isatty = getattr(self.stream, "isatty", None)
            interactive = bool(isatty and isatty())
        self.interactive = interactive
        self.keep = keep
        self.enabled = not _settings["quiet"]
        self.interval = REDRAW_INTERVAL_S if interactive else _interval_from_env()
        self.start = time.perf_counter()
        # A terminal shows the first update at once; plain lines wait.
        self._last_write = self.start - (self.interval if interactive else 0.0)
        self._done = 0
        self._extra = ""
        self._drawn = False
        self._written = None  # plain mode: the (done, extra) last written

    def update(self, done: int, extra: str = "") -> None:
        """Records `done` units finished; `extra` is shown after them."""
        self._done, self._extra = done, extra
        if not self.enabled:
            return
        now = time.perf_counter()
        last = self.total is not None and done >= self.total
        if now - self._last_write < self.interval and not (last and self.interactive):
            return
        self._last_write = now
        self._write(self.line(now))

    def close(self) -> None:
        """Ends the task: clears the live line or writes the last state."""
        if not self.enabled:
            return
        if self.interactive:
            if self._drawn and not self.keep:
                self.stream.write("\r\x1b[K")
            elif self._drawn:
                self.stream.write("\n")
            self.stream.flush()
        elif self.keep and self._written != (self._done, self._extra):
            self._write(self.line(time.perf_counter()))
        self._drawn = False

    def line(self, now: float) -> str:
        """The state at `now` (`time.perf_counter()`) as one line of text."""
        elapsed = now - self.start
        done = self._done
        parts = [self.label]
        if self.total is not None:
            fraction = min(done / self.total, 1.0)
            count = f"{done}/{self.total} {self.unit} ({100 * fraction:.0f}%)"
            if self.interactive:
                filled = int(round(BAR_WIDTH * fraction))
                count = f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {count}"
            parts.append(count)
        else:
            parts.append(f"{done} {self.unit}")
        if self._extra:
            parts.append(self._extra)
        timing = f"{_duration(elapsed)} elapsed"
        if self.total is not None and 0 < done < self.total:
            timing += f", ~{_duration(elapsed * (self.total - done) / done)} left"
        parts.append(timing)
        return "  ".join(parts)

    def _write(self, text: str) -> None:
        if self.interactive:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            # A line longer than the terminal wraps and \r cannot redraw it.
            self.stream.write("\r\x1b[K" + text[:width])
            self._drawn = True
        else:
            self.stream.write(text + "\n")
            self._written = (self._done, self._extra)
        self.stream.flush()


# Training metrics shown on the live line, in this order, when logged.
_SHOWN = ("loss", "accuracy", "adv_accuracy")


class EpochProgress(keras.callbacks.Callback):
    """A live step bar for each training epoch, cleared at its end: put it
    before the callback that prints the epoch's line.

    Example:

    ```python
    model.fit(ds, epochs=10, callbacks=[EpochProgress(10), ProgressLine(...)])
    ```
    """

    def __init__(self, epochs: int):
        super().__init__()
        self.epochs = epochs
        self._bar: Optional[Progress] = None

    def on_epoch_begin(self, epoch, logs=None):
        self._bar = Progress(
            f"epoch {epoch + 1}/{self.epochs}", self.params.get("steps")
        )

    def on_train_batch_end(self, batch, logs=None):
        if self._bar is None:
            return
        logs = logs or {}
        shown = "  ".join(
            f"{name} {float(logs[name]):.4f}" for name in _SHOWN if name in logs
        )
        total = self._bar.total
        self._bar.update(min(batch + 1, total) if total else batch + 1, shown)

    def on_epoch_end(self, epoch, logs=None):
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def on_train_end(self, logs=None):
        self.on_epoch_end(0)  # an interrupted epoch leaves no half line
