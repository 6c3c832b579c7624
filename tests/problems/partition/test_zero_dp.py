"""Data parallelism and ZeRO in the partition DP (issue 25, 3): with ``Settings.zero`` 0..3,
``dp`` 1..4 and non-zero training-state ratios, the DP (``recompute`` none and auto, straight
and replicated) equals the brute force over every split (times every recompute choice) scored
by :func:`pipeopt.evaluate` (tests/brute_force.py); its claimed objective is evaluate's; memory
binding exactly at capacity; ``auto`` runs the DP; the other exact methods refuse, naming dp."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brute_force import partition_optimum, recompute_optimum, recompute_plans
from pipeopt import Cluster, Instance, Settings, evaluate, solve
from pipeopt.errors import InfeasibleError, InvalidProblemError
from pipeopt.problems.partition.dp import solve_dp
from pipeopt.problems.partition.problem import PartitionProblem
from pipeopt.result import Status
from strategies import binding_memory, chain_graph, zero_chains

REL = 1e-9


def _instance(fwd, act, param, S, memory, state: dict, latency=0.0, collective=None):
    g = chain_graph(fwd, [2 * f for f in fwd], out=1e7, act=act, param=param)
    cluster = Cluster.homogeneous(S, kind="gpu", memory=memory, bandwidth=1e8, latency=latency)
    return Instance(g, cluster.with_overrides(collective_bandwidth=collective), Settings(**state), name="zero")


@st.composite
def cases(draw, max_layers: int = 5):
    """A small random chain with ZeRO settings whose memory sits where it binds: between the least
    fullest-stage memory of the plans recomputing every layer and of those recomputing none (brute
    force, the ZeRO stage's sharded state included)."""
    n = draw(st.integers(3, max_layers))
    S = draw(st.integers(2, n - 1))
    fwd, act, param, state, latency = draw(zero_chains(n))
    collective = draw(st.sampled_from([None, 4e7]))  # ZeRO's collectives at the link's rate or slower
    free = _instance(fwd, act, param, S, math.inf, state, latency, collective)
    every = min(max(evaluate(free, p).memory) for p in recompute_plans(free, S, forced=True))
    none = min(max(evaluate(free, p).memory) for p in recompute_plans(free, S)
               if not any(s.recompute for s in p.stages))
    memory = binding_memory(draw, every, none)
    return _instance(fwd, act, param, S, memory, state, latency, collective), S


def _check(inst, res, value):
    """Optimal, equal to the brute force's and evaluate's objective, a plan that fits."""
    assert res.status == Status.OPTIMAL
    ev = evaluate(inst, res.plan)
    assert ev.feasible
    assert res.objective == pytest.approx(ev.objective, rel=REL)
    assert res.info["dp_value"] == pytest.approx(ev.objective, rel=REL)
    assert res.objective == pytest.approx(value, rel=REL)
    assert res.lower_bound <= res.objective * (1 + REL)
    assert res.info["zero"]["zero"] == inst.settings.zero


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_dp_equals_brute_force(case):
    inst, S = case
    for rc in ("none", "auto"):
        bf = recompute_optimum(inst, S) if rc == "auto" else partition_optimum(inst, S)
        try:
            res = solve(inst, method="dp", stages=S, recompute=rc)
        except InfeasibleError:
            assert not bf.exists, (rc, bf.value)
            continue
        assert bf.exists
        _check(inst, res, bf.value)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(max_layers=4))
def test_replicated_dp_equals_brute_force(case):
    """PipeDream replication beside the pipeline's data parallelism: a stage on m replicas keeps
    ceil(W / m) microbatches, its ZeRO collectives join each replica's ops."""
    inst, S = case
    for rc in ("none", "auto"):
        bf = recompute_optimum(inst, S, replication=True) if rc == "auto" else partition_optimum(inst, S, replication=True)
        try:
            res = solve_dp(PartitionProblem(inst, S, replication=True, recompute=rc))
        except InfeasibleError:
            assert not bf.exists
            continue
        _check(inst, res, bf.value)


