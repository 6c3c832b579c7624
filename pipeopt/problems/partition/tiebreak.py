"""The secondary objective: among splits of optimal bottleneck, the shortest iteration.

Many splits often share the optimal steady-state period (the bottleneck stage or window
decides it; the other cuts are free within it), and they do not run equally well: a plan
whose last stage idles fills and drains the pipeline more slowly. Every exact method of the
straight partition problem therefore breaks ties the same documented way, once its primary
optimum T* is proven:

1. **the iteration time of M microbatches under 1F1B with a flush** (M =
   ``settings.microbatches``), minimised over the splits whose period is at most T*
   (relative slack :data:`~pipeopt.problems.partition.events.CAP_REL`): first, exactly, over
   every such split, by :mod:`.tied`: their graph of the DP's window states, scored on the run
   graph, timing only the splits whose path bound is at most an upper bound
   (:func:`.tied.least_run`, ``method: enumeration``); past the graph's limits, the same answer
   by a branch and bound over partial splits (:func:`.tied.search_least`, ``method: search``,
   within its node limit); when both give up, a
   deterministic descent that moves one cut at a
   time (:func:`descend`), then, when the model is small enough (:data:`EVENTS_SIZE`), the
   event-time MILP of :mod:`pipeopt.problems.partition.events` from the descent's split (the
   window rows cap the period);
2. then **peak memory**, as the order between splits of equal iteration time: not
   optimised (the MILP returns one of them), and said so in ``info["secondary"]``.

The DP, the MILP and the CP-SAT model all call :func:`break_ties` with their proven plan as
the warm start, so they return plans of equal primary and secondary value when the second
phase is proven. The budget, the record ``info["secondary"]`` and the guard against a
stopped or crashed solver are those of every problem (:mod:`pipeopt.problems.secondary`): the
event-time MILP runs on the method's own clock with at most :data:`SECONDARY_NODES`
branch-and-bound nodes per solve - a work limit, so the same call returns the same split
whatever the machine's load. If the node limit ends it, the best tied split found is kept and
``info["secondary"]["proven"]`` is False; if the method's time limit ends it, the proven split
is returned unchanged (``stopped``). The replicated-one-order space has no second phase (the event-time model covers one worker per
stage); its results say so. Bi-Partition breaks its ties by the same objective
(:mod:`pipeopt.problems.bipartition.tiebreak`).
"""

from __future__ import annotations

import math

import numpy as np

from ...backends.deadline import Deadline
from ...cost import evaluate, rules
from ...cost.tolerance import FLOAT_NOISE, SUM_ORDER
from .. import secondary
from ..secondary import SECONDARY_NODES
from ..secondary import CAP_REL
from .problem import PartitionProblem
from .tied import least_run, search_least

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
        k = rules.in_flight(s, S)
        both = []
        for prev in (first, second):
            cand, ok = rules.window_step(prev[None, :], trip[None, :], work, k, k - 1, T)  # D = k, U = k - 1
            bad = link_bad | ~ok | ~(prev < np.inf)[None, :]
            if math.isfinite(problem.memory):
                bad |= j > problem.memory_reach(k)[None, :]
            both.append(np.where(bad, np.inf, cand))
        two = np.partition(np.concatenate(both, axis=1), 1, axis=1)[:, :2]
        first, second = two[:, 0].copy(), two[:, 1].copy()
    return bool(second[n] < np.inf)


EVENTS_SIZE = 1000
"""The largest event-time MILP the second phase solves, as ``S (S - 1)(n - S)`` (its binaries
times the stages): a rule on the instance, not on the clock. Measured (HiGHS, one thread, the
machine loaded by others): PipeDream profiles at S = 4 (sizes 200-3,900) in 0.5-1.3 s, VGG-16,
AlexNet and GNMT at S = 8 (800-2,100) in 2.7-7.6 s; ResNet-50 at S = 8 (9,400) took 30 s, almost
all of it in HiGHS's root (cuts and sub-MIP heuristics, which a node limit does not bound).
So the MILP runs up to 1,000 (PipeDream's VGG-16, ResNet-18, AlexNet at S = 4, AlexNet at S = 8:
under a second each), keeping a default solve quick; larger models keep the descent's split
(:func:`descend`), with ``proven`` False (VGG-16, S = 8: 2.196 s against the MILP's 2.069 s,
from the primary plan's 2.293 s)."""

DESCENT_STEPS = (1, 2)
"""Units by which :func:`descend` moves one cut."""

DESCENT_EVALUATIONS = 500
"""Most plans :func:`descend` evaluates: a work limit, so it ends at the same split on every run."""


def milp_size(problem: PartitionProblem) -> int:
    """``S (S - 1)(n - S)``: the event-time MILP's binaries times its stages (:data:`EVENTS_SIZE`)."""
    S, n = problem.stages, problem.n
    return S * (S - 1) * max(n - S, 0)


