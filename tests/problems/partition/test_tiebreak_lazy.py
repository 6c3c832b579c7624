"""The tie-break's order (pipeopt/problems/partition/tied.py: _TieStates, _LeastFirst;
issue 22): timing only the tied splits whose path bound is at most an upper bound gives the same
order -- least 1F1B-flush time, then lexicographic -- and the same times as timing every tied
split with run_times, hence the same chosen split; on the shipped profiles with many tied splits
(AlexNet at S = 16, ResNet-18 at S = 8) and on random chains (bounds forced on small ones)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_events import make_instance
from test_tiebreak_search import primary_split

from pipeopt.io.pipedream import read_pipedream
from pipeopt.problems.partition import tied
from pipeopt.problems.partition.dp import solve_dp
from pipeopt.problems.partition.problem import PartitionProblem
from pipeopt.problems.secondary import CAP_REL

PROFILES = Path("/work/shared/data/pipedream-profiles")


def _check(problem: PartitionProblem, starts: list[int], first: int = 12) -> tied._LeastFirst:
    T = problem.period(starts) * (1 + CAP_REL)
    tie = tied._tie_states(problem, T * (1 + CAP_REL))
    splits = tie.rows()
    if not (splits == np.array(starts)[None, :]).all(axis=1).any():
        splits = np.vstack([splits, np.array(starts)[None, :]])  # the proven split, float order aside
    full = tied.run_times(problem, splits)
    want = [(splits[i].tolist(), float(full[i])) for i in np.lexsort([*splits.T[::-1], full])[:first]]
    order = tied._LeastFirst(problem, tie, list(starts))
    head = len(order.first[0])  # the splits given before any fallback
    assert head >= 1
    got = list(itertools.islice(iter(order), first))
    assert got == want  # the same splits in the same order, the same floats
    return order, head, len(splits)


@pytest.mark.parametrize("name, stages", [("alexnet", 16), ("resnet18", 8)])
def test_order_equals_timing_every_tied_split_on_profiles(name, stages, monkeypatch):
    problem = PartitionProblem(read_pipedream(PROFILES / f"{name}.txt"), stages)
    primary = primary_split(problem, monkeypatch)
    final = problem.starts_of(solve_dp(problem, time_limit=None).plan)
    assert primary != final  # the tie-break moves it: the order starts from a slower split
    for starts in (primary, final):
        order, _, count = _check(problem, starts)
        assert count > tied._LeastFirst.ALL
        fresh = tied._LeastFirst(problem, order.tie, starts)
        assert fresh.timed < count / 20  # the first splits from a few timings


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), n=st.integers(6, 12), S=st.integers(2, 5), M=st.integers(1, 9),
       overlap=st.booleans(), bandwidth=st.sampled_from(["fast", "medium", "tight"]), probes=st.sampled_from([1, 2, 8]),
       candidates=st.sampled_from([0, 3, 2048]), dives=st.sampled_from([0, 1, 4]), other=st.integers(0, 10**6))
def test_order_equals_timing_every_tied_split_on_random_chains(seed, n, S, M, overlap, bandwidth, probes, candidates,
                                                               dives, other, monkeypatch):
    S = min(S, n)
    problem = PartitionProblem(make_instance(seed, n, S, M=M, overlap=overlap, bandwidth=bandwidth), S)
    starts = problem.starts_of(solve_dp(problem, time_limit=None).plan)
    with monkeypatch.context() as m:
        m.setattr(tied._LeastFirst, "ALL", 0)  # the bounds on a small instance
        m.setattr(tied._LeastFirst, "CANDIDATES", candidates)
        m.setattr(tied._LeastFirst, "PROBES", probes)
        m.setattr(tied._LeastFirst, "DIVES", dives)
        _check(problem, starts, first=50)  # past the candidates too: the fallback continues the order


def test_the_secondary_phase_ends_at_the_same_split_with_or_without_bounds(monkeypatch):
    inst = read_pipedream(PROFILES / "alexnet.txt")
    res = solve_dp(PartitionProblem(inst, 16), time_limit=None)
    with monkeypatch.context() as m:
        m.setattr(tied._LeastFirst, "ALL", 10**9)  # every tied split timed at once
        ref = solve_dp(PartitionProblem(inst, 16), time_limit=None)
    assert res.plan == ref.plan and res.info["secondary"]["value"] == ref.info["secondary"]["value"]
    assert res.info["secondary"]["bound"] == ref.info["secondary"]["bound"]
    assert res.info["secondary"]["timed"] < ref.info["secondary"]["timed"] == ref.info["secondary"]["splits"]
