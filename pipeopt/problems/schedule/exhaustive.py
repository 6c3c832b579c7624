"""Every split, scored by the executor: the exact answer on small chains (the tests' check of
the MILP), and nothing else. With free W placement, every split times every placement of the
W's (:func:`w_assignments`); with ``recompute="auto"``, every split with its exact recompute
sets (:mod:`.recompute`)."""

from __future__ import annotations

import itertools
import math
import time
from math import comb

from ...cost.passes import pass_times
from ...errors import InvalidProblemError
from ...schedules import execute
from ...schedules.w_gaps import place_w, rank_gaps
from ...result import Result
from .problem import ScheduleProblem
from .recompute import best_recompute

__all__ = ["MAX_SPLITS", "exhaustive", "w_assignments"]

MAX_SPLITS = 20_000
"""The most splits (times W placements) :func:`exhaustive` agrees to score."""


def w_assignments(gaps, chunk_order: bool = True):
    """Every W placement of a schedule: per rank, a gap for each W of
    :func:`~pipeopt.schedules.w_gaps.rank_gaps` ``[r].ws`` at or after its I's step; with
    ``chunk_order``, only those where the W's of one chunk keep the order of their I's (the
    model's lossless restriction); without, all of them (W's of one gap in a fixed order:
    their order inside a gap changes nothing, :mod:`pipeopt.schedules.w_gaps`).

    Yields ``tuple`` per rank of ``tuple`` of gaps."""
    per_rank = []
    for rg in gaps:
        options = []
        for where in itertools.product(*(range(lo, rg.gaps) for lo in rg.earliest)):
            if chunk_order and any(where[a] > where[b] for c in rg.chains for a, b in itertools.pairwise(c)):
                continue
            options.append(where)
        per_rank.append(options)
    yield from itertools.product(*per_rank)


def exhaustive(problem: ScheduleProblem, *, chunk_order: bool = True, **_) -> Result:
    """The split of least iteration time over all ``C(n - 1, S - 1)`` splits, each run by
    :meth:`ScheduleProblem.execute` (ties: the first in lexicographic order of the starts).
    With ``problem.w_placement == "free"``, each split in every W placement
    (:func:`w_assignments`, ``chunk_order`` as there): the result's
    ``evaluation.schedule`` (and ``info["order"]``) is the best one's. The solve arguments
    every method takes (``time_limit``, ``solver``, ...) are accepted and ignored: the count
    of splits is bounded by :data:`MAX_SPLITS` instead.

    With ``problem.recompute``: ``"full"`` runs every split with every layer recomputed;
    ``"auto"`` gives each split (in each W placement) its exact recompute sets
    (:func:`.recompute.best_recompute`: per chunk the least rerun seconds that fit with v = 1,
    the ranks' combined choices with v > 1), so the result is the optimum over splits x
    recompute sets (status ``"feasible"`` without a bound if a recompute frontier had to be
    thinned, ``info["recompute_exact"]``).

    Data parallelism and ZeRO (``Settings.dp``, ``zero`` and the training-state ratios) are the
    executor's (each chunk's sharded state in its rank's memory, ZeRO-2/3's collectives in its ops,
    the synchronisation after the flush), and the recompute choice counts each chunk's sharded
    state as fixed bytes (:meth:`.recompute.ChunkRecompute.state`): the optimum holds under them.

    Returns
    -------
    Result
        Method ``"exhaustive"``, status ``"optimal"`` (bound = its time) or ``"infeasible"``
        (no split fits).

    Raises
    ------
    InvalidProblemError
        If there are more than :data:`MAX_SPLITS` splits (times placements).
    """
    if problem.is_free:
        raise InvalidProblemError(f"method 'exhaustive' splits a fixed order; the free order (schedule='free') is"
                                  " solved by 'cpsat' (or 'auto')")
    started = time.perf_counter()
    n, S = problem.n, problem.S
    count = comb(n - 1, S - 1)
    orders = [None]
    if problem.w_placement == "free":
        gaps = rank_gaps(problem.schedule)
        orders = []
        for assignment in w_assignments(gaps, chunk_order):
            orders.append(place_w(problem.schedule, assignment, gaps))
            if count * len(orders) > MAX_SPLITS:
                break
    if count * len(orders) > MAX_SPLITS:
        raise InvalidProblemError(f"exhaustive: {count} splits of {n} units into {S} chunks times {len(orders)}+"
                                  f" W placements (at most {MAX_SPLITS})")
    best, best_order, best_value, best_rc = None, None, math.inf, None
    auto = problem.recompute == "auto"
    for starts in itertools.combinations(range(1, n), S - 1):
        if not auto:  # what run_schedule does, once per split (recompute none or full: one plan per split)
            times = pass_times(problem.instance, problem.plan(starts))
        for order in orders:
            if auto:  # the exact recompute sets of this split in this order (.recompute)
                value, rc, _ = best_recompute(problem, starts, problem.schedule if order is None else order)
            else:
                ex = execute(problem.schedule if order is None else order, times)
                value, rc = (ex.time if ex.feasible else math.inf), None
            if value < best_value:
                best, best_order, best_value, best_rc = list(starts), order, value, rc
    info = {"splits": count, "placements": len(orders)}
    if auto:
        info["recompute_exact"] = bool(problem.recomputation.exact)
    if best is None:
        return problem.result("exhaustive", None, "infeasible", lower_bound=math.inf, started=started, info=info)
    if auto and not problem.recomputation.exact:  # a frontier was thinned: the choice is real, not proven
        return problem.result("exhaustive", best, "feasible", started=started, info=info, order=best_order,
                              recompute=best_rc)
    return problem.result("exhaustive", best, "optimal", lower_bound=best_value, started=started, info=info,
                          order=best_order, recompute=best_rc)
