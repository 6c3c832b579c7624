"""The free-order schedule problem (ScheduleProblem(..., schedule="free")) and its CP-SAT model:

* the model's optimum = the brute force over every split and EVERY order of every rank
  (tests/brute_force.py: no symmetry assumed, its own statement of the rules) on small random
  chains: p = 2, v = 1 (m = 2, 3), looped v = 2 and V (m = 2), with and without memory limits,
  overlap and W shares;
* the claimed objective is the executor's time of the returned order (plan.schedule read back);
* free is never worse than a fixed order of its placement (their exhaustive optimum);
* honesty: a deadline that has passed never claims an optimum; bad requests are typed errors.
"""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import chain_graph, split_backward_chains

import brute_force as bf
import pipeopt
from pipeopt import Cluster, Instance, Settings
from pipeopt.backends.deadline import Deadline
from pipeopt.errors import InfeasibleError, InvalidProblemError, PipeoptError
from pipeopt.problems import spaces
from pipeopt.problems.schedule import ScheduleProblem, exhaustive, solve_free_order, solve_milp
from pipeopt.schedules import Schedule, as_free, make_schedule, run_schedule

REL = 1e-6
FEW = settings(max_examples=8, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def free_problems(draw):
    placement, v, m = draw(st.sampled_from([("looped", 1, 2), ("looped", 1, 3), ("looped", 2, 2), ("v", 2, 2)]))
    n = draw(st.integers(2 * v, 2 * v + (1 if m == 3 else 2 if v == 1 else 1)))
    g = draw(split_backward_chains(n))
    memory = draw(st.sampled_from([math.inf, 4e8 * n / 2 + 3e8, 1e9]))
    latency = draw(st.sampled_from([0.0, 0.0, 0.01, 0.05]))  # alpha-beta transfers
    inst = Instance(g, Cluster.homogeneous(2, memory=memory, bandwidth=1e9, latency=latency),
                    Settings(overlap=draw(st.booleans())))
    return ScheduleProblem(inst, "free", 2, m, v, placement=placement)


def solve(problem, **kw):
    return solve_free_order(problem, time_limit=None, threads=1, **kw)


def check_claim(problem, res):
    """The objective is the executor's time of the order the plan carries."""
    order = Schedule.from_dict(res.plan.schedule)
    assert order.name == "free" and order.placement == problem.schedule.placement
    ex = run_schedule(problem.instance, order, res.plan)
    assert ex.feasible and res.objective == ex.time
    assert res.lower_bound <= res.objective * (1 + 1e-9)


@FEW
@given(free_problems())
def test_cpsat_equals_brute_force_over_every_order(problem):
    value, bounds, _ = bf.free_order_optimum(problem.instance, problem.schedule.placement, problem.microbatches)
    if not math.isfinite(value):
        with pytest.raises(InfeasibleError):
            solve(problem)
        return
    res = solve(problem)
    assert res.status == "optimal" and res.space == problem.result_space
    check_claim(problem, res)
    assert math.isclose(res.objective, value, rel_tol=REL), (res.objective, value)


@pytest.mark.parametrize("name", ["GPipe", "1F1B", "InterleavedZeroBubble"])
def test_free_is_never_worse_than_a_fixed_order(name):
    g = chain_graph([1.0, 2.0, 1.5, 0.5, 1.2], [2.0, 3.0, 3.5, 1.0, 2.0], out=1e7, act=1e8, param=1e8)
    inst = Instance(g, Cluster.homogeneous(2, memory=1e9, bandwidth=1e9))
    fixed = exhaustive(ScheduleProblem(inst, name, 2, 4, 1 if name != "GPipe" else None))
    free = solve(ScheduleProblem(inst, "free", 2, 4))
    assert free.status == "optimal"
    assert free.objective <= fixed.objective * (1 + 1e-9)
    assert spaces.contains(free.space, fixed.space) == (name != "InterleavedZeroBubble")  # its name has no v
    check_claim(ScheduleProblem(inst, "free", 2, 4), free)


def test_as_free_never_later():
    """An order with whole backwards and fused steps (DualPipeV) as a free order: never later."""
    g = chain_graph([1.0, 2.0, 1.5, 0.5, 1.2, 0.7], [2.0, 3.0, 3.5, 1.0, 2.0, 1.1], out=1e7)
    inst = Instance(g, Cluster.homogeneous(2, bandwidth=1e9))
    for name, v in (("DualPipeV", 2), ("1F1B", None), ("Interleaved1F1B", 2)):
        sched = make_schedule(name, 2, 4, v)
        plan = ScheduleProblem(inst, sched).plan([1, 3, 4] if sched.stages == 4 else [3])
        assert run_schedule(inst, as_free(sched), plan).time <= run_schedule(inst, sched, plan).time * (1 + 1e-12)


def test_a_passed_deadline_never_claims_an_optimum():
    g = chain_graph([1.0, 2.0, 1.5, 0.5], [2.0, 3.0, 3.5, 1.0])
    problem = ScheduleProblem(Instance(g, Cluster.homogeneous(2)), "free", 2, 3)
    dl = Deadline(1e-3, clock=time.perf_counter() - 1.0)  # passed before the call: no race with a fast machine
    res = solve_free_order(problem, time_limit=dl)
    if res.status == "optimal":  # only where a starting plan meets the split bound: proven without the solver
        assert "proof" in res.info and res.objective <= res.info["split_bound"] * (1 + 1e-6)
    if res.plan is not None:
        check_claim(problem, res)


def test_door_and_bad_requests():
    g = chain_graph([1.0, 2.0, 1.5, 0.5], [2.0, 3.0, 3.5, 1.0])
    inst = Instance(g, Cluster.homogeneous(2))
    res = pipeopt.solve(inst, problem="schedule", schedule="Free-Order", stages=2, microbatches=2, time_limit=None)
    assert res.method == "cpsat" and res.info["chosen"]["method"] == "cpsat" and res.status == "optimal"
    with pytest.raises(InvalidProblemError, match="'cpsat'"):
        solve_milp(ScheduleProblem(inst, "free", 2, 2))
    with pytest.raises(InvalidProblemError, match="placement='v' is for the free order"):
        ScheduleProblem(inst, "1F1B", 2, 2, placement="v")
    with pytest.raises(InvalidProblemError, match="unknown placement"):
        ScheduleProblem(inst, "free", 2, 2, placement="zigzag")
    with pytest.raises(InvalidProblemError, match="V placement holds 2"):
        ScheduleProblem(inst, "free", 2, 2, 3, placement="v")
    with pytest.raises(InvalidProblemError, match="w_placement='free' is part of the free order"):
        ScheduleProblem(inst, "free", 2, 2, w_placement="free")
    with pytest.raises(InvalidProblemError, match="fixed order"):
        solve_free_order(ScheduleProblem(inst, "1F1B", 2, 2))


def test_cli_free_order(tmp_path, capsys):
    from pipeopt.cli import main
    from pipeopt.io import write

    g = chain_graph([1.0, 2.0, 1.5, 0.5], [2.0, 3.0, 3.5, 1.0], out=1e6)
    path = tmp_path / "four.json"
    write(Instance(g, Cluster.homogeneous(2, bandwidth=1e9)), path)
    plan = tmp_path / "plan.json"
    assert main(["solve", str(path), "--schedule", "free", "--microbatches", "3", "--time-limit", "none",
                 "--save-plan", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "free" in out and "optimal" in out and "action order (chosen with the split)" in out
    import json

    saved = json.loads(plan.read_text())
    assert Schedule.from_dict(saved["schedule"]).name == "free"
    assert main(["solve", str(path), "--schedule", "1F1B", "--placement", "v"]) == 2
    assert "--placement is for --schedule free" in capsys.readouterr().err


def test_bench_free_bound_bounds_the_fixed_orders():
    from pipeopt import bench

    g = chain_graph([1.0, 2.0, 1.5, 0.5, 1.2], [2.0, 3.0, 3.5, 1.0, 2.0], out=1e7, act=1e8, param=1e8)
    inst = Instance(g, Cluster.homogeneous(2, memory=1e9, bandwidth=1e9), Settings(microbatches=3))
    df = bench.run([inst], problem="schedule", stages=[2], schedule=["free", "1F1B"], methods=["auto", "uniform"],
                   time_limit=60.0, progress=False)
    free = df[(df["space"] == "schedule:free") & (df["method"] == "auto")].iloc[0]  # (bench needs a time limit:
    # no status is asserted; the bound relation below holds whatever the solve proved)
    fixed = df[df["space"] == "schedule:1F1B"]
    own = fixed[fixed["method"] == "auto"].iloc[0]["lower_bound"]
    # the free bound is a bound of the 1F1B rows too: their best bound is the larger of the two
    assert len(fixed) == 2 and (fixed["best_bound"] == max(own, free["lower_bound"])).all()
    assert (fixed["objective"] >= free["lower_bound"] * (1 - 1e-9)).all()
    assert spaces.contains("schedule:free-looped2", "schedule:Interleaved1F1B")
    assert not spaces.contains("schedule:free", "schedule:Interleaved1F1B")  # v differs: no bound
    assert not spaces.contains("schedule:free", "schedule:ZBVZeroBubble")
    assert ScheduleProblem(inst, "free", 2, 2, 2).result_space == "schedule:free-looped2"
    assert ScheduleProblem(inst, "free", 2, 2, placement="v").result_space == "schedule:free-v"


@FEW
@given(free_problems(), st.integers(0, 3))
def test_split_descent_never_worsens_its_start(problem, seed):
    """descend_split: from any split, the result fits, its time is the executor's time of its
    order on its split, at most the start's, and its split is strictly increasing in (0, n)."""
    import random

    from pipeopt.problems.schedule.free_order import _scored, descend_split, looped_torch_orders
    from pipeopt.schedules.free import placement_kind

    sched = problem.schedule
    orders = [("free", sched)]
    for name in looped_torch_orders(placement_kind(sched) or "looped", sched.stages_per_rank):
        try:  # as warm_starts does: an order this shape does not admit (DualPipeV, m < 2p) is left out
            orders.append((name, as_free(make_schedule(
                name, 2, sched.microbatches, None if name in ("GPipe", "1F1B") else sched.stages_per_rank))))
        except PipeoptError:
            pass
    rng = random.Random(seed)
    starts = sorted(rng.sample(range(1, problem.n), problem.S - 1))
    cands = _scored(problem, orders, starts)
    if not cands:
        return
    start = min(cands, key=lambda c: c[0])
    t, _, order, best = descend_split(problem, orders, start, Deadline(None))
    assert t <= start[0]
    assert all(a < b for a, b in zip([0, *best], [*best, problem.n]))
    ex = problem.execute(best, order)
    assert ex.feasible and ex.time == t


@FEW
@given(free_problems())
def test_given_warm_start_bounds_the_result(problem):
    """A fixed order's exhaustive optimum given as a warm start: the free result, even with no
    time for CP-SAT, is never slower than it; a pair of another shape is refused by name."""
    from pipeopt.schedules.free import placement_kind

    sched = problem.schedule

    name = "1F1B" if sched.stages_per_rank == 1 else ("ZBVZeroBubble" if placement_kind(sched) == "v"
                                                      else "Interleaved1F1B")
    try:  # (a shape the fixed order does not admit, or no split of it fits: nothing to compare)
        fixed = ScheduleProblem(problem.instance, name, 2, sched.microbatches,
                                None if sched.stages_per_rank == 1 else 2)
        best = exhaustive(fixed)
    except (InfeasibleError, InvalidProblemError):
        return
    order = make_schedule(name, 2, sched.microbatches, None if sched.stages_per_rank == 1 else 2)
    res = solve_free_order(problem, time_limit=Deadline(1e-9), threads=1, warm=[(best.info["starts"], order)])
    assert res.plan is not None and res.objective <= best.objective * (1 + 1e-12)
    check_claim(problem, res)
    other = make_schedule("GPipe", 2, sched.microbatches + 1)
    with pytest.raises(InvalidProblemError, match="warm start 0"):
        solve_free_order(problem, time_limit=Deadline(1e-9), warm=[(best.info["starts"], other)])


def test_warm_start_on_one_chain_and_bad_warm_starts():
    """The fast tier's member of test_given_warm_start_bounds_the_result (slow: an exhaustive
    fixed order per example): 1F1B's exact split and order as a warm start bound the free result
    even with no time for CP-SAT; each malformed warm start is refused by name and index."""
    g = chain_graph([1.0, 2.0, 1.5, 0.5], [2.0, 3.0, 3.5, 1.0])
    inst = Instance(g, Cluster.homogeneous(2, memory=1e9, bandwidth=1e9))
    problem = ScheduleProblem(inst, "free", 2, 3)
    best = exhaustive(ScheduleProblem(inst, "1F1B", 2, 3))
    order = make_schedule("1F1B", 2, 3)
    res = solve_free_order(problem, time_limit=Deadline(1e-9), threads=1, warm=[(best.info["starts"], order)])
    assert res.plan is not None and res.objective <= best.objective * (1 + 1e-12)
    check_claim(problem, res)
    bad = {
        "expected a \\(starts, order\\) pair": [best.info["starts"]],
        "must be a pipeopt.schedules.Schedule": [(best.info["starts"], "1F1B")],
        "the problem": [(best.info["starts"], make_schedule("GPipe", 2, 4))],
        "is not a split of 4 layers": [([3, 1], order)],
    }
    for match, warm in bad.items():
        with pytest.raises(InvalidProblemError, match="warm start 0: .*" + match):
            solve_free_order(problem, time_limit=Deadline(1e-9), warm=warm)


@pytest.mark.slow
def test_warm_start_where_the_zero_bubble_order_fits_no_split():
    """BERT-large on 4 V100s (16 GB), looped v = 2, m = 8: no split fits the memory under the
    two-chunk zero-bubble order (its MILP proves it) nor on the baselines' splits, but some split
    fits under Interleaved1F1B; the warm start takes that order's exact split, so the free solve
    starts from a plan (before, it had none). The limit is far above the few seconds it takes."""
    from pathlib import Path

    from pipeopt.problems.schedule.free_order import warm_starts

    inst = pipeopt.read(Path(__file__).resolve().parents[3] / "instances/memory/bert-large-mb16-v100-16gb-x4.json")
    assert solve_milp(ScheduleProblem(inst, "InterleavedZeroBubble", 4, 8, 2), time_limit=600).status == "infeasible"
    problem = ScheduleProblem(inst, "free", 4, 8, 2, placement="looped")
    found = warm_starts(problem, Deadline.of(600))
    assert found and all(problem.execute(c[3], c[2]).feasible for c in found)
    assert found[0][0] == pytest.approx(problem.execute(found[0][3], found[0][2]).time)
