"""Baselines of the Bi-Partition problem: the best same-cut plan, and a greedy cut mover.

``same_cut`` is the classic answer (forward and backward cut at the same layers): the exact
partition DP (:func:`pipeopt.exact.dp.solve_dp`), re-scored in the Bi-Partition space.

``greedy`` follows the idea of Bi-Partition (Cui et al.): start from the best same-cut plan
and move individual backward cuts, one unit position at a time, while the loads even out.
Each round tries every single-cut move of the backward split (to any position that keeps the
stages non-empty and respects ``max_shift``) and applies the best one; a move is accepted if
it lowers, lexicographically, the vector of stage and cut times sorted from the largest (so
that it may lower the number of stages tied at the bottleneck before the bottleneck itself);
plans that break memory are compared by their bytes over capacity first. It stops when no
move improves or at its time limit. Scores use :meth:`BipartitionProblem.score`, the same
model as :func:`pipeopt.evaluate`.

References
----------
Cui et al., *Bi-Partition*, Journal of Cloud Computing (Springer) -- separate forward and
backward cuts (the paper's own search is not public here; this greedy is in its spirit).
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from ..bipartition import BipartitionProblem, Score
from ..cluster import Cluster
from ..errors import InfeasibleError
from ..exact.dp import solve_dp
from ..partition import PartitionProblem
from ..result import Result, Status


def best_same_cut(problem: BipartitionProblem, *, ignore_memory: bool = False) -> list[int] | None:
    """Cut positions of the best same-cut plan (exact partition DP), or ``None`` if none fits memory.

    Parameters
    ----------
    problem
        The Bi-Partition problem.
    ignore_memory
        Solve the DP with unlimited memory (a starting point when no same-cut plan fits).

    Returns
    -------
    list[int] | None
        ``S - 1`` unit indices.
    """
    base = problem.same_cut_problem()
    if ignore_memory:
        cl = problem.instance.cluster
        free = Cluster(tuple(dataclasses.replace(d, memory=math.inf) for d in cl.devices), cl.bandwidth)
        base = PartitionProblem(problem.instance.replace(cluster=free), problem.stages)
    try:
        res = solve_dp(base)
    except InfeasibleError:
        return None
    return base.starts_of(res.plan)


def same_cut(problem: BipartitionProblem, *, time_limit: float = 60.0, solver: str = "cbc", seed: int = 0, **_kw) -> Result:
    """The best plan whose forward and backward cuts coincide (a_i = b_i).

    Parameters
    ----------
    problem
        The Bi-Partition problem.
    time_limit, solver, seed
        Unused (the DP is exact and fast); accepted for the common method signature.

    Returns
    -------
    Result
        Status ``FEASIBLE`` (optimal among same-cut plans, ``info["same_cut_optimal"]``, but
        not proven optimal for Bi-Partition; no lower bound), or ``INFEASIBLE`` without a plan
        if no same-cut plan fits memory.

    References
    ----------
    The exact partition DP (:mod:`pipeopt.exact.dp`).
    """
    started = time.perf_counter()
    cuts = best_same_cut(problem)
    if cuts is None:
        return problem.result("same_cut", None, Status.INFEASIBLE, started=started,
                              info={"reason": "no same-cut plan fits the workers' memory"})
    return problem.result("same_cut", problem.plan(cuts, cuts), Status.FEASIBLE, started=started,
                          info={"same_cut_optimal": True, "cuts": cuts})


def _key(problem: BipartitionProblem, s: Score) -> tuple:
    times = np.concatenate([s.stage_time, s.comm_time if problem.overlap else []])
    return (s.excess, *np.sort(times)[::-1])


def _better(new: tuple, old: tuple, rel: float = 1e-12) -> bool:
    """Lexicographic ``new < old`` ignoring float noise."""
    for x, y in zip(new, old, strict=True):
        if abs(x - y) > rel * max(abs(x), abs(y), 1e-300):
            return x < y
    return False


def greedy(problem: BipartitionProblem, *, time_limit: float = 60.0, solver: str = "cbc", seed: int = 0, **_kw) -> Result:
    """Greedy Bi-Partition: move backward cuts of the best same-cut plan while loads even out.

    Parameters
    ----------
    problem
        The Bi-Partition problem.
    time_limit
        Seconds; the search stops after the round in progress.
    solver, seed
        Unused (deterministic); accepted for the common method signature.

    Returns
    -------
    Result
        Status ``FEASIBLE`` (``INFEASIBLE`` if its plan breaks memory); no lower bound.
        ``info``: ``moves`` applied, ``start`` (same-cut cuts), ``fwd_cuts``, ``bwd_cuts``.

    References
    ----------
    Cui et al., *Bi-Partition*, J. Cloud Computing (module docstring).
    """
    started = time.perf_counter()
    S, n = problem.stages, problem.n
    start = best_same_cut(problem)
    if start is None:
        start = best_same_cut(problem, ignore_memory=True)
    a = list(start)
    b = list(start)
    key = _key(problem, problem.score(a, b))
    moves = 0
    while time.perf_counter() - started < time_limit:
        best = None
        for c in range(S - 1):
            lo = b[c - 1] + 1 if c > 0 else 1
            hi = b[c + 1] - 1 if c < S - 2 else n - 1
            if problem.max_shift is not None:
                lo, hi = max(lo, a[c] - problem.max_shift), min(hi, a[c] + problem.max_shift)
            for pos in range(lo, hi + 1):
                if pos == b[c]:
                    continue
                cand = b[:c] + [pos] + b[c + 1 :]
                k = _key(problem, problem.score(a, cand))
                if _better(k, key if best is None else best[0]):
                    best = (k, cand)
        if best is None:
            break
        key, b = best
        moves += 1
    plan = problem.plan(a, b)
    return problem.result("greedy", plan, Status.FEASIBLE, started=started,
                          info={"moves": moves, "start": list(start), "fwd_cuts": a, "bwd_cuts": b})
