"""The split-execution gain beside the NPU backward efficiency it rests on (examples.py)."""

from __future__ import annotations

import math

from pipeopt.problems.resource.examples import (
    SENSITIVITY_EFFICIENCIES,
    npu_efficiency,
    split_gain,
    split_gain_report,
    split_gain_sensitivity,
)
from pipeopt.zoo import KINDS


def test_the_assumed_efficiency_is_the_zoos():
    assert npu_efficiency() == (KINDS["npu"].forward_efficiency, KINDS["npu"].backward_efficiency)
    assert SENSITIVITY_EFFICIENCIES[0] == npu_efficiency()[1]


def test_gain_falls_as_the_npu_backward_pass_improves():
    rows = split_gain_sensitivity(models=("alexnet",))
    gains = [r["gain"] for r in rows]
    assert [r["npu_backward"] for r in rows] == list(SENSITIVITY_EFFICIENCIES)
    assert all(g >= 1 - 1e-9 for g in gains)  # the split is never worse than no split on one worker
    assert gains == sorted(gains, reverse=True)
    assert gains[0] > 1.2 and math.isclose(gains[-1], 1.0, abs_tol=0.01)  # no backward penalty: ~no gain
    default = split_gain("alexnet")
    assert default["npu_backward"] == npu_efficiency()[1] and math.isclose(default["gain"], gains[0])
    assert math.isclose(default["gain"], default["sequential"] / default["split"])


def test_report_prints_the_assumption_beside_the_gain():
    text = split_gain_report(models=("alexnet",))
    fwd, bwd = npu_efficiency()
    assert f"backward {bwd:g}" in text and "split-execution gain" in text
    assert all(f"at {e:g}" in text for e in SENSITIVITY_EFFICIENCIES)
