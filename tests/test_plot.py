"""Every figure renders and writes a non-empty PNG; bad benchmark rows raise typed errors."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
from conftest import profile
from matplotlib.figure import Figure

from pipeopt import Cluster, PartitionProblem, Plan, evaluate
from pipeopt.errors import InvalidPlanError, InvalidProblemError
from pipeopt.problems.partition.dp import solve_dp
from pipeopt.plot import BENCH_COLUMNS, plot_gaps, plot_plan, plot_schedule, plot_solve_times
from pipeopt.simulate import simulate

PNG = b"\x89PNG\r\n\x1a\n"


def written(path) -> bool:
    data = path.read_bytes()
    return data.startswith(PNG) and len(data) > 5000


@pytest.fixture(scope="module")
def vgg():
    inst = profile("vgg16")
    return inst, solve_dp(PartitionProblem(inst, 4)).plan


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "async", "split"])
def test_plot_schedule(tmp_path, vgg, schedule):
    inst, plan = vgg
    if schedule == "split":
        ev = evaluate(inst, plan)  # beta = F / (F + B): both lanes take F + B
        plan = Plan(tuple(dataclasses.replace(st, beta={"gpu": f / (f + b)})
                          for st, f, b in zip(plan.stages, ev.forward_time, ev.backward_time, strict=True)))
    sim = simulate(inst, plan, schedule=schedule, microbatches=6)
    out = tmp_path / f"{schedule}.png"
    fig = plot_schedule(sim, out)
    assert isinstance(fig, Figure) and written(out)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "stage 0", "link 0-1", "stage 1", "link 1-2", "stage 2", "link 2-3", "stage 3"]
    bars = sum(len(c.get_paths()) for c in ax.collections)
    drawn = [e for e in sim.events if e.end > e.start]
    if schedule != "async":
        assert bars == len(drawn)  # one bar per event with a duration
    else:  # a long run: only the first M + 2 S microbatches' span is drawn
        assert 0 < bars < len(drawn)


def test_plot_schedule_replicas_and_no_save(vgg):
    inst = profile("resnet50")
    res = solve_dp(PartitionProblem(inst, 6, replication=True))
    sim = simulate(inst, res.plan, schedule="1f1b", microbatches=6)
    fig = plot_schedule(sim, labels=False, until=sim.iteration_time / 2, title="half")
    names = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert sum(n.startswith("stage") for n in names) == sum(st.replicas for st in res.plan.stages)
    assert fig.axes[0].get_title() == "half"


def test_plot_plan(tmp_path, vgg):
    inst, plan = vgg
    out = tmp_path / "plan.png"
    fig = plot_plan(inst, plan, out)
    assert isinstance(fig, Figure) and written(out) and len(fig.axes) == 3
    # with a memory limit the capacity is drawn; a replicated plan labels its replicas
    tight = inst.replace(cluster=Cluster.homogeneous(16, memory=20e9))
    res = solve_dp(PartitionProblem(tight, 6, replication=True))
    fig = plot_plan(tight, res.plan, tmp_path / "rep.png")
    assert written(tmp_path / "rep.png")
    labels = [t.get_text() for t in fig.axes[1].get_xticklabels()]
    assert any(" x" in lab for lab in labels) == any(st.replicas > 1 for st in res.plan.stages)
    with pytest.raises(InvalidPlanError):
        plot_plan(inst, Plan(plan.stages[:2]))


def bench_rows() -> pd.DataFrame:
    rows = []
    for inst, S in [("vgg16", 4), ("vgg16", 8), ("gnmt", 4)]:
        for method, space, gap, status, t in [
            ("dp", "one-order", 0.0, "optimal", 0.002),
            ("milp", "one-order", 0.0, "time_limit", 5.0),
            ("uniform", "one-order", 31.5, "feasible", 0.001),
            ("mcmc", "one-order", 2.5, "feasible", 0.4),
            ("pipedream", "replicated-one-order", math.nan, "feasible", 0.05),
            ("time_balanced", "one-order", math.nan, "error", 0.0),
        ]:
            rows.append({"instance": inst, "stages": S, "method": method, "space": space, "objective": 0.1,
                         "lower_bound": 0.1 if method == "dp" else math.nan, "gap": gap, "status": status,
                         "runtime": t})
    return pd.DataFrame(rows)


def test_plot_gaps_and_solve_times(tmp_path):
    df = bench_rows()
    for fn, name in ((plot_gaps, "gaps.png"), (plot_solve_times, "times.png")):
        fig = fn(df, tmp_path / name)
        assert isinstance(fig, Figure) and written(tmp_path / name)
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["gnmt\nS=4", "vgg16\nS=4", "vgg16\nS=8"]
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "uniform (one-order)" in legend and "pipedream (replicated-one-order)" in legend
    gaps = plot_gaps(df).axes[0]
    heights = sorted({round(p.get_height(), 6) for p in gaps.patches})
    assert heights == [0.0, 2.5, 31.5]
    assert sum(t.get_text() == "n/a" for t in gaps.texts) == 2 * 3  # no bound: pipedream, error row
    assert plot_solve_times(df).axes[0].get_yscale() == "log"


def test_bench_rows_must_have_the_columns():
    df = bench_rows().drop(columns=["gap"])
    with pytest.raises(InvalidProblemError, match="gap"):
        plot_gaps(df)
    with pytest.raises(InvalidProblemError, match="no benchmark rows"):
        plot_solve_times(pd.DataFrame(columns=list(BENCH_COLUMNS)))
