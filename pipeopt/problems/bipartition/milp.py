"""Exact MILP for the Bi-Partition problem (separate forward and backward cuts), with PuLP.

Formulation (the model of :mod:`pipeopt.problems.bipartition.problem`; stages i = 0..S-1, cuts c = 0..S-2,
units u = 0..n-1):

* ``p[c, u] = 1`` iff unit u runs its forward pass on a stage <= c (a staircase:
  ``p[c, u] >= p[c, u+1]``, ``p[c, u] <= p[c+1, u]``); the forward cut is
  ``a_c = sum_u p[c, u]`` and ``a_{c+1} >= a_c + 1`` keeps every stage non-empty. ``q[c, u]``
  is the same for the backward pass. Stage i holds unit u in the forward pass iff
  ``p[i, u] - p[i-1, u] = 1`` (``p[-1] = 0``, ``p[S-1] = 1``), so loads are linear:
  ``load_i = sum_u fwd_u (p[i,u] - p[i-1,u]) + bwd_u (q[i,u] - q[i-1,u])``.
* Bytes of the edges crossing the forward split at cut c:
  ``sum_j bytes_j (p[c, j-1] - p[c, j])`` (the indicator of ``a_c = j``); the same with q.
* Migrations at cut c: the units between the two cuts are those with ``p[c,u] != q[c,u]``,
  one interval, so ``sum_u act_u |p - q| = |sum_u act_u (p - q)|``; four non-negative
  variables bound the positive and negative parts of ``sum act (p - q)`` and
  ``sum param/M (p - q)`` from below (exact at the optimum, since they only raise T).
* Overlap: ``T >= load_i`` and ``T >= (forward + backward bytes at c) / bandwidth``; without
  overlap ``T >= load_i + sends_i / bandwidth``.
* Memory (finite capacity only): ``h[u, i] >= `` forward and backward indicators (the union),
  ``k_i * sum act_u (q[i,u] - q[i-1,u]) + v_i * sum param_u h[u, i] <= capacity``.
* ``max_shift``: ``|sum_u p[c,u] - sum_u q[c,u]| <= max_shift``.

Times are divided by a reference (the simple lower bound) for the solver's tolerances. The
best same-cut plan (exact DP) caps T from above and is kept as the incumbent if the solver
finds nothing better in time (or only a tie: then the plan without migrations is returned); the
status is ``OPTIMAL`` only if the solver proved it, and the
reported lower bound is the solver's proven dual bound (never above the returned objective).

**Memory relaxation by bisection** (:func:`relaxation_optimum`, method
:func:`solve_bisection`). Without the memory limit the problem has an exact O(S n^2)
feasibility test for a given T: a stage from states ``(a, b)`` to ``(a', b')`` fits iff
``G(a', b') <= T + H(a, b)`` with G and H depending on one end each (loads are differences of
prefix sums, and each cut's transfers depend on its own two positions only), so the reachable
states follow from a 2-D prefix maximum. Bisection on T gives the relaxation's optimum; if its
plan fits in memory it is optimal for the problem, and in any case its value is a lower bound
that :func:`solve_milp` uses (``dp_bound=True``) to bound T from below and to cap it from above.

References
----------
Cui et al., *Bi-Partition*, Journal of Cloud Computing (Springer) -- the problem.
"""

from __future__ import annotations

import math
import os
import tempfile
import time

import numpy as np
import pulp

from .greedy import best_same_cut
from .problem import BipartitionProblem
from ...errors import InfeasibleError, InvalidPlanError, InvalidProblemError
from ...result import Result, Status
from ..partition.milp import CBC_INTERRUPTED, _cbc_bound

SOLVERS = ("cbc", "highs")


def _make_solver(solver: str, time_limit: float, gap: float, log_path: str, seed: int):
    if solver == "cbc":
        return pulp.PULP_CBC_CMD(msg=False, timeLimit=max(1, int(math.ceil(time_limit))), gapRel=gap,
                                 gapAbs=0.0,
                                 threads=1, logPath=log_path,
                                 options=[f"randomSeed {int(seed) + 1}", f"randomCbcSeed {int(seed) + 1}"])
    if solver == "highs":
        return pulp.HiGHS(msg=False, timeLimit=float(time_limit), gapRel=gap, gapAbs=0.0, threads=1,
                          random_seed=int(seed))
    raise InvalidProblemError(f"unknown MILP solver {solver!r}; choose from {list(SOLVERS)}")


