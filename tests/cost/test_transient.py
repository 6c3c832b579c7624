"""The measured transients of a stage's memory (pipeopt.cost.transient): the outputs it keeps
(k microbatches; the last stage all M) and its backward's excess over one microbatch's
activations (rules.backward_excess) - the formula's pieces by hand, the table = evaluate, the dense DP = brute force under a finite
memory, the methods that assume an interval refuse; and, on two processes, the prediction
within 10 % of MemTracker on gpt-tiny."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import chain_instance, compositions

from pipeopt import Instance, evaluate, solve
from pipeopt.cost import rules
from pipeopt.cost.transient import ChainTransient
from pipeopt.errors import InfeasibleError, InvalidProblemError
from pipeopt.problems.partition import PartitionProblem


def _with_transient(inst, temps, twice=()):
    g = inst.graph.copy()
    for (n, _), t in zip(g.nodes(data=True), temps, strict=True):
        g.nodes[n]["bwd_temp_bytes"] = float(t)
    for i, t in enumerate(twice):  # l{i} -> l{i+1} both save the tensor between them
        g.edges[f"l{i}", f"l{i + 1}"]["saved_twice_bytes"] = float(t)
    g.graph["transient_memory"] = True
    return Instance(g, inst.cluster, inst.settings, name="transient")


def test_pieces_by_hand():
    base = chain_instance([1e-3] * 4, out=[10.0, 20.0, 30.0, 40.0], act=100.0, param=1000.0, microbatches=6)
    inst = _with_transient(base, [5.0, 50.0, 7.0, 3.0])
    plan = PartitionProblem(inst, 2).plan([2])
    ev, ev0 = evaluate(inst, plan), evaluate(base, plan)
    # stage 0 (l0, l1): k = 2 outputs of l1 kept (20 B each); the backward's excess over one
    # microbatch's activations (200): max(100 + 5, 200 + 50) - 200 = 50 (l1's backward runs while
    # both layers' activations are held)
    # stage 1 (l2, l3, the last): all M = 6 outputs of the model (l3's 40 B); excess
    # max(100 + 7, 200 + 3) - 200 = 3 (l2's larger temporary comes once l3's activations are freed);
    # at the end torch merges the 6 outputs (240 B more) once the k = 1 microbatch's 200 B of
    # activations are freed: max(3, 240 - 200) = 40
    assert ev.transient == [2 * 20.0 + 50.0, 6 * 40.0 + 40.0]
    assert ev.memory == pytest.approx([ev0.memory[0] + 90.0, ev0.memory[1] + 280.0])
    assert float(rules.backward_excess(250.0, 200.0)) == 50.0 and float(rules.backward_excess(150.0, 200.0)) == 0.0
    assert ev0.memory == [2 * 200.0 + 2000.0, 1 * 200.0 + 2000.0]
    assert rules.outputs_kept(2, False, 6) == 2 and rules.outputs_kept(1, True, 6) == 6
    assert rules.transient_memory(20.0, 2, 50.0) == 90.0
    assert float(rules.merged_output(40.0, True, 6)) == 240.0 and float(rules.merged_output(40.0, False, 6)) == 0.0
    assert float(rules.transient_memory(40.0, 6, 3.0, 240.0, 200.0)) == 280.0
    assert float(rules.transient_memory(40.0, 6, 3.0, 240.0, 300.0)) == 243.0  # the backward's excess dominates
    assert ev.bottleneck == ev0.bottleneck and ev.iteration_time == ev0.iteration_time  # memory only
    # l0 -> l1 save one 30 B tensor (inside stage 0: k = 2 copies less), l1 -> l2 another (a cut: both kept)
    both = _with_transient(base, [5.0, 50.0, 7.0, 3.0], twice=[30.0, 30.0, 0.0])
    assert evaluate(both, plan).transient == [90.0 - 2 * 30.0, 280.0]
    assert float(rules.saved_once(2, 30.0)) == -60.0


def test_range_maximum():
    vals = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    inst = _with_transient(chain_instance([1e-3] * len(vals)), vals)
    ct = ChainTransient(inst.chain, inst.graph)
    a, b = np.triu_indices(len(vals) + 1, k=1)
    assert list(ct.peak(a, b)) == [max(vals[i:j]) for i, j in zip(a, b, strict=True)]
    assert ct.peak(3, 3) == 0.0


@pytest.mark.parametrize("S", [2, 3])
def test_table_equals_evaluate(S):
    rng = np.random.default_rng(S)
    n = 6
    base = chain_instance(list(rng.uniform(1e-3, 2e-3, n)), out=list(rng.uniform(0, 1e6, n)),
                          act=list(rng.uniform(0, 1e6, n)), param=list(rng.uniform(0, 1e6, n)), microbatches=5)
    inst = _with_transient(base, rng.uniform(0, 1e6, n), twice=rng.uniform(0, 1e5, n - 1))
    p = PartitionProblem(inst, S)
    for starts in compositions(n, S):
        ev = evaluate(inst, p.plan(starts))
        bounds = [0, *starts, n]
        for t in range(S):
            assert p.stage_memory(bounds[t], bounds[t + 1], p.in_flight(t)) == pytest.approx(ev.memory[t], rel=1e-12)
            assert p.table.stage_memory(bounds[t], bounds[t + 1], t) == pytest.approx(ev.memory[t], rel=1e-12)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_dp_equals_brute_force_under_memory(data):
    n = data.draw(st.integers(3, 7))
    sizes = st.floats(0.0, 1e8, allow_nan=False)
    out = data.draw(st.lists(sizes, min_size=n, max_size=n))
    act = data.draw(st.lists(sizes, min_size=n, max_size=n))
    par = data.draw(st.lists(sizes, min_size=n, max_size=n))
    temps = data.draw(st.lists(sizes, min_size=n, max_size=n))
    fwd = data.draw(st.lists(st.floats(1e-4, 1e-2), min_size=n, max_size=n))
    total = sum(par) + 3 * sum(act) + 4 * sum(out) + max(temps)
    memory = max(data.draw(st.sampled_from([0.25, 0.4, 0.6])) * total, 1.0)
    S = data.draw(st.integers(2, min(3, n)))
    twice = [data.draw(st.floats(0.0, min(act[i], act[i + 1]))) for i in range(n - 1)]
    inst = _with_transient(chain_instance(fwd, out=out, act=act, param=par, memory=memory, bandwidth=1e9,
                                          microbatches=4), temps, twice)
    p = PartitionProblem(inst, S)
    best = math.inf
    for starts in compositions(n, S):
        ev = evaluate(inst, p.plan(starts))
        if ev.feasible:
            best = min(best, ev.objective)
    try:
        res = solve(inst, method="dp", stages=S)
    except InfeasibleError:
        assert best == math.inf
        return
    ev = evaluate(inst, res.plan)
    assert ev.feasible and res.objective == pytest.approx(ev.objective, rel=1e-12)
    assert res.objective == pytest.approx(best, rel=1e-6)


@pytest.mark.parametrize("method", ["probe", "milp", "cpsat", "convex"])
def test_interval_methods_refuse_under_a_finite_memory(method):
    base = chain_instance([1e-3] * 4, out=10.0, act=10.0, param=10.0)
    inst = _with_transient(base, [1.0] * 4)
    res = solve(inst, method=method, stages=2)  # unlimited memory: the terms change no plan
    assert res.objective == pytest.approx(evaluate(inst, res.plan).objective)
    limited = _with_transient(chain_instance([1e-3] * 4, out=10.0, act=10.0, param=10.0, memory=1e6), [1.0] * 4)
    with pytest.raises(InvalidProblemError, match="outputs a stage keeps.*dp"):
        solve(limited, method=method, stages=2)
    assert solve(limited, method="dp", stages=2).status.value == "optimal"


@pytest.mark.torchrun
def test_prediction_within_ten_percent_of_memtracker():
    """gpt-tiny at S = 2 (a fixed split, so the profile's timing noise cannot move it): pipeopt's
    memory per stage within 10 % of the peak MemTracker counts in each stage's process under
    torch's Schedule1F1B with Adam (deterministic on CPU: the same bytes on every run)."""
    pytest.importorskip("torch")
    from pipeopt.plan import Plan, Stage
    from pipeopt.torch import from_torch, models
    from pipeopt.torch.memory import measure_stages

    module, inputs = models.build("gpt-tiny")
    inst = from_torch(module, inputs, microbatches=4, repeats=1, warmup=0).with_settings(objective="iteration")
    names = list(inst.graph.nodes)
    plan = Plan((Stage(tuple(names[:4]), ("cpu0",)), Stage(tuple(names[4:]), ("cpu1",))))
    ev = evaluate(inst, plan)
    measured = measure_stages(plan, "gpt-tiny", instance=inst, microbatches=4)
    for i, m in enumerate(measured):
        assert abs(ev.memory[i] - m["peak"]) <= 0.10 * m["peak"], (i, ev.memory[i], m["peak"])
