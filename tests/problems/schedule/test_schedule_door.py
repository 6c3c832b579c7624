"""The schedule problem through the package's one door: in the registry with its methods,
posed by ``pipeopt.solve(..., problem="schedule")``, its results :class:`pipeopt.Result`
(claims checked, objective the executor's), ``bench`` rows with gaps to its exact bound,
``auto`` under one deadline, m from the one rule, and too large a request refused before any
work."""

from __future__ import annotations

import math

import networkx as nx
import pytest

import pipeopt
from pipeopt import Cluster, Instance, Result, Settings, bench, registry
from pipeopt.backends.deadline import Deadline
from pipeopt.errors import ClaimError, InvalidProblemError
from pipeopt.problems.method import Method
from pipeopt.problems.schedule import METHODS, ScheduleProblem, exhaustive
from pipeopt.problems.schedule.choose import solve_schedules
from pipeopt.schedules import TORCH_SCHEDULES, run_schedule


def instance(memory=math.inf, devices=4, microbatches=4):
    g = nx.DiGraph()
    for i in range(6):
        g.add_node(f"l{i}", fwd={"gpu": 0.01 + 0.004 * i}, bwd={"gpu": 0.02 + 0.01 * (i % 3)}, out_bytes=2e6,
                   act_bytes=1e8, param_bytes=2e8)
    nx.add_path(g, [f"l{i}" for i in range(6)])
    return Instance(g, Cluster.homogeneous(devices, memory=memory, bandwidth=1e9),
                    Settings(microbatches=microbatches), name="six")


def test_schedule_is_a_problem_of_the_registry():
    assert "schedule" in registry.PROBLEMS and registry.problem_class("schedule") is ScheduleProblem
    names = [m.name for m in registry.methods("schedule")]
    assert names == [m.name for m in METHODS] and names[:4] == ["auto", "cpsat", "milp", "exhaustive"]
    assert [m.exact for m in registry.methods("schedule")][:5] == [True, True, True, True, False]
    assert not any(m.exact for m in registry.methods("schedule")[4:])
    assert registry.options_of("schedule") == ("schedule", "stages", "microbatches", "stages_per_rank",
                                               "w_placement", "placement", "recompute")


def test_solve_poses_it_and_returns_a_result_scored_by_the_executor():
    inst = instance()
    res = pipeopt.solve(inst, problem="schedule", schedule="1F1B", stages=4, microbatches=8, time_limit=None)
    assert isinstance(res, Result) and res.status == "optimal" and res.space == "schedule:1F1B"
    assert res.info["schedule"] == "1F1B" and res.info["microbatches"] == 8 and res.info["ranks"] == 4
    ex = run_schedule(inst, res.evaluation.schedule, res.plan)  # the single evaluation, again
    assert res.objective == ex.time and res.evaluation.feasible
    assert res.objective == exhaustive(ScheduleProblem(inst, "1F1B", 4, 8)).objective
    assert [len(st.layers) for st in res.plan.stages] == [b - a for a, b in
                                                          zip([0, *res.info["starts"]], [*res.info["starts"], 6])]
    text = res.summary()
    assert "space schedule:1F1B" in text and "chunk 3 on rank 3" in text
    # aliases reach the same problem; the default schedule is 1F1B, the default p every device
    same = pipeopt.solve(inst, problem="schedule", method="exhaustive", schedule="Schedule1F1B", microbatches=8)
    assert same.objective == res.objective and same.info["ranks"] == 4
    with pytest.raises(InvalidProblemError, match="unknown schedule 'nope'; choose from"):
        pipeopt.solve(inst, problem="schedule", schedule="nope", stages=2)


def test_the_claims_check_holds_the_methods_to_the_executor():
    inst = instance()
    problem = ScheduleProblem(inst, "GPipe", 2, 4)
    res = problem.result("milp", [3], "optimal", lower_bound=problem.value([3]))
    assert res.lower_bound == res.objective
    with pytest.raises(ClaimError, match="exceeds the objective"):
        problem.result("milp", [3], "time_limit", lower_bound=problem.value([3]) * 1.01)
    tight = ScheduleProblem(instance(memory=5e8), "GPipe", 2, 4)  # 4 microbatches in flight: over memory
    assert not tight.execute([3]).feasible
    with pytest.raises(ClaimError, match="breaks the constraints"):
        tight.result("milp", [3], "optimal")
    assert tight.result("uniform", [3], "feasible").status == "infeasible"  # a heuristic's plan over memory


