"""Search spaces: which contains which, and the bench's gaps taken only against a bound of the
same or a larger space (issue 21)."""

from __future__ import annotations

import math

import networkx as nx
import pandas as pd
import pytest

from pipeopt import Cluster, Instance, Settings, bench, registry, rowlog
from pipeopt.problems import spaces
from pipeopt.problems.spaces import BIPARTITION, CONVEX, ONE_ORDER, REPLICATED_CONVEX, REPLICATED_ONE_ORDER, SPLIT
from pipeopt.solve import solve

SEQUENTIAL = spaces.SEQUENTIAL

# (big, small): True where every plan of small is a plan of big
CONTAINS = {
    (ONE_ORDER, ONE_ORDER): True,
    (CONVEX, ONE_ORDER): True,
    (REPLICATED_ONE_ORDER, ONE_ORDER): True,
    (REPLICATED_CONVEX, ONE_ORDER): True,
    (ONE_ORDER, CONVEX): False,
    (CONVEX, CONVEX): True,
    (REPLICATED_ONE_ORDER, CONVEX): False,
    (REPLICATED_CONVEX, CONVEX): True,
    (ONE_ORDER, REPLICATED_ONE_ORDER): False,
    (CONVEX, REPLICATED_ONE_ORDER): False,
    (REPLICATED_ONE_ORDER, REPLICATED_ONE_ORDER): True,
    (REPLICATED_CONVEX, REPLICATED_ONE_ORDER): True,
    (ONE_ORDER, REPLICATED_CONVEX): False,
    (CONVEX, REPLICATED_CONVEX): False,
    (REPLICATED_ONE_ORDER, REPLICATED_CONVEX): False,
    (REPLICATED_CONVEX, REPLICATED_CONVEX): True,
}


def test_names():
    assert (ONE_ORDER, REPLICATED_ONE_ORDER, CONVEX, REPLICATED_CONVEX) == (
        "one-order", "replicated-one-order", "convex", "replicated-convex")
    assert spaces.SPLIT_SPACES == (ONE_ORDER, REPLICATED_ONE_ORDER, CONVEX, REPLICATED_CONVEX)


@pytest.mark.parametrize("big,small", sorted(CONTAINS), ids=lambda s: s)
def test_contains_table(big, small):
    assert spaces.contains(big, small) is CONTAINS[(big, small)]


def test_contains_is_a_partial_order():
    names = list(spaces.SPACES) + ["something-else"]
    for a in names:
        assert spaces.contains(a, a)
        for b in names:
            if a != b and spaces.contains(a, b):
                assert not spaces.contains(b, a), (a, b)
            for c in names:
                if spaces.contains(a, b) and spaces.contains(b, c):
                    assert spaces.contains(a, c), (a, b, c)


@pytest.mark.parametrize("other", [SPLIT, SEQUENTIAL, BIPARTITION, "schedule", "unknown"])
def test_other_spaces_compare_only_with_themselves(other):
    assert spaces.contains(other, other)
    for name in [*spaces.SPACES, "unknown2"]:
        if name != other:
            assert not spaces.contains(other, name) and not spaces.contains(name, other), name


def test_every_registered_method_states_a_known_space():
    for m in registry.METHODS:
        assert m.space == spaces.AUTO or m.space in spaces.SPACES, (m.problem, m.name, m.space)


def test_legacy_names_are_read_as_the_new_ones():
    assert spaces.canonical("straight") == ONE_ORDER
    assert spaces.canonical("replicated") == REPLICATED_ONE_ORDER
    assert spaces.canonical("replicated-convex") == REPLICATED_CONVEX
    assert spaces.canonical(SPLIT) == SPLIT


# ---- the gaps: bounds of the same or a larger space only ----------------------------------------


def _row(method, space, objective, lower_bound=math.nan, *, exact=False, status=None, problem="partition",
         instance="tiny", stages=2, workers=math.nan):
    return {"instance": instance, "layers": 4, "units": 4, "problem": problem, "stages": stages, "workers": workers,
            "method": method, "exact": exact, "space": space,
            "status": status or ("optimal" if exact else "feasible"), "objective_name": "bottleneck",
            "objective": objective, "simulated": objective, "lower_bound": lower_bound, "runtime": 0.1, "note": ""}


def _gaps(rows) -> pd.DataFrame:
    df = bench.add_gaps(pd.DataFrame(rows))
    assert list(df.columns) == bench.COLUMNS
    return df.set_index("method")


def test_one_order_row_takes_the_larger_convex_bound():
    """A one-order exact method stopped at its limit (bound 8) and a convex optimum (bound 9):
    9 bounds every one-order plan too, so the one-order rows' gaps are taken against it."""
    df = _gaps([
        _row("milp", ONE_ORDER, 11.0, 8.0, exact=True, status="time_limit"),
        _row("convex", CONVEX, 9.0, 9.0, exact=True),
        _row("uniform", ONE_ORDER, 12.0),
    ])
    assert df.loc["uniform", "best_bound"] == 9.0
    assert df.loc["uniform", "gap"] == pytest.approx(25.0)
    assert df.loc["milp", "best_bound"] == 9.0
    assert df.loc["milp", "gap"] == pytest.approx(100 * 2 / 11)
    assert df.loc["convex", "best_bound"] == 9.0 and df.loc["convex", "gap"] == 0.0


