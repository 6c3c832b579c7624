"""Issue 8, deliverable 3: on real profiles the certified optimum is the fastest plan when the
pipeline runs. For S in {2, 4} on AlexNet, VGG16, SqueezeNet and ResNet-18, the simulator
equals the optimised objective for the DP's plan, and a simulator-scored local search started
from the certified plan and from every baseline's plan never beats it
(``benchmarks/schedule_exact.py`` runs the same on every profile and S up to 16)."""

import importlib.util
from pathlib import Path

import pytest

from pipeopt import PartitionProblem, solve
from pipeopt.io import load

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("schedule_exact", ROOT / "benchmarks" / "schedule_exact.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.parametrize("name", bench.QUICK)
@pytest.mark.parametrize("S", [2, 4])
def test_no_simulated_search_beats_the_certified_plan(name, S):
    inst = load(bench.PROFILES / f"{name}.txt")
    res = solve(inst, problem="partition", method="dp", stages=S)
    problem = PartitionProblem(inst, S)
    certified = problem.starts_of(res.plan)
    sim = bench.simulated(inst, problem, certified)
    assert sim == pytest.approx(res.objective, rel=1e-9)
    starts = {"dp": certified, **bench.heuristic_starts(inst, S)}
    assert len(starts) >= 4  # the baselines ran
    for label, s in starts.items():
        _, value = bench.local_search(inst, problem, s)
        assert value >= sim * (1 - bench.NOISE), (label, value, sim)
