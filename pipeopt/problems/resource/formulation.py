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
variable ``T R_{s,k}`` stays linear for fixed workers and uses ``v = T g`` (:func:`product`
again) when grouping (supported by :func:`build`; the shipped methods bisect, whose bound
needs no access to the solver's internal bound).

CP-SAT (:func:`run_cpsat`) instead works over stage intervals at fixed T, where the split
feasibility of an interval on a worker is linear in the worker's devices by LP duality
(:func:`interval_cover_coefficients`), and is bisected by the same driver.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

from .problem import ResourceProblem

COVER_SCALE = 10**6
"""Right-hand side of the integer split-feasibility rows in CP-SAT (coefficients rounded up,
so at most ~1e-6 relative slack, in the relaxing direction). With 1e9 CP-SAT 9.15's presolve
wrongly reported a feasible model infeasible; 1e6 passes the cross-checks."""

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
    conv = lambda t: None if math.isinf(t) else t / time_scale
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
        Numbers in model units (:func:`milp_data`).
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
            for d, e in itertools.pairwise(cls):
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
           rel_gap: float = MIN_REL_GAP, step_share: float = 0.34) -> Bisection:
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
    step_share
        Each check gets this share of the time left (at least 1 s). A check that runs out
        of time marks its T as hard: the search continues below it (proving bounds is
        easier there), and retries above it with all the remaining time once the bracket
        below is closed.

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
    hard = None  # smallest T whose check ran out of time: search below it first
    while upper - lower > rel_gap * upper:
        left = deadline - time.perf_counter()
        if left <= 0.05:
            break
        top = upper if hard is None or hard - lower <= rel_gap * upper else hard
        T = 0.5 * (lower + top)
        budget = left if top == upper and hard is not None else max(1.0, step_share * left)
        out = check(T, min(left, budget))
        steps.append((T, out[0]))
        if out[0] == "feasible":
            v = problem.plan_value(out[1], out[2])
            if v >= upper:  # the solver's plan misses T beyond its tolerance: no progress
                steps.append((T, "no progress"))
                break
            starts, groups, upper = out[1], out[2], v
            if hard is not None and hard >= upper:
                hard = None
        elif out[0] == "infeasible":
            lower = T
        elif hard is not None and top == upper:
            break  # even with all the time left the check could not decide
        else:
            hard = T if hard is None else min(hard, T)
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
        from ...errors import InvalidProblemError

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
    "finish_bisection", "interval_cover_coefficients", "milp_data", "product", "read_solution",
    "run_cpsat", "run_milp", "solve_pulp", "unit_lower_bound", "work_lower_bound",
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
    started = time.perf_counter()
    tau0 = problem.plan_value(*start)
    if not math.isfinite(tau0) or tau0 <= 0:
        tau0 = 1.0
    data = milp_data(problem, fixed_groups, tau0)
    group = fixed_groups is None

    def check(T: float, left: float):
        m = PulpModel(f"{method}_T")
        f = build(m, problem, data, T / tau0, group=group)
        m.prob += m.total([0 * next(iter(f.x.values()))])
        out = solve_pulp(m, solver, left)
        if out != "feasible":
            return (out,)
        starts, groups = read_solution(problem, f, lambda v: v.value() or 0.0, fixed_groups)
        return ("feasible", starts, groups)

    info = {"solver": solver, "bound": "largest T the MILP proved infeasible"}
    return finish_bisection(problem, method, check, start, lower, started, time_limit, rel_gap, info)


def finish_bisection(problem, method, check, start, lower, started, time_limit, rel_gap, info):
    """Run :func:`bisect` with ``check`` and wrap its outcome into a :class:`~pipeopt.result.Result`
    (``OPTIMAL`` when the bracket closed within ``rel_gap``, else ``TIME_LIMIT``)."""
    from ...result import Status

    b = bisect(problem, check, lower, start, deadline=started + time_limit, rel_gap=rel_gap)
    plan = problem.plan(b.starts, b.groups, "split")
    status = Status.OPTIMAL if b.proven else Status.TIME_LIMIT
    info = {**info, "bisection_steps": len(b.steps), "rel_gap_target": rel_gap,
            "step_outcomes": [o for _, o in b.steps]}
    res = problem.result(method, plan, status, lower_bound=b.lower, started=started, space="split", info=info)
    res.lower_bound = min(res.lower_bound, res.objective)
    return res




# ---- CP-SAT: the same bisection, over stage intervals -----------------------------------------

