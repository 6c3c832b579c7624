"""MILP (PuLP; CBC or HiGHS) for the partition problem in the one-order space.

Formulation (arrays from :mod:`pipeopt.problems.partition.model`, read off the cost table).
Binary *cumulative* start variables ``y[t, c] = 1`` iff stage t (t = 1..S-1) has started by
unit c, i.e. ``p_t <= c``, over its window ``c = t .. n-S+t-1`` (``y[t, c] = 1`` beyond it). A
prefix array F taken at the start of stage t is then linear:

    F[p_t] = F[n-S+t] - sum_c (F[c+1] - F[c]) * y[t, c]

and the model is

    minimise T  s.t.
      y[t, c] <= y[t, c+1]                      (monotone)
      y[t+1, c] <= y[t, c-1]                    (stage t non-empty: p_t < p_{t+1})
      end[p_{t+1}] - begin[p_t] <= T            (stage time, every stage t)
      cut[p_t] <= T                             (overlapped communication, t >= 1)
      end[p_{l+1}] - begin[p_i] + sum_{c=i+1..l} mid[p_c] <= (l - i + 1) T
                                                (window rows, 0 <= i < l <= S-1)
      y[t, a] <= y[t+1, R_t(a)]                 (reach: memory, and the incumbent's value)
      T >= simple_lower_bound

The **window rows** (1F1B's bounded window, :mod:`pipeopt.problems.partition.model`) make
the max of the rows the exact period of the split, :func:`pipeopt.evaluate`'s bottleneck.
The O(S^2) rows are stated in O(S) rows with continuous variables: the prefix sums
``M_l = sum_{c<=l} mid[p_c]`` (``window_sum_l``, equalities), so that row (i, l) reads
``A_l <= B_i`` with ``A_l = end[p_{l+1}] + M_l - (l+1) T`` and ``B_i = begin[p_i] + M_i - i T``,
and a running minimum ``window_min_l <= window_min_{l-1}``, ``window_min_l <= B_l``,
``A_l <= window_min_l``: every row holds iff these do (the same LP relaxation as the rows
written out).

The **reach rows** say that a stage t that starts by unit a ends by ``R_t(a)``: the last end
at which it fits in memory (:func:`~pipeopt.problems.partition.model.memory_reach`, decided
by the cost model's own ``fits``) and, when a split that fits is known, the last end at which
its time stays within that split's value U (they only remove splits worse than a known one
and tighten the LP relaxation). They are 0/1 rows: memory is exact in this model, with no
byte count scaled or compared with a solver tolerance.

Cumulative variables leave no symmetry between stages, and branching on ``y[t, c]`` splits
the position of one cut into "before c" / "after c", which is what proves bottleneck
optimality quickly. Times are expressed in units of 1/100 of the simple lower bound (so T is
about 100-1000 in the solver, away from its absolute tolerances).

Solving goes through the one PuLP door, :func:`pipeopt.backends.pulp.solve_pulp`: **CBC runs
in a child process that is ended at the deadline** (plus a short grace) if it has not stopped
itself, so a limit holds even inside CBC's preprocessing; HiGHS runs in a child process too.
"""

from __future__ import annotations

import math

import numpy as np

from ...lazy import lazy_module
from ...backends.deadline import Deadline
from ...backends.pulp import SOLVERS, solve_pulp
from ...errors import InvalidProblemError
from ...result import Result, Status
from .events import solve_events
from .model import (
    BOUND_SLACK,
    MILP_ABS_GAP,
    MILP_REL_GAP,
    MILP_TOLERANCE,
    Attempt,
    CumulativeSplit,
    StraightModel,
    check_options,
    infeasible_memory,
    solve_exact,
    starts_from_cumulative,
)
from .tiebreak import break_ties
from .problem import PartitionProblem

pulp = lazy_module("pulp")

__all__ = ["BOUND_SLACK", "MILP_REL_GAP", "MILP_TOLERANCE", "build_milp", "solve_iteration", "solve_milp"]




