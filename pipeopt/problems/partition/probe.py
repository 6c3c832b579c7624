"""The exact partition method for long chains: a K-way search on the period over exact probes.

``solve_probe`` minimises the same objective as the dense DP (:mod:`.dp`): the 1F1B
steady-state time per microbatch with every window row, every cut's one-way transfer and
each stage's memory (:func:`pipeopt.cost.rules.steady_period`, the value
:func:`pipeopt.evaluate` gives). It keeps a bracket ``lower <= T* <= upper`` on the optimum:

* ``lower`` starts at a valid bound (the window row over all stages, the heaviest unit) and
  only moves to a trial period that an exact probe proved infeasible;
* ``upper`` is always the period of a split in hand (a balanced split, or the split that the
  probe rebuilds), so it only moves to values some split attains;

and closes it by probing K trial periods at once (:mod:`.chains`: the exact recursion over the
frontier of (stage, end unit) states): the smallest feasible trial period's split becomes the
new upper end (its period, often well below the trial value), the largest infeasible one the
new lower end. K - 2 trial periods are spread over the bracket (it shrinks at least K - 1
times a round) and two sit just below its upper end, so that a split in hand that is already
optimal is proven so in one round (the probe's split is often optimal: its period lies well
below the trial period that found it). The search stops when
``upper - lower <= REL_TOL * upper``, so the returned split is optimal within ``REL_TOL``
(relative) and ``lower`` is its proven bound.

A probe costs in proportion to its band, which widens with T, while the start can lie far above
the optimum (under memory limits the start is the memory-greedy split). So a bracket wider than
:data:`REACH` (relative) is first searched from below: an O(S) check of the relaxations rules
out whole spans (an empty band, :meth:`StraightProbe.band_empty`) and :func:`_threshold` finds
where the band starts; probe rounds then span ``REACH * lower`` above the lower end, doubling
while they find nothing. The replicated search starts from the one-order optimum (one worker
per stage is a replicated split, often the optimal one: a single trial period just below it
proves that) or from one stage on all workers.

Memory: the trial periods' arrays over the chain (O(K n)) and the frontier's keys of the probe
that rebuilds a split (O(K sum_s |F_s|), :mod:`.chains`), never an n x n matrix.

Secondary objective (ties, :mod:`.tiebreak`): in the one-order space, when the dense tie check
is affordable (``n^2 S <= TIE_BREAK_WORK``), the same second phase as the DP, MILP and
CP-SAT; beyond, the split is returned as found and ``info["secondary"]`` says the tie-break
was skipped.

References
----------
Pinar & Aykanat, Fast optimal load balancing algorithms for 1D partitioning, JPDC 64 (2004)
(bisection on the bottleneck with probes on prefix sums, bounds on the separators); Nicol, JPDC
23 (1994).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from ...backends.deadline import Deadline, DeadlineReached
from ...cost.transient import refuse_transient
from ...errors import InfeasibleError, InvalidProblemError
from ...result import Result, Status
from .chains import ReplicatedProbe, StraightProbe
from .problem import PartitionProblem
from .tiebreak import SECONDARY, break_ties

REL_TOL = 1e-11
"""The search stops when ``upper - lower <= REL_TOL * upper``: the objective is within this
(relative) of the proven lower bound."""

WAYS = 8
"""Trial periods per probe (K): K - 2 spread evenly over the bracket (each round shrinks it at
least K - 1 times) and two just below the upper end (:data:`NEAR`): the split in hand is often
optimal already, and one round then proves it."""

REACH = 0.01
"""A bracket wider than this (relative to its lower end) is first searched from below: the
trial periods of a round span at most ``REACH * lower`` above the lower end, a span that grows
:data:`GROW` times after every round without a feasible period. A probe costs in proportion to its band,
which widens with T: the optimum is often near the lower bound (replication balances the
load), the start far above it."""

GROW = 2.0
"""Growth of the galloping span (:data:`REACH`) per probe round without a feasible period."""

GROW_EMPTY = 4.0
"""Growth of the galloping span while the relaxations alone rule the span out (an empty band:
O(S) work, no probe); at the first span whose band is not empty, :func:`_threshold` finds
where it starts and the span restarts at :data:`REACH` from there."""

BAND_STEPS = 8
"""Bisection steps of :func:`_threshold` (the span shrinks 2^8 times)."""

NEAR = 1e-3
"""The second-highest trial period sits this fraction of the bracket below its upper end; the
highest sits ``REL_TOL / 2`` (relative) below it."""

TIE_BREAK_WORK = 5e7
"""The second phase runs when ``n^2 S`` is at most this (its tie check is the dense O(S n^2)
probe of :func:`pipeopt.problems.partition.tiebreak.has_tie`)."""


def _infeasible(p: PartitionProblem) -> InfeasibleError:
    return InfeasibleError(
        f"no split of {p.instance.name} into {p.stages} stages fits in {p.memory / 2**30:.3f} GiB per worker"
        + (" (with replication)" if p.replication else "")
    )


def search(probe, lower: float, upper: float, best, *, period, deadline: Deadline, ways: int = WAYS,
           rel_tol: float = REL_TOL, check_first: bool = False) -> dict:
    """Close the bracket ``[lower, upper]`` on the optimal period with K-way probes.

    Parameters
    ----------
    probe
        ``probe.run(periods, keep=True, deadline=...) -> Outcome`` (:mod:`.chains`): exact.
    lower
        A valid lower bound on the optimum, seconds.
    upper, best
        The period of the split ``best`` (a tuple ``(starts, replicas)``), seconds.
    period
        ``period(starts, replicas) -> float``: the exact period of a split.
    deadline
        Checked between rounds and inside the probes; when it passes, the search returns the
        bracket it has (``"stopped"`` says where).
    check_first
        Start with a round of one trial period, ``upper (1 - rel_tol / 2)``: when ``best`` is
        likely optimal already (the replicated search starts from the one-order optimum), one
        cheap probe proves it.

    Returns
    -------
    dict
        ``lower``, ``upper``, ``best``, ``rounds``, ``states`` (frontier states computed),
        ``closed``, and ``stopped`` if the deadline passed.
    """
    fractions = np.arange(1, ways - 1) / (ways - 1)
    out = {"lower": lower, "upper": upper, "best": best, "rounds": 0, "states": 0, "closed": False}
    try:
        _rounds(probe, out, fractions, period=period, deadline=deadline, rel_tol=rel_tol, check_first=check_first)
    except DeadlineReached as stop:
        out["stopped"] = str(stop)
    up = out["upper"]
    out["closed"] = up - out["lower"] <= max(rel_tol * up, 4 * float(np.spacing(up)))
    return out


def _threshold(probe, lower: float, top: float, steps: int = BAND_STEPS) -> tuple[float, float]:
    """The relaxations' threshold between ``lower`` and ``top`` (where the band is not empty):
    ``(empty, first)``, the largest T found whose band is empty (``lower`` if even ``lower``'s is
    not) and the smallest found whose band is not. No split passes a period with an empty band
    (:meth:`StraightProbe.band`), so ``empty`` is a proven lower bound; each step is O(S)."""
    if not probe.band_empty(lower):
        return lower, lower
    lo, hi = lower, top
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        if probe.band_empty(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def _rounds(probe, out: dict, fractions, *, period, deadline: Deadline, rel_tol: float, check_first: bool) -> None:
    """The rounds of :func:`search`, updating ``out`` after each one."""
    lower, upper, best = out["lower"], out["upper"], out["best"]
    rounds = states = 0
    within = None
    reach = REACH  # how far above the lower end the next round looks, relative
    banded = False  # a band is known not to be empty below the next round's top
    spread = np.append(fractions, 1.0)
    while upper - lower > rel_tol * upper:
        deadline.check(f"search round {rounds + 1}")
        gap = upper - lower
        near = [upper - NEAR * gap, upper * (1 - rel_tol / 2)]  # is the split in hand optimal?
        first_round = not rounds and not check_first
        if check_first and not rounds:
            Ts = np.array(near[1:])
        elif lower > 0 and gap > reach * lower:  # gallop up from the lower end: narrow bands, cheap probes
            top = lower * (1 + reach)
            if not banded:
                if probe.band_empty(top):  # a proof for every T <= top, in O(S)
                    lower, reach = top, reach * GROW_EMPTY
                    out.update(lower=lower)
                    continue
                lower, start = _threshold(probe, lower, top)
                banded, reach = True, REACH
                top = min(top, start * (1 + reach))
                Ts = np.append(start + (top - start) * spread, start)
            else:
                Ts = lower + (top - lower) * spread
        else:
            Ts = np.concatenate([lower + gap * fractions, near])
        if first_round:  # is the lower bound attained (e.g. by the heaviest unit)?
            Ts = np.append(Ts, lower)
        Ts = np.unique(Ts)
        Ts = Ts[(Ts >= lower) & (Ts < upper)] if first_round else Ts[(Ts > lower) & (Ts < upper)]
        if not Ts.size:  # adjacent floats
            break
        found = probe.run(Ts, keep=True, deadline=deadline, within=within)
        rounds += 1
        states += found.states
        if found.first > 0:
            lower = float(Ts[found.first - 1])
        if found.first == Ts.size:
            reach *= GROW
        if found.first < Ts.size:
            value = period(found.starts, found.replicas)
            within = found.band  # later trial periods are below T[first]
            if value < upper:
                upper, best = value, (found.starts, found.replicas)
            else:  # the split meets every row at T, so its period is <= T (float aside)
                upper = min(upper, float(Ts[found.first]))
        out.update(lower=lower, upper=upper, best=best, rounds=rounds, states=states)


def _straight_start(straight: StraightProbe):
    """The compute-balanced straight split if it fits memory, else the memory-greedy one
    (:meth:`StraightProbe.memory_split`), or ``None`` if no straight split fits (proven by the
    greedy)."""
    bal = straight.balanced_split()
    return bal if straight.fits(bal) else straight.memory_split()


def _top(problem: PartitionProblem) -> float:
    """A period every split that fits memory meets: the busiest window row cannot exceed all
    the busy time and round trips there are (all-reduce on S replicas), nor a cut's one-way
    transfer the largest there is. Seconds."""
    added, bound = problem.cut_terms
    busy = float(problem.stage_work(0, problem.n, problem.stages)) + 2 * float(np.sum(added))
    return 2 * (busy + float(np.sum(problem.trip)) + float(np.max(bound))) + 1e-300


def _replicated(problem: PartitionProblem, straight: StraightProbe, plain: dict | None, deadline: Deadline) -> dict:
    """The replicated search, started from the one-order optimum ``plain`` (one worker per stage
    is a replicated split; often the optimal one) and one stage on all S workers, whichever is
    better and fits; if neither fits, from a probe at :func:`_top` (which proves infeasibility
    when it fails). ``plain`` may hold the straight search's outcome or be ``None``; if the
    deadline passes during the replicated search the best split so far is returned."""
    probe = ReplicatedProbe(problem)
    S = problem.stages
    cands = []
    if plain is not None:
        cands.append((plain["upper"], (list(plain["best"][0]), [1] * S)))
    if straight.mem.fits(0, problem.n, probe.tokens(S, np.array([S]))[0][0]):
        cands.append((problem.period([], [S]), ([], [S])))
    if not cands:
        found = probe.run([_top(problem)], keep=True, deadline=deadline)
        if found.starts is None:
            raise _infeasible(problem)
        cands.append((problem.period(found.starts, found.replicas), (found.starts, found.replicas)))
    upper, best = min(cands, key=lambda c: c[0])
    out = search(probe, min(probe.lower_bound(), upper), upper, best, period=problem.period, deadline=deadline,
                 check_first=plain is not None and best[1] == [1] * S)
    if plain is not None:
        out["straight_rounds"] = plain["rounds"]
    return out


def solve_probe(problem: PartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc",
                seed: int = 0, threads: int = 2) -> Result:
    """Solve the partition problem exactly at scale (module docstring), straight or replicated.

    Parameters
    ----------
    problem
        A partition problem with the ``"bottleneck"`` objective; ``problem.replication`` selects
        the space (the replicated search starts from the one-order optimum, one worker per stage).
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline`. If it passes, the
        result has status ``TIME_LIMIT`` with the split in hand and the proven lower end.
    solver, seed, threads
        For the tie-break's event-time MILP only (:func:`pipeopt.problems.partition.tiebreak.break_ties`).

    Returns
    -------
    Result
        Status ``OPTIMAL``, ``lower_bound`` the proven lower end (within :data:`REL_TOL` of the
        objective). ``info``: ``"rounds"`` (K-way probes), ``"ways"`` (K), ``"states"``
        (frontier states computed), ``"search_s"`` (seconds of the search, without scoring the
        plan), ``"straight_rounds"`` (replicated: the straight search's rounds),
        ``"secondary"``, ``"probe_value"`` (the split's period on the table's numbers).

    Raises
    ------
    InvalidProblemError
        If the objective is not ``"bottleneck"``.
    InfeasibleError
        If no split fits the workers' memory (proven).
    """
    problem.refuse_recompute("method 'probe'")
    deadline = Deadline.of(time_limit)
    refuse_transient(problem.instance, "method 'probe'")  # its memory search: the ends that fit, an interval
    problem.refuse_replicated_latency("probe")
    objective = problem.instance.settings.objective
    if objective != "bottleneck":
        raise InvalidProblemError(
            f"probe minimises the steady-state bottleneck; objective {objective!r} is solved by the "
            "event-time model of 'milp'"
        )
    problem.refuse_tie_sums("probe")  # its frontier reads the work as prefix sums
    t0 = time.perf_counter()
    status, info = Status.OPTIMAL, {"ways": WAYS}
    straight = StraightProbe(problem)
    out = None
    try:
        starts = _straight_start(straight)
        if starts is not None:  # the one-order optimum: the answer, or the replicated search's start
            upper = problem.period(starts)
            out = search(straight, min(straight.lower_bound(), upper), upper, (starts, None),
                         period=lambda st, reps: problem.period(st), deadline=deadline)
        elif not problem.replication:
            raise _infeasible(problem)
        if problem.replication:
            out = _replicated(problem, straight, out, deadline)
    except DeadlineReached as stop:  # before any split was in hand
        return problem.result("probe", None, Status.TIME_LIMIT, lower_bound=problem.simple_lower_bound(),
                              started=deadline.started, info={"stopped": str(stop)})
    if "stopped" in out:
        status, info["stopped"] = Status.TIME_LIMIT, out["stopped"]
    elif not out.get("closed", True):  # cannot happen with exact probes; never claim what is not proven
        status = Status.TIME_LIMIT
    lower, upper, best = out["lower"], out["upper"], out["best"]
    info.update(rounds=out["rounds"], states=out["states"], search_s=time.perf_counter() - t0)
    if "straight_rounds" in out:
        info["straight_rounds"] = out["straight_rounds"]
    starts, replicas = list(best[0]), best[1]
    n, S = problem.n, problem.stages
    if status == Status.OPTIMAL and (problem.replication or n * n * S <= TIE_BREAK_WORK):
        try:
            starts = break_ties(problem, starts, deadline, info, solver=solver, threads=threads, seed=seed)
        except DeadlineReached:
            info.setdefault("secondary", {})["proven"] = False
    else:
        info["secondary"] = {"objective": SECONDARY, "proven": False,
                             "skipped": (f"n^2 S = {n * n * S:.3g} > {TIE_BREAK_WORK:.0e}: the dense tie check"
                                         " is not run at this size" if status == Status.OPTIMAL else "time limit")}
    plan = problem.plan(starts, replicas)
    value = info["probe_value"] = problem.period(starts, replicas)
    res = problem.result("probe", plan, status, started=deadline.started, info=info)
    # a tied split, or evaluate's own arithmetic (times of 1e-300 s), may undercut the proven lower end
    # by float rounding only: the bound is capped at the evaluated objective (one evaluation, not two)
    return dataclasses.replace(res, lower_bound=min(lower, upper, value, res.objective))
