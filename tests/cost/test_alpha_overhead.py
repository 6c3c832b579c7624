"""The two optional cost terms of issue 24: the per-message latency alpha beside the bandwidth
(alpha-beta communication, :func:`pipeopt.cost.rules.transfer_time`) and the stage overhead
(:func:`pipeopt.cost.rules.stage_overhead`). Defaults leave every result unchanged; with them,
evaluate = simulate = the executor, and the exact partition methods = brute force."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import brute_force, chain_instance, instances

from pipeopt import Cluster, PartitionProblem, evaluate, solve
from pipeopt.simulate import simulate
from pipeopt.cost import rules
from pipeopt.errors import InfeasibleError, InvalidClusterError, InvalidGraphError, InvalidProblemError
from pipeopt.io.native import from_dict, to_dict
from pipeopt.units import parse_latency

ALPHA, BW = 2e-3, 1e9
OVER = {"forward": 1e-3, "backward": 4e-3}


def _chain(latency=0.0, overhead=None, **kw):
    inst = chain_instance([0.01, 0.02, 0.03, 0.01], [0.02, 0.04, 0.05, 0.02], out=[1e6, 2e6, 0.0, 5e5],
                          act=1e6, param=1e6, bandwidth=BW, devices=4, **kw)
    inst = inst.replace(cluster=inst.cluster.with_overrides(latency=latency))
    if overhead:
        inst.graph.graph["stage_overhead"] = dict(overhead)
    return inst


# ---- the rules -------------------------------------------------------------------------------
def test_transfer_time_is_alpha_plus_bytes_over_beta_and_zero_bytes_is_no_message():
    assert rules.transfer_time(0.0, BW, 1, ALPHA) == 0.0
    assert rules.transfer_time(1e6, BW, 1, ALPHA) == pytest.approx(ALPHA + 1e-3, rel=1e-15)
    assert rules.transfer_time(1e6, BW, 2, ALPHA) == pytest.approx(ALPHA + 5e-4, rel=1e-15)  # alpha once
    got = rules.transfer_time(np.array([0.0, 1e6]), BW, 1, ALPHA)
    assert got.tolist() == pytest.approx([0.0, ALPHA + 1e-3])
    assert rules.transfer_time(1e6, BW) == 1e6 / BW  # no latency: the bandwidth-only rule, bit for bit
    # a round trip is two messages; the busier direction one
    assert rules.round_trip(1e6, 3e6, BW, ALPHA) == pytest.approx(2 * ALPHA + 4e-3)
    assert rules.round_trip(1e6, 0.0, BW, ALPHA) == pytest.approx(ALPHA + 1e-3)
    assert rules.cut_time(1e6, 3e6, BW, 1, ALPHA) == pytest.approx(ALPHA + 3e-3)
    # a ring all-reduce over m workers: 2 (m - 1) steps, one message each
    assert rules.allreduce_time(3e6, 3, BW, ALPHA) == pytest.approx(4 * ALPHA + 4e-3)
    assert rules.allreduce_time(0.0, 3, BW, ALPHA) == 0.0
    assert rules.allreduce_time(3e6, 1, BW, ALPHA) == 0.0


def test_stage_compute_adds_the_overhead_once_per_pass():
    f, b, tau = rules.stage_compute({"gpu": 2.0}, {"gpu": 0.02}, {"gpu": 0.04}, None, (1e-3, 4e-3))
    assert (f, b, tau) == pytest.approx((0.011, 0.024, 0.035))
    f, b, tau = rules.stage_compute({"gpu": 2.0}, {"gpu": 0.02}, {"gpu": 0.04}, {"gpu": 0.5}, (1e-3, 4e-3))
    assert (f, b, tau) == pytest.approx((0.021, 0.044, 0.044))


@pytest.mark.parametrize("bad", [{"forward": -1.0}, {"forward": math.nan}, {"fwd": 1.0}, [1, 2], "x",
                                 {"backward": math.inf}])
def test_a_bad_stage_overhead_is_a_typed_error(bad):
    inst = _chain()
    inst.graph.graph["stage_overhead"] = bad
    with pytest.raises(InvalidGraphError, match="stage_overhead"):
        evaluate(inst, PartitionProblem(inst, 2).plan([2]))


# ---- the cluster field -------------------------------------------------------------------------
def test_latency_is_validated_parsed_and_defaults_to_zero():
    assert Cluster.homogeneous(2).latency == 0.0
    assert Cluster.homogeneous(2, latency="0.3ms").latency == pytest.approx(3e-4)
    assert Cluster.homogeneous(2).with_overrides(latency="300us").latency == pytest.approx(3e-4)
    assert parse_latency("3e-4") == pytest.approx(3e-4) and parse_latency("1 s") == 1.0
    for bad in (-1e-3, math.inf, math.nan, True, "1h", "-2ms", None):
        with pytest.raises(InvalidClusterError, match="latency"):
            Cluster.homogeneous(2, latency=bad)


def test_latency_and_overhead_survive_the_instance_file():
    inst = _chain(ALPHA, OVER)
    d = json.loads(json.dumps(to_dict(inst)))
    assert d["cluster"]["latency"] == ALPHA
    back = from_dict(d)
    assert back.cluster.latency == ALPHA and back.graph.graph["stage_overhead"] == OVER
    plain = to_dict(_chain())
    assert "latency" not in plain["cluster"]  # every existing file is written as before
    assert from_dict(plain).cluster.latency == 0.0
    d["cluster"]["latency"] = "-1ms"
    with pytest.raises(InvalidClusterError, match="latency"):
        from_dict(d)


# ---- evaluate, simulate, the executor ------------------------------------------------------
@pytest.mark.parametrize("overlap", [True, False])
def test_evaluate_includes_alpha_and_the_overhead(overlap):
    inst = _chain(ALPHA, OVER).with_settings(overlap=overlap)
    plan = PartitionProblem(inst, 2).plan([2])
    ev = evaluate(inst, plan)
    base = evaluate(_chain().with_settings(overlap=overlap), plan)
    x = ALPHA + 2e6 / BW  # layer l1's 2e6 bytes cross the cut: one message each way
    assert ev.pipeline["x"] == pytest.approx([x] if overlap else [0.0])
    assert ev.comm_time == pytest.approx([x])
    sent = [x, 0.0] if not overlap else [0.0, 0.0]
    for s in range(2):
        assert ev.forward_op[s] == pytest.approx(base.forward_op[s] - (0 if overlap else [2e-3, 0][s]) + 1e-3
                                                 + sent[s])
    assert ev.backward_op[1] == pytest.approx(base.backward_op[1] - (0 if overlap else 2e-3) + 4e-3
                                              + (0 if overlap else x))
    # the terms print with every result
    res = solve(inst, problem="partition", method="dp", stages=2)
    lines = " ".join(res.info["assumptions"])
    assert "2 ms of latency" in lines and "stage_overhead" in lines
    assert _chain().cost_terms == ()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(inst=instances(max_layers=6, memory=False, alpha=True), data=st.data())
def test_evaluate_equals_simulate_with_alpha_and_overhead(inst, data):
    n = inst.chain.n
    S = data.draw(st.integers(1, min(n, 4)))
    starts = sorted(data.draw(st.sets(st.integers(1, n - 1), min_size=S - 1, max_size=S - 1))) if S > 1 else []
    plan = PartitionProblem(inst, S).plan(starts)
    M = data.draw(st.integers(1, 6))
    for objective, schedule in (("iteration", "1f1b"), ("gpipe", "gpipe")):
        ev = evaluate(inst.with_settings(objective=objective, microbatches=M), plan)
        sim = simulate(inst, plan, schedule=schedule, microbatches=M)
        assert math.isclose(sim.iteration_time, ev.objective, rel_tol=1e-9, abs_tol=1e-12)


# ---- the exact methods: brute force with alpha and the overhead --------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(inst=instances(max_layers=6, alpha=True), S=st.integers(1, 3),
       objective=st.sampled_from(["bottleneck", "iteration"]))
def test_exact_partition_methods_equal_brute_force_with_alpha_and_overhead(inst, S, objective):
    S = min(S, inst.chain.n)
    inst = inst.with_settings(objective=objective, microbatches=3)
    best = brute_force(PartitionProblem(inst, S))
    methods = ["dp", "probe", "milp", "cpsat", "convex"] if objective == "bottleneck" else ["milp", "auto"]
    for method in methods:
        try:
            res = solve(inst, problem="partition", method=method, stages=S, time_limit=None)
        except InfeasibleError:
            assert math.isinf(best), method
            continue
        assert math.isclose(res.objective, evaluate(inst, res.plan).objective, rel_tol=1e-9, abs_tol=1e-12)
        if method == "convex":  # a larger space (every convex split): at most the straight optimum
            assert res.objective <= best * (1 + 1e-7) + 1e-12
            continue
        assert math.isclose(res.objective, best, rel_tol=1e-7, abs_tol=1e-12), (method, res.objective, best)
        assert res.lower_bound <= best * (1 + 1e-7) + 1e-12


def test_exact_methods_that_do_not_model_a_term_refuse_it():
    inst = _chain(ALPHA)
    with pytest.raises(InvalidProblemError, match="does not model a message latency"):
        solve(inst, problem="bipartition", method="milp", stages=2)
    with pytest.raises(InvalidProblemError, match="does not model a stage overhead"):
        solve(_chain(0.0, OVER), problem="partition", method="convex_milp", stages=2)
    assert solve(inst, problem="bipartition", method="greedy", stages=2).plan is not None  # heuristics score it
    replicated = PartitionProblem(inst, 2, replication=True)
    for method in ("probe", "convex"):
        with pytest.raises(InvalidProblemError, match="with replication does not model a message latency"):
            solve(inst, problem="partition", method=method, stages=2, replication=True)
    dp = solve(inst, problem="partition", method="dp", stages=2, replication=True, time_limit=None)
    assert math.isclose(dp.objective, brute_force(replicated), rel_tol=1e-9)
    # zero terms: every method as before
    assert solve(_chain(), problem="bipartition", method="milp", stages=2, time_limit=None).plan is not None


def test_the_cli_takes_latency(tmp_path, capsys):
    from pipeopt.cli import main
    from pipeopt.io.native import write_instance

    path = write_instance(_chain(), tmp_path / "c.json")
    assert main(["solve", str(path), "--stages", "2", "--latency", "2ms"]) == 0
    assert "2 ms of latency" in capsys.readouterr().out
    assert main(["solve", str(path), "--stages", "2", "--latency=-2ms"]) != 0
    assert "latency must be a finite number of seconds >= 0" in capsys.readouterr().err
