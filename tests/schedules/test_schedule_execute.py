"""The executor: a schedule's iteration time is the longest path through its operations.

* GPipe and 1F1B on one stage per rank: equal to :func:`pipeopt.cost.schedule.makespan` of
  :func:`pipeopt.cost.schedule.run_graph` on the same plan (and so to ``evaluate``'s
  ``gpipe_time`` / ``iteration_time``), on random chains with skip edges, transfers as long
  as compute, overlap on and off;
* every schedule: equal, action by action, to a step-by-step reference run written here
  without a graph (random durations, transfers, overlap on and off);
* the textbook iteration times with equal chunk times and free transfers.
"""

from __future__ import annotations

import math
import os
import re
from collections import defaultdict
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import layer_graphs

from pipeopt import Cluster, Instance, InvalidPlanError, Plan, Settings, Stage, evaluate
from pipeopt.cost.passes import PassTimes, pass_times
from pipeopt.cost.schedule import makespan, run_graph
from pipeopt.errors import InvalidProblemError, PipeoptError
from pipeopt.schedules import GENERATORS, chunk_plan, execute, make_schedule, run_schedule, schedule_graph

ROOT = Path(__file__).resolve().parents[2]

REL = 1e-9
PROPERTY = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def chains(draw):
    """(instance, plan with one stage per rank, M): a random chain with skip edges whose
    transfers take 0 - 0.08 s (as long as compute), overlap mostly on."""
    g = draw(layer_graphs(min_layers=2, max_layers=8))
    for v in g.nodes:
        g.nodes[v]["out_bytes"] = draw(st.floats(0.0, 0.08)) * 1e9
    overlap = draw(st.sampled_from([True, True, False]))
    M = draw(st.integers(1, 9))
    inst = Instance(g, Cluster.homogeneous(8, bandwidth=1e9), Settings(overlap=overlap, microbatches=M))
    n = inst.chain.n
    S = draw(st.integers(1, min(n, 5)))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), min_size=S - 1, max_size=S - 1))) if S > 1 else []
    plan = Plan(tuple(Stage(layers, (f"gpu{s}",)) for s, layers in enumerate(inst.chain.stages_from_cuts(cuts))))
    return inst, plan, M


@PROPERTY
@given(case=chains())
def test_gpipe_and_1f1b_equal_the_cost_models_longest_path(case):
    inst, plan, M = case
    ev = evaluate(inst, plan)
    S = plan.num_stages
    p = ev.pipeline
    for name, kind, analytic in (("GPipe", "gpipe", ev.gpipe_time), ("1F1B", "1f1b", ev.iteration_time)):
        graph = run_graph(kind, p["replicas"], p["window"], p["split"], p["links"], M, p["overlap"])
        reference = makespan(graph, graph.durations(ev.forward_op, ev.backward_op, p["x"], p["y"]))[0]
        ex = run_schedule(inst, make_schedule(name, S, M), plan)
        assert math.isclose(ex.time, reference, rel_tol=REL, abs_tol=1e-15), (name, ex.time, reference)
        assert math.isclose(ex.time, analytic, rel_tol=REL, abs_tol=1e-15)
        assert len(ex.ops) == len(graph.ops)  # the same operations: actions and transfers


