"""Exact event-time MILP: the split of a fixed schedule's chunks of least iteration time.

The schedule fixes the order of every action on every rank and of every transfer on every
link (:func:`pipeopt.schedules.schedule_graph`), so one iteration is a fixed directed acyclic
graph of operations whose *durations* alone depend on the split; its iteration time is the
longest path (:func:`pipeopt.cost.schedule.makespan`, what :func:`pipeopt.schedules.execute`
measures). This is the partition problem's event-time model
(:mod:`pipeopt.problems.partition.events`) on the schedule's graph:

* the split into ``S = p v`` chunks is the cumulative binaries of
  :class:`pipeopt.problems.partition.model.CumulativeSplit` (``y[t, c] = 1[p_t <= c]``), so
  a prefix array taken at a chunk boundary is linear in them;
* one continuous duration per chunk and action kind, equal to a difference of the prefixes
  of :attr:`ScheduleProblem.prefixes` - F, B, I, W (W = ``bwd_w`` or B/2, I = B - W) - and,
  without overlap, the transfer the action sends when its neighbour chunk sits on another
  rank; with overlap, one duration per boundary between ranks for its transfers (both
  directions carry as many bytes);
* one start time per operation and the longest-path rows of
  :func:`pipeopt.problems.run_rows.add_run_rows` (``t_q >= t_a + d_a`` per dependency,
  ``Z >= t_q + d_q``): no big-M, the order being the schedule's;
* **memory**, one linear row per rank and per count vector of
  :meth:`pipeopt.schedules.Schedule.activation_profile` (the microbatches in flight on each of
  the rank's chunks at the points where its memory can peak):
  ``sum_s c_s act_s + parameter_copies * sum_s param_s <= capacity`` (bytes scaled by the
  capacity, right-hand side :func:`pipeopt.cost.rules.memory_limit` widened by
  :data:`MEMORY_WIDEN` so the row never cuts off a split that fits). A split the model admits
  but the executor finds over memory is cut off by a no-good row and the model solved again;
* **recomputation** (``recompute`` ``"full"`` / ``"auto"``, the schedule's W places): one
  continuous ``q_s`` per chunk in its B / I duration. One chunk per rank: ``q_s`` bounded below by
  the least rerun seconds of every interval the chunk covers (:func:`.model.recompute_rows`: the
  partition problem's per-stage Pareto frontiers at the chunk's in-flight count), whose ``inf``
  rows replace the memory rows. Several chunks per rank (v > 1: ZBV, DualPipeV, the interleaved
  schedules), whose recompute sets share the rank's memory: the partition MILP's binary per layer
  (:class:`pipeopt.problems.partition.milp.RecomputeChoice`, ``q_s`` its linear sum) and one memory
  row per rank, count vector and chunk holding a microbatch (:func:`.model.recompute_memory_rows`:
  each chunk's kept bytes times its count, the parameters, the largest backward excess).

minimise Z. For integral y the least Z is the exact iteration time of the split, so the MILP
optimum is the least iteration time over the splits that fit; its dual bound (less
:data:`~pipeopt.problems.partition.model.BOUND_SLACK`) is a valid bound when the solver stops
at the time limit, and the method then says ``time_limit``, never ``optimal``. The bound never
falls below the busiest rank's work m (F + B) / p nor, with two chunks per rank, the rank bound
of :mod:`.rank_bound` (valid for every order of the placement). Every split is re-scored by
:meth:`ScheduleProblem.execute`.

Size: ``(S - 1)(n - S + 1)`` binaries; about ``2 S m`` actions (``3 S m`` with I/W) plus
``2 m`` transfers per boundary between ranks, one start time each, and about two rows per op.
The LP relaxation is weak (fractional boundaries give fractional durations everywhere), so the
branch and bound grows fast with ``n - S`` and ``S m`` (measured in
``benchmarks/schedule_split.py``).
"""

from __future__ import annotations

import math
import time

import numpy as np

