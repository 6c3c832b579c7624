"""Data parallelism and ZeRO in the one cost model (issue 25, 3): ``Settings.zero``, ``dp``,
``gradient_ratio``, ``optimizer_ratio``. Hand-computed memory and time per ZeRO stage, the
defaults leave today's model unchanged, evaluate = simulate on random chains, the JSON round
trip, and the typed refusals (settings, exact methods, the schedules' chunk times)."""

from __future__ import annotations

import math

import numpy as np

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import chain_instance, layer_graphs

import pipeopt
from pipeopt import Cluster, Instance, InvalidPlanError, Plan, Settings, Stage, evaluate
from pipeopt.cost import rules
from pipeopt.cost.passes import pass_times
from pipeopt.errors import InvalidProblemError
from pipeopt.schedules import make_schedule, run_schedule
from pipeopt.simulate import simulate

REL = 1e-9


def close(a, b):
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-12)


def inst(**kw):
    """l0 -> l1 -> l2 on 2 GPUs at 10 B/s: weights 40, 60, 100 B, activations 100, 200, 300 B."""
    return chain_instance([1.0, 2.0, 3.0], [2.0, 4.0, 6.0], out=[10.0, 20.0, 30.0], act=[100.0, 200.0, 300.0],
                          param=[40.0, 60.0, 100.0], devices=2, bandwidth=10.0, **kw)


PLAN = Plan((Stage(("l0", "l1"), ("gpu0",)), Stage(("l2",), ("gpu1",))))
STATE = {"dp": 4, "gradient_ratio": 1.0, "optimizer_ratio": 2.0}


def test_ring_collectives():
    # 3 steps of 25 B at 10 B/s, plus 3 messages' latency
    assert rules.ring_collective_time(100.0, 4, 10.0) == 7.5
    assert rules.ring_collective_time(100.0, 4, 10.0, 1.0) == 10.5
    assert 2 * rules.ring_collective_time(100.0, 4, 10.0) == rules.allreduce_time(100.0, 4, 10.0)
    assert rules.ring_collective_time(100.0, 1, 10.0) == 0.0


@pytest.mark.parametrize(("zero", "stage0"), [(0, 1000.0), (1, 850.0), (2, 775.0), (3, 745.0)])
def test_memory_per_zero_stage(zero, stage0):
    """Stage 0 keeps 2 microbatches of 300 B and 100 B of weights: gradients 100 B and
    optimizer state 200 B, ZeRO-1 shards the optimizer state over 4 (50), ZeRO-2 also the
    gradients (25), ZeRO-3 also the weights (25) plus l1's 60 B gathered while it runs (45 of
    them from the other shards)."""
    ev = evaluate(inst(zero=zero, **STATE), PLAN)
    assert ev.memory[0] == stage0
    assert ev.state[0] == stage0 - 700.0


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_time_per_zero_stage(zero):
    base = evaluate(inst(objective="iteration"), PLAN)
    ev = evaluate(inst(zero=zero, objective="iteration", **STATE), PLAN)
    c = 7.5  # one ring reduce-scatter or all-gather of a stage's 100 B over 4 replicas
    add_f, add_b, sync = {0: (0, 0, 2 * c), 1: (0, 0, 2 * c), 2: (0, c, c), 3: (c, 2 * c, 0)}[zero]
    assert ev.forward_op == [f + add_f for f in base.forward_op]
    assert ev.backward_op == [b + add_b for b in base.backward_op]
    assert ev.dp_sync == sync
    if zero < 2:  # the same ops: only the synchronisation after the flush
        assert close(ev.objective, base.objective + sync) and ev.bottleneck == base.bottleneck


def test_defaults_are_todays_model():
    s = Settings()
    assert (s.zero, s.dp, s.gradient_ratio, s.optimizer_ratio) == (0, 1, 0.0, 0.0) and not s.data_parallel
    ev = evaluate(inst(), PLAN)
    assert ev.state == [] and ev.dp_sync == 0.0 and ev.memory == [2 * 300.0 + 100.0, 300.0 + 100.0]
    # ZeRO on one replica shards nothing and synchronises nothing
    one = evaluate(inst(zero=3, dp=1), PLAN)
    assert one.memory == ev.memory and one.forward_op == ev.forward_op and one.dp_sync == 0.0
    assert inst().cost_terms == ()
    assert "ZeRO-2" in inst(zero=2, **STATE).cost_terms[0]