def build_milp(
    model: StraightModel, time_unit: float, upper: float | None = None, deadline: Deadline | None = None
) -> tuple[pulp.LpProblem, pulp.LpVariable, dict]:
    """Build the PuLP model of the straight partition problem.

    Parameters
    ----------
    model
        Arrays of the problem (:class:`~pipeopt.problems.partition.model.StraightModel`); its
        ``reach`` gives the memory rows.
    time_unit
        Seconds per unit of the solver's time values.
    upper
        Seconds: the bottleneck of a split known to fit, or ``None``. If given, the time reach
        (:meth:`StraightModel.time_reach`) joins the memory reach in the reach rows.
    deadline
        The method's clock: building stops with
        :class:`~pipeopt.backends.deadline.DeadlineReached` when it passes.

    Returns
    -------
    (lp, T, y)
        The PuLP problem (``None`` if a reach row is false on constants: a stage cannot reach
        the window of the next one at all, so no split fits; without ``upper`` that is a
        proof), the bottleneck variable (in ``time_unit``) and ``y[t][c]``, the cumulative
        start variables (dict of dicts; stages 1..S-1). The window rows' continuous
        variables are named ``window_sum_{t}`` and ``window_min_{l}``.
    """
    deadline = Deadline(None) if deadline is None else deadline
    S = model.S
    lp = pulp.LpProblem("partition_straight", pulp.LpMinimize)
    T = lp.add_variable("bottleneck", lowBound=model.lower_bound / time_unit)
    lp += T, "bottleneck_time"
    split = CumulativeSplit(lp, model)
    y, add, at_start = split.y, split.add, split.at
    for t in range(1, S):
        deadline.check("building the MILP")
        split.structure_rows(t)
    u = 1.0 / time_unit
    for t in range(S):
        deadline.check("building the MILP")
        e_terms, e_const = at_start(model.end, t + 1, u)
        b_terms, b_const = at_start(model.begin, t, u)
        add(e_terms + [(v, -c) for v, c in b_terms] + [(T, -1.0)], e_const - b_const, f"stage_time_{t}")
    for t in range(1, S):
        if model.cut[model.window(t)].max(initial=0.0) > 0:
            terms, const = at_start(model.cut, t, u)
            add(terms + [(T, -1.0)], const, f"cut_time_{t}")
    if model.windowed:
        # window row (i, l): A_l <= B_i with A_l = end[p_{l+1}] + M_l - (l+1) T,
        # B_i = begin[p_i] + M_i - i T, M_l = sum_{c=1..l} mid[p_c]; a running minimum of the
        # B_i (window_min_l <= window_min_{l-1}, <= B_l) states every row in O(S) rows
        M: list = [None]
        for t in range(1, S):
            deadline.check("building the MILP")
            v = lp.add_variable(f"window_sum_{t}")
            terms, const = at_start(model.mid, t, u)
            prev = [] if M[-1] is None else [(M[-1], -1.0)]
            lp.addConstraint(pulp.LpConstraint(
                pulp.LpAffineExpression([(v, 1.0), *prev, *((x, -c) for x, c in terms)], -const),
                pulp.LpConstraintEQ), f"window_sum_{t}")
            M.append(v)
        low = None  # window_min_0 = B_0 = begin[0], a constant
        for l in range(1, S):
            deadline.check("building the MILP")
            v = lp.add_variable(f"window_min_{l}")
            if low is None:
                add([(v, 1.0)], -float(model.begin[0]) * u, f"window_min_{l}_first")
            else:
                add([(v, 1.0), (low, -1.0)], 0.0, f"window_min_{l}_running")
            b_terms, b_const = at_start(model.begin, l, u)
            add([(v, 1.0), *((x, -c) for x, c in b_terms), (M[l], -1.0), (T, float(l))], -b_const,
                f"window_min_{l}_stage")
            e_terms, e_const = at_start(model.end, l + 1, u)
            add([*e_terms, (M[l], 1.0), (T, -float(l + 1)), (v, -1.0)], e_const, f"window_{l}")
            low = v
    time_reach = model.time_reach(upper) if upper is not None else None
    for t in range(S):
        deadline.check("building the MILP")
        R = model.reach[t] if time_reach is None else np.minimum(model.reach[t], time_reach)
        if not split.reach_rows(t, R):
            return None, T, y
    return lp, T, y


