"""Issue 7's reproducers of the resource problems, read from ../shared/repro (never copied).

* ``group_154.json --problem group --workers 2 --method cpsat``: InfeasibleError ("an exact
  method proved that no plan fits") because both heuristic starts break memory; a 16.15 ms
  plan fits. Root cause: the exact methods needed a feasible start. Now, without one, the
  bisection probes a limit every plan that fits passes first, and only a proof at that limit
  raises InfeasibleError.
* ``joint_104.json --problem joint --stages 2 --method milp --solver highs``: ``time_limit``
  after 0.02 s of 20 s with a 63 % gap. Root cause: the memory rows were written in GiB, so
  capacities of ~2 kB were 2e-6 in the model, below HiGHS's feasibility tolerance; HiGHS
  returned a plan that breaks memory, whose exact value was no progress, and the bisection
  gave up. Now memory rows are scaled by the capacity, every plan is certified under the cost
  model (a stage over T is cut off and the model solved again), and an undecided step is
  searched around, never a reason to stop.

Both were written when a split-execution stage kept k microbatches in flight; it keeps 2k now
(:func:`pipeopt.cost.rules.in_flight`), so every device's capacity is doubled here
(:func:`_read`) to keep each reproducer's situation (with weight stashing off, a stage needs
``2k act + params``: no more than twice what it needed).
"""

from __future__ import annotations

import math

import pytest
from conftest import ROOT

import pipeopt
from pipeopt.backends.deadline import Deadline
from pipeopt.problems.resource import GroupProblem, JointProblem, brute_force
from pipeopt.problems.resource.duan_wu import algorithm2, round_robin
from pipeopt.problems.resource.search import MIN_REL_GAP

REPRO = ROOT.parent / "shared" / "repro"


def _read(name: str) -> pipeopt.Instance:
    path = REPRO / name
    if not path.exists():
        pytest.skip(f"{path} is not present")
    inst = pipeopt.read(path)
    devs = tuple(pipeopt.Device(d.name, d.resources, 2 * d.memory) for d in inst.cluster.devices)
    return inst.replace(cluster=pipeopt.Cluster(devs, inst.cluster.bandwidth))


def _check_optimal(inst, r, best):
    assert r.plan is not None and pipeopt.evaluate(inst, r.plan).feasible
    assert r.objective == pipeopt.evaluate(inst, r.plan).objective
    assert str(r.status) == "optimal", (r.status, r.info)
    gap = r.info["rel_gap_target"]
    assert gap <= MIN_REL_GAP  # the DP's is 1e-12
    assert best * (1 - 1e-12) <= r.objective <= best * (1 + gap)
    assert r.lower_bound <= best * (1 + 1e-12)


def test_group_154_heuristic_starts_break_memory():
    """The situation of the reproducer: both starts break memory, yet a plan fits."""
    p = GroupProblem(_read("group_154.json"), 2)
    for heuristic in (algorithm2, round_robin):
        assert str(heuristic(p).status) == "infeasible"
    _, _, best = brute_force(p)
    assert math.isfinite(best)  # 8.08 ms (16.15 ms with k in flight and the old objective)


@pytest.mark.parametrize("method,solver", [("cpsat", "cbc"), ("milp", "cbc"), ("milp", "highs")])
def test_group_154_exact_methods_find_the_plan_that_fits(method, solver):
    inst = _read("group_154.json")
    _, _, best = brute_force(GroupProblem(inst, 2))
    r = pipeopt.solve(inst, problem="group", method=method, solver=solver, workers=2, time_limit=None)
    _check_optimal(inst, r, best)
    assert r.info["start"] == "none fits"


@pytest.mark.parametrize("method,solver", [("milp", "highs"), ("milp", "cbc"), ("cpsat", "cbc"), ("dp", "cbc")])
def test_joint_104_exact_methods_prove_the_optimum(method, solver):
    inst = _read("joint_104.json")
    _, _, best = brute_force(JointProblem(inst, 2))
    r = pipeopt.solve(inst, problem="joint", method=method, solver=solver, stages=2, time_limit=None)
    _check_optimal(inst, r, best)
    assert "unknown" not in r.info.get("step_outcomes", [])  # every bisection step decided


def test_joint_104_tiny_capacities_are_rows_the_solver_sees():
    """The capacity of joint_104 is ~2 kB: a memory row in GiB (2e-6) is below HiGHS's
    tolerance; scaled by the capacity every MILP step at a limit the best plan passes finds a
    plan that fits."""
    from pipeopt.problems.resource.formulation import MilpProbe

    inst = _read("joint_104.json")
    p = JointProblem(inst, 2)
    assert max(d.memory for d in inst.cluster.devices) < 1e4
    _, _, best = brute_force(p)
    for T in (best, 1.5 * best, 4 * best):
        out = MilpProbe(p, solver="highs")(T, Deadline(20))
        assert out.outcome == "feasible" and out.value <= T
        assert pipeopt.evaluate(inst, p.plan(*out.plan)).feasible
    assert MilpProbe(p, solver="highs")(best * (1 - 1e-6), None).outcome == "infeasible"
    assert math.isfinite(best)
