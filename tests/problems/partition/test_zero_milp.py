"""Data parallelism and ZeRO in the partition MILP (issue 25): with ``Settings.zero`` 0..3, ``dp``
1..4, the training-state ratios and a message latency, the MILP (ZeRO's state in the memory rows,
its per-microbatch collectives as linear stage terms read off the one rule) equals the DP and the
brute force over every split (times every recompute choice) scored by :func:`pipeopt.evaluate`,
recompute none and auto; tied parameters and the event-time objectives are refused."""

from __future__ import annotations

import math

import pytest
from brute_force import partition_optimum, recompute_optimum
from hypothesis import HealthCheck, given, settings
from test_zero_dp import ACT, ADAM, FWD, PARAM, _instance, cases

from pipeopt import evaluate, solve
from pipeopt.errors import InfeasibleError, InvalidProblemError
from pipeopt.problems.partition.dp import solve_dp
from pipeopt.problems.partition.milp import solve_milp
from pipeopt.problems.partition.problem import PartitionProblem
from pipeopt.result import Status


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_milp_equals_dp_and_brute_force(case):
    inst, S = case
    for rc in ("none", "auto"):
        best = (recompute_optimum(inst, S) if rc == "auto" else partition_optimum(inst, S)).value
        prob = PartitionProblem(inst, S, recompute=rc)
        if not math.isfinite(best):
            with pytest.raises(InfeasibleError):
                solve_milp(prob, solver="highs", time_limit=None)
            continue
        res = solve_milp(prob, solver="highs", time_limit=None)
        assert res.status == Status.OPTIMAL, res.info
        ev = evaluate(inst, res.plan)
        assert ev.feasible and res.objective == pytest.approx(ev.objective, rel=1e-9)
        assert res.objective == pytest.approx(best, rel=1e-6), (rc, res.objective, best)
        assert res.lower_bound <= res.objective * (1 + 1e-9)
        assert res.objective == pytest.approx(solve_dp(prob).objective, rel=1e-6)


def test_solve_routes_and_refusals():
    base = _instance(FWD, ACT, PARAM, 3, 2.6e9, {"zero": 3, "dp": 4, **ADAM}, latency=0.01)
    res = solve(base, method="milp", stages=3, recompute="auto")
    assert res.status == Status.OPTIMAL
    assert res.objective == pytest.approx(solve(base, method="dp", stages=3, recompute="auto").objective, rel=1e-6)
    it = base.with_settings(objective="iteration")
    with pytest.raises(InvalidProblemError, match="does not model data parallelism or ZeRO"):
        solve(it, method="milp", stages=3)
