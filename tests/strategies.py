"""Random layer graphs and instances for property tests (hypothesis), and a brute-force
enumerator of contiguous splits used as the reference for exact methods."""

from __future__ import annotations

import itertools
import math

import networkx as nx
from hypothesis import strategies as st

from pipeopt import Cluster, Instance, Settings, evaluate
from pipeopt.errors import PipeoptError

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


@st.composite
def instances(draw, max_layers: int = 8, dag: bool = True, memory: bool = True) -> Instance:
    """A random instance on 8 identical GPUs, with random bandwidth, overlap and memory."""
    g = draw(layer_graphs(max_layers=max_layers, dag=dag))
    mem = draw(st.sampled_from([math.inf, 2e9, 5e9])) if memory else math.inf
    bw = draw(st.sampled_from([1e9, 1.25e10, 1e11]))
    settings = Settings(overlap=draw(st.booleans()), weight_stashing=draw(st.booleans()))
    return Instance(g, Cluster.homogeneous(8, memory=mem, bandwidth=bw), settings, name="random")


def compositions(n: int, k: int):
    """All ways to cut n units into k non-empty contiguous parts, as stage start indices."""
    for cuts in itertools.combinations(range(1, n), k - 1):
        yield list(cuts)


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
