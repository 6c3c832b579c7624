"""Exact dynamic program for the partition problem (one-order and replicated-one-order spaces).

The objective is the steady-state time per microbatch of 1F1B, window rows included
(:func:`pipeopt.cost.rules.steady_period`; the value :func:`pipeopt.evaluate` and
:func:`pipeopt.simulate` give). It is not a max over stages, so the DP runs in two parts:

1. **The min-max DP** over the stages' own terms (a stage's busy time per microbatch over its
   replicas, its cuts' one-way transfers, its memory): with best[s][j] the smallest such
   bottleneck of units 0..j-1 in s stages, ``best[s][j] = min_i max(best[s-1][i], cost(i, j,
   stage s-1))``, O(S n^2). Its value L0 is a lower bound (the window rows only add
   constraints); if its plan's true period equals L0, that plan is optimal.
2. **Otherwise, bisection on the period T with an exact feasibility probe.** At a trial T
   the window rows ending at stage l hold iff ``G_l <= -U_l T`` with ``G_l = w_l +
   max(-D_l T, G_{l-1} + C_{l-1})`` (:func:`pipeopt.cost.rules.window_step`: w_l the stage's
   busy time per microbatch, C the cut's round trip, D and U the window tokens). A smaller G
   is better for every later row, so the probe keeps, per (stage, end unit) — replicated:
   per (workers used, end unit) — the least G over every split that satisfies every row so
   far: exact for "is there a split of period <= T". A feasible probe returns a split whose
   true period becomes the new upper end; an infeasible one raises the lower end. The
   bisection is pipeopt's one (:func:`pipeopt.backends.bisection.bisect`), which probes just
   below the upper end first (the first pass's plan is often optimal: one infeasible probe
   proves it) and then the midpoints; it stops when the two ends agree within
   :data:`REL_TOL`; the result reports the proven lower end as its bound.

Replicated (PipeDream, Narayanan et al. SOSP 2019, section 3.1): with best[w][j] over the
first w workers, a stage on m replicas keeps ceil(W/m) microbatches per replica, W the workers
from the stage to the end (:func:`pipeopt.cost.rules.in_flight`). O(S^2 n^2) per DP pass.

Costs are read from the problem (:meth:`PartitionProblem.stage_work`, :attr:`PartitionProblem.trip`,
:attr:`PartitionProblem.cut_terms`, :meth:`PartitionProblem.memory_reach`), which reads the
cost table; the returned plan is scored by :func:`pipeopt.evaluate`.

**Data parallelism and ZeRO** (``Settings.dp``, ``zero``, ``gradient_ratio``, ``optimizer_ratio``)
are stage terms, so the DP is exact with them: a stage's memory adds its training state as the
ZeRO stage shards it (:meth:`pipeopt.cost.CostTable.sharded_state`) and its busy time per
microbatch ZeRO-2/3's collectives (:meth:`pipeopt.cost.CostTable.zero_ops`), both through
:meth:`PartitionProblem.stage_memory` and :meth:`PartitionProblem.stage_work`. Both grow with
the stage's units (ZeRO-3 keeps ``P / d`` plus the largest layer gathered, weight stashing being
refused with it), so :meth:`PartitionProblem.memory_reach` stays exact; with ``recompute`` the
state is part of each stage's fixed bytes (:meth:`.recompute.RecomputeModel.fixed`). The
synchronisation after the flush (:func:`pipeopt.cost.rules.zero_sync_time`) is not in the
``bottleneck`` objective, the only one the DP solves. The tie-break (its event-time MILP does not
model them) is then not run.

References
----------
Narayanan et al., PipeDream, SOSP 2019; Narayanan et al., PipeDream-2BW / Flush, ICML 2021
(1F1B). Baccelli et al., Synchronization and Linearity, 1992 (cycle time of max-plus systems).
"""

from __future__ import annotations

import math

import numpy as np

from ...backends.bisection import FEASIBLE, INFEASIBLE, UNKNOWN, Probe, bisect
from ...backends.deadline import Deadline, DeadlineReached
from ...cost import evaluate, rules
from ...cost.tolerance import BISECTION_WIDTH
from ...errors import InfeasibleError, InvalidProblemError
from ...result import Result, Status
from .problem import PartitionProblem
from .tiebreak import SECONDARY, break_ties

REL_TOL = BISECTION_WIDTH
"""The bisection on T stops when (upper - lower) <= REL_TOL * lower: the result's bound is the
proven lower end, within this of its objective."""