def _start_values(model: StraightModel, starts: list[int], value: float, time_unit: float) -> dict:
    vals = {
        f"started_{t}_by_{c}": float(c >= starts[t - 1])
        for t in range(1, model.S)
        for c in model.window(t)[:-1]
    }
    vals["bottleneck"] = max(value, model.lower_bound) / time_unit
    return vals  # the continuous window variables are completed by the solver


def solve_milp(
    problem: PartitionProblem,
    *,
    time_limit: float | Deadline = 60.0,
    solver: str = "cbc",
    seed: int = 0,
    threads: int = 1,
    warm_start: bool = True,
) -> Result:
    """Solve the straight partition problem as a MILP (PuLP, CBC or HiGHS).

    Parameters
    ----------
    problem
        The partition problem (``replication=False``).
    time_limit
        Seconds, or the solve's :class:`~pipeopt.backends.deadline.Deadline`: one clock for
        the warm start heuristic (at most a quarter of it), model building and the solver,
        which gets what is left through :func:`pipeopt.backends.pulp.solve_pulp`. CBC runs in
        a child process that the door ends at the deadline (plus
        :func:`~pipeopt.backends.pulp.kill_grace`, 0.3 s + 2 % of the limit) if it has not
        stopped itself, so the method returns within about that.
    solver
        ``"cbc"`` (PuLP's bundled CBC) or ``"highs"`` (HiGHS through highspy).
    seed
        Solver random seed.
    threads
        Solver threads (default 1: CBC and HiGHS are then deterministic).
    warm_start
        Give the solver a heuristic split as MIP start and add the time reach rows of its value
        (see the module docstring); ``False`` solves the bare formulation.

    Returns
    -------
    Result
        Method ``"milp"``.

        * ``OPTIMAL``: the solver proved optimality (gap :data:`MILP_REL_GAP`) and the plan's
          objective by :func:`pipeopt.evaluate` is within :data:`MILP_TOLERANCE` (relative,
          ``info["rel_gap_target"]``) of the lower bound. S = 1 and S = n have one split only:
          it is scored directly.
        * ``TIME_LIMIT``: the solver stopped at its time limit (what was left of the
          deadline) or the deadline passed during the warm start or model building; the
          plan is the best one found that fits (the solver's incumbent or the warm start), or
          ``None`` if none fits.
        * ``FEASIBLE``: the solver's answer could not be taken as a proof (it said infeasible
          although a split that fits is known, or its optimum is not confirmed by the valid
          bound); the best plan that fits and the bound.

        ``info["solver_objective"]`` and ``info["solver_bound"]`` are the solver's objective
        and (slackened) bound in seconds; ``info["bound_source"]`` says where the bound
        comes from.

        With objective ``"iteration"`` or ``"gpipe"`` (M microbatches under 1F1B with a
        flush, or GPipe) the event-time model of :func:`solve_iteration` runs instead.

        ``lower_bound`` (seconds) is valid for the true one-order optimum: the largest of
        :meth:`PartitionProblem.simple_lower_bound` (total work / S, largest unit) and the
        solver's dual bound less :data:`BOUND_SLACK` (relative). Memory is exact (0/1 reach
        rows), so every plan that fits is in the model and a plan the solver returns fits
        (checked by :func:`pipeopt.evaluate`; one that does not is removed and the model
        solved again).

    Raises
    ------
    InvalidProblemError
        If ``problem.replication`` is set (replication is solved by the DP only), the solver
        is unknown, ``threads`` < 1 or ``seed`` < 0, or the time limit is not a positive
        number.
    InfeasibleError
        Only when proven: the only split (S = 1 or S = n) breaks memory, the reach rows
        contradict each other on constants, or the solver proves that no split fits.

    References
    ----------
    Pinar & Aykanat, JPDC 2004 (1D chains-on-chains partitioning); Narayanan et al.,
    PipeDream, SOSP 2019 (1F1B memory, weight stashing).
    """
    deadline = Deadline.of(time_limit)
    if problem.instance.settings.objective != "bottleneck":
        return solve_iteration(problem, deadline, solver=solver, threads=threads, seed=seed)
    check_options("milp", threads, seed)
    if solver not in SOLVERS:
        raise InvalidProblemError(f"unknown MILP solver {solver!r}; choose from {SOLVERS}")

    def run(model: StraightModel, hint: list[int], upper: float | None, dl: Deadline) -> Attempt:
        unit = model.time_unit
        lp, T, y = build_milp(model, unit, upper if warm_start else None, dl)
        info = {"solver": solver, "time_unit": unit, "rel_gap": MILP_REL_GAP,
                "binaries": sum(len(v) for v in y.values())}
        if lp is None:
            return Attempt("infeasible", info={**info, "solver": "reach rows (memory) on constants"})
        info["constraints"] = lp.numConstraints()
        start = _start_values(model, hint, upper or model.bottleneck(hint), unit) if hint else None
        out = solve_pulp(lp, solver=solver, deadline=dl, rel_gap=MILP_REL_GAP, abs_gap=MILP_ABS_GAP,
                         threads=int(threads), seed=int(seed), warm_start=start)
        info.update(out.info())
        starts = None
        # the door's bound (the solver's dual bound, or its objective less the gap when it
        # proved optimality), less the tolerances the solver works with
        bound = out.bound * unit * (1 - BOUND_SLACK) if out.bound is not None else None
        info["solver_bound"] = bound
        info["solver_objective"] = None
        if out.has_solution:
            values = {t: {c: out.value(y[t][c]) for c in y[t]} for t in y}
            starts = starts_from_cumulative(values, model)
            info["solver_objective"] = out.objective * unit
        status = out.status
        if status == "unbounded" or any("unbounded or infeasible" in note for note in out.notes):
            status = "infeasible"  # T >= simple_lower_bound: the model cannot be unbounded
        return Attempt(status, starts, bound, info)

    return solve_exact(problem, "milp", deadline, run, rel_tol=MILP_TOLERANCE, abs_tol=0.0,
                       warm_start=warm_start, info={"solver": solver},
                       phase2={"run": break_ties, "solver": solver, "threads": int(threads), "seed": int(seed)})


