"""The resolve loop, written once: solve, score the solver's plan by the evaluation, cut it off if
the evaluation refuses it, solve again.

An exact MILP of pipeopt states its rows on a cost table (prefix sums, memory reach per stage)
whose floats are summed in another order than :func:`pipeopt.evaluate` (or the schedule
executor) sums them. So a plan the solver returns can break memory by a few ulps in the
evaluation, or exceed a period cap by the solver's own tolerances. The methods do not quote
such a plan: they cut it off (a no-good row, or the offending stage removed from the table)
and solve the model again, until the solver's plan is admitted, the solver proves there is
none, or the clock ends. :func:`resolve` is that loop; the partition problem's event-time
MILP (:func:`pipeopt.problems.partition.events.solve_events`) and the schedule problem's MILP
(:func:`pipeopt.problems.schedule.milp.solve_milp`) both run it.

What the caller supplies, as functions of its own plan type (a list of stage starts, or
starts with an action order):

* ``build(exclude, deadline) -> (lp, v)``: the PuLP model with the plans of ``exclude`` cut
  off (``lp`` ``None`` if a row is false on constants: no plan is admitted);
* ``warm(v, plan) -> dict``: a MIP start for the incumbent;
* ``read(v, out) -> plan``: the solver's plan from its outcome;
* ``score(plan) -> Verdict``: its value by the evaluation, and whether it is admitted - and if
  not, how to cut it off (``Verdict.cut``: ``None`` appends the plan to ``exclude``; a
  callable changes the model's tables instead, e.g. removes a stage that breaks memory) or
  that it cannot be cut off (``Verdict.final``).

The outcome's status follows the rules every exact method of pipeopt keeps: ``"optimal"``
only when the solver proved its optimum and the valid bound (the solver's dual bound less a
relative slack, at most the incumbent) is within the tolerance of the incumbent's evaluated
value; ``"infeasible"`` only when the solver proved it and no admitted plan is known.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .deadline import Deadline, DeadlineReached
from .pulp import solve_pulp

__all__ = ["LazyOutcome", "Verdict", "resolve"]


@dataclass
class Verdict:
    """The evaluation's word on a solver plan.

    Attributes
    ----------
    value
        Seconds: the plan's objective by the evaluation (``inf`` if it is not admitted).
    admitted
        The evaluation accepts the plan (it fits, and meets any cap).
    why
        Words for the notes when it is not admitted (e.g. ``"breaks memory by the executor"``).
    cut
        ``None``: cut the plan off by adding it to ``exclude``; else a callable that changes the
        model instead (called once) and returns the words for the notes.
    final
        The plan cannot be cut off (a no-good row would cut off more than it): stop the loop.
    """

    value: float
    admitted: bool
    why: str = ""
    cut: Callable[[], str] | None = None
    final: bool = False


@dataclass
class LazyOutcome:
    """What :func:`resolve` found.

    Attributes
    ----------
    plan
        The best admitted plan (the warm start's, if the solver found none better), or ``None``.
    value
        Its value by the evaluation (seconds; ``inf`` without a plan).
    bound
        Seconds: a valid lower bound on the optimum (at most ``value``; ``inf`` if proven
        infeasible).
    status
        ``"optimal"``, ``"feasible"`` (a plan, no proof, though the solver ended of itself),
        ``"time_limit"`` (the solver stopped without a proof: the clock), ``"node_limit"`` (the
        solver stopped without a proof at ``node_limit``, the clock not out) or ``"infeasible"``.
    runs
        Solver runs.
    notes
        What happened on the way (cut-off plans, ignored solver claims).
    """

    plan: Any
    value: float
    bound: float
    status: str
    runs: int
    notes: list[str] = field(default_factory=list)


def resolve(
    build: Callable[[list, Deadline], tuple],
    warm: Callable[[Any, Any], dict | None],
    read: Callable[[Any, Any], Any],
    score: Callable[[Any], Verdict],
    *,
    deadline: Deadline,
    unit: float,
    incumbent: Any = None,
    value: float = math.inf,
    bound: float = 0.0,
    solver: str = "cbc",
    rel_gap: float,
    abs_gap: float,
    tolerance: float,
    bound_slack: float,
    threads: int = 1,
    seed: int = 0,
    node_limit: int | None = None,
    info: dict | None = None,
    on_first: Callable[[Any, Any], None] | None = None,
    empty_note: str = "a row is false on constants",
) -> LazyOutcome:
    """Solve, score, cut off, solve again (module docstring) and state what was proven.

    Parameters
    ----------
    build, warm, read, score
        The caller's model, MIP start, plan reader and evaluation (module docstring).
    deadline
        One clock for building and solving (:func:`pipeopt.backends.pulp.solve_pulp` ends the
        solver at it).
    unit
        Seconds per unit of the model's objective.
    incumbent, value
        An admitted plan known before the loop (the warm start) and its evaluated value.
    bound
        Seconds: a valid lower bound known before the loop (``info["bound_source"]`` names it).
    solver, rel_gap, abs_gap, threads, seed, node_limit
        For :func:`pipeopt.backends.pulp.solve_pulp` (``abs_gap`` in model units).
    tolerance
        Relative: the incumbent is optimal if the solver proved it and ``value - bound <=
        max(abs_gap * unit, tolerance * value)``.
    bound_slack
        Relative slack taken off the solver's dual bound before it is quoted (its feasibility
        tolerances).
    info
        The caller's info dict: the solver outcome's facts (:meth:`PulpOutcome.info`),
        ``solver_bound`` (seconds), ``solver_objective`` (seconds), ``bound_source`` and
        ``solver_runs`` are written into it.
    on_first
        ``on_first(lp, v)`` after the first build (model sizes for the info).
    empty_note
        The note when ``build`` says no plan is admitted on constants.

    Returns
    -------
    LazyOutcome
        ``status`` ``"node_limit"`` only when ``node_limit`` is given, the clock is not out and
        the last solve stopped without a proof.
    """
    info = {} if info is None else info
    exclude: list = []
    notes: list[str] = []
    proven, last, runs = False, "no_solution", 0

    def infeasible() -> LazyOutcome:
        info["solver_runs"] = runs
        return LazyOutcome(None, math.inf, math.inf, "infeasible", runs, notes)

    while True:
        runs += 1
        try:
            lp, v = build(exclude, deadline)
        except DeadlineReached as stop:
            notes.append(str(stop))
            last = "no_solution"
            break
        if lp is None:
            if incumbent is None:
                notes.append(empty_note)
                return infeasible()
            notes.append(f"{empty_note} although an admitted plan is known: ignored")
            last = "infeasible"
            break
        if runs == 1 and on_first is not None:
            on_first(lp, v)
        start = warm(v, incumbent) if incumbent is not None else None
        out = solve_pulp(lp, solver=solver, deadline=deadline, rel_gap=rel_gap, abs_gap=abs_gap,
                         threads=int(threads), seed=int(seed), warm_start=start, node_limit=node_limit)
        info.update(out.info())
        last = out.status
        if out.bound is not None:
            b = max(0.0, out.bound * unit * (1 - bound_slack))
            info["solver_bound"] = b
            if b > bound:
                bound, info["bound_source"] = b, f"{solver} (run {runs})"
        # the objectives are >= 0: "unbounded (or infeasible)" means infeasible
        unsure = any("unbounded or infeasible" in x for x in out.notes)
        if out.status in ("infeasible", "unbounded") or unsure:
            last = "infeasible"
            if incumbent is None:
                return infeasible()
            notes.append("the solver said infeasible although an admitted plan is known: no proof, ignored")
            break
        if not out.has_solution:
            break
        plan = read(v, out)
        info["solver_objective"] = out.objective * unit
        verdict = score(plan)
        if verdict.admitted:
            if verdict.value < value:
                incumbent, value = plan, verdict.value
            proven = out.proven
            break
        if deadline.expired() or verdict.final:
            notes.append(f"solver plan {_show(plan)} {verdict.why}; not returned")
            break
        if verdict.cut is None:
            exclude.append(plan)
            notes.append(f"solver plan {_show(plan)} {verdict.why}: cut off, solved again")
        else:
            notes.append(f"solver plan {_show(plan)} {verdict.why}: {verdict.cut()}, solved again")
    info["solver_runs"] = runs
    if incumbent is not None:
        bound = min(bound, value)
    tol = max(abs_gap * unit, tolerance * value) if incumbent is not None else 0.0
    if proven and value - bound <= tol:
        status = "optimal"
    elif incumbent is None or last in ("feasible", "no_solution") or deadline.expired():
        status = "time_limit"
        if node_limit is not None and incumbent is not None and not deadline.expired():
            status = "node_limit"
    else:
        status = "feasible"
        if proven:
            notes.append("the solver's optimum is not confirmed by the valid bound within the tolerance")
    return LazyOutcome(incumbent, value, bound, status, runs, notes)


def _show(plan) -> str:
    """A plan in the notes: its stage starts (the first item of a (starts, order) pair)."""
    return str(plan[0]) if isinstance(plan, tuple) else str(plan)
