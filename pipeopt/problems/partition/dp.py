"""Exact dynamic program for the partition problem (straight and replicated spaces).

Straight (one worker per stage): with best[s][j] the smallest bottleneck of units 0..j-1 in
s stages, ``best[s][j] = min_i max(best[s-1][i], cost(i, j, stage s-1))``, O(S n^2),
vectorised over (i, j). The stage index enters through memory (stage t keeps S - t
microbatches under 1F1B).

Replicated (PipeDream, Narayanan et al. SOSP 2019, section 3.1): with best[w][j] the
smallest bottleneck of units 0..j-1 on w workers, ``best[w][j] = min_{i, m} max(best[w-m][i],
cost_m(i, j))`` over stages on m replicas, which keep ceil(W/m) microbatches, W the workers
from the stage to the end (:func:`pipeopt.cost.rules.in_flight`). O(S^2 n^2).

``cost`` is :meth:`PartitionProblem.stage_time` (the cost table's compute, all-reduce and cut
terms, exactly as :func:`pipeopt.evaluate` scores a stage; the cut between stages on m and
m' replicas is thereby counted over min(m, m') links) and a stage fits iff it ends by
:meth:`PartitionProblem.memory_reach` of its start (the cost model's ``fits``). Both DPs are
exact in pipeopt's cost model; the result's bound equals its objective.
"""

from __future__ import annotations

import math

import numpy as np

from ...backends.deadline import Deadline, DeadlineReached
from ...cost import rules
from ...errors import InfeasibleError
from ...result import Result, Status
from .problem import PartitionProblem


def _time_matrix(p: PartitionProblem, m: int) -> np.ndarray:
    """``cost[j, i]``: time of a stage of units i..j-1 on m replicas, memory aside (inf if
    i >= j), :meth:`PartitionProblem.stage_time`. End-major, so that the minimum over starts
    runs along contiguous memory."""
    j = np.arange(p.n + 1)[:, None]
    i = np.arange(p.n + 1)[None, :]
    cost = p.stage_time(i, j, in_flight=1, replicas=m, memory=False)
    return np.where(j > i, cost, np.inf)


def _step(p: PartitionProblem, best: np.ndarray, time: np.ndarray, in_flight, out: np.ndarray):
    """One DP step: for every end j, the best ``max(best[i], stage i..j-1)`` over starts i.

    The stage's memory enters through :meth:`PartitionProblem.memory_reach`: a stage i..j-1
    with ``j > reach[i]`` does not fit.

    Returns
    -------
    (value, arg) or None
        ``ndarray (n+1,)`` each: the best value per end and the start achieving it (None if no
        start is reachable).
    """
    rows = np.flatnonzero(np.isfinite(best))  # prefixes reachable so far
    if rows.size == 0:
        return None
    lo, hi = int(rows[0]), int(rows[-1]) + 1  # unreachable starts in between have best = inf
    sub = out[:, : hi - lo]
    np.maximum(best[None, lo:hi], time[:, lo:hi], out=sub)
    if math.isfinite(p.memory):
        reach = p.memory_reach(in_flight)[lo:hi]
        np.putmask(sub, np.arange(p.n + 1)[:, None] > reach[None, :], np.inf)
    pick = np.argmin(sub, axis=1)
    ends = np.arange(p.n + 1)
    return sub[ends, pick], pick + lo


def _infeasible(p: PartitionProblem) -> InfeasibleError:
    cap = p.memory
    return InfeasibleError(
        f"no split of {p.instance.name} into {p.stages} stages fits in {cap / 2**30:.3f} GiB per worker"
        + (" (with replication)" if p.replication else "")
    )


def solve_dp(problem: PartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
             threads: int = 2) -> Result:
    """Solve the partition problem exactly by dynamic programming.

    Parameters
    ----------
    problem
        The partition problem; ``problem.replication`` selects the search space.
    time_limit
        Seconds, or the :class:`~pipeopt.backends.deadline.Deadline` of the solve. The DP
        checks it between stages (straight) or worker counts (replicated); if it passes, the
        result has status ``TIME_LIMIT``, no plan (the DP has no incumbent before its last
        step) and :meth:`PartitionProblem.simple_lower_bound` as its bound.
    solver, seed, threads
        Unused (the common method signature).

    Returns
    -------
    Result
        Status ``OPTIMAL``, ``lower_bound`` = objective: the DP minimises over every split
        with the stage times :func:`pipeopt.evaluate` gives (:meth:`PartitionProblem.stage_time`,
        memory by :func:`pipeopt.cost.rules.fits`), so its optimum is exact up to float
        rounding (about 1e-15 relative); ``info["dp_value"]`` is its own value.

    Raises
    ------
    InfeasibleError
        If no split fits the workers' memory (proven: every split was priced).
    """
    deadline = Deadline.of(time_limit)
    try:
        if problem.replication:
            starts, reps, value = _replicated(problem, deadline)
        else:
            starts, value = _straight(problem, deadline)
            reps = None
    except DeadlineReached as stop:
        return problem.result("dp", None, Status.TIME_LIMIT, lower_bound=problem.simple_lower_bound(),
                              started=deadline.started, info={"stopped": str(stop)})
    plan = problem.plan(starts, reps)
    res = problem.result("dp", plan, Status.OPTIMAL, started=deadline.started, info={"dp_value": value})
    return res


def _straight(p: PartitionProblem, deadline: Deadline) -> tuple[list[int], float]:
    n, S = p.n, p.stages
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    args = []
    time = _time_matrix(p, 1)
    work = np.empty((n + 1, n + 1))
    for s in range(S):
        deadline.check(f"DP stage {s}")
        step = _step(p, best, time, p.in_flight(s), work)
        if step is None:
            raise _infeasible(p)
        best, arg = step
        args.append(arg)
    value = float(best[n])
    if not math.isfinite(value):
        raise _infeasible(p)
    starts, j = [], n
    for s in range(S - 1, 0, -1):
        j = int(args[s][j])
        starts.append(j)
    return starts[::-1], value


def _replicated(p: PartitionProblem, deadline: Deadline) -> tuple[list[int], list[int], float]:
    n, S = p.n, p.stages
    best = np.full((S + 1, n + 1), np.inf)
    best[0, 0] = 0.0
    arg_i = np.zeros((S + 1, n + 1), dtype=int)
    arg_m = np.zeros((S + 1, n + 1), dtype=int)
    times: dict = {}
    work = np.empty((n + 1, n + 1))
    for w in range(1, S + 1):
        for m in range(1, w + 1):
            deadline.check(f"DP on {w} workers")
            # the stage uses workers w-m+1..w of S: the workers from it to the end are S-(w-m)
            in_flight = rules.in_flight(w - m, S, workers_after=S - (w - m), replicas=m)
            if m not in times:
                times[m] = _time_matrix(p, m)
            step = _step(p, best[w - m], times[m], in_flight, work)
            if step is None:
                continue
            val, arg = step
            better = val < best[w]
            best[w] = np.where(better, val, best[w])
            arg_i[w] = np.where(better, arg, arg_i[w])
            arg_m[w] = np.where(better, m, arg_m[w])
    value = float(best[S, n])
    if not math.isfinite(value):
        raise _infeasible(p)
    starts, reps, w, j = [], [], S, n
    while j > 0:
        m, i = int(arg_m[w, j]), int(arg_i[w, j])
        reps.append(m)
        if i > 0:
            starts.append(i)
        w, j = w - m, i
    return starts[::-1], reps[::-1], value