def _dual_bound(prob: pulp.LpProblem, solver: str, log: str) -> float | None:
    """The solver's proven lower bound on the (scaled) objective, or ``None`` if unknown.

    HiGHS reports it through highspy; CBC's is read from its log by the partition MILP's
    reader (:func:`pipeopt.problems.partition.milp._cbc_bound`).
    """
    if solver == "highs":
        v = float(prob.solverModel.getInfo().mip_dual_bound)
        return v if math.isfinite(v) else None
    return _cbc_bound(log)


def build_model(problem: BipartitionProblem, scale: float, upper: float | None = None,
                lower: float | None = None):
    """Build the PuLP model (module docstring).

    Parameters
    ----------
    problem
        The Bi-Partition problem.
    scale
        Seconds per model time unit (times are divided by it).
    upper, lower
        Optional bounds on the bottleneck, seconds (``lower`` defaults to the simple bound).

    Returns
    -------
    (prob, T, p, q)
        The model, its objective variable and the staircase variables ``p[c][u]``, ``q[c][u]``.
    """
    S, n = problem.stages, problem.n
    fwd, bwd = problem.fwd / scale, problem.bwd / scale
    tb = problem.boundary_bytes / (problem.bandwidth * scale)  # seconds of edge bytes per split position
    ta = problem.act / (problem.bandwidth * scale)
    tp = problem.param / (problem.microbatches * problem.bandwidth * scale)
    prob = pulp.LpProblem("bipartition", pulp.LpMinimize)
    T = pulp.LpVariable("T", lowBound=(problem.simple_lower_bound() if lower is None else lower) / scale,
                        upBound=None if upper is None else upper / scale)
    prob += T

    def staircase(name: str) -> list[list]:
        rows = []
        for c in range(S - 1):
            row = []
            for u in range(n):
                if u <= c:  # stages 0..c are non-empty: unit c is in a stage <= c
                    row.append(1)
                elif u >= n - (S - 1 - c):  # stages c+1..S-1 are non-empty
                    row.append(0)
                else:
                    row.append(pulp.LpVariable(f"{name}_{c}_{u}", cat="Binary"))
            rows.append(row)
        for c in range(S - 1):
            for u in range(n - 1):
                if isinstance(rows[c][u + 1], pulp.LpVariable) or isinstance(rows[c][u], pulp.LpVariable):
                    prob.addConstraint(rows[c][u] - rows[c][u + 1] >= 0)
            if c < S - 2:
                prob.addConstraint(pulp.lpSum(rows[c + 1]) - pulp.lpSum(rows[c]) >= 1)
                for u in range(n):
                    if isinstance(rows[c][u], pulp.LpVariable) or isinstance(rows[c + 1][u], pulp.LpVariable):
                        prob.addConstraint(rows[c + 1][u] - rows[c][u] >= 0)
        return rows

    p, q = staircase("p"), staircase("q")
    ones, zeros = [1] * n, [0] * n

    def member(x, i):  # indicator rows of stage i: x[i] - x[i-1]
        hi = x[i] if i < S - 1 else ones
        lo = x[i - 1] if i > 0 else zeros
        return [hi[u] - lo[u] for u in range(n)]

    def split_bytes(row):  # seconds of edge bytes crossing the split described by staircase row
        return pulp.lpSum(tb[j] * (row[j - 1] - row[j]) for j in range(1, n))

    fwd_send, bwd_send = [], []
    for c in range(S - 1):
        diff = [p[c][u] - q[c][u] for u in range(n)]
        act_pos, act_neg, par_pos, par_neg = (pulp.LpVariable(f"{nm}_{c}", lowBound=0)
                                              for nm in ("act_pos", "act_neg", "par_pos", "par_neg"))
        prob.addConstraint(act_pos - pulp.lpSum(ta[u] * diff[u] for u in range(n)) >= 0)
        prob.addConstraint(act_neg + pulp.lpSum(ta[u] * diff[u] for u in range(n)) >= 0)
        prob.addConstraint(par_pos - pulp.lpSum(tp[u] * diff[u] for u in range(n)) >= 0)
        prob.addConstraint(par_neg + pulp.lpSum(tp[u] * diff[u] for u in range(n)) >= 0)
        # p > q: forward on <= c, backward on > c: activation forward, weights backward
        fwd_send.append(split_bytes(p[c]) + act_pos + par_neg)
        bwd_send.append(split_bytes(q[c]) + act_neg + par_pos)
        if problem.overlap:
            prob.addConstraint(T - fwd_send[c] - bwd_send[c] >= 0, f"cut_{c}")
        if problem.max_shift is not None:
            prob.addConstraint(pulp.lpSum(p[c]) - pulp.lpSum(q[c]) <= problem.max_shift)
            prob.addConstraint(pulp.lpSum(q[c]) - pulp.lpSum(p[c]) <= problem.max_shift)

    cap = problem.memory
    for i in range(S):
        f, g = member(p, i), member(q, i)
        load = pulp.lpSum(fwd[u] * f[u] + bwd[u] * g[u] for u in range(n))
        if not problem.overlap:
            if i < S - 1:
                load = load + fwd_send[i]
            if i > 0:
                load = load + bwd_send[i - 1]
        prob.addConstraint(T - load >= 0, f"stage_{i}")
        if math.isfinite(cap):
            h = []
            for u in range(n):
                hu = pulp.LpVariable(f"h_{i}_{u}", lowBound=0, upBound=1)
                prob.addConstraint(hu - f[u] >= 0)
                prob.addConstraint(hu - g[u] >= 0)
                h.append(hu)
            k, v = problem.in_flight(i), problem.versions(i)
            # bytes scaled to GiB for the solver's tolerances
            prob.addConstraint(
                pulp.lpSum(k * problem.act[u] / 2**30 * g[u] + v * problem.param[u] / 2**30 * h[u]
                           for u in range(n))
                <= cap / 2**30, f"memory_{i}")
    return prob, T, p, q


