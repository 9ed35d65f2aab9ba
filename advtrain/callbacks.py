"""Training callbacks: progress lines and atomic, rotating checkpoints."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable, Optional

import keras

from advtrain.io import atomic_path


class ProgressLine(keras.callbacks.Callback):
    """One line per epoch: metrics, seconds and samples per second."""

    def __init__(self, echo: Callable[[str], None], epochs: int, samples_per_epoch: int):
        super().__init__()
        self.echo = echo
        self.epochs = epochs
        self.samples_per_epoch = samples_per_epoch
        self.epoch_seconds: list[float] = []
        self._start = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._start
        self.epoch_seconds.append(seconds)
        shown = "  ".join(
            f"{k} {v:.4f}" for k, v in (logs or {}).items() if k != "learning_rate"
        )
        rate = self.samples_per_epoch / max(seconds, 1e-9)
        self.echo(
            f"epoch {epoch + 1}/{self.epochs}  {shown}  "
            f"({seconds:.1f} s, {rate:.0f} samples/s)"
        )


class AtomicCheckpoint(keras.callbacks.Callback):
    """Saves the whole model (weights and optimizer state) every N epochs.

    Each checkpoint is written to a temporary name and renamed, so a crash
    mid-write leaves the previous checkpoints intact; the newest `keep`
    are kept.
    """

    PATTERN = re.compile(r"^epoch-(\d+)\.keras$")

    def __init__(self, directory: Path, every_epochs: int = 1, keep: int = 3):
        super().__init__()
        self.directory = Path(directory)
        self.every_epochs = every_epochs
        self.keep = keep

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every_epochs:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"epoch-{epoch + 1:04d}.keras"
        with atomic_path(path) as tmp:
            self.model.save(tmp)
        for old in self.checkpoints(self.directory)[: -self.keep]:
            old.unlink()

    @classmethod
    def checkpoints(cls, directory: Path) -> list[Path]:
        """Finished checkpoints, oldest first."""
        directory = Path(directory)
        if not directory.is_dir():
            return []
        found = [p for p in directory.iterdir() if cls.PATTERN.match(p.name)]
        return sorted(found, key=lambda p: int(cls.PATTERN.match(p.name).group(1)))

    @classmethod
    def latest(cls, directory: Path) -> Optional[tuple[int, Path]]:
        found = cls.checkpoints(directory)
        if not found:
            return None
        last = found[-1]
        return int(cls.PATTERN.match(last.name).group(1)), last
