"""Duan & Wu's binary-search partition: one generic core for every stage time.

A bottleneck limit T is easy to check greedily: walk the units left to right and let each
stage end at the farthest unit that keeps its stage time <= T (:func:`greedy_starts`).
Bisection on T then finds the smallest limit the greedy accepts (:func:`bisect_limit`), and
a plan with fewer stages than workers gets its missing cuts where they cost least
(:func:`complete_stages`). The problems only supply their **stage time**:

``stage_time(stage, a, b) -> ndarray``
    Seconds per microbatch of stage ``stage`` (0-based position in the pipeline, which
    fixes its worker and its 1F1B in-flight count) made of units ``a .. b-1``, including the
    transfers of its two cuts (before unit ``a`` and before unit ``b``) as the problem counts
    them, and ``inf`` when the stage does not fit in its worker's memory. ``a`` and ``b`` are
    ints or integer ``ndarray``s that broadcast together; the result has their broadcast shape.

The adapters are :func:`pipeopt.problems.partition.binary_search.binary_search` (partition problem:
identical single-kind workers, :meth:`pipeopt.problems.partition.problem.PartitionProblem.stage_time`) and
:func:`pipeopt.problems.resource.duan_wu.bisection_partition` (resource problems: multi-kind fixed
workers, split or sequential stage time).

The greedy check is exact for stage times that are non-decreasing in ``b`` and
non-increasing in ``a`` (compute and memory only). Cut transfers are not monotone (a later
cut may carry fewer bytes) and under 1F1B the greedy's packing decides the in-flight counts
of later stages, so in general the result is a **heuristic** upper bound on the optimum.

References
----------
Duan, Y. and Wu, J., *Optimizing Resource Allocation in Pipeline Parallelism for Distributed
DNN Training*, ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from ..errors import InvalidProblemError

StageTime = Callable[[int, "int | np.ndarray", "int | np.ndarray"], np.ndarray]
"""``stage_time(stage, a, b) -> ndarray`` seconds (see the module docstring)."""

INSERTS = ("within", "shift")


def _check_sizes(n: int, stages: int) -> None:
    if not 1 <= stages <= n:
        raise InvalidProblemError(f"cannot split {n} units into {stages} non-empty stages")


def greedy_starts(
    n: int,
    stages: int,
    stage_time: StageTime,
    limit: float,
    *,
    bound: StageTime | None = None,
) -> list[int] | None:
    """Duan & Wu's greedy check of a bottleneck limit T.

    Stage t = 0, 1, ... starts where stage t - 1 ended and extends to the farthest end ``b``
    whose ``stage_time(t, a, b)`` is finite and <= ``limit``; the check fails when a stage
    cannot take even one unit or the units outlast the stages.

    Parameters
    ----------
    n
        Number of units of the chain.
    stages
        S, the most stages the plan may have.
    stage_time
        ``stage_time(stage, a, b)``, seconds (see the module docstring). Without ``bound``
        it is called once per stage with ``b`` an ``ndarray`` of every end ``a+1 .. n``.
    limit
        T, seconds (may be ``inf``: then only memory limits the stages).
    bound
        Optional ``bound(stage, a, b)``, seconds: a lower bound on ``stage_time`` that is
        non-decreasing in ``b`` (e.g. the compute-and-memory part, without the cuts). If
        given, the ends are scanned one at a time (scalar ``b``) and the scan stops at the
        first end whose bound exceeds ``limit`` or is ``inf``: use it when the stage time is
        costly (one LP per call) and not vectorised.

    Returns
    -------
    list[int] or None
        The unit index where each stage after the first begins (at most S - 1 entries,
        increasing), or ``None`` if the greedy needs more than S stages.

    References
    ----------
    Duan & Wu, ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029 (partition by binary search).
    """
    a, starts = 0, []
    for t in range(stages):
        if bound is None:
            ends = np.arange(a + 1, n + 1)
            times = np.asarray(stage_time(t, a, ends), dtype=float)
            ok = np.flatnonzero(np.isfinite(times) & (times <= limit))
            b_ok = int(ends[ok[-1]]) if ok.size else None
        else:
            b_ok = None
            for b in range(a + 1, n + 1):
                lb = float(bound(t, a, b))
                if lb > limit or math.isinf(lb):
                    break  # the bound only grows with b
                v = float(stage_time(t, a, b))
                if math.isfinite(v) and v <= limit:
                    b_ok = b
        if b_ok is None:
            return None
        a = b_ok
        if a == n:
            return starts
        starts.append(a)
    return None


def _times(stage_time: StageTime, bounds: Sequence[int], offset: int = 0) -> list[float]:
    """Stage times of the plan ``bounds`` with stage s at position s + offset."""
    return [float(stage_time(s + offset, bounds[s], bounds[s + 1])) for s in range(len(bounds) - 1)]


def bottleneck(n: int, stage_time: StageTime, starts: Sequence[int]) -> float:
    """Bottleneck of the plan whose stages start at ``[0, *starts]``: the max stage time.

    Parameters
    ----------
    n
        Number of units.
    stage_time
        ``stage_time(stage, a, b)``, seconds (see the module docstring).
    starts
        Unit index where each stage after the first begins (increasing); stage s sits at
        position s.

    Returns
    -------
    float
        Seconds per microbatch (``inf`` if a stage does not fit in memory).
    """
    return max(_times(stage_time, [0, *(int(c) for c in starts), n]))


def complete_stages(
    n: int,
    stages: int,
    stage_time: StageTime,
    starts: Sequence[int],
    *,
    insert: str = "within",
) -> list[int]:
    """Add cuts to a plan with fewer than S stages until it has exactly S non-empty stages.

    One cut at a time, over every stage of the current plan and every position inside it,
    the cut of smallest score is added (ties: the leftmost). ``insert`` says what moves:

    ``"within"``
        The score is the time of the two halves only, ``max(stage_time(t, a, c),
        stage_time(t + 1, c, b))`` for stage t = units ``a..b-1``; the other stages keep
        their times as they were. Right when a stage's time depends on its position only
        through 1F1B memory (identical workers: moving a stage later lowers its in-flight
        count, so its time can only drop). Used by the partition problem.
    ``"shift"``
        The score is the bottleneck of the whole new plan: stages after the cut move to the
        next position (the next worker), with their times there. Needed when the workers
        differ (fixed worker groups). Used by the resource problems.

    Splitting never adds compute to a stage, but the new cut's transfer can exceed the old
    bottleneck: hence the choice of the cheapest cut.

    Parameters
    ----------
    n
        Number of units.
    stages
        S, the number of stages wanted (<= n).
    stage_time
        ``stage_time(stage, a, b)``, seconds (see the module docstring), vectorised over
        ``a`` and ``b``.
    starts
        Unit index where each stage after the first begins (entries outside ``1 .. n-1``
        and duplicates are dropped).
    insert
        ``"within"`` or ``"shift"`` (above).

    Returns
    -------
    list[int]
        The S - 1 stage starts, increasing.

    Raises
    ------
    InvalidProblemError
        If ``insert`` is unknown or S is not in ``1 .. n``.

    References
    ----------
    Duan & Wu, ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029.
    """
    if insert not in INSERTS:
        raise InvalidProblemError(f"unknown insert mode {insert!r}; choose from {INSERTS}")
    _check_sizes(n, stages)
    starts = sorted({int(c) for c in starts if 0 < c < n})
    while len(starts) + 1 < stages:
        bounds = [0, *starts, n]
        k = len(bounds) - 1
        if insert == "shift":
            here = _times(stage_time, bounds)  # stages before the cut keep their position
            moved = _times(stage_time, bounds, offset=1)  # stages after it move one later
            before = np.maximum.accumulate([-math.inf, *here])[:k]  # max over s < t
            after = np.maximum.accumulate([-math.inf, *moved[::-1]])[:k][::-1]  # max over s > t
        best_score, best_cut = math.inf, None
        for t in range(k):
            a, b = bounds[t], bounds[t + 1]
            if b - a < 2:
                continue
            cuts = np.arange(a + 1, b)
            score = np.maximum(stage_time(t, a, cuts), stage_time(t + 1, cuts, b))
            if insert == "shift":
                score = np.maximum(score, max(before[t], after[t]))
            i = int(np.argmin(score))
            if best_cut is None or score[i] < best_score:
                best_score, best_cut = float(score[i]), int(cuts[i])
        starts = sorted([*starts, best_cut])
    return starts


class Bisection(NamedTuple):
    """Outcome of :func:`bisect_limit`."""

    starts: list
    """Stage starts of the kept plan (as the check returned them)."""
    limit: float
    """The smallest accepted limit T (seconds): the final upper end of the bracket."""
    iterations: int
    """Checks made at bracket midpoints."""


def bisect_limit(
    check: Callable[[float], list[int] | None],
    lo: float,
    hi: float,
    starts: list[int],
    *,
    rel_tol: float = 1e-9,
    deadline: float | None = None,
    max_iter: int = 200,
    score: Callable[[list[int]], float] | None = None,
) -> Bisection:
    """Bisection on the bottleneck limit T between a lower and an upper bound.

    First ``check(lo)``: if it accepts, the bracket closes at ``lo``. Otherwise the midpoint
    of ``[lo, hi]`` is checked repeatedly; an accepted midpoint becomes ``hi`` (its plan is
    kept), a rejected one ``lo``. Stops when ``hi - lo <= rel_tol * hi``, after ``max_iter``
    midpoints, or at ``deadline``.

    Parameters
    ----------
    check
        ``check(T) -> starts or None``: the greedy check (:func:`greedy_starts`) of limit T
        seconds.
    lo, hi
        Lower and upper bound on T, seconds (``0 <= lo <= hi < inf``).
    starts
        A plan accepted at ``hi`` (or the plan to fall back on): stage starts.
    rel_tol
        Relative width of the bracket at which the bisection stops.
    deadline
        ``time.perf_counter()`` value after which no further midpoint is checked (None:
        no deadline).
    max_iter
        Most midpoints checked (guards against a bracket that floats cannot narrow).
    score
        If given, ``score(starts) -> seconds`` of a plan; every accepted plan is scored and
        the best-scoring one is kept (ties: the earlier), e.g. the bottleneck after
        :func:`complete_stages` when the greedy plan has fewer stages. Without it, the plan
        accepted at the smallest limit is kept.

    Returns
    -------
    Bisection
        ``(starts, limit, iterations)``: the kept plan's starts, the final ``hi``, and the
        number of midpoints checked.

    References
    ----------
    Duan & Wu, ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029.
    """
    best = starts
    best_score = score(starts) if score is not None else None

    def keep(st):
        nonlocal best, best_score
        if score is None:
            best = st
            return
        v = score(st)
        if v < best_score:
            best, best_score = st, v

    iterations = 0
    first = check(lo)
    if first is not None:
        keep(first)
        return Bisection(best, lo, 0)
    while iterations < max_iter and hi - lo > rel_tol * hi:
        if deadline is not None and time.perf_counter() >= deadline:
            break
        mid = 0.5 * (lo + hi)
        iterations += 1
        st = check(mid)
        if st is None:
            lo = mid
        else:
            keep(st)
            hi = mid
    return Bisection(best, hi, iterations)
