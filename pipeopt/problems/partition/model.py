"""Solver-neutral pieces of the MILP and CP-SAT models of the (straight) partition problem.

Both models decide the start positions ``0 = p_0 < p_1 < ... < p_{S-1} < p_S = n`` of the S
stages over the chain's n units (stage t holds units ``p_t .. p_{t+1}-1``) and minimise the
bottleneck T. Everything a stage costs is a *difference of prefix arrays taken at two start
positions*, which is what makes both formulations compact:

* stage time (straight space, one worker per stage; see :mod:`pipeopt.problems.partition.dp` and
  :func:`pipeopt.evaluate`): ``end[p_{t+1}] - begin[p_t]`` with ``end[c] = W[c] + q[c]`` and
  ``begin[c] = W[c] - q[c]``, ``W`` the prefix sum of work (forward + backward seconds) and
  ``q[c] = bytes crossing the boundary before unit c / bandwidth`` without overlap (the
  stage sends its activations forward and its input gradients back), ``q = 0`` with overlap;
* with overlap each cut also bounds T from below: ``T >= 2 bytes[p_t] / bandwidth``;
* memory of stage t (1F1B, ``k_t = S - t`` microbatches in flight, ``v_t = k_t`` weight
  versions with weight stashing, else 1): ``M_t[p_{t+1}] - M_t[p_t] <= capacity`` with
  ``M_t[c] = k_t A[c] + v_t P[c]`` (A, P prefix sums of activation and parameter bytes).

This module computes these arrays once (:class:`StraightModel`), the stage windows (stage t
can only start at units ``t .. n-S+t``: every stage is non-empty), the integer time scale
of the CP-SAT model and its tolerance, a cheap warm start (:func:`balanced_split`, *not* the
DP: the solvers must stay independent checks of it) and the helpers that turn a solver's
outcome into a :class:`~pipeopt.result.Result`.

References
----------
Narayanan et al., PipeDream: Generalized Pipeline Parallelism for DNN Training, SOSP 2019
(1F1B memory, weight stashing). Pinar & Aykanat, Fast optimal load balancing algorithms for
1D partitioning, JPDC 64(8), 2004 (chains-on-chains partitioning: the bottleneck problem
on prefix sums).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ...errors import InfeasibleError, InvalidProblemError
from .problem import PartitionProblem
from ...result import Result, Status

MEMORY_SLACK = 1e-12
"""Relative slack on the memory capacity, the same as :mod:`pipeopt.problems.partition.dp` and
:func:`pipeopt.evaluate` use (``memory <= capacity * (1 + 1e-12)``)."""

TIME_TICKS = 10**9
"""CP-SAT's integer time scale: the largest time value of the model (the whole chain's
stage time, or the dearest cut) is mapped to about ``TIME_TICKS`` integer ticks."""


def require_straight(problem: PartitionProblem, method: str) -> None:
    """Raise :class:`InvalidProblemError` unless ``problem`` is in the straight space.

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
            f"method {method!r} covers the straight space (one worker per stage) only; "
            "stage replication is solved by the DP (method 'dp') only"
        )


def infeasible_memory(problem: PartitionProblem, method: str) -> InfeasibleError:
    """The error an exact method raises when its solver proves that no split fits in memory."""
    return InfeasibleError(
        f"{method}: no split of {problem.instance.name} into {problem.stages} stages fits in "
        f"{problem.memory / 2**30:.3f} GiB of memory per worker (proven infeasible by the solver)"
    )