from ...backends.scaling import model_unit
from ...backends.deadline import Deadline
from ...backends.lazy import Verdict, resolve
from ...backends.pulp import SOLVERS
from ...errors import InvalidProblemError
from ...schedules import schedule_graph
from ..partition.model import (
    BOUND_SLACK,
    HEURISTIC_SHARE,
    MILP_ABS_GAP,
    MILP_REL_GAP,
    MILP_TOLERANCE,
    check_options,
    starts_from_cumulative,
)
from ..run_rows import add_run_rows, run_start_values
from .model import (
    MEMORY_WIDEN,
    chunk_durations,
    memory_scale,
    memory_terms,
    merged,
    per_layer_recompute,
    recompute_memory_rows,
    split_and_durations,
    split_values,
)
from ...result import Result
from .problem import SOLVER, ScheduleProblem, uniform_starts
from .rank_bound import rank_lower_bound
from .recompute import best_recompute, budget_recompute
from .w_placement import build_free_milp, free_start_values, place_for_split, read_order

__all__ = ["MEMORY_WIDEN", "build_milp", "chunk_durations", "local_search", "memory_scale", "memory_terms",
           "recompute_supported", "solve_milp", "split_and_durations", "split_values", "work_balanced_starts"]

WARM_COMBINATIONS = 2000
"""With several chunks per rank and ``recompute="auto"``: the most recompute combinations
:func:`.recompute.best_recompute` checks for each warm-start candidate (its exact sets for that
split, when they beat the budget heuristic's; past this the budget sets stand)."""

_TIME_SCALE = 1000.0
"""The solver's time unit is a reference iteration time / this."""


def build_milp(problem: ScheduleProblem, unit: float, *, exclude=(), deadline: Deadline | None = None):
    """Build the event-time MILP (module docstring).

    Parameters
    ----------
    problem
        :class:`ScheduleProblem`.
    unit
        Seconds per unit of the solver's time values.
    exclude
        Splits (lists of starts) cut off by no-good rows.
    deadline
        Building stops with :class:`~pipeopt.backends.deadline.DeadlineReached` when it passes.

    Returns
    -------
    (lp, v)
        The PuLP problem (``None`` if a memory row is false on constants: no split fits) and
        its variables: ``"Z"``, ``"y"``, ``"t"`` (per op of ``v["graph"]``), ``"d"`` (kind ->
        list of variables or ``None``), ``"graph"`` (:class:`pipeopt.cost.schedule.RunGraph`).
    """
    deadline = Deadline(None) if deadline is None else deadline
    sg = schedule_graph(problem.schedule, overlap=problem.instance.settings.overlap)
    lp, split, between, v = split_and_durations(problem, unit, "schedule_split")
    v["graph"] = sg.graph
    deadline.check("building the schedule MILP")
    v["t"] = add_run_rows(lp, sg.graph, v["d"], v["Z"], deadline)
    # memory: one row per rank and count vector (with recomputation: recompute_rows' rows instead,
    # or with several chunks per rank recompute_memory_rows over the per-layer choice)
    if math.isfinite(problem.capacity) and v["rc_choice"] is not None:
        if not recompute_memory_rows(problem, split, between, v["rc_choice"], v.get("zero")):
            return None, v
    elif math.isfinite(problem.capacity) and v["rc"] is None:
        sched = problem.schedule
        for r in range(sched.ranks):
            mine = sched.stages_on(r)
            for q, counts in enumerate(sched.activation_profile(r) or ((0,) * len(mine),)):
                terms, const = memory_terms(problem, split, between, r, counts, v.get("zero"))
                if not terms:
                    if const > 0:
                        return None, v
                    continue
                split.add(merged(terms), const, f"memory_{r}_{q}")
    for q, starts in enumerate(exclude):
        split.exclude(starts, f"nogood_{q}")
    return lp, v


def _start_values(problem: ScheduleProblem, v: dict, starts, unit: float, recompute=None) -> dict:
    """A full MIP start: binaries, durations and earliest start times of ``starts`` (each chunk
    recomputing ``recompute[s]`` with a binary per layer, :func:`split_values`)."""
    vals, dur = split_values(problem, v, starts, unit, recompute)
    graph = v["graph"]
    arr = np.array([dur[k][i] for k, i, _ in graph.ops])
    vals.update(run_start_values(graph, v["t"], v["Z"], arr, unit)[1])
    return vals


def recompute_supported(problem: ScheduleProblem) -> bool:
    """True if :func:`solve_milp` models ``problem.recompute``: the schedule's W places (a freely
    placed W changes the counts in flight). One chunk per rank: each chunk's memory is its rank's
    (:func:`.model.recompute_rows`); several: a binary per layer and the rank's memory rows
    (:func:`.model.recompute_memory_rows`)."""
    return problem.w_placement == "schedule"


