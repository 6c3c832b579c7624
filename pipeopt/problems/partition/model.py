"""What the MILP and CP-SAT models of the (straight) partition problem share.

Both models decide the start positions ``0 = p_0 < p_1 < ... < p_{S-1} < p_S = n`` of the S
stages over the chain's n units (stage t holds units ``p_t .. p_{t+1}-1``) and minimise the
bottleneck T, the exact 1F1B steady-state period of the split
(:meth:`PartitionProblem.period`, = :func:`pipeopt.evaluate`'s bottleneck). Every array here
is read off the problem's cost table (:attr:`PartitionProblem.table`,
:class:`pipeopt.cost.CostTable`) through :attr:`PartitionProblem.work_prefix`,
:attr:`PartitionProblem.cut_terms` and :attr:`PartitionProblem.trip`; no rule of the cost
model is written in this module.

* **Stage rows** (one worker per stage): a stage of units ``a..b-1`` is busy
  ``w = W[b] - W[a] + added[a] + added[b]`` per microbatch (:meth:`PartitionProblem.stage_work`,
  W the work prefix), written ``end[p_{t+1}] - begin[p_t] <= T`` with ``end = W + added``,
  ``begin = W - added``; and ``cut[p_t] <= T`` with ``cut = bound`` (one direction's transfer
  per microbatch with overlap, zero without).
* **Window rows** (1F1B: stages i..l hold l - i + 1 microbatches in flight,
  :func:`pipeopt.cost.rules.steady_period`): for every ``0 <= i < l <= S-1``

      sum_{s=i..l} w_s + sum_{c=i+1..l} trip[p_c] <= (l - i + 1) T,

  which telescopes to ``end[p_{l+1}] - begin[p_i] + sum_{c=i+1..l} mid[p_c] <= (l - i + 1) T``
  with ``mid = 2 added + trip`` (what an inner cut adds: the sends of the stages on both
  sides without overlap, the round trip with overlap). With the stage rows (i = l) and the
  cut rows, the max over all rows is exactly the period: the models minimise
  ``evaluate``'s bottleneck. O(S^2) rows; none when no cut has a round trip (without
  overlap, or no bytes cross): a window row is then a sum of l - i + 1 stage times, implied
  by the stage rows (:attr:`StraightModel.windowed`).
* **Memory** is exact and has no byte in it: stage t of units ``a..b-1`` fits
  (:func:`pipeopt.cost.rules.fits`, the shared :data:`~pipeopt.cost.rules.MEMORY_SLACK`) iff
  ``b <= reach_t[a]``, the last end that fits (:meth:`PartitionProblem.memory_reach`; memory
  only grows as a stage gains units, so the ends that fit are an interval). The models state
  ``p_{t+1} <= reach_t[p_t]`` (MILP: 0/1 rows; CP-SAT: an element constraint), so no byte
  count is rounded, scaled or compared with a solver tolerance, whatever the sizes
  (fractional bytes, capacities up to the data model's 1e15 B: nothing near CP-SAT's 64-bit
  integers).
* Every plan a solver returns is scored by :func:`pipeopt.evaluate`; a stage that the table
  says fits but ``evaluate`` says does not (float summation order, about 1e-16 relative) is
  removed from the model (:meth:`StraightModel.forbid`) and the solver runs again
  (:func:`solve_exact`): the method never returns a plan that breaks memory as optimal.

This module also holds the stage windows (stage t can only start at units ``t .. n-S+t``:
every stage is non-empty), the integer time scale of CP-SAT, a heuristic warm start
(:func:`heuristic_split`: Duan & Wu's greedy check and a beam search over the window rows
(:func:`window_beam`) bisected with :func:`pipeopt.backends.bisection.bisect_limit`, then a
local search (:func:`improve_split`); *not* the DP, so that the solvers stay independent
checks of it) and the driver :func:`solve_exact` that turns the solvers' outcomes into a
:class:`~pipeopt.result.Result` whose every claim is checked, with the hook of the second
phase (:func:`second_phase`: the tie-break among optimal splits, called once the primary
optimum is proven).

References
----------
Narayanan et al., PipeDream: Generalized Pipeline Parallelism for DNN Training, SOSP 2019
(1F1B memory, weight stashing). Pinar & Aykanat, Fast optimal load balancing algorithms for
1D partitioning, JPDC 64(8), 2004 (chains-on-chains partitioning: the bottleneck problem
on prefix sums).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import itertools

import numpy as np

from ...lazy import lazy_module
from ...backends.bisection import bisect_limit
from ...backends.scaling import model_unit
from ...backends.deadline import Deadline, DeadlineReached
from ...cost import evaluate, rules
from ...cost.transient import refuse_transient
from ...cost.tolerance import FLOAT_NOISE, SOLVER_CLAIM, SOLVER_GAP
from ...errors import InfeasibleError, InvalidProblemError
from ...result import Result, Status
from .binary_search import greedy_check, plan_time, split_to_stages
from .problem import PartitionProblem

pulp = lazy_module("pulp")

TIME_TICKS = 10**9
"""CP-SAT's integer time scale: :attr:`StraightModel.top`, a bound on every time value of the
model, is about ``TIME_TICKS`` integer ticks."""

_TICK_GUARD = 1e-5
"""Ticks: how far a time value is pushed (down for ``end`` and cuts, up for ``begin``) before
it is rounded, so that float error in ``seconds / tick`` cannot round it the wrong way."""

_TIME_GUARD = FLOAT_NOISE
"""Relative widening of the incumbent's value in :meth:`StraightModel.time_reach`, so that
float rounding of ``end[b] - begin[a]`` cannot cut off the incumbent itself (the time reach
rows only remove splits worse than it)."""

MILP_REL_GAP = SOLVER_GAP
"""Relative optimality gap at which the MILP solvers stop (about zero)."""

MILP_ABS_GAP = SOLVER_GAP
"""Absolute gap, in the MILP's time units (1/100 of the simple lower bound)."""

