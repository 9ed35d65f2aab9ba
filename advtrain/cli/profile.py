"""`advtrain profile`: is a recipe input-bound or compute-bound?

The input pipeline alone, the step alone (one cached batch repeated) and
both, each the median of a few rounds after a warm-up; the report says
which part sets the pace, by how much, and what to change.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
from typing import Optional

from advtrain.utils.progress import Echo

_CACHED = "  (one cached batch, repeated)"


@dataclasses.dataclass
class ProfileReport:
    """Seconds per global batch for each part, and the run's settings."""

    global_batch: int
    replicas: int
    steps_per_execution: int
    timed_steps: int
    input_seconds: float
    step_seconds: float
    together_seconds: float
    device_kind: str
    precision: str
    jit_compile: bool
    cache: str
    augment: bool
    attack: str = "none"
    attack_steps: int = 0
    reuse_gradient: bool = False
    cpu_bf16: bool = False

    @property
    def bound(self) -> str:
        """ "input" or "compute": the part that sets the pace."""
        return "input" if self.input_seconds > self.step_seconds else "compute"

    @property
    def ratio(self) -> float:
        """How many times slower the pacing part is than the other."""
        fast = min(self.input_seconds, self.step_seconds)
        return max(self.input_seconds, self.step_seconds) / max(fast, 1e-12)

    def lines(self) -> list[str]:
        """The report, one line each."""
        ms = 1000.0
        out = [
            f"profile: global batch {self.global_batch} = {self.replicas} "
            f"replica(s) x {self.global_batch // self.replicas}, "
            f"{self.steps_per_execution} step(s) per host call, "
            f"{self.timed_steps} timed steps per measurement "
            f"({self.device_kind}, {self.precision}, XLA "
            f"{'on' if self.jit_compile else 'off'})"
        ]
        for label, seconds, unit, note in (
            ("input pipeline alone", self.input_seconds, "ms/batch", ""),
            ("train step alone", self.step_seconds, "ms/step", _CACHED),
            ("both, as `run` trains", self.together_seconds, "ms/step", ""),
        ):
            rate = f"{self.global_batch / max(seconds, 1e-12):,.0f} examples/s"
            out.append(f"  {label:<22} {seconds * ms:9.2f} {unit:<8} {rate:>20}{note}")
        slower = max(self.input_seconds, self.step_seconds)
        if self.bound == "input":
            idle = 1.0 - self.step_seconds / self.input_seconds
            out.append(
                f"verdict: input-bound by {self.ratio:.1f}x: the pipeline "
                f"needs {self.input_seconds * ms:.2f} ms per batch, the step "
                f"{self.step_seconds * ms:.2f} ms; the model waits "
                f"~{100 * idle:.0f}% of the time."
            )
        else:
            out.append(
                f"verdict: compute-bound by {self.ratio:.1f}x: the step takes "
                f"{self.step_seconds * ms:.2f} ms, the pipeline needs "
                f"{self.input_seconds * ms:.2f} ms per batch; faster input "
                "would not speed this run up."
            )
        overlap = self.together_seconds / max(slower, 1e-12)
        if overlap > 1.25:
            cpu = self.device_kind == "cpu"
            out.append(
                f"note: together {overlap:.2f}x the slower part alone: input "
                "and step do not overlap fully"
                f"{' (on a CPU they share the same cores)' if cpu else ''}."
            )
        out.extend(f"to change: {tip}" for tip in self.advice())
        return out

    def advice(self) -> list[str]:
        """What to change, most effective first."""
        tips = []
        if self.bound == "input":
            if self.cache == "none":
                tips.append(
                    "data.cache: memory (or a file path prefix when it does "
                    "not fit): every epoch decodes the source again."
                )
            if self.augment:
                tips.append(
                    "augmentation runs per example on the host CPU; lighter "
                    "data.augment settings or more CPU cores for tf.data."
                )
            tips.append(
                f"a larger train.batch_size (now {self.global_batch}) spreads "
                "tf.data's per-batch overhead; pair it with train.scale_lr."
            )
            tips.append(
                "data.deterministic: false lets parallel map stages run out "
                "of order (faster, still seeded)."
            )
        else:
            if self.steps_per_execution == 1 and self.step_seconds < 0.01:
                tips.append(
                    f"steps of {self.step_seconds * 1000:.1f} ms are "
                    "dominated by the host round trip: "
                    "runtime.steps_per_execution: auto (or 8-32)."
                )
            if self.attack in ("fgsm", "fgsm_rs") and not self.reuse_gradient:
                tips.append(
                    "attack.reuse_gradient: true: 2 forward + 2 backward passes per "
                    "step instead of 3 + 3 (scripts/bench_step, same model: "
                    "0.47-0.50 vs 0.37-0.41 of a clean step on CPU); see "
                    "AdversarialModel(reuse_gradient=) for its trade-off."
                )
            elif self.attack == "pgd":
                tips.append(
                    f"fewer attack.steps (now {self.attack_steps}): each "
                    "costs about one forward and one input backward pass."
                )
            if (
                self.device_kind == "cpu"
                and self.precision == "float32"
                and self.cpu_bf16
            ):
                tips.append(
                    "runtime.precision: mixed_bfloat16: this CPU computes "
                    "bfloat16 natively (scripts/bench_step on a 2-core "
                    "AVX512-BF16 CPU: 1.15x the float32 clean step, 1.3-1.4x "
                    "the gradient-reusing FGSM step, with BatchNorm fused)."
                )
            if self.device_kind in ("gpu", "tpu"):
                if self.precision == "float32":
                    tips.append(
                        "runtime.precision: mixed_float16 (GPU) or "
                        "mixed_bfloat16 (TPU, recent GPUs)."
                    )
                if not self.jit_compile:
                    tips.append("runtime.jit_compile: true (XLA); measure it.")
            tips.append(
                f"a larger train.batch_size (now {self.global_batch}) uses "
                "the device better per example; pair it with train.scale_lr."
            )
        return tips


