"""The exact tie-break by enumeration (pipeopt/problems/partition/tied.py: tied_splits,
run_times, least_run; issue 22): it lists exactly the splits the event-time MILP admits, scores
them as the run graph does, and ends at the same secondary value as the MILP wherever the MILP
proved its answer (on PipeDream's profiles: a few in the fast tier, all 14 at S in {2, 4, 8, 16}
in the slow tier)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from test_events import binding_memory, brute, make_instance

from pipeopt.io.pipedream import read_pipedream
from pipeopt.problems.partition import tied
from pipeopt.problems.partition.dp import solve_dp
from pipeopt.problems.partition.events import run_time
from pipeopt.problems.partition.problem import PartitionProblem
from pipeopt.problems.secondary import CAP_REL

PROFILES = Path("/work/shared/data/pipedream-profiles")
NAMES = sorted(p.stem for p in PROFILES.glob("*.txt") if p.name != "LICENSE.txt")


def _all_splits(n: int, S: int):
    return [list(c) for c in itertools.combinations(range(1, n), S - 1)]


@pytest.mark.parametrize("memory", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_tied_splits_are_exactly_the_capped_splits_that_fit(seed, memory):
    inst = make_instance(seed, 8, 3, M=5, bandwidth="fast")
    if memory:
        inst = binding_memory(inst, 3, "1f1b", seed)
    problem = PartitionProblem(inst, 3)
    starts = problem.starts_of(solve_dp(problem, time_limit=None).plan)
    T = problem.period(starts) * (1 + CAP_REL)
    reach = [problem.memory_reach(3 - s) for s in range(3)]

    def fits(c):
        p = [0, *c, problem.n]
        return all(p[s + 1] <= reach[s][p[s]] for s in range(3))

    listed = {tuple(c) for c in tied.tied_splits(problem, T * (1 + CAP_REL)).tolist() if problem.period(c) <= T}
    brute = {tuple(c) for c in _all_splits(problem.n, 3) if fits(c) and problem.period(c) <= T}
    assert listed == brute
    assert tuple(starts) in listed


@pytest.mark.parametrize("seed", range(3))
def test_run_times_equal_the_run_graph_one_by_one(seed):
    inst = make_instance(seed, 9, 4, M=6, bandwidth="tight")
    problem = PartitionProblem(inst, 4)
    splits = [tuple(c) for c in _all_splits(problem.n, 4)]
    got = tied.run_times(problem, splits)
    for c, v in zip(splits, got):
        assert math.isclose(v, run_time(problem, list(c), "1f1b")[0], rel_tol=1e-12, abs_tol=0.0)


@pytest.mark.parametrize("memory", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_break_ties_equals_brute_force(seed, memory):
    inst = make_instance(seed, 8, 3, M=5, bandwidth="fast")
    if memory:
        inst = binding_memory(inst, 3, "1f1b", seed)
    problem = PartitionProblem(inst, 3)
    res = solve_dp(problem, time_limit=None)
    rec = res.info["secondary"]
    assert rec["proven"]
    cap = problem.period(problem.starts_of(res.plan))
    assert math.isclose(rec["value"], brute(inst, 3, "1f1b", cap), rel_tol=1e-9)


def test_tied_splits_rows_are_distinct_in_lexicographic_order_on_a_profile():
    # PipeDream's AlexNet at S = 16: 18,372 tied splits from at most a few dozen window states per stage
    problem = PartitionProblem(read_pipedream(PROFILES / "alexnet.txt"), 16)
    starts = problem.starts_of(solve_dp(problem, time_limit=None).plan)
    T = problem.period(starts) * (1 + CAP_REL)
    rows = tied.tied_splits(problem, T * (1 + CAP_REL)).tolist()
    assert len(rows) == 18_372
    assert all(x < y for x, y in zip(rows, rows[1:]))  # strictly increasing: sorted and distinct
    assert all(0 < r[0] and all(u < v for u, v in zip(r, r[1:])) and r[-1] < problem.n for r in rows)
    assert list(starts) in rows


def test_split_limit_bounds_the_list_and_the_edge_limit_the_graph(monkeypatch):
    inst = make_instance(1, 9, 3, M=6, bandwidth="fast")
    problem = PartitionProblem(inst, 3)
    every = tied.tied_splits(problem, 1e6)  # a period no split reaches (seconds)
    assert len(every) == len(_all_splits(problem.n, 3))  # every split
    with monkeypatch.context() as m:
        m.setattr(tied, "ENUM_SPLITS", len(every) - 1)  # too many to list; the graph still stands
        assert tied.tied_splits(problem, 1e6) is None
        assert tied._tie_states(problem, 1e6).count == len(every)
    monkeypatch.setattr(tied, "ENUM_EDGES", 3)
    assert tied._tie_states(problem, 1e6) is None


def test_too_many_at_once_gives_up_and_records_nothing(monkeypatch):
    # PipeDream's GNMT at S = 8: 345,000 tied splits on a graph of 1,341 states
    problem = PartitionProblem(read_pipedream(PROFILES / "gnmt.txt"), 8)
    res = solve_dp(problem, time_limit=None)
    assert res.info["secondary"]["method"] == "enumeration" and res.info["secondary"]["splits"] > tied.ENUM_SPLITS
    starts = problem.starts_of(res.plan)
    monkeypatch.setattr(tied, "FRONTIER", 0)  # no partial split may be extended
    rec = {"value": res.info["secondary"]["value"]}
    assert tied.least_run(problem, starts, problem.period(starts), rec) is None
    assert rec == {"value": res.info["secondary"]["value"]}


def test_work_limit_gives_up_deterministically(monkeypatch):
    inst = make_instance(0, 9, 3, M=6, bandwidth="fast")
    problem = PartitionProblem(inst, 3)
    monkeypatch.setattr(tied, "ENUM_WORK", 3)
    assert tied.tied_splits(problem, math.inf) is None


def _both(name: str, S: int, monkeypatch):
    inst = read_pipedream(PROFILES / f"{name}.txt")
    if S > inst.chain.n:
        pytest.skip("more stages than units")
    new = solve_dp(PartitionProblem(inst, S), time_limit=None)
    with monkeypatch.context() as m:
        m.setattr(tied, "ENUM_WORK", 0)  # the former phase: descent, then the event-time MILP
        old = solve_dp(PartitionProblem(inst, S), time_limit=None)
    return new, old


def _check(new, old):
    a, b = new.info["secondary"], old.info["secondary"]
    assert math.isclose(new.objective, old.objective, rel_tol=1e-9)  # the primary optimum is untouched
    assert a["value"] <= b["value"] * (1 + 1e-9)  # never worse than the former phase
    if b["proven"] and a["proven"]:
        assert math.isclose(a["value"], b["value"], rel_tol=1e-9)
    if a.get("method") == "enumeration":
        assert a["proven"] and a["bound"] <= a["value"] * (1 + 1e-9)


@pytest.mark.parametrize("name,S", [("alexnet", 4), ("alexnet", 8), ("vgg16", 4), ("resnet18", 4)])
def test_profiles_enumeration_equals_milp(name, S, monkeypatch):
    new, old = _both(name, S, monkeypatch)
    assert new.info["secondary"].get("method") == "enumeration"
    _check(new, old)


@pytest.mark.slow
@pytest.mark.parametrize("S", [2, 4, 8, 16])
@pytest.mark.parametrize("name", NAMES)
def test_every_profile_enumeration_equals_milp(name, S, monkeypatch):
    new, old = _both(name, S, monkeypatch)
    _check(new, old)