BOUND_SLACK = SOLVER_GAP
"""Relative amount taken off a MILP solver's dual bound before quoting it as a proven bound
(covers the solver's feasibility and integrality tolerances, about 1e-9 relative on these
scaled rows)."""

MILP_TOLERANCE = SOLVER_CLAIM
"""Relative tolerance of an ``optimal`` claim: the evaluated objective of the plan is within
it of the method's valid lower bound (the gap, :data:`BOUND_SLACK` and the tolerances)."""

HEURISTIC_SHARE = 0.25
"""At most this share of the time limit goes to the warm start heuristic."""


def check_options(method: str, threads, seed) -> None:
    """Raise :class:`InvalidProblemError` unless ``threads`` >= 1 and ``seed`` >= 0 are integers
    (checked before any work)."""
    for name, value, least in (("threads", threads, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise InvalidProblemError(f"{method}: {name} must be an integer >= {least}, got {value!r}")


def require_straight(problem: PartitionProblem, method: str) -> None:
    """Raise :class:`InvalidProblemError` unless ``problem`` is in the one-order space.

    Parameters
    ----------
    problem
        The partition problem.
    method
        Method name used in the message (``"milp"``, ``"cpsat"``).
    """
    if not isinstance(problem, PartitionProblem):
        raise InvalidProblemError(
            f"method {method!r} solves a PartitionProblem, got {type(problem).__name__}"
        )
    if problem.replication:
        raise InvalidProblemError(
            f"method {method!r} covers the one-order space (one worker per stage) only; "
            "stage replication is solved by the DP (method 'dp') only"
        )


def infeasible_memory(problem: PartitionProblem, method: str, why: str) -> InfeasibleError:
    """The error an exact method raises when it has proved that no split fits in memory."""
    return InfeasibleError(
        f"{method}: no split of {problem.instance.name} into {problem.stages} stages fits in "
        f"{problem.memory / 2**30:.3f} GiB of memory per worker ({why})"
    )


def memory_reach(problem: PartitionProblem) -> np.ndarray:
    """``reach[t, a]``: the last end ``b`` such that stage t of units ``a..b-1`` fits in memory
    (:meth:`PartitionProblem.memory_reach` with stage t's in-flight count), non-decreasing in
    ``a``, so ``p_t <= a`` implies ``p_{t+1} <= reach[t, a]``.

    Returns
    -------
    ndarray (S, n+1) of int (a copy the model may tighten)
    """
    return np.array([problem.memory_reach(problem.in_flight(t)) for t in range(problem.stages)], dtype=np.int64)


def stage_window(n: int, S: int, t: int) -> range:
    """Units where stage ``t`` (0-based) of a split of n units into S non-empty contiguous
    stages can start: ``t .. n-S+t`` (``0`` for stage 0, ``n`` for the end of the last stage,
    t = S)."""
    if t == 0:
        return range(1)
    if t == S:
        return range(n, n + 1)
    return range(t, n - S + t + 1)


@dataclass
class StraightModel:
    """The arrays both formulations read (shapes ``(n+1,)`` over boundary positions
    ``c = 0..n``, position c being "before unit c"; seconds).

    Build with :meth:`of`. ``begin``, ``end``, ``cut`` are the linear form of the stage rows,
    ``mid`` what an inner cut adds to the window rows (module docstring); ``reach`` is
    :func:`memory_reach`, ``(S, n+1)``, tightened by :meth:`forbid`; ``lower_bound`` is
    :meth:`PartitionProblem.simple_lower_bound` (seconds, a valid bound without any solver).
    """

    problem: PartitionProblem
    n: int
    S: int
    begin: np.ndarray
    end: np.ndarray
    cut: np.ndarray
    mid: np.ndarray
    reach: np.ndarray
    lower_bound: float

    @classmethod
    def of(cls, problem: PartitionProblem, method: str = "exact") -> StraightModel:
        """Read the model arrays of a straight partition problem off its cost table.

        Raises
        ------
        InvalidProblemError
            If ``problem.replication`` is set (see :func:`require_straight`).
        """
        require_straight(problem, method)
        refuse_transient(problem.instance, f"method {method!r}")  # its memory rows: the ends that fit, an interval
        W = np.asarray(problem.work_prefix, dtype=float)
        added, bound = problem.cut_terms
        mid = 2.0 * np.asarray(added, dtype=float) + np.asarray(problem.trip, dtype=float)
        return cls(problem, problem.n, problem.stages, W - added, W + added, np.asarray(bound, dtype=float),
                   mid, memory_reach(problem), float(problem.simple_lower_bound()))

    # ---- structure ----------------------------------------------------------------------
    def window(self, t: int) -> range:
        """Units where stage ``t`` (0-based) can start (:func:`stage_window`)."""
        return stage_window(self.n, self.S, t)

    @property
    def single_split(self) -> list[int] | None:
        """The starts of the only split there is (S = 1, or S = n), else ``None``."""
        if self.S == 1 or self.S == self.n:
            return list(range(1, self.S))
        return None

    @property
    def windowed(self) -> bool:
        """True if the model needs window rows: S >= 2 and some inner cut has a round trip
        (:attr:`PartitionProblem.trip` > 0, with overlap). Otherwise a window row's left side
        is a sum of l - i + 1 stage times (``mid = 2 added``) and the stage rows imply it."""
        return self.S >= 2 and bool(np.any(self.problem.trip[1:-1] > 0))

    def windows(self):
        """The window rows ``(i, l)``, ``0 <= i < l <= S-1`` (the stage rows i = l aside), or
        none if not :attr:`windowed`."""
        if not self.windowed:
            return []
        return [(i, l) for l in range(1, self.S) for i in range(l)]

    @property
    def memory_binding(self) -> bool:
        """True if memory rules out some stage."""
        return bool(np.any(self.reach[:, :-1] < self.n))

    def forbid(self, t: int, a: int, b: int) -> None:
        """Remove stage t of units ``a..b-1`` (and, memory growing with the units, every stage t
        that starts at or before ``a`` and ends at or after ``b``) from the model: evaluate
        found it over memory although the table's test let it through."""
        self.reach[t, : a + 1] = np.minimum(self.reach[t, : a + 1], b - 1)

    # ---- evaluating a split the way the models do ---------------------------------------
    def bottleneck(self, starts) -> float:
        """Bottleneck (seconds) of the split whose stages 1..S-1 start at ``starts``, memory
        ignored: the exact period (:meth:`PartitionProblem.period`, = :func:`pipeopt.evaluate`'s
        bottleneck, :func:`pipeopt.problems.partition.binary_search.plan_time`), the max of
        the model's rows."""
        return plan_time(self.problem, list(starts), memory=False)

    def fits(self, starts) -> bool:
        """True if every stage of the split fits in memory (the model's reach arrays)."""
        p = [0, *starts, self.n]
        return all(p[t + 1] <= self.reach[t, p[t]] for t in range(self.S))

    def value(self, starts) -> float:
        """Bottleneck of the split if it fits, else ``inf``."""
        return self.bottleneck(starts) if self.fits(starts) else math.inf

    def rows(self, bounds: np.ndarray) -> np.ndarray:
        """Every row of many splits, vectorised: for each row of ``bounds`` (``(K, S+1)`` ints
        ``0 = p_0 < ... < p_S = n``) the values (seconds) of its stage rows, cut rows and
        window rows over their l - i + 1, ``(K, R)``. Their max is :meth:`bottleneck` (up to
        float rounding), memory aside."""
        P = np.atleast_2d(np.asarray(bounds, dtype=np.int64))
        parts = [self.end[P[:, 1:]] - self.begin[P[:, :-1]], self.cut[P[:, 1:-1]]]
        if self.windowed:
            # row (i, l): E[l+1] - B[i], with E[j] = end[p_j] + M[j-1], B[i] = begin[p_i] + M[i]
            # and M[i] = sum_{c=1..i} mid[p_c]
            M = np.concatenate([np.zeros((P.shape[0], 1)), np.cumsum(self.mid[P[:, 1:-1]], axis=1)], axis=1)
            E, B = self.end[P[:, 1:]] + M, self.begin[P[:, :-1]] + M
            i, l = np.triu_indices(self.S, k=1)
            parts.append((E[:, l] - B[:, i]) / (l - i + 1))
        return np.concatenate(parts, axis=1)

    def row_values(self, bounds: np.ndarray) -> np.ndarray:
        """The value of many splits by the model's rows (:meth:`rows`), ``(K,)`` seconds;
        ``inf`` where a stage does not fit :attr:`reach`."""
        P = np.atleast_2d(np.asarray(bounds, dtype=np.int64))
        fits = np.all(P[:, 1:] <= self.reach[np.arange(self.S), P[:, :-1]], axis=1)
        return np.where(fits, self.rows(P).max(axis=1), np.inf)

    def time_reach(self, upper: float) -> np.ndarray:
        """``R[a]``: the last position a stage starting at or before unit ``a`` can end at with
        ``end[b] - begin[a] <= upper`` seconds (so ``p_t <= a`` implies ``p_{t+1} <= R[a]`` in
        every split of bottleneck <= upper). ``ndarray (n+1,)`` of ints, ``R[a] >= a``."""
        # largest b with end[b] <= x: search the suffix minimum of end (nondecreasing)
        suffix_min = np.minimum.accumulate(self.end[::-1])[::-1]
        x = self.begin + upper * (1 + _TIME_GUARD) + 1e-300
        r = np.searchsorted(suffix_min, x, side="right") - 1
        r = np.maximum(r, np.arange(self.n + 1))
        return np.maximum.accumulate(r)

    # ---- integer scale of the CP-SAT model ----------------------------------------------
    @cached_property
    def top(self) -> float:
        """Seconds: an upper bound on the period of every split (``max(end) - min(begin) +
        max(mid)``, a window row's left side over its l - i + 1 being at most a stage's time
        plus one inner cut's ``mid``, or the dearest cut); ``0.0`` only if every time is zero."""
        return float(max(self.end.max() - self.begin.min() + max(self.mid.max(initial=0.0), 0.0),
                         self.cut.max(initial=0.0), 0.0))

    @property
    def time_unit(self) -> float:
        """Seconds per unit of the MILP's time values: 1/100 of the simple lower bound (or of
        :attr:`top` if that bound is zero), so the solver's T lies around 100..10^4."""
        base = self.lower_bound if self.lower_bound > 0 else self.top
        return model_unit(base, 100.0)

    @cached_property
    def tick(self) -> float:
        """Seconds per integer time tick of the CP-SAT model (:attr:`top` is
        :data:`TIME_TICKS` ticks)."""
        return self.top / TIME_TICKS if self.top > 0 else 1.0

    def ticks(self, seconds: np.ndarray) -> list[int]:
        """``seconds`` in whole ticks, rounded down (never above the true value, up to
        :data:`_TICK_GUARD`)."""
        return [int(x) for x in np.floor(np.asarray(seconds) / self.tick - _TICK_GUARD)]

    @property
    def tolerance(self) -> float:
        """Seconds: CP-SAT's window row (i, l) with k = l - i + 1 (k = 1: a stage row) reads
        ``ticks(end)[p_{l+1}] - ticks(begin)[p_i] + sum ticks(mid)[p_c] - k <= k T``. Its
        integer left side is below the true one (in ticks) less k - 1, so the split's true
        period P satisfies every row at ``T = floor(P / tick)`` (the integer value of every
        split is at most its true value: a valid bound); and above it less 2k (plus the
        guards), so the integer value is above ``P / tick - 2`` (a cut's ``ticks(cut)[c]`` is
        above its true value less 1). A split optimal in ticks is within 3 ticks of the true
        optimum."""
        return 3.0 * self.tick


# ---- a warm start ------------------------------------------------------------------------
def balanced_split(model: StraightModel) -> list[int]:
    """Cut where the work prefix crosses t/S of the total (a quick split, any memory).

    Stage t (t >= 1) starts at the unit of its window whose work prefix is closest to
    ``t * total / S`` (ties: the earlier unit).

    Returns
    -------
    list[int]
        Starts of stages 1..S-1, strictly increasing, inside their windows.
    """
    n, S = model.n, model.S
    W = model.problem.work_prefix
    total = W[-1]
    starts: list[int] = []
    prev = 0
    for t in range(1, S):
        lo = max(prev + 1, t)
        hi = n - S + t
        target = t * total / S
        c = int(np.searchsorted(W, target))
        cands = [x for x in (c - 1, c) if lo <= x <= hi]
        c = min(cands, key=lambda x: (abs(W[x] - target), x)) if cands else min(max(c, lo), hi)
        starts.append(c)
        prev = c
    return starts


BEAM_WIDTH = 16
"""States per stage :func:`window_beam` keeps."""


def window_beam(model: StraightModel, limit: float, width: int = BEAM_WIDTH,
                deadline: Deadline | None = None) -> list[int] | None:
    """A beam search for a split whose every row meets a period limit T (a heuristic check).

    Stage by stage it keeps at most ``width`` partial splits, each summed up by where its last
    stage ends (b) and the least G of the window rows so far plus the next cut's round trip
    (:func:`pipeopt.cost.rules.window_step`: what the rows of the later stages inherit). A
    partial split is extended by every end at which the new stage fits in memory
    (:attr:`StraightModel.reach`), leaves a unit to each later stage, and meets its stage row,
    its cut row and every window row ending at it; per end the least G is kept, then the
    Pareto front (farther end, smaller G), thinned evenly to ``width`` states. ``width = 1``
    is the greedy that packs each stage as far as it goes.

    Not the DP (which keeps every end): ``None`` does not prove that no split meets T. It also
    gives up (``None``) when ``deadline`` passes.

    Returns
    -------
    list[int] or None
        Starts of stages 1..S-1 of a split whose period is at most T (and that fits), or
        ``None`` if the beam dies out.
    """
    problem, n, S = model.problem, model.n, model.S
    D, U = rules.window_tokens([problem.in_flight(t) for t in range(S)], np.ones(S), np.zeros(S, dtype=bool))
    trip = np.asarray(problem.trip, dtype=float)
    ends = np.array([0])  # where the kept partial splits' last stage ends
    carry = np.array([-math.inf])  # their G plus the round trip of the cut at that end
    parents: list[tuple[np.ndarray, np.ndarray]] = []  # per stage: (ends, index of the parent state)
    for t in range(S):
        if deadline is not None and deadline.expired():
            return None
        cand_b, cand_g, cand_from = [], [], []
        for k, (a, c) in enumerate(zip(ends, carry, strict=True)):
            b = np.arange(a + 1, min(n - (S - 1 - t), int(model.reach[t, a])) + 1)
            if b.size == 0:
                continue
            w = problem.stage_work(a, b)
            g, ok = rules.window_step(c, 0.0, w, D[t], U[t], limit)
            ok &= (w <= limit) & (model.cut[b] <= limit)
            if t == S - 1:
                ok &= b == n
            cand_b.append(b[ok])
            cand_g.append(g[ok])
            cand_from.append(np.full(int(ok.sum()), k))
        if not cand_b or sum(x.size for x in cand_b) == 0:
            return None
        b, g, src = np.concatenate(cand_b), np.concatenate(cand_g), np.concatenate(cand_from)
        g = g + trip[b]  # what the next stage's rows inherit (the cut at b; zero at n)
        order = np.lexsort((g, -b))  # farther end first, then least G
        b, g, src = b[order], g[order], src[order]
        front = np.flatnonzero(g < np.minimum.accumulate(np.concatenate([[np.inf], g[:-1]])))
        if front.size > width:
            front = front[np.unique(np.linspace(0, front.size - 1, width).round().astype(int))]
        ends, carry = b[front], g[front]
        parents.append((ends, src[front]))
    starts, k = [], 0
    for t in range(S - 1, 0, -1):
        k = int(parents[t][1][k])
        starts.append(int(parents[t - 1][0][k]))
    return starts[::-1]


def improve_split(model: StraightModel, starts: list[int], deadline: Deadline | None = None,
                  max_rounds: int = 100) -> list[int]:
    """Local search from a split: move one cut at a time to the position in its range (between
    its neighbours) that lowers the split's value by the model's rows
    (:meth:`StraightModel.row_values`, memory included), ties broken by fewer rows at that
    value (so that plateaus of the max are left); sweep the cuts until no move helps, the
    deadline passes or ``max_rounds`` sweeps.

    Returns
    -------
    list[int]
        Starts of stages 1..S-1 (``starts`` itself if no move helps).
    """
    deadline = Deadline(None) if deadline is None else deadline
    n, S = model.n, model.S
    best = np.array([0, *starts, n], dtype=np.int64)
    value = float(model.row_values(best)[0])
    if not math.isfinite(value):
        return list(starts)

    def tight(P, v):
        """Rows of each split in ``P`` within 1e-12 (relative) of ``v``."""
        return np.sum(model.rows(P) >= v * (1 - 1e-12), axis=1)

    count = int(tight(best, value)[0])

    def consider(P) -> bool:
        """Move to the best split of ``P`` if it is better (lower value, or as low with fewer
        tight rows)."""
        nonlocal best, value, count
        vals = model.row_values(P)
        k = int(np.argmin(vals))
        if vals[k] < value * (1 - 1e-12):
            best, value = P[k], float(vals[k])
            count = int(tight(best, value)[0])
            return True
        ties = np.flatnonzero(vals <= value * (1 + 1e-12))
        if ties.size:
            counts = tight(P[ties], value)
            j = int(np.argmin(counts))
            if counts[j] < count:
                best, count = P[ties[j]], int(counts[j])
                return True
        return False

    for _ in range(max_rounds):
        moved = False
        for t in range(1, S):
            if deadline.expired():
                return [int(x) for x in best[1:-1]]
            cands = np.arange(best[t - 1] + 1, best[t + 1])
            cands = cands[cands != best[t]]
            if cands.size:
                P = np.repeat(best[None, :], cands.size, axis=0)
                P[:, t] = cands
                moved |= consider(P)
        if not moved:
            break
    return [int(x) for x in best[1:-1]]


def heuristic_split(model: StraightModel, deadline: Deadline | None = None) -> list[int]:
    """A heuristic split for the solvers' warm start / hint: the best (fitting, then fastest)
    of :func:`balanced_split`, Duan & Wu's greedy check
    (:func:`~pipeopt.problems.partition.binary_search.greedy_check`, completed to S stages by
    :func:`~pipeopt.problems.partition.binary_search.split_to_stages`) and the window rows'
    beam search (:func:`window_beam`), each bisected on the limit by
    :func:`pipeopt.backends.bisection.bisect_limit`; then improved by :func:`improve_split`.

    Not the DP (the solvers stay independent checks of it); neither optimal nor
    memory-feasible in general.

    Parameters
    ----------
    model
        The model arrays.
    deadline
        The method's clock; the heuristic stops its bisections and local search at it.

    Returns
    -------
    list[int]
        Starts of stages 1..S-1.
    """
    deadline = Deadline(None) if deadline is None else deadline
    problem = model.problem
    best = balanced_split(model)

    def check(T: float) -> list[int] | None:
        found = greedy_check(problem, T)
        return None if found is None else split_to_stages(problem, found)

    lo = model.lower_bound
    hi = float(problem.work_prefix[-1] + model.top) * (1 + 1e-9)  # every period is below it
    found = bisect_limit(check, lo, hi, best, rel_tol=1e-9, deadline=deadline, max_iter=60, score=model.value)
    best = list(found.starts)
    found = bisect_limit(lambda T: window_beam(model, T, deadline=deadline), lo, hi, best, rel_tol=1e-9,
                         deadline=deadline, max_iter=60, score=model.value)
    best = min([best, list(found.starts)], key=model.value)
    return improve_split(model, best, deadline)


# ---- the driver ------------------------------------------------------------------------------
@dataclass
class Attempt:
    """What one solver run on the current model gave.

    Attributes
    ----------
    status
        ``"optimal"`` (proven for the model), ``"feasible"`` (a solution, no proof),
        ``"infeasible"`` (proven for the model) or ``"no_solution"``.
    starts
        Starts of stages 1..S-1 of the solver's solution, or ``None``.
    bound
        Seconds: a valid lower bound on the one-order optimum from this run, or ``None``.
    info
        Solver details for ``Result.info``.
    """

    status: str
    starts: list[int] | None = None
    bound: float | None = None
    info: dict = field(default_factory=dict)


Solve = Callable[[StraightModel, list, "float | None", Deadline], Attempt]
"""``solve(model, hint, upper, deadline) -> Attempt``: build the model (with ``model.reach``
as it is now) and solve it once. ``hint``: starts to warm-start from (or ``[]`` for none);
``upper``: the bottleneck of a split known to fit, or ``None``."""


def _violations(problem: PartitionProblem, starts: list[int]) -> tuple[float, bool, list[tuple[int, int, int]]]:
    """``evaluate``'s objective of the split, whether it fits, and the stages ``(t, a, b)`` it
    finds over memory."""
    ev = evaluate(problem.instance, problem.plan(starts))
    if ev.feasible:
        return ev.objective, True, []
    p = [0, *starts, problem.n]
    over = [(t, p[t], p[t + 1]) for t in range(problem.stages) if not problem.fits(ev.memory[t])]
    return ev.objective, False, over


class CumulativeSplit:
    """A straight split as cumulative binaries in a PuLP model, shared by the MILP
    (:func:`pipeopt.problems.partition.milp.build_milp`) and the event-time model
    (:func:`pipeopt.problems.partition.events.build_events`).

    ``y[t][c] = 1[p_t <= c]`` ("stage t has started by unit c") for stages t = 1..S-1 and c
    in stage t's window but its last unit (where it is 1). Rows are built directly as
    :class:`pulp.LpConstraint` (PuLP's operators are slow on tens of thousands of rows).

    Parameters
    ----------
    lp
        The PuLP problem the variables and rows go into.
    model
        The split's arrays (:class:`StraightModel`: windows, memory reach); only ``n``, ``S``
        and ``window(t)`` (:func:`stage_window`) are read, except by :meth:`reach_rows`'s
        caller (the schedule problem's chunk split passes a smaller object with just those).
    """

    def __init__(self, lp: pulp.LpProblem, model: StraightModel) -> None:
        self.lp, self.model = lp, model
        self.y = {t: {c: lp.add_variable(f"started_{t}_by_{c}", cat=pulp.LpBinary) for c in model.window(t)[:-1]}
                  for t in range(1, model.S)}

    def add(self, terms, constant: float, name: str, sense=None) -> None:
        """The row ``sum(coef * var) + constant (<= or ==) 0`` (``sense`` default ``pulp.LpConstraintLE``)."""
        sense = pulp.LpConstraintLE if sense is None else sense
        self.lp.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms, constant), sense), name)

    def started(self, t: int, c: int):
        """``1[p_t <= c]``: a variable inside stage t's window, else the constant 0 or 1."""
        win = self.model.window(t)
        if c >= win[-1]:
            return 1
        if c < win[0]:
            return 0
        return self.y[t][c]

    def member(self, s: int, c: int) -> tuple[list, float]:
        """``1[p_s <= c < p_{s+1}]`` ("unit c is in stage s", s = 0..S-1) as (terms, constant):
        :meth:`started` of stage s less that of stage s + 1 (``p_0 = 0``, ``p_S = n``)."""
        terms, const = [], 0.0
        for t, sign in ((s, 1.0), (s + 1, -1.0)):
            val = 1 if t == 0 else (0 if t == self.model.S else self.started(t, c))
            if isinstance(val, int):
                const += sign * val
            else:
                terms.append((val, sign))
        return terms, const

    def at(self, arr, t: int, scale: float) -> tuple[list, float]:
        """``arr[p_t] * scale`` as (terms, constant), t = 0..S (``p_0 = 0``, ``p_S = n``)."""
        n, S = self.model.n, self.model.S
        if t == 0 or t == S:
            return [], float(arr[0 if t == 0 else n]) * scale
        hi = self.model.window(t)[-1]
        return [(yc, -float(arr[c + 1] - arr[c]) * scale) for c, yc in self.y[t].items()], float(arr[hi]) * scale

    def structure_rows(self, t: int) -> None:
        """Stage t's indicators are monotone in c, and stage t + 1 starts after stage t."""
        y = self.y
        for a, b in itertools.pairwise(list(y[t])):
            self.add([(y[t][a], 1.0), (y[t][b], -1.0)], 0.0, f"monotone_{t}_{a}")
        if t + 1 < self.model.S:
            for c in y[t + 1]:
                self.add([(y[t + 1][c], 1.0), (y[t][c - 1], -1.0)], 0.0, f"nonempty_{t}_{c}")

    def reach_rows(self, t: int, reach: np.ndarray) -> bool:
        """Stage t ends by ``reach[p_t]`` (memory, :meth:`StraightModel.forbid`): ``p_t <= a``
        implies ``p_{t+1} <= reach[a]``, one 0/1 row per step of ``reach``.

        Returns
        -------
        bool
            False if a row is false on constants (no split admits stage t at all).
        """
        win = list(self.model.window(t))
        for i, a in enumerate(win):
            if i + 1 < len(win) and reach[win[i + 1]] == reach[a]:
                continue  # implied by the row of the next a (y[t] is monotone)
            lhs, rhs = self.started(t, a), self.started(t + 1, int(reach[a]))
            if isinstance(lhs, int) and lhs == 0 or isinstance(rhs, int) and rhs == 1:
                continue
            if isinstance(lhs, int) and isinstance(rhs, int):  # 1 <= 0 on constants
                return False
            terms = ([] if isinstance(lhs, int) else [(lhs, 1.0)]) + ([] if isinstance(rhs, int) else [(rhs, -1.0)])
            self.add(terms, float(lhs if isinstance(lhs, int) else 0) - float(rhs if isinstance(rhs, int) else 0),
                     f"reach_{t}_{a}")
        return True


    def exclude(self, starts, name: str) -> None:
        """A no-good row cutting off the one split whose stages 1..S-1 start at ``starts``:
        ``sum over binaries of |y - y_hat| >= 1``."""
        terms, const = [], 1.0
        for t in range(1, self.model.S):
            for c, var in self.y[t].items():
                if c >= starts[t - 1]:  # y_hat = 1: contributes 1 - y
                    terms.append((var, 1.0))
                    const -= 1.0
                else:
                    terms.append((var, -1.0))
        self.add(terms, const, name)