def cpu_has_bfloat16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether /proc/cpuinfo lists AVX512-BF16 or AMX-BF16."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return bool(set(flags.split(":", 1)[-1].split()) & {"avx512_bf16", "amx_bf16"})


def _time_fit(model, dataset, steps: int, rounds: int) -> float:
    # Median seconds per step over `rounds` epochs, after a warm-up epoch.
    import keras

    starts, seconds = [], []
    timer = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda *_: starts.append(time.perf_counter()),
        on_epoch_end=lambda *_: seconds.append(time.perf_counter() - starts[-1]),
    )
    model.fit(
        dataset,
        epochs=rounds + 1,
        steps_per_epoch=steps,
        verbose=0,
        callbacks=[timer],
        shuffle=False,
    )
    return statistics.median(seconds[1:]) / steps


def _repeated(batch):
    # One batch over and over, so that the step is timed without input: in
    # tf.data where TensorFlow is installed (no per-step Python), else a
    # Python iterator, which Keras's JAX trainer reads as fast.
    from advtrain import backend

    if not backend.HAS_TENSORFLOW:
        return itertools.repeat(batch)
    tf = backend.tensorflow_or_none()
    return tf.data.Dataset.from_tensors(batch).repeat()


def _time_input(dataset, steps: int, rounds: int) -> float:
    iterator = iter(dataset)
    times = []
    for _ in range(rounds + 1):
        start = time.perf_counter()
        for _ in range(steps):
            next(iterator)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) / steps


def profile(
    recipe,
    *,
    steps: Optional[int] = None,
    rounds: int = 3,
    echo: Echo = print,
) -> ProfileReport:
    """Times input, step and both for `recipe`; echoes and returns a report.

    Args:
        steps: steps per timed round (rounded up to whole host calls;
            default >= 20).
        rounds: timed rounds per measurement, after one warm-up.
    """
    import keras

    from advtrain.data import cache_mode, has_augmentation
    from advtrain.recipe.build import recipe_runtime, recipe_splits
    from advtrain.recipe.run import recipe_setup
    from advtrain.train.fitting import compile_setup

    keras.utils.set_random_seed(recipe.train.seed)
    runtime = recipe_runtime(recipe)
    splits = recipe_splits(recipe)
    # The run's setup and compile (runtime and plan printed), as `advtrain
    # run` makes them.
    setup = recipe_setup(recipe, splits, runtime, echo)
    plan, model = setup.plan, setup.model
    spe = plan.steps_per_execution
    steps = spe * max(1, -(-(steps or 20) // spe))  # a multiple of spe
    stream = setup.stream(0)
    input_seconds = _time_input(stream, steps, rounds)
    compile_setup(
        setup, metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    )
    cached = _repeated(next(iter(stream)))
    attack = recipe.attack
    report = ProfileReport(
        global_batch=plan.global_batch,
        replicas=plan.replicas,
        steps_per_execution=spe,
        timed_steps=steps,
        input_seconds=input_seconds,
        step_seconds=_time_fit(model, cached, steps, rounds),
        together_seconds=_time_fit(model, stream, steps, rounds),
        device_kind=runtime.device_kind,
        precision=runtime.precision,
        jit_compile=runtime.jit_compile,
        cache=cache_mode(recipe.data.cache, recipe.data.source),
        augment=has_augmentation(recipe.data.augment.model_dump()),
        attack=attack.method
        + (" (cleverhans)" if attack.backend == "cleverhans" else ""),
        attack_steps=attack.steps or 10,
        reuse_gradient=bool(getattr(model, "reuse_gradient_step", False)),
        cpu_bf16=cpu_has_bfloat16(),
    )
    for line in report.lines():
        echo(line)
    return report