def work_balanced_starts(problem: ScheduleProblem) -> list[int]:
    """Cut where the prefix of F + B crosses s/S of the total (a quick split, memory aside)."""
    P = problem.prefixes
    work = P["F"] + P["B"]
    S, n = problem.S, problem.n
    starts, last = [], 0
    for s in range(1, S):
        c = int(np.argmin(np.abs(work - work[-1] * s / S)))
        c = min(max(c, last + 1), n - (S - s))
        starts.append(c)
        last = c
    return starts


def local_search(problem: ScheduleProblem, starts, value: float, deadline: Deadline, steps=(1, 2),
                 score=None) -> tuple:
    """Move one cut at a time by ``steps`` units either way while the executor's time drops
    (best move first); stops at a local optimum or at ``deadline``. ``score(starts) -> seconds``
    (default :meth:`ScheduleProblem.value`). Returns ``(starts, value)``."""
    score = problem.value if score is None else score
    starts, n = list(starts), problem.n
    while not deadline.expired():
        best = None
        for t in range(len(starts)):
            lo = starts[t - 1] + 1 if t > 0 else 1
            hi = starts[t + 1] - 1 if t + 1 < len(starts) else n - 1
            for d in [x for s in steps for x in (-s, s)]:
                c = starts[t] + d
                if not lo <= c <= hi:
                    continue
                cand = starts[:t] + [c] + starts[t + 1:]
                v = score(cand)
                if v < value * (1 - 1e-12) and (best is None or v < best[1]):
                    best = (cand, v)
            if deadline.expired():
                break
        if best is None:
            break
        starts, value = best
    return starts, value


