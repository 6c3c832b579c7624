"""Free W placement (ScheduleProblem(..., w_placement="free")):

* the MILP's optimum = the brute force over every split x every W placement on small random
  chains (p = 2, v = 1 or 2, m = 2..4), with and without memory limits and overlap; the brute
  force without the model's chunk-order restriction finds nothing better (the restriction is
  lossless);
* the claimed objective (the solver's Z) = the executor's time of the returned order;
* free is never worse than the schedule's own placement; with W = 0 they agree;
* a time limit never claims optimality; a schedule without W is refused (typed error);
* the order helpers reproduce the schedule's own order and refuse a W before its I.
"""

from __future__ import annotations

import json
import math
import re

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import layer_graphs

from pipeopt import Cluster, Instance, Settings
from pipeopt.cli import main
from pipeopt.errors import InvalidPlanError, InvalidProblemError
from pipeopt.io import write
from pipeopt.problems.schedule import ScheduleProblem, exhaustive, solve_milp
from pipeopt.schedules import Action, Schedule, make_schedule, run_schedule
from pipeopt.schedules.w_gaps import place_w, rank_gaps, schedule_gaps

REL = 1e-6
FEW = settings(max_examples=15, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def cases(draw):
    """(free problem, same problem with the schedule's placement): 2 ranks, a chain of
    S + 1 .. S + 2 layers, W a random share of B, random memory and overlap."""
    name, v, m = draw(st.sampled_from([("InterleavedZeroBubble", 1, 2), ("InterleavedZeroBubble", 1, 3),
                                       ("InterleavedZeroBubble", 1, 4), ("InterleavedZeroBubble", 2, 2),
                                       ("ZBVZeroBubble", 2, 2)]))
    S = 2 * v
    g = draw(layer_graphs(min_layers=S + 1, max_layers=S + (2 if v == 1 else 1)))
    for n in g.nodes:
        g.nodes[n]["out_bytes"] = draw(st.floats(0.0, 0.03)) * 1e9
        g.nodes[n]["bwd_w"] = {"gpu": g.nodes[n]["bwd"]["gpu"] * draw(st.floats(0.0, 1.0))}
    memory = draw(st.sampled_from([math.inf, 2.5e9, 4e9]))
    inst = Instance(g, Cluster.homogeneous(2, memory=memory, bandwidth=1e9),
                    Settings(overlap=draw(st.booleans())))
    return (ScheduleProblem(inst, name, 2, m, v, w_placement="free"), ScheduleProblem(inst, name, 2, m, v))


def check_claim(problem, res):
    """The objective is the simulator's time of the returned order, and the solver's Z says so."""
    ex = run_schedule(problem.instance, res.evaluation.schedule, problem.plan(res.info["starts"]))
    assert res.objective == ex.time and ex.feasible
    assert res.lower_bound <= res.objective * (1 + 1e-9)
    if res.info.get("solver_objective") is not None and res.info["starts"] != res.info.get("warm_start"):
        assert math.isclose(res.info["solver_objective"], res.objective, rel_tol=REL, abs_tol=1e-12)


@FEW
@given(pair=cases())
def test_free_milp_equals_brute_force(pair):
    free, fixed = pair
    res = solve_milp(free, time_limit=None)
    ref = exhaustive(free)
    if ref.status == "infeasible":
        assert res.status == "infeasible" and res.info["starts"] is None
        return
    assert res.status == "optimal", res.info
    assert math.isclose(res.objective, ref.objective, rel_tol=REL, abs_tol=1e-12), \
        (res.info["starts"], ref.info["starts"])
    check_claim(free, res)
    # every placement, W's of one chunk in any order: nothing better (the restriction is lossless)
    if free.microbatches <= 3:
        allw = exhaustive(free, chunk_order=False)
        assert math.isclose(allw.objective, ref.objective, rel_tol=REL, abs_tol=1e-12)
    # free placement is never worse than the schedule's own
    own = exhaustive(fixed)
    assert res.objective <= own.objective * (1 + REL)


def test_zero_w_cost_agrees_and_dualpipe_claim():
    g = nx.DiGraph()
    for i in range(5):
        g.add_node(f"l{i}", fwd={"gpu": 1.0 + 0.3 * i}, bwd={"gpu": 2.0 + 0.5 * (i % 3)}, bwd_w={"gpu": 0.0},
                   out_bytes=2e7, act_bytes=1e8, param_bytes=1e8)
    nx.add_path(g, [f"l{i}" for i in range(5)])
    inst = Instance(g, Cluster.homogeneous(2, bandwidth=1e9), Settings())
    for name, m in (("InterleavedZeroBubble", 3), ("ZBVZeroBubble", 3)):
        free = solve_milp(ScheduleProblem(inst, name, 2, m, 2, w_placement="free"), time_limit=None)
        own = exhaustive(ScheduleProblem(inst, name, 2, m, 2))
        assert free.status == "optimal"
        assert math.isclose(free.objective, own.objective, rel_tol=REL)
    for n in g.nodes:
        g.nodes[n]["bwd_w"] = {"gpu": 0.8}
    inst = Instance(g, Cluster.homogeneous(2, bandwidth=1e9, memory=3e9), Settings())
    problem = ScheduleProblem(inst, "DualPipeV", 2, 4, w_placement="free")
    res = solve_milp(problem, time_limit=60)
    assert res.status in ("optimal", "time_limit")
    check_claim(problem, res)
    assert res.objective <= solve_milp(ScheduleProblem(inst, "DualPipeV", 2, 4)).objective * (1 + REL)


def test_time_limit_reports_bound():
    g = nx.DiGraph()
    for i in range(16):
        g.add_node(f"l{i}", fwd={"gpu": 1.0 + (i % 5) * 0.2}, bwd={"gpu": 2.0 + (i % 3) * 0.3},
                   bwd_w={"gpu": 0.9}, out_bytes=1e7, act_bytes=1e8, param_bytes=1e8)
    nx.add_path(g, [f"l{i}" for i in range(16)])
    inst = Instance(g, Cluster.homogeneous(4, bandwidth=1e9), Settings())
    problem = ScheduleProblem(inst, "ZBVZeroBubble", 4, 8, w_placement="free")
    res = solve_milp(problem, time_limit=1.0)
    # (stopped by the clock on any machine we know; a much faster one may prove it: both are honest)
    assert res.status in ("time_limit", "optimal") and res.info["starts"] is not None
    assert res.lower_bound is not None and res.lower_bound <= res.objective
    check_claim(problem, res)


def test_free_needs_w_actions():
    g = nx.DiGraph()
    for i in range(4):
        g.add_node(f"l{i}", fwd={"gpu": 1.0}, bwd={"gpu": 2.0}, out_bytes=1.0, act_bytes=1.0, param_bytes=1.0)
    nx.add_path(g, [f"l{i}" for i in range(4)])
    inst = Instance(g, Cluster.homogeneous(2), Settings())
    for name in ("1F1B", "GPipe", "Interleaved1F1B"):
        with pytest.raises(InvalidProblemError, match="no W"):
            ScheduleProblem(inst, name, 2, 4, w_placement="free")
    with pytest.raises(InvalidProblemError, match="W placement"):
        ScheduleProblem(inst, "ZBVZeroBubble", 2, 4, w_placement="late")


@pytest.mark.parametrize("name, v", [("InterleavedZeroBubble", 2), ("ZBVZeroBubble", 2), ("DualPipeV", 2),
                                     ("InterleavedZeroBubble", 1)])
def test_place_w_reproduces_the_schedule(name, v):
    sched = make_schedule(name, 4, 8, v)
    gaps = rank_gaps(sched)
    again = place_w(sched, schedule_gaps(sched, gaps), gaps)
    # the same W's in the same gaps (inside a gap, W's in the order of their I's) ...
    assert schedule_gaps(again, gaps) == schedule_gaps(sched, gaps)
    assert [[s for s in rank if s[0].kind != "W"] for rank in again.steps] == \
        [[s for s in rank if s[0].kind != "W"] for rank in sched.steps]
    # ... and the same iteration: the order inside a gap changes no start time
    g = nx.DiGraph()
    for i in range(4 * v + 2):
        g.add_node(f"l{i}", fwd={"gpu": 1.0 + (i % 3) * 0.4}, bwd={"gpu": 2.0 + (i % 4) * 0.3},
                   bwd_w={"gpu": 0.5 + (i % 2) * 0.6}, out_bytes=1e7, act_bytes=1e8, param_bytes=1e8)
    nx.add_path(g, list(g.nodes))
    problem = ScheduleProblem(Instance(g, Cluster.homogeneous(4, bandwidth=1e9), Settings()), sched)
    starts = list(range(1, 4 * v)) if v == 1 else [1, 2, 3, 4, 5, 6, 8]
    assert math.isclose(problem.execute(starts, again).time, problem.execute(starts).time, rel_tol=1e-12)
    late = place_w(sched, [[rg.gaps - 1] * len(rg.ws) for rg in gaps], gaps)
    assert [a.kind for a in late.actions(0)][-len(gaps[0].ws):] == ["W"] * len(gaps[0].ws)
    with pytest.raises(InvalidPlanError, match="its I"):
        bad = [list(x) for x in schedule_gaps(sched, gaps)]
        bad[0][0] = gaps[0].earliest[0] - 1
        place_w(sched, bad, gaps)


def five_layers():
    """Five layers with W costs, 2 ranks, m = 2 (the CLI tests)."""
    g = nx.DiGraph()
    for i in range(5):
        g.add_node(f"l{i}", fwd={"gpu": 0.01 + 0.004 * i}, bwd={"gpu": 0.02 + 0.01 * (i % 3)},
                   bwd_w={"gpu": 0.004 + 0.002 * i}, out_bytes=2e6, act_bytes=1e8, param_bytes=2e8)
    nx.add_path(g, [f"l{i}" for i in range(5)])
    return Instance(g, Cluster.homogeneous(2, bandwidth=1e9), Settings(microbatches=2), name="five")


def test_cli_w_placement(tmp_path, capsys):
    inst = five_layers()
    path = write(inst, tmp_path / "five.json")
    base = ["solve", str(path), "--stages", "2", "--microbatches", "2"]
    assert main([*base, "--schedule", "ZBVZeroBubble", "--w-placement", "free", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["schedules"]
    problem = ScheduleProblem(inst, "ZBVZeroBubble", 2, 2, w_placement="free")
    ref = exhaustive(problem)
    assert row["status"] == "optimal" and row["w_placement"] == "free"
    assert math.isclose(row["iteration_time"], ref.objective, rel_tol=REL)
    # the printed order, run by the simulator, gives the printed time
    actions = [[Action(k, int(st_), int(j)) for st_, k, j in (re.fullmatch(r"(\d+)([FBIW])(\d+)", a).groups()
                                                               for a in rank)] for rank in row["order"]]
    sched = problem.schedule
    order = Schedule("read", 2, 2, 2, sched.placement, tuple(tuple((a,) for a in r) for r in actions))
    assert math.isclose(problem.execute(row["starts"], order).time, row["iteration_time"], rel_tol=1e-12)
    assert main([*base, "--schedule", "1F1B", "--w-placement", "free"]) == 2
    assert "no W" in capsys.readouterr().err


def test_cli_auto_with_free_placement(tmp_path, capsys):
    """``--schedule auto --w-placement free``: the schedules with W actions get the free
    placement, the others their own order (not refused); every row is the brute force's
    optimum of the problem it names, and the best is the least of them."""
    inst = five_layers()
    path = write(inst, tmp_path / "five.json")
    assert main(["solve", str(path), "--stages", "2", "--microbatches", "2", "--schedule", "auto",
                 "--w-placement", "free", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    refs, free_rows = {}, 0
    for row in out["schedules"]:
        if "refused" in row:
            continue
        own = ScheduleProblem(inst, row["schedule"], 2, 2)
        placement = "free" if own.schedule.splits_backward else "schedule"
        assert (row["w_placement"] or "schedule") == placement, row
        free_rows += placement == "free"
        problem = ScheduleProblem(inst, own.schedule, w_placement="free") if placement == "free" else own
        ref = exhaustive(problem)
        refs[row["schedule"]] = ref.objective
        assert row["status"] == "optimal"
        assert math.isclose(row["iteration_time"], ref.objective, rel_tol=REL), row["schedule"]
        if placement == "free":  # never worse than the schedule's own placement
            assert row["iteration_time"] <= exhaustive(own).objective * (1 + REL)
    assert free_rows >= 2 and len(refs) >= 4
    assert out["best"] == min(refs, key=refs.get) and out["proven_best"]


def test_free_placement_fits_where_the_schedules_order_does_not():
    """Memory binds: W's placed right after their I's free activations the schedule keeps."""
    g = nx.DiGraph()
    for i in range(5):
        g.add_node(f"l{i}", fwd={"gpu": 1.0 + 0.3 * i}, bwd={"gpu": 2.0 + 0.5 * (i % 3)}, bwd_w={"gpu": 0.9 + 0.2 * i},
                   out_bytes=2e7, act_bytes=1e9, param_bytes=1e8)
    nx.add_path(g, [f"l{i}" for i in range(5)])
    inst = Instance(g, Cluster.homogeneous(2, memory=4.2e9, bandwidth=1e9), Settings())
    own = ScheduleProblem(inst, "InterleavedZeroBubble", 2, 3, 1)
    assert solve_milp(own, time_limit=None).status == "infeasible" and exhaustive(own).status == "infeasible"
    free = ScheduleProblem(inst, "InterleavedZeroBubble", 2, 3, 1, w_placement="free")
    res = solve_milp(free, time_limit=None)
    assert res.status == "optimal"
    assert math.isclose(res.objective, exhaustive(free).objective, rel_tol=REL)
    check_claim(free, res)
    assert max(res.evaluation.memory) <= 4.2e9 * (1 + 1e-6)
