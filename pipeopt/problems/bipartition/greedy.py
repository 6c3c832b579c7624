"""Baselines of the Bi-Partition problem: the best same-cut plan, and a greedy cut mover.

``same_cut`` is the classic answer (forward and backward cut at the same layers): the exact
partition DP (:func:`pipeopt.problems.partition.dp.solve_dp`), re-scored in the Bi-Partition space.

``greedy`` follows the idea of Bi-Partition (Cui et al.): start from the best same-cut plan
and move cuts, forward and backward, one cut at a time, while the time per microbatch
improves. Each round scores every move of the current plan and applies the best one:

* **backward move**: one backward cut b_c to any other position (the other cuts stay);
* **forward move**: one forward cut a_c to any other position (``move="both"``, the default);
* **boundary move**: the forward and the backward cut of one boundary together, by the same
  offset (the stage boundary moves in both passes; ``move="both"``).

Positions keep every stage non-empty in both passes and respect ``max_shift``. A move is
accepted if it lowers, lexicographically, (bytes over capacity, the time per microbatch of
:meth:`BipartitionProblem.score` -- the steady state of 1F1B with its window rows, the value
:func:`pipeopt.evaluate` reports --, then the stage and cut times sorted from the largest): so
the objective never gets worse, and among moves that tie on it the one that lowers the number
of stages tied at the bottleneck wins. It stops when no move improves or at its time limit.
``move="backward"`` restricts it to backward moves (forward cuts stay where the same-cut
optimum put them). No guarantee: a local search.

References
----------
Cui et al., *Bi-Partition*, Journal of Cloud Computing (Springer) -- separate forward and
backward cuts (the paper's own search is not public here; this greedy is in its spirit).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ...backends.deadline import Deadline, DeadlineReached
from ...errors import InfeasibleError, InvalidProblemError
from ...cost.tolerance import FLOAT_NOISE
from ...result import Result, Status
from ..partition.dp import solve_dp
from ..partition.problem import PartitionProblem
from .problem import BipartitionProblem, Score


def best_same_cut(problem: BipartitionProblem, *, ignore_memory: bool = False,
                  deadline: Deadline | None = None) -> list[int] | None:
    """Cut positions of the best same-cut plan (exact partition DP), or ``None`` if none fits memory.

    Parameters
    ----------
    problem
        The Bi-Partition problem.
    ignore_memory
        Solve the DP with unlimited memory (a starting point when no same-cut plan fits).
    deadline
        The solve's :class:`~pipeopt.backends.deadline.Deadline` (``None``: no limit); the DP
        checks it between stages.

    Returns
    -------
    list[int] | None
        ``S - 1`` unit indices; ``None`` only when the DP proved that no same-cut plan fits.

    Raises
    ------
    DeadlineReached
        If the deadline stopped the DP before it had a plan.
    """
    base = problem.same_cut_problem()
    if ignore_memory:
        cl = problem.instance.cluster
        free = dataclasses.replace(cl, devices=tuple(dataclasses.replace(d, memory=math.inf) for d in cl.devices))
        base = PartitionProblem(problem.instance.replace(cluster=free), problem.stages)
    dl = Deadline(None) if deadline is None else deadline
    try:
        res = solve_dp(base, time_limit=dl)
    except InfeasibleError:
        return None
    if res.plan is None:
        raise DeadlineReached("the same-cut DP", dl.elapsed())
    return base.starts_of(res.plan)  # the same-cut problem has no recomputation: starts_of refuses a plan with one


def same_cut(problem: BipartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc",
             seed: int = 0, threads: int = 2) -> Result:
    """The best plan whose forward and backward cuts coincide (a_i = b_i).

    Parameters
    ----------
    problem
        The Bi-Partition problem.
    time_limit
        Seconds, or the :class:`~pipeopt.backends.deadline.Deadline` of the solve (the DP
        checks it between stages).
    solver, seed, threads
        Unused (the DP is exact and fast); accepted for the common method signature.

    Returns
    -------
    Result
        Status ``FEASIBLE`` (optimal among same-cut plans, ``info["same_cut_optimal"]``, but
        not proven optimal for Bi-Partition; no lower bound), ``INFEASIBLE`` without a plan
        if no same-cut plan fits memory, or ``TIME_LIMIT`` without a plan if the deadline
        stopped the DP.

    References
    ----------
    The exact partition DP (:mod:`pipeopt.problems.partition.dp`).
    """
    deadline = Deadline.of(time_limit)
    try:
        cuts = best_same_cut(problem, deadline=deadline)
    except DeadlineReached as stop:
        return problem.result("same_cut", None, Status.TIME_LIMIT, started=deadline.started,
                              info={"stopped": str(stop)})
    if cuts is None:
        return problem.result("same_cut", None, Status.INFEASIBLE, started=deadline.started,
                              info={"reason": "no same-cut plan fits the workers' memory"})
    return problem.result("same_cut", problem.plan(cuts, cuts), Status.FEASIBLE, started=deadline.started,
                          info={"same_cut_optimal": True, "cuts": cuts})


def _key(problem: BipartitionProblem, s: Score) -> tuple:
    times = np.concatenate([s.stage_time, s.comm_time if problem.overlap else []])
    return (s.excess, s.bottleneck, *np.sort(times)[::-1])


def _better(new: tuple, old: tuple, rel: float = FLOAT_NOISE) -> bool:
    """Lexicographic ``new < old`` ignoring float noise."""
    for x, y in zip(new, old, strict=True):
        if abs(x - y) > rel * max(abs(x), abs(y), 1e-300):
            return x < y
    return False


def _moves(problem: BipartitionProblem, cuts: dict, kinds: tuple):
    """Every plan one move away from ``cuts`` (module docstring): ``(kind, fwd, bwd)``."""
    S, n, k = problem.stages, problem.n, problem.max_shift

    def span(row, c):  # positions of cut c that keep the stages of ``row``'s pass non-empty
        return (row[c - 1] + 1 if c > 0 else 1), (row[c + 1] - 1 if c < S - 2 else n - 1)

    a, b = cuts["fwd"], cuts["bwd"]
    for c in range(S - 1):
        for kind in kinds:
            if kind == "boundary":
                (alo, ahi), (blo, bhi) = span(a, c), span(b, c)
                for d in range(max(alo - a[c], blo - b[c]), min(ahi - a[c], bhi - b[c]) + 1):
                    if d:  # the shift |a_c - b_c| is unchanged
                        yield kind, a[:c] + [a[c] + d] + a[c + 1 :], b[:c] + [b[c] + d] + b[c + 1 :]
                continue
            mine, other = (a, b) if kind == "forward" else (b, a)
            lo, hi = span(mine, c)
            if k is not None:
                lo, hi = max(lo, other[c] - k), min(hi, other[c] + k)
            for pos in range(lo, hi + 1):
                if pos != mine[c]:
                    moved = mine[:c] + [pos] + mine[c + 1 :]
                    yield (kind, moved, b) if kind == "forward" else (kind, a, moved)


def greedy(problem: BipartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc",
           seed: int = 0, threads: int = 2, move: str = "both") -> Result:
    """Greedy Bi-Partition: move forward and backward cuts of the best same-cut plan while the
    time per microbatch improves (module docstring).

    Parameters
    ----------
    problem
        The Bi-Partition problem.
    time_limit
        Seconds, or the :class:`~pipeopt.backends.deadline.Deadline` of the solve: the
        same-cut start draws from it and the search stops after the round in progress.
    solver, seed, threads
        Unused (deterministic); accepted for the common method signature.
    move
        ``"both"`` (default: backward, forward and boundary moves) or ``"backward"`` (backward
        moves only: the forward cuts stay where the same-cut optimum put them).

    Returns
    -------
    Result
        Status ``FEASIBLE`` (``INFEASIBLE`` if its plan breaks memory; ``TIME_LIMIT`` without
        a plan if the deadline stopped the same-cut start); no lower bound. ``info``:
        ``moves`` applied, ``moves_by_kind`` (``backward`` / ``forward`` / ``boundary``),
        ``move``, ``start`` (same-cut cuts), ``fwd_cuts``, ``bwd_cuts``.

    Raises
    ------
    InvalidProblemError
        If ``move`` is not ``"backward"`` or ``"both"``.

    References
    ----------
    Cui et al., *Bi-Partition*, J. Cloud Computing (module docstring).
    """
    deadline = Deadline.of(time_limit)
    if move not in ("backward", "both"):
        raise InvalidProblemError(f"greedy: move must be 'backward' or 'both', got {move!r}")
    try:
        start = best_same_cut(problem, deadline=deadline)
        if start is None:
            start = best_same_cut(problem, ignore_memory=True, deadline=deadline)
    except DeadlineReached as stop:
        return problem.result("greedy", None, Status.TIME_LIMIT, started=deadline.started,
                              info={"stopped": str(stop)})
    cuts = {"fwd": list(start), "bwd": list(start)}
    kinds = ("backward",) if move == "backward" else ("backward", "forward", "boundary")
    key = _key(problem, problem.score(cuts["fwd"], cuts["bwd"]))
    applied = dict.fromkeys(kinds, 0)
    while not deadline.expired():
        best = None
        for kind, a, b in _moves(problem, cuts, kinds):
            k = _key(problem, problem.score(a, b))
            if _better(k, key if best is None else best[0]):
                best = (k, kind, {"fwd": a, "bwd": b})
        if best is None:
            break
        key, kind, cuts = best
        applied[kind] += 1
    a, b = cuts["fwd"], cuts["bwd"]
    plan = problem.plan(a, b)
    return problem.result("greedy", plan, Status.FEASIBLE, started=deadline.started,
                          info={"moves": sum(applied.values()), "moves_by_kind": applied, "move": move,
                                "start": list(start), "fwd_cuts": a, "bwd_cuts": b})
