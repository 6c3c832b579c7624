"""Tied parameters (pipeopt.cost.ties): charged on every stage that holds one of their layers,
their gradient all-reduced between those stages after the flush; the exact partition methods
equal the brute force over every split; the others refuse with a typed error."""

from __future__ import annotations

import json
import math

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from strategies import chain_instance, compositions, tied_instances

from pipeopt import Cluster, Instance, Settings, evaluate, solve
from pipeopt.cost import rules
from pipeopt.cost.ties import ChainTies, ties_of
from pipeopt.errors import InvalidGraphError, InvalidProblemError, PipeoptError, ReadError
from pipeopt.io import native
from pipeopt.problems.partition import PartitionProblem

EXACT = ("dp", "probe", "milp", "cpsat")


def _tied(inst, layers, nbytes=1e8, state=4e8):
    g = inst.graph.copy()
    g.graph["tied"] = [{"name": "emb.weight", "bytes": nbytes, "state_bytes": state, "layers": list(layers)}]
    return Instance(g, inst.cluster, inst.settings, name="tied")


def _brute(inst, S):
    """Best evaluated objective over every split that fits (inf if none)."""
    p = PartitionProblem(inst, S)
    best = math.inf
    for starts in compositions(p.n, S):
        ev = evaluate(inst, p.plan(starts))
        if ev.feasible:
            best = min(best, ev.objective)
    return best


def test_memory_and_sync_by_hand():
    base = chain_instance([1e-3] * 4, act=1e8, param=2e8, bandwidth=1e10, microbatches=4)
    inst = _tied(base, ["l0", "l3"])
    p = PartitionProblem(inst, 2)
    apart, together = p.plan([2]), PartitionProblem(inst, 2).plan([1])
    ev, ev0 = evaluate(inst, apart), evaluate(base, apart)
    # 1F1B: stage 0 keeps 2 microbatches, stage 1 one; both hold the tie (l0 on 0, l3 on 1)
    assert ev.memory == pytest.approx([2 * 2e8 + 4e8 + 4e8, 1 * 2e8 + 4e8 + 4e8])
    assert ev.memory[0] - ev0.memory[0] == pytest.approx(4e8) and ev.memory[1] - ev0.memory[1] == pytest.approx(4e8)
    sync = rules.allreduce_time(1e8, 2, 1e10)  # ring all-reduce between the two stages: 2 (2-1)/2 x 1e8 / 1e10
    assert ev.tie_sync == pytest.approx(sync) == pytest.approx(0.01)
    assert ev.tied == [{"name": "emb.weight", "stages": [0, 1], "sync_s": pytest.approx(sync), "sum_s": 0.0}]
    assert ev.iteration_time == pytest.approx(ev0.iteration_time + sync)
    assert ev.gpipe_time == pytest.approx(ev0.gpipe_time + sync)
    assert ev.bottleneck == ev0.bottleneck  # the steady state has no flush: no per-iteration sync
    # a tie on layers of one stage: charged once, nothing to synchronise
    one = _tied(base, ["l0", "l1"])
    ev1 = evaluate(one, together.__class__(apart.stages))
    assert ev1.tie_sync == 0.0 and ev1.memory[1] == pytest.approx(ev0.memory[1])
    assert ev1.memory[0] == pytest.approx(ev0.memory[0] + 4e8)


def test_chain_ties_state_bytes_per_stage():
    inst = _tied(chain_instance([1e-3] * 5), ["l1", "l3"], state=7.0)
    ct = ChainTies(inst.chain, ties_of(inst.graph))
    a = [0, 0, 2, 2, 4, 0]
    b = [1, 2, 3, 4, 5, 5]
    assert list(ct.state_bytes(a, b)) == [0.0, 7.0, 0.0, 7.0, 0.0, 7.0]


