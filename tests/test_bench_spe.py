"""scripts/bench_spe's table: ms/epoch per runner and setting, each
runner's speed-up, advtrain over Keras, and the issue-46 verdicts. (The
benchmark itself times real epochs; its rows are in docs/performance.md.)"""

import importlib.util
from importlib.machinery import SourceFileLoader
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    loader = SourceFileLoader("bench_spe", str(ROOT / "scripts" / "bench_spe"))
    module = importlib.util.module_from_spec(
        importlib.util.spec_from_loader(loader.name, loader)
    )
    loader.exec_module(module)
    return module


def _epochs(keras_ms, advtrain_ms):
    return {
        (runner, spe): ms / 1000
        for runner, times in zip(
            ("Keras Model.fit", "advtrain.fit"), (keras_ms, advtrain_ms), strict=True
        )
        for spe, ms in zip((1, 25), times, strict=True)
    }


def test_the_table_before_issue_46s_fix_misses_both_goals():
    lines = _bench().report(_epochs((61.0, 28.0), (92.0, 74.0))).splitlines()
    assert lines[1].split() == ["Keras", "Model.fit", "61.0", "28.0", "2.18x"]
    assert lines[2].split() == ["advtrain.fit", "92.0", "74.0", "1.24x"]
    assert lines[3].split() == ["advtrain", "/", "Keras", "1.51x", "2.64x", "0.57"]
    assert "ratio 0.57 (goal >= 0.90: MISS)" in lines[4]
    assert "at most 2.64x (goal <= 1.20: MISS)" in lines[4]


def test_the_goals_are_met_within_10_percent_and_1_2x():
    verdict = _bench().report(_epochs((60.0, 30.0), (66.0, 35.5))).splitlines()[-1]
    assert "ratio 0.93 (goal >= 0.90: ok)" in verdict
    assert "at most 1.18x (goal <= 1.20: ok)" in verdict