DENSE_LIMIT = 2 * 2**30
"""Bytes of dense matrices the DP may allocate (:func:`dense_bytes`); a larger instance is
refused before any allocation, with an :class:`InvalidProblemError` that names ``probe``
(the exact method whose memory grows with the chain, not its square)."""

DENSE_TEMPORARIES = 5
"""(n+1) x (n+1) float matrices the DP holds at its peak beside the cached work matrices:
the temporaries of building one (prefix differences, the mask) and of one DP step (the
candidates, the feasibility mask)."""


def dense_bytes(p: PartitionProblem) -> int:
    """Bytes of the dense matrices :func:`solve_dp` allocates at its peak: one (n+1) x (n+1)
    float64 work matrix per replica count it uses (1 straight; 1 .. S replicated, all cached)
    plus :data:`DENSE_TEMPORARIES` matrices of temporaries. At n = 10^5 straight: 447 GiB;
    the limit :data:`DENSE_LIMIT` (2 GiB) is passed from n = 6,690 straight and, replicated,
    from n = 1,980 at S = 64."""
    side = p.n + 1
    kept = p.stages if p.replication else 1
    if p.recompute != "none":  # per in-flight count: the least recompute seconds, the overshoot, the cost
        kept += 3 * p.stages
    return (kept + DENSE_TEMPORARIES) * side * side * 8


def check_dense_size(p: PartitionProblem, limit: float = DENSE_LIMIT) -> None:
    """Refuse, before any allocation, an instance whose dense matrices exceed ``limit`` bytes.

    Raises
    ------
    InvalidProblemError
        Naming the size, the bytes the DP would allocate and the method that solves it
        (``probe``: O(n) arrays and the frontier of the search).
    """
    need = dense_bytes(p)
    if need > limit:
        raise InvalidProblemError(
            f"dp: {p.instance.name} has n = {p.n:,} units (S = {p.stages}"
            + (", replicated" if p.replication else "")
            + f"); the dense DP would allocate {need / 2**30:,.1f} GiB of (n+1) x (n+1) matrices, above its limit "
            f"of {limit / 2**30:g} GiB (pipeopt.problems.partition.dp.DENSE_LIMIT); use method 'probe' (exact, "
            "memory linear in n) or 'auto'"
        )


def _infeasible(p: PartitionProblem) -> InfeasibleError:
    cap = p.memory
    return InfeasibleError(
        f"no split of {p.instance.name} into {p.stages} stages fits in {cap / 2**30:.3f} GiB per worker"
        + (" (with replication)" if p.replication else "") + overshoot_note(p)
    )


def overshoot_note(p: PartitionProblem) -> str:
    """``"; the best split ... misses the limit by X GiB (B bytes) on its worst stage ..."``: the
    least, over every straight split (with recomputation: and every recompute choice of each
    stage), of its worst stage's memory beyond the worker's (:func:`least_overshoot`), for an
    :class:`InfeasibleError` that says by how much; ``""`` with replication, a split that fits or
    dense matrices beyond :data:`DENSE_LIMIT`."""
    if p.replication or dense_bytes(p) > DENSE_LIMIT:
        return ""
    over, starts = least_overshoot(p)
    if not (math.isfinite(over) and over > 0):
        return ""
    from .recompute import overshoot_hint

    how = overshoot_hint(p.recompute)
    return (f"; the best split (stages starting at units {[0, *starts]}) misses the limit by "
            f"{over / 2**30:.3f} GiB ({over:,.0f} bytes) on its worst stage{how}")


def least_overshoot(p: PartitionProblem) -> tuple[float, list[int]]:
    """The smallest worst-stage memory overshoot over every straight split, in bytes beyond
    the worker's memory (with recomputation: each stage's least over its
    recompute choices), and the split attaining it."""
    from .recompute import min_max_overshoot as min_max

    n, S = p.n, p.stages
    if p.recomputation is not None:
        mats = [p.recomputation.overshoot(p.in_flight(s)) for s in range(S)]
    else:
        j = np.arange(n + 1)[:, None]
        i = np.arange(n + 1)[None, :]
        mats = [np.where(j > i, p.stage_memory(np.minimum(i, j), j, p.in_flight(s)) - p.memory, np.inf)
                for s in range(S)]
    return min_max(mats, S)


