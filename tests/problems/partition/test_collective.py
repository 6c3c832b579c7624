"""The collectives' bus bandwidth (:attr:`pipeopt.Cluster.collective_bandwidth`): every rule
that all-reduces (replicas, tied weights, ZeRO) reads it, so the exact methods and the
evaluation agree with it set, and a slower collective changes the replicated optimum. The
random cross-checks draw it too (``strategies.instances(alpha=True)``, ``tied_instances``)."""

from __future__ import annotations

import math

import pytest
from conftest import profile

from pipeopt import Cluster, PartitionProblem, evaluate
from pipeopt.cost import rules
from pipeopt.errors import InvalidClusterError
from pipeopt.problems.partition.dp import solve_dp
from pipeopt.problems.partition.milp import solve_milp
from pipeopt.problems.partition.probe import solve_probe
from pipeopt.problems.partition.problem import is_close


def test_the_default_is_the_link_and_a_new_link_drops_a_measured_collective():
    cl = Cluster.homogeneous(2, bandwidth=1e10)
    assert cl.collective_bandwidth is None and cl.bus_bandwidth == 1e10
    slow = cl.with_overrides(collective_bandwidth="2GB/s")
    assert slow.bus_bandwidth == 2e9 and slow.bandwidth == 1e10
    assert slow.with_overrides(latency=1e-4).bus_bandwidth == 2e9  # kept
    assert slow.with_overrides(bandwidth=5e9).bus_bandwidth == 5e9  # measured on the old link: dropped
    with pytest.raises(InvalidClusterError, match="bandwidth"):
        cl.with_overrides(collective_bandwidth=-1.0)


def test_the_replicas_all_reduce_runs_at_the_bus_bandwidth():
    inst = profile("vgg16")
    slow = inst.replace(cluster=inst.cluster.with_overrides(collective_bandwidth=inst.cluster.bandwidth / 8))
    changed = False
    for S in (4, 8):
        fast = solve_dp(PartitionProblem(inst, S, replication=True))
        res = {m: f(PartitionProblem(slow, S, replication=True)) for m, f in (("dp", solve_dp), ("probe", solve_probe))}
        for r in res.values():
            assert is_close(r.objective, evaluate(slow, r.plan).objective)  # claimed = the evaluation
        assert is_close(res["dp"].objective, res["probe"].objective)  # two exact methods, one optimum
        assert res["dp"].objective >= fast.objective * (1 - 1e-9)  # slower collectives never help
        if any(st.replicas > 1 for st in fast.plan.stages):  # the evaluation charges the bus bandwidth
            assert evaluate(slow, fast.plan).objective > fast.objective * (1 + 1e-9)
        changed |= not is_close(res["dp"].objective, fast.objective)
    assert changed  # on vgg16 the optimum moves


def test_a_tie_sync_runs_at_the_bus_bandwidth():
    from strategies import chain_instance

    inst = chain_instance([1e-3] * 4, param=[1e6] * 4, devices=2, bandwidth=1e10, objective="iteration",
                          microbatches=4)
    inst.graph.graph["tied"] = [{"name": "emb.weight", "bytes": 4e8, "state_bytes": 1.6e9, "layers": ["l0", "l3"]}]
    slow = inst.replace(cluster=inst.cluster.with_overrides(collective_bandwidth=2.5e9))
    for one in (inst, slow):
        res = solve_milp(PartitionProblem(one, 2), time_limit=None)
        ev = evaluate(one, res.plan)
        assert is_close(res.objective, ev.objective)
        held = ev.tied[0]["stages"]
        expected = float(rules.tie_sync_time(4e8, len(held), one.cluster.bus_bandwidth)) if len(held) > 1 else 0.0
        assert ev.tie_sync == pytest.approx(expected)
    assert solve_milp(PartitionProblem(slow, 2), time_limit=None).objective >= \
        solve_milp(PartitionProblem(inst, 2), time_limit=None).objective * (1 - 1e-9)
    assert math.isfinite(evaluate(slow, res.plan).objective)
