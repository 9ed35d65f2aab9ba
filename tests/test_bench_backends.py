"""scripts/bench_backends' table: per row the median over rounds, the
TensorFlow-over-JAX time ratio, and a backend without `advtrain.evaluate`
shown as such. (The benchmark itself runs both backends for minutes; its
table is in docs/performance.md.)"""

import argparse
import importlib.util
from importlib.machinery import SourceFileLoader
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    loader = SourceFileLoader(
        "bench_backends", str(ROOT / "scripts" / "bench_backends")
    )
    module = importlib.util.module_from_spec(
        importlib.util.spec_from_loader(loader.name, loader)
    )
    loader.exec_module(module)
    return module


def test_table_has_medians_ratios_and_the_tensorflow_only_row():
    def result(step, evaluate, robust=0.5):
        rows = {"default step": step, "evaluate AutoAttack": evaluate,
                "Square, attacks API": 2 * step}  # fmt: skip
        return {"rows": rows, "robust": robust}

    results = {
        "tensorflow": [result(10.0, 4.0), result(30.0, 6.0), result(20.0, 5.0)],
        "jax": [result(5.0, None, 0.25)],
    }
    args = argparse.Namespace(images=20, quick=True)
    lines = _bench().table(results, args).splitlines()
    assert lines[2] == "| default step | ms/step | 20.0 | 5.0 | 4.00 |"
    assert lines[3] == (
        "| evaluate AutoAttack | images/s | 5.0 | TensorFlow-only for now | n/a |"
    )
    # Throughput: the ratio is still TensorFlow's time over JAX's.
    assert lines[4] == "| Square, attacks API | images/s | 40.0 | 10.0 | 0.25 |"
    assert "TensorFlow 50.0%, JAX 25.0%" in lines[-1]