def interval_cover_coefficients(F: dict, B: dict, kinds: tuple) -> list[dict]:
    """Rows ``c(lambda)`` of the split-feasibility test of one stage load.

    By LP duality the best split's rate is ``min over lambda in [0, 1] of
    sum_k R_k max(lambda / F_k, (1 - lambda) / B_k)``, a convex piecewise-linear function
    whose kinks ``F_k / (F_k + B_k)`` do not depend on R. So a stage with loads F, B runs
    within T on resources R iff ``sum_k R_k c_k(lambda) >= 1 / T`` for every lambda in
    {0, 1, F_k / (F_k + B_k)}: constraints *linear in R*, hence in the device assignment.

    Returns
    -------
    list[dict[kind, float]]
        One row per lambda (``inf`` where a pass has no work on a kind).
    """
    usable = [k for k in kinds if math.isfinite(F[k])]
    lams = {0.0, 1.0}
    for k in usable:
        if F[k] + B[k] > 0:
            lams.add(F[k] / (F[k] + B[k]))

    def ratio(x, y):
        return 0.0 if x == 0 else (math.inf if y == 0 else x / y)

    return [{k: max(ratio(lam, F[k]), ratio(1 - lam, B[k])) for k in usable} for lam in sorted(lams)]


def run_cpsat(problem: ResourceProblem, *, method: str, fixed_groups: list | None, start: tuple,
              lower: float, time_limit: float, seed: int, workers: int = 2, rel_gap: float = MIN_REL_GAP):
    """CP-SAT at fixed T over stage intervals, bisected on T (:func:`bisect`).

    Booleans ``y[a, b, s]`` (stage s covers units a..b-1) form a path from unit 0 to n
    through S stages; an interval is offered only if its transfers fit T and it fits T on
    the strongest conceivable worker. With fixed workers (joint) the interval's stage time is
    checked exactly beforehand. When grouping, ``y`` enforces the split-feasibility rows of
    :func:`interval_cover_coefficients` and the memory of the interval on the worker's
    devices ``g[d, s]`` (identical devices ordered). Coefficients are rounded towards
    feasibility (a relaxation by at most 1e-9 relative), so a proven infeasibility is a
    valid bound; every plan found is scored exactly.
    """
    from ortools.sat.python import cp_model

    started = time.perf_counter()
    n, S, kinds = problem.n, problem.num_stages, problem.kinds
    cut = problem.cut_time
    devs = problem.instance.cluster.devices
    group = fixed_groups is None
    all_names = [d.name for d in devs]
    strongest = problem.pooled(all_names)
    mem_total = problem.capacity(all_names)
    if group and S > 1:  # the other S - 1 workers hold at least the S - 1 smallest amounts of each kind
        for k in list(strongest):
            strongest[k] -= sum(sorted(d.resources.get(k, 0.0) for d in devs)[: S - 1])
        mem_total -= sum(sorted(d.memory for d in devs)[: S - 1]) if math.isfinite(mem_total) else 0.0
    names = problem.device_names if group else None

    def check(T: float, left: float):
        model = cp_model.CpModel()
        y, out_of, into = {}, {}, {}
        g = None
        if group:
            g = {(d, s): model.NewBoolVar("g") for d in range(len(devs)) for s in range(S)}
            for d in range(len(devs)):
                model.AddExactlyOne(g[d, s] for s in range(S))
            for s in range(S):
                model.AddBoolOr([g[d, s] for d in range(len(devs))])
            for cls in problem.device_classes:
                for d, e in itertools.pairwise(cls):
                    model.Add(sum(s * g[d, s] for s in range(1, S)) <= sum(s * g[e, s] for s in range(1, S)))
            scale = COVER_SCALE * T
            ch = problem.instance.chain
            demand = S * (float(ch.act.sum()) + float(ch.param.sum())) + 1.0  # stands in for unlimited memory
            mem_cap = [min(dv.memory, demand) for dv in devs]
            mem_limited = any(math.isfinite(dv.memory) for dv in devs)
        for s in range(S):
            a_range = [0] if s == 0 else range(s, n - (S - 1 - s))
            for a in a_range:
                if cut[a] > T:
                    continue
                for b in range(a + 1, n - (S - 1 - s) + 1):
                    if s == S - 1 and b != n:
                        continue
                    if group:
                        if problem.compute_time(a, b, strongest) > T or problem.stage_memory(a, b, s) > mem_total:
                            if s < S - 1:
                                break
                            continue
                    elif problem.fit_time(a, b, fixed_groups[s], s) > T:
                        if s < S - 1:
                            break
                        continue
                    if cut[b] > T:
                        continue
                    v = model.NewBoolVar("y")
                    y[a, b, s] = v
                    out_of.setdefault((a, s), []).append(v)
                    into.setdefault((b, s), []).append(v)
                    if group:
                        F, B = problem.load(a, b)
                        for row in interval_cover_coefficients(F, B, kinds):
                            coef = []
                            for d, dv in enumerate(devs):
                                e = sum(dv.resources.get(k, 0.0) * c for k, c in row.items() if dv.resources.get(k, 0.0) > 0)
                                # an infinite rate (a pass with no work on a kind the device has) meets the row alone
                                coef.append(COVER_SCALE if e * scale >= COVER_SCALE else math.ceil(e * scale))
                            model.Add(sum(c * g[d, s] for d, c in enumerate(coef) if c) >= COVER_SCALE).OnlyEnforceIf(v)
                        need = problem.stage_memory(a, b, s)
                        if mem_limited and need > 0:
                            model.Add(sum(math.ceil(mem_cap[d]) * g[d, s] for d in range(len(devs)))
                                      >= math.floor(need)).OnlyEnforceIf(v)
        if not out_of.get((0, 0)):
            return ("infeasible",)
        model.AddExactlyOne(out_of[(0, 0)])
        for s in range(S - 1):
            for c in range(1, n):
                ins, outs = into.get((c, s), []), out_of.get((c, s + 1), [])
                if ins or outs:
                    model.Add(sum(ins) == sum(outs))
        model.AddExactlyOne(into.get((n, S - 1), []) or [model.NewConstant(0)])
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.1, float(left))
        solver.parameters.num_workers = int(workers)
        solver.parameters.random_seed = int(seed)
        code = solver.Solve(model)
        if code == cp_model.INFEASIBLE:
            return ("infeasible",)
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return ("unknown",)
        chosen = sorted((s, a) for (a, b, s), v in y.items() if solver.Value(v))
        starts = [a for s, a in chosen[1:]]
        groups = fixed_groups
        if group:
            groups = [tuple(names[d] for d in range(len(devs)) if solver.Value(g[d, s])) for s in range(S)]
        return ("feasible", starts, groups)

    info = {"solver": "cp-sat", "bound": "largest T CP-SAT proved infeasible"}
    return finish_bisection(problem, method, check, start, lower, started, time_limit, rel_gap, info)


