"""MILP (PuLP; CBC or HiGHS) for the partition problem in the straight space.

Formulation (pieces shared with CP-SAT in :mod:`pipeopt.problems.partition.model`). Binary
*cumulative* start variables ``y[t, c] = 1`` iff stage t (t = 1..S-1) has started by unit c,
i.e. ``p_t <= c``, over its window ``c = t .. n-S+t-1`` (``y[t, c] = 1`` beyond it). A prefix
array F taken at the start of stage t is then linear:

    F[p_t] = F[n-S+t] - sum_c (F[c+1] - F[c]) * y[t, c]

and the model is

    minimise T  s.t.
      y[t, c] <= y[t, c+1]                      (monotone)
      y[t+1, c] <= y[t, c-1]                    (stage t non-empty: p_t < p_{t+1})
      end[p_{t+1}] - begin[p_t] <= T            (stage time, every stage t)
      cut[p_t] <= T                             (overlapped communication, t >= 1)
      (M_t[p_{t+1}] - M_t[p_t]) / capacity <= 1 (1F1B memory, if it can bind)
      T >= simple_lower_bound

Cumulative variables leave no symmetry between stages, and branching on ``y[t, c]`` splits
the position of one cut into "before c" / "after c", which is what proves bottleneck
optimality quickly. Times are expressed in units of 1/100 of the simple lower bound (so T
is about 100-1000 in the solver, away from its absolute tolerances), memory rows divided by
the capacity. The gap tolerance is :data:`MILP_REL_GAP` relative, so "optimal" means
optimal to about 1e-9 relative (plus the solver's 1e-7..1e-6 feasibility tolerances on
these scaled rows). A heuristic split (:func:`~pipeopt.problems.partition.model.heuristic_split`)
is given as MIP start and, if it fits in memory, its value U adds the *reach* rows
``y[t, a] <= y[t+1, R_U(a)]`` (a stage that starts by unit a and takes at most U ends by
R_U(a)): they only cut off splits worse than a known one and tighten the LP relaxation.
"""

from __future__ import annotations

import itertools
import math
import os
import tempfile
import time

import pulp

from ...errors import InvalidProblemError
from .problem import PartitionProblem
from ...result import Result
from .model import (
    StraightModel,
    finish,
    heuristic_split,
    infeasible_memory,
    reach,
    starts_from_cumulative,
)

MILP_REL_GAP = 1e-9
"""Relative optimality gap at which the MILP solvers stop (about zero)."""

BOUND_SLACK = 1e-7
"""Relative amount taken off a MILP solver's dual bound before quoting it as a proven bound
(covers the solver's feasibility and integrality tolerances)."""

MILP_ABS_GAP = 1e-9
"""Absolute gap, in the MILP's time units (1/100 of the simple lower bound)."""

SOLVERS = ("cbc", "highs")

CBC_INTERRUPTED = (
    "The LP relaxation is infeasible or too expensive",
    "Pre-processing says infeasible",
    "Cut generators found to be infeasible",
)
"""CBC's log lines when its time limit interrupts preprocessing or the root LP; its status
is then meaningless (seen with the CBC 2.10.3 bundled with PuLP)."""


def build_milp(
    model: StraightModel, time_unit: float, upper: float | None = None
) -> tuple[pulp.LpProblem, pulp.LpVariable, dict]:
    """Build the PuLP model of the straight partition problem.

    Parameters
    ----------
    model
        Arrays of the problem (:class:`~pipeopt.problems.partition.model.StraightModel`).
    time_unit
        Seconds per unit of the solver's time values.
    upper
        Seconds: the bottleneck of a known memory-feasible split, or ``None``. If given, the
        *reach* rows ``y[t, a] <= y[t+1, R(a)]`` (:func:`~pipeopt.problems.partition.model.reach`:
        a stage starting by unit a must end by R(a) to take at most ``upper``) are added.
        They only remove splits worse than the known one, so the optimum and every bound
        stay valid, and they make the LP relaxation much tighter.

    Returns
    -------
    (lp, T, y)
        The PuLP problem, the bottleneck variable (in ``time_unit``) and ``y[t][c]``, the
        cumulative start variables (dict of dicts; stages 1..S-1).
    """
    n, S = model.n, model.S
    lp = pulp.LpProblem("partition_straight", pulp.LpMinimize)
    T = lp.add_variable("bottleneck", lowBound=model.lower_bound / time_unit)
    lp += T, "bottleneck_time"
    y: dict[int, dict[int, pulp.LpVariable]] = {}
    for t in range(1, S):
        win = model.window(t)
        y[t] = {c: lp.add_variable(f"started_{t}_by_{c}", cat=pulp.LpBinary) for c in win[:-1]}

    def started(t, c):
        """``1[p_t <= c]``: a variable inside stage t's window, else the constant 0 or 1."""
        if t == 0:
            return 1
        if t == S:
            return int(c >= n)
        win = model.window(t)
        return int(c >= win[-1]) if c not in y[t] else y[t][c]

    def at_start(F, t, scale=1.0):
        """Linear expression of ``F[p_t] * scale``."""
        if t == 0:
            return F[0] * scale
        if t == S:
            return F[n] * scale
        hi = model.window(t)[-1]
        return F[hi] * scale - pulp.lpSum((F[c + 1] - F[c]) * scale * y[t][c] for c in y[t])

    for t in range(1, S):
        cs = list(y[t])
        for a, b in itertools.pairwise(cs):
            lp += y[t][a] <= y[t][b], f"monotone_{t}_{a}"
        if t + 1 < S:
            for c in y[t + 1]:
                lp += y[t + 1][c] <= y[t][c - 1], f"nonempty_{t}_{c}"
    u = 1.0 / time_unit
    for t in range(S):
        lp += at_start(model.end, t + 1, u) - at_start(model.begin, t, u) <= T, f"stage_time_{t}"
    if model.overlap:
        for t in range(1, S):
            lp += at_start(model.cut_time, t, u) <= T, f"cut_time_{t}"
    if model.memory_binding:
        m = 1.0 / model.capacity
        for t in range(S):
            F = model.mem_prefix[t]
            lp += at_start(F, t + 1, m) - at_start(F, t, m) <= 1.0 + 1e-12, f"memory_{t}"
    if upper is not None:
        R = reach(model, upper)
        for t in range(S):
            for a in model.window(t):
                lhs, rhs = started(t, a), started(t + 1, int(R[a]))
                if isinstance(lhs, int) and lhs == 0 or isinstance(rhs, int) and rhs == 1:
                    continue
                if isinstance(lhs, int) and isinstance(rhs, int):  # 1 <= 0: upper is not feasible
                    raise RuntimeError(f"reach rows contradict the split of value {upper} s")  # noqa: TRY004
                lp += lhs <= rhs, f"reach_{t}_{a}"
    return lp, T, y