@st.composite
def zero_cases(draw):
    g = draw(layer_graphs(min_layers=2, max_layers=6))
    for v in g.nodes:
        g.nodes[v]["out_bytes"] = draw(st.floats(0.0, 0.05)) * 1e9
        g.nodes[v]["param_bytes"] = draw(st.floats(0.0, 0.05)) * 1e9
    M = draw(st.integers(1, 6))
    s = Settings(overlap=draw(st.booleans()), microbatches=M, zero=draw(st.integers(0, 3)), dp=draw(st.integers(1, 8)),
                 gradient_ratio=draw(st.sampled_from([0.0, 1.0])), optimizer_ratio=draw(st.sampled_from([0.0, 2.0, 6.0])))
    instance = Instance(g, Cluster.homogeneous(4, bandwidth=1e9, latency=draw(st.sampled_from([0.0, 1e-3]))), s)
    n = instance.chain.n
    S = draw(st.integers(1, min(n, 4)))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), min_size=S - 1, max_size=S - 1))) if S > 1 else []
    plan = Plan(tuple(Stage(layers, (f"gpu{i}",)) for i, layers in enumerate(instance.chain.stages_from_cuts(cuts))))
    return instance, plan, M


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=zero_cases())
def test_evaluate_equals_simulate(case):
    instance, plan, M = case
    ev = evaluate(instance, plan)
    sim = simulate(instance, plan, schedule="1f1b", microbatches=M)
    assert close(sim.time_per_microbatch, ev.bottleneck)
    assert close(sim.iteration_time, ev.iteration_time)
    assert close(simulate(instance, plan, schedule="gpipe", microbatches=M).iteration_time, ev.gpipe_time)
    for name, analytic in (("GPipe", ev.gpipe_time), ("1F1B", ev.iteration_time)):  # the schedule executor
        assert close(run_schedule(instance, make_schedule(name, plan.num_stages, M), plan).time, analytic), name
    if M >= plan.num_stages:
        assert sim.peak_memory == pytest.approx(ev.memory, rel=REL)
        ex = run_schedule(instance, make_schedule("1F1B", plan.num_stages, M), plan)
        assert list(ex.memory) == pytest.approx(ev.memory, rel=REL)
    # memory: one weight copy and the activations, plus the sharded state
    g = instance.graph
    s = instance.settings
    for i, stg in enumerate(plan.stages):
        P = sum(g.nodes[x]["param_bytes"] for x in stg.layers)
        acts = sum(g.nodes[x]["act_bytes"] for x in stg.layers)
        state = rules.sharded_state(P, max(g.nodes[x]["param_bytes"] for x in stg.layers),
                                    gradient_ratio=s.gradient_ratio, optimizer_ratio=s.optimizer_ratio,
                                    zero=s.zero, dp=s.dp)
        assert ev.memory[i] == pytest.approx(ev.in_flight[i] * acts + P + state, rel=REL)


def test_json_round_trip(tmp_path):
    from pipeopt import io

    a = inst(zero=2, **STATE)
    b = io.read(io.write(a, tmp_path / "zero.json"))
    assert b.settings == a.settings
    assert evaluate(b, PLAN).memory == evaluate(a, PLAN).memory
    assert '"zero"' not in (io.write(inst(), tmp_path / "plain.json")).read_text()  # defaults: not written


def test_typed_refusals():
    for bad, match in ((dict(zero=4), "ZeRO stage"), (dict(dp=0), "positive integer"),
                       (dict(gradient_ratio=-1.0), "gradient_ratio"), (dict(optimizer_ratio=math.inf), "optimizer_ratio"),
                       (dict(zero=3, weight_stashing=True), "weight stashing")):
        with pytest.raises(InvalidProblemError, match=match):
            Settings(**bad)
    with pytest.raises(InvalidProblemError, match=r"does not model data parallelism.*\(auto, dp, milp\)"):
        pipeopt.solve(inst(zero=1, **STATE), stages=2, method="probe")  # dp, auto and milp model it
    with pytest.raises(InvalidPlanError):
        evaluate(inst(zero=1, **STATE), Plan((Stage(("l0",), ("gpu0",)),)))  # still a plan check first


