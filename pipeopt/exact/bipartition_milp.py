"""Exact MILP for the Bi-Partition problem (separate forward and backward cuts), with PuLP.

Formulation (the model of :mod:`pipeopt.bipartition`; stages i = 0..S-1, cuts c = 0..S-2,
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

References
----------
Cui et al., *Bi-Partition*, Journal of Cloud Computing (Springer) -- the problem.
"""

from __future__ import annotations

import math
import os
import tempfile
import time

import pulp

from ..baselines.bipartition_greedy import best_same_cut
from ..bipartition import BipartitionProblem
from ..errors import InfeasibleError, InvalidProblemError
from ..result import Result, Status
from .milp import _cbc_bound

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


def _dual_bound(prob: pulp.LpProblem, solver: str, log_path: str) -> float | None:
    """The solver's proven lower bound on the (scaled) objective, or ``None`` if unknown.

    HiGHS reports it through highspy; CBC's is read from its log by the partition MILP's
    reader (:func:`pipeopt.exact.milp._cbc_bound`).
    """
    if solver == "highs":
        v = float(prob.solverModel.getInfo().mip_dual_bound)
        return v if math.isfinite(v) else None
    try:
        with open(log_path) as fh:
            return _cbc_bound(fh.read())
    except OSError:  # pragma: no cover
        return None


def build_model(problem: BipartitionProblem, scale: float, upper: float | None = None):
    """Build the PuLP model (module docstring).

    Parameters
    ----------
    problem
        The Bi-Partition problem.
    scale
        Seconds per model time unit (times are divided by it).
    upper
        Optional upper bound on the bottleneck, seconds.

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
    T = pulp.LpVariable("T", lowBound=problem.simple_lower_bound() / scale,
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


def _cuts(rows) -> list[int]:
    return [int(round(sum(pulp.value(x) if isinstance(x, pulp.LpVariable) else x for x in row)))
            for row in rows]


def solve_milp(problem: BipartitionProblem, *, time_limit: float = 60.0, solver: str = "cbc", seed: int = 0,
               gap: float = 1e-9, **_kw) -> Result:
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

    Returns
    -------
    Result
        Status ``OPTIMAL`` (proven within ``gap``) or ``TIME_LIMIT`` (incumbent -- at worst the
        best same-cut plan -- and the solver's bound, or the simple bound if the solver gave
        none); ``lower_bound`` in seconds; ``info["milp_objective"]`` is the model's value of
        the returned plan, seconds (equal to ``evaluate`` at optimality).

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
    if start_cuts is None:  # memory depends on the backward split, minimised by a = b: none fits
        raise InfeasibleError(
            f"no Bi-Partition plan of {problem.instance.name} into {problem.stages} stages fits in "
            f"{problem.memory / 2**30:.3f} GiB per worker (no same-cut plan fits, and moving the "
            "forward cuts away from the backward cuts only adds weight memory)")
    upper = problem.score(start_cuts, start_cuts).bottleneck
    scale = problem.simple_lower_bound() or 1.0
    prob, T, p, q = build_model(problem, scale, upper * (1 + 1e-7))
    fd, log_path = tempfile.mkstemp(prefix="pipeopt_cbc_", suffix=".log")
    os.close(fd)
    try:
        remaining = max(1.0, time_limit - (time.perf_counter() - started))
        prob.solve(_make_solver(solver, remaining, gap, log_path, seed))
        bound = _dual_bound(prob, solver, log_path)
    finally:
        os.unlink(log_path)
    info = {"solver": solver, "seed": seed, "gap_tolerance": gap,
            "binaries": sum(v.cat == "Integer" for v in prob.variables()),
            "same_cut": {"cuts": start_cuts, "bottleneck": upper},
            "solver_status": pulp.LpStatus[prob.status]}
    has_solution = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    proven = prob.sol_status == pulp.LpSolutionOptimal
    plan = None
    if has_solution:
        a, b = _cuts(p), _cuts(q)
        plan = problem.plan(a, b)
        info["milp_objective"] = float(pulp.value(T)) * scale
        info.update(fwd_cuts=a, bwd_cuts=b)
    if plan is None or upper <= problem.score(a, b).bottleneck * (1 + 1e-9):
        # the solver found nothing (time limit, or a numerical 'infeasible' under the same-cut cap)
        # or nothing better: keep the best same-cut plan (no needless migrations on ties),
        # optimal only if the solver proved it
        plan = problem.plan(start_cuts, start_cuts)
        info.update(fwd_cuts=start_cuts, bwd_cuts=start_cuts, incumbent="same_cut")
        proven = proven and has_solution
    status = Status.OPTIMAL if proven else Status.TIME_LIMIT
    res = problem.result("milp", plan, status, started=started, info=info)
    lb = problem.simple_lower_bound()
    if bound is not None:
        lb = max(lb, bound * scale)
    if math.isfinite(res.objective):
        lb = min(lb, res.objective)
    res.lower_bound = lb
    return res