# ---- the memory relaxation, solved exactly by bisection on T ------------------------------------


def _cut_bytes(problem: BipartitionProblem):
    """``(fwd, bwd)``, ``ndarray (n+1, n+1)``: bytes per microbatch sent forward / backward across a
    cut whose forward split is at x and backward split at y (index ``[x, y]``)."""
    n, M = problem.n, problem.microbatches
    x = np.arange(n + 1)[:, None]
    y = np.arange(n + 1)[None, :]
    d_act = problem.act_prefix[y] - problem.act_prefix[x]
    d_par = (problem.param_prefix[y] - problem.param_prefix[x]) / M
    bb = problem.boundary_bytes
    fwd = bb[x] + np.maximum(-d_act, 0.0) + np.maximum(d_par, 0.0)
    bwd = bb[y] + np.maximum(d_act, 0.0) + np.maximum(-d_par, 0.0)
    return fwd, bwd


class _Relaxation:
    """Feasibility of a bottleneck T for the Bi-Partition problem without its memory limit.

    A state ``(a, b)`` is the start of a stage in the forward and the backward pass. Stage i
    from ``(a, b)`` to ``(a', b')`` (``a < a'``, ``b < b'``) fits in T iff
    ``G_i(a', b') <= T + H_i(a, b)`` with ``G_i = Fp[a'] + Bp[b'] (+ sends forward / bandwidth
    without overlap)`` and ``H_i = Fp[a] + Bp[b] (- sends backward at the cut before)``, and the
    cut ``(a', b')`` takes at most T (overlap) and respects ``max_shift``. So the stages
    reachable after i + 1 stages follow from a 2-D prefix maximum of ``H_i`` over the states
    reachable after i stages: O(S n^2) per value of T.
    """

    def __init__(self, problem: BipartitionProblem):
        self.p = problem
        n, S, bw = problem.n, problem.stages, problem.bandwidth
        fb, bk = _cut_bytes(problem)
        base = problem.fwd_prefix[:, None] + problem.bwd_prefix[None, :]
        over = problem.overlap
        self.G = [base + (fb / bw if (not over and i < S - 1) else 0.0) for i in range(S)]
        self.H = [base - (bk / bw if (not over and i > 0) else 0.0) for i in range(S)]
        self.comm = (fb + bk) / bw if over else np.zeros_like(fb)
        mask = np.ones((n + 1, n + 1), dtype=bool)
        if problem.max_shift is not None:
            x = np.arange(n + 1)
            mask = np.abs(x[:, None] - x[None, :]) <= problem.max_shift
        self.mask = mask

    def reach(self, T: float) -> list[np.ndarray] | None:
        """Reachable states per stage boundary if T is feasible, else ``None``."""
        n, S = self.p.n, self.p.stages
        R = np.zeros((n + 1, n + 1), dtype=bool)
        R[0, 0] = True
        out = [R]
        for i in range(S):
            V = np.where(R, self.H[i], -np.inf)
            V = np.maximum.accumulate(np.maximum.accumulate(V, axis=0), axis=1)
            best = np.full((n + 1, n + 1), -np.inf)
            best[1:, 1:] = V[:-1, :-1]  # strictly earlier in both passes
            R = self.G[i] <= T + best
            if i < S - 1:
                R &= self.mask & (self.comm <= T)
                R[n, :] = False
                R[:, n] = False
            out.append(R)
        return out if out[-1][n, n] else None

    def cuts(self, T: float, reach: list[np.ndarray]) -> tuple[list[int], list[int]]:
        """Backtrack a plan of bottleneck <= T from the reachable sets."""
        n, S = self.p.n, self.p.stages
        a2, b2 = n, n
        fa, fb = [], []
        for i in range(S - 1, 0, -1):
            ok = reach[i].copy()
            ok[a2:, :] = False
            ok[:, b2:] = False
            ok &= self.G[i][a2, b2] <= T + self.H[i]
            cand = np.where(ok, self.H[i], -np.inf)
            a2, b2 = (int(v) for v in np.unravel_index(np.argmax(cand), cand.shape))
            fa.append(a2)
            fb.append(b2)
        return fa[::-1], fb[::-1]


