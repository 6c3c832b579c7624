"""The objective is the schedule: :func:`pipeopt.evaluate` equals :func:`pipeopt.simulate`.

Two independent computations of the same runs. ``evaluate`` states the steady state in
closed form (the window rows of :func:`pipeopt.cost.rules.steady_period`) and the finite runs
as longest paths over fixed op orders (:mod:`pipeopt.cost.schedule`); ``simulate`` plays the
same orders (:func:`pipeopt.cost.schedule.lane_orders`) with an event-driven engine and
measures. On random layer graphs (chains and DAGs with skip edges, transfers as long as
compute, overlap on or off), random plans (straight, replicated, split execution with one or
two resource kinds, Bi-Partition) and random M, and on random splits of the real PipeDream
profiles, they agree to 1e-9 relative:

* 1F1B steady state (``simulate(..., "1f1b").time_per_microbatch``) and asynchronous
  PipeDream's (``"async"``) = ``evaluate(...).bottleneck``;
* 1F1B with a flush, M microbatches = ``evaluate(...).iteration_time``;
* GPipe, M microbatches = ``evaluate(...).gpipe_time``;
* split execution (``"split"``, every stage with a forward share beta): steady state =
  ``bottleneck`` and M microbatches = ``iteration_time`` of the plan with its beta.

Then the rules the objective is made of, on hand-made cases: a tensor crosses a cut once
(:func:`rules.crossing_bytes`), full-duplex cuts (:func:`rules.cut_time`), the window rows
(:func:`rules.steady_period`), and the simulator's half-duplex option, which the cost model
does not describe.
"""

from __future__ import annotations

import functools
import math
import random

import networkx as nx
import numpy as np
import pytest
from conftest import PROFILE_DIR, PROFILES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import layer_graphs

from pipeopt import Cluster, Device, Instance, Plan, Settings, Stage, evaluate
from pipeopt.cost import rules
from pipeopt.io import load
from pipeopt.simulate import simulate

REL = 1e-9
PROPERTY = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def assert_equal(simulated, analytic, what):
    """Relative error <= 1e-9 (an absolute 1e-15 s for runs that take no time)."""
    assert math.isclose(simulated, analytic, rel_tol=REL, abs_tol=1e-15), (
        f"{what}: simulated {simulated!r}, evaluate {analytic!r}, "
        f"relative error {abs(simulated - analytic) / max(abs(analytic), 1e-300):.3g}"
    )


def build_plan(inst, starts, replicas=None, betas=None, bwd_starts=None) -> Plan:
    """Stages over the instance's layer order starting at units ``[0, *starts]``; devices dealt
    in order (stage s gets the next ``replicas[s]`` devices); ``betas[s]`` its forward shares
    (split execution); ``bwd_starts`` the backward cuts (Bi-Partition)."""
    layer_sets = inst.chain.stages_from_cuts(list(starts))
    S = len(layer_sets)
    replicas = replicas or [1] * S
    betas = betas or [None] * S
    bwd_sets = inst.chain.stages_from_cuts(list(bwd_starts)) if bwd_starts is not None else [None] * S
    names = [d.name for d in inst.cluster.devices]
    stages, used = [], 0
    for layers, m, beta, bwd in zip(layer_sets, replicas, betas, bwd_sets, strict=True):
        stages.append(Stage(layers, tuple(names[used:used + m]), m, beta, bwd))
        used += m
    return Plan(tuple(stages))


@st.composite
def cuts(draw, n: int, S: int) -> list:
    """Start units of stages 1..S-1 of a contiguous split of n units."""
    return sorted(draw(st.sets(st.integers(1, n - 1), min_size=S - 1, max_size=S - 1))) if S > 1 else []


@st.composite
def replica_counts(draw, S: int, devices: int = 8) -> list:
    """m_s >= 1 per stage, at most ``devices`` in all."""
    reps, spare = [], devices - S
    for _ in range(S):
        extra = draw(st.integers(0, min(spare, 3)))
        reps.append(1 + extra)
        spare -= extra
    return reps


