"""Local search over groupings: a heuristic start for the exact group methods.

A plan of the group problem is a worker per stage (a count of each device class,
:attr:`~pipeopt.problems.resource.GroupProblem.device_classes`) and a contiguous split of the
chain over the workers. :func:`improve` starts from a plan and repeats first-improvement moves:

* **move** one device of class t from stage a's worker to stage b's (a keeps a device);
* **swap** a device of class t on stage a with one of class t' on stage b.

A grouping is accepted when the chain over its workers has a split of period at most
``best (1 - step)``, decided exactly by the chain DP at that limit
(:class:`~pipeopt.problems.resource.problem.ChainProbe`: memory, the cuts, the window rows and
each stage's best forward share; one DP of ``O(S n^2)``), and its split is then scored exactly
(:meth:`~pipeopt.problems.resource.ResourceProblem.plan_value`). When no move reaches
``best (1 - step)``, the next smaller step of :data:`STEPS` is tried; the search ends at a plan
no move improves by the smallest step, or at the deadline. The least busy times of the
workers seen at one limit are shared between the moves' DPs (a move changes two workers).

It proves nothing: its plan is a start (an incumbent) for
:func:`pipeopt.problems.resource.group_dp.solve_dp` and the group MILP and CP-SAT
(:func:`pipeopt.problems.resource.group._starts`), which certify or bound it. Measured (GPT-2 XL
over 64 devices of 4 mixed kinds into 16 workers, the group-scale benchmark's seed 2): from
Algorithm 2's 11.63 ms to 8.59 ms in about 6 CPU seconds, where the type DP's beam passes took
20 s to reach 8.59 ms (the optimum is 8.44 ms).
"""

from __future__ import annotations

import math

import numpy as np

from ...backends.deadline import Deadline, DeadlineReached
from .problem import ChainProbe, GroupProblem

STEPS = (2e-3, 5e-4, 1.25e-4, 3e-5)
"""Relative improvements a move must reach, tried in turn (the next when no move reaches one)."""


def moves(counts: np.ndarray):
    """Every neighbour of the count matrix ``counts`` (``(classes, S)``, ints): one device moved
    from one stage to another (the first keeps a device), then one device of each of two classes
    swapped between two stages; yields new matrices, in a fixed order."""
    tau, S = counts.shape
    sizes = counts.sum(axis=0)
    for a in range(S):
        if sizes[a] < 2:
            continue
        for b in range(S):
            if a == b:
                continue
            for t in range(tau):
                if counts[t, a] > 0:
                    out = counts.copy()
                    out[t, a] -= 1
                    out[t, b] += 1
                    yield out
    for a in range(S):
        for b in range(a + 1, S):
            for t in range(tau):
                if counts[t, a] == 0:
                    continue
                for u in range(tau):
                    if u != t and counts[u, b] > 0:
                        out = counts.copy()
                        out[t, a] -= 1
                        out[t, b] += 1
                        out[u, b] -= 1
                        out[u, a] += 1
                        yield out


def improve(problem: GroupProblem, starts, groups, deadline: Deadline | None = None) -> tuple[list, list, float]:
    """First-improvement local search from the plan ``(starts, groups)`` (module docstring).

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.GroupProblem`.
    starts, groups
        The plan to start from: stage starts (``S - 1`` unit indices) and each stage's worker
        (device names).
    deadline
        Stops the search (its best plan so far is returned); ``None``: run to a local optimum.

    Returns
    -------
    (starts, groups, value)
        The best plan found and its period (seconds, :meth:`plan_value`); the given plan if it
        does not fit memory (``value`` then ``inf``) or nothing improves it.
    """
    best = problem.plan_value(starts, groups)
    if not math.isfinite(best):
        return list(starts), list(groups), best
    counts = np.array([problem.class_counts(g) for g in groups], dtype=np.int64).T
    starts, groups = list(starts), list(groups)
    try:
        for step in STEPS:
            while True:
                found = _first_better(problem, counts, best * (1.0 - step), deadline)
                if found is None:
                    break
                c2, g2, st2 = found
                value = problem.plan_value(st2, g2)
                if not value < best:  # the DP's limit holds up to float rounding; no progress
                    break
                counts, groups, starts, best = c2, g2, st2, value
    except DeadlineReached:
        pass
    return starts, groups, best


def improve_best(problem: GroupProblem, plans: list[tuple], deadline: Deadline | None = None) -> list[tuple]:
    """The best of ``plans`` (``[(starts, groups), ...]``) improved by :func:`improve` (until
    ``deadline``): ``[(starts, groups)]`` if it found a better plan, else ``[]`` (also when
    ``plans`` is empty or none fits memory). The group methods' start (:mod:`.group`) and the type
    DP's polish before its bisection (:mod:`.group_dp`) call it."""
    values = [problem.plan_value(*cand) for cand in plans]
    if not plans or not math.isfinite(min(values)):
        return []
    at = min(range(len(plans)), key=values.__getitem__)
    found, groups, value = improve(problem, *plans[at], deadline)
    return [(found, groups)] if value < values[at] else []


def _first_better(problem: GroupProblem, counts: np.ndarray, T: float, deadline: Deadline | None):
    """The first neighbour of ``counts`` (:func:`moves`) whose chain has a split of period at most
    T: ``(counts, groups, starts)``, or ``None``."""
    cache: dict = {}
    for c2 in moves(counts):
        if deadline is not None:
            deadline.check("the local search over groupings")
        g2 = problem.groups_from_counts(c2.tolist())
        st = ChainProbe(problem, g2).solve(T, cache=cache)
        if st is not None:
            return c2, g2, st
    return None
