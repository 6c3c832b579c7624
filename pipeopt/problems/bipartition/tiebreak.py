"""The secondary objective of Bi-Partition: among plans of optimal period, the shortest iteration.

Many Bi-Partition plans share the optimal steady period T* (the bottleneck stage or window
decides it; the other forward and backward cuts are free within it). Both exact methods
(:func:`~pipeopt.problems.bipartition.milp.solve_milp` and
:func:`~pipeopt.problems.bipartition.milp.solve_bisection`) break these ties the same way once
the primary optimum is proven, with the partition problem's secondary objective (Bi-Partition
with equal cuts is the partition problem, :mod:`pipeopt.problems.partition.tiebreak`):

1. **the iteration time of M microbatches under 1F1B with a flush** (M =
   ``settings.microbatches``; what ``evaluate(...).iteration_time`` reports), minimised over the
   plans of period at most ``T* (1 + CAP_REL)`` that fit in memory;
2. then **peak memory**: not optimised (the MILP returns one of the plans of least iteration
   time), and said so in ``info["secondary"]``.

The event-time MILP (:func:`break_ties`) is the Bi-Partition MILP of
:func:`pipeopt.problems.bipartition.model.model_rows` with T capped at the proven period - its
stage, cut and window rows then admit exactly the plans of period at most the cap, its memory
rows the plans that fit - whose op durations (the stages' forward and backward loads, the
cuts' transfers with the migrations; without overlap the sends in the ops) are put under the
longest-path rows of the run of M microbatches (:func:`pipeopt.problems.run_rows.add_run_rows`
over :func:`pipeopt.cost.schedule.run_graph`: one worker per stage, sequential execution,
window ``S - s``, one link per cut), minimising the iteration time Z. The migrations' positive
parts are variables bounded below (they only lengthen ops), so the least Z is the least
iteration time of an admitted plan. The binaries live in the windows of the memory
relaxation at the cap (every plan of period at most the cap lies inside them); when every
window is a single position the optimal plan is unique and no MILP runs.

The budget, the record ``info["secondary"]`` and the guard against a stopped or crashed
solver are those of every problem (:mod:`pipeopt.problems.secondary`): at most
:data:`~pipeopt.problems.secondary.SECONDARY_NODES` nodes, and the MILP runs only when its
size is at most :data:`EVENTS_SIZE` (else the proven plan is kept, unproven) - limits that do
not depend on the clock.
"""

from __future__ import annotations

from collections.abc import Callable

from ...lazy import lazy_module
from ...backends.deadline import Deadline
from ...backends.pulp import solve_pulp
from ...cost import evaluate, rules
from ...cost.tolerance import FLOAT_NOISE, SOLVER_GAP
from ...cost.schedule import run_graph
from ...errors import InvalidPlanError
from .. import secondary
from ..partition.tiebreak import SECONDARY
from ..run_rows import add_run_rows, run_start_values
from ..secondary import CAP_REL, SECONDARY_NODES
from .model import MODEL_UNIT, SOLVER_SLACK, cuts_of_rows, model_rows, start_of_rows
from .problem import BipartitionProblem

pulp = lazy_module("pulp")

REL_GAP = SOLVER_GAP
"""Relative gap at which the event-time MILP stops and says optimal."""


EVENTS_SIZE = 1000
"""The largest event-time MILP the second phase solves, as S times the cut positions its
windows leave (:func:`milp_size`): a rule on the instance, not on the clock (HiGHS's root
cuts and sub-MIP heuristics, which a node limit does not bound, dominate larger models).
Measured, loaded 2-core machine (HiGHS): PipeDream's AlexNet, VGG16, ResNet-18, SqueezeNet at
S = 4 (sizes 140-292) in 0.1-0.35 s; VGG16 at S = 8 (size 2,496) took 24-29 s."""


def milp_size(problem: BipartitionProblem, windows: list | None) -> int:
    """S times the forward and backward cut positions the windows leave (every position of
    every cut without windows): the event-time MILP's size for :data:`EVENTS_SIZE`."""
    S, n = problem.stages, problem.n
    if windows is None:
        return S * 2 * (S - 1) * max(n - 1, 0)
    return S * sum((a_hi - a_lo + 1) + (b_hi - b_lo + 1) for a_lo, a_hi, b_lo, b_hi in windows)