def test_microbatches_default_to_the_instance_s_and_too_many_are_refused_before_any_work():
    inst = instance(microbatches=6)
    assert ScheduleProblem(inst, "1F1B", 2).microbatches == 6
    assert ScheduleProblem(inst, "1F1B", 2, 3).microbatches == 3
    for m in (10**9, 0, True, 2.5):
        with pytest.raises(InvalidProblemError, match="microbatches must be"):
            ScheduleProblem(inst, "1F1B", 2, m)
    with pytest.raises(InvalidProblemError, match="operations, more than"):
        ScheduleProblem(instance(devices=8), "ZBVZeroBubble", 8, 50_000)
    sched = ScheduleProblem(inst, "1F1B", 2, 3).schedule
    with pytest.raises(InvalidProblemError, match="microbatches=4 differs"):
        ScheduleProblem(inst, sched, microbatches=4)


def test_auto_shares_one_deadline(monkeypatch):
    inst = instance(devices=2)
    seen = []

    def record(problem, *, time_limit, **_):
        seen.append(time_limit)
        return problem.result("uniform", None, "time_limit")

    import pipeopt.problems.schedule as schedule_package

    monkeypatch.setattr(schedule_package, "METHODS", (Method("schedule", "milp", record, True),))
    shared = Deadline(1000.0)
    out = solve_schedules(inst, 2, 4, time_limit=shared)
    assert [r.info["schedule"] for r in out if isinstance(r, Result)] == list(TORCH_SCHEDULES)
    assert len(seen) == len(TORCH_SCHEDULES)
    for k, d in enumerate(seen):  # each schedule's share ends within the one deadline, on its clock
        assert isinstance(d, Deadline) and d.started == shared.started and d.end <= shared.end
        assert d.limit <= shared.limit / (len(TORCH_SCHEDULES) - k) + shared.elapsed() + 1.0


def test_a_schedule_whose_share_ran_out_says_so():
    inst = instance(devices=2)
    gone = Deadline(1e-9)
    while not gone.expired():
        pass
    for r in solve_schedules(inst, 2, 4, time_limit=gone):
        assert r.status == "time_limit" and r.plan is not None  # the warm start, never a proof
        assert r.lower_bound is not None and r.lower_bound <= r.objective


def test_bench_runs_the_schedule_problem_with_gaps_to_its_exact_bound():
    inst = instance()
    df = bench.run([inst], problem="schedule", stages=[2], schedule=["1f1b", "ScheduleZBVZeroBubble"],
                   methods=["milp", "uniform", "best_1f1b"], time_limit=60.0, progress=False)
    assert list(df["space"].unique()) == ["schedule:1F1B", "schedule:ZBVZeroBubble"]
    assert (df["problem"] == "schedule").all() and (df["objective_name"] == "iteration").all()
    for space, rows in df.groupby("space"):
        exact = rows[rows["method"] == "milp"].iloc[0]
        assert exact["lower_bound"] <= rows["objective"].min() * (1 + 1e-9)
        for _, row in rows.iterrows():  # the gap of each row is to its own schedule's exact bound
            assert row["best_bound"] == exact["lower_bound"]
            assert math.isclose(row["gap"], (row["objective"] - exact["lower_bound"]) / row["objective"] * 100,
                                abs_tol=1e-9)
    one = df[df["space"] == "schedule:1F1B"]  # GPipe / 1F1B on one stage per rank: the simulator agrees
    assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(one["simulated"], one["objective"]))
    assert df[df["space"] == "schedule:ZBVZeroBubble"]["simulated"].isna().all()
    with pytest.raises(InvalidProblemError, match="does not use schedule"):
        bench.run([inst], problem="partition", stages=[2], schedule="1F1B", progress=False)
    with pytest.raises(InvalidProblemError, match="unknown schedule"):
        bench.run([inst], problem="schedule", stages=[2], schedule="nope", progress=False)