class _Stages:
    """Per replica count m: ``work[j, i]`` (busy time per microbatch of one replica of a stage
    of units i..j-1, inf if j <= i) and the cut bound per boundary; end-major so the minimum
    over starts runs along contiguous memory."""

    def __init__(self, p: PartitionProblem):
        self.p = p
        self._work: dict = {}
        _, self.bound = p.cut_terms
        self.trip = np.asarray(p.trip, dtype=float)

    def fits(self, k: int) -> np.ndarray:
        """``fits[j, i]``: a stage of units i..j-1 keeping k microbatches fits memory
        (:meth:`PartitionProblem.stage_memory`, every stage tested: with the transient terms of
        :mod:`pipeopt.cost.transient` the ends that fit need not be an interval)."""
        if ("fits", k) not in self._work:
            n = self.p.n
            j = np.arange(n + 1)[:, None]
            i = np.arange(n + 1)[None, :]
            self._work["fits", k] = (j > i) & self.p.fits(self.p.stage_memory(np.minimum(i, j), j, k))
        return self._work["fits", k]

    def cost(self, m: int, k: int) -> np.ndarray:
        """:meth:`work` of m replicas, plus with recomputation the least seconds a stage keeping k
        microbatches per replica adds to a replica's busy time with its memory fitting (``inf`` where
        none fits: :meth:`pipeopt.problems.partition.recompute.RecomputeModel.extra`)."""
        if self.p.recomputation is None:
            return self.work(m)
        if ("cost", m, k) not in self._work:
            self._work["cost", m, k] = self.work(m) + self.p.recomputation.extra(k)
        return self._work["cost", m, k]

    def work(self, m: int) -> np.ndarray:
        if m not in self._work:
            n = self.p.n
            j = np.arange(n + 1)[:, None]
            i = np.arange(n + 1)[None, :]
            w = self.p.stage_work(i, j, m)
            self._work[m] = np.where(j > i, w, np.inf)
        return self._work[m]


def _transitions(p: PartitionProblem, stages: _Stages, S: int):
    """The DP's steps: ``(to, frm, m, window)`` per (target state, source state, replicas):
    straight: one per stage s (states: stage count); replicated: per (workers w, replicas m)."""
    if not p.replication:
        for s in range(S):
            yield s + 1, s, 1, S - s
    else:
        for w in range(1, S + 1):
            for m in range(1, w + 1):
                W = S - (w - m)  # workers from this stage to the end
                yield w, w - m, m, rules.in_flight(0, 0, workers_after=W, replicas=m)


def _dp(p: PartitionProblem, stages: _Stages, T: float | None, deadline: Deadline):
    """One DP pass. ``T is None``: the min-max DP (value per state = bottleneck of its own
    terms). Else the feasibility probe at T (value per state = least window slack G).

    Returns
    -------
    (value, arg_i, arg_m) or None
        ``value[state, j]`` and the argmins, ``None`` if the end state is unreachable.
    """
    n, S = p.n, p.stages
    states = S + 1
    value = np.full((states, n + 1), np.inf)
    value[0, 0] = -np.inf if T is not None else 0.0
    arg_i = np.zeros((states, n + 1), dtype=np.int64)
    arg_m = np.ones((states, n + 1), dtype=np.int64)
    ends = np.arange(n + 1)
    for to, frm, m, k in _transitions(p, stages, S):
        deadline.check(f"DP step to state {to}")
        prev = value[frm]
        ok = prev < np.inf
        if not ok.any():
            continue
        rows = np.flatnonzero(ok)
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        work = stages.cost(m, k)[:, lo:hi]
        link = stages.bound / m  # one direction of a cut over this stage's m links
        if T is None:
            cand = np.maximum(np.maximum(prev[None, lo:hi], work / m),
                              np.maximum(link[None, lo:hi], link[:, None]))
        else:
            D, U = k * m, (k - 1) * m
            carry = rules.window_carry(prev[lo:hi], stages.trip[lo:hi], D, T)  # G_{l-1} + C or -D T
            cand = work + carry[None, :]
            bad = (cand > -U * T) | (link[None, lo:hi] > T) | (link[:, None] > T)
            cand = np.where(bad, np.inf, cand)
        if p.recomputation is not None:  # memory is in the stage cost (inf where no choice fits)
            pass
        elif math.isfinite(p.memory) and p.table.transient:  # the ends that fit need not be an interval
            cand = np.where(stages.fits(k)[:, lo:hi], cand, np.inf)
        elif math.isfinite(p.memory):
            reach = p.memory_reach(k)[lo:hi]
            cand = np.where(ends[:, None] > reach[None, :], np.inf, cand)
        pick = np.argmin(cand, axis=1)
        val = cand[ends, pick]
        better = val < value[to]
        value[to] = np.where(better, val, value[to])
        arg_i[to] = np.where(better, pick + lo, arg_i[to])
        arg_m[to] = np.where(better, m, arg_m[to])
    if not value[S, n] < np.inf:
        return None
    return value, arg_i, arg_m