def relaxation_optimum(problem: BipartitionProblem, rel_tol: float = 1e-12):
    """The optimum of the Bi-Partition problem with its memory limit ignored, by bisection on T.

    Parameters
    ----------
    problem
        The Bi-Partition problem (its memory capacity is ignored).
    rel_tol
        Bisection stops when ``hi - lo <= rel_tol * hi``.

    Returns
    -------
    (lower, fwd_cuts, bwd_cuts)
        ``lower`` (seconds): a value proven infeasible (or the simple bound, if feasible), less
        a relative 1e-12 for rounding, so every plan -- memory or not -- has a bottleneck
        above it; the cuts of an optimal plan of the relaxation (bottleneck within ``rel_tol``
        of ``lower``). If that plan fits in memory it is optimal for the problem.

    Notes
    -----
    Exact feasibility test per T (class ``_Relaxation``): O(S n^2) with numpy; about 40
    bisection steps.
    """
    relax = _Relaxation(problem)
    start = best_same_cut(problem, ignore_memory=True)
    hi = problem.score(start, start).bottleneck
    lo = problem.simple_lower_bound()
    T_best = hi * (1 + 1e-9)
    best = relax.reach(T_best)
    if best is None:  # pragma: no cover - the same-cut plan is feasible: float trouble only
        return lo * (1 - 1e-12), list(start), list(start)
    if relax.reach(lo) is not None:
        best, T_best, hi = relax.reach(lo), lo, lo
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        r = relax.reach(mid)
        if r is None:
            lo = mid
        else:
            hi, best, T_best = mid, r, mid
    a, b = relax.cuts(T_best, best)
    return lo * (1 - 1e-12), a, b  # the margin covers the rounding of the feasibility test


def _cuts(rows) -> list[int]:
    return [int(round(sum(pulp.value(x) if isinstance(x, pulp.LpVariable) else x for x in row)))
            for row in rows]


