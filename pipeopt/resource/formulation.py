"""One formulation of the joint and group problems, written once for PuLP and for CP-SAT.

Variables (S stages, n units, K resource kinds, D devices):

* ``x[i, s]`` binary: unit i runs in stage s (only the stages i can be in while leaving one
  unit per stage). The stage index ``sigma(i) = sum_s s x[i, s]`` rises by 0 or 1 from one
  unit to the next, from 0 to S - 1: stages are contiguous and none is empty.
* ``phi_f[s, k], phi_b[s, k]`` in [0, 1]: the fraction of stage s's forward (backward) work
  done by kind k, summing to 1. With loads ``L_{s,k} = phi_f F_{s,k} + phi_b B_{s,k}`` the
  stage's split time is <= T iff ``L_{s,k} <= T R_{s,k}`` for every kind (then
  ``beta_k = phi_f F_k / (T R_k)`` is a valid forward share, and conversely any split with
  stage time <= T gives such fractions) - an exact reformulation of
  :func:`pipeopt.cost.stage_compute` for split execution.
* ``w = phi x`` (a share times a binary), linearised exactly by :func:`product`:
  ``w <= x_ub y``, ``w <= x``, ``w >= x - x_ub (1 - y)``, ``w >= 0``. Then
  ``F_{s,k} phi_f[s,k] = sum_i fwd[i,k] w_f[i,s,k]``.
* group only: ``g[d, s]`` binary, device d in worker s, every device in one worker, every
  worker non-empty; ``R_{s,k} = sum_d r[d,k] g[d,s]``. Identical devices are ordered
  (the worker index of a device is at most that of the next identical device); workers are
  not interchangeable (worker s runs stage s), so no other symmetry remains.
* transfers (overlap): ``T >= cut_time[i+1] (sigma(i+1) - sigma(i))``; memory:
  ``sum_i (k_s act_i + v_s param_i) x[i, s] <= capacity_s`` (k_s = S - s microbatches in flight).

With T fixed (the MILP, bisected by :func:`bisect`) every constraint is linear. With T a
variable (CP-SAT, minimised directly) ``T R_{s,k}`` is linear for fixed workers and uses
``v = T g`` (:func:`product` again) when grouping.

CP-SAT needs integers. :func:`cpsat_data` scales so that the integer model is a
*relaxation* of the real one (costs rounded down, resources and capacities rounded up,
fractions on a grid of 1/D whose sum may fall short of 1 by (K-1)/D); its optimum, or its
proven bound at the time limit, is thus a valid lower bound on the real optimum, and the
plan it returns is scored exactly by :func:`pipeopt.evaluate`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from .problems import GroupProblem, ResourceProblem

MIN_REL_GAP = 1e-4
"""Default relative gap (objective - bound) / objective at which an exact method stops and
reports OPTIMAL."""


# ---- two modelling back ends with one interface ---------------------------------------------

class PulpModel:
    """PuLP back end (CBC or HiGHS): continuous shares."""

    integral = False

    def __init__(self, name: str = "pipeopt") -> None:
        import pulp

        self.pulp = pulp
        self.prob = pulp.LpProblem(name, pulp.LpMinimize)
        self._count = 0

    def _name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def binary(self, prefix: str = "x"):
        """A 0/1 variable."""
        return self.pulp.LpVariable(self._name(prefix), cat=self.pulp.LpBinary)

    def var(self, lo: float, hi: float, prefix: str = "v"):
        """A continuous variable in [lo, hi]."""
        return self.pulp.LpVariable(self._name(prefix), lo, hi)

    def add(self, constraint) -> None:
        """Add a linear constraint."""
        self.prob += constraint

    def total(self, terms):
        """Sum of linear expressions."""
        return self.pulp.lpSum(terms)


class CpsatModel:
    """OR-Tools CP-SAT back end: integer variables only."""

    integral = True

    def __init__(self) -> None:
        from ortools.sat.python import cp_model

        self.cp = cp_model
        self.model = cp_model.CpModel()

    def binary(self, prefix: str = "x"):
        """A 0/1 variable."""
        return self.model.NewBoolVar(prefix)

    def var(self, lo: float, hi: float, prefix: str = "v"):
        """An integer variable in [lo, hi]."""
        return self.model.NewIntVar(int(lo), int(hi), prefix)

    def add(self, constraint) -> None:
        """Add a linear constraint."""
        self.model.Add(constraint)

    def total(self, terms):
        """Sum of linear expressions."""
        return self.cp.LinearExpr.Sum(list(terms))


def product(m, x, y, x_ub: float):
    """``w = x * y`` for ``x`` in [0, x_ub] and ``y`` binary (or a 0/1 expression), exactly:
    ``w <= x_ub y``, ``w <= x``, ``w >= x - x_ub (1 - y)``, ``w >= 0``."""
    w = m.var(0, x_ub, "w")
    m.add(w <= x)
    m.add(w <= x_ub * y)
    m.add(w >= x - x_ub + x_ub * y)
    return w


# ---- the numbers the model reads, in model units ------------------------------------------

@dataclass
class ModelData:
    """Numbers of one problem in model units.

    Attributes
    ----------
    fwd, bwd
        ``list[list[number | None]]`` (n x K): per-unit forward / backward time (``None``:
        the unit cannot run on that kind).
    res
        ``list[list[number]]``: fixed workers, S x K resources; group, D x K per device.
    mem_need_act, mem_need_par
        ``list[number]`` (n,): activation and parameter size per unit, or ``None`` when
        memory is unlimited.
    capacity
        fixed workers: per stage; group: per device (a finite stand-in for unlimited).
    cut
        ``list[number]`` (n+1,): transfer time of the boundary before unit c.
    unit, phi_min
        Fractions live in [0, unit] and each pass's fractions add up to >= phi_min.
    time_scale
        Seconds per model time unit (T_model * time_scale = seconds, up to rounding).
    """

    fwd: list
    bwd: list
    res: list
    mem_need_act: list | None
    mem_need_par: list | None
    capacity: list | None
    cut: list
    unit: float
    phi_min: float
    time_scale: float


def _raw(problem: ResourceProblem, groups: list | None):
    kinds = problem.kinds
    fwd = [[problem.fwd[k][i] for k in kinds] for i in range(problem.n)]
    bwd = [[problem.bwd[k][i] for k in kinds] for i in range(problem.n)]
    devs = problem.instance.cluster.devices
    if groups is None:
        res = [[d.resources.get(k, 0.0) for k in kinds] for d in devs]
        mems = [d.memory for d in devs]
    else:
        res = [[problem.pooled(g).get(k, 0.0) for k in kinds] for g in groups]
        mems = [problem.capacity(g) for g in groups]
    ch = problem.instance.chain
    if all(math.isinf(c) for c in mems):
        act = par = cap = None
    else:
        S = problem.num_stages
        demand = S * (float(ch.act.sum()) + float(ch.param.sum())) + 1.0
        act, par = list(ch.act), list(ch.param)
        cap = [min(c, demand) for c in mems]
    return fwd, bwd, res, act, par, cap, list(problem.cut_time)


def milp_data(problem: ResourceProblem, groups: list | None, time_scale: float) -> ModelData:
    """Model numbers for the MILP: times divided by ``time_scale`` seconds, bytes in GiB."""
    fwd, bwd, res, act, par, cap, cut = _raw(problem, groups)
    conv = lambda t: None if math.isinf(t) else t / time_scale  # noqa: E731
    gib = 2.0**30
    return ModelData(
        fwd=[[conv(t) for t in row] for row in fwd],
        bwd=[[conv(t) for t in row] for row in bwd],
        res=res,
        mem_need_act=None if act is None else [a / gib for a in act],
        mem_need_par=None if par is None else [p / gib for p in par],
        capacity=None if cap is None else [c / gib for c in cap],
        cut=[c / time_scale for c in cut],
        unit=1.0,
        phi_min=1.0,
        time_scale=time_scale,
    )


def cpsat_data(problem: ResourceProblem, groups: list | None, horizon: float,
               ticks: int = 10**6, grid: int = 10**4) -> ModelData:
    """Integer model numbers for CP-SAT forming a relaxation of the real model.

    Parameters
    ----------
    horizon
        Seconds that map to ``ticks`` time ticks (use an upper bound on the optimum).
    ticks
        Resolution of the per-unit times (floor(time / horizon * ticks)).
    grid
        D: fractions are multiples of 1/D; each pass's fractions must add up to at least
        1 - (K - 1)/D, since rounding K true fractions down loses less than K/D.

    Notes
    -----
    Constraint ``sum_i c_int[i,k] w[i,s,k] <= T_int R_int[s,k]`` with ``c_int = floor(c sigma)``,
    ``sigma = ticks / horizon``, ``R_int = ceil(R rho)`` and ``w`` in [0, D]: a real
    solution at T maps to ``T_int = ceil(sigma D T / rho)``, so ``T >= (T_int* - 1) rho / (sigma D)``
    for the integer optimum (or bound) ``T_int*``; ``time_scale = rho / (sigma D)``.
    """
    fwd, bwd, res, act, par, cap, cut = _raw(problem, groups)
    sigma = ticks / horizon
    flat = [r for row in res for r in row]
    rho = 1 if all(float(r).is_integer() for r in flat) else 1000
    K = len(problem.kinds)
    ts = rho / (sigma * grid)
    conv = lambda t: None if math.isinf(t) else int(math.floor(t * sigma))  # noqa: E731
    return ModelData(
        fwd=[[conv(t) for t in row] for row in fwd],
        bwd=[[conv(t) for t in row] for row in bwd],
        res=[[int(math.ceil(r * rho - 1e-9)) for r in row] for row in res],
        mem_need_act=None if act is None else [int(math.floor(a)) for a in act],
        mem_need_par=None if par is None else [int(math.floor(p)) for p in par],
        capacity=None if cap is None else [int(math.ceil(c)) for c in cap],
        cut=[int(math.floor(c / ts)) for c in cut],
        unit=grid,
        phi_min=grid - (K - 1),
        time_scale=ts,
    )


# ---- the formulation ------------------------------------------------------------------------

@dataclass
class Formulation:
    """Handles to the variables of a built model (for hints and for reading a solution)."""

    x: dict
    g: dict | None
    T: object


def build(m, problem: ResourceProblem, data: ModelData, T, T_ub: float | None = None,
          group: bool = False) -> Formulation:
    """Write the joint (fixed workers, ``group=False``) or group model into back end ``m``.

    Parameters
    ----------
    m
        :class:`PulpModel` or :class:`CpsatModel`.
    problem
        The problem (for S, n and identical-device classes).
    data
        Numbers in model units (:func:`milp_data` or :func:`cpsat_data`).
    T
        The bottleneck limit: a number (fixed) or a model variable in [0, T_ub].
    T_ub
        Upper bound of the T variable (needed to linearise ``T g`` when grouping).
    group
        Choose the device-to-worker assignment too.
    """
    n, S, K = problem.n, problem.num_stages, len(problem.kinds)
    fixed_T = isinstance(T, (int, float))
    U = data.unit
    x = {}
    for i in range(n):
        for s in range(max(0, S - n + i), min(i, S - 1) + 1):
            x[i, s] = m.binary("x")
    stages_of = {i: [s for s in range(S) if (i, s) in x] for i in range(n)}
    units_of = {s: [i for i in range(n) if (i, s) in x] for s in range(S)}
    for i in range(n):
        m.add(m.total(x[i, s] for s in stages_of[i]) == 1)
    sigma = {i: m.total(s * x[i, s] for s in stages_of[i] if s) for i in range(n)}
    for i in range(n - 1):
        step = sigma[i + 1] - sigma[i]
        if S > 1:
            m.add(step >= 0)
            m.add(step <= 1)
        c = data.cut[i + 1]
        if c <= 0 or S == 1:
            continue
        if fixed_T:
            if c > T:
                m.add(step <= 0)  # this boundary cannot be a cut
        else:
            m.add(T >= c * step)
    # device grouping
    g = None
    if group:
        Dn = len(data.res)
        g = {(d, s): m.binary("g") for d in range(Dn) for s in range(S)}
        for d in range(Dn):
            m.add(m.total(g[d, s] for s in range(S)) == 1)
        for s in range(S):
            m.add(m.total(g[d, s] for d in range(Dn)) >= 1)
        for cls in problem.device_classes:
            for d, e in zip(cls[:-1], cls[1:]):
                m.add(m.total(s * g[d, s] for s in range(1, S)) <= m.total(s * g[e, s] for s in range(1, S)))
        if not fixed_T:
            v = {(d, s): product(m, T, g[d, s], T_ub) for d in range(Dn) for s in range(S)}
    # shares and loads
    for s in range(S):
        phis = []
        for pass_costs in (data.fwd, data.bwd):
            phi = [m.var(0, U, "phi") for _ in range(K)]
            m.add(m.total(phi) >= data.phi_min)
            phis.append((pass_costs, phi))
        for k in range(K):
            terms = []
            for costs, phi in phis:
                for i in units_of[s]:
                    c = costs[i][k]
                    if c is None:
                        m.add(phi[k] <= U - U * x[i, s])  # kind k cannot run unit i
                    elif c > 0:
                        terms.append(c * product(m, phi[k], x[i, s], U))
            if not terms:
                continue
            load = m.total(terms)
            if group:
                if fixed_T:
                    cap = m.total(T * data.res[d][k] * g[d, s] for d in range(len(data.res)) if data.res[d][k])
                else:
                    cap = m.total(data.res[d][k] * v[d, s] for d in range(len(data.res)) if data.res[d][k])
                m.add(load <= cap)
            else:
                m.add(load <= data.res[s][k] * T)
    # memory
    if data.capacity is not None:
        ws = problem.instance.settings.weight_stashing
        for s in range(S):
            k_s = S - s
            v_s = k_s if ws else 1
            need = m.total((k_s * data.mem_need_act[i] + v_s * data.mem_need_par[i]) * x[i, s]
                           for i in units_of[s] if data.mem_need_act[i] or data.mem_need_par[i])
            if group:
                cap = m.total(data.capacity[d] * g[d, s] for d in range(len(data.res)))
            else:
                cap = data.capacity[s]
            m.add(need <= cap)
    return Formulation(x=x, g=g, T=T)


def read_solution(problem: ResourceProblem, f: Formulation, value, groups: list | None) -> tuple[list[int], list]:
    """``(starts, groups)`` from a solved model; ``value(var) -> number``."""
    stage = [max((s for (i2, s) in f.x if i2 == i), key=lambda s: value(f.x[i, s])) for i in range(problem.n)]
    starts = [i for i in range(1, problem.n) if stage[i] != stage[i - 1]]
    if f.g is not None:
        names = problem.device_names
        S = problem.num_stages
        groups = [tuple(names[d] for d in range(len(names)) if value(f.g[d, s]) > 0.5) for s in range(S)]
    return starts, groups


# ---- bisection on T (MILP) -------------------------------------------------------------------

@dataclass
class Bisection:
    """Outcome of :func:`bisect`: best plan found, proven bracket, what happened."""

    starts: list
    groups: list
    upper: float
    lower: float
    proven: bool
    steps: list


def bisect(problem: ResourceProblem, check, lower: float, start: tuple, *, deadline: float,
           rel_gap: float = MIN_REL_GAP) -> Bisection:
    """Bisection on the bottleneck T with a feasibility oracle.

    Parameters
    ----------
    problem
        The problem (to score solutions with :meth:`ResourceProblem.plan_value`).
    check
        ``check(T, seconds) -> ("feasible", starts, groups) | ("infeasible",) | ("unknown",)``:
        is there a plan with bottleneck <= T? ``"infeasible"`` must be proven.
    lower
        A valid lower bound on the optimum (seconds).
    start
        ``(starts, groups)`` of a known plan (the upper end of the bracket).
    deadline
        ``time.perf_counter()`` value at which to stop.
    rel_gap
        Stop when ``(upper - lower) <= rel_gap * upper``.

    Returns
    -------
    Bisection
        ``lower`` is the largest T proven infeasible (or the given bound): a valid lower bound
        (up to the solver's feasibility tolerance); ``upper`` is the exact bottleneck of the
        best plan found.
    """
    starts, groups = start
    upper = problem.plan_value(starts, groups)
    steps = []
    while upper - lower > rel_gap * upper:
        left = deadline - time.perf_counter()
        if left <= 0.05:
            break
        T = 0.5 * (lower + upper)
        out = check(T, left)
        steps.append((T, out[0]))
        if out[0] == "feasible":
            v = problem.plan_value(out[1], out[2])
            if v < upper:
                starts, groups, upper = out[1], out[2], v
            if v > T * (1 + 1e-6):  # the solver's plan misses T beyond its tolerance: stop
                steps.append((T, "tolerance"))
                break
        elif out[0] == "infeasible":
            lower = T
        else:
            break
    return Bisection(starts, groups, upper, lower, upper - lower <= rel_gap * upper, steps)


def solve_pulp(m: PulpModel, solver: str, seconds: float) -> str:
    """Solve a PuLP model: ``"feasible"``, ``"infeasible"`` (proven) or ``"unknown"``."""
    pulp = m.pulp
    seconds = max(1.0, float(seconds))
    if solver == "cbc":
        s = pulp.PULP_CBC_CMD(msg=False, timeLimit=seconds, threads=1)
    elif solver == "highs":
        s = pulp.HiGHS(msg=False, timeLimit=seconds, threads=1)
    else:
        from ..errors import InvalidProblemError

        raise InvalidProblemError(f"unknown MILP solver {solver!r}; choose 'cbc' or 'highs'")
    m.prob.solve(s)
    if m.prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return "feasible"
    if m.prob.status == pulp.LpStatusInfeasible and m.prob.sol_status != pulp.LpSolutionIntegerFeasible:
        return "infeasible"
    return "unknown"


def unit_lower_bound(problem: ResourceProblem, res: dict) -> float:
    """``max_i`` compute time of unit i alone on resources ``res`` (seconds): a lower bound
    when every worker has at most ``res`` (stage time is monotone in its units and resources)."""
    return max(problem.compute_time(i, i + 1, res) for i in range(problem.n))


__all__ = [
    "Bisection", "CpsatModel", "Formulation", "ModelData", "PulpModel", "bisect", "build",
    "cpsat_data", "milp_data", "product", "read_solution", "solve_pulp", "unit_lower_bound",
]


# ---- the two exact drivers shared by joint and group ---------------------------------------

def run_milp(problem: ResourceProblem, *, method: str, fixed_groups: list | None, start: tuple,
             lower: float, time_limit: float, solver: str, rel_gap: float = MIN_REL_GAP):
    """MILP (PuLP) with T fixed, bisected on T (:func:`bisect`).

    Each step builds :func:`build` at one T and asks the solver for any feasible plan; a
    plan found moves the upper end to its exact bottleneck, a proven infeasibility moves the
    lower end. The result's bound is the largest T proven infeasible (valid up to the
    solver's feasibility tolerance); status ``OPTIMAL`` once the bracket is within
    ``rel_gap``, else ``TIME_LIMIT`` with the incumbent.
    """
    from ..result import Status

    started = time.perf_counter()
    tau0 = problem.plan_value(*start)
    if not math.isfinite(tau0) or tau0 <= 0:
        tau0 = 1.0
    data = milp_data(problem, fixed_groups, tau0)
    group = fixed_groups is None
    stats = {"models": 0}

    def check(T: float, left: float):
        m = PulpModel(f"{method}_T")
        f = build(m, problem, data, T / tau0, group=group)
        m.prob += m.total([0 * next(iter(f.x.values()))])
        stats["models"] += 1
        out = solve_pulp(m, solver, left)
        if out != "feasible":
            return (out,)
        starts, groups = read_solution(problem, f, lambda v: v.value() or 0.0, fixed_groups)
        return ("feasible", starts, groups)

    b = bisect(problem, check, lower, start, deadline=started + time_limit, rel_gap=rel_gap)
    plan = problem.plan(b.starts, b.groups, "split")
    status = Status.OPTIMAL if b.proven else Status.TIME_LIMIT
    info = {"solver": solver, "bisection_steps": len(b.steps), "models_solved": stats["models"],
            "rel_gap_target": rel_gap, "bound": "largest T the MILP proved infeasible"}
    return problem.result(method, plan, status, lower_bound=b.lower, started=started, space="split", info=info)


def run_cpsat(problem: ResourceProblem, *, method: str, fixed_groups: list | None, start: tuple,
              lower: float, time_limit: float, seed: int, workers: int = 2,
              rel_gap: float = 1e-3, ticks: int = 10**6, grid: int = 10**4):
    """CP-SAT on the integer relaxation (:func:`cpsat_data`), minimising T directly.

    The known plan ``start`` is given as a hint and bounds T from above. The bound is CP-SAT's
    best objective bound mapped back to seconds (a valid lower bound on the real optimum);
    the plan is scored exactly. Status ``OPTIMAL`` only if CP-SAT proved its optimum *and*
    the exact gap is within ``rel_gap`` (the relaxation's rounding is at most about
    ``(K - 1)/grid + n/ticks``); ``TIME_LIMIT`` if it stopped at the limit; otherwise
    ``FEASIBLE`` (rounding gap above ``rel_gap``).
    """
    from ortools.sat.python import cp_model

    from ..result import Status

    started = time.perf_counter()
    hi = problem.plan_value(*start)
    data = cpsat_data(problem, fixed_groups, horizon=hi, ticks=ticks, grid=grid)
    T_ub = int(math.ceil(hi / data.time_scale)) + 1
    m = CpsatModel()
    T = m.var(0, T_ub, "T")
    group = fixed_groups is None
    f = build(m, problem, data, T, T_ub, group=group)
    m.model.Minimize(T)
    starts0, groups0 = start
    bounds = [0, *starts0, problem.n]
    for s in range(problem.num_stages):
        for i in range(bounds[s], bounds[s + 1]):
            for (i2, s2), var in ((key, f.x[key]) for key in f.x if key[0] == i):
                m.model.AddHint(var, int(s2 == s))
    if group:
        index = {name: d for d, name in enumerate(problem.device_names)}
        for s, grp in enumerate(groups0):
            for name in problem.device_names:
                m.model.AddHint(f.g[index[name], s], int(name in grp))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, float(time_limit))
    solver.parameters.num_workers = int(workers)
    solver.parameters.random_seed = int(seed)
    code = solver.Solve(m.model)
    best = (starts0, groups0, hi)
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        starts, groups = read_solution(problem, f, solver.Value, fixed_groups)
        v = problem.plan_value(starts, groups)
        if v < best[2]:
            best = (starts, groups, v)
    bound = lower
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
        bound = max(bound, (solver.BestObjectiveBound() - 1) * data.time_scale)
    plan = problem.plan(best[0], best[1], "split")
    res = problem.result(method, plan, Status.TIME_LIMIT, lower_bound=bound, started=started, space="split",
                         info={"cpsat_status": solver.StatusName(code), "ticks": ticks, "grid": grid,
                               "rel_gap_target": rel_gap,
                               "bound": "CP-SAT bound of the integer relaxation, in seconds"})
    res.lower_bound = min(res.lower_bound, res.objective)
    gap = res.gap or 0.0
    if gap <= rel_gap:  # the bound proves the plan optimal within rel_gap
        res.status = Status.OPTIMAL
    elif code == cp_model.OPTIMAL:  # relaxation solved, but its rounding leaves a gap
        res.status = Status.FEASIBLE
    return res