@st.composite
def two_kinds(draw, inst) -> Instance:
    """The same graph on 8 workers with a GPU and a slower CPU (random CPU times per layer)."""
    g = inst.graph.copy()
    for n in g.nodes:
        for key in ("fwd", "bwd"):
            g.nodes[n][key] = {"gpu": g.nodes[n][key]["gpu"],
                               "cpu": draw(st.floats(0.0, 0.2, allow_nan=False))}
    devices = tuple(Device(f"w{i}", {"gpu": 1.0, "cpu": 0.5}) for i in range(8))
    return Instance(g, Cluster(devices, bandwidth=inst.cluster.bandwidth), inst.settings, name="two kinds")


@st.composite
def cases(draw, plan_kind: str):
    """(instance, plan, M): a random layer graph (a chain plus skip edges, compute 0 - 0.05 s
    per layer and pass) on 8 GPUs, whose tensors, weights (all-reduce) and skip edges take
    0 - 0.08 s to send, as long as compute (so that every row of the steady state binds
    somewhere); overlap mostly on; and a random plan of ``plan_kind``."""
    g = draw(layer_graphs(min_layers=3, max_layers=8))
    bandwidth = 1e9
    seconds = st.floats(0.0, 0.08, allow_nan=False)
    for v in g.nodes:
        g.nodes[v]["out_bytes"] = draw(seconds) * bandwidth
        g.nodes[v]["param_bytes"] = draw(seconds) * bandwidth
    for u, v in g.edges:
        if int(v[1:]) > int(u[1:]) + 1 and draw(st.booleans()):  # a skip edge carrying its own bytes
            g.edges[u, v]["bytes"] = draw(seconds) * bandwidth
    overlap = draw(st.sampled_from([True, True, False]))
    inst = Instance(g, Cluster.homogeneous(8, bandwidth=bandwidth), Settings(overlap=overlap), name="random")
    if plan_kind == "split" and draw(st.booleans()):
        inst = draw(two_kinds(inst))
    n = inst.chain.n
    S = draw(st.integers(1, min(n, 5)))
    starts = draw(cuts(n, S))
    replicas = draw(replica_counts(S)) if plan_kind in ("replicated", "split") else None
    betas = bwd = None
    if plan_kind == "split":
        kinds = sorted({k for d in inst.cluster.devices for k in d.resources})
        share = st.floats(0.05, 0.95, allow_nan=False)
        betas = [{k: draw(share) for k in kinds} for _ in range(S)]
    if plan_kind == "bipartition":
        bwd = draw(cuts(n, S))
    M = draw(st.integers(1, 10))
    return inst.with_settings(microbatches=M), build_plan(inst, starts, replicas, betas, bwd), M


def check_sequential(inst, plan, M, label=""):
    """1F1B steady state and flush, GPipe, async: simulated = evaluate."""
    ev = evaluate(inst, plan)
    sim = simulate(inst, plan, schedule="1f1b", microbatches=M)
    assert_equal(sim.time_per_microbatch, ev.bottleneck, f"{label} 1f1b steady state")
    assert_equal(sim.iteration_time, ev.iteration_time, f"{label} 1f1b iteration")
    assert all(k <= e for k, e in zip(sim.peak_in_flight, ev.in_flight, strict=True))
    gp = simulate(inst, plan, schedule="gpipe", microbatches=M)
    assert_equal(gp.iteration_time, ev.gpipe_time, f"{label} gpipe iteration")
    gpipe = evaluate(inst.with_settings(objective="gpipe"), plan)
    assert_equal(gp.iteration_time, gpipe.objective, "gpipe objective")
    asy = simulate(inst, plan, schedule="async", microbatches=M)
    assert_equal(asy.time_per_microbatch, ev.bottleneck, f"{label} async steady state")
    # a long run fills every replica's window: the cost model's in-flight count exactly
    assert asy.peak_in_flight == ev.in_flight
    return ev