@pytest.mark.parametrize("objective", ["bottleneck", "iteration"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=tied_instances())
def test_exact_methods_equal_brute_force(inst, objective):
    inst = inst.with_settings(objective=objective)
    for S in (2, 3):
        if S > inst.chain.n:
            continue
        best = _brute(inst, S)
        methods = EXACT if objective == "bottleneck" else ("milp",)
        for method in methods:
            try:
                res = solve(inst, method=method, stages=S, time_limit=None)
            except PipeoptError as exc:
                assert not math.isfinite(best), f"{method} refused a solvable instance: {exc}"
                continue
            assert math.isfinite(best), f"{method} returned a plan although no split fits"
            _assert_optimal(inst, res, best, (method, S))


def _assert_optimal(inst, res, best, what):
    ev = evaluate(inst, res.plan)
    assert ev.feasible
    assert res.objective == pytest.approx(ev.objective, rel=1e-9)
    assert res.status.value == "optimal", (what, res.status)
    assert res.objective == pytest.approx(best, rel=1e-6, abs=1e-12), what


def _chain(fwd, bwd, out, act, param, tied, bandwidth):
    g = nx.DiGraph()
    for i, row in enumerate(zip(fwd, bwd, out, act, param, strict=True)):
        f, b, o, a, p_ = row
        g.add_node(f"l{i}", fwd={"gpu": f}, bwd={"gpu": b}, out_bytes=o, act_bytes=a, param_bytes=p_)
    nx.add_path(g, list(g))
    g.graph["tied"] = tied
    return Instance(g, Cluster.homogeneous(8, kind="gpu", bandwidth=bandwidth), Settings(microbatches=8, objective="iteration"))


def test_event_milp_on_tiny_backward_times_is_optimal():
    """CBC claimed 0.47680 optimal on this chain (backward times of 1e-12 s and below), against
    0.47357: a MILP with such coefficients now goes to HiGHS (pipeopt.backends.pulp.CBC_TINY)."""
    inst = _chain([0.02103963609989275, 0.007159697021850854, 0.008119888712682722, 0.00161329691285026,
                   0.016415068578685747],
                  [0.022627509784205652, 1e-12, 0.04094343463755365, 1e-06, 4.696746938969052e-263],
                  [44073.0, 21727.0, 225.0, 1000.0, 375.0], [94049167.0, 34.0, 134.0, 399999999.0, 18492.0],
                  [966.0, 55563.0, 7665650.0, 806.0, 473.0],
                  [{"name": "tie0.weight", "bytes": 1736.0, "state_bytes": 6944.0, "layers": ["l1", "l2", "l3"]},
                   {"name": "tie1.weight", "bytes": 133928781.0, "state_bytes": 535715124.0, "layers": ["l0", "l2"]}],
                  1e11)
    res = solve(inst, method="milp", stages=3, time_limit=None)
    _assert_optimal(inst, res, _brute(inst, 3), "events")
    assert res.objective == pytest.approx(0.47357065193813225, rel=1e-9)


def test_event_milp_on_subnormal_times():
    """Every time 0 but one forward of 2.2e-309 s: the model's time unit stays finite
    (pipeopt.backends.scaling.model_unit; a division by zero and a NaN row before)."""
    zeros = [0.0] * 5
    inst = _chain([2.225073858507203e-309, 0.0, 0.0, 0.0, 0.0], zeros, zeros, zeros, zeros,
                  [{"name": "tie0.weight", "bytes": 0.0, "state_bytes": 0.0, "layers": ["l0", "l1"]}], 1e9)
    for S in (2, 3):
        res = solve(inst, method="milp", stages=S, time_limit=None)
        _assert_optimal(inst, res, _brute(inst, S), ("events", S))


def test_replicated_dp_equals_brute_force():
    base = chain_instance([3e-3, 1e-3, 1e-3, 2e-3], act=1e8, param=[3e8, 1e8, 1e8, 2e8], memory=2.2e9,
                          bandwidth=1e10)
    inst = _tied(base, ["l0", "l3"], state=6e8)
    p = PartitionProblem(inst, 3, replication=True)
    from strategies import brute_force

    best = brute_force(p)
    res = solve(inst, method="dp", stages=3, replication=True)
    assert res.objective == pytest.approx(best, rel=1e-9)
    assert res.objective == pytest.approx(evaluate(inst, res.plan).objective, rel=1e-12)


def test_memory_binds_on_the_tie():
    """With the tie the cheapest period's split no longer fits: every exact method moves."""
    base = chain_instance([1e-3] * 6, act=1e8, param=1e8, memory=1.35e9, bandwidth=1e12)
    inst = _tied(base, ["l0", "l5"], state=5e8)
    free = solve(base, method="dp", stages=2)
    for method in EXACT:
        res = solve(inst, method=method, stages=2)
        ev = evaluate(inst, res.plan)
        assert ev.feasible and res.objective == pytest.approx(_brute(inst, 2), rel=1e-9)
    assert not evaluate(inst, free.plan).feasible


@pytest.mark.parametrize("method, kw", [("convex", {}), ("convex_milp", {})])
def test_methods_without_ties_refuse(method, kw):
    inst = _tied(chain_instance([1e-3] * 4), ["l0", "l3"])
    with pytest.raises(InvalidProblemError, match="tied parameters.*dp, probe, milp and cpsat"):
        solve(inst, method=method, stages=2, **kw)


def test_other_problems_refuse():
    from pipeopt.problems.bipartition import BipartitionProblem
    from pipeopt.problems.resource.problem import JointProblem
    from pipeopt.problems.schedule.problem import ScheduleProblem

    inst = _tied(chain_instance([1e-3] * 4), ["l0", "l3"])
    for build in (lambda: BipartitionProblem(inst, 2), lambda: JointProblem(inst, 2),
                  lambda: ScheduleProblem(inst, "1F1B", 2, 4)):
        with pytest.raises(InvalidProblemError, match="tied parameters"):
            build()


def test_native_round_trip_and_bad_ties():
    inst = _tied(chain_instance([1e-3] * 4), ["l0", "l3"])
    back = native.from_dict(json.loads(native.dumps(inst)))
    assert back.graph.graph["tied"] == inst.graph.graph["tied"]
    assert evaluate(back, PartitionProblem(back, 2).plan([2])).tie_sync > 0
    for bad, match in ((["l0"], "two distinct"), (["l0", "zz"], "unknown layer")):
        d = json.loads(native.dumps(inst))
        d["graph"]["attributes"]["tied"][0]["layers"] = bad
        with pytest.raises((ReadError, InvalidGraphError), match=match):
            native.from_dict(d)
    d = json.loads(native.dumps(inst))
    d["graph"]["attributes"]["tied"][0]["bytes"] = -1
    with pytest.raises((ReadError, InvalidGraphError), match="bytes"):
        native.from_dict(d)


def test_unknown_cluster_still_fine():
    """An instance without ties is unchanged (no ``tied`` key, zero sync)."""
    inst = chain_instance([1e-3] * 3)
    ev = evaluate(inst, PartitionProblem(inst, 2).plan([1]))
    assert ev.tie_sync == 0.0 and ev.tied == []
    assert isinstance(Cluster, type) and isinstance(Settings(), Settings)


def test_times_of_1e_203_seconds():
    """A stage's ops split its time by the shares F / (F + B) (``busy * forward`` underflowed to 0
    at 1e-203 s, so evaluate scored such stages 0 and the MILP's bound exceeded the plan's
    objective: a ClaimError the stress run drew), and the models keep their time unit at that
    scale (pipeopt.backends.scaling.UNIT_FLOOR)."""
    inst = chain_instance([3e-203, 1e-203, 2e-203, 5e-203, 1e-203], [1e-203, 4e-203, 1e-203, 2e-203, 3e-203],
                          out=1e-194, bandwidth=1e9)
    p = PartitionProblem(inst, 2)
    ev = evaluate(inst, p.plan([2]))
    for f, b in zip(ev.forward_op, ev.backward_op, strict=True):
        assert f > 0 and b > 0
    assert ev.bottleneck == pytest.approx(1.4e-202, rel=1e-9)
    for S in (2, 3):
        for method in EXACT:
            res = solve(inst, method=method, stages=S, time_limit=None)
            _assert_optimal(inst, res, _brute(inst, S), (method, S))