def test_cli_zero_and_dp(tmp_path, capsys):
    import json

    from pipeopt import io
    from pipeopt.cli import main

    path = io.write(inst(), tmp_path / "three.json")
    assert main(["solve", str(path), "--stages", "2", "--method", "probe", "--zero", "1", "--dp", "4"]) == 2
    assert "does not model data parallelism" in capsys.readouterr().err
    args = ["--stages", "2", "--method", "uniform", "--zero", "2", "--dp", "4", "--gradient-ratio", "1",
            "--optimizer-ratio", "2"]
    assert main(["solve", str(path), *args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any("ZeRO-2" in a for a in out["info"]["assumptions"])
    assert main(["simulate", str(path), *args, "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["peak_memory"] == [775.0, 475.0]  # uniform's split is PLAN's: test_memory_per_zero_stage
    assert sim["peak_memory"] == evaluate(inst(zero=2, **STATE), PLAN).memory


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_split_backward_zero_collectives(zero):
    """ZeRO-3's all-gathers join F and I, ZeRO-2/3's reduce-scatter joins W (it follows the
    weight gradient); a rank's synchronisation after the flush is in the executor's time."""
    plain = pass_times(inst(), PLAN)
    t = pass_times(inst(zero=zero, **STATE), PLAN)
    c = 7.5
    gather, scatter = (c if zero == 3 else 0.0), (c if zero >= 2 else 0.0)
    assert t.forward == tuple(f + gather for f in plain.forward)
    assert t.weight_grad == pytest.approx([w + scatter for w in plain.weight_grad], rel=1e-12)
    assert t.input_grad == pytest.approx([i + gather for i in plain.input_grad], rel=1e-12)
    assert t.sync == ((2 * c, 2 * c) if zero < 2 else (c, c) if zero == 2 else (0.0, 0.0))
    s = make_schedule("ZBVZeroBubble", 1, 4)  # both chunks on one rank: it synchronises them one after the other
    one_rank = Plan(tuple(Stage(st.layers, ("gpu0",)) for st in PLAN.stages))
    ex = run_schedule(inst(zero=zero, **STATE), s, one_rank)
    base = run_schedule(inst(zero=zero, **STATE).with_settings(dp=1), s, one_rank)
    assert ex.time >= base.time + sum(pass_times(inst(zero=zero, **STATE), one_rank).sync) * (1 - REL)


def test_zero_with_recomputation():
    """The two add up: stage 0 keeps 2 x 110 B (l1 recomputed) + 190 B of re-created activations
    while l1's backward runs + 100 B of weights + ZeRO-3's state 25 + 25 + 50 + 45 - 100 = 45 B."""
    plan = Plan((Stage(("l0", "l1"), ("gpu0",), recompute={"l1": "full"}), Stage(("l2",), ("gpu1",))))
    instance = inst(zero=3, microbatches=4, **STATE)
    ev = evaluate(instance, plan)
    assert ev.memory[0] == 2 * 110.0 + 190.0 + 100.0 + 45.0
    assert simulate(instance, plan, microbatches=4).peak_memory == pytest.approx(ev.memory, rel=REL)
    assert list(run_schedule(instance, make_schedule("1F1B", 2, 4), plan).memory) == pytest.approx(ev.memory, rel=REL)
    assert close(run_schedule(instance, make_schedule("1F1B", 2, 4), plan).time, ev.iteration_time)


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=zero_cases(), tie=st.booleans())
def test_cost_table_terms_are_evaluates(case, tie):
    """CostTable.sharded_state, zero_ops and zero_sync of each stage are evaluate's."""
    from pipeopt.cost.table import CostTable

    instance, plan, M = case
    g = instance.graph.copy()
    if tie:  # the first and the last layer share a weight (GPT-2's embedding and head)
        first, last = plan.stages[0].layers[0], plan.stages[-1].layers[-1]
        g.graph["tied"] = [{"name": "wte", "bytes": 3e7, "state_bytes": 5e7, "layers": [first, last]}]
    instance = instance.replace(graph=g)
    S = plan.num_stages
    table = CostTable(instance, S)
    ev = evaluate(instance, plan)
    plain = evaluate(instance.with_settings(zero=0, dp=1, gradient_ratio=0.0, optimizer_ratio=0.0), plan)
    unit_of = instance.chain.unit_of
    starts = [unit_of[st.layers[0]] for st in plan.stages] + [instance.chain.n]
    for i in range(S):
        a, b = starts[i], starts[i + 1]
        assert table.sharded_state(a, b) == pytest.approx(ev.state[i] if ev.state else 0.0, rel=REL, abs=1e-6)
        zf, zb = table.zero_ops(a, b)
        assert ev.forward_op[i] == pytest.approx(plain.forward_op[i] + zf, rel=REL, abs=1e-12)
        assert ev.backward_op[i] == pytest.approx(plain.backward_op[i] + zb, rel=REL, abs=1e-12)
        assert table.zero_sync(a, b) == pytest.approx(ev.stage_sync[i] if ev.stage_sync else 0.0, rel=REL, abs=1e-12)
    # vectorised over every stage at once
    a, b = np.array(starts[:-1]), np.array(starts[1:])
    assert np.allclose(table.largest_layer(a, b),
                       [max(instance.graph.nodes[x]["param_bytes"] for x in st.layers) for st in plan.stages])
