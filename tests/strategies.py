"""Shared test helpers: random layer graphs and instances for property tests (hypothesis),
the one builder of hand-made chains (:func:`chain_graph`, :func:`chain_instance`), and the
brute-force enumerators over a problem object's own splits (:func:`brute_force`,
:func:`straight_splits`, :func:`resource_splits`). The references built from the problems'
definitions alone, without a problem class, are in ``tests/brute_force.py``."""

from __future__ import annotations

import itertools
import math

import networkx as nx
from hypothesis import strategies as st

from pipeopt import Cluster, Instance, Settings, evaluate
from pipeopt.errors import PipeoptError

# ---- hand-made chains ---------------------------------------------------------------------------


def _each(value, n: int) -> list:
    """``value`` per layer: a list or tuple (of length n) as is, anything else for every layer."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{len(value)} values for {n} layers")
        return list(value)
    return [value] * n


def chain_graph(fwd, bwd=None, out=0.0, act=0.0, param=0.0, *, kind: str = "gpu", skips=(), cast=None,
                attrs: dict | None = None) -> nx.DiGraph:
    """A chain ``l0 -> l1 -> ... -> l{n-1}`` of ``n = len(fwd)`` layers, plus ``skips`` edges.

    Parameters
    ----------
    fwd, bwd
        Per-layer forward / backward seconds (a list of n); each a number (the time on ``kind``)
        or a ``dict[kind, seconds]`` stored as given. ``bwd`` defaults to ``fwd``; a single
        number or dict is used for every layer.
    out, act, param
        ``out_bytes`` (what crosses a cut after the layer), ``act_bytes``, ``param_bytes``: a
        list of n, or one value for every layer.
    skips
        Extra edges ``(a, b)`` between layer indices (a tensor of ``l{a}`` read by ``l{b}``), or
        ``(a, b, bytes)`` with the edge's own tensor size (edge attribute ``bytes``).
    cast
        Applied to every number above (e.g. ``float``); values are stored as given otherwise
        (invalid ones included: the bad-input tests build graphs the readers must refuse).
    attrs
        Node attributes set on every layer after the ones above, as given (they override).
    """
    n = len(fwd)
    c = cast or (lambda x: x)

    def time(x):
        return dict(x) if isinstance(x, dict) else {kind: c(x)}

    fs, bs = _each(fwd, n), _each(fwd if bwd is None else bwd, n)
    outs, acts, params = _each(out, n), _each(act, n), _each(param, n)
    names = [f"l{i}" for i in range(n)]
    g = nx.DiGraph()
    for i, name in enumerate(names):
        g.add_node(name, **{"fwd": time(fs[i]), "bwd": time(bs[i]), "out_bytes": c(outs[i]),
                            "act_bytes": c(acts[i]), "param_bytes": c(params[i]), **(attrs or {})})
    g.add_edges_from(itertools.pairwise(names))
    for a, b, *size in skips:
        g.add_edge(names[a], names[b], **({"bytes": c(size[0])} if size else {}))
    return g


def chain_instance(fwd, bwd=None, out=0.0, act=0.0, param=0.0, *, devices: int | None = None,
                   memory: float = math.inf, bandwidth: float = 1.25e10, skips=(), cast=None,
                   kind: str = "gpu", name: str = "chain", **settings) -> Instance:
    """:func:`chain_graph` on ``devices`` (default: one per layer) identical single-kind devices
    of ``memory`` bytes joined by ``bandwidth`` bytes/s; ``settings`` are :class:`Settings`
    fields (``overlap``, ``weight_stashing``, ``microbatches``)."""
    g = chain_graph(fwd, bwd, out, act, param, kind=kind, skips=skips, cast=cast)
    cluster = Cluster.homogeneous(devices or len(fwd), kind=kind, memory=memory, bandwidth=bandwidth)
    return Instance(g, cluster, Settings(**settings), name=name)


times = st.floats(min_value=0.0, max_value=0.05, allow_nan=False)
sizes = st.integers(min_value=0, max_value=400_000_000)


@st.composite
def layer_graphs(draw, min_layers: int = 1, max_layers: int = 8, dag: bool = True) -> nx.DiGraph:
    """A random single-kind ("gpu") layer DAG: a chain plus random forward skip edges."""
    n = draw(st.integers(min_layers, max_layers))
    g = nx.DiGraph()
    for i in range(n):
        g.add_node(
            f"l{i}",
            fwd={"gpu": draw(times)},
            bwd={"gpu": draw(times)},
            out_bytes=float(draw(sizes)),
            act_bytes=float(draw(sizes)),
            param_bytes=float(draw(sizes)),
        )
    for i in range(n - 1):
        g.add_edge(f"l{i}", f"l{i + 1}")
    if dag and n > 2:
        extra = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=n))
        for a, b in extra:
            if a + 1 < b:
                g.add_edge(f"l{a}", f"l{b}")
    return g


latencies = st.sampled_from([0.0, 1e-4, 3e-3, 0.02])
"""Per-message latencies (seconds): none, small, and of the order of the layer :data:`times`."""


@st.composite
def overheads(draw) -> dict | None:
    """A graph's ``stage_overhead`` attribute (:func:`pipeopt.cost.rules.stage_overhead`), or
    ``None`` (none)."""
    if not draw(st.booleans()):
        return None
    part = st.sampled_from([0.0, 1e-3, 0.01, 0.03])
    return {"forward": draw(part), "backward": draw(part)}


@st.composite
def instances(draw, max_layers: int = 8, dag: bool = True, memory: bool = True, alpha: bool = False) -> Instance:
    """A random instance on 8 identical GPUs, with random bandwidth, overlap and memory; with
    ``alpha``, also a random per-message latency (:data:`latencies`), stage overhead
    (:func:`overheads`), each sometimes 0, and collective bandwidth
    (:attr:`Cluster.collective_bandwidth`: the replicas' all-reduce), sometimes the link's."""
    g = draw(layer_graphs(max_layers=max_layers, dag=dag))
    mem = draw(st.sampled_from([math.inf, 2e9, 5e9])) if memory else math.inf
    bw = draw(st.sampled_from([1e9, 1.25e10, 1e11]))
    settings = Settings(overlap=draw(st.booleans()), weight_stashing=draw(st.booleans()))
    latency, collective = 0.0, None
    if alpha:
        latency = draw(latencies)
        over = draw(overheads())
        if over:
            g.graph["stage_overhead"] = over
        share = draw(st.sampled_from([None, 0.4, 3.0]))
        collective = None if share is None else share * bw
    cluster = Cluster.homogeneous(8, memory=mem, bandwidth=bw, latency=latency)
    return Instance(g, cluster.with_overrides(collective_bandwidth=collective), settings, name="random")


def compositions(n: int, k: int):
    """All ways to cut n units into k non-empty contiguous parts, as stage start indices."""
    for cuts in itertools.combinations(range(1, n), k - 1):
        yield list(cuts)


def straight_splits(problem) -> list[list[int]]:
    """Every split of a partition (or Bi-Partition) problem's ``n`` units into its ``stages``
    contiguous stages, as stage start indices (``problem.plan(starts)``)."""
    return list(compositions(problem.n, problem.stages))


def resource_splits(problem):
    """Every ``(starts, groups)`` of a tiny joint or group problem (``problem.plan(starts, groups)``):
    the joint problem's fixed groups, or every grouping of the devices into the group problem's
    workers, times every contiguous split into that many stages."""
    from pipeopt.problems.resource import JointProblem
    from pipeopt.problems.resource.problem import groupings

    names = [d.name for d in problem.instance.cluster.devices]
    if isinstance(problem, JointProblem):
        all_groups = [problem.groups]
    else:
        all_groups = [[tuple(names[d] for d in g) for g in gs] for gs in groupings(len(names), problem.num_stages)]
    for groups in all_groups:
        for starts in compositions(problem.n, problem.num_stages):
            yield starts, groups


def brute_force(problem) -> float:
    """Best feasible objective over every contiguous split (and replica vector) of a
    PartitionProblem, each scored by evaluate; inf if none fits."""
    best = math.inf
    n, S = problem.n, problem.stages
    if problem.replication:
        for k in range(1, S + 1):
            for starts in compositions(n, k):
                for reps in itertools.product(range(1, S + 1), repeat=k):
                    if sum(reps) != S:
                        continue
                    ev = evaluate(problem.instance, problem.plan(starts, list(reps)))
                    if ev.feasible:
                        best = min(best, ev.objective)
    else:
        for starts in compositions(n, S):
            ev = evaluate(problem.instance, problem.plan(starts))
            if ev.feasible:
                best = min(best, ev.objective)
    return best


def safe_problem(cls, *args, **kw):
    """Build a problem or return None if the request is invalid for this instance."""
    try:
        return cls(*args, **kw)
    except PipeoptError:
        return None


def hand_free_order(m: int = 3):
    """1F1B on 2 ranks with each B split into I and W, rank 1's W's moved to its end: a valid
    order that is none of torch's seven (a :class:`pipeopt.schedules.Schedule` named ``free``)."""
    from pipeopt.schedules import Action, Schedule, make_schedule

    base = make_schedule("1F1B", ranks=2, microbatches=m)
    steps = []
    for r in range(2):
        row, ws = [], []
        for a in base.actions(r):
            if a.kind == "B":
                row.append((Action("I", a.stage, a.microbatch),))
                (ws if r == 1 else row).append((Action("W", a.stage, a.microbatch),))
            else:
                row.append((a,))
        steps.append(tuple(row + ws))
    return Schedule("free", 2, 1, m, (0, 1), tuple(steps), source="by hand")


@st.composite
def tied_instances(draw, max_layers: int = 7, memory: bool = True, sums: bool = False) -> Instance:
    """A random chain instance (:func:`layer_graphs` without skips) with one or two tied
    parameters (graph attribute ``tied``, :mod:`pipeopt.cost.ties`), each used by two or three
    random layers, whose state is large enough for memory to bind on the stages holding it;
    with ``sums`` each tie also has a measured gradient sum (``sum_s``, 0 to 30 ms, or none)."""
    g = draw(layer_graphs(min_layers=3, max_layers=max_layers, dag=False))
    n = g.number_of_nodes()
    ties = []
    for j in range(draw(st.integers(1, 2))):
        users = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=3, unique=True))
        nbytes = float(draw(st.integers(0, 300_000_000)))
        ties.append({"name": f"tie{j}.weight", "bytes": nbytes, "state_bytes": 4 * nbytes,
                     "layers": [f"l{i}" for i in sorted(users)]})
        if sums:
            ties[-1]["sum_s"] = {"gpu": draw(st.sampled_from([0.0, 1e-4, 0.003, 0.03]))}
    g.graph["tied"] = ties
    total = sum(a["param_bytes"] + 2 * a["act_bytes"] for _, a in g.nodes(data=True)) + sum(
        t["state_bytes"] for t in ties)
    share = draw(st.sampled_from([math.inf, 0.3, 0.45, 0.6])) if memory else math.inf
    mem = share * total if math.isfinite(share) and total > 0 else math.inf  # binds on some splits
    bw = draw(st.sampled_from([1e9, 1e11]))
    settings = Settings(overlap=draw(st.booleans()), weight_stashing=draw(st.booleans()))
    collective = draw(st.sampled_from([None, 0.4 * bw]))  # the tie's all-reduce at the link's rate or slower
    cluster = Cluster.homogeneous(8, memory=mem, bandwidth=bw).with_overrides(collective_bandwidth=collective)
    return Instance(g, cluster, settings, name="tied")