@PROPERTY
@given(case=cases("straight"))
def test_straight_plans(case):
    inst, plan, M = case
    ev = check_sequential(inst, plan, M)
    assert_equal(ev.objective, ev.bottleneck, "objective")
    iteration = evaluate(inst.with_settings(objective="iteration"), plan)
    assert_equal(iteration.objective, ev.iteration_time, "objective")


@PROPERTY
@given(case=cases("replicated"))
def test_replicated_plans(case):
    check_sequential(*case)


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases("bipartition"))
def test_bipartition_plans(case):
    check_sequential(*case)


@PROPERTY
@given(case=cases("split"))
def test_split_execution_plans(case):
    inst, plan, M = case
    ev = evaluate(inst, plan)
    sim = simulate(inst, plan, schedule="split", microbatches=M)
    assert_equal(sim.time_per_microbatch, ev.bottleneck, "split steady state")
    assert_equal(sim.iteration_time, ev.iteration_time, "split iteration")
    assert all(k <= e for k, e in zip(sim.peak_in_flight, ev.in_flight, strict=True))  # at most 2 k


# ---- the real profiles -------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def real(name: str) -> Instance:
    """A PipeDream profile on 16 identical GPUs (``pipeopt.io.load``'s default), cached."""
    return load(PROFILE_DIR / f"{name}.txt")


@pytest.mark.parametrize("name", PROFILES)
def test_real_profiles_random_splits(name, profile_dir):
    """A random split of every PipeDream profile at S = 2, 4, 8 on its 16 GPUs, random M and
    overlap; the plan kind (straight, replicated, split execution) rotates over profiles and S
    so that every kind meets every S."""
    inst = real(name)
    rng = random.Random(name)
    n = inst.chain.n
    for q, S in enumerate((2, 4, 8)):
        kind = ("straight", "replicated", "split")[(PROFILES.index(name) + q) % 3]
        starts = sorted(rng.sample(range(1, n), S - 1))
        reps = [1] * S  # 1, 2 or 4 replicas per stage, at most 16 GPUs
        if kind != "straight":
            for s in rng.sample(range(S), S):
                reps[s] = rng.choice([m for m in (1, 2, 4) if sum(reps) - 1 + m <= 16])
        M = rng.randint(1, 3 * S)
        case = inst.with_settings(microbatches=M, overlap=rng.random() < 0.75)
        label = f"{name} S={S} starts={starts} replicas={reps} M={M} overlap={case.settings.overlap}"
        if kind != "split":
            check_sequential(case, build_plan(case, starts, reps), M, label)
            continue
        plan = build_plan(case, starts, reps, [{"gpu": rng.uniform(0.2, 0.6)} for _ in range(S)])
        ev = evaluate(case, plan)
        sim = simulate(case, plan, schedule="split", microbatches=M)
        assert_equal(sim.time_per_microbatch, ev.bottleneck, f"{label} split steady state")
        assert_equal(sim.iteration_time, ev.iteration_time, f"{label} split iteration")


# ---- a tensor crosses a cut once ---------------------------------------------------------------


def graph(edges, out_bytes=None, edge_bytes=None):
    """Layers a, b, c, ... with the given edges; out_bytes per layer (default 0)."""
    g = nx.DiGraph()
    names = sorted({u for e in edges for u in e})
    for v in names:
        g.add_node(v, fwd={"gpu": 1.0}, bwd={"gpu": 1.0}, out_bytes=float((out_bytes or {}).get(v, 0.0)),
                   act_bytes=0.0, param_bytes=0.0)
    for u, v in edges:
        g.add_edge(u, v)
        if edge_bytes and (u, v) in edge_bytes:
            g.edges[u, v]["bytes"] = float(edge_bytes[(u, v)])
    return g


