"""A tied parameter's gradient sums (pipeopt.cost.rules.tie_sum_time): a stage whose backward
holds k >= 2 of the tie's layers sums their gradient contributions k - 1 times per microbatch
(autograd, out of place). evaluate charges it, the simulator follows evaluate, the DP and the
event-time MILP equal the brute force with it, and the methods whose models read the work as
prefix sums (probe, the bottleneck MILP, CP-SAT) refuse where it can differ between splits."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import brute_force as bf
from strategies import chain_instance, tied_instances

from pipeopt import Instance, evaluate, solve
from pipeopt.cost import rules
from pipeopt.cost.ties import ChainTies, ties_of
from pipeopt.errors import InvalidGraphError, InvalidProblemError, PipeoptError
from pipeopt.io import native
from pipeopt.problems.partition import PartitionProblem
from pipeopt.simulate import simulate

SUM = 2.5e-3


def _tied(layers, sum_s=None, **kw):
    base = chain_instance([1e-3, 2e-3, 1e-3, 3e-3, 1e-3], act=1e7, param=2e7, bandwidth=1e10, microbatches=4, **kw)
    g = base.graph.copy()
    tie = {"name": "emb.weight", "bytes": 1e7, "state_bytes": 4e7, "layers": list(layers)}
    if sum_s is not None:
        tie["sum_s"] = sum_s
    g.graph["tied"] = [tie]
    return base, Instance(g, base.cluster, base.settings, name="tied")


def test_rule():
    assert rules.tie_sum_time(0, 2.0) == 0.0 and rules.tie_sum_time(1, 2.0) == 0.0
    assert rules.tie_sum_time(2, 2.0) == 2.0 and rules.tie_sum_time(3, 2.0) == 4.0
    assert list(rules.tie_sum_time([1, 2, 4], 0.5)) == [0.0, 0.5, 1.5]


def test_evaluate_by_hand():
    base, inst = _tied(["l1", "l3"], {"gpu": SUM})
    p = PartitionProblem(inst, 1)
    one, one0 = evaluate(inst, p.plan([])), evaluate(base, p.plan([]))
    assert one.bottleneck == pytest.approx(one0.bottleneck + SUM)  # one stage: both users, one sum per microbatch
    assert one.tied[0]["sum_s"] == pytest.approx(SUM)
    assert one.iteration_time == pytest.approx(one0.iteration_time + 4 * SUM)  # M = 4, one stage: no overlap
    p2 = PartitionProblem(inst, 2)
    apart, together = p2.plan([2]), p2.plan([4])  # l1 | l3 on two stages; l0..l3 | l4: both on stage 0
    assert evaluate(inst, apart).tied[0]["sum_s"] == 0.0
    ev, ev0 = evaluate(inst, together), evaluate(base, together)
    assert ev.tied[0]["sum_s"] == pytest.approx(SUM)
    assert ev.backward_time[0] == pytest.approx(ev0.backward_time[0] + SUM) and ev.backward_time[1] == ev0.backward_time[1]
    # measured on another kind only: nothing on these gpus
    _, other = _tied(["l1", "l3"], {"cpu": SUM})
    assert evaluate(other, p.plan([])).bottleneck == pytest.approx(one0.bottleneck)


@pytest.mark.parametrize("objective", ["bottleneck", "iteration"])
def test_the_sum_moves_the_optimum(objective):
    """Layers of 1, 1, 1, 1, 4 ms (forward; the backward the same): without the sum the best
    two-stage split is l0..l3 | l4; with a 3 ms sum on the tie of l1 and l3 it is l0..l2 | l3 l4.
    Every exact method that answers finds the latter, as the brute force does."""
    base = chain_instance([1e-3, 1e-3, 1e-3, 1e-3, 4e-3], bandwidth=1e12, microbatches=4, objective=objective)
    g = base.graph.copy()
    g.graph["tied"] = [{"name": "w", "bytes": 0.0, "state_bytes": 0.0, "layers": ["l1", "l3"], "sum_s": {"gpu": 3e-3}}]
    inst = Instance(g, base.cluster, base.settings, name="tied")
    assert solve(base, method="auto", stages=2).plan.stages[0].layers == ("l0", "l1", "l2", "l3")
    best = _brute(inst, 2)
    for method in ("auto", "dp", "milp") if objective == "bottleneck" else ("auto", "milp"):
        try:
            res = solve(inst, method=method, stages=2, time_limit=None)
        except InvalidProblemError as exc:
            assert method == "milp" and objective == "bottleneck" and "'dp'" in str(exc)
            continue
        assert res.status.value == "optimal" and res.plan.stages[0].layers == ("l0", "l1", "l2"), method
        assert res.objective == pytest.approx(best, rel=1e-9) == pytest.approx(evaluate(inst, res.plan).objective)


def test_simulator_follows():
    _, inst = _tied(["l1", "l3"], {"gpu": SUM})
    for S, starts in ((1, []), (2, [4]), (2, [2]), (3, [3, 4])):
        plan = PartitionProblem(inst, S).plan(starts)
        sim, ev = simulate(inst, plan), evaluate(inst, plan)
        assert sim.iteration_time == pytest.approx(ev.iteration_time, rel=1e-9)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(inst=tied_instances(memory=False, sums=True), data=st.data())
def test_simulator_equals_evaluate_on_random_tied_chains(inst, data):
    """The simulated 1F1B and GPipe iterations (ties' all-reduce after the flush, their sums on the
    stages holding two users) equal evaluate's, and the 1F1B steady state its bottleneck; straight
    and replicated plans on up to 4 workers."""
    workers = data.draw(st.integers(1, min(inst.chain.n, 4)))
    plan = data.draw(st.sampled_from(list(bf.partition_plans(inst, workers, data.draw(st.booleans())))))
    S = plan.num_stages
    M = data.draw(st.integers(S, 3 * S))
    for schedule, objective in (("1f1b", "iteration"), ("gpipe", "gpipe")):
        i2 = inst.with_settings(objective=objective, microbatches=M, weight_stashing=False)
        ev, sim = evaluate(i2, plan), simulate(i2, plan, schedule=schedule, microbatches=M)
        assert sim.iteration_time == pytest.approx(ev.objective, rel=1e-9, abs=1e-15), schedule
    ev = evaluate(inst, plan)
    if ev.bottleneck > 0:
        assert simulate(inst, plan, microbatches=M).time_per_microbatch == pytest.approx(ev.bottleneck, rel=1e-7)


def test_chain_ties_counts_and_binding():
    _, inst = _tied(["l0", "l4"], {"gpu": SUM})
    ct = ChainTies(inst.chain, ties_of(inst.graph))
    assert [list(u) for u in ct.users([0, 0, 1], [5, 4, 5])] == [[2, 1, 1]]
    assert ct.sums_bind(5, 1) == ["emb.weight"] and ct.sums_bind(5, 2) == []  # the ends: only one stage holds both
    _, mid = _tied(["l1", "l2"], {"gpu": SUM})
    assert ChainTies(mid.chain, ties_of(mid.graph)).sums_bind(5, 4) == ["emb.weight"]
    _, unmeasured = _tied(["l1", "l2"])
    assert ChainTies(unmeasured.chain, ties_of(unmeasured.graph)).sums_bind(5, 2) == []


@pytest.mark.parametrize("method", ["probe", "milp", "cpsat"])
def test_prefix_methods_refuse_where_the_sums_can_differ(method):
    _, inst = _tied(["l1", "l3"], {"gpu": SUM})
    with pytest.raises(InvalidProblemError, match="'dp'"):
        solve(inst, method=method, stages=2)
    res = solve(inst, method=method, stages=1)  # one split: its sums are in its one stage time
    assert res.objective == pytest.approx(evaluate(inst, res.plan).objective, rel=1e-9)
    _, ends = _tied(["l0", "l4"], {"gpu": SUM})  # two stages never hold both ends
    res = solve(ends, method=method, stages=2)
    assert res.objective == pytest.approx(evaluate(ends, res.plan).objective, rel=1e-9)


def _brute(inst, S, replication=False):
    """The best evaluated objective over every plan that fits (tests/brute_force.py; inf if none)."""
    return bf.optimum(inst, bf.partition_plans(inst, S, replication)).value


@pytest.mark.parametrize("objective", ["bottleneck", "iteration"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=tied_instances(sums=True))
def test_exact_methods_equal_brute_force(inst, objective):
    inst = inst.with_settings(objective=objective)
    ct = ChainTies(inst.chain, ties_of(inst.graph))
    for S in (1, 2, 3):
        if S > inst.chain.n:
            continue
        best = _brute(inst, S)
        methods = ("auto", "dp", "probe", "milp", "cpsat") if objective == "bottleneck" else ("auto", "milp")
        for method in methods:
            try:
                res = solve(inst, method=method, stages=S, time_limit=None)
            except InvalidProblemError as exc:
                if "gradient sums" in str(exc):  # refused exactly where the sums can differ between splits
                    assert method in ("probe", "milp", "cpsat") and S >= 2 and ct.sums_bind(inst.chain.n, S)
                    continue
                assert not math.isfinite(best), f"{method} refused a solvable instance: {exc}"
                continue
            except PipeoptError as exc:
                assert not math.isfinite(best), f"{method} refused a solvable instance: {exc}"
                continue
            ev = evaluate(inst, res.plan)
            assert ev.feasible and res.status.value == "optimal", (method, S, res.status)
            assert res.objective == pytest.approx(ev.objective, rel=1e-9)
            assert res.objective == pytest.approx(best, rel=1e-6, abs=1e-12), (method, S)


@pytest.mark.parametrize("users", [["l0", "l2"], ["l3", "l4"]])
def test_replicated_dp_equals_brute_force(users):
    """Replication: without the sum the best plan is l0..l2 on one worker | l3 l4 on three; a
    20 ms sum on a tie inside either stage moves the optimum, and the replicated DP finds the
    brute force's (every stage count, split and replica count). With replication one stage may
    hold the whole chain, so probe refuses even a tie on the chain's two ends."""
    base = chain_instance([1e-3, 1e-3, 1e-3, 8e-3, 1e-3], act=1e7, param=2e5, bandwidth=1e10, microbatches=4, devices=4)
    plain = solve(base, method="dp", stages=4, replication=True).plan
    assert [(st.layers, st.replicas) for st in plain.stages] == [(("l0", "l1", "l2"), 1), (("l3", "l4"), 3)]

    def tied(layers):
        g = base.graph.copy()
        g.graph["tied"] = [{"name": "w", "bytes": 1e5, "state_bytes": 4e5, "layers": layers, "sum_s": {"gpu": 2e-2}}]
        return Instance(g, base.cluster, base.settings, name="tied")

    inst = tied(users)
    best = _brute(inst, 4, replication=True)  # every stage count, split and replica count
    res = solve(inst, method="dp", stages=4, replication=True)
    assert res.plan != plain and evaluate(inst, plain).objective > best * (1 + 1e-6)  # the sum moved it
    assert res.status.value == "optimal" and res.objective == pytest.approx(best, rel=1e-9)
    assert res.objective == pytest.approx(evaluate(inst, res.plan).objective, rel=1e-9)
    with pytest.raises(InvalidProblemError, match="'dp'"):
        solve(tied(["l0", "l4"]), method="probe", stages=4, replication=True)


def test_printed_with_every_result():
    _, inst = _tied(["l1", "l3"], {"gpu": SUM})
    assert any("sums their gradients" in line and "2.5 ms on gpu" in line for line in inst.cost_terms)
    _, plain = _tied(["l1", "l3"])
    assert not any("sums their gradients" in line for line in plain.cost_terms)


def test_native_round_trip_and_bad_sums():
    _, inst = _tied(["l1", "l3"], {"gpu": SUM})
    back = native.from_dict(json.loads(native.dumps(inst)))
    assert ties_of(back.graph)[0].sum_on("gpu") == SUM
    plan = PartitionProblem(inst, 1).plan([])
    assert evaluate(back, plan).bottleneck == pytest.approx(evaluate(inst, plan).bottleneck)
    for bad in ({"gpu": -1.0}, {"gpu": math.nan}, [SUM], {"gpu": "x"}):
        g = inst.graph.copy()
        g.graph["tied"] = [dict(g.graph["tied"][0], sum_s=bad)]
        with pytest.raises(InvalidGraphError, match="sum_s"):
            ties_of(g)
    json.dumps(inst.graph.graph["tied"])  # plain JSON
