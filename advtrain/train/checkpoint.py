"""Crash-safe checkpoints, and resuming from them.

Beyond BackupAndRestore (weights only, once, at an epoch), ModelCheckpoint
and tf.train.CheckpointManager (TensorFlow's alone): optimizer and metric
state for a bitwise mid-epoch resume, write-then-rename, corrupt ones
skipped with a warning, the best kept, in NumPy files (no pickle).

```
checkpoints/
  step-00000013/     inside an epoch (checkpoint_every_steps)
    variables.npz    model (SeedGenerator state included), optimizer and
                     metric variables; more groups (`CheckpointStore.extras`:
                     a catastrophic-overfitting guard's record, `co_guard/`)
    state.json       epoch, step, phase, monitored value, sha256 of the npz
  epoch-0002/        at the end of epoch 2 (same contents)
  best.json          which checkpoint holds the best monitored value
```

A checkpoint is written under a `.tmp-` name, fsynced, then renamed, so
one with its final name is complete; pruning renames before deleting. On
resume `.tmp-` entries are removed and a checkpoint that does not parse or
match its hash is skipped, falling back to the one before it.
"""

from __future__ import annotations

import atexit
import csv
import dataclasses
import hashlib
import io
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import numpy as np

from advtrain.utils.io import atomic_write_json, atomic_write_text
from advtrain.utils.progress import Echo

FORMAT = 1
GROUPS = ("model", "optimizer", "metrics")
TMP_PREFIX = ".tmp-"
_NAME = re.compile(r"^(epoch|step)-(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint that exists but cannot be used for this model."""


class NonFiniteStateError(RuntimeError):
    """Refusal to checkpoint weights that hold NaN or Inf."""


def writable_dir(out: Path, is_chief: bool) -> Path:
    """Where this worker writes: the run folder for the chief, a private
    temporary folder (removed at exit) for the others, which run the same
    saving code (tf.distribute's convention)."""
    if is_chief:
        return out
    scratch = Path(tempfile.mkdtemp(prefix="advtrain-worker-"))
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    return scratch


def truncate_history(path: Path, epochs: int) -> None:
    """Keeps the header and the whole rows of the first `epochs` epochs of
    a CSVLogger file (a killed run may have logged an epoch it had not
    checkpointed, or half a row), byte for byte: Keras ends its rows with
    CRLF, and a resumed run's file must equal an uninterrupted one's."""
    if not path.is_file():
        return
    with open(path, newline="", encoding="utf-8") as handle:
        lines = handle.readlines()
    if not lines:
        return
    width = len(next(csv.reader(lines[:1])))
    kept = lines[:1]
    for line in lines[1:]:
        row = next(csv.reader([line]), [])
        try:
            epoch = int(row[0])
        except (IndexError, ValueError):
            continue
        if epoch < epochs and len(row) == width and line.endswith("\n"):
            kept.append(line)
    atomic_write_text(path, "".join(kept))


def read_history(path: Path) -> dict[str, list[float]]:
    """A CSVLogger file as `History.history` (without the epoch column)."""
    if not path.is_file():
        return {}
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    history: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            if key == "epoch" or key is None:
                continue
            try:
                history.setdefault(key, []).append(float(value))
            except (TypeError, ValueError):
                pass
    return history


def _groups(model) -> dict[str, list]:
    optimizer = getattr(model, "optimizer", None)
    built = optimizer is not None and getattr(optimizer, "built", False)
    return {
        "model": list(model.variables),
        "optimizer": list(optimizer.variables) if built else [],
        "metrics": list(getattr(model, "metrics_variables", [])),
    }


def capture_variables(model) -> tuple[dict[str, np.ndarray], dict[str, list]]:
    """The arrays to save, and per group the [path, shape, dtype] of each.
    Raises `NonFiniteStateError` when a model variable holds NaN or Inf."""
    from advtrain.train.guards import first_nonfinite_variable

    groups = _groups(model)
    bad = first_nonfinite_variable(groups["model"])
    if bad is not None:
        raise NonFiniteStateError(
            f"variable {bad} holds NaN or Inf; not checkpointing it"
        )
    arrays: dict[str, np.ndarray] = {}
    spec: dict[str, list] = {}
    for group, variables in groups.items():
        spec[group] = []
        for i, variable in enumerate(variables):
            value = np.array(variable.numpy())
            spec[group].append(
                [str(variable.path), list(value.shape), str(value.dtype)]
            )
            if value.dtype.kind not in "biuf":
                # bfloat16 and friends: stored as raw bytes, no pickle.
                value = np.frombuffer(value.tobytes(), dtype=np.uint8)
            arrays[f"{group}/{i:05d}"] = value
    return arrays, spec


@dataclasses.dataclass
class Checkpoint:
    """A finished checkpoint folder and its parsed `state.json`: `epoch`
    (0-based) continues after `step` of its batches."""

    path: Path
    state: dict[str, Any]

    epoch = property(lambda self: int(self.state["epoch"]))
    step = property(lambda self: int(self.state["step"]))
    global_step = property(lambda self: int(self.state["global_step"]))
    phase = property(lambda self: self.state["phase"])

    def arrays(self) -> dict[str, np.ndarray]:
        """The saved arrays, after checking the file's hash."""
        data = (self.path / "variables.npz").read_bytes()
        if hashlib.sha256(data).hexdigest() != self.state.get("variables_sha256"):
            raise CheckpointError(
                f"{self.path}: variables.npz does not match its recorded hash"
            )
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}


