"""Method "convex" (the DP over the ideals of the layer DAG) against brute force over every
convex ordered split, against the one-order DP, and on real profiles.

The reference here enumerates the convex space from its definition - every assignment of the
layers to stages 0..S-1 with ``stage(u) <= stage(v)`` on every edge, every stage non-empty,
pinned (``pin_first``) layers in stage 0 (with replication: every such split into k <= S stages
times every replica vector adding up to S, devices dealt in order) - and scores each plan with
:func:`pipeopt.evaluate` (:func:`brute_force.optimum`); nothing below reads the lattice, the
unit DAG or a cost table. The random DAGs are networkx gnp graphs oriented from the lower to the
higher index (branches, skip edges, several components), with the names permuted so that
pipeopt's layer order is not the index order.
"""

from __future__ import annotations

import math

import networkx as nx
import pytest
from brute_force import compositions, optimum
from conftest import PROFILE_DIR
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from strategies import times

import pipeopt
from pipeopt import Cluster, Instance, Plan, Settings, Stage, evaluate
from pipeopt.errors import InfeasibleError
from pipeopt.graph import layer_order
from pipeopt.problems.partition.problem import is_close
from pipeopt.result import Status

REL = 1e-9
MAX_PLANS = 2500
"""Brute force is skipped (hypothesis ``assume``) above this many plans (about 1 s of evaluate)."""
SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.data_too_large])


# ---- the convex space, from its definition ------------------------------------------------

def convex_assignments(graph, k: int):
    """Every ``dict[layer, stage]`` with stages 0..k-1 all used, ``stage(u) <= stage(v)`` on
    every edge and pinned layers in stage 0 (depth first over a topological order)."""
    order = list(nx.topological_sort(graph))
    preds = {v: list(graph.predecessors(v)) for v in order}
    n, where = len(order), {}

    def rec(i: int, used: frozenset):
        if k - len(used) > n - i:  # too few layers left to fill the empty stages
            return
        if i == n:
            yield dict(where)
            return
        v = order[i]
        lo = max((where[u] for u in preds[v]), default=0)
        hi = 0 if graph.nodes[v].get("pin_first") else k - 1
        for s in range(lo, hi + 1):
            where[v] = s
            yield from rec(i + 1, used | {s})
        where.pop(v, None)

    yield from rec(0, frozenset())


def convex_plans(instance, stages: int, replication: bool = False):
    """Every plan of the convex space (``replicated-convex`` with ``replication``)."""
    g = instance.graph
    order = list(nx.topological_sort(g))
    names = [d.name for d in instance.cluster.devices]
    counts = range(1, min(stages, g.number_of_nodes()) + 1) if replication else (stages,)
    for k in counts:
        for where in convex_assignments(g, k):
            layers = [tuple(v for v in order if where[v] == s) for s in range(k)]
            for reps in (compositions(stages, k) if replication else ((1,) * k,)):
                used, st_ = 0, []
                for L, m in zip(layers, reps, strict=True):
                    st_.append(Stage(L, tuple(names[used:used + m]), m))
                    used += m
                yield Plan(tuple(st_))


# ---- random DAG instances ------------------------------------------------------------------

sizes = st.one_of(st.floats(min_value=0.0, max_value=4e8, allow_nan=False),
                  st.floats(min_value=0.0, max_value=4e8).map(lambda x: math.floor(x) + 0.37),
                  st.just(0.0))
"""Byte counts: mostly non-integral."""


@st.composite
def dag_graphs(draw, max_layers: int = 8) -> nx.DiGraph:
    """A gnp DAG on ``l0..l{n-1}`` (names permuted), edges low -> high index, random per-edge
    bytes on some edges, some sources pinned."""
    n = draw(st.sampled_from(range(max_layers, 0, -1)))
    p = draw(st.sampled_from([0.2, 0.35, 0.5, 0.7]))
    seed = draw(st.integers(0, 2**20))
    names = draw(st.permutations([f"l{i}" for i in range(n)]))
    g = nx.DiGraph()
    for i in range(n):
        g.add_node(names[i], fwd={"gpu": draw(times)}, bwd={"gpu": draw(times)}, out_bytes=draw(sizes),
                   act_bytes=draw(sizes), param_bytes=draw(sizes))
    for a, b in nx.gnp_random_graph(n, p, seed=seed).edges:
        u, v = names[min(a, b)], names[max(a, b)]
        if draw(st.integers(0, 3)) == 0:  # a tensor larger or smaller on this edge than out_bytes
            g.add_edge(u, v, bytes=draw(sizes))
        else:
            g.add_edge(u, v)
    if draw(st.integers(0, 3)) == 0:
        sources = sorted(v for v in g if g.in_degree(v) == 0)
        for v in draw(st.lists(st.sampled_from(sources), min_size=1, max_size=2, unique=True)):
            g.nodes[v]["pin_first"] = True
    return g