def test_one_default_m(tmp_path, capsys):
    import json

    from pipeopt.cli import main
    from pipeopt.io import write
    from pipeopt.units import DEFAULT_MICROBATCHES

    assert Settings().microbatches == DEFAULT_MICROBATCHES
    inst = instance(devices=2, microbatches=6)
    path = write(inst, tmp_path / "six.json")
    for argv in (["simulate", str(path), "--stages", "2", "--json"],
                 ["simulate", str(path), "--stages", "2", "--schedule", "GPipe", "--json"]):
        assert main(argv) == 0
        assert json.loads(capsys.readouterr().out)["microbatches"] == 6  # the instance's, not a command's own
    res = pipeopt.solve(inst, problem="schedule", method="uniform", stages=2)
    assert res.info["microbatches"] == 6


def test_the_export_names_the_schedule_of_the_chunks():
    import tomllib

    from pipeopt.export import export
    from pipeopt.schedules import chunk_plan, make_schedule

    g = nx.DiGraph()
    names = ["tok_emb", *[f"layers.{i}" for i in range(6)], "head"]
    for n in names:
        g.add_node(n, fwd={"gpu": 0.01}, bwd={"gpu": 0.02}, out_bytes=1e6, act_bytes=1e6, param_bytes=1e6)
    nx.add_path(g, names)
    inst = Instance(g, Cluster.homogeneous(2, bandwidth=1e9), Settings())
    chunks = [names[0:2], names[2:4], names[4:6], names[6:8]]
    plan = chunk_plan(inst, make_schedule("ZBVZeroBubble", 2, 4), chunks)
    out = export(plan, "torchtitan", graph=g, schedule="zbv")
    cfg = tomllib.loads(out["toml"])["parallelism"]
    assert out["schedule"] == "ZBVZeroBubble" and cfg["pipeline_parallel_schedule"] == "ZBVZeroBubble"
    assert cfg["pipeline_parallel_degree"] == 2 and cfg["module_fqns_per_model_part"] == chunks
    assert export(plan, "torch", graph=g, schedule="ScheduleZBVZeroBubble")["schedule"] == "ZBVZeroBubble"
    with pytest.raises(pipeopt.errors.UnsupportedPlanError, match="1F1B runs 1 stage"):
        export(plan, "torchtitan", graph=g)  # 4 chunks on 2 ranks are not 1F1B's
    with pytest.raises(InvalidProblemError, match="unknown schedule 'zbx'; choose from"):
        export(plan, "torchtitan", graph=g, schedule="zbx")


def test_solver_auto_is_each_problems_own_backend():
    """``solver="auto"`` (the default of solve, the CLI and the bench) is HiGHS for the schedule
    problem (:data:`pipeopt.problems.schedule.SOLVER`) and CBC for the others; a name given is
    used as given, and both backends prove the same optimum."""
    from pipeopt.problems.schedule import SOLVER

    assert SOLVER == "highs" and registry.default_solver("schedule") == "highs"
    assert registry.default_solver("partition") == "cbc" and registry.default_solver("group") == "cbc"
    with pytest.raises(InvalidProblemError, match="unknown problem"):
        registry.default_solver("nope")
    inst = instance()
    opts = {"problem": "schedule", "method": "milp", "schedule": "1F1B", "stages": 4, "microbatches": 8,
            "time_limit": None}
    auto, cbc = pipeopt.solve(inst, **opts), pipeopt.solve(inst, **opts, solver="cbc")
    assert auto.info["solver"] == "highs" and cbc.info["solver"] == "cbc"
    assert auto.status == cbc.status == "optimal" and auto.objective == pytest.approx(cbc.objective, rel=1e-9)
    part = pipeopt.solve(inst, stages=2, method="milp", time_limit=None)
    assert part.info["solver"] == "cbc"
    rows = solve_schedules(inst, 4, 8, ["1F1B"], time_limit=None)  # --schedule auto's path takes "auto" too
    assert rows[0].info["solver"] == "highs"
    with pytest.raises(InvalidProblemError, match=r"unknown solver 'gurobi'; choose from \['cbc', 'highs', 'auto'\]"):
        pipeopt.solve(inst, **opts, solver="gurobi")
