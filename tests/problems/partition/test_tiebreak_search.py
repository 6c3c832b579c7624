"""The exact tie-break past the enumeration's limits (pipeopt/problems/partition/tied.py:
search_least, _RangeMin; issue 22): its branch and bound over partial splits gives the
enumeration's answer - the same split, secondary value and bound as least_run, which lists
every tied split - on random chains (zero-time layers, binding memory, tight bandwidth,
S = 2 .. n), and gives up at its node limit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_events import binding_memory, make_instance

from pipeopt import evaluate
from pipeopt.problems.partition import dp, tied
from pipeopt.problems.partition.dp import solve_dp
from pipeopt.problems.partition.problem import PartitionProblem


def primary_split(problem: PartitionProblem, monkeypatch) -> list[int]:
    """The split the DP proves optimal for the bottleneck, before its tie-break."""
    seen = []
    with monkeypatch.context() as m:
        m.setattr(dp, "break_ties", lambda _problem, starts, *a, **k: seen.append(list(starts)) or list(starts))
        solve_dp(problem, time_limit=None)
    return seen[0]


def _both(problem: PartitionProblem, starts: list[int]):
    period = problem.period(starts)
    value = evaluate(problem.instance, problem.plan(starts)).iteration_time
    listed, searched = {"value": value}, {"value": value}
    a = tied.least_run(problem, starts, period, listed)
    b = tied.search_least(problem, starts, period, searched)
    return a, listed, b, searched


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), n=st.integers(3, 12), S=st.integers(2, 6), M=st.integers(1, 9),
       overlap=st.booleans(), bandwidth=st.sampled_from(["fast", "medium", "tight"]), memory=st.booleans(),
       zeros=st.booleans())
def test_search_equals_the_enumeration(seed, n, S, M, overlap, bandwidth, memory, zeros, monkeypatch):
    S = min(S, n)
    inst = make_instance(seed, n, S, M=M, overlap=overlap, bandwidth=bandwidth, zeros=zeros)
    if memory:
        inst = binding_memory(inst, S, "1f1b", seed)
    problem = PartitionProblem(inst, S)
    try:
        starts = primary_split(problem, monkeypatch)
    except Exception:  # no split fits: nothing to break
        return
    a, listed, b, searched = _both(problem, starts)
    assert a == b
    assert listed["value"] == searched["value"]
    assert np.isclose(listed["bound"], searched["bound"], rtol=1e-12, atol=0)
    assert searched["proven"] and searched["method"] == "search"


def test_search_gives_up_at_its_node_limit(monkeypatch):
    problem = PartitionProblem(make_instance(3, 10, 4, M=6, bandwidth="fast"), 4)
    starts = primary_split(problem, monkeypatch)
    monkeypatch.setattr(tied, "SEARCH_NODES", 0)
    rec = {"value": evaluate(problem.instance, problem.plan(starts)).iteration_time}
    assert tied.search_least(problem, starts, problem.period(starts), rec) is None
    assert "method" not in rec  # nothing recorded


@pytest.mark.parametrize("seed", range(5))
def test_range_min_equals_slices(seed):
    rng = np.random.default_rng(seed)
    values = rng.random((int(rng.integers(1, 40)), 3))
    lo = rng.integers(0, len(values), 50)
    hi = rng.integers(-1, len(values), 50)
    got = tied._RangeMin(values).query(lo, hi)
    for i in range(50):
        want = values[lo[i]:hi[i] + 1].min(axis=0) if lo[i] <= hi[i] else np.full(3, np.inf)
        assert np.array_equal(got[i], want)