@dataclass(frozen=True)
class StraightModel:
    """The arrays both formulations read, in seconds and bytes (shapes ``(n+1,)`` over
    boundary positions ``c = 0..n``, position c being "before unit c").

    Build with :meth:`of`. Attributes: ``n``, ``S`` (stages), ``overlap``, ``begin`` and
    ``end`` (seconds, see the module docstring), ``cut_time`` (seconds, ``2 bytes[c] /
    bandwidth``, the overlapped communication bound of a cut at c; zeros without overlap),
    ``mem_prefix`` (``(S, n+1)`` bytes, ``M_t``), ``capacity`` (bytes per worker, ``inf`` if
    unlimited), ``lower_bound`` (seconds, :meth:`PartitionProblem.simple_lower_bound`).
    """

    problem: PartitionProblem
    n: int
    S: int
    overlap: bool
    begin: np.ndarray
    end: np.ndarray
    cut_time: np.ndarray
    mem_prefix: np.ndarray
    capacity: float
    lower_bound: float

    @classmethod
    def of(cls, problem: PartitionProblem, method: str = "exact") -> StraightModel:
        """Precompute the model arrays of a straight partition problem.

        Raises
        ------
        InvalidProblemError
            If ``problem.replication`` is set (see :func:`require_straight`).
        """
        require_straight(problem, method)
        n, S = problem.n, problem.stages
        overlap = bool(problem.instance.settings.overlap)
        W = np.asarray(problem.work_prefix, dtype=float)
        q = np.asarray(problem.boundary_bytes, dtype=float) / problem.bandwidth
        if overlap:
            begin, end, cut = W.copy(), W.copy(), 2.0 * q
        else:
            begin, end, cut = W - q, W + q, np.zeros(n + 1)
        k = np.array([problem.in_flight(t) for t in range(S)], dtype=float)
        v = k if problem.instance.settings.weight_stashing else np.ones(S)
        mem = k[:, None] * problem.act_prefix[None, :] + v[:, None] * problem.param_prefix[None, :]
        return cls(
            problem,
            n,
            S,
            overlap,
            begin,
            end,
            cut,
            mem,
            float(problem.memory),
            float(problem.simple_lower_bound()),
        )

    # ---- structure ----------------------------------------------------------------------
    def window(self, t: int) -> range:
        """Units where stage ``t`` (0-based) can start: ``t .. n-S+t`` (``0`` for stage 0)."""
        if t == 0:
            return range(1)
        return range(t, self.n - self.S + t + 1)

    @cached_property
    def memory_binding(self) -> bool:
        """True if some split could exceed the capacity (else the memory rows are omitted)."""
        if not math.isfinite(self.capacity):
            return False
        worst = max(self.mem_prefix[t, -1] - self.mem_prefix[t, 0] for t in range(self.S))
        return bool(worst > self.capacity * (1 + MEMORY_SLACK))

    # ---- evaluating a split the way the models do ---------------------------------------
    def bottleneck(self, starts) -> float:
        """Model value (seconds) of the split whose stages 1..S-1 start at ``starts``."""
        p = [0, *starts, self.n]
        t = max(self.end[p[i + 1]] - self.begin[p[i]] for i in range(self.S))
        return float(max([t, *(self.cut_time[c] for c in starts)]))

    def fits(self, starts) -> bool:
        """True if every stage of the split fits in memory (same slack as the DP)."""
        if not math.isfinite(self.capacity):
            return True
        p = [0, *starts, self.n]
        cap = self.capacity * (1 + MEMORY_SLACK)
        return all(self.mem_prefix[t, p[t + 1]] - self.mem_prefix[t, p[t]] <= cap for t in range(self.S))

    # ---- integer scale of the CP-SAT model ----------------------------------------------
    @cached_property
    def top(self) -> float:
        """Seconds: an upper bound on every time value of the model (``max(end) - min(begin)``
        or the dearest cut); ``0.0`` only if every time is zero."""
        return float(max(self.end.max() - self.begin.min(), self.cut_time.max(initial=0.0), 0.0))

    @property
    def time_unit(self) -> float:
        """Seconds per unit of the MILP's time values: 1/100 of the simple lower bound (or of
        :attr:`top` if that bound is zero), so the solver's T lies around 100..10^4."""
        base = self.lower_bound if self.lower_bound > 0 else self.top
        return base / 100.0 if base > 0 else 1.0

    @cached_property
    def tick(self) -> float:
        """Seconds per integer time tick of the CP-SAT model.

        :attr:`top`, a bound on every time value, is :data:`TIME_TICKS` ticks. ``begin``, ``end`` and ``cut_time`` are rounded to the
        nearest tick, so the model's stage time of any split differs from the true one by
        at most one tick and a cut's time by at most half a tick: see :attr:`tolerance`.
        """
        return self.top / TIME_TICKS if self.top > 0 else 1.0

    def ticks(self, seconds: np.ndarray) -> list[int]:
        """``seconds`` rounded to integer ticks (see :attr:`tick`)."""
        return [int(x) for x in np.rint(np.asarray(seconds) / self.tick)]

    @property
    def rounding_error(self) -> float:
        """Seconds: ``|tick * T_int(split) - T(split)| <= rounding_error`` for every split."""
        return self.tick

    @property
    def tolerance(self) -> float:
        """Seconds: a split optimal in ticks is within this of the true optimum (2 ticks)."""
        return 2.0 * self.tick

    def memory_units(self) -> tuple[np.ndarray, int] | None:
        """Memory prefixes ``M_t`` in whole bytes (rounded) and the capacity floored, or
        ``None`` if memory cannot bind. Exact for integral byte counts (PipeDream profiles);
        otherwise each stage's memory is modelled to within one byte."""
        if not self.memory_binding:
            return None
        return np.rint(self.mem_prefix).astype(np.int64), math.floor(self.capacity * (1 + MEMORY_SLACK))