@st.composite
def dag_cases(draw, max_layers: int = 8, replication: bool = False):
    """``(instance, S, plans)``: a random DAG instance, S in 1..min(4, units), and every plan
    of its convex space. Memory per device: none; the largest stage of a random plan (that
    plan fits exactly at capacity); the least such over up to 12 random plans (the leanest of
    them fits exactly, and the limit often binds); 1e-6 below one; or 1 byte (nothing fits)."""
    g = draw(dag_graphs(max_layers))
    bw = draw(st.sampled_from([1e9, 1e10, 1.25e10, 1e11]))  # 1e9: a cut's transfer is up to 0.4 s
    units = draw(st.sampled_from([1.0, 2.5]))  # resource units per device (times are per unit)
    sets = Settings(overlap=draw(st.booleans()), weight_stashing=draw(st.booleans()))
    free = Instance(g, Cluster.homogeneous(8, units=units, bandwidth=bw), sets, name="random-dag")
    top = min(4, free.chain.n)
    S = draw(st.sampled_from(range(top, 0, -1)))
    plans = []
    for plan in convex_plans(free, S, replication):
        plans.append(plan)
        assume(len(plans) <= MAX_PLANS)
    mode = draw(st.sampled_from(["inf", "at", "lean", "lean", "below", "tiny"]))
    if mode == "inf":
        return free, S, plans
    if mode == "tiny":
        cap = 1.0
    else:
        some = draw(st.lists(st.integers(0, len(plans) - 1), min_size=1, max_size=1 if mode == "at" else 12))
        cap = min(max(evaluate(free, plans[i]).memory) for i in some)
        if mode == "below":
            cap *= 1 - 1e-6
        assume(cap > 0)
    inst = free.replace(cluster=Cluster.homogeneous(8, units=units, memory=cap, bandwidth=bw))
    return inst, S, plans


def _objective_or_inf(inst, S, method, **kw) -> float:
    try:
        return pipeopt.solve(inst, stages=S, method=method, **kw).objective
    except InfeasibleError:
        return math.inf


def check_against_brute_force(inst, S, plans, replication=False):
    """Convex's claims on one instance against :func:`brute_force.optimum` of ``plans``.

    Returns ``None`` if nothing fits, else ``(convex result, brute-force optimum, dp objective)``."""
    ref = optimum(inst, plans)
    if not ref.exists:
        with pytest.raises(InfeasibleError):
            pipeopt.solve(inst, stages=S, method="convex", replication=replication)
        # one-order is a subset of convex: nothing fits there either
        assert math.isinf(_objective_or_inf(inst, S, "dp", replication=replication))
        return None
    res = pipeopt.solve(inst, stages=S, method="convex", replication=replication, time_limit=None)
    assert res.status == Status.OPTIMAL
    assert "convex" in res.space and (("replicated" in res.space) == replication)
    assert is_close(res.objective, ref.value, REL), (res.objective, ref.value, res.plan, ref.plan)
    ev = evaluate(inst, res.plan)  # raises if the plan is not a valid convex ordered split
    assert ev.feasible
    assert is_close(ev.objective, res.objective, REL)
    assert res.lower_bound <= res.objective * (1 + REL) and is_close(res.lower_bound, res.objective, 1e-9)
    if replication:
        assert sum(s.replicas for s in res.plan.stages) == S
    else:
        assert res.plan.num_stages == S and all(s.replicas == 1 for s in res.plan.stages)
    one_order = _objective_or_inf(inst, S, "dp", replication=replication)
    assert one_order >= res.objective * (1 - REL)
    return res, ref, one_order


def _events(case, out) -> None:
    """What the example covered (``pytest --hypothesis-show-statistics``)."""
    inst, S, _ = case
    event(f"S = {'1' if S == 1 else 'units' if S == inst.chain.n else 'between'}")
    if out is None:
        event("memory: nothing fits")
    elif math.isinf(inst.cluster.devices[0].memory):
        event("memory: unlimited")
    else:
        res, ref, _ = out
        cap = inst.cluster.devices[0].memory
        binds = ref.value > ref.least_infeasible * (1 + REL)
        event("memory: binds" if binds else "memory: limit, not binding")
        if any(abs(m - cap) <= 1e-9 * cap for m in res.evaluation.memory):
            event("memory: the plan found is at capacity")
    if out is not None:
        event("convex < one-order" if out[0].objective < out[2] * (1 - REL) else "convex = one-order")
    if any(p for _, p in inst.graph.nodes(data="pin_first")):
        event("pinned")


