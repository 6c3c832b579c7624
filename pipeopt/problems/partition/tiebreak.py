"""The secondary objective: among splits of optimal bottleneck, the shortest iteration.

Many splits often share the optimal steady-state period (the bottleneck stage or window
decides it; the other cuts are free within it), and they do not run equally well: a plan
whose last stage idles fills and drains the pipeline more slowly. Every exact method of the
straight partition problem therefore breaks ties the same documented way, once its primary
optimum T* is proven:

1. **the iteration time of M microbatches under 1F1B with a flush** (M =
   ``settings.microbatches``), minimised over the splits whose period is at most T*
   (relative slack :data:`~pipeopt.problems.partition.events.CAP_REL`), by the event-time
   MILP of :mod:`pipeopt.problems.partition.events` (the window rows cap the period);
2. then **peak memory**, as the order between splits of equal iteration time: not
   optimised (the MILP returns one of them), and said so in ``info["secondary"]``.

The DP, the MILP and the CP-SAT model all call :func:`break_ties` with their proven plan as
the warm start, so they return plans of equal primary and secondary value when the second
phase is proven. The budget, the record ``info["secondary"]`` and the guard against a
stopped or crashed solver are those of every problem (:mod:`pipeopt.problems.secondary`:
:data:`SECONDARY_SHARE` of the clock, at most :data:`SECONDARY_LIMIT`); if the budget runs
out first the best tied split found so far is kept and ``info["secondary"]["proven"]`` is
False. The replicated-one-order space has no second phase (the event-time model covers one worker per
stage); its results say so. Bi-Partition breaks its ties by the same objective
(:mod:`pipeopt.problems.bipartition.tiebreak`).
"""

from __future__ import annotations

import math

import numpy as np

from ...backends.deadline import Deadline
from ...cost import evaluate
from .. import secondary
from ..secondary import SECONDARY_LIMIT, SECONDARY_SHARE  # noqa: F401 - the budget, named in the docstring
from .events import CAP_REL, solve_events
from .problem import PartitionProblem

SECONDARY = "iteration time of M microbatches under 1F1B with a flush, then peak memory (not optimised)"


def has_tie(problem: PartitionProblem, T: float, deadline: Deadline) -> bool:
    """True if at least two straight splits fit in memory and have a period <= T.

    The DP's feasibility probe at T (:mod:`pipeopt.problems.partition.dp`) keeping the two
    least window slacks G per (stage, end unit) over distinct partial splits instead of one:
    if a partial split extends to a full split of period <= T, so do the ones of smaller G (a
    smaller G is better for every later row, :func:`pipeopt.cost.rules.window_step`), so two
    feasible full splits exist iff the end state keeps two. When it keeps one, the optimal
    split is unique and the second phase has nothing to choose. O(S n^2).
    """
    n, S = problem.n, problem.stages
    _, bound = problem.cut_terms
    trip = np.asarray(problem.trip, dtype=float)
    j = np.arange(n + 1)[:, None]
    i = np.arange(n + 1)[None, :]
    work = np.where(j > i, problem.stage_work(i, j), np.inf)
    link_bad = (bound[None, :] > T) | (bound[:, None] > T)
    first = np.full(n + 1, np.inf)
    second = np.full(n + 1, np.inf)
    first[0] = -np.inf
    for s in range(S):
        deadline.check(f"tie check, stage {s}")
        k = S - s
        both = []
        for prev in (first, second):
            cand = work + np.maximum(-k * T, prev + trip)[None, :]
            bad = link_bad | (cand > -(k - 1) * T) | ~(prev < np.inf)[None, :]
            if math.isfinite(problem.memory):
                bad |= j > problem.memory_reach(k)[None, :]
            both.append(np.where(bad, np.inf, cand))
        two = np.partition(np.concatenate(both, axis=1), 1, axis=1)[:, :2]
        first, second = two[:, 0].copy(), two[:, 1].copy()
    return bool(second[n] < np.inf)


def break_ties(problem: PartitionProblem, starts: list[int], deadline: Deadline, info: dict, *,
               solver: str = "cbc", threads: int = 1, seed: int = 0) -> list[int]:
    """The split of least 1F1B-flush iteration time among those of period <= the period of
    ``starts`` (the proven primary optimum). If :func:`has_tie` finds no other such split,
    ``starts`` is returned at once (proven).

    Parameters
    ----------
    problem
        A straight partition problem whose objective is ``"bottleneck"`` (other objectives
        and the replicated-one-order space return ``starts`` unchanged, with a note).
    starts
        The proven optimal split (stage starts after the first).
    deadline
        The method's clock; the second phase gets :data:`SECONDARY_SHARE` of what is left of
        it, at most :data:`SECONDARY_LIMIT` seconds.
    info
        The result's info dict: ``info["secondary"]`` (:func:`pipeopt.problems.secondary.open_record`)
        records the objective, the chosen split's iteration time (``value``), the cap, the
        phase's bound and whether it was proven.
    solver, threads, seed
        For the event-time MILP (:func:`pipeopt.problems.partition.events.solve_events`).

    Raises
    ------
    DeadlineReached
        If the clock runs out during the tie check (the caller keeps ``starts``).

    Returns
    -------
    list[int]
        The split to report (``starts`` itself if no tied split is better or time ran out
        before one was found). Its period is within ``CAP_REL`` of the period of ``starts``.
    """
    inst = problem.instance
    if inst.settings.objective != "bottleneck" or problem.replication:
        info["secondary"] = {"objective": "none (only the bottleneck objective in the one-order space has one)"}
        return list(starts)
    period = problem.period(starts)
    ev = evaluate(inst, problem.plan(starts))
    record = secondary.open_record(info, SECONDARY, ev.iteration_time, cap=period, evaluation=ev)
    if problem.stages in (1, problem.n) or not has_tie(problem, period * (1 + CAP_REL), deadline):
        record.update(proven=True, unique=True)  # no other split has the optimal period
        return list(starts)

    def phase(clock: Deadline, rec: dict) -> list[int]:
        out = solve_events(problem, "1f1b", period_cap=period, deadline=clock, solver=solver,
                           threads=threads, seed=seed, hint=list(starts))
        rec.update(bound=out.bound, status=str(out.status))
        chosen = list(starts)
        if out.starts is not None and out.value < rec["value"] and problem.period(out.starts) <= period * (1 + CAP_REL):
            chosen = list(out.starts)
            secondary.settle(rec, out.value, evaluate(inst, problem.plan(chosen)))
        rec["proven"] = str(out.status) == "optimal"
        return chosen

    return secondary.run(phase, list(starts), deadline, record)