def reference_run(schedule, times: PassTimes) -> dict:
    """Start and end of every action, step by step: a rank runs its next step once the data
    of its actions is there; a step's outputs leave when it ends, over the link between the
    two ranks (each direction serving its transfers one after the other, in the order they
    were sent) or at once on the same rank; without overlap the sender carries the transfer."""
    S, place, p = schedule.stages, schedule.placement, schedule.ranks
    x, y = times.send_forward, times.send_backward
    own = {"F": times.forward, "B": times.backward, "I": times.input_grad, "W": times.weight_grad}
    arrive, end, out = {}, {}, {}
    free, nxt = [0.0] * p, [0] * p
    link = defaultdict(float)
    left = sum(len(s) for s in schedule.steps)
    while left:
        moved = False
        for r in range(p):
            if nxt[r] == len(schedule.steps[r]):
                continue
            step = schedule.steps[r][nxt[r]]
            needs = []
            for kind, s, j in step:
                if kind == "F" and s > 0:
                    needs.append(("act", s, j))
                if kind in ("B", "I") and s < S - 1:
                    needs.append(("grad", s, j))
            if any(k not in arrive for k in needs):
                continue
            t = free[r]
            for kind, s, j in step:
                ready = [t]
                if kind == "F" and s > 0:
                    ready.append(arrive[("act", s, j)])
                elif kind in ("B", "I"):
                    ready.append(end[("F", s, j)])
                    if s < S - 1:
                        ready.append(arrive[("grad", s, j)])
                else:
                    ready.append(end.get(("I", s, j), 0.0))
                d = own[kind][s]
                if not times.overlap:
                    if kind == "F" and s < S - 1 and place[s] != place[s + 1]:
                        d += x[s]
                    if kind in ("B", "I") and s > 0 and place[s] != place[s - 1]:
                        d += y[s - 1]
                start = max(ready)
                t = start + d
                end[(kind, s, j)] = t
                out[(kind, s, j)] = (start, t)
            for kind, s, j in step:
                if kind == "F" and s < S - 1:
                    key, to, dur = ("act", s + 1, j), place[s + 1], x[s]
                elif kind in ("B", "I") and s > 0:
                    key, to, dur = ("grad", s - 1, j), place[s - 1], y[s - 1]
                else:
                    continue
                if to == r or not times.overlap:
                    arrive[key] = t
                else:
                    begin = max(t, link[(r, to)])
                    link[(r, to)] = arrive[key] = begin + dur
            free[r] = t
            nxt[r] += 1
            left -= 1
            moved = True
        assert moved, "the reference run is stuck"
    return out


@st.composite
def runs(draw):
    """A schedule of any kind (p <= 4, v <= 3, m <= 9) and random durations and transfers."""
    name = draw(st.sampled_from(sorted(GENERATORS)))
    p, m, v = draw(st.integers(1, 4)), draw(st.integers(1, 9)), draw(st.integers(1, 3))
    try:
        s = make_schedule(name, p, m, None if name in ("GPipe", "1F1B", "ZBVZeroBubble", "DualPipeV") else v)
    except InvalidProblemError:
        s = make_schedule("1F1B", p, m)
    S = s.stages
    sec = st.floats(0.0, 1.0)
    f = draw(st.lists(sec, min_size=S, max_size=S))
    i = draw(st.lists(sec, min_size=S, max_size=S))
    w = draw(st.lists(sec, min_size=S, max_size=S))
    x = draw(st.lists(sec, min_size=S - 1, max_size=S - 1))
    y = draw(st.lists(sec, min_size=S - 1, max_size=S - 1))
    times = PassTimes(tuple(f), tuple(a + b for a, b in zip(i, w, strict=True)), tuple(i), tuple(w), tuple(x),
                      tuple(y), (1.0,) * S, (1.0,) * S, (math.inf,) * S, overlap=draw(st.booleans()))
    return s, times


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(run=runs())
def test_every_schedule_equals_a_step_by_step_run(run):
    schedule, times = run
    ex = execute(schedule, times)
    ref = reference_run(schedule, times)
    got = ex.action_times()
    assert set(got) == set(ref)
    for a, (s0, e0) in ref.items():
        assert math.isclose(got[a][0], s0, rel_tol=REL, abs_tol=1e-12), a
        assert math.isclose(got[a][1], e0, rel_tol=REL, abs_tol=1e-12), a
    assert math.isclose(ex.time, max(e for _, e in ref.values()), rel_tol=REL, abs_tol=1e-12)
    assert all(b <= ex.time + 1e-12 for b in ex.busy())
    assert 0.0 <= ex.bubble_fraction <= 1.0


def unit_times(S: int, f: float = 1.0, i: float = 1.0, w: float = 1.0) -> PassTimes:
    return PassTimes((f,) * S, (i + w,) * S, (i,) * S, (w,) * S, (0.0,) * (S - 1), (0.0,) * (S - 1),
                     (1.0,) * S, (0.0,) * S, (math.inf,) * S)