# ---- 1. straight: random DAGs against brute force -------------------------------------------

@settings(max_examples=250, **SETTINGS)
@given(case=dag_cases())
def test_convex_equals_brute_force(case):
    _events(case, check_against_brute_force(*case))


# ---- 2. replicated ------------------------------------------------------------------------------

@settings(max_examples=100, **SETTINGS)
@given(case=dag_cases(max_layers=7, replication=True))
def test_replicated_convex_equals_brute_force(case):
    _events(case, check_against_brute_force(*case, replication=True))


# ---- fixed edge cases: S = 1 and S = number of layers, exactly at capacity ---------------------

def _diamond_plus(overlap=True, memory=math.inf, bandwidth=1e10):
    """6 layers: a -> (b1 -> b2, c1 -> c2) -> d, plus a skip edge a -> d; fractional bytes."""
    g = nx.DiGraph()
    spec = {"a": (1e-3, 2e-3), "b1": (2e-3, 3e-3), "b2": (1e-3, 1e-3), "c1": (4e-3, 5e-3),
            "c2": (0.5e-3, 1e-3), "d": (2e-3, 2e-3)}
    for i, (x, (f, b)) in enumerate(spec.items()):
        g.add_node(x, fwd={"gpu": f}, bwd={"gpu": b}, out_bytes=1.5e7 + 1234.5 * i,
                   act_bytes=3.25e8 - 1e6 * i, param_bytes=1.1e8 + 777.7 * i)
    g.add_edges_from([("a", "b1"), ("b1", "b2"), ("b2", "d"), ("a", "c1"), ("c1", "c2"), ("c2", "d")])
    g.add_edge("a", "d", bytes=4.4e7 + 0.25)
    return Instance(g, Cluster.homogeneous(8, memory=memory, bandwidth=bandwidth), Settings(overlap=overlap),
                    name="diamond-plus")


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("S", [1, 2, 3, 6])
def test_fixed_dag_every_stage_count(S, overlap):
    inst = _diamond_plus(overlap)
    assert inst.num_layers == 6
    plans = list(convex_plans(inst, S))
    check_against_brute_force(inst, S, plans)
    # the memory of the unconstrained optimum, as the capacity: it fits exactly
    res = pipeopt.solve(inst, stages=S, method="convex")
    cap = max(res.evaluation.memory)
    at = inst.replace(cluster=Cluster.homogeneous(8, memory=cap, bandwidth=inst.cluster.bandwidth))
    tight = check_against_brute_force(at, S, plans)
    assert tight is not None and is_close(tight[0].objective, res.objective, REL)
    below = inst.replace(cluster=Cluster.homogeneous(8, memory=cap * (1 - 1e-6),
                                                     bandwidth=inst.cluster.bandwidth))
    check_against_brute_force(below, S, plans)


@pytest.mark.parametrize("S", [1, 3, 6])
def test_fixed_dag_replicated(S):
    inst = _diamond_plus(bandwidth=1e9)
    check_against_brute_force(inst, S, list(convex_plans(inst, S, replication=True)), replication=True)


def test_pinned_layer_with_a_predecessor():
    """A ``pin_first`` layer that is not a source: l0 -> l1 (pinned) -> l2, S = 2.

    Stage 0 must hold l1, hence l0 (edge l0 -> l1 goes forward): {l0, l1} | {l2} is a valid
    convex split (evaluate scores it, dp returns it, 6 ms). Once a defect: the pinned unit was
    put before every other root, its own ancestor too (a cycle, InvalidProblemError)."""
    g = nx.DiGraph()
    for i, t in enumerate([1e-3, 2e-3, 3e-3]):
        g.add_node(f"l{i}", fwd={"gpu": t}, bwd={"gpu": t}, out_bytes=0.0, act_bytes=0.0, param_bytes=0.0)
    g.add_edges_from([("l0", "l1"), ("l1", "l2")])
    g.nodes["l1"]["pin_first"] = True
    inst = Instance(g, Cluster.homogeneous(2), Settings(), name="pinned-middle")
    ref = optimum(inst, convex_plans(inst, 2))
    assert ref.value == pytest.approx(6e-3, rel=1e-12)
    assert is_close(pipeopt.solve(inst, stages=2, method="dp").objective, ref.value, REL)
    assert is_close(pipeopt.solve(inst, stages=2, method="convex").objective, ref.value, REL)