def work_lower_bound(problem: ResourceProblem, res: dict) -> float:
    """A lower bound from the total work: resources ``res`` (the whole cluster) with every
    layer's forward and backward work divisible among kinds *layer by layer*.

    LP: minimise T s.t. ``sum_k psi_f[i,k] = sum_k psi_b[i,k] = 1`` for every unit i and
    ``sum_i psi_f[i,k] fwd[i,k] + psi_b[i,k] bwd[i,k] <= T R_k`` for every kind. Any plan
    gives a feasible point (psi = its stage's work fractions, summed over the stages), so
    the LP optimum (HiGHS) bounds the bottleneck from below. Seconds; 0.0 if the LP fails.
    """
    import pulp

    m = pulp.LpProblem("work_bound", pulp.LpMinimize)
    T = pulp.LpVariable("T", 0)
    m += T
    load = {k: [] for k in problem.kinds}
    for i in range(problem.n):
        for name, arr in (("f", problem.fwd), ("b", problem.bwd)):
            usable = [k for k in problem.kinds if math.isfinite(arr[k][i]) and res.get(k, 0) > 0]
            if not usable:
                return math.inf
            psi = {k: pulp.LpVariable(f"p{name}_{i}_{k}", 0, 1) for k in usable}
            m += pulp.lpSum(psi.values()) == 1
            for k in usable:
                if arr[k][i] > 0:
                    load[k].append(float(arr[k][i]) * psi[k])
    scale = max(problem.compute_time(0, problem.n, res), 1e-30)
    for k, terms in load.items():
        if terms:
            m += pulp.lpSum(terms) * (1.0 / scale) <= T * (res.get(k, 0.0) / scale)
    m.solve(pulp.HiGHS(msg=False, timeLimit=30))
    if m.status != pulp.LpStatusOptimal or T.value() is None:
        return 0.0
    return max(0.0, float(T.value()) * (1 - 1e-7))
