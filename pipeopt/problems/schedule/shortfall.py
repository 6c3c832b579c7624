"""By how much a schedule misses the memory limit when no split fits: the least, over every split,
of its fullest rank's memory beyond the device's, for the message of an infeasible result.

For a fixed order chunk s holds at most ``k_s`` microbatches in flight
(:meth:`pipeopt.schedules.Schedule.in_flight`), so its memory is at least
``k_s * act + parameter_copies * params + state`` (:func:`pipeopt.cost.rules.stage_memory`, the
executor's rule, :func:`pipeopt.schedules.execute.rank_memory`), with recomputation the least of
that over the chunk's recompute choices (:meth:`~pipeopt.problems.partition.recompute.RecomputeModel.overshoot`),
and a rank's memory at least that of each of its chunks. The least, over every split, of the
largest chunk overshoot is a min-max over a chain (the partition problem's
:func:`~pipeopt.problems.partition.recompute.min_max_overshoot`): **exact** when every rank holds
one chunk (the chunk's memory is the rank's), a lower bound on the shortfall when a rank holds
several (their memories add) and for the free order (whose in-flight counts are chosen: at least
one microbatch per chunk).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...cost import rules
from ...schedules import FREE
from ..partition.recompute import min_max_overshoot, overshoot_hint

__all__ = ["Shortfall", "least_overshoot", "shortfall_note"]


@dataclass(frozen=True)
class Shortfall:
    """The least memory overshoot of a schedule problem's splits.

    Attributes
    ----------
    bytes
        The least, over every split, of the fullest rank's bytes beyond the device's memory
        (``<= 0``: some split's chunks fit; with ``exact`` False a lower bound).
    starts
        ``list[int]``: the split attaining it (units where chunks 1..S-1 start).
    exact
        True when every rank holds one chunk of a fixed order: ``bytes`` is then the least
        overshoot itself, else a lower bound on it.
    """

    bytes: float
    starts: list
    exact: bool


def least_overshoot(problem) -> Shortfall:
    """The least, over every split of ``problem`` (a
    :class:`~pipeopt.problems.schedule.problem.ScheduleProblem`), of its largest chunk memory
    beyond the device's (module docstring).

    Returns
    -------
    Shortfall
        Bytes (``inf`` if no chunk of any split is finite), the split and whether it is exact.
    """
    sched, n, S = problem.schedule, problem.n, problem.S
    free = sched.name == FREE
    flight = [1] * S if free else [max(int(k), 1) for k in sched.in_flight()]
    if problem.recomputation is not None:
        model = problem.recomputation
        model.prepare(sorted(set(float(k) for k in flight)))
        mats = [model.overshoot(float(flight[s])) for s in range(S)]
    else:
        P = problem.prefixes
        j = np.arange(n + 1)[:, None]  # end-major: row j (end), column i (start)
        i = np.arange(n + 1)[None, :]
        lo = np.minimum(i, j)
        act, params = P["act"][j] - P["act"][lo], P["param"][j] - P["param"][lo]
        state = problem.table.sharded_state(lo, j)  # training state beyond the weights (0 by default)
        mats = [np.where(j > i, rules.stage_memory(act, params, flight[s], sched.parameter_copies) + state
                         - problem.capacity, np.inf) for s in range(S)]
    over, starts = min_max_overshoot(mats, S)
    one_each = all(len(sched.stages_on(r)) == 1 for r in range(sched.ranks))
    return Shortfall(float(over), [int(c) for c in starts], bool(one_each and not free))


def shortfall_note(problem, short: Shortfall | None = None) -> str:
    """``"no split fits: the best ... misses the limit by X GiB (B bytes) on its fullest rank"``
    (``short``, default :func:`least_overshoot`; "by at least" where it is a lower bound), with
    a hint on recomputation; ``""`` if the bound says nothing (some split's chunks fit one by one)."""
    short = least_overshoot(problem) if short is None else short
    if not (math.isfinite(short.bytes) and short.bytes > 0):
        return ""
    how = overshoot_hint(problem.recompute)
    by = "by" if short.exact else "by at least"
    return (f"no split fits: the best (chunks starting at units {[0, *short.starts]}) misses the limit {by} "
            f"{short.bytes / 2**30:.3f} GiB ({short.bytes:,.0f} bytes) on its fullest rank{how}")