# ---- 3. a DAG where convex beats every contiguous split of the layer order -----------------------

def test_convex_strictly_better_than_one_order():
    """Two parallel branches, a -> b1 -> b2 -> d and a -> c1 -> c2 -> d; no bytes (no transfers).

    Per-layer work (forward 1 ms + backward 2 ms per unit of weight): a 0, b1 1, b2 1, c1 3,
    c2 1, d 0 - 6 units, 18 ms in all. pipeopt's layer order is lexicographic by natural name:
    a, b1, b2, c1, c2, d, whose prefixes weigh 0, 1, 2, 5, 6, 6 units; the best contiguous
    split into S = 2 stages is {a, b1, b2} | {c1, c2, d} = 2 | 4 units: a period of 12 ms.
    The convex split {a, c1} | {b1, b2, c2, d} = 3 | 3 units (the c branch's head c1 with the
    root; the whole b branch, c's tail c2 and d after it) is not contiguous in that order (c1
    would have to come before b1, b2) and has period 9 ms: it is the only balanced split.
    Without transfers the 1F1B steady-state period of 2 stages is the larger stage's work.
    """
    w = {"a": 0, "b1": 1, "b2": 1, "c1": 3, "c2": 1, "d": 0}
    g = nx.DiGraph()
    for x, u in w.items():
        g.add_node(x, fwd={"gpu": 1e-3 * u}, bwd={"gpu": 2e-3 * u}, out_bytes=0.0, act_bytes=0.0,
                   param_bytes=0.0)
    g.add_edges_from([("a", "b1"), ("b1", "b2"), ("b2", "d"), ("a", "c1"), ("c1", "c2"), ("c2", "d")])
    inst = Instance(g, Cluster.homogeneous(2), Settings(), name="two-branches")
    assert layer_order(g) == ["a", "b1", "b2", "c1", "c2", "d"]
    dp = pipeopt.solve(inst, stages=2, method="dp")
    cv = pipeopt.solve(inst, stages=2, method="convex", time_limit=None)
    assert dp.objective == pytest.approx(12e-3, rel=1e-12)
    assert cv.objective == pytest.approx(9e-3, rel=1e-12)
    assert cv.objective < dp.objective
    assert cv.status == Status.OPTIMAL
    assert [set(s.layers) for s in cv.plan.stages] == [{"a", "c1"}, {"b1", "b2", "c2", "d"}]
    assert is_close(evaluate(inst, cv.plan).objective, cv.objective, REL)
    assert is_close(optimum(inst, convex_plans(inst, 2)).value, cv.objective, REL)
    # replicated: convex still at least as good as one-order
    rdp = pipeopt.solve(inst, stages=2, method="dp", replication=True)
    rcv = pipeopt.solve(inst, stages=2, method="convex", replication=True)
    assert rcv.objective <= rdp.objective * (1 + REL)


# ---- 4. real PipeDream profiles -------------------------------------------------------------------

@pytest.mark.parametrize("name", ["resnet18", "squeezenet1_0", "alexnet"])
def test_real_profiles(name):
    path = PROFILE_DIR / f"{name}.txt"
    if not path.exists():
        pytest.skip(f"{path} is not present")
    inst = pipeopt.read(path)
    for replication in (False, True):
        cv = pipeopt.solve(inst, stages=4, method="convex", replication=replication, time_limit=None)
        dp = pipeopt.solve(inst, stages=4, method="dp", replication=replication, time_limit=None)
        assert cv.status == Status.OPTIMAL
        assert cv.objective <= dp.objective * (1 + REL)
        assert is_close(evaluate(inst, cv.plan).objective, cv.objective, REL)
        assert sorted(x for s in cv.plan.stages for x in s.layers) == sorted(inst.graph.nodes)
        if not replication:
            assert cv.plan.num_stages == 4
        assert sum(s.replicas for s in cv.plan.stages) == 4


# ---- 5. more ideals than the limit: the convex MILP takes over (straight), an error (replicated) ---

