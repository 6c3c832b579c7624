"""The exact joint and group methods' common search: bounds, a start, the bisection on T.

The objective is the steady period with its window rows (evaluate's ``bottleneck``,
:meth:`~pipeopt.problems.resource.ResourceProblem.period`). Every exact method of the two
problems is a *probe* - a model at a fixed limit T (the MILP of :mod:`.formulation`, the
CP-SAT models of :mod:`.intervals`, the chain DP of
:class:`~pipeopt.problems.resource.problem.ChainProbe`) - bisected on T by the one bisection
:func:`pipeopt.backends.bisection.bisect`:

1. ``deadline = Deadline.of(time_limit)``: the bounds, the heuristic starts, every probe and
   every solver call draw from it.
2. Lower end: :func:`pipeopt.problems.resource.bounds.lower_bound`. Upper end: the best
   heuristic plan that fits memory, or - when none fits - :func:`~.bounds.top_limit`, a limit
   every plan that fits memory passes, probed first: the exact methods never need a feasible
   start, and :class:`~pipeopt.errors.InfeasibleError` is raised only when that probe *proves*
   that no plan fits.
3. Each model's plan is checked exactly (:func:`certify`,
   :meth:`~pipeopt.problems.resource.ResourceProblem.check`: the best shares at T, every
   window row). The models hold each stage's own rows and a *relaxation* of the window rows
   (rows over per-stage busy-time variables bounded below by cuts), so a plan may fail the
   exact check: a stage that cannot pass T on its worker is cut off with a no-good, a window
   row that fails gets its stages' exact busy times as cuts (valid for every plan: tangent
   planes of a convex function of the worker, :func:`~.split.busy_cut`) and a no-good, and
   the model is solved again. So a feasible answer is a plan whose exact period is <= T, and
   an infeasible answer is a proof (the model relaxes the true constraints).

Once the bracket closes, the tie-break (:func:`pipeopt.problems.resource.tiebreak.break_ties`)
returns, among the plans of period at most the proven one, one of least latency of a microbatch
(the secondary objective, the same for every exact method; ``info["secondary"]``).

Status ``OPTIMAL`` means *optimal within a relative gap of* :data:`MIN_REL_GAP` (the chain
DP: :data:`~pipeopt.problems.resource.problem.CHAIN_REL_TOL`): the bracket closed,
``objective <= (1 + gap) * lower_bound``, and the lower bound is the largest T proven
infeasible (never above the optimum). ``info["rel_gap_target"]`` states the tolerance. A
probe that cannot settle T (after :data:`MAX_REPAIRS` repairs, or out of time) leaves the
bracket open: status ``FEASIBLE`` (or ``TIME_LIMIT`` at the deadline) with a valid bound,
never a false claim.

References
----------
Duan, Y. and Wu, J., *Optimizing Resource Allocation in Pipeline Parallelism for Distributed
DNN Training*, ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ...backends.bisection import FEASIBLE, UNKNOWN, Probe, bisect
from ...backends.deadline import Deadline
from ...errors import InfeasibleError
from ...result import Result, Status
from .bounds import lower_bound, top_limit
from .problem import Check, ResourceProblem
from .tiebreak import SECONDARY, break_ties

MIN_REL_GAP = 1e-4
"""Relative gap at which the bisection stops and the method reports ``OPTIMAL``: the plan's
bottleneck is within ``(1 + 1e-4)`` of the proven lower bound, hence of the optimum."""

STEP_SHARE = 0.34
"""Share of the time left each bisection probe may use (at least 1 s)."""

MAX_REPAIRS = 60
"""Most repairs (no-goods and cuts added after an exact check) one probe makes before it gives
up (answers unknown)."""


def stages_over(problem: ResourceProblem, starts: list[int], groups: list, T: float) -> list[tuple]:
    """Stages of a plan that cannot pass T on their own (memory, or no share keeps both passes
    within T): ``[(s, a, b, group), ...]``."""
    return problem.check(starts, groups, T).over


def certify(problem: ResourceProblem, T: float, solve_once: Callable[[], Probe],
            forbid: Callable[[int, int, int, tuple], None],
            window: Callable[[tuple, list, list, Check], None] | None = None) -> Probe:
    """Solve a model at limit T until its plan passes T under the cost model.

    Parameters
    ----------
    problem
        The joint or group problem.
    T
        The limit, seconds.
    solve_once
        ``solve_once() -> Probe`` with plan ``(starts, groups)``: one solve of the model.
    forbid
        ``forbid(s, a, b, group)``: cut off stage s = units ``a..b-1`` on ``group`` (and any
        stage that contains those units on a subset of the devices) from the model.
    window
        ``window(row, starts, groups, check)``: the plan's window row ``row = (i, l)`` fails
        (:class:`~pipeopt.problems.resource.problem.Check`); cut off this plan's stages
        ``i..l`` (and add what the model should know of their busy times). ``None``: such a
        plan leaves T undecided.

    Returns
    -------
    Probe
        Feasible with the plan ``(starts, groups)`` and its exact period (<= T up to float
        rounding), or the model's infeasible / unknown answer; unknown after
        :data:`MAX_REPAIRS` repairs.
    """
    for _ in range(MAX_REPAIRS):
        out = solve_once()
        if out.outcome != FEASIBLE:
            return out
        starts, groups = out.plan
        chk = problem.check(starts, groups, T)
        if chk.ok:
            return Probe(FEASIBLE, (starts, groups), problem.plan_value(starts, groups))
        if chk.over:
            for stage in chk.over:
                forbid(*stage)
        elif chk.row is not None and window is not None:
            window(chk.row, starts, groups, chk)
        else:  # over T through a cut: the models exclude those exactly, so this is no plan at T
            return Probe(UNKNOWN)
    return Probe(UNKNOWN)


def exact_search(problem: ResourceProblem, method: str, probe: Callable[[float, Deadline], Probe],
                 deadline: Deadline, starts: Callable[[Deadline], list[tuple]], info: dict,
                 rel_tol: float = MIN_REL_GAP, probe_top: bool = False,
                 first_top_share: float | None = None, step_share: float = STEP_SHARE,
                 raise_lower: Callable[[float, float, Deadline], float] | None = None) -> Result:
    """Bound, start and bisect: the body of every exact joint and group method.

    Parameters
    ----------
    problem
        The joint or group problem.
    method
        Method name for the result.
    probe
        ``probe(T, deadline) -> Probe`` at a fixed limit (plans are ``(starts, groups)``).
    deadline
        The method's clock.
    starts
        ``starts(deadline) -> [(starts, groups), ...]``: heuristic plans; the best one that
        fits memory is the incumbent.
    info
        Details for ``Result.info`` (solver, ...).
    rel_tol
        The bisection's relative gap (default :data:`MIN_REL_GAP`).
    probe_top
        Probe just below the start's value first (:func:`~pipeopt.backends.bisection.bisect`'s
        ``probe_top``): for a probe whose starts are often optimal.
    first_top_share
        The first of those probes' share of the time left (``bisect``'s ``first_top_share``;
        ``None``: a fraction of a midpoint's).
    step_share
        Share of the time left each midpoint probe may use (default :data:`STEP_SHARE`; a probe
        that decides all or nothing wastes a share too small for it).
    raise_lower
        ``raise_lower(lower, top, deadline) -> (bound, plans)``: a method's own lower bound, given
        the common one and the incumbent's value (``top``); it must be valid (never above the
        optimum). The bisection starts from the larger of the two (``info["lower_bounds"]``
        records both). ``plans``: heuristic plans found with the bound's help (``[(starts,
        groups), ...]``, possibly none); a better one becomes the incumbent.

    Returns
    -------
    Result
        ``OPTIMAL`` (within ``rel_tol``; the plan is the tie-break's, of least latency among
        those of period at most the proven one) or ``TIME_LIMIT`` with the incumbent (or no
        plan if none was found) and the proven bound; ``FEASIBLE`` with the incumbent and the
        bound if the search stopped before the deadline without closing the bracket
        (``info["stop"]`` says why: a probe that could not decide even with all the time left).

    Raises
    ------
    InfeasibleError
        If the probe at :func:`~.bounds.top_limit` proved that no plan fits.
    """
    lower = lower_bound(problem, deadline)
    if math.isinf(lower):  # some unit runs on no kind any worker has (a kind with 0 units everywhere)
        raise InfeasibleError(
            f"{problem.instance.name}: some layer can run on no worker into {problem.num_stages} stages "
            f"(its resource kinds have 0 units on every device); no plan has a finite period"
        )

    def better(best, cands):  # the plan of least period among best and cands (None: none fits)
        for cand in cands:
            value = problem.plan_value(*cand)
            if math.isfinite(value) and (best is None or value < best[1]):
                best = (cand, value)
        return best

    best = better(None, starts(deadline))
    top = best[1] if best is not None else top_limit(problem)
    if raise_lower is not None and best is not None and lower < top:
        own, more = raise_lower(lower, top, deadline)
        info = {**info, "lower_bounds": {"common": lower, "method": own}}
        if (guided := better(best, more)) is not best:
            best, top = guided, guided[1]
            info["incumbent_from"] = "the heuristics after the method's bound (raise_lower)"
        lower = max(lower, min(own, top))
    found = bisect(probe, min(lower, top), top, start=None if best is None else best[0],
                   start_value=None if best is None else best[1], rel_tol=rel_tol, deadline=deadline,
                   step_share=step_share, probe_top=probe_top, first_top_share=first_top_share)
    info = {**info, "rel_gap_target": rel_tol, "start": "heuristic" if best is not None else "none fits",
            "bisection_steps": len(found.steps), "step_outcomes": [o for _, o in found.steps], "stop": found.stop}
    if found.plan is None:
        if found.closed:
            raise InfeasibleError(
                f"{problem.instance.name}: no plan into {problem.num_stages} stages fits in memory "
                f"({method} proved it at the limit {top:.6g} s, which every plan that fits passes)"
            )
        return problem.result(method, None, Status.TIME_LIMIT, lower_bound=found.lower, started=deadline.started,
                              space="split", info={**info, "incumbent": "none found within the time limit"})
    # stopped before the deadline without closing the bracket (a probe could not decide even with
    # all the time left): a plan and a bound, but not a time limit
    status = Status.OPTIMAL if found.closed else Status.TIME_LIMIT if found.stop == "deadline" else Status.FEASIBLE
    if status == Status.OPTIMAL:  # the secondary objective (tie-break) among plans of the proven period
        within = max(found.value, found.lower * (1 + rel_tol))
        plan = break_ties(problem, *found.plan, deadline, info, within=within)
    else:
        plan = problem.plan(*found.plan, "split")
        info["secondary"] = {"objective": SECONDARY, "proven": False,
                             "note": "no second phase: the primary optimum is not proven"}
    return problem.result(method, plan, status, lower_bound=found.lower, started=deadline.started, space="split",
                          info=info)