def starts_from_cumulative(values, model: StraightModel) -> list[int]:
    """Starts of stages 1..S-1 from cumulative indicators ``values[t][c]`` ("stage t has
    started by unit c", t = 1..S-1, c over the window), read with a 0.5 threshold.

    A value ``None`` reads as 0.

    Raises
    ------
    RuntimeError
        If the values do not describe S non-empty contiguous stages (a modelling bug).
    """
    starts = []
    for t in range(1, model.S):
        win = model.window(t)
        start = win[-1]
        for c in win[:-1]:
            v = values[t].get(c)
            if v is not None and v > 0.5:
                start = c
                break
        starts.append(start)
    if any(a >= b for a, b in zip([0, *starts], [*starts, model.n], strict=True)):
        raise RuntimeError(f"solver values do not give {model.S} non-empty stages: starts {starts}")
    return starts


def second_phase(
    problem: PartitionProblem,
    model: StraightModel,
    starts: list[int],
    value: float,
    bound: float,
    deadline: Deadline,
    info: dict,
    options: dict | None = None,
) -> list[int]:
    """The secondary objective (tie-breaking among plans of optimal primary value).

    :func:`solve_exact` calls it once, only after the primary optimum is proven (status
    ``OPTIMAL``: ``starts`` fits, its evaluated objective ``value`` is within the claim's
    tolerance of the valid bound ``bound``), with the method's clock and the ``info`` dict of
    the result. It returns :func:`pipeopt.problems.partition.tiebreak.break_ties`'s split (the
    least 1F1B-flush iteration time among splits of the optimal period; ``info["secondary"]``
    says whether that was proven); :func:`solve_exact` re-scores it with
    :func:`pipeopt.evaluate` and keeps it only if it fits and its primary value is still within
    the tolerance of ``bound`` (else ``starts`` stays, with a note). ``options``: ``run``, the
    tie-break (:func:`~pipeopt.problems.partition.tiebreak.break_ties`, given by the method so
    that this module does not import the modules built on it), and its ``solver``,
    ``threads``, ``seed``; without ``run`` the split is returned unchanged.
    """
    options = dict(options or {})
    run = options.pop("run", None)
    if run is None:
        return list(starts)
    try:
        return run(problem, list(starts), deadline, info, **options)
    except DeadlineReached:
        info.setdefault("secondary", {})["proven"] = False
        return list(starts)


