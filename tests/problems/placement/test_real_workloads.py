"""The placement DP on Tarnawski et al.'s real workloads equals the optimum their ``dp.exe``
proves (their ``throughput-dp/dp.cpp``, built with ``g++ -O3`` and run unmodified on each file;
the numbers below are its ``maxLoad`` output in ms, as its JSON prints them).

dp.exe is not run here (pipeopt never ships or builds their code); ``benchmarks/dag_space.py
--dp-exe PATH`` reruns the comparison where a user has built it. Inception-v3 (which dp.exe does
not solve) is left to the benchmark: it takes about a minute."""

from __future__ import annotations

from pathlib import Path

import pytest

import pipeopt
from pipeopt.io.dnn_partitioning import read_dnn_partitioning

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "dnn-partitioning" / "throughput-inputs"

DP_EXE = {  # dp.exe's maxLoad (ms) on each throughput workload it solves
    "LayerGraphs/bert24_inference": 17.78990625,
    "LayerGraphs/bert24_training": 41.7458125,
    "LayerGraphs/gnmt_inference": 32.910658203124996,
    "LayerGraphs/gnmt_training": 107.0044140625,
    "LayerGraphs/resnet50_inference": 33.774666015625,
    "LayerGraphs/resnet50_training": 78.63181250000001,
    "OperatorGraphs/bert_l-3_inference": 27.9185676799125,
    "OperatorGraphs/bert_l-3_training": 65.30314912208605,
    "OperatorGraphs/bert_l-6_inference": 29.57950580645155,
    "OperatorGraphs/bert_l-6_training": 72.86496632241122,
    "OperatorGraphs/bert_l-12_inference": 147.47798444934838,
    "OperatorGraphs/bert_L-12_training": 437.9976378578455,
    "OperatorGraphs/resnet50_inference": 124.34884977404485,
    "OperatorGraphs/resnet50_training": 255.19441645217384,
}


@pytest.mark.parametrize("name", sorted(DP_EXE))
def test_dp_equals_dp_exe(name):
    inst = read_dnn_partitioning(DATA / f"{name}.json")
    res = pipeopt.solve(inst, time_limit=None)  # no option: the problem dp.exe solves
    assert res.method == "dp" and res.space == "convex"
    assert str(res.status) == "optimal"
    assert res.objective * 1e3 == pytest.approx(DP_EXE[name], rel=1e-9)
    assert res.objective == pytest.approx(pipeopt.evaluate(inst, res.plan).objective, rel=1e-12)
    assert res.lower_bound == pytest.approx(res.objective, rel=1e-12)
    one = pipeopt.solve(inst, problem="placement", method="one_order", time_limit=None)
    assert one.space == "one-order"
    assert one.objective >= res.objective * (1 - 1e-12)
