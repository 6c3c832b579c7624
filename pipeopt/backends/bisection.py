"""The one bisection on the bottleneck limit T, and Duan & Wu's greedy chain probe.

**The bisection** (:func:`bisect`): a bracket ``[lower, upper]`` on T and a *probe* that
answers, for one T, whether some plan has bottleneck <= T (:class:`Probe`: feasible with a
plan, infeasible, or unknown). Every bisection on T in pipeopt is this one function:

* exact probes (a MILP or CP-SAT model at fixed T, the resource problems'
  :mod:`pipeopt.problems.resource.search`): an infeasible answer is a proof, so ``lower`` is a
  valid lower bound and a closed bracket certifies the plan within ``rel_tol``; an unknown
  answer (the probe's share of the time ran out) is searched around;
* greedy checks (:func:`bisect_limit`, Duan & Wu's partition heuristic): accept or reject.

**The greedy chain probe.** A bottleneck limit T is easy to check greedily: walk the units
left to right and let each stage end at the farthest unit that keeps its stage time <= T
(:func:`greedy_starts`). Bisection on T then finds the smallest limit the greedy accepts
(:func:`bisect_limit`), and a plan with fewer stages than workers gets its missing cuts where
they cost least (:func:`complete_stages`). The problems only supply their **stage time**:

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
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..cost.tolerance import SUM_ORDER
from ..errors import InvalidProblemError
from .deadline import Deadline

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


# ---- the one bisection on T --------------------------------------------------------------------

FEASIBLE = "feasible"
"""Probe outcome: a plan with bottleneck <= T was found (a greedy check: T is accepted)."""
INFEASIBLE = "infeasible"
"""Probe outcome: no plan has bottleneck <= T (an exact probe: proven; a greedy check: rejected)."""
UNKNOWN = "unknown"
"""Probe outcome: undecided (the probe ran out of time, or it could not certify its plan)."""


class Probe(NamedTuple):
    """What one check of a bottleneck limit T found: the answer of ``probe(T, deadline)``.

    Attributes
    ----------
    outcome
        :data:`FEASIBLE`, :data:`INFEASIBLE` or :data:`UNKNOWN`.
    plan
        With :data:`FEASIBLE`: the plan found (any object the caller understands).
    value
        The plan's exact bottleneck in seconds, or ``None`` if the plan is only known to pass
        T (a greedy check whose plan is completed later); then T itself becomes the upper end.
    """

    outcome: str
    plan: object = None
    value: float | None = None


@dataclass
class Bisection:
    """Outcome of :func:`bisect`.

    Attributes
    ----------
    plan
        The plan kept (``None`` if no probe found one and no start was given).
    value
        Its score (by default its bottleneck, or the limit it passed), seconds; ``inf`` without
        a plan.
    upper
        The bracket's upper end: the smallest limit some plan is known to pass (the kept plan's
        bottleneck for exact probes), seconds.
    lower
        The bracket's lower end: the largest limit rejected (for exact probes, proven: a valid
        lower bound on the optimum), or the given lower bound.
    closed
        ``upper - lower <= rel_tol * lower``: the bracket is closed (exact probes: the plan is
        optimal within ``rel_tol``). Without a plan, ``closed`` means that no plan passes the
        given upper limit (exact probes: proven).
    steps
        ``list[(T, outcome)]`` of every probe, in order.
    iterations
        Probes at bracket midpoints (the probes at ``lower`` and at ``upper`` not counted).
    stop
        Why the search ended: ``"closed"``, ``"deadline"``, ``"undecided"`` (a probe could not
        decide even with all the time left), ``"max_iter"`` or ``"floats"`` (the bracket cannot
        be split further).
    """

    plan: object
    value: float
    upper: float
    lower: float
    closed: bool
    steps: list = field(default_factory=list)
    iterations: int = 0
    stop: str = "closed"


TOP_PROBES = 3
"""Most probes just below the upper end with ``probe_top`` (:func:`bisect`)."""

TOP_SHARE = 0.5
"""A probe just below the upper end (``probe_top``) gets this fraction of a midpoint's share
of the clock: it bets that the start is optimal, where a rejection is quick (a tight limit),
and a poor start makes it a generous limit, where an exact probe is slowest."""


def bisect(
    probe: Callable[[float, Deadline | None], Probe],
    lower: float,
    upper: float,
    *,
    start: object = None,
    start_value: float | None = None,
    rel_tol: float = SUM_ORDER,
    deadline: Deadline | None = None,
    step_share: float | None = None,
    min_step: float = 1.0,
    max_iter: int = 200,
    probe_lower: bool = False,
    probe_top: bool = False,
    first_top_share: float | None = None,
    top_after_plan: bool = False,
    score: Callable[[object], float] | None = None,
) -> Bisection:
    """The one bisection on the bottleneck limit T, for greedy checks and exact probes alike.

    Keeps a bracket ``[lower, upper]`` on T and probes its midpoint: a plan found moves the
    upper end (to the plan's bottleneck, or to T if the probe gives none), a rejection moves
    the lower end to T. A probe that cannot decide (:data:`UNKNOWN`, e.g. its solver ran out
    of its share of the time) marks its T as *hard*: the search continues below it, where
    proofs are easier, and retries above it with all the time left once the bracket below is
    closed. Stops when the bracket is closed (``upper - lower <= rel_tol * lower``), at the
    deadline, after ``max_iter`` midpoints, when a hard T stays undecided with all the time
    left, or when floats cannot split the bracket.

    Parameters
    ----------
    probe
        ``probe(T, deadline) -> Probe``: is there a plan with bottleneck <= T seconds?
        ``deadline`` is the probe's share of the time (a
        :class:`~pipeopt.backends.deadline.Deadline` on the caller's clock, or ``None``).
        An exact probe answers :data:`INFEASIBLE` only with a proof; then ``lower`` is a
        valid lower bound.
    lower
        A lower end: a valid lower bound on the optimum (exact probes) or a limit no plan
        passes, seconds (>= 0).
    upper
        An upper end, seconds: the bottleneck of ``start``, or, without a start, a limit that
        every plan passes if any plan exists at all (then it is probed first, with all the time).
    start
        A plan known to pass ``upper`` (the incumbent), or ``None``.
    start_value
        Score of ``start`` (default ``score(start)`` if ``score`` is given, else ``upper``).
    rel_tol
        Relative width at which the bracket is closed. Relative to ``lower``, so that a closed
        bracket means ``upper <= (1 + rel_tol) * lower <= (1 + rel_tol) * optimum``.
    deadline
        The caller's :class:`~pipeopt.backends.deadline.Deadline` (``None``: no limit). No
        probe starts after it has passed.
    step_share
        If given, each midpoint probe gets at most this share of the time left (at least
        ``min_step`` seconds, never beyond the deadline); a retry above a hard T gets all of it.
        ``None``: every probe gets all the time left.
    min_step
        Seconds: the smallest share a probe is given (see ``step_share``).
    max_iter
        Most midpoint probes (guards against a bracket that floats cannot narrow).
    probe_lower
        Probe ``lower`` itself first (a greedy check that may accept its lower bound).
    probe_top
        Before the midpoints, probe just below the upper end, at ``upper / (1 + rel_tol / 2)``:
        when the start is optimal (a good heuristic start often is), one rejection there closes
        the bracket, instead of the ``log2(gap / rel_tol)`` midpoints that walk the lower end up
        to it; a plan found there moves the upper end and the next probe is just below it again,
        at most :data:`TOP_PROBES` times in all, each with :data:`TOP_SHARE` of a midpoint's clock.
    first_top_share
        With ``probe_top``: the first probe just below the upper end gets this fraction of the
        time left instead (at least ``min_step`` seconds), e.g. ``1.0`` for a probe that is
        all-or-nothing and whose starts are its own heuristic's (a rejection there proves the
        start optimal; a short clock would only be spent). ``None``: :data:`TOP_SHARE` as the others.
    top_after_plan
        After a midpoint probe finds a plan that moves the upper end, probe just below the new
        upper end next (as ``probe_top`` does, with a midpoint's clock), and again while such
        probes find plans: for cheap exact probes
        whose plans are often optimal (an exact DP's), where the midpoints would otherwise walk
        the lower end up to it in ``log2(gap / rel_tol)`` rejections.
    score
        ``score(plan) -> float``: the plan kept is the one of least score (ties: the
        earlier), e.g. the bottleneck after :func:`complete_stages`. Default: the plan's
        :attr:`Probe.value`, else the limit it passed.

    Returns
    -------
    Bisection

    References
    ----------
    Duan & Wu, ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029 (partition by binary search on
    the bottleneck).
    """
    lower, upper = float(lower), float(upper)
    steps: list = []
    best, best_key = None, math.inf
    if start is not None:
        best = start
        best_key = score(start) if score is not None else (upper if start_value is None else float(start_value))

    def expired() -> bool:
        return deadline is not None and deadline.expired()

    def closed() -> bool:
        return upper - lower <= rel_tol * lower

    def take(out: Probe, T: float) -> bool:
        """Move the upper end to a plan found at T; False if it does not improve the upper end."""
        nonlocal best, best_key, upper
        reach = T if out.value is None else float(out.value)
        if not reach < upper:
            return False
        upper = reach
        key = score(out.plan) if score is not None else reach
        if key < best_key:
            best, best_key = out.plan, key
        return True

    def share(fraction: float = 1.0) -> Deadline | None:
        """A probe's clock: ``fraction`` of ``step_share`` of the time left (at least ``min_step``)."""
        if deadline is not None and deadline.bounded and step_share is not None:
            return deadline.sub(seconds=max(min_step, fraction * step_share * deadline.remaining()))
        return deadline

    def result(is_closed: bool, iterations: int, stop: str | None = None) -> Bisection:
        if stop is None:
            stop = "closed" if is_closed else "deadline" if expired() else "max_iter"
        return Bisection(best, best_key, upper, lower, is_closed, steps, iterations, stop)

    if start is None:  # no plan known: does any plan pass the top at all?
        if expired():
            return result(False, 0)
        out = probe(upper, deadline)
        steps.append((upper, out.outcome))
        if out.outcome == INFEASIBLE:
            lower = upper
            return result(True, 0)
        if out.outcome != FEASIBLE or out.plan is None:
            return result(False, 0, None if expired() else "undecided")
        reach = upper if out.value is None else float(out.value)
        best, upper = out.plan, min(upper, reach)
        best_key = score(best) if score is not None else reach
    if probe_lower and not expired():
        out = probe(lower, deadline)
        steps.append((lower, out.outcome))
        if out.outcome == FEASIBLE:
            take(out, lower)
    iterations = 0
    hard = None  # smallest T a probe could not decide: search below it first

    def below_upper(clock) -> bool | None:
        """Probe just below the upper end, at ``upper / (1 + rel_tol / 2)`` (a bet that the plan
        in hand is optimal): True if it found a better plan, False if it proved the bracket or
        could not decide (then that T is hard), None if floats cannot split the bracket there."""
        nonlocal lower, hard, iterations
        T = upper / (1.0 + 0.5 * rel_tol)
        if not lower < T < upper:
            return None
        out = probe(T, clock)
        iterations += 1
        steps.append((T, out.outcome))
        if out.outcome == INFEASIBLE:
            lower = T
            return False
        if out.outcome == FEASIBLE and take(out, T):
            return True
        hard = T
        return False

    for i in range(TOP_PROBES if probe_top else 0):
        if closed() or expired() or hard is not None:
            break
        if i == 0 and first_top_share is not None and deadline is not None and deadline.bounded:
            clock = deadline.sub(seconds=max(min_step, first_top_share * deadline.remaining()))
        else:
            clock = share(TOP_SHARE)
        if below_upper(clock) is None:
            break
    while not closed() and iterations < max_iter and not expired():
        top = upper if hard is None or hard - lower <= rel_tol * lower else hard
        T = 0.5 * (lower + top)
        if not lower < T < top:
            return result(closed(), iterations, "floats")
        retry = hard is not None and top == upper
        out = probe(T, deadline if retry else share())
        iterations += 1
        steps.append((T, out.outcome))
        if out.outcome == FEASIBLE and take(out, T):
            if hard is not None and hard >= upper:
                hard = None
            # just below the new plan, again while plans come
            while top_after_plan and hard is None and not closed() and not expired() and iterations < max_iter:
                if not below_upper(share()):
                    break
            continue
        if out.outcome == INFEASIBLE:
            lower = T
            continue
        # undecided (or a plan that does not improve on the incumbent)
        if retry:  # even with all the time left the probe could not decide
            return result(closed(), iterations, None if expired() else "undecided")
        hard = T if hard is None else min(hard, T)
    return result(closed(), iterations)


class LimitSearch(NamedTuple):
    """Outcome of :func:`bisect_limit` (a greedy check bisected by :func:`bisect`)."""

    starts: list
    """Stage starts of the kept plan (as the check returned them)."""
    limit: float
    """The smallest accepted limit T (seconds): the final upper end of the bracket."""
    iterations: int
    """Checks made at bracket midpoints."""


def _as_deadline(deadline: Deadline | float | None) -> Deadline | None:
    """A :class:`Deadline` from a deadline, a ``time.perf_counter()`` end, or ``None``."""
    if deadline is None or isinstance(deadline, Deadline):
        return deadline
    return Deadline(max(float(deadline) - time.perf_counter(), 1e-12))


def bisect_limit(
    check: Callable[[float], list[int] | None],
    lo: float,
    hi: float,
    starts: list[int],
    *,
    rel_tol: float = SUM_ORDER,
    deadline: Deadline | float | None = None,
    max_iter: int = 200,
    score: Callable[[list[int]], float] | None = None,
) -> LimitSearch:
    """Duan & Wu's bisection of a greedy check between a lower and an upper bound on T.

    :func:`bisect` with the check as a probe that accepts or rejects: first ``check(lo)``
    (if it accepts, the bracket closes at ``lo``), then midpoints; an accepted midpoint
    becomes ``hi`` (its plan is kept), a rejected one ``lo``. Stops when
    ``hi - lo <= rel_tol * lo``, after ``max_iter`` midpoints, or at ``deadline``.

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
        A :class:`~pipeopt.backends.deadline.Deadline`, or a ``time.perf_counter()`` value,
        after which no further check is made (None: no deadline).
    max_iter
        Most midpoints checked.
    score
        If given, ``score(starts) -> seconds`` of a plan; every accepted plan is scored and
        the best-scoring one is kept (ties: the earlier), e.g. the bottleneck after
        :func:`complete_stages` when the greedy plan has fewer stages. Without it, the plan
        accepted at the smallest limit is kept.

    Returns
    -------
    LimitSearch
        ``(starts, limit, iterations)``: the kept plan's starts, the final ``hi``, and the
        number of midpoints checked.

    References
    ----------
    Duan & Wu, ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029.
    """

    def probe(T: float, _deadline) -> Probe:
        st = check(T)
        return Probe(INFEASIBLE) if st is None else Probe(FEASIBLE, st)

    found = bisect(probe, lo, hi, start=starts, rel_tol=rel_tol, deadline=_as_deadline(deadline),
                   max_iter=max_iter, probe_lower=True, score=score)
    return LimitSearch(found.plan, found.upper, found.iterations)