def test_textbook_iteration_times():
    """Equal chunk times F = I = W = 1 (B = 2), free transfers: fill-drain and 1F1B take
    (m + p - 1)(F + B); interleaved 1F1B and looped BFS leave (p - 1)(F + B) of bubble whatever
    v (Narayanan et al., SC 2021: a fraction (p - 1) / (v m)) once m >= p; the zero-bubble
    schedules leave only the last rank's wait for its first forward, (p - 1) F, the least any
    schedule can (m >= p, ZB-V m >= 2p - 1)."""
    for p in range(1, 6):
        for m in range(1, 13):
            for name, v in (("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2), ("Interleaved1F1B", 3),
                            ("LoopedBFS", 2), ("LoopedBFS", 3), ("InterleavedZeroBubble", 2),
                            ("InterleavedZeroBubble", 3), ("ZBVZeroBubble", 2)):
                try:
                    s = make_schedule(name, p, m, v)
                except PipeoptError:
                    continue
                t = execute(s, unit_times(s.stages)).time
                if name in ("GPipe", "1F1B"):
                    assert t == (m + p - 1) * 3.0, (name, p, m)
                elif name in ("Interleaved1F1B", "LoopedBFS") and m >= p:
                    assert t == (v * m + p - 1) * 3.0, (name, p, m, v)
                elif name == "InterleavedZeroBubble" and m >= p or name == "ZBVZeroBubble" and m >= 2 * p - 1:
                    assert t == 3.0 * v * m + (p - 1), (name, p, m, v)
                assert t >= 3.0 * v * m + (p - 1)  # never below that bound


def two_rank_instance(overlap=True):
    g = nx.DiGraph()
    for i in range(8):
        g.add_node(f"l{i}", fwd={"gpu": 0.01}, bwd={"gpu": 0.02}, out_bytes=1e7, act_bytes=1e8, param_bytes=1e9)
    nx.add_path(g, [f"l{i}" for i in range(8)])
    return Instance(g, Cluster.homogeneous(4, memory=4e9, bandwidth=1e9), Settings(overlap=overlap, microbatches=4))


def test_run_schedule_on_chunks_of_a_plan():
    """ZB-V on 2 ranks: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2 (V placement).
    The boundary between chunks 1 and 2 stays on rank 1: no transfer."""
    inst = two_rank_instance()
    dev = {0: ("gpu0",), 1: ("gpu1",)}
    s = make_schedule("ZBVZeroBubble", 2, 4)
    plan = Plan(tuple(Stage((f"l{2 * c}", f"l{2 * c + 1}"), dev[r]) for c, r in enumerate(s.placement)))
    ex = run_schedule(inst, s, plan)
    assert not any(op[:2] in (("X", 1), ("Y", 1)) for op in ex.ops)
    assert sum(op[0] == "X" for op in ex.ops) == 2 * 4
    # the memory rule: rank 0 peaks at (4, 0) or (3, 1) microbatches of its chunks (2e8 bytes each)
    assert ex.memory == (4 * 2e8 + 2 * 2e9, 4 * 2e8 + 2 * 2e9)
    assert ex.memory_capacity == (4e9, 4e9) and not ex.feasible
    assert any("W = B/2" in a for a in ex.assumptions)
    text = str(ex)
    assert "ZBVZeroBubble on 2 ranks x 2 stages, 4 microbatches" in text
    assert "rank 0 (stages [0, 3])" in text and "of 3.725 GiB" in text
    assert text.splitlines()[-1].startswith("  assumed: weight gradient W = B/2")
    with pytest.raises(InvalidPlanError, match="must list the same devices"):
        run_schedule(inst, s, Plan(tuple(Stage(st.layers, (f"gpu{c}",)) for c, st in enumerate(plan.stages))))
    with pytest.raises(InvalidPlanError, match="runs 4 chunks; the plan has 2"):
        run_schedule(inst, s, Plan((Stage(("l0",), ("gpu0",)), Stage(tuple(f"l{i}" for i in range(1, 8)), ("gpu1",)))))
    with pytest.raises(InvalidProblemError, match="durations are for 3 chunks"):
        execute(s, unit_times(3))


def test_without_overlap_the_sender_carries_its_transfer():
    inst = two_rank_instance(overlap=False)
    s = make_schedule("1F1B", 2, 1)
    plan = Plan((Stage(tuple(f"l{i}" for i in range(4)), ("gpu0",)), Stage(tuple(f"l{i}" for i in range(4, 8)), ("gpu1",))))
    ex = run_schedule(inst, s, plan)
    assert all(op[0] in "FBIW" for op in ex.ops)
    # F0 (0.04 + 0.01 send), F1 0.04, B1 (0.08 + 0.01 send), B0 0.08
    assert ex.time == pytest.approx(0.05 + 0.04 + 0.09 + 0.08, rel=1e-12)
    assert schedule_graph(s, overlap=True).graph.ops != schedule_graph(s, overlap=False).graph.ops


@st.composite
def chunked(draw):
    """(instance, schedule, plan): a random chain cut into the p * v chunks of a random
    schedule, chunk s on rank ``placement[s]``'s GPU."""
    g = draw(layer_graphs(min_layers=8, max_layers=12))
    for v in g.nodes:
        g.nodes[v]["out_bytes"] = draw(st.floats(0.0, 0.05)) * 1e9
        if draw(st.booleans()):
            g.nodes[v]["bwd_w"] = {"gpu": g.nodes[v]["bwd"]["gpu"] * draw(st.floats(0.0, 1.0))}
    name = draw(st.sampled_from(sorted(GENERATORS)))
    p, m = draw(st.integers(1, 4)), draw(st.integers(1, 8))
    try:
        s = make_schedule(name, p, m)
    except InvalidProblemError:
        s = make_schedule("1F1B", p, m)
    inst = Instance(g, Cluster.homogeneous(4, bandwidth=1e9),
                    Settings(overlap=draw(st.booleans()), microbatches=m))
    n = inst.chain.n
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), min_size=s.stages - 1, max_size=s.stages - 1)))
    return inst, s, chunk_plan(inst, s, inst.chain.stages_from_cuts(cuts))