def _split(p: PartitionProblem, arg_i, arg_m) -> tuple[list[int], list[int]]:
    starts, reps, state, j = [], [], p.stages, p.n
    while j > 0:
        m, i = int(arg_m[state, j]), int(arg_i[state, j])
        reps.append(m)
        if i > 0:
            starts.append(i)
        state, j = state - (m if p.replication else 1), i
    return starts[::-1], reps[::-1]


def solve_dp(problem: PartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
             threads: int = 2) -> Result:
    """Solve the partition problem exactly by dynamic programming (module docstring).

    Parameters
    ----------
    problem
        The partition problem; ``problem.replication`` selects the search space. Its
        objective must be ``"bottleneck"`` (the DP's probe is the window recursion of the
        steady state; the finite-M objectives are solved by the MILP's event-time model).
    time_limit
        Seconds, or the :class:`~pipeopt.backends.deadline.Deadline` of the solve, checked
        between DP steps. If it passes before the first DP pass ends, the result has status
        ``TIME_LIMIT``, no plan and :meth:`PartitionProblem.simple_lower_bound` as its bound;
        if it passes during the bisection, status ``TIME_LIMIT`` with the best split found
        and the proven lower end of the bisection.
    solver, seed, threads
        For the second phase only: the event-time MILP that breaks ties among optimal
        splits (:func:`pipeopt.problems.partition.tiebreak.break_ties`).

    Returns
    -------
    Result
        Status ``OPTIMAL`` with ``lower_bound`` the proven lower end (within
        :data:`REL_TOL` of the objective). Among optimal splits, the one of least 1F1B-flush
        iteration time (one-order space; :mod:`pipeopt.problems.partition.tiebreak`).
        ``info``: ``"min_max"`` (the first pass's bound), ``"probes"`` (bisection probes),
        ``"secondary"`` (the tie-break: its objective, value, bound, whether proven),
        ``"dp_value"`` (the period of the returned split on the table's numbers).

    Raises
    ------
    InvalidProblemError
        If the objective is not ``"bottleneck"``, or the dense matrices would exceed
        :data:`DENSE_LIMIT` (:func:`dense_bytes`; checked before any allocation, the message
        names ``probe``).
    InfeasibleError
        If no split fits the workers' memory (proven: every split was priced).
    """
    deadline = Deadline.of(time_limit)
    objective = problem.instance.settings.objective
    if objective != "bottleneck":
        raise InvalidProblemError(
            f"dp minimises the steady-state bottleneck; objective {objective!r} is solved by the "
            "event-time model of 'milp'"
            + (" (which does not model data parallelism or ZeRO: no exact method solves this objective with "
               "them yet)" if problem.data_parallel else "")
        )
    check_dense_size(problem)
    stages = _Stages(problem)
    rc = problem.recomputation
    try:
        if rc is not None:  # every stage's least recompute seconds, per in-flight count (the frontiers)
            rc.prepare(sorted({k for _, _, _, k in _transitions(problem, stages, problem.stages)}), deadline)
        first = _dp(problem, stages, None, deadline)
    except DeadlineReached as stop:
        return problem.result("dp", None, Status.TIME_LIMIT, lower_bound=problem.simple_lower_bound(),
                              started=deadline.started, info={"stopped": str(stop)})
    if first is None:
        raise _infeasible(problem)

    def period(split) -> float:
        if rc is None:
            return problem.period(*split)
        bounds = [0, *split[0], problem.n]
        reps = split[1] if problem.replication else None
        flight = problem.stage_flight(len(bounds) - 1, reps)
        extra = [rc.extra(k)[bounds[t + 1], bounds[t]] for t, k in enumerate(flight)]
        return problem.period(split[0], reps, extra)

    value, arg_i, arg_m = first
    start = _split(problem, arg_i, arg_m)
    stopped: list[str] = []

    def probe(T: float, _clock) -> Probe:
        try:
            found = _dp(problem, stages, T, deadline)
        except DeadlineReached as stop:
            stopped.append(str(stop))
            return Probe(UNKNOWN)
        if found is None:
            return Probe(INFEASIBLE)
        split = _split(problem, found[1], found[2])
        return Probe(FEASIBLE, split, min(period(split), T))  # it meets every row at T: period <= T, float aside

    # the min-max plan is often optimal: one probe just below it proves it (probe_top)
    search = bisect(probe, float(value[problem.stages, problem.n]), period(start), start=start, score=period,
                    rel_tol=REL_TOL, deadline=deadline, probe_top=True, top_after_plan=True)
    best, lower, upper, probes = search.plan, search.lower, search.upper, search.iterations
    status, info = Status.OPTIMAL, {}
    if not search.closed:
        status, info = Status.TIME_LIMIT, {"stopped": stopped[-1] if stopped else f"bisection: {search.stop}"}
    info.update({"min_max": float(value[problem.stages, problem.n]), "probes": probes})
    if problem.data_parallel:
        s = problem.instance.settings
        info["zero"] = {"zero": s.zero, "dp": s.dp, "gradient_ratio": s.gradient_ratio,
                        "optimizer_ratio": s.optimizer_ratio}
    if rc is not None:  # the tie-break's event-time MILP does not model recomputation: not run
        info["secondary"] = {"objective": SECONDARY, "proven": False, "skipped": "recompute"}
        info["recompute"] = {"mode": rc.mode, "modes": list(rc.modes), "exact": rc.exact,
                             "largest_frontier": rc.largest}
        if not rc.exact and status == Status.OPTIMAL:  # a thinned frontier: the plan fits, no optimum is claimed
            status = Status.FEASIBLE
            lower = problem.simple_lower_bound()
            from .recompute import FRONTIER_LIMIT, PAIRWISE_LIMIT  # the recompute model's modules where it runs

            limit = PAIRWISE_LIMIT if rc.pairwise else FRONTIER_LIMIT
            info["note"] = (f"a stage's recompute frontier exceeded {limit:,} points and was thinned: "
                            "the plan fits but is not proven optimal; the bound is the simple one")
    elif problem.data_parallel:  # the tie-break's event-time MILP does not model ZeRO: not run
        info["secondary"] = {"objective": SECONDARY, "proven": False, "skipped": "zero"}
    elif status == Status.OPTIMAL:  # the secondary objective (tie-break), in the one-order space
        try:
            best = (break_ties(problem, best[0], deadline, info, solver=solver, threads=threads, seed=seed), best[1])
        except DeadlineReached:
            info.setdefault("secondary", {})["proven"] = False
    else:
        info["secondary"] = {"objective": SECONDARY, "proven": False}
    plan = problem.plan(best[0], best[1] if problem.replication else None)
    info["dp_value"] = period(best) if (problem.replication or rc is not None) else problem.period(best[0])
    final = evaluate(problem.instance, plan).objective
    # a tied split, or evaluate's own summation order, may undercut the proven lower end by float rounding only
    return problem.result("dp", plan, status, lower_bound=min(lower, upper, final), started=deadline.started, info=info)