def solve_milp(problem: ScheduleProblem, *, time_limit: float | None = 60.0, solver: str = SOLVER,
               threads: int = 1, seed: int = 0, hint=None) -> Result:
    """The split of least iteration time under ``problem.schedule``, exactly (module docstring).

    Parameters
    ----------
    problem
        :class:`ScheduleProblem`.
    time_limit
        Seconds (``None``: none) for model building and the solver together.
    solver
        ``"cbc"`` or ``"highs"`` (default :data:`~.problem.SOLVER`, HiGHS).
    threads, seed
        Solver threads (>= 1) and seed (>= 0).
    hint
        Starts of a split to warm-start from (else the better of the uniform and the
        work-balanced splits that fits), improved by :func:`local_search` within
        :data:`~pipeopt.problems.partition.model.HEURISTIC_SHARE` of the time limit.

    With ``problem.w_placement == "free"`` the model is :func:`.w_placement.build_free_milp`
    (the split and every W's gap together); the loop, warm start and statuses are the same,
    and the result's ``evaluation.schedule`` (and ``info["order"]``) is the chosen action order.

    Returns
    -------
    Result
        Method ``"milp"`` (:meth:`ScheduleProblem.result`: the chunk plan and its execution);
        ``objective`` = the executor's time of the split (in its order); ``status``
        ``"optimal"`` only when the solver proved it (within
        :data:`~pipeopt.problems.partition.model.MILP_TOLERANCE`), ``"time_limit"`` when it
        stopped with the incumbent and the bound, ``"infeasible"`` when no split fits.

    Raises
    ------
    InvalidProblemError
        Unknown solver, bad threads / seed / hint, bad time limit; ``problem.recompute`` other
        than ``"none"`` where :func:`recompute_supported` is False (v > 1 or free W placement:
        :func:`.exhaustive.exhaustive` chooses it on small chains).

    With ``problem.recompute`` ``"full"`` or ``"auto"`` (the schedule's W places) each chunk's
    rerun seconds join its B / I durations. One chunk per rank: its least rerun seconds
    (:func:`.model.recompute_rows`, module docstring) and the returned plan carries each chunk's
    exact recompute set (:meth:`ScheduleProblem.chunk_recompute`). Several chunks per rank (v > 1):
    a binary per layer (:class:`~pipeopt.problems.partition.milp.RecomputeChoice`) and the rank's
    memory rows per count vector (:func:`.model.recompute_memory_rows`); the plan carries the
    solver's recompute sets, the warm start's are :func:`.recompute.budget_recompute`'s (a
    heuristic) or, where faster, the exact sets of a candidate split (the hint, uniform,
    work-balanced, local search's; :func:`.recompute.best_recompute` up to
    :data:`WARM_COMBINATIONS` combinations); if the executor finds the solver's sets over memory (the rows' widening), the
    heuristic's sets for that split are tried and the loop stops there without a proof.
    """
    if problem.is_free:
        raise InvalidProblemError("method 'milp' splits a fixed order; the free order (schedule='free') is"
                                  " solved by 'cpsat' (or 'auto')")
    if problem.recompute != "none" and not recompute_supported(problem):
        raise InvalidProblemError(f"method 'milp' models activation recomputation (recompute={problem.recompute!r})"
                                  " with the schedule's W places only; here w_placement="
                                  f"{problem.w_placement!r}: use 'exhaustive' (small chains; 'auto' runs it), or"
                                  " recompute='none'")
    if problem.instance.settings.data_parallel and problem.w_placement == "free":
        raise InvalidProblemError("method 'milp' models data parallelism and ZeRO with the schedule's W places only"
                                  " (a freely placed W moves its reduce-scatter); use 'exhaustive' (small chains)")
    started = time.perf_counter()
    deadline = Deadline.of(time_limit)
    if solver not in SOLVERS:
        raise InvalidProblemError(f"unknown MILP solver {solver!r}; choose from {list(SOLVERS)}")
    check_options("schedule milp", threads, seed)
    S, n = problem.S, problem.n
    info: dict = {"solver": solver, "ranks": problem.ranks, "stages_per_rank": problem.stages_per_rank,
                  "microbatches": problem.microbatches, "chunks": S, "w_placement": problem.w_placement}
    free = problem.w_placement == "free"
    if free:
        build, warm_values = build_free_milp, free_start_values
    else:
        build, warm_values = build_milp, (lambda pr, v, st, _order, u, rc=None: _start_values(pr, v, st, u, rc))
    layered = problem.recomputation is not None and per_layer_recompute(problem) and not free

    def sets(starts) -> list | None:
        """Per chunk the recompute sets the MILP's plans of ``starts`` carry: ``None`` (the
        problem's own, :meth:`ScheduleProblem.chunk_recompute`) unless ``layered``: the budget
        heuristic's (auto; ``None`` if it fits none) or every layer (full)."""
        if not layered:
            return None
        if problem.recompute == "full":
            return problem.chunk_recompute(starts)
        return budget_recompute(problem, starts)

    def score(starts) -> float:
        picks = sets(starts)
        if layered and picks is None:
            return math.inf
        return problem.value(starts, None, picks)

    if (S == 1 or S == n) and not free:
        only = list(range(1, S))
        ok = problem.value(only) < math.inf
        info["solver"] = "none (one split only, scored by the executor)"
        return problem.result("milp", only if ok else None, "optimal" if ok else "infeasible",
                              lower_bound=problem.value(only) if ok else math.inf, started=started, info=info)
    candidates = [problem.check_starts(hint)] if hint is not None else []
    candidates += [uniform_starts(n, S), work_balanced_starts(problem)]
    incumbent, inc_order, inc_value = None, None, math.inf
    for cand in candidates:
        value = score(cand)
        if value < inc_value:
            incumbent, inc_value = list(cand), value
    if incumbent is not None:  # a better warm start: cuts moved while the executor's time drops
        incumbent, inc_value = local_search(problem, incumbent, inc_value, deadline.sub(fraction=HEURISTIC_SHARE),
                                            score=score)
    exact_sets: dict = {}  # split -> its exact recompute sets (v > 1, auto), where they were checked
    if layered and problem.recompute == "auto":  # the candidates' exact sets beat the budget heuristic's
        for cand in [*candidates, incumbent]:
            if cand is None or tuple(cand) in exact_sets or deadline.expired():
                continue
            try:
                value, picks, _ = best_recompute(problem, list(cand), problem.schedule, limit=WARM_COMBINATIONS)
            except InvalidProblemError:  # too many combinations to check here: the budget sets stand
                continue
            exact_sets[tuple(cand)] = picks
            if value < inc_value:
                incumbent, inc_value = list(cand), value
    ref = inc_value if incumbent is not None else \
        problem.execute(candidates[0], recompute=[None] * S if layered else None).time
    unit = model_unit(ref, _TIME_SCALE)
    if free:  # the best W places for the warm start's split (or the first candidate if none fits): placement only
        split_ = incumbent if incumbent is not None else candidates[0]
        order, value = place_for_split(problem, split_, None, unit, deadline.sub(fraction=HEURISTIC_SHARE),
                                       solver=solver, threads=int(threads), seed=int(seed))
        info["placement_heuristic"] = value if math.isfinite(value) else None
        if value < inc_value:
            incumbent, inc_order, inc_value = list(split_), order, value
    info.update(warm_start=incumbent, warm_start_value=inc_value if incumbent is not None else None)
    floor = problem.memory_free_bound()
    info["bound_source"] = "memory-free bound m (F + B) / p"
    two = rank_lower_bound(problem, floor, inc_value if math.isfinite(inc_value) else 4 * floor, deadline=deadline)
    if two > floor:  # two chunks per rank (looped or V): both in one one-machine bound
        floor, info["bound_source"] = two, "rank bound (rank_bound.py)"

    def first(lp, v):
        info.update(binaries=sum(len(r) for r in v["y"].values()), ops=len(v["t"]), constraints=lp.numConstraints())
        if free:
            info["gap_binaries"] = sum(len(z) for rank in v["z"] for z in rank)

    def read(v, out):  # a plan is (starts, order, recompute): the order only with free W places, the sets if layered
        y = v["y"]
        starts = starts_from_cumulative({t: {c: out.value(y[t][c]) for c in y[t]} for t in y}, problem.space)
        picks = solver_sets(problem, v["rc_choice"], starts, out.value) if layered else None
        if layered and problem.value(starts, None, picks) == math.inf:  # over memory by the rows' widening
            picks = sets(starts) or picks
        return starts, (read_order(problem, v, out) if free else None), picks

    def verdict(plan) -> Verdict:
        value = problem.value(*plan)
        # free: a no-good row would cut the split with every placement; layered: with every recompute set
        return Verdict(value, value < math.inf, "breaks memory by the executor", final=free or layered)

    # the resolve loop shared with the partition problem's event-time MILP (backends/lazy.py)
    inc_sets = (exact_sets.get(tuple(incumbent)) or sets(incumbent)) if incumbent is not None else None
    lazy = resolve(lambda exclude, clock: build(problem, unit, exclude=[p[0] for p in exclude], deadline=clock),
                   lambda v, plan: (warm_values(problem, v, plan[0], plan[1], unit, plan[2]) if layered
                                    else warm_values(problem, v, plan[0], plan[1], unit)), read, verdict,
                   deadline=deadline, unit=unit,
                   incumbent=None if incumbent is None else (incumbent, inc_order, inc_sets),
                   value=inc_value, bound=floor, solver=solver, rel_gap=MILP_REL_GAP,
                   abs_gap=MILP_ABS_GAP, tolerance=MILP_TOLERANCE, bound_slack=BOUND_SLACK, threads=int(threads),
                   seed=int(seed), info=info, on_first=first, empty_note="a memory row is false on constants")
    if lazy.notes:
        info["notes"] = lazy.notes
    if lazy.status == "infeasible":
        return problem.result("milp", None, "infeasible", lower_bound=math.inf, started=started, info=info)
    if lazy.plan is None:
        return problem.result("milp", None, "time_limit", lower_bound=lazy.bound, started=started, info=info)
    return problem.result("milp", lazy.plan[0], lazy.status, lower_bound=lazy.bound, started=started, info=info,
                          order=lazy.plan[1], recompute=lazy.plan[2])


def solver_sets(problem: ScheduleProblem, choice, starts, value) -> list:
    """Per chunk of the split ``starts``, ``dict[layer, mode]`` (or ``None``) of the layers the
    solver's per-layer binaries (``choice``, a :class:`~pipeopt.problems.partition.milp.RecomputeChoice`;
    ``value(var)`` their values) recompute; every layer with ``recompute="full"``."""
    if problem.recompute == "full":
        return problem.chunk_recompute(starts)
    chunk_of = {}
    for s, layers in enumerate(problem.chunks(starts)):
        chunk_of.update(dict.fromkeys(layers, s))
    out: list = [{} for _ in range(problem.S)]
    for (i, o), var in choice.r.items():
        if (value(var) or 0.0) > 0.5:
            layer = choice.layers[i][1]
            out[chunk_of[layer.name]][layer.name] = layer.modes[o]
    return [x or None for x in out]