# ---- a cheap warm start ------------------------------------------------------------------
def greedy_probe(model: StraightModel, limit: float) -> list[int] | None:
    """Greedy split with every stage and cut time at most ``limit`` seconds, or ``None``.

    Each stage extends as far as it can (leaving one unit for each later stage) while its
    time, the time of the cut it ends at and its memory stay within bounds - the "probe" of
    chains-on-chains partitioning (Pinar & Aykanat 2004) and of Duan & Wu's binary search.
    A heuristic here: with memory limits or without overlap, farthest is not always best.
    """
    n, S = model.n, model.S
    cap = model.capacity * (1 + MEMORY_SLACK)
    starts, a = [], 0
    for t in range(S - 1):
        b = np.arange(a + 1, n - S + t + 2)  # stage t = units a..b-1, leaving a unit per later stage
        ok = (model.end[b] - model.begin[a] <= limit) & (model.cut_time[b] <= limit)
        if math.isfinite(cap):
            ok &= model.mem_prefix[t, b] - model.mem_prefix[t, a] <= cap
        if not ok.any():
            return None
        a = int(b[np.flatnonzero(ok)[-1]])
        starts.append(a)
    t = S - 1
    if model.end[n] - model.begin[a] > limit or model.mem_prefix[t, n] - model.mem_prefix[t, a] > cap:
        return None
    return starts


def heuristic_split(model: StraightModel, iterations: int = 40) -> list[int]:
    """A heuristic split for the solvers' warm start / hint: the best of
    :func:`balanced_split` and a bisection over :func:`greedy_probe` limits between the
    simple lower bound and the balanced split's value (or :attr:`StraightModel.top` if the
    balanced split breaks memory).

    O(iterations * S * n) at worst. Not the DP (the solvers stay independent checks of
    it); neither optimal nor memory-feasible in general.

    Returns
    -------
    list[int]
        Starts of stages 1..S-1.
    """
    best = balanced_split(model)
    best_val = model.bottleneck(best) if model.fits(best) else math.inf
    # search up to the balanced split's value, or up to any split's value if it breaks memory
    lo, hi = model.lower_bound, best_val if math.isfinite(best_val) else model.top * (1 + 1e-9)
    for _ in range(iterations):
        if hi - lo <= 1e-12 * max(hi, 1e-300):
            break
        mid = 0.5 * (lo + hi)
        found = greedy_probe(model, mid)
        if found is None:
            lo = mid
        else:
            hi = mid
            val = model.bottleneck(found)
            if val < best_val:
                best, best_val = found, val
    return best


def reach(model: StraightModel, upper: float) -> np.ndarray:
    """``R[a]``: the last position a stage starting at or before unit ``a`` can end at with
    stage time <= ``upper`` seconds (so ``p_t <= a`` implies ``p_{t+1} <= R[a]`` in every
    split of bottleneck <= upper). ``ndarray (n+1,)`` of ints, ``R[a] >= a`` (``R[a] == a``:
    no stage can start by a)."""
    # largest b with end[b] <= x: search the suffix minimum of end (nondecreasing)
    suffix_min = np.minimum.accumulate(model.end[::-1])[::-1]
    x = model.begin + upper * (1 + 1e-12) + 1e-300
    r = np.searchsorted(suffix_min, x, side="right") - 1
    r = np.maximum(r, np.arange(model.n + 1))
    return np.maximum.accumulate(r)