def solve_zero_auto(instance, *, method: str = "dp", time_limit: float | None = 60.0, solver: str = "cbc",
                    seed: int = 0, threads: int = 2, **kw) -> Result:
    """The partition problem with the ZeRO stage chosen too: one exact solve per stage of
    :data:`~pipeopt.problems.zero.ZERO_STAGES` (the instance's ``dp`` and ratios kept), the least
    objective kept (ties: the lower stage, fewer collectives), by
    :func:`pipeopt.problems.zero.best_zero_stage`. Each solve is a proven optimum over its stage's
    plans, so the least of them is one over the union.

    Parameters
    ----------
    instance
        :class:`pipeopt.Instance`; its ``Settings.zero`` is replaced by each stage in turn.
    method
        ``"dp"`` or ``"auto"`` (the partition methods that model ZeRO; ``auto`` runs ``dp`` under
        these settings, :func:`pipeopt.problems.partition.auto.choose`): :func:`solve_dp` runs.
    time_limit
        Seconds for all four solves together (``None``: until proven), one clock.
    solver, seed, threads
        As :func:`solve_dp` takes them.
    **kw
        The partition problem's options (``stages``, ``replication``, ``recompute``:
        :class:`PartitionProblem`).

    Returns
    -------
    Result
        As :func:`~pipeopt.problems.zero.best_zero_stage` returns it (``info["zero_auto"]``: each
        stage's objective or status and the stage chosen).

    Raises
    ------
    InvalidProblemError
        If ``method`` is not ``dp`` or ``auto``, or a solve refuses the instance.
    InfeasibleError
        If every stage is proven infeasible (the messages of each).
    """
    from ..zero import best_zero_stage

    if method not in ("dp", "auto"):
        raise InvalidProblemError(f"the ZeRO stage is chosen by the partition methods dp and auto, not {method!r}")
    solver_kw = {"solver": solver, "seed": seed, "threads": threads}
    return best_zero_stage(
        lambda z, deadline: solve_dp(PartitionProblem(instance.with_settings(zero=z), **kw), time_limit=deadline,
                                     **solver_kw),
        time_limit)
