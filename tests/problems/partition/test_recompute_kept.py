"""A plan's recompute set is never dropped when a plan is turned into cuts (issue 25): the
partition problem's ``starts_of`` and the Bi-Partition problem's ``cuts_of`` refuse a plan
that recomputes (:func:`pipeopt.cost.table.refuse_recompute`), ``split_of`` carries the sets,
and the schedule problem's ``best_1f1b`` baseline runs the 1F1B DP's recompute sets with its
split."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeopt import PartitionProblem, evaluate
from pipeopt.errors import InvalidPlanError
from pipeopt.problems.partition import solve_dp

sys.path.insert(0, str(Path(__file__).parent))
from test_recompute_baselines import problem, zoo_style  # noqa: E402


def auto_plan(memory=2e5, S=4):
    p = problem(zoo_style(8), S, memory)
    auto = PartitionProblem(p.instance, S, recompute="auto")
    return auto, solve_dp(auto, time_limit=None).plan


def test_starts_of_refuses_a_recomputing_plan_and_split_of_carries_it():
    auto, plan = auto_plan()
    assert any(st.recompute for st in plan.stages)
    with pytest.raises(InvalidPlanError, match="starts_of .* recomputes"):
        auto.starts_of(plan)
    starts, rc = auto.split_of(plan)
    assert auto.plan(starts, recompute=rc) == plan  # the round trip keeps every recompute set
    assert [dict(st.recompute or {}) for st in plan.stages] == rc
    plain = PartitionProblem(auto.instance, auto.stages)
    free = plain.plan(starts)  # the same cuts without recomputation
    assert plain.starts_of(free) == starts
    assert not evaluate(auto.instance, free).feasible  # dropping the sets would break memory


def test_bipartition_cuts_of_refuses_a_recomputing_plan():
    from pipeopt.problems.bipartition import BipartitionProblem

    auto, plan = auto_plan()
    bp = BipartitionProblem(auto.instance, auto.stages)
    with pytest.raises(InvalidPlanError, match="Bi-Partition has no recomputation"):
        bp.cuts_of(plan)


@pytest.mark.parametrize("rc", ["none", "full", "auto"])
def test_best_1f1b_carries_the_dp_recompute_sets(rc):
    from pipeopt.problems.schedule import ScheduleProblem
    from pipeopt.problems.schedule.baselines import best_1f1b

    memory = 2e5 if rc != "none" else 4e5
    inst = problem(zoo_style(8), 4, memory).instance
    pr = ScheduleProblem(inst, "1F1B", 4, 8, recompute=rc)
    res = best_1f1b(pr)
    part = PartitionProblem(inst.with_settings(objective="bottleneck", microbatches=8), 4, recompute=rc)
    dp = solve_dp(part, time_limit=None)
    starts, sets = part.split_of(dp.plan)
    assert res.info["starts"] == starts
    assert [dict(st.recompute or {}) for st in res.plan.stages] == sets  # the DP's sets, unchanged
    assert res.status.value == "feasible"  # under 1F1B the DP's sets fit by construction
    if rc == "none":
        assert not any(sets)
    else:
        assert any(sets)