def _infeasible(problem: BipartitionProblem) -> InfeasibleError:
    # memory depends on the backward split, and a = b needs the fewest weights: if no same-cut
    # plan fits, no plan does
    return InfeasibleError(
        f"no Bi-Partition plan of {problem.instance.name} into {problem.stages} stages fits in "
        f"{problem.memory / 2**30:.3f} GiB per worker (no same-cut plan fits, and moving the "
        "forward cuts away from the backward cuts only adds weight memory)")


def _finish(problem: BipartitionProblem, method: str, candidates: list, proven: bool, lower: float,
            started: float, info: dict) -> Result:
    """The best memory-feasible candidate ``(label, fwd_cuts, bwd_cuts)`` (first wins ties) as a Result.

    ``OPTIMAL`` if ``proven`` or if the bound ``lower`` meets the objective (rel. 1e-9); the
    reported bound never exceeds the objective.
    """
    best = None
    for label, a, b in candidates:
        sc = problem.score(a, b)
        if sc.excess > 0:
            continue
        if best is None or sc.bottleneck < best[0] * (1 - 1e-9):
            best = (sc.bottleneck, label, a, b)
    _, label, a, b = best
    info.update(incumbent=label, fwd_cuts=list(a), bwd_cuts=list(b))
    res = problem.result(method, problem.plan(a, b), Status.FEASIBLE, started=started, info=info)
    lb = min(max(lower, problem.simple_lower_bound()), res.objective)
    if not proven and lb >= res.objective * (1 - 1e-9):
        proven = True
        res.info["proof"] = "lower bound meets the objective"
    res.status = Status.OPTIMAL if proven else (Status.TIME_LIMIT if method == "milp" else Status.FEASIBLE)
    res.lower_bound = lb
    return res


def solve_bisection(problem: BipartitionProblem, *, time_limit: float = 60.0, solver: str = "cbc",
                    seed: int = 0, **_kw) -> Result:
    """Solve the Bi-Partition problem by bisection on T over the memory relaxation.

    :func:`relaxation_optimum` finds the optimum with the memory limit ignored, exactly (up to
    a relative 1e-12 bisection tolerance). If that plan fits in memory it is optimal;
    otherwise the best same-cut plan is returned with the relaxation's value as lower bound.

    Parameters
    ----------
    problem
        The Bi-Partition problem.
    time_limit, solver, seed
        Unused (accepted for the common method signature).

    Returns
    -------
    Result
        ``OPTIMAL`` with ``lower_bound`` the largest value proven infeasible (clamped to the
        objective), or ``FEASIBLE`` with that bound when memory binds.

    Raises
    ------
    InfeasibleError
        If no plan fits the workers' memory.
    """
    started = time.perf_counter()
    start_cuts = best_same_cut(problem)
    if start_cuts is None:
        raise _infeasible(problem)
    lo, a, b = relaxation_optimum(problem)
    info = {"relaxation_bound": lo, "relaxed_plan_fits": problem.score(a, b).excess == 0}
    cands = [("same_cut", start_cuts, start_cuts), ("bisection", a, b)]
    return _finish(problem, "bisection", cands, False, lo, started, info)


