"""The exact joint choice of split and per-layer recomputation (issue 25): the DP
(:mod:`pipeopt.problems.partition.recompute` frontiers) and the MILP equal the brute force over
every straight split times every recompute choice (tests/brute_force.py), their claimed
objectives are :func:`pipeopt.evaluate`'s, and the edges: memory binding exactly, S = 1 and
S = n, chains that fit only with recomputation or not at all (the error says by how much),
methods that do not model recomputation refuse it, the CLI option."""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brute_force import recompute_optimum, recompute_plans
from pipeopt import Cluster, Instance, Settings, evaluate, solve
from pipeopt.cli import main
from pipeopt.io import write
from pipeopt.errors import InfeasibleError, InvalidProblemError
from pipeopt.problems.partition import recompute as rcmod
from pipeopt.problems.partition.recompute_compare import compare
from pipeopt.problems.partition.dp import solve_dp
from pipeopt.problems.partition.milp import solve_milp
from pipeopt.problems.partition.problem import PartitionProblem
from pipeopt.result import Status
from strategies import chain_graph, chain_instance

REL = 1e-9


def _instance(fwd, act, out, param, S, memory, skips=(), selective=False):
    g = chain_graph(fwd, [2 * f for f in fwd], out=out, act=act, param=param, skips=skips)
    if selective:  # selective keeps half the activations and reruns a third of the forward
        for i, v in enumerate(g.nodes):
            g.nodes[v]["selective"] = {"act_bytes": act[i] / 2, "fwd": {"gpu": fwd[i] / 3}}
    return Instance(g, Cluster.homogeneous(S, kind="gpu", memory=memory, bandwidth=1e9), Settings(), name="rc")


def _least_memory(inst, S, plans) -> float:
    """The least, over ``plans``, of the plan's fullest stage's memory (by evaluate)."""
    return min(max(evaluate(inst, p).memory) for p in plans)


@st.composite
def chains(draw, max_layers: int = 5):
    """A small random chain (sometimes a skip edge) whose memory sits where recomputation matters:
    from a little below the least memory of the plans that recompute every layer to a little above
    the least memory of the plans that recompute none (both by brute force over the splits)."""
    n = draw(st.integers(3, max_layers))
    S = draw(st.integers(2, n - 1))  # S = 1 and S = n (one split only): test_one_stage_and_one_layer_per_stage
    fwd = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]), min_size=n, max_size=n))
    act = draw(st.lists(st.integers(0, 10).map(lambda k: k * 1e8), min_size=n, max_size=n))
    out = draw(st.lists(st.integers(0, 5).map(lambda k: k * 5e7), min_size=n, max_size=n))
    param = draw(st.lists(st.integers(0, 3).map(lambda k: k * 5e7), min_size=n, max_size=n))
    skips = [(0, n - 1)] if n >= 3 and draw(st.booleans()) else []
    selective = draw(st.booleans())
    free = _instance(fwd, act, out, param, S, math.inf, skips, selective)
    everything = _least_memory(free, S, recompute_plans(free, S, forced=True))
    nothing = _least_memory(free, S, (p for p in recompute_plans(free, S) if not any(st.recompute for st in p.stages)))
    lo, hi = min(everything, nothing), max(everything, nothing)
    memory = max(lo + draw(st.floats(-0.05, 1.1)) * (hi - lo), 1e6)
    return _instance(fwd, act, out, param, S, memory, skips, selective), S


def _check(inst, res, value):
    """The result is optimal, its objective equals the brute force's and evaluate's, and its plan
    fits and carries exactly the recompute sets evaluate scores."""
    assert res.status == Status.OPTIMAL
    ev = evaluate(inst, res.plan)
    assert ev.feasible
    assert res.objective == pytest.approx(ev.objective, rel=REL)
    assert res.objective == pytest.approx(value, rel=1e-6 if res.method == "milp" else REL)
    assert res.lower_bound <= res.objective * (1 + 1e-9)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_dp_and_milp_equal_brute_force(case):
    inst, S = case
    modes = ("full", "selective") if all("selective" in inst.graph.nodes[v] for v in inst.graph.nodes) else ("full",)
    for rc in ("full", "auto"):
        bf = recompute_optimum(inst, S, modes=modes, forced=rc == "full")
        for method in (solve_dp, solve_milp):
            kw = {"solver": "highs"} if method is solve_milp else {}
            try:
                res = method(PartitionProblem(inst, S, recompute=rc), time_limit=None, **kw)
            except InfeasibleError:
                assert not bf.exists, (rc, method.__name__, bf.value)
                continue
            assert bf.exists
            _check(inst, res, bf.value)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains(max_layers=4))