# ---- ZeRO chains whose memory binds (the partition DP's and the schedule problem's tests) --------


@st.composite
def zero_chains(draw, n: int) -> tuple[list, list, list, dict, float]:
    """``(fwd, act, param, state, latency)`` of an n-layer chain with random ZeRO settings: forward
    seconds from {0.5, 1, 2, 3}, activation bytes in steps of 1e8, parameter bytes in steps of 5e7,
    ``state`` the keyword arguments of :class:`pipeopt.Settings` (ZeRO stage 0-3, d = 1-4 replicas,
    gradient and optimizer ratios), ``latency`` 0 or 10 ms."""
    fwd = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0]), min_size=n, max_size=n))
    act = draw(st.lists(st.integers(0, 10).map(lambda k: k * 1e8), min_size=n, max_size=n))
    param = draw(st.lists(st.integers(0, 3).map(lambda k: k * 5e7), min_size=n, max_size=n))
    state = {"zero": draw(st.integers(0, 3)), "dp": draw(st.integers(1, 4)),
             "gradient_ratio": draw(st.sampled_from([0.5, 1.0])), "optimizer_ratio": draw(st.sampled_from([2.0, 6.0]))}
    latency = draw(st.sampled_from([0.0, 0.01]))
    return fwd, act, param, state, latency