def test_convex_row_gets_no_gap_from_a_one_order_bound():
    """A one-order optimum (10) is no bound on a convex plan (which may be better): no gap."""
    df = _gaps([
        _row("dp", ONE_ORDER, 10.0, 10.0, exact=True),
        _row("convex_heuristic", CONVEX, 11.0),
        _row("pipedream", REPLICATED_CONVEX, 9.5),
        _row("uniform", ONE_ORDER, 12.0),
    ])
    assert math.isnan(df.loc["convex_heuristic", "best_bound"]) and math.isnan(df.loc["convex_heuristic", "gap"])
    assert math.isnan(df.loc["pipedream", "best_bound"]) and math.isnan(df.loc["pipedream", "gap"])
    assert df.loc["uniform", "best_bound"] == 10.0
    assert df.loc["uniform", "gap"] == pytest.approx(100 / 6)


def test_the_largest_containing_bound_and_only_the_same_case():
    """Replicated rows take replicated-one-order and replicated-convex bounds, not convex ones;
    bounds of another instance, size or problem never count; nor does a heuristic's own bound."""
    df = _gaps([
        _row("dp", REPLICATED_ONE_ORDER, 7.0, 7.0, exact=True),
        _row("rc", REPLICATED_CONVEX, 7.5, 6.5, exact=True, status="time_limit"),
        _row("convex", CONVEX, 9.0, 9.0, exact=True),
        _row("pipedream", REPLICATED_ONE_ORDER, 8.0),
        _row("pipedream_dag", REPLICATED_CONVEX, 8.0),
        _row("other_size", REPLICATED_ONE_ORDER, 8.0, stages=4),
        _row("liar", CONVEX, 20.0, 19.0),  # a heuristic's bound proves nothing
    ])
    assert df.loc["pipedream", "best_bound"] == 7.0
    assert df.loc["pipedream_dag", "best_bound"] == 6.5
    assert df.loc["rc", "best_bound"] == 6.5
    assert math.isnan(df.loc["other_size", "best_bound"])
    assert df.loc["liar", "best_bound"] == 9.0


def test_other_problems_compare_only_equal_spaces():
    df = _gaps([
        _row("lp", SPLIT, 5.0, 5.0, exact=True, problem="allocate"),
        _row("theorem", SPLIT, 6.0, problem="allocate"),
        _row("sequential", SEQUENTIAL, 8.0, problem="allocate"),
        _row("milp", BIPARTITION, 4.0, 4.0, exact=True, problem="bipartition"),
        _row("greedy", BIPARTITION, 5.0, problem="bipartition"),
    ])
    assert df.loc["theorem", "best_bound"] == 5.0
    assert math.isnan(df.loc["sequential", "gap"])
    assert df.loc["greedy", "best_bound"] == 4.0


def test_gaps_with_a_repeated_index():
    """Rows concatenated without ignore_index still get their own bounds."""
    a = pd.DataFrame([_row("dp", ONE_ORDER, 10.0, 10.0, exact=True), _row("uniform", ONE_ORDER, 12.0)])
    b = pd.DataFrame([_row("convex", CONVEX, 9.0, 9.0, exact=True), _row("h", CONVEX, 12.0)])
    df = bench.add_gaps(pd.concat([a, b]))
    assert list(df["best_bound"]) == [10.0, 10.0, 9.0, 9.0]


def test_legacy_rows_load_with_the_new_names(tmp_path):
    df = bench.add_gaps(pd.DataFrame([_row("dp", "straight", 10.0, 10.0, exact=True),
                                      _row("pipedream", "replicated", 12.0)]))
    back = bench.load_rows(bench.save_rows(df, tmp_path / "old.csv"))
    assert list(back["space"]) == [ONE_ORDER, REPLICATED_ONE_ORDER]


def test_resume_keeps_a_row_of_a_larger_space_than_its_task(tmp_path):
    """PipeDream's replicated-one-order task may return a replicated-convex plan; the DP's
    one-order task never takes the replicated-one-order row of the other DP task."""
    k_dp = rowlog.key("tiny", "partition", 2, None, "dp")
    k_pd = rowlog.key("tiny", "partition", 2, None, "pipedream")
    path = tmp_path / "rows.csv"
    bench.save_rows(bench.add_gaps(pd.DataFrame([_row("dp", REPLICATED_ONE_ORDER, 7.0, 7.0, exact=True),
                                                 _row("pipedream", REPLICATED_CONVEX, 8.0)])), path)
    tasks = [(k_dp, ONE_ORDER), (k_dp, REPLICATED_ONE_ORDER), (k_pd, REPLICATED_ONE_ORDER)]
    kept = rowlog.resume(path, tasks, bench.load_rows)
    assert sorted(kept) == [1, 2]
    assert kept[1]["space"] == REPLICATED_ONE_ORDER and kept[2]["space"] == REPLICATED_CONVEX