def test_replicated_dp_equals_brute_force(case):
    """With PipeDream replication a stage on m replicas keeps ceil(W / m) microbatches per replica
    and its recompute seconds join each replica's busy time."""
    inst, S = case
    inst = Instance(inst.graph, Cluster.homogeneous(S, kind="gpu", memory=inst.cluster.devices[0].memory,
                                                    bandwidth=1e9), Settings(), name="rc")
    modes = ("full", "selective") if all("selective" in inst.graph.nodes[v] for v in inst.graph.nodes) else ("full",)
    bf = recompute_optimum(inst, S, modes=modes, replication=True)
    try:
        res = solve_dp(PartitionProblem(inst, S, replication=True, recompute="auto"))
    except InfeasibleError:
        assert not bf.exists
        return
    _check(inst, res, bf.value)


@st.composite
def transient_chains(draw):
    """A small chain with measured transients (graph attribute transient_memory): backward
    temporaries per layer, tensors two consecutive layers both save (saved_twice_bytes), the
    outputs a stage keeps (M microbatches on the last stage)."""
    inst, S = draw(chains())
    g = inst.graph.copy()
    g.graph["transient_memory"] = True
    names = list(g.nodes)
    for v in names:
        g.nodes[v]["bwd_temp_bytes"] = draw(st.integers(0, 4)) * 1e8
    for u, v in zip(names, names[1:]):
        if draw(st.booleans()):
            share = draw(st.floats(0.0, 1.0))
            g.edges[u, v]["saved_twice_bytes"] = share * min(g.nodes[u]["act_bytes"], g.nodes[v]["act_bytes"])
    free = Instance(g, Cluster.homogeneous(S, kind="gpu", memory=math.inf, bandwidth=1e9),
                    Settings(microbatches=draw(st.integers(1, 6))), name="rc-transient")
    mems = [max(evaluate(free, p).memory) for p in recompute_plans(free, S)]
    memory = min(mems) + draw(st.floats(-0.05, 0.6)) * (max(mems) - min(mems))
    return Instance(g, Cluster.homogeneous(S, kind="gpu", memory=max(memory, 1e6), bandwidth=1e9), free.settings,
                    name="rc-transient"), S


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transient_chains())
def test_dp_with_measured_transients_equals_brute_force(case):
    """The backward's temporaries join the peak of re-created activations, a tensor two
    consecutive layers save is held once only while neither is recomputed (evaluate's rule): the
    DP's frontiers (pruned pairwise then) still give the brute force's optimum."""
    inst, S = case
    modes = ("full", "selective") if all("selective" in inst.graph.nodes[v] for v in inst.graph.nodes) else ("full",)
    for rc in ("full", "auto"):
        bf = recompute_optimum(inst, S, modes=modes, forced=rc == "full")
        try:
            res = solve_dp(PartitionProblem(inst, S, recompute=rc))
        except InfeasibleError:
            assert not bf.exists
            continue
        _check(inst, res, bf.value)


@settings(max_examples=6, deadline=None)
@given(chains(max_layers=4))
def test_milp_cbc_equals_dp(case):
    inst, S = case
    try:
        dp = solve_dp(PartitionProblem(inst, S, recompute="auto"))
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            solve_milp(PartitionProblem(inst, S, recompute="auto"), solver="cbc")
        return
    milp = solve_milp(PartitionProblem(inst, S, recompute="auto"), solver="cbc", time_limit=None)
    assert milp.status == Status.OPTIMAL
    assert milp.objective == pytest.approx(dp.objective, rel=1e-6)


def test_auto_never_worse_than_none_or_full():
    inst = _instance([1, 2, 3, 1, 2], [5e8, 4e8, 6e8, 3e8, 2e8], 1e7, 1e8, 3, 2.0e9)
    vals = {rc: solve_dp(PartitionProblem(inst, 3, recompute=rc)).objective for rc in ("none", "full", "auto")}
    assert vals["auto"] <= min(vals["none"], vals["full"]) * (1 + 1e-12)
    assert vals["auto"] < vals["none"]  # memory binds: recomputation buys a better split