def binding_memory(draw, every: float, none: float) -> float:
    """A memory capacity (bytes) where recomputation binds: drawn from a little below to a little
    above the span between ``every`` and ``none``, the least fullest-stage memory of the plans
    recomputing every layer and of those recomputing none (at least 1 MB). ``draw``: the
    composite strategy's own."""
    lo, hi = min(every, none), max(every, none)
    return max(lo + draw(st.floats(-0.05, 1.1)) * (hi - lo), 1e6)


@st.composite
def split_backward_chains(draw, n: int) -> nx.DiGraph:
    """An n-layer chain for the split-backward schedules (F, I, W): forward seconds 0.2-2, the
    backward 1-3 times it, of which a share 0-1 is the weight gradient W (``bwd_w``); 0-30 MB
    sent after each layer, 100 MB of activations and of parameters per layer."""
    fwd = [draw(st.floats(0.2, 2.0)) for _ in range(n)]
    bwd = [f * draw(st.floats(1.0, 3.0)) for f in fwd]
    out = [draw(st.floats(0.0, 0.03)) * 1e9 for _ in range(n)]
    g = chain_graph(fwd, bwd, out=out, act=1e8, param=1e8)
    for i, node in enumerate(g.nodes):
        g.nodes[node]["bwd_w"] = {"gpu": bwd[i] * draw(st.floats(0.0, 1.0))}
    return g