# ---- a real bench run on a tiny DAG -------------------------------------------------------------


def diamond() -> Instance:
    """a -> b, c -> d on 2 GPUs: the convex split {a, c} | {b, d} (20 ms) is not contiguous in
    the layer order a, b, c, d, whose best split is 28 ms."""
    g = nx.DiGraph()
    for name, t in {"a": 1e-3, "b": 5e-3, "c": 9e-3, "d": 5e-3}.items():
        g.add_node(name, fwd={"gpu": t}, bwd={"gpu": t}, out_bytes=1e3, act_bytes=1e3, param_bytes=1e3)
    g.add_edges_from([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    return Instance(g, Cluster.homogeneous(2, memory=math.inf, bandwidth=1e10), Settings(), name="diamond")


def test_result_states_its_space():
    inst = diamond()
    res = solve(inst, method="dp", stages=2)
    assert res.space == ONE_ORDER and res.info["space"] == ONE_ORDER
    assert "space one-order" in res.summary().splitlines()[0] and "space one-order" in str(res)
    assert res.to_dict()["space"] == ONE_ORDER
    rep = solve(inst, method="dp", stages=2, replication=True)
    assert rep.space == rep.info["space"] == REPLICATED_ONE_ORDER


@pytest.mark.skipif("convex" not in [m.name for m in registry.methods("partition")],
                    reason="no exact method of the convex space registered")
def test_bench_takes_a_one_order_gap_against_the_convex_bound():
    inst = diamond()
    df = bench.run([inst], stages=[2], methods=["convex", "uniform"], progress=False)
    df = df.set_index(["method", "space"])
    convex = df.loc[("convex", CONVEX)]
    assert convex["status"] == "optimal" and convex["lower_bound"] == pytest.approx(20e-3, rel=1e-3)
    uniform = df.loc[("uniform", ONE_ORDER)]
    assert uniform["objective"] == pytest.approx(28e-3, rel=1e-3)
    assert uniform["best_bound"] == convex["lower_bound"]
    assert uniform["gap"] == pytest.approx(100 * (uniform["objective"] - convex["lower_bound"]) / uniform["objective"])
    assert "convex" in bench.table(df.reset_index())

    # with the one-order DP in the run, the one-order rows take its (larger) bound, the convex row its own
    both = bench.run([inst], stages=[2], methods=["dp", "convex", "uniform", "pipedream"], progress=False)
    both = both.set_index(["method", "space"])
    assert both.loc[("uniform", ONE_ORDER), "best_bound"] == pytest.approx(28e-3, rel=1e-3)
    assert both.loc[("convex", CONVEX), "best_bound"] == pytest.approx(20e-3, rel=1e-3)
    # every row's bound comes from an exact row of the same or a larger space
    exact = both[both["exact"].astype(bool)]
    for (method, space), row in both.iterrows():
        bounds = [b for (_, s), b in exact["lower_bound"].items() if spaces.contains(s, space)]
        assert row["best_bound"] == pytest.approx(max(bounds)) if bounds else math.isnan(row["best_bound"])


def test_a_schedule_order_lies_in_its_free_w_space_and_not_the_other_way():
    assert spaces.contains("schedule:ZBVZeroBubble+free-w", "schedule:ZBVZeroBubble")
    assert not spaces.contains("schedule:ZBVZeroBubble", "schedule:ZBVZeroBubble+free-w")
    assert not spaces.contains("schedule:InterleavedZeroBubble+free-w", "schedule:ZBVZeroBubble")
    assert not spaces.contains("schedule:1F1B+free-w", spaces.ONE_ORDER)


def test_recompute_spaces():
    """A split without recomputation lies in the per-layer recompute space; every layer
    recomputed is one choice of it and is disjoint from the splits without recomputation."""
    assert spaces.contains(spaces.ONE_ORDER_RECOMPUTE, ONE_ORDER)
    assert spaces.contains(spaces.ONE_ORDER_RECOMPUTE, spaces.ONE_ORDER_FULL_RECOMPUTE)
    assert spaces.contains(spaces.REPLICATED_ONE_ORDER_RECOMPUTE, REPLICATED_ONE_ORDER)
    assert not spaces.contains(ONE_ORDER, spaces.ONE_ORDER_RECOMPUTE)
    assert not spaces.contains(spaces.ONE_ORDER_FULL_RECOMPUTE, ONE_ORDER)
    assert not spaces.contains(ONE_ORDER, spaces.ONE_ORDER_FULL_RECOMPUTE)
    assert not spaces.contains(CONVEX, spaces.ONE_ORDER_RECOMPUTE)
    assert spaces.with_recompute(ONE_ORDER, "none") == ONE_ORDER
    assert spaces.with_recompute(ONE_ORDER, "auto") == spaces.ONE_ORDER_RECOMPUTE
    assert spaces.with_recompute(REPLICATED_ONE_ORDER, "full") == spaces.REPLICATED_ONE_ORDER_FULL_RECOMPUTE
    assert all(s in spaces.SPACES for s in spaces.RECOMPUTE_SPACES)