class _HiGHSWarm(pulp.HiGHS):
    """PuLP's HiGHS API interface, plus a MIP start passed to highspy before the solve."""

    def __init__(self, start: dict | None = None, **kw):
        super().__init__(**kw)
        self._start = start or {}

    def callSolver(self, lp):
        if self._start:
            import highspy

            sol = highspy.HighsSolution()
            values = [0.0] * lp.solverModel.getNumCol()
            for var in lp.variables():
                values[var.index] = self._start.get(var.name, 0.0)
            sol.col_value = values
            sol.value_valid = True
            lp.solverModel.setSolution(sol)
        lp.solverModel.run()


def _start_values(model: StraightModel, starts: list[int], time_unit: float) -> dict:
    vals = {
        f"started_{t}_by_{c}": float(c >= starts[t - 1])
        for t in range(1, model.S)
        for c in model.window(t)[:-1]
    }
    vals["bottleneck"] = max(model.bottleneck(starts), model.lower_bound) / time_unit
    return vals


def _cbc_bound(log: str) -> float | None:
    """CBC's final dual bound from its log ("Lower bound:", or "Objective value:" when it
    proved optimality), or ``None``."""
    found = {}
    for line in log.splitlines():
        for key in ("Lower bound:", "Objective value:"):
            if line.strip().startswith(key):
                try:
                    found[key] = float(line.split(":", 1)[1].split()[0])
                except (ValueError, IndexError):
                    pass
    if "Lower bound:" in found:
        return found["Lower bound:"]
    if "Result - Optimal solution found" in log and "Objective value:" in found:
        return found["Objective value:"]
    return None