@PROPERTY
@given(case=chunked())
def test_random_chains_under_every_schedule(case):
    """On random chains the executor's actions are the reference run's, I + W = B per chunk,
    and a rank's peak memory is that of its worst in-flight vector."""
    inst, s, plan = case
    ex = run_schedule(inst, s, plan)
    times = pass_times(inst, plan)
    ref = reference_run(s, times)
    assert math.isclose(ex.time, max(e for _, e in ref.values()), rel_tol=REL, abs_tol=1e-12)
    for s_, i, w, b in zip(range(s.stages), times.input_grad, times.weight_grad, times.backward, strict=True):
        assert math.isclose(i + w, b, rel_tol=1e-12, abs_tol=1e-15), s_
    for r in range(s.ranks):
        mine = s.stages_on(r)
        params = sum(times.param_bytes[c] for c in mine)
        worst = max(sum(k * times.act_bytes[c] for k, c in zip(vec, mine, strict=True))
                    for vec in s.activation_profile(r))
        assert math.isclose(ex.memory[r], worst + params, rel_tol=1e-12)


def test_chunk_plan_places_chunks_on_their_ranks():
    inst = two_rank_instance()
    s = make_schedule("Interleaved1F1B", 2, 4)
    chunks = inst.chain.stages_from_cuts([2, 4, 6])
    plan = chunk_plan(inst, s, chunks)
    assert [st.devices for st in plan.stages] == [("gpu0",), ("gpu1",), ("gpu0",), ("gpu1",)]
    plan = chunk_plan(inst, s, chunks, rank_devices=[("gpu2", "gpu3"), ("gpu0",)])
    assert plan.stages[2].devices == ("gpu2", "gpu3")
    with pytest.raises(InvalidPlanError, match="runs 4 chunks; 3 given"):
        chunk_plan(inst, s, chunks[:3])
    with pytest.raises(InvalidPlanError, match="2 ranks, 1 device lists"):
        chunk_plan(inst, s, chunks, rank_devices=[("gpu0",)])
    with pytest.raises(InvalidPlanError, match="8 ranks need 8 devices"):
        chunk_plan(inst, make_schedule("GPipe", 8, 2), inst.chain.stages_from_cuts(list(range(1, 8))))


def test_readme_schedules_example_prints_its_table(capsys):
    """docs/schedules.md's example runs as written and prints the table shown under it."""
    text = (ROOT / "docs" / "schedules.md").read_text()
    section = text[text.index("## Running a schedule on a plan"):]
    code, shown = re.findall(r"```(?:python)?\n(.*?)```", section, re.S)[:2]
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        exec(compile(code, "docs-schedules", "exec"), {})
    finally:
        os.chdir(cwd)
    assert capsys.readouterr().out.splitlines() == shown.splitlines()