def test_memory_binding_exactly_at_capacity():
    """Capacity set to the exact memory of the optimal plan's fullest stage: the plan still fits
    and both methods find the brute force's optimum at that capacity."""
    base = _instance([1, 2, 3, 1, 2], [5e8, 4e8, 6e8, 3e8, 2e8], 1e7, 1e8, 3, 2.0e9)
    plan = solve_dp(PartitionProblem(base, 3, recompute="auto")).plan
    assert any(st.recompute for st in plan.stages)
    cap = max(evaluate(base, plan).memory)
    inst = _instance([1, 2, 3, 1, 2], [5e8, 4e8, 6e8, 3e8, 2e8], 1e7, 1e8, 3, cap)
    assert evaluate(inst, plan).feasible
    bf = recompute_optimum(inst, 3)
    assert bf.exists
    for method, kw in ((solve_dp, {}), (solve_milp, {"solver": "highs"})):
        _check(inst, method(PartitionProblem(inst, 3, recompute="auto"), **kw), bf.value)


@pytest.mark.parametrize("S", [1, 4])
def test_one_stage_and_one_layer_per_stage(S):
    act = [6e8, 2e8, 9e8, 4e8]
    need = max(evaluate(_instance([1, 1, 1, 1], act, 1e7, 0, S, math.inf), p).memory[0]
               for p in recompute_plans(_instance([1, 1, 1, 1], act, 1e7, 0, S, math.inf), S))
    inst = _instance([1, 2, 1, 3], act, 1e7, 5e7, S, 0.6 * need)
    bf = recompute_optimum(inst, S)
    for method, kw in ((solve_dp, {}), (solve_milp, {"solver": "highs"})):
        try:
            res = method(PartitionProblem(inst, S, recompute="auto"), **kw)
        except InfeasibleError:
            assert not bf.exists
            continue
        _check(inst, res, bf.value)


def test_fits_only_with_recompute():
    inst = _instance([1, 1, 1, 1], [1e9] * 4, 1e7, 0, 2, 1.5e9)
    with pytest.raises(InfeasibleError, match="try recompute='auto'"):
        solve_dp(PartitionProblem(inst, 2))
    res = solve(inst, method="dp", stages=2, recompute="auto")
    assert res.status == Status.OPTIMAL and evaluate(inst, res.plan).feasible
    assert sum(len(st.recompute or {}) for st in res.plan.stages) > 0
    assert res.objective == pytest.approx(recompute_optimum(inst, 2).value, rel=REL)
    full = solve(inst, method="dp", stages=2, recompute="full")
    assert all(set(st.recompute) == set(st.layers) for st in full.plan.stages)
    assert full.objective >= res.objective


def _overshoot(message: str) -> float:
    return float(re.search(r"\(([\d,]+) bytes\)", message).group(1).replace(",", ""))


@pytest.mark.parametrize("rc", ["none", "full", "auto"])
def test_infeasible_says_by_how_much(rc):
    """No plan fits with any recompute set: the error gives the least worst-stage overshoot over
    every split and choice, the brute force's."""
    inst = _instance([1, 1, 1, 1], [4e9, 4e9, 4e9, 4e9], 2e9, 1e8, 2, 3e9)
    with pytest.raises(InfeasibleError, match="misses the limit by") as err:
        solve_dp(PartitionProblem(inst, 2, recompute=rc))
    plans = recompute_plans(inst, 2, forced=rc == "full") if rc != "none" else \
        (p for p in recompute_plans(inst, 2) if not any(st.recompute for st in p.stages))
    least = min(max(evaluate(inst, p).memory) for p in plans) - 3e9
    assert least > 0
    assert _overshoot(str(err.value)) == pytest.approx(least, abs=1.0)
    with pytest.raises(InfeasibleError, match="misses the limit by") as err:
        solve_milp(PartitionProblem(inst, 2, recompute=rc), solver="highs")
    assert _overshoot(str(err.value)) == pytest.approx(least, abs=1.0)


def test_thinned_frontier_claims_no_optimum(monkeypatch):
    inst = _instance([1, 2, 1, 3, 2, 1], [5e8, 4e8, 6e8, 3e8, 2e8, 7e8], 1e7, 1e8, 2, 1.6e9)
    exact = solve_dp(PartitionProblem(inst, 2, recompute="auto"))
    assert exact.status == Status.OPTIMAL and exact.info["recompute"]["exact"]
    monkeypatch.setattr(rcmod, "FRONTIER_LIMIT", 3)
    res = solve_dp(PartitionProblem(inst, 2, recompute="auto"))
    assert res.status == Status.FEASIBLE and not res.info["recompute"]["exact"]
    assert res.objective >= exact.objective * (1 - 1e-12)
    assert res.lower_bound <= exact.objective
    assert evaluate(inst, res.plan).feasible