def solve_iteration(problem: PartitionProblem, deadline: Deadline, *, solver: str = "cbc", threads: int = 1,
                    seed: int = 0) -> Result:
    """The exact straight split for the finite-M objectives (``"iteration"``: 1F1B with a
    flush; ``"gpipe"``: fill-drain): the event-time MILP of
    :func:`pipeopt.problems.partition.events.solve_events`, one start time per operation of
    the run (no closed form exists for 1F1B's; GPipe's is a sum of two flow shops), turned
    into a :class:`Result` scored by :func:`pipeopt.evaluate`.

    Raises
    ------
    InvalidProblemError
        If the problem is replicated (the event-time model has one worker per stage).
    InfeasibleError
        If no split fits the memory (proven by the model).
    """
    schedule = "gpipe" if problem.instance.settings.objective == "gpipe" else "1f1b"
    out = solve_events(problem, schedule, deadline=deadline, solver=solver, threads=int(threads), seed=int(seed))
    if out.status == "infeasible":
        raise infeasible_memory(problem, "milp", "proven infeasible by the event-time model")
    status = {"optimal": Status.OPTIMAL, "feasible": Status.FEASIBLE}.get(out.status, Status.TIME_LIMIT)
    plan = problem.plan(out.starts) if out.starts is not None else None
    if plan is None and status != Status.TIME_LIMIT:
        status = Status.TIME_LIMIT
    bound = min(out.bound, out.value) if plan is not None else out.bound
    return problem.result("milp", plan, status, lower_bound=bound if math.isfinite(bound) else None,
                          started=deadline.started, info={**out.info, "model": f"event-time ({schedule})"})