def solve_exact(
    problem: PartitionProblem,
    method: str,
    deadline: Deadline,
    solve: Solve,
    *,
    rel_tol: float,
    abs_tol: float | Callable[[StraightModel], float],
    warm_start: bool = True,
    info: dict | None = None,
    phase2: dict | None = None,
) -> Result:
    """Run an exact one-order-space method and turn what it proves into a :class:`Result`.

    1. The only split (S = 1 or S = n) is scored directly: ``OPTIMAL`` if it fits, else
       :class:`InfeasibleError` (proven: there is no other split).
    2. A warm start (:func:`heuristic_split`, at most :data:`HEURISTIC_SHARE` of the time
       left) is the incumbent if it fits.
    3. ``solve`` runs on the model; its plan is scored by :func:`pipeopt.evaluate`. A plan
       that breaks memory is never returned: its offending stages are removed from the model
       (:meth:`StraightModel.forbid`) and ``solve`` runs again while time is left.
    4. Status ``OPTIMAL`` only if the solver proved its model optimal, the plan fits and its
       evaluated objective is within ``max(abs_tol, rel_tol * objective)`` of the bound (then
       :func:`second_phase`, the tie-breaking hook, may replace the plan by a tied one);
       ``TIME_LIMIT`` if the solver stopped at its time limit (what was left of the deadline,
       its only limit) or the deadline passed, with the best fitting plan seen, if any, and
       the bound; ``FEASIBLE`` (the best fitting plan, the bound) if the solver's answer could
       not be taken as a proof (it claimed infeasibility although a split that fits is known,
       or its optimum is not confirmed by the valid bound).
       :class:`InfeasibleError` only when the solver proved the model infeasible and no
       fitting split is known (the model is a relaxation of the problem: only stages that do
       not fit and splits worse than a fitting one are removed from it).

    The bound is the largest of :meth:`PartitionProblem.simple_lower_bound` and the solver
    bounds of every run (each run's model keeps every split that fits and is no worse than
    the incumbent, so its bound is a bound on the true optimum).

    Parameters
    ----------
    problem
        The (straight) partition problem.
    method
        ``"milp"`` or ``"cpsat"``.
    deadline
        The method's clock.
    solve
        One solver run (:data:`Solve`).
    rel_tol, abs_tol
        The tolerance of an ``optimal`` claim, relative and in seconds (recorded in ``info``
        as ``rel_gap_target`` and ``tolerance_s``); ``abs_tol`` may be a function of the
        model (CP-SAT's tick).
    warm_start
        Use the heuristic split as warm start and its value as an upper limit.
    info
        Method details to record.

    Returns
    -------
    Result

    Raises
    ------
    InfeasibleError
        When proven (see above).
    """
    model = StraightModel.of(problem, method)
    if callable(abs_tol):
        abs_tol = abs_tol(model)
    info = dict(info or {})
    info.update(rel_gap_target=rel_tol, tolerance_s=abs_tol)
    only = model.single_split
    if only is not None:
        value, fits, _ = _violations(problem, only)
        if not fits:
            raise infeasible_memory(problem, method, "the only split there is breaks memory")
        info["solver"] = "none (S = 1 or S = n: one split only, scored by evaluate)"
        return problem.result(method, problem.plan(only), Status.OPTIMAL, lower_bound=value,
                              started=deadline.started, info=info)
    incumbent, inc_value = None, math.inf
    hint: list[int] = []
    if warm_start:
        hint = heuristic_split(model, deadline.sub(fraction=HEURISTIC_SHARE))
        value, fits, _ = _violations(problem, hint)
        info.update(warm_start=hint, warm_start_value=value, warm_start_fits=fits)
        if fits:
            incumbent, inc_value = hint, value
    bound = model.lower_bound
    info["bound_source"] = "simple_lower_bound (total work / S, largest unit)"
    proven = False
    runs = 0
    notes: list[str] = []
    while True:
        runs += 1
        try:
            att = solve(model, hint, inc_value if math.isfinite(inc_value) else None, deadline)
        except DeadlineReached as stop:
            att = Attempt("no_solution", info={"stopped": str(stop)})
        info.update(att.info)
        if att.bound is not None and att.bound > bound:
            bound = att.bound
            info["bound_source"] = f"{info.get('solver', method)} (run {runs})"
        if att.status == "infeasible":
            if incumbent is None:
                raise infeasible_memory(problem, method, f"proven infeasible by {info.get('solver', 'the solver')}")
            notes.append("the solver said infeasible although a split that fits is known: no proof, ignored")
            break
        if att.starts is None:
            break
        value, fits, over = _violations(problem, att.starts)
        if fits:
            if value < inc_value:
                incumbent, inc_value = att.starts, value
            proven = att.status == "optimal"
            break
        if not over or deadline.expired():
            notes.append(f"solver plan {att.starts} breaks memory by evaluate; not returned")
            break
        for t, a, b in over:
            model.forbid(t, a, b)
        notes.append(f"solver plan {att.starts} breaks memory by evaluate: stages {over} removed, solved again")
    info["solver_runs"] = runs
    stopped = att.status in ("feasible", "no_solution")  # the solver's one limit is the deadline
    if proven and inc_value - bound <= max(abs_tol, rel_tol * inc_value):
        status = Status.OPTIMAL
        chosen = second_phase(problem, model, list(incumbent), inc_value, bound, deadline, info, phase2)
        if list(chosen) != list(incumbent):
            value, fits, _ = _violations(problem, list(chosen))
            if fits and value - bound <= max(abs_tol, rel_tol * value):
                incumbent, inc_value = list(chosen), value
                info["incumbent"] = "second phase"
            else:
                notes.append(f"second phase returned {list(chosen)}, not within the tolerance of the "
                             "bound: ignored")
    elif stopped or deadline.expired() or incumbent is None:
        status = Status.TIME_LIMIT
        if incumbent is None and not (stopped or deadline.expired()):  # pragma: no cover - defensive
            notes.append("no plan that fits and no proof")
    else:
        status = Status.FEASIBLE
        if proven:
            notes.append("the solver's optimum is not confirmed by the valid bound within the tolerance")
    if notes:
        info["notes"] = notes
    if incumbent is not None and incumbent != att.starts and "incumbent" not in info:
        info["incumbent"] = "warm start" if incumbent == hint else "an earlier solver run"
    plan = problem.plan(incumbent) if incumbent is not None else None
    return problem.result(method, plan, status, lower_bound=bound, started=deadline.started, info=info)