def solve_milp(
    problem: PartitionProblem,
    *,
    time_limit: float = 60.0,
    solver: str = "cbc",
    seed: int = 0,
    warm_start: bool = True,
    **_ignored,
) -> Result:
    """Solve the straight partition problem as a MILP (PuLP, CBC or HiGHS).

    Parameters
    ----------
    problem
        The partition problem (``replication=False``).
    time_limit
        Seconds of wall time, model building included (the solver gets what is left).
        CBC checks its limit only between phases: on a large model its preprocessing can
        overrun it (NASNet-A Large, S = 16: about 20 s for a 5 s limit here); the result
        then says ``time_limit`` and carries no proof. HiGHS honours the limit closely.
    solver
        ``"cbc"`` (PuLP's bundled CBC) or ``"highs"`` (HiGHS through highspy, via PuLP's
        HiGHS API interface).
    seed
        Solver random seed.
    warm_start
        Give the solver a heuristic split as MIP start and add the reach rows of its value
        (see the module docstring); ``False`` solves the bare formulation.

    Returns
    -------
    Result
        Method ``"milp"``. Status ``OPTIMAL`` if the solver proved optimality (gap
        :data:`MILP_REL_GAP`), else ``TIME_LIMIT`` with the incumbent. ``lower_bound``
        (seconds) is the solver's dual bound reduced by :data:`BOUND_SLACK` (relative) -
        HiGHS reports it through its API, CBC's is read from its log - or, if none can be
        read, :meth:`PartitionProblem.simple_lower_bound` (total work / S, largest unit), a
        bound that holds without any solver. ``info`` holds the solver, its status, its own
        objective (seconds) and the bound's source.

    Raises
    ------
    InvalidProblemError
        If ``problem.replication`` is set (replication is solved by the DP only), or the
        solver is unknown.
    InfeasibleError
        If the solver proves that no split fits in memory.

    References
    ----------
    Pinar & Aykanat, JPDC 2004 (1D chains-on-chains partitioning); Narayanan et al.,
    PipeDream, SOSP 2019 (1F1B memory, weight stashing).
    """
    started = time.perf_counter()
    if solver not in SOLVERS:
        raise InvalidProblemError(f"unknown MILP solver {solver!r}; choose from {SOLVERS}")
    model = StraightModel.of(problem, "milp")
    unit = model.time_unit
    hint = heuristic_split(model)
    upper = model.bottleneck(hint) if (warm_start and model.fits(hint)) else None
    lp, T, y = build_milp(model, unit, upper)
    start = _start_values(model, hint, unit) if warm_start else {}
    info: dict = {
        "solver": solver,
        "warm_start": hint,
        "warm_start_value": model.bottleneck(hint),
        "time_unit": unit,
        "rel_gap": MILP_REL_GAP,
        "binaries": sum(len(v) for v in y.values()),
        "constraints": lp.numConstraints(),
    }
    tl = max(float(time_limit) - (time.perf_counter() - started), 0.01)  # model building counts
    if solver == "cbc":
        for var in lp.variables():
            if var.name in start:
                var.setInitialValue(start[var.name])
        fd, log_path = tempfile.mkstemp(prefix="pipeopt_cbc_", suffix=".log")
        os.close(fd)
        try:
            cmd = pulp.PULP_CBC_CMD(
                msg=False,
                timeLimit=tl,
                gapRel=MILP_REL_GAP,
                gapAbs=MILP_ABS_GAP,
                warmStart=bool(start),
                timeMode="elapsed",  # wall clock, not CPU time
                logPath=log_path,
                options=[f"randomSeed {int(seed) + 1}", f"randomCbcSeed {int(seed) + 1}"],
            )
            t0 = time.perf_counter()
            lp.solve(cmd)
            cbc_wall = time.perf_counter() - t0
            with open(log_path) as fh:
                log = fh.read()
        finally:
            os.unlink(log_path)
        raw = _cbc_bound(log)
        proven = lp.sol_status == pulp.LpSolutionOptimal
        infeasible = lp.status == pulp.LpStatusInfeasible
        if any(sign in log for sign in CBC_INTERRUPTED) and cbc_wall >= 0.9 * tl:
            # CBC's time limit interrupted its preprocessing or root LP; it then reports
            # "optimal" (the MIP start) or "infeasible": neither is a proof
            proven = infeasible = False
            raw = None
            info["solver_note"] = "CBC stopped in preprocessing / the root LP at its time limit (no proof)"
        has_sol = lp.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
        info["solver_status"] = pulp.LpStatus[lp.status]
        info["bound_source"] = "CBC log" if raw is not None else "simple_lower_bound (CBC bound not readable)"
    else:
        cmd = _HiGHSWarm(
            start=start,
            msg=False,
            timeLimit=tl,
            gapRel=MILP_REL_GAP,
            gapAbs=MILP_ABS_GAP,
            random_seed=int(seed),
        )
        lp.solve(cmd)
        import highspy

        h = lp.solverModel
        st = h.getModelStatus()
        hinfo = h.getInfo()
        proven = st == highspy.HighsModelStatus.kOptimal
        infeasible = st == highspy.HighsModelStatus.kInfeasible
        has_sol = hinfo.primal_solution_status == 2  # kSolutionStatusFeasible
        raw = hinfo.mip_dual_bound if math.isfinite(hinfo.mip_dual_bound) else None
        info["solver_status"] = h.modelStatusToString(st)
        info["nodes"] = int(hinfo.mip_node_count)
        info["bound_source"] = "HiGHS mip_dual_bound" if raw is not None else "simple_lower_bound"
    if infeasible and model.fits(hint):  # a split that fits is known: not a proof
        infeasible = False
        info["solver_note"] = "solver claimed infeasibility although a split that fits is known (ignored)"
    if infeasible:
        raise infeasible_memory(problem, "milp")
    starts = None
    if has_sol:
        values = {t: {c: y[t][c].varValue for c in y[t]} for t in y}
        starts = starts_from_cumulative(values, model)
        info["solver_objective"] = T.varValue * unit
    if proven and starts is not None:
        # optimal within the gap: the solver's value less the gap bounds the optimum (HiGHS
        # may leave mip_dual_bound stale when presolve solves the model)
        proof = T.varValue * (1 - MILP_REL_GAP) - MILP_ABS_GAP
        if raw is None or proof > raw:
            raw = proof
            info["bound_source"] = "solver objective less the gap (proven optimal)"
    # CBC prints 8 decimals: take 1e-8 units and BOUND_SLACK (relative) off the dual bound
    bound = (raw - 1e-8) * unit * (1 - BOUND_SLACK) if raw is not None else None
    return finish(model, "milp", starts, proven and starts is not None, bound, started, info)