def test_too_many_ideals_falls_back_to_the_convex_milp(monkeypatch):
    """With the ideal listing refused (as past IDEAL_LIMIT), straight stages are solved by the
    convex MILP on the same clock, under the convex method's name, with the same optimum."""
    from pipeopt.problems import ideals
    from pipeopt.problems.partition import convex

    inst = _diamond_plus(bandwidth=1e9)
    exact = pipeopt.solve(inst, stages=3, method="convex")

    def refuse(*args, **kwargs):
        raise ideals.LatticeTooLarge("more than 0 ideals (test)")

    monkeypatch.setattr(convex.Lattice, "of", refuse)
    res = pipeopt.solve(inst, stages=3, method="convex", solver="highs", time_limit=None)
    assert res.method == "convex" and "convex_milp" in res.info["fallback"]
    assert res.status == Status.OPTIMAL and res.space == "convex"
    assert is_close(res.objective, exact.objective, 1e-6)
    with pytest.raises(ideals.LatticeTooLarge, match="one-order methods"):
        pipeopt.solve(inst, stages=3, method="convex", replication=True)


# ---- 6. a deadline during the bisection keeps what it found and proved ----------------------------

@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("bandwidth", [1e9, 1e10])
@pytest.mark.parametrize("S", [2, 3])
def test_deadline_in_the_bisection_keeps_plan_and_bound(monkeypatch, S, bandwidth, overlap):
    """The deadline passing during the k-th probe of the bisection over every ideal (simulated:
    that probe raises DeadlineReached): status time_limit, the best plan of the probes before it
    (or of the min-max pass) kept, the lower end proven before it kept - between the min-max
    value and the optimum - for every k the whole solve reaches."""
    from pipeopt.backends.deadline import DeadlineReached
    from pipeopt.problems.partition import convex

    inst = _diamond_plus(overlap, bandwidth=bandwidth)
    full_run, lattice_of = convex._Search.run, convex.Lattice.of
    seen: list = []  # per pass over every ideal: (T, value or None, period or None)

    def of(*args, **kwargs):
        lat = lattice_of(*args, **kwargs)
        seen.append("lattice")
        return lat

    def run(self, T, bound, stop_at=None):
        mine = self.lat.size > inst.num_layers + 1  # not the one-order chain
        probed = sum(1 for x in seen if x != "lattice" and x[0] is not None)  # probes of this solve so far
        if mine and T is not None and stop_at is not None and probed == stop_at:
            raise DeadlineReached("test", 0.0)
        found = full_run(self, T, bound)
        if mine:
            seen.append((T, None if found is None else found[0], None if found is None else self.period(found[1], found[2])))
        return found

    monkeypatch.setattr(convex.Lattice, "of", of)
    monkeypatch.setattr(convex._Search, "run", lambda self, T, bound: run(self, T, bound))
    exact = pipeopt.solve(inst, stages=S, method="convex", time_limit=None)
    assert exact.status == Status.OPTIMAL
    passes = [x for x in seen if x != "lattice"]
    min_max_value, min_max_period = passes[0][1], passes[0][2]
    probes = passes[1:]
    assert len(probes) == exact.info["probes"]
    for k in range(len(probes)):
        seen.clear()
        monkeypatch.setattr(convex._Search, "run", lambda self, T, bound, k=k: run(self, T, bound, k))
        res = pipeopt.solve(inst, stages=S, method="convex", time_limit=None)
        assert res.status == Status.TIME_LIMIT and "test" in res.info["stopped"]
        kept = min([res.info["one_order"], min_max_period] + [p for _, v, p in probes[:k] if p is not None])
        assert res.objective <= kept * (1 + REL)
        assert is_close(evaluate(inst, res.plan).objective, res.objective, REL)
        assert min_max_value * (1 - REL) <= res.lower_bound <= exact.objective * (1 + REL)
        rejected = [T for T, v, _ in probes[:k] if v is None]
        assert res.lower_bound >= max(rejected, default=0.0) * (1 - REL)


def test_the_tables_check_the_deadline():
    """Building the per-ideal tables (seconds on a lattice of 10^5 ideals) checks the deadline:
    one that has passed stops it with DeadlineReached naming the step (which the solve turns into
    time_limit); without a deadline the tables are built."""
    from pipeopt.backends.deadline import Deadline, DeadlineReached
    from pipeopt.problems.ideals import Lattice, UnitDag
    from pipeopt.problems.partition import convex
    from pipeopt.problems.partition.problem import PartitionProblem

    inst = _diamond_plus()
    dag = UnitDag.build(inst.graph)
    passed = Deadline(1e-12)
    with pytest.raises(DeadlineReached, match="the convex tables"):
        convex.ConvexTables(PartitionProblem(inst, 3), dag, Lattice.of(dag), passed)
    tables = convex.ConvexTables(PartitionProblem(inst, 3), dag, Lattice.of(dag))  # no deadline: built
    assert tables.W.shape == tables.X.shape == (Lattice.of(dag).size,)