def solve_milp(problem: BipartitionProblem, *, time_limit: float = 60.0, solver: str = "cbc", seed: int = 0,
               gap: float = 1e-9, dp_bound: bool = True, **_kw) -> Result:
    """Solve the Bi-Partition problem exactly with a MILP (module docstring).

    Parameters
    ----------
    problem
        The Bi-Partition problem.
    time_limit
        Seconds for the MILP solver (CBC rounds up to whole seconds).
    solver
        ``"cbc"`` or ``"highs"`` (through PuLP), one thread.
    seed
        Solver random seed.
    gap
        Relative optimality tolerance passed to the solver.
    dp_bound
        First solve the memory relaxation by bisection (:func:`relaxation_optimum`): its value
        bounds T from below in the model and its plan, if it fits in memory, caps T from above
        and is a candidate incumbent. ``False`` gives the plain MILP (an independent check).

    Returns
    -------
    Result
        Status ``OPTIMAL`` (proven by the solver within ``gap``, or because the lower bound
        meets the incumbent; ``info["proof"]`` says so) or ``TIME_LIMIT`` (incumbent -- at
        worst the best same-cut plan -- and the best bound: the solver's, the relaxation's or
        the simple bound). ``lower_bound`` in seconds; ``info["milp_objective"]`` is the
        model's value of the solver's plan, seconds (equal to ``evaluate`` at optimality);
        ``info["incumbent"]`` says which plan was returned (``"milp"``, ``"same_cut"`` on ties,
        ``"bisection"``).

    Raises
    ------
    InvalidProblemError
        Unknown solver.
    InfeasibleError
        If no plan fits the workers' memory (then no same-cut plan fits either: the
        backward split fixes the activation memory and ``a = b`` minimises the weights).

    References
    ----------
    Cui et al., *Bi-Partition*, Journal of Cloud Computing (the problem).
    """
    started = time.perf_counter()
    if solver not in SOLVERS:
        raise InvalidProblemError(f"unknown MILP solver {solver!r}; choose from {list(SOLVERS)}")
    start_cuts = best_same_cut(problem)
    if start_cuts is None:
        raise _infeasible(problem)
    cands = [("same_cut", start_cuts, start_cuts)]
    upper = problem.score(start_cuts, start_cuts).bottleneck
    lower = problem.simple_lower_bound()
    info: dict = {"solver": solver, "seed": seed, "gap_tolerance": gap, "dp_bound": dp_bound,
                  "same_cut": {"cuts": start_cuts, "bottleneck": upper}}
    if dp_bound:
        lo, a, b = relaxation_optimum(problem)
        lower = max(lower, lo)
        info["relaxation_bound"] = lo
        sc = problem.score(a, b)
        if sc.excess == 0:
            cands.append(("bisection", a, b))
            upper = min(upper, sc.bottleneck)
    scale = problem.simple_lower_bound() or 1.0
    # the caps keep a relative margin of 1e-6: a window as narrow as the solvers' tolerances
    # makes them report the model infeasible
    prob, T, p, q = build_model(problem, scale, upper * (1 + 1e-6), lower * (1 - 1e-6))
    fd, log_path = tempfile.mkstemp(prefix="pipeopt_cbc_", suffix=".log")
    os.close(fd)
    try:
        remaining = max(1.0, time_limit - (time.perf_counter() - started))
        t0 = time.perf_counter()
        prob.solve(_make_solver(solver, remaining, gap, log_path, seed))
        wall = time.perf_counter() - t0
        with open(log_path) as fh:
            log = fh.read()
    finally:
        os.unlink(log_path)
    bound = _dual_bound(prob, solver, log)
    info.update(binaries=sum(v.cat == "Integer" for v in prob.variables()),
                solver_status=pulp.LpStatus[prob.status])
    has_solution = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    proven = prob.sol_status == pulp.LpSolutionOptimal
    if solver == "cbc" and any(sign in log for sign in CBC_INTERRUPTED) and wall >= 0.9 * remaining:
        # CBC's time limit interrupted its preprocessing or root LP: its status is no proof
        # (the same guard as the partition MILP's)
        proven, has_solution, bound = False, False, None
        info["solver_note"] = "CBC stopped in preprocessing / the root LP at its time limit (no proof)"
    if has_solution:
        a, b = _cuts(p), _cuts(q)
        try:
            problem.check_cuts(a, b)
        except InvalidPlanError:  # pragma: no cover - a solver returning garbage
            has_solution = proven = False
            info["solver_note"] = f"solver returned invalid cuts {a}, {b}"
    if has_solution:
        claimed = float(pulp.value(T)) * scale
        info["milp_objective"] = claimed
        if proven and claimed < problem.score(a, b).bottleneck * (1 - 1e-6):  # pragma: no cover
            proven = False  # the model's value must be the plan's: a solver slip is no proof
            info["solver_note"] = "solver's objective below the plan's evaluation: not trusted"
        cands.insert(1, ("milp", a, b))  # after same_cut: a tie keeps the plan without migrations
    if bound is not None:
        lower = max(lower, bound * scale)
    # a solver's optimality proof holds under the caps: the best candidate is then optimal
    return _finish(problem, "milp", cands, proven and has_solution, lower, started, info)