FWD, ACT, PARAM = [1.0, 2.0, 3.0, 1.0, 2.0], [5e8, 4e8, 6e8, 3e8, 2e8], [1e8, 1.5e8, 5e7, 1e8, 1e8]
ADAM = {"gradient_ratio": 1.0, "optimizer_ratio": 6.0}


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_memory_exactly_at_capacity(zero):
    """Capacity = the fullest stage of the optimum with recompute=auto: the plan still fits, and the
    DP finds the brute force's optimum at that capacity."""
    state = {"zero": zero, "dp": 4, **ADAM}
    base = _instance(FWD, ACT, PARAM, 3, 3.0e9, state)
    plan = solve_dp(PartitionProblem(base, 3, recompute="auto")).plan
    cap = max(evaluate(base, plan).memory)
    inst = _instance(FWD, ACT, PARAM, 3, cap, state)
    assert evaluate(inst, plan).feasible
    for rc, bf in (("auto", recompute_optimum(inst, 3)), ("none", partition_optimum(inst, 3))):
        try:
            res = solve(inst, method="auto", stages=3, recompute=rc)
        except InfeasibleError:
            assert not bf.exists
            continue
        assert res.method == "dp"
        _check(inst, res, bf.value)


def test_sharding_frees_memory_for_fewer_recomputed_layers():
    """The same chain and capacity: ZeRO-1 over 4 replicas leaves room that ZeRO-0 fills with
    recomputation; the DP recomputes fewer layers and is faster (bottleneck: no ZeRO-1 op time)."""
    vals, recomputed = {}, {}
    for zero in (0, 1):
        inst = _instance(FWD, ACT, PARAM, 3, 3.0e9, {"zero": zero, "dp": 4, **ADAM})
        res = solve(inst, stages=3, recompute="auto")
        vals[zero] = res.objective
        recomputed[zero] = sum(len(s.recompute or {}) for s in res.plan.stages)
    assert vals[1] < vals[0] and recomputed[1] < recomputed[0]


def test_other_exact_methods_refuse_naming_dp():
    inst = _instance(FWD, ACT, PARAM, 3, math.inf, {"zero": 2, "dp": 2, **ADAM})
    for method in ("probe", "cpsat", "convex"):
        with pytest.raises(InvalidProblemError, match=r"does not model data parallelism.*auto, dp"):
            solve(inst, method=method, stages=3)
    assert solve(inst, method="uniform", stages=3).objective > 0  # heuristics: scored by evaluate


def test_iteration_objective_refused_with_zero():
    """The DP solves the bottleneck only and the MILP does not model ZeRO: auto says so."""
    inst = _instance(FWD, ACT, PARAM, 3, math.inf, {"zero": 1, "dp": 2, "objective": "iteration", **ADAM})
    with pytest.raises(InvalidProblemError, match="does not model data parallelism or ZeRO"):
        solve(inst, stages=3)


@pytest.mark.parametrize("rc", ["none", "auto"])
def test_zero_auto_is_the_best_stage(rc):
    """solve_zero_auto: one exact solve per ZeRO stage, the least kept (ties: the lower stage); it
    equals the brute force over stages x splits (x recompute sets)."""
    from pipeopt.problems.partition.dp import solve_zero_auto

    base = _instance(FWD, ACT, PARAM, 3, 2.6e9, {"dp": 4, **ADAM}, latency=0.01)
    res = solve_zero_auto(base, stages=3, recompute=rc)
    per = {}
    for z in range(4):
        inst = base.with_settings(zero=z)
        per[z] = (recompute_optimum(inst, 3) if rc == "auto" else partition_optimum(inst, 3)).value
    best = min(per.values())
    chosen = res.info["zero_auto"]["chosen"]
    assert chosen == min(z for z in per if per[z] == best)
    assert res.status == Status.OPTIMAL
    assert res.objective == pytest.approx(best, rel=REL)
    assert res.objective == pytest.approx(evaluate(base.with_settings(zero=chosen), res.plan).objective, rel=REL)
    for z, v in res.info["zero_auto"]["stages"].items():
        assert (v == "infeasible") if not math.isfinite(per[z]) else v == pytest.approx(per[z], rel=REL)
    with pytest.raises(InvalidProblemError, match="dp and auto"):
        solve_zero_auto(base, method="probe", stages=3)


def test_cli_zero_auto(tmp_path, capsys):
    import json

    from pipeopt.cli import main
    from pipeopt.io import write

    path = write(_instance(FWD, ACT, PARAM, 3, 2.6e9, {}), tmp_path / "z.json")
    args = ["--stages", "3", "--zero", "auto", "--dp", "4", "--gradient-ratio", "1", "--optimizer-ratio", "6"]
    assert main(["solve", str(path), *args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    chosen = out["info"]["zero_auto"]["chosen"]
    assert any(f"ZeRO-{chosen}" in a for a in out["info"]["assumptions"])
    assert main(["solve", str(path), *args]) == 0
    assert f"ZeRO stage chosen: {chosen}" in capsys.readouterr().out
    assert main(["simulate", str(path), *args]) == 2
    assert "--zero auto" in capsys.readouterr().err