def break_ties(problem: BipartitionProblem, cuts: tuple[list[int], list[int]], deadline: Deadline, info: dict, *,
               within: float, windows: Callable[[float, Deadline], list | None], solver: str = "cbc",
               threads: int = 1, seed: int = 0) -> tuple[list[int], list[int]]:
    """The plan of least 1F1B-flush iteration time among those of period at most the period of
    ``cuts`` (the proven optimum), module docstring.

    Parameters
    ----------
    problem
        The Bi-Partition problem.
    cuts
        ``(forward cuts, backward cuts)`` of the proven optimal plan.
    deadline
        The method's clock; the phase runs on what is left of it with at most
        :data:`~pipeopt.problems.secondary.SECONDARY_NODES` nodes (:func:`pipeopt.problems.secondary.budget`).
    info
        The result's info dict: ``info["secondary"]`` (:func:`pipeopt.problems.secondary.open_record`)
        records the objective, the returned plan's iteration time (``value``), the cap, the
        phase's bound and status and whether it was proven (``unique`` when the windows leave one
        plan).
    within
        Seconds: a plan is returned only if its period is at most this (the method's optimality
        claim) and it fits in memory.
    windows
        ``windows(T, clock)``: per cut ``(a_lo, a_hi, b_lo, b_hi)``, the positions of every plan of
        period at most T, memory ignored (the relaxation's
        :meth:`~pipeopt.problems.bipartition.milp._Relaxation.windows`).
    solver, threads, seed
        For the event-time MILP (:func:`pipeopt.backends.pulp.solve_pulp`).

    Returns
    -------
    (forward cuts, backward cuts)
        The plan to report (``cuts`` itself if no tied plan is better or time ran out first).
    """
    a0, b0 = (list(c) for c in cuts)
    inst = problem.instance
    ev = evaluate(inst, problem.plan(a0, b0))
    cap = problem.score(a0, b0).bottleneck
    record = secondary.open_record(info, SECONDARY, ev.iteration_time, cap=cap, evaluation=ev)
    if problem.stages in (1, problem.n):
        record.update(proven=True, unique=True)  # the only plan there is
        return a0, b0

    def phase(clock: Deadline, rec: dict) -> tuple[list[int], list[int]]:
        win = windows(cap * (1 + CAP_REL), clock)
        if win is not None and all(w[0] == w[1] and w[2] == w[3] for w in win):
            rec.update(proven=True, unique=True)  # no other plan has the optimal period
            return a0, b0
        S, scale = problem.stages, cap / MODEL_UNIT if cap > 0 else 1.0
        size = milp_size(problem, win)
        rec["size"] = size
        if size > EVENTS_SIZE:
            rec.update(status="not run", note=f"the event-time MILP's size S x (window positions) = {size} exceeds "
                       f"EVENTS_SIZE = {EVENTS_SIZE}: the proven plan, no proof")
            return a0, b0
        m = model_rows(problem, scale, upper=cap * (1 + CAP_REL), windows=win, deadline=clock)
        graph = run_graph("1f1b", [1] * S, rules.windows(S), [False] * S, [1] * (S - 1),
                          inst.settings.microbatches, problem.overlap)
        dur, starts = {}, {}
        for kind, exprs, secs in (("F", m.f_op, ev.forward_op), ("B", m.b_op, ev.backward_op),
                                  ("X", m.x, ev.pipeline["x"]), ("Y", m.y, ev.pipeline["y"])):
            dur[kind] = [pulp.LpVariable(f"dur_{kind}_{i}", lowBound=0.0) for i in range(len(exprs))]
            for i, (d, e) in enumerate(zip(dur[kind], exprs, strict=True)):
                m.prob.addConstraint(d - e >= 0, f"dur_{kind}_{i}_def")
                starts[d.name] = secs[i] / scale
        Z = pulp.LpVariable("iteration", lowBound=0.0)
        m.prob.setObjective(Z)
        t = add_run_rows(m.prob, graph, dur, Z, clock)
        ops = graph.durations(ev.forward_op, ev.backward_op, ev.pipeline["x"], ev.pipeline["y"])
        starts.update(run_start_values(graph, t, Z, ops, scale)[1])
        starts.update({**start_of_rows(m.p, a0), **start_of_rows(m.q, b0), m.T.name: cap / scale})
        out = solve_pulp(m.prob, solver=solver, deadline=clock, rel_gap=REL_GAP, abs_gap=REL_GAP * MODEL_UNIT,
                         threads=threads, seed=seed, warm_start=starts, node_limit=SECONDARY_NODES)
        rec["status"] = out.status
        if out.bound is not None:
            rec["bound"] = out.bound * scale * (1 - SOLVER_SLACK)
        chosen, admitted = (a0, b0), True
        if out.has_solution:
            a, b = cuts_of_rows(m.p, out.values), cuts_of_rows(m.q, out.values)
            try:
                sc = problem.score(*problem.check_cuts(a, b))
            except InvalidPlanError:  # pragma: no cover - a solver returning garbage
                sc = None
            admitted = sc is not None and sc.fits and sc.bottleneck <= within
            if admitted:
                ev2 = evaluate(inst, problem.plan(a, b))
                if ev2.iteration_time < rec["value"] * (1 - FLOAT_NOISE):  # not float noise
                    chosen = (a, b)
                    secondary.settle(rec, ev2.iteration_time, ev2)
            else:
                rec["note"] = f"the solver's plan {a}, {b} is not admitted by evaluate (tolerances): not returned"
        rec["proven"] = out.status == "optimal" and admitted
        if any("node limit" in x for x in out.notes):
            rec["note"] = f"the event-time MILP stopped at its node limit ({SECONDARY_NODES} nodes)"
        return chosen

    return secondary.run(phase, (a0, b0), deadline, record)