def balanced_split(model: StraightModel) -> list[int]:
    """A quick split to warm-start the solvers: cut where the work prefix crosses t/S of the
    total, then repair towards memory feasibility.

    Stage t (t >= 1) starts at the unit of its window whose start value ``begin[c]`` is
    closest to ``t * total / S`` (ties: the earlier unit). If the split breaks memory, cuts
    are shifted one unit at a time towards the overloaded stage's neighbours while that
    helps (a few passes). This is a hint, not a method: it may be far from optimal or break
    memory, and the solvers treat it as such.

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
    if model.memory_binding:
        starts = _repair_memory(model, starts)
    return starts


def _repair_memory(model: StraightModel, starts: list[int], passes: int = 4) -> list[int]:
    """Shift cuts to shrink stages that exceed memory (greedy, bounded number of moves)."""
    cap = model.capacity * (1 + MEMORY_SLACK)
    p = [0, *starts, model.n]
    for _ in range(passes * model.n):
        over = [t for t in range(model.S) if model.mem_prefix[t, p[t + 1]] - model.mem_prefix[t, p[t]] > cap]
        if not over:
            break
        t = over[0]
        moved = False
        # give the stage's last unit to the next stage, or its first unit to the previous one
        if t + 1 < model.S and p[t + 1] - 1 > p[t]:
            p[t + 1] -= 1
            moved = True
        elif t > 0 and p[t] + 1 < p[t + 1]:
            p[t] += 1
            moved = True
        if not moved:
            break
    return p[1:-1]


# ---- outcome -> Result -------------------------------------------------------------------
def finish(
    model: StraightModel,
    method: str,
    starts: list[int] | None,
    proven_optimal: bool,
    bound: float | None,
    started: float,
    info: dict,
) -> Result:
    """Turn a solver outcome into a :class:`Result` scored by :func:`pipeopt.evaluate`.

    Parameters
    ----------
    model
        The model arrays.
    method
        ``"milp"`` or ``"cpsat"``.
    starts
        Incumbent starts of stages 1..S-1 (``None``: no incumbent; the warm start is used
        if it fits in memory, else the result has no plan).
    proven_optimal
        The solver proved its incumbent optimal (within its stated tolerance).
    bound
        A proven lower bound on the straight optimum in seconds, or ``None``; the result's
        bound is the larger of it and :meth:`PartitionProblem.simple_lower_bound`, never
        above the objective of a proven-optimal plan.
    started
        ``time.perf_counter()`` at the start of the method.
    info
        Solver details to record.

    Returns
    -------
    Result
        Status ``OPTIMAL`` or ``TIME_LIMIT``.
    """
    problem = model.problem
    info = dict(info)
    if starts is None:
        hint = info.get("warm_start")
        if hint is not None and model.fits(hint):
            starts = list(hint)
            info["incumbent"] = "warm start (the solver found none within its time limit)"
    plan = problem.plan(starts) if starts is not None else None
    lb = model.lower_bound if bound is None else max(model.lower_bound, bound)
    status = Status.OPTIMAL if (proven_optimal and plan is not None) else Status.TIME_LIMIT
    res = problem.result(method, plan, status, lower_bound=lb, started=started, info=info)
    if res.evaluation is not None and not res.evaluation.feasible:
        # the solver accepted a split that breaks memory within its own feasibility tolerance
        res.status = Status.INFEASIBLE
        res.info["warning"] = "solver's plan breaks memory within the solver's tolerance: " + "; ".join(
            res.evaluation.violations
        )
    if plan is not None and res.lower_bound is not None and res.lower_bound > res.objective:
        # only rounding can put a proven bound above a feasible plan's value
        res.lower_bound = res.objective
    return res


def starts_from_cumulative(values, model: StraightModel) -> list[int]:
    """Starts of stages 1..S-1 from cumulative indicators ``values[t][c]`` ("stage t has
    started by unit c", t = 1..S-1, c over the window), read with a 0.5 threshold.

    A value ``None`` (a variable the solver dropped because no row uses it, so either value
    gives the same model value) reads as 0.

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
    if any(a >= b for a, b in zip([0, *starts], [*starts, model.n])):
        raise RuntimeError(f"solver values do not give {model.S} non-empty stages: starts {starts}")
    return starts