def test_a_tensor_feeding_two_layers_of_the_next_stage_crosses_once():
    # a (stage 0) feeds b and c (stage 1): its 8 bytes cross cut 0 once, not twice
    g = graph([("a", "b"), ("a", "c"), ("b", "c")], out_bytes={"a": 8.0, "b": 1.0})
    assert list(rules.crossing_bytes(g, {"a": 0, "b": 1, "c": 1}, 2)) == [8.0]
    # b's output stays inside stage 1
    assert list(rules.crossing_bytes(g, {"a": 0, "b": 0, "c": 1}, 2)) == [8.0 + 1.0]


def test_a_tensor_feeding_two_later_stages_crosses_each_cut_once():
    # a (stage 0) feeds b (stage 1) and d (stage 2): relayed through stage 1, once per cut
    g = graph([("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")], out_bytes={"a": 8.0, "b": 2.0, "c": 3.0})
    pos = {"a": 0, "b": 1, "c": 1, "d": 2}
    assert list(rules.crossing_bytes(g, pos, 3)) == [8.0, 8.0 + 3.0]
    # a skip edge over two cuts with nothing else reading a: still once per cut
    pos = {"a": 0, "b": 0, "c": 1, "d": 2}
    assert list(rules.crossing_bytes(g, pos, 3)) == [8.0 + 2.0, 8.0 + 3.0]


def test_different_edge_bytes_the_largest_beyond_the_cut():
    # a's edges carry 5 bytes to b (stage 1) and 3 to d (stage 2): cut 0 carries max(5, 3),
    # cut 1 only what reaches beyond it, 3; and the other way round
    g = graph([("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")], edge_bytes={("a", "b"): 5.0, ("a", "d"): 3.0})
    pos = {"a": 0, "b": 1, "c": 1, "d": 2}
    assert list(rules.crossing_bytes(g, pos, 3)) == [5.0, 3.0]
    g = graph([("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")], edge_bytes={("a", "b"): 3.0, ("a", "d"): 5.0})
    assert list(rules.crossing_bytes(g, pos, 3)) == [5.0, 5.0]


def test_evaluate_and_the_simulator_send_a_tensor_once():
    # a 1 MB tensor feeding two layers of stage 1 at 1 MB/s: 1 s each way per microbatch
    g = graph([("a", "b"), ("a", "c"), ("b", "c")], out_bytes={"a": 1e6})
    inst = Instance(g, Cluster.homogeneous(2, bandwidth=1e6), Settings(microbatches=6))
    plan = Plan((Stage(("a",), ("gpu0",)), Stage(("b", "c"), ("gpu1",))))
    ev = evaluate(inst, plan)
    assert ev.comm_bytes_forward == [1e6] and ev.comm_bytes_backward == [1e6]
    assert ev.comm_time == [1.0] and ev.round_trip == [2.0]
    sim = simulate(inst, plan)
    sends = [e for e in sim.events if e.kind == "comm"]
    assert len(sends) == 2 * 6 and all(math.isclose(e.end - e.start, 1.0) for e in sends)
    assert_equal(sim.time_per_microbatch, ev.bottleneck, "steady state")


# ---- full-duplex cuts --------------------------------------------------------------------------


def test_cut_time_is_the_busier_direction():
    assert rules.cut_time(10.0, 4.0, 20.0) == 0.5
    assert rules.cut_time(4.0, 10.0, 20.0) == 0.5
    assert rules.cut_time(10.0, 4.0, 20.0, links=2) == 0.25
    assert np.array_equal(rules.cut_time(np.array([10.0, 2.0]), np.array([4.0, 6.0]), 2.0), [5.0, 3.0])
    assert rules.round_trip(10.0, 4.0, 20.0) == 0.7


def vgg16_dp_split():
    """VGG16 on 4 stages at the split the DP found before the window rows ([5, 6, 13]): a light
    stage 1 (54.8 ms) between two heavy cuts (round trips 65.8 ms and 131.5 ms)."""
    inst = real("vgg16")
    return inst, build_plan(inst, [5, 6, 13])