def descend(problem: PartitionProblem, starts: list[int], value: float, cap: float,
            deadline: Deadline | None = None) -> tuple[list[int], float]:
    """A deterministic descent over the tied splits: move one cut by :data:`DESCENT_STEPS` units
    either way (cuts in order, steps in order, first improvement taken) while the split keeps
    its period at most ``cap (1 + CAP_REL)``, fits in memory and its 1F1B-flush iteration time
    (``evaluate(...).iteration_time``) drops by more than float noise; at most
    :data:`DESCENT_EVALUATIONS` plans tried. Each is first timed on the run graph
    (:func:`pipeopt.problems.partition.events.run_time`, built once) and given to
    :func:`pipeopt.evaluate` only if that time could be an improvement (within
    :data:`~pipeopt.cost.tolerance.SUM_ORDER`): the same moves at a fraction of the cost.

    Returns
    -------
    (starts, iteration time)
        The split it ends at (``starts`` if no move helps) and its iteration time (seconds).
    """
    from .ops import event_graph, run_time

    inst, n = problem.instance, problem.n
    graph = event_graph(problem, "1f1b")  # built once: each candidate is first timed on it
    best, best_value, evaluations = list(starts), float(value), 0
    moved = True
    while moved and evaluations < DESCENT_EVALUATIONS:
        moved = False
        for t in range(len(best)):
            for step in DESCENT_STEPS:
                for cand_t in (best[t] - step, best[t] + step):
                    lo = best[t - 1] if t else 0
                    hi = best[t + 1] if t + 1 < len(best) else n
                    if not lo < cand_t < hi:
                        continue
                    cand = best[:t] + [cand_t] + best[t + 1:]
                    if problem.period(cand) > cap * (1 + CAP_REL) or evaluations >= DESCENT_EVALUATIONS:
                        continue
                    if deadline is not None:
                        deadline.check("the tie-break's descent")
                    evaluations += 1
                    # the run graph's time equals evaluate's up to float summation order: a
                    # candidate it shows no better is not evaluated
                    if run_time(problem, cand, "1f1b", graph)[0] >= best_value * (1 - FLOAT_NOISE) * (1 + SUM_ORDER):
                        continue
                    ev = evaluate(inst, problem.plan(cand))
                    if ev.feasible and ev.iteration_time < best_value * (1 - FLOAT_NOISE):
                        best, best_value, moved = cand, float(ev.iteration_time), True
                        break
                if moved:
                    break
            if moved:
                break
    return best, best_value


def break_ties(problem: PartitionProblem, starts: list[int], deadline: Deadline, info: dict, *,
               solver: str = "cbc", threads: int = 1, seed: int = 0) -> list[int]:
    """The split of least 1F1B-flush iteration time among those of period <= the period of
    ``starts`` (the proven primary optimum): by enumeration when the graph of the tied splits
    is small (:func:`least_run`, proven, ``info["secondary"]["method"] == "enumeration"``), else
    by branch and bound within its node limit (:func:`search_least`, proven, ``"search"``); else, if
    :func:`has_tie` finds no other such split, ``starts`` (proven); else the descent and the
    event-time MILP (module docstring).

    Parameters
    ----------
    problem
        A straight partition problem whose objective is ``"bottleneck"`` (other objectives
        and the replicated-one-order space return ``starts`` unchanged, with a note).
    starts
        The proven optimal split (stage starts after the first).
    deadline
        The method's clock (the second phase runs on what is left of it, with at most
        :data:`SECONDARY_NODES` nodes per solve).
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
    if problem.table.ties:  # the enumeration and the descent time splits without the ties' all-reduce
        info["secondary"] = {"objective": "none (tied parameters: the tie-break does not price their all-reduce)"}
        return list(starts)
    if problem.table.transient and math.isfinite(problem.memory):  # its memory test: the ends that fit, an interval
        info["secondary"] = {"objective": "none (the transient memory terms under a finite memory)"}
        return list(starts)
    period = problem.period(starts)
    ev = evaluate(inst, problem.plan(starts))
    record = secondary.open_record(info, SECONDARY, ev.iteration_time, cap=period, evaluation=ev)
    if problem.stages in (1, problem.n):
        record.update(proven=True, unique=True)  # one split only
        return list(starts)

    def phase(clock: Deadline, rec: dict) -> list[int]:
        listed = least_run(problem, list(starts), period, rec, clock)
        if listed is None:  # too many to list: the same answer by branch and bound, within its node limit
            listed = search_least(problem, list(starts), period, rec, clock)
        if listed is not None:
            return listed
        if not has_tie(problem, period * (1 + CAP_REL), clock):
            rec.update(proven=True, unique=True)  # no other split has the optimal period
            return list(starts)
        chosen, value = descend(problem, list(starts), rec["value"], period, clock)
        if chosen != list(starts):
            secondary.settle(rec, value, evaluate(inst, problem.plan(chosen)))
            rec["descent"] = value
        size = milp_size(problem)
        if size > EVENTS_SIZE:
            rec.update(status="not run", note=f"the event-time MILP's size S (S - 1)(n - S) = {size} exceeds "
                       f"EVENTS_SIZE = {EVENTS_SIZE}: the descent's split, no proof")
            return chosen
        from .events import solve_events  # the MILP's modules only where it runs

        out = solve_events(problem, "1f1b", period_cap=period, deadline=clock, solver=solver,
                           threads=threads, seed=seed, hint=list(chosen), node_limit=SECONDARY_NODES)
        rec.update(bound=out.bound, status=str(out.status))
        if out.starts is not None and out.value < rec["value"] and problem.period(out.starts) <= period * (1 + CAP_REL):
            chosen = list(out.starts)
            secondary.settle(rec, out.value, evaluate(inst, problem.plan(chosen)))
        rec["proven"] = str(out.status) == "optimal"
        if out.status == "node_limit":
            rec["note"] = f"the event-time MILP stopped at its node limit ({SECONDARY_NODES} nodes per solve)"
        return chosen

    return secondary.run(phase, list(starts), deadline, record)
