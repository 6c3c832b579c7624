"""``pipeopt.solve(..., zero=...)`` (issue 25): ``zero="auto"`` chooses the ZeRO stage with the plan
through the one door (the partition problem's dp / auto: one exact solve per stage, as the CLI's
``--zero auto``), ``zero=0..3`` solves under that stage, other problems and methods refuse
``"auto"`` with a typed error, a bad value is refused."""

from __future__ import annotations

import pytest
from test_zero_dp import ACT, ADAM, FWD, PARAM, _instance

from pipeopt import evaluate, solve
from pipeopt.errors import InvalidProblemError
from pipeopt.problems.partition.dp import solve_zero_auto
from pipeopt.result import Status


@pytest.mark.parametrize("rc", ["none", "auto"])
def test_solve_zero_auto_is_solve_zero_auto(rc):
    base = _instance(FWD, ACT, PARAM, 3, 2.6e9, {"dp": 4, **ADAM}, latency=0.01)
    res = solve(base, stages=3, recompute=rc, zero="auto")
    ref = solve_zero_auto(base, stages=3, recompute=rc)
    assert res.status == Status.OPTIMAL
    assert res.info["zero_auto"] == ref.info["zero_auto"]
    assert res.objective == pytest.approx(ref.objective, rel=1e-12)
    chosen = res.info["zero_auto"]["chosen"]
    assert res.objective == pytest.approx(evaluate(base.with_settings(zero=chosen), res.plan).objective, rel=1e-9)
    stages = res.info["zero_auto"]["stages"]
    assert res.objective == min(v for v in stages.values() if isinstance(v, float))


def test_solve_zero_stage_and_refusals():
    base = _instance(FWD, ACT, PARAM, 3, 2.6e9, {"dp": 4, **ADAM}, latency=0.01)
    for z in range(4):
        res = solve(base, stages=3, recompute="auto", zero=z)
        direct = solve(base.with_settings(zero=z), stages=3, recompute="auto")
        assert res.objective == direct.objective and res.info["zero"]["zero"] == z
    by_dp = solve(base, stages=3, zero="auto", time_limit=None)
    by_milp = solve(base, stages=3, method="milp", zero="auto", time_limit=None)  # any exact method with ZeRO
    assert by_milp.status == by_dp.status == "optimal"
    assert by_milp.objective == pytest.approx(by_dp.objective, rel=1e-6)
    with pytest.raises(InvalidProblemError, match="a method that models ZeRO, not partition/probe"):
        solve(base, stages=3, method="probe", zero="auto")
    for bad in (4, -1, "2", True, 1.5):
        with pytest.raises(InvalidProblemError, match="zero must be"):
            solve(base, stages=3, zero=bad)
