"""The fixed-order split search (pipeopt/problems/schedule/split_search.py):

* its stage tables give the durations :func:`.model.chunk_durations` gives a whole split, and the
  longest path it reads off them is the executor's time (memory aside);
* every path bound (the least over splits of a path's length), the LP relaxation and the bound of
  its dual's path weights are below the exhaustive optimum;
* the branch and bound equals :func:`.exhaustive.exhaustive` on small random chains, for torch's
  orders with one and two chunks per rank, with and without memory limits, overlap and latency
  (node limits only; an unfinished search reports a bound below the optimum).
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import chain_graph, split_backward_chains

from pipeopt import Cluster, Instance, Settings
from pipeopt.errors import InvalidProblemError, PipeoptError
from pipeopt.problems.schedule import ScheduleProblem
from pipeopt.problems.schedule.exhaustive import exhaustive
from pipeopt.problems.schedule.model import chunk_durations
from pipeopt.problems.schedule.split_search import (KINDS, SplitTables, lp_weights, path_counts, search,
                                                    solve_split_search, supported)

FEW = settings(max_examples=40, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
REL = 1e-9
ORDERS = [("GPipe", None, 2), ("1F1B", None, 2), ("1F1B", None, 3), ("InterleavedZeroBubble", 1, 2),
          ("Interleaved1F1B", 2, 2), ("LoopedBFS", 2, 2), ("InterleavedZeroBubble", 2, 2),
          ("ZBVZeroBubble", 2, 2), ("DualPipeV", 2, 2)]


@st.composite
def chains(draw, n_min=4, n_max=9):
    n = draw(st.integers(n_min, n_max))
    g = draw(split_backward_chains(n))
    memory = draw(st.sampled_from([math.inf, 4e8 * n / 2 + 3e8, 1.2e9, 8e8]))
    latency = draw(st.sampled_from([0.0, 0.01]))
    return Instance(g, Cluster.homogeneous(3, memory=memory, bandwidth=1e9, latency=latency),
                    Settings(overlap=draw(st.booleans())))


def problem_of(inst, order):
    name, v, m = order
    p = 3 if name == "1F1B" and m == 3 else 2
    try:
        return ScheduleProblem(inst, name, p, m + 1, v)
    except PipeoptError:
        return None


@FEW
@given(chains(), st.sampled_from(ORDERS), st.integers(0, 10**6))
def test_tables_give_the_executor_durations_and_time(inst, order, seed):
    problem = problem_of(inst, order)
    if problem is None:
        return
    tab = SplitTables(problem)
    rng = random.Random(seed)
    starts = sorted(rng.sample(range(1, problem.n), problem.S - 1))
    want = chunk_durations(problem, starts)
    b = [0, *starts, problem.n]
    for k, kind in enumerate(KINDS[:4]):
        for s in range(problem.S):
            if tab.ok[s, b[s], b[s + 1]]:
                assert tab.T[s, k, b[s], b[s + 1]] == pytest.approx(want[kind][s], rel=REL, abs=1e-12)
    if all(tab.ok[s, b[s], b[s + 1]] for s in range(problem.S)):
        length, counts = path_counts(problem, tab.graph, tab.durations(starts))
        assert length == pytest.approx(problem.execute(starts).time, rel=REL)
        # the path's length, recomputed from its counts, is the same number
        again = sum(counts[s] @ tab.T[s, :, b[s], b[s + 1]] for s in range(problem.S))
        assert again == pytest.approx(length, rel=REL)


@FEW
@given(chains(), st.sampled_from(ORDERS), st.integers(1, 200))
def test_search_equals_exhaustive(inst, order, node_limit):
    problem = problem_of(inst, order)
    if problem is None:
        return
    want = exhaustive(problem)
    got = solve_split_search(problem, time_limit=None)
    assert got.status == ("optimal" if want.status == "optimal" else "infeasible")
    if want.status == "optimal":
        assert got.objective == pytest.approx(want.objective, rel=1e-7)
        assert got.lower_bound <= want.objective * (1 + 1e-9)
        if got.info["lp_bound"] is not None:  # the LP relaxation and its path weights' bound
            assert got.info["lp_bound"] <= want.objective * (1 + 1e-7)
            tab = SplitTables(problem)
            tab.add_path(lp_weights(problem)[1])
            assert tab.root_bound() <= want.objective * (1 + 1e-9)
    # stopped early: the reported bound is still below the optimum; the path bounds too
    part = solve_split_search(problem, time_limit=None, node_limit=node_limit)
    if want.status == "optimal":
        assert part.lower_bound <= want.objective * (1 + 1e-9)
        tab = SplitTables(problem)
        out = search(problem, node_limit=node_limit, tables=tab)
        assert out["bound"] <= want.objective * (1 + 1e-9)
        assert (tab.suffix[:, 0, 0] <= want.objective * (1 + 1e-9)).all()
    else:
        assert part.plan is None or part.status == "infeasible"


def test_refuses_what_it_does_not_model():
    g = chain_graph([1.0] * 6, [2.0] * 6, act=1e8, param=1e8)
    inst = Instance(g, Cluster.homogeneous(2, memory=math.inf, bandwidth=1e9), Settings())
    problem = ScheduleProblem(inst, "1F1B", 2, 4, recompute="full")
    assert not supported(problem)
    with pytest.raises(InvalidProblemError):
        search(problem)
    assert supported(ScheduleProblem(inst, "ZBVZeroBubble", 2, 4))