def test_half_duplex_is_slower_than_full_duplex_on_vgg16(profile_dir):
    inst, plan = vgg16_dp_split()
    ev = evaluate(inst, plan)
    full = simulate(inst, plan, schedule="1f1b")
    half = simulate(inst, plan, schedule="1f1b", half_duplex=True)
    assert_equal(full.time_per_microbatch, ev.bottleneck, "full duplex")
    assert_equal(full.iteration_time, ev.iteration_time, "full duplex iteration")
    assert math.isclose(ev.bottleneck, 0.23559, rel_tol=1e-12)  # stage 0's work
    # half duplex: stage 1 is serialised with both of its cuts, C0 + tau1 + C1 = 252.1 ms
    assert half.time_per_microbatch > full.time_per_microbatch * 1.05
    serialised = ev.round_trip[0] + ev.stage_time[1] + ev.round_trip[1]
    assert_equal(half.time_per_microbatch, serialised, "half duplex")
    assert half.iteration_time > full.iteration_time
    assert any("half-duplex" in note for note in half.notes)


def test_half_duplex_serialises_a_links_directions():
    # ops of 0.25 s, transfers of 1 s each way: full duplex lets activations and gradients
    # overlap on the link (a round trip 0.25 + 0.25 + 1 + 1 s per 2 microbatches in flight,
    # 1.5 s); half duplex never does (the link is busy 2 s per microbatch)
    g = graph([("a", "b")], out_bytes={"a": 1e6})
    for v in g.nodes:
        g.nodes[v]["fwd"] = g.nodes[v]["bwd"] = {"gpu": 0.25}
    inst = Instance(g, Cluster.homogeneous(2, bandwidth=1e6), Settings(microbatches=8))
    plan = Plan((Stage(("a",), ("gpu0",)), Stage(("b",), ("gpu1",))))

    def transfers(sim, direction=None):
        return sorted((e.start, e.end) for e, d in zip(sim.events, sim.event_details, strict=True)
                      if e.kind == "comm" and direction in (None, d[2]))

    for half in (False, True):
        sim = simulate(inst, plan, half_duplex=half)
        for direction in ("fwd", "bwd"):  # one direction: one transfer at a time, always
            one = transfers(sim, direction)
            assert all(a[1] <= b[0] + 1e-12 for a, b in zip(one, one[1:]))
        both = transfers(sim)
        overlapping = any(a[1] > b[0] + 1e-12 for a, b in zip(both, both[1:]))
        assert overlapping != half
        assert_equal(sim.time_per_microbatch, 2.0 if half else 1.5, "half duplex" if half else "full duplex")
    assert evaluate(inst, plan).bottleneck == 1.5


# ---- the window rows ---------------------------------------------------------------------------


def chain_instance(taus, replicas, out_bytes=0.0, bandwidth=1.25e10, M=12):
    """One layer per stage, forward = backward = tau / 2 per replica, stage s on replicas[s] GPUs."""
    g = nx.DiGraph()
    for k, t in enumerate(taus):
        g.add_node(f"l{k}", fwd={"gpu": t / 2}, bwd={"gpu": t / 2}, out_bytes=out_bytes, act_bytes=1.0,
                   param_bytes=0.0)
        if k:
            g.add_edge(f"l{k - 1}", f"l{k}")
    inst = Instance(g, Cluster.homogeneous(sum(replicas), bandwidth=bandwidth), Settings(microbatches=M))
    return inst, build_plan(inst, list(range(1, len(taus))), list(replicas))


def test_window_row_of_a_replicated_middle_stage():
    # 1, 4, 1 s per microbatch on 1, 2, 1 workers: the replicas' own work allows 2 s, but
    # windows k = 4, 2, 1 (D = k m = 4, 4, 1; U = (k - 1) m = 3, 2, 0) give the row over stages
    # 0..1: (1 + 4) / (D_0 - U_1) = 5 / 2 = 2.5 s
    period = rules.steady_period([0.5, 2.0, 0.5], [0.5, 2.0, 0.5], [1, 2, 1], [4, 2, 1], [False] * 3,
                                 [0.0, 0.0], [0.0, 0.0], [1, 1])
    assert period == 2.5
    assert [list(v) for v in rules.window_tokens([4, 2, 1], [1, 2, 1], [False] * 3)] == [[4, 4, 1], [3, 2, 0]]
    inst, plan = chain_instance([1.0, 4.0, 1.0], [1, 2, 1])
    ev = evaluate(inst, plan)
    assert ev.stage_time == [1.0, 2.0, 1.0] and ev.in_flight == [4, 2, 1]
    assert ev.bottleneck == 2.5
    assert_equal(simulate(inst, plan).time_per_microbatch, 2.5, "replicated middle stage")
    assert simulate(inst, plan).peak_in_flight == [4, 2, 1]