def _sort_key(path: Path) -> tuple[int, int]:
    kind, number = _NAME.match(path.name).groups()
    if kind == "step":
        return int(number), 0
    # Ordered by global step, which an unreadable checkpoint may lack.
    state = _read_state(path)
    return (int(state["global_step"]) if state else 1 << 62), 1


def _read_state(path: Path) -> Optional[dict[str, Any]]:
    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return None
    return state


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot sync a folder
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _discard(path: Path) -> None:
    """Renames, then deletes: a half-deleted folder never keeps a real name."""
    doomed = path.with_name(f"{TMP_PREFIX}del-{os.getpid()}-{path.name}")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


class CheckpointStore:
    """Writes, lists, rotates and ranks the checkpoints of one run.

    Args:
        directory: the run's `checkpoints/` folder.
        keep: newest checkpoints kept; the best one is kept as well.
        monitor: metric that ranks epoch checkpoints (None: no best).
        mode: "max" or "min".

    Example:

    ```python
    store = CheckpointStore(run_dir / "checkpoints", keep=3)
    store.save(model, kind="epoch", epoch=2, step=0, global_step=80, phase="train")
    point = find_resume_point(run_dir / "checkpoints")
    restore_variables(model, point, "model")
    ```
    """

    def __init__(
        self,
        directory: Path,
        keep: int = 3,
        monitor: Optional[str] = None,
        mode: str = "max",
    ):
        if keep < 1:
            raise ValueError(f"keep must be >= 1. Received: keep={keep}")
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be max or min. Received: mode={mode}")
        self.directory = Path(directory)
        self.keep = keep
        self.monitor = monitor
        self.mode = mode
        # More groups of each checkpoint, hashed with the variables: name ->
        # a function returning that group's arrays (`extra_group` reads it).
        self.extras: dict[str, Callable[[], dict[str, np.ndarray]]] = {}

    def paths(self) -> list[Path]:
        """Checkpoint folders with a final name, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [
            p for p in self.directory.iterdir() if p.is_dir() and _NAME.match(p.name)
        ]
        return sorted(found, key=_sort_key)

    def best(self) -> Optional[dict[str, Any]]:
        try:
            best = json.loads(
                (self.directory / "best.json").read_text(encoding="utf-8")
            )
        except (OSError, ValueError):
            return None
        return best if isinstance(best, dict) else None

    def latest(self) -> Optional[Path]:
        found = self.paths()
        return found[-1] if found else None

    def remove_temporaries(self) -> list[Path]:
        """Deletes what an interrupted write or prune left behind."""
        if not self.directory.is_dir():
            return []
        removed = [p for p in self.directory.iterdir() if p.name.startswith(TMP_PREFIX)]
        for path in removed:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        return removed

    def is_improvement(self, value: Optional[float]) -> bool:
        if self.monitor is None or value is None or not math.isfinite(value):
            return False
        best = self.best()
        if best is None or best.get("monitor") != self.monitor:
            return True
        if self.mode == "max":
            return value > float(best["value"])
        return value < float(best["value"])

    def save(
        self,
        model,
        *,
        kind: str,
        epoch: int,
        step: int,
        global_step: int,
        phase: str,
        logs: Optional[dict[str, Any]] = None,
        prune: bool = True,
        steps_per_epoch: Optional[int] = None,
    ) -> Path:
        """Writes one checkpoint atomically and returns its folder.

        Args:
            model: the training model (compiled; its optimizer built).
            kind: "epoch" (after `epoch` epochs) or "step" (inside one).
            epoch, step: a resumed run continues with `epoch` (0-based)
                after `step` of its batches.
            global_step: batches trained since the start of the run.
            phase: the fine-tuning phase (advtrain.models.freezing).
            logs: metrics to record in state.json.
            prune: remove checkpoints beyond `keep` (and not the best).
            steps_per_epoch: recorded, for a resume to compare.
        """
        if kind not in ("epoch", "step"):
            raise ValueError(f"kind must be epoch or step. Received: {kind}")
        name = f"epoch-{epoch:04d}" if kind == "epoch" else f"step-{global_step:08d}"
        arrays, spec = capture_variables(model)
        for group, values in self.extras.items():
            arrays.update({f"{group}/{k}": v for k, v in values().items()})
        numbers = (int, float, np.floating, np.integer)
        logs = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, numbers)}
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / name
        tmp = self.directory / f"{TMP_PREFIX}{os.getpid()}-{name}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        try:
            buffer = io.BytesIO()
            np.savez(buffer, **arrays)
            data = buffer.getvalue()
            _write_synced(tmp / "variables.npz", data)
            state = {
                "format": FORMAT,
                "kind": kind,
                "epoch": epoch,
                "step": step,
                "global_step": global_step,
                "steps_per_epoch": steps_per_epoch,
                "phase": phase,
                "logs": logs,
                "variables": spec,
                "variables_sha256": hashlib.sha256(data).hexdigest(),
            }
            _write_synced(tmp / "state.json", json.dumps(state, indent=1).encode())
            _fsync_dir(tmp)
            if final.exists():
                _discard(final)
            os.replace(tmp, final)
            _fsync_dir(self.directory)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        if prune:
            self.prune()
        return final

    def record_best(self, path: Path, value: float, epoch: int) -> None:
        best = {"checkpoint": path.name, "monitor": self.monitor, "mode": self.mode}
        best.update(value=float(value), epoch=epoch)
        atomic_write_json(self.directory / "best.json", best)

    def prune(self) -> None:
        """Keeps the newest `keep` checkpoints and the best one."""
        best = self.best() or {}
        found = self.paths()
        for path in found[: max(0, len(found) - self.keep)]:
            if path.name != best.get("checkpoint"):
                _discard(path)


def load_checkpoint(path: Path) -> Checkpoint:
    """Parses and checks one checkpoint folder (else `CheckpointError`)."""
    state = _read_state(path)
    if state is None:
        raise CheckpointError(f"{path}: state.json missing or unreadable")
    checkpoint = Checkpoint(path, state)
    try:
        checkpoint.arrays()
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any decoding failure
        raise CheckpointError(
            f"{path}: variables.npz unreadable ({type(exc).__name__})"
        ) from None
    return checkpoint


def find_resume_point(directory: Path, echo: Echo = print) -> Optional[Checkpoint]:
    """The newest checkpoint that loads, warning about those that do not."""
    for path in reversed(CheckpointStore(directory).paths()):
        try:
            return load_checkpoint(path)
        except CheckpointError as exc:
            echo(f"warning: skipping checkpoint: {exc}; trying the one before")
    return None


def extra_group(checkpoint: Checkpoint, group: str) -> dict[str, np.ndarray]:
    """The arrays of one of `CheckpointStore.extras`' groups in a
    checkpoint (hash checked), by their own names; empty when absent."""
    prefix = f"{group}/"
    arrays = checkpoint.arrays()
    return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}


def restore_variables(model, checkpoint: Checkpoint, group: str) -> int:
    """Assigns one group ("model", "optimizer" or "metrics") of a
    checkpoint to `model`; returns how many variables were set. Raises
    `CheckpointError` when the model's variables do not match the saved."""
    if group not in GROUPS:
        raise ValueError(f"group must be one of {GROUPS}. Received: {group}")
    variables = _groups(model)[group]
    spec = checkpoint.state["variables"][group]
    if len(variables) != len(spec):
        raise CheckpointError(
            f"{checkpoint.path}: {len(spec)} saved {group} variables, the "
            f"model has {len(variables)}; it was written by a different "
            "model or version of the code"
        )
    for variable, (path, shape, _) in zip(variables, spec, strict=True):
        if list(variable.shape) != list(shape):
            raise CheckpointError(
                f"{checkpoint.path}: {group} variable {path} has shape "
                f"{shape}, the model's {variable.path} has "
                f"{list(variable.shape)}"
            )
    arrays = checkpoint.arrays()
    for i, (variable, (_, shape, dtype)) in enumerate(zip(variables, spec)):  # noqa: B905
        value = arrays[f"{group}/{i:05d}"]
        if value.dtype == np.uint8 and dtype != "uint8":
            value = np.frombuffer(value.tobytes(), dtype=np.dtype(dtype))
            value = value.reshape(shape)
        variable.assign(value)
    return len(variables)