# ---- heterogeneous devices (the group problem) --------------------------------------------------

DEVICE_PROFILES = ({"cpu": 1, "gpu": 2}, {"cpu": 4}, {"gpu": 3, "npu": 1}, {"npu": 4}, {"cpu": 2, "gpu": 1, "npu": 1})
"""Resources of the random devices of :func:`device_instance` (a profile used twice: identical devices)."""


def device_instance(n: int, profiles: list[int], *, seed: int, bandwidth: float, memory: list[float] | None = None,
                    name: str | None = None) -> Instance:
    """A random multi-kind chain of ``n`` units (:func:`pipeopt.problems.resource.examples.random_chain`) on
    one device per entry of ``profiles`` (indices into :data:`DEVICE_PROFILES`), each with its ``memory``
    (default unlimited)."""
    from pipeopt import Device
    from pipeopt.problems.resource.examples import random_chain

    mem = memory or [math.inf] * len(profiles)
    devices = tuple(Device(f"d{i}", dict(DEVICE_PROFILES[k]), m) for i, (k, m) in enumerate(zip(profiles, mem)))
    return Instance(random_chain(n, seed=seed), Cluster(devices, bandwidth), name=name or f"types-{seed}")


@st.composite
def group_problems(draw, min_units: int = 2, min_workers: int = 1):
    """A tiny :class:`~pipeopt.problems.resource.GroupProblem`: ``min_units``..6 units, 2..4 devices of
    the first three profiles (repeats: identical devices), ``min_workers``..3 workers; memory unlimited,
    binding (about half a stage of the whole chain per device) or loose; bandwidth loose or tight."""
    from pipeopt.problems.resource import GroupProblem

    seed = draw(st.integers(0, 10**6))
    n = draw(st.integers(min_units, 6))
    d = draw(st.integers(max(2, min_workers), 4))
    profiles = draw(st.lists(st.integers(0, 2), min_size=d, max_size=d))
    q = draw(st.integers(min_workers, min(3, n, d)))
    bandwidth = draw(st.sampled_from([1e9, 4e6, 1e6]))
    free = device_instance(n, profiles, seed=seed, bandwidth=bandwidth)
    memory = draw(st.sampled_from(["inf", "binding", "loose"]))
    if memory != "inf":
        whole = GroupProblem(free, q).stage_memory(0, n, 0)
        per = whole * (0.45 if memory == "binding" else 2.0) * (2 / max(q, 1))
        free = device_instance(n, profiles, seed=seed, bandwidth=bandwidth, memory=[per] * d)
    return GroupProblem(free, q)