def test_window_row_of_a_heavy_cut():
    # two stages of tau0 = 1, tau1 = 1.5 s and x = y = 1 s each way: every resource allows
    # 1.5 s, but one microbatch's round trip through both stages, tau0 + tau1 + 2 x = 4.5 s,
    # spans the D_0 - U_1 = 2 microbatches stage 0 keeps in flight: T = 4.5 / 2 = 2.25 s
    tau0, tau1, x = 1.0, 1.5, 1.0
    period = rules.steady_period([tau0 / 2, tau1 / 2], [tau0 / 2, tau1 / 2], [1, 1], [2, 1], [False] * 2,
                                 [x], [x], [1])
    assert period == (tau0 + tau1 + 2 * x) / 2
    inst, plan = chain_instance([tau0, tau1], [1, 1], out_bytes=1e6, bandwidth=1e6)
    ev = evaluate(inst, plan)
    assert ev.comm_time == [x] and ev.round_trip == [2 * x]
    assert ev.bottleneck == 2.25 > max(ev.stage_time + ev.comm_time)
    assert_equal(simulate(inst, plan).time_per_microbatch, 2.25, "heavy cut")
    assert_equal(simulate(inst, plan, schedule="async").time_per_microbatch, 2.25, "heavy cut, async")
    # a light cut leaves the resources binding
    light = rules.steady_period([0.5, 0.75], [0.5, 0.75], [1, 1], [2, 1], [False] * 2, [0.1], [0.1], [1])
    assert light == 1.5


def test_window_rows_of_split_execution():
    # split execution doubles the window and runs a backward as soon as its data is there
    # (D = 2 k m, U = 0): two stages with f = b = 1 s on their shares and 1 s transfers:
    # (2 + 2 + 2) / (D_0 - U_1) = 6 / 4 = 1.5 s, above each lane's 1 s
    assert [list(v) for v in rules.window_tokens([2, 1], [1, 1], [True, True])] == [[4, 2], [0, 0]]
    assert rules.steady_period([1.0, 1.0], [1.0, 1.0], [1, 1], [2, 1], [True, True], [1.0], [1.0], [1]) == 1.5
    inst, plan = chain_instance([1.0, 1.0], [1, 1], out_bytes=1e6, bandwidth=1e6)
    split = Plan(tuple(Stage(s.layers, s.devices, s.replicas, {"gpu": 0.5}) for s in plan.stages))
    ev = evaluate(inst, split)
    assert ev.forward_op == [1.0, 1.0] and ev.in_flight == [4, 2]
    assert ev.bottleneck == 1.5
    assert_equal(simulate(inst, split, schedule="split").time_per_microbatch, 1.5, "split")


def test_window_step_is_the_rows_recursion():
    # G_l = w_l + max(-D_l T, G_{l-1} + C_{l-1}); the rows ending at l hold iff G_l <= -U_l T.
    # At the period of the three stages above every row holds, just below it one fails.
    w, C = [1.0, 4.0, 1.0], [0.0, 0.0]
    D, U = rules.window_tokens([4, 2, 1], [1, 2, 1], [False] * 3)
    for T, holds in ((2.5, True), (2.5 * (1 - 1e-9), False)):
        G, oks = -math.inf, []
        for s in range(3):
            G, ok = rules.window_step(G, C[s - 1] if s else 0.0, w[s], D[s], U[s], T)
            oks.append(bool(ok))
        assert all(oks) == holds
