"""The adversarial examples an evaluation found (`return_examples=True`),
and their grid (clean, adversarial, perturbation) as a PNG or in TensorBoard.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from advtrain.utils.io import atomic_path

# A run's grid: this many images, from a seeded subset of this many.
GRID_SIZE = 8
GRID_CANDIDATES = 256

FIELDS = ("x", "y", "x_adv", "attack", "predicted", "robust", "index")

CLEAN = "clean"


@dataclasses.dataclass
class AdversarialExamples:
    """Worst-case adversarial inputs with per-example verdicts, in
    evaluation order: `x_adv` is the point of the first attack (in the
    order they run) that made the model wrong, which `attack` names; an
    example no attack broke (`robust`) holds the last attack's point and
    `attack` ""; one wrong unattacked holds `x` and `attack` "clean".

    Attributes:
        predicted: the model's label on `x_adv`.
        index: each example's position among those evaluated.

    Example:

    ```python
    result = advtrain.evaluate(model, (x, y), eps=0.1, return_examples=True)
    found = result["adversarial_examples"]
    broken = found.x_adv[~found.robust]
    found.save("adversarial_examples.npz")
    ```
    """

    x: np.ndarray
    y: np.ndarray
    x_adv: np.ndarray
    attack: np.ndarray
    predicted: np.ndarray
    robust: np.ndarray
    index: np.ndarray
    eps: float = 0.0
    norm: str = "inf"

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, index: Any) -> AdversarialExamples:
        """The examples at `index` (positions in these arrays)."""
        arrays = {name: getattr(self, name)[index] for name in FIELDS}
        return AdversarialExamples(**arrays, eps=self.eps, norm=self.norm)

    def pick(self, count: int = 8, seed: int = 0) -> AdversarialExamples:
        """`count` examples drawn with `seed`, half broken by an attack and
        half robust where there are that many (then any others), in their
        evaluation order."""
        rng = np.random.default_rng(seed)
        clean_wrong = self.attack == CLEAN
        attacked = ~self.robust & ~clean_wrong
        groups = [rng.permutation(np.flatnonzero(g)) for g in (attacked, self.robust)]
        chosen = [*groups[0][: count // 2], *groups[1][: count // 2]]
        # Short of one kind: the rest of both, then the clean mistakes.
        rest = [*groups[0][count // 2 :], *groups[1][count // 2 :]]
        rest += list(rng.permutation(np.flatnonzero(clean_wrong)))
        chosen += rest[: count - len(chosen)]
        return self.subset(np.sort(np.asarray(chosen, dtype=np.int64)))

    def save(self, path: Union[str, Path]) -> Path:
        """Writes the arrays, `eps` and `norm` to an .npz file atomically;
        `np.load(path)` reads them back."""
        arrays = {name: getattr(self, name) for name in FIELDS}
        arrays["attack"] = arrays["attack"].astype(str)
        with atomic_path(Path(path)) as tmp:
            with open(tmp, "wb") as handle:
                np.savez(handle, **arrays, eps=self.eps, norm=self.norm)
        return Path(path)


class ExampleRecorder:
    """Builds `AdversarialExamples` during an evaluation: per batch
    `start`, `attacked`, `keep`; then `cascaded` per cascade batch. `limit`
    keeps a seeded random subset of that many examples."""

    def __init__(
        self,
        limit: Optional[int] = None,
        seed: int = 0,
        eps: float = 0.0,
        norm: Any = "inf",
    ):
        self.limit, self.eps, self.norm = limit, float(eps), str(norm)
        self.rng = np.random.default_rng(seed)
        self.parts: list[dict[str, np.ndarray]] = []
        self.batch: dict[str, np.ndarray] = {}
        self.seen = 0
        self.standing_seen = 0
        self.slot: Optional[np.ndarray] = None

    def start(self, x: np.ndarray, y: np.ndarray, clean: np.ndarray) -> None:
        """A new batch: its pixels, labels and clean predictions."""
        self.batch = {
            "x": x,
            "y": y,
            "x_adv": x.copy(),
            "attack": np.where(clean != y, CLEAN, "").astype(object),
            "predicted": clean.copy(),
        }

    def attacked(self, name: str, x_adv: np.ndarray, predicted: np.ndarray) -> None:
        """One attack's points, for the examples still right."""
        b = self.batch
        right = b["attack"] == ""
        b["x_adv"][right] = x_adv[right]
        b["predicted"][right] = predicted[right]
        b["attack"][right & (predicted != b["y"])] = name

    def keep(self) -> None:
        """Ends the batch: keeps it, or its share of the seeded subset."""
        b, self.batch = self.batch, {}
        count = len(b["y"])
        standing = b["attack"] == ""
        b["index"] = np.arange(self.seen, self.seen + count)
        # Each example's row in the cascade's arrays (the standing ones').
        b["row"] = np.where(standing, self.standing_seen + np.cumsum(standing) - 1, -1)
        b["key"] = self.rng.random(count)
        self.seen += count
        self.standing_seen += int(np.sum(standing))
        self.parts.append(b)
        if self.limit is not None and self.seen > self.limit:
            self.parts = [smallest_keys(concat(self.parts), self.limit)]

    def cascaded(self, name: str, rows, x_adv, predicted) -> None:
        """One cascade attack's points for `rows` of the cascade's arrays;
        the last attack to run on an example sets its point."""
        kept = self._merged()
        if self.slot is None:
            mine = np.flatnonzero(kept["row"] >= 0)
            self.slot = np.full(self.standing_seen, -1)
            self.slot[kept["row"][mine]] = mine
        slot = self.slot[rows]
        hit = slot >= 0
        slot, predicted = slot[hit], predicted[hit]
        kept["x_adv"][slot] = x_adv[hit]
        kept["predicted"][slot] = predicted
        kept["attack"][slot] = np.where(predicted != kept["y"][slot], name, "")

    def _merged(self) -> dict[str, np.ndarray]:
        self.parts = [concat(self.parts)]
        return self.parts[0]

    def result(self) -> AdversarialExamples:
        """The examples kept, in evaluation order."""
        kept = self._merged()
        attack = kept["attack"].astype(str)
        arrays = {k: kept[k] for k in FIELDS if k not in ("attack", "robust")}
        return AdversarialExamples(
            **arrays, attack=attack, robust=attack == "", eps=self.eps, norm=self.norm
        )


def concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays of `parts` joined key by key."""
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def smallest_keys(arrays: dict[str, np.ndarray], count: int) -> dict[str, np.ndarray]:
    """The rows of `arrays` with the `count` smallest `arrays["key"]`, in
    their order: a seeded random subset when the keys are seeded draws."""
    if len(arrays["key"]) <= count:
        return arrays
    best = np.sort(np.argpartition(arrays["key"], count - 1)[:count])
    return {k: v[best] for k, v in arrays.items()}


def _floats(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if np.issubdtype(x.dtype, np.integer):
        return x.astype(np.float32) / 255.0
    return x.astype(np.float32)


def _image(x: np.ndarray) -> np.ndarray:
    if x.ndim == 3 and x.shape[-1] == 1:
        x = x[..., 0]
    return np.clip(x, 0.0, 1.0)


def _name(label: int, class_names: Optional[Sequence[str]]) -> str:
    names = class_names or ()
    if 0 <= label < len(names) and names[label] != str(label):
        return f"{label} ({names[label]})"
    return str(label)


def _titles(examples, i, class_names, scale) -> tuple[str, str, str]:
    predicted = _name(int(examples.predicted[i]), class_names)
    attack = examples.attack[i]
    verdict = f"{attack}: predicted {predicted}" if attack else f"robust: {predicted}"
    if attack == CLEAN:
        verdict = f"wrong unattacked: {predicted}"
    return (
        f"true {_name(int(examples.y[i]), class_names)}",
        verdict,
        f"x_adv - x (scale ±{scale:.3g})",
    )


def examples_figure(
    examples: AdversarialExamples,
    class_names: Optional[Sequence[str]] = None,
    title: str = "",
):
    """A figure, a row per example: clean, adversarial, and `x_adv - x`
    mapped from [-eps, eps] (L2: the largest change) to [0, 1]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(len(examples), 1)
    fig, axes = plt.subplots(
        rows, 3, figsize=(7.2, 2.2 * rows + 0.4), dpi=100, squeeze=False
    )
    for i in range(len(examples)):
        x, x_adv = _floats(examples.x[i]), _floats(examples.x_adv[i])
        delta = x_adv - x
        scale = float(examples.eps)
        if examples.norm != "inf":  # an L2 change spreads thin over pixels
            scale = float(np.max(np.abs(delta)))
        scale = max(scale, 1e-12)
        images = (x, x_adv, np.clip(delta / scale, -1.0, 1.0) * 0.5 + 0.5)
        titles = _titles(examples, i, class_names, scale)
        for ax, image, text in zip(axes[i], images, titles, strict=True):
            image = _image(image)
            ax.imshow(image, cmap="gray" if image.ndim == 2 else None, vmin=0, vmax=1)
            ax.set_title(text, fontsize=8)
            ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def plot_examples(
    examples: AdversarialExamples,
    path: Union[str, Path],
    class_names: Optional[Sequence[str]] = None,
    title: str = "",
) -> Path:
    """Writes `examples_figure` as a PNG, atomically."""
    import matplotlib.pyplot as plt

    fig = examples_figure(examples, class_names, title)
    with atomic_path(Path(path)) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return Path(path)


def log_examples(
    examples: AdversarialExamples,
    logdir: Union[str, Path],
    step: int,
    class_names: Optional[Sequence[str]] = None,
    name: str = "adversarial_examples",
) -> None:
    """Writes `examples_figure` to TensorBoard in `logdir` at `step`."""
    import matplotlib.pyplot as plt
    import tensorflow as tf

    fig = examples_figure(examples, class_names)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    image = tf.io.decode_png(buffer.getvalue(), channels=4)[None]
    writer = tf.summary.create_file_writer(str(logdir))
    with writer.as_default():
        tf.summary.image(name, image, step=step)
    writer.close()