def test_methods_that_do_not_model_recompute_refuse_it():
    inst = chain_instance([1, 2, 3, 1], act=1e8, memory=1e10, devices=2)
    for method in ("probe", "cpsat", "uniform", "convex"):
        with pytest.raises(InvalidProblemError, match="does not model activation recomputation.*dp"):
            solve(inst, method=method, stages=2, recompute="auto")
    assert solve(inst, stages=2, recompute="auto").method == "dp"  # auto runs the dp
    with pytest.raises(InvalidProblemError, match="recompute must be one of"):
        PartitionProblem(inst, 2, recompute="selective")
    with pytest.raises(InvalidProblemError, match="replicat"):  # the MILP is straight only
        solve_milp(PartitionProblem(inst, 2, replication=True, recompute="full"))


def test_cli_recompute(tmp_path, capsys):
    inst = _instance([1, 1, 1, 1], [1e9] * 4, 1e7, 0, 2, 1.5e9)
    path = tmp_path / "rc.json"
    write(inst, path)
    assert main(["solve", str(path), "--stages", "2", "--recompute", "auto", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any(st["recompute"] for st in out["stage_details"])
    assert main(["solve", str(path), "--stages", "2", "--recompute", "auto", "--method", "probe"]) == 2
    assert "does not model activation recomputation" in capsys.readouterr().err
    from pipeopt import registry

    if "recompute" not in registry.options_of("schedule"):  # a problem that does not take it refuses it
        assert main(["solve", str(path), "--stages", "2", "--recompute", "full", "--schedule", "1f1b"]) == 2
        assert "does not use recompute" in capsys.readouterr().err
    assert main(["solve", str(path), "--stages", "2", "--recompute", "full", "--problem", "joint"]) == 2
    assert "does not use --recompute" in capsys.readouterr().err


def test_selective_where_every_layer_has_it():
    """With every layer's selective profile, auto may pick selective (half the bytes, a third of
    the forward): here it is the cheapest way to fit, and the result is the brute force's."""
    inst = _instance([3, 3, 3, 3], [1e9] * 4, 1e7, 0, 2, 1.6e9, selective=True)
    res = solve_dp(PartitionProblem(inst, 2, recompute="auto"))
    assert res.info["recompute"]["modes"] == ["full", "selective"]
    assert "selective" in {m for st in res.plan.stages for m in (st.recompute or {}).values()}
    _check(inst, res, recompute_optimum(inst, 2, modes=("full", "selective")).value)
    full_only = _instance([3, 3, 3, 3], [1e9] * 4, 1e7, 0, 2, 1.6e9)
    assert solve_dp(PartitionProblem(full_only, 2, recompute="auto")).objective > res.objective


def test_compare_rows():
    inst = _instance([1, 1, 1, 1], [1e9] * 4, 1e7, 0, 2, 1.5e9)
    rows = {r["recompute"]: r for r in compare(inst)}
    assert rows["none"]["status"] == "infeasible" and "misses the limit by" in rows["none"]["error"]
    assert rows["auto"]["status"] == "optimal" and rows["full"]["status"] == "optimal"
    assert rows["auto"]["objective"] <= rows["full"]["objective"]
    assert rows["full"]["recomputed"] == 4
    assert all(s["memory"] <= 1.5e9 * (1 + 1e-9) for s in rows["auto"]["stages"])


@pytest.mark.parametrize("module,function", [("probe", "solve_probe"), ("cpsat", "solve_cpsat"),
                                             ("convex", "solve_convex"), ("convex_milp", "solve_convex_milp")])
@pytest.mark.parametrize("recompute", ["full", "auto"])
def test_exact_methods_without_recompute_refuse_it_when_called_directly(module, function, recompute):
    """pipeopt.solve refuses them first; called directly they must not prove an optimum over the
    splits without recomputation and state it for the recompute space."""
    import importlib

    fn = getattr(importlib.import_module(f"pipeopt.problems.partition.{module}"), function)
    problem = PartitionProblem(chain_instance([1e-3, 2e-3, 1e-3], act=1e6, memory=1e9), 2, recompute=recompute)
    with pytest.raises(InvalidProblemError, match="does not choose activation recomputation"):
        fn(problem, time_limit=None)
