"""The rows of the Bi-Partition MILP (PuLP), shared by the exact MILP and the tie-break.

:func:`build_model` writes the model stated in :mod:`pipeopt.problems.bipartition.milp` (the
staircase binaries of the forward and backward cuts, loads, transfers with migrations, the
stage, cut and window rows of the steady period, memory, ``max_shift``), minimising the period
T. :func:`model_rows` returns the same model with its per-op durations as linear expressions,
which the tie-break's event-time model (:mod:`pipeopt.problems.bipartition.tiebreak`) puts
under the longest path of M microbatches. Every rule is read from :mod:`pipeopt.cost.rules`
and the problem's cost table (:class:`~pipeopt.problems.bipartition.problem.BipartitionProblem`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ...lazy import lazy_module
from ...backends.deadline import Deadline
from ...cost import rules
from .problem import BipartitionProblem

pulp = lazy_module("pulp")

MODEL_UNIT = 1e3
"""The model's T of the incumbent, and a memory row's capacity: the solvers' absolute
tolerances (1e-9 to 1e-6) are then at most 1e-9 of them (at T about 1, HiGHS's presolve fixed
T within 1e-6 of its cap and quoted that as the optimum)."""

SOLVER_SLACK = 1e-8
"""Relative amount taken off the solver's dual bound before it is quoted (its tolerances)."""


class ModelRows(NamedTuple):
    """What :func:`model_rows` builds (times in the model's unit: seconds / ``scale``).

    Attributes
    ----------
    prob
        The PuLP problem (objective: minimise T).
    T
        The period variable.
    p, q
        Staircase rows of the forward and backward cuts: ``p[c][u]`` is 1 iff unit u runs its
        forward pass on a stage <= c (a ``pulp.LpVariable`` or the constant 0 / 1).
    f_op, b_op
        Per stage, the forward and backward op's duration (its load; without overlap plus the
        transfer it sends), linear expressions.
    x, y
        Per cut, the forward and backward transfer of one microbatch (activations and migrated
        inputs / weights forward, gradients and weights back), linear expressions bounded
        below by the true values (the migrations' positive parts are variables that only
        raise a time). With overlap they lie on the links; without it they are in the ops.
    """

    prob: pulp.LpProblem
    T: pulp.LpVariable
    p: list
    q: list
    f_op: list
    b_op: list
    x: list
    y: list


def model_rows(problem: BipartitionProblem, scale: float, upper: float | None = None,
               lower: float | None = None, windows: list | None = None,
               deadline: Deadline | None = None) -> ModelRows:
    """Build the PuLP model (:mod:`pipeopt.problems.bipartition.milp`'s docstring).

    Parameters
    ----------
    problem
        The Bi-Partition problem.
    scale
        Seconds per model time unit (times are divided by it; > 0).
    upper, lower
        Optional bounds on the bottleneck, seconds (``lower`` defaults to the simple bound).
    windows
        Optional per cut ``(a_lo, a_hi, b_lo, b_hi)``: ranges of the forward and backward cut
        positions (:meth:`_Relaxation.windows`); the staircase variables outside are constants.
    deadline
        Checked between the rows of the model.

    Returns
    -------
    ModelRows

    Raises
    ------
    DeadlineReached
        If ``deadline`` passes while the model is built.
    """
    S, n, bw = problem.stages, problem.n, problem.bandwidth
    dl = Deadline(None) if deadline is None else deadline
    fwd, bwd = problem.fwd / scale, problem.bwd / scale
    tab = problem.table
    tb = rules.transfer_time(tab.boundary_bytes, bw) / scale  # per split position
    act, par = rules.migration_bytes(problem.migrated, problem.param, problem.microbatches)
    ta, tp = rules.transfer_time(act, bw) / scale, rules.transfer_time(par, bw) / scale
    prob = pulp.LpProblem("bipartition", pulp.LpMinimize)
    T = pulp.LpVariable("T", lowBound=(problem.simple_lower_bound() if lower is None else lower) / scale,
                        upBound=None if upper is None else upper / scale)
    prob += T

    def is_var(x) -> bool:
        return not isinstance(x, int)

    def add(expr_terms, constraint) -> None:
        if any(is_var(x) for x in expr_terms):
            prob.addConstraint(constraint)

    # cut c's position range: default every position that leaves the stages non-empty
    ranges = []
    for which in (0, 1):
        lo = [c + 1 for c in range(S - 1)]
        hi = [n - (S - 1 - c) for c in range(S - 1)]
        if windows is not None:
            lo = [max(lo[c], windows[c][2 * which]) for c in range(S - 1)]
            hi = [min(hi[c], windows[c][2 * which + 1]) for c in range(S - 1)]
        for c in range(1, S - 1):  # cuts increase strictly
            lo[c] = max(lo[c], lo[c - 1] + 1)
        for c in range(S - 3, -1, -1):
            hi[c] = min(hi[c], hi[c + 1] - 1)
        ranges.append((lo, hi))

    def staircase(name: str, lo: list[int], hi: list[int]) -> list[list]:
        rows = []
        for c in range(S - 1):
            dl.check("building the MILP")
            # p[c][u] = 1 iff u < a_c, with lo[c] <= a_c <= hi[c]
            rows.append([1 if u < lo[c] else 0 if u >= hi[c] else pulp.LpVariable(f"{name}_{c}_{u}", cat="Binary")
                         for u in range(n)])
        for c in range(S - 1):
            dl.check("building the MILP")
            row = rows[c]
            for u in range(n - 1):
                add((row[u], row[u + 1]), row[u] - row[u + 1] >= 0)
            if c < S - 2:
                nxt = rows[c + 1]
                add(row + nxt, pulp.lpSum(nxt) - pulp.lpSum(row) >= 1)
                for u in range(n):
                    add((row[u], nxt[u]), nxt[u] - row[u] >= 0)
        return rows

    p, q = staircase("p", *ranges[0]), staircase("q", *ranges[1])
    ones, zeros = [1] * n, [0] * n

    def member(x, i):  # indicator rows of stage i: x[i] - x[i-1]
        hi = x[i] if i < S - 1 else ones
        lo = x[i - 1] if i > 0 else zeros
        return [hi[u] - lo[u] for u in range(n)]

    def split_time(row):  # seconds of edge bytes crossing the split described by staircase row
        return pulp.lpSum(tb[j] * (row[j - 1] - row[j]) for j in range(1, n))

    fwd_send, bwd_send = [], []
    for c in range(S - 1):
        dl.check("building the MILP")
        diff = [p[c][u] - q[c][u] for u in range(n)]
        act_pos, act_neg, par_pos, par_neg = (pulp.LpVariable(f"{nm}_{c}", lowBound=0)
                                              for nm in ("act_pos", "act_neg", "par_pos", "par_neg"))
        moved_act = pulp.lpSum(ta[u] * diff[u] for u in range(n))
        moved_par = pulp.lpSum(tp[u] * diff[u] for u in range(n))
        prob.addConstraint(act_pos - moved_act >= 0)
        prob.addConstraint(act_neg + moved_act >= 0)
        prob.addConstraint(par_pos - moved_par >= 0)
        prob.addConstraint(par_neg + moved_par >= 0)
        # p > q (forward on <= c, backward on > c): the activation goes forward, the weights back
        fwd_send.append(split_time(p[c]) + act_pos + par_neg)
        bwd_send.append(split_time(q[c]) + act_neg + par_pos)
        if problem.overlap:  # full duplex: each direction on its own
            prob.addConstraint(T - fwd_send[c] >= 0, f"cut_fwd_{c}")
            prob.addConstraint(T - bwd_send[c] >= 0, f"cut_bwd_{c}")
        if problem.max_shift is not None:
            add(p[c] + q[c], pulp.lpSum(p[c]) - pulp.lpSum(q[c]) <= problem.max_shift)
            add(p[c] + q[c], pulp.lpSum(q[c]) - pulp.lpSum(p[c]) <= problem.max_shift)

    cap = problem.memory
    f_op, b_op = [], []
    for i in range(S):
        dl.check("building the MILP")
        f, g = member(p, i), member(q, i)
        f_op.append(pulp.lpSum(fwd[u] * f[u] for u in range(n)))
        b_op.append(pulp.lpSum(bwd[u] * g[u] for u in range(n)))
        # without overlap a stage sends its activations forward, its gradients back
        f_op[i], b_op[i] = rules.carried(i, S, f_op[i], b_op[i], fwd_send, bwd_send, problem.overlap)
        prob.addConstraint(T - f_op[i] - b_op[i] >= 0, f"stage_{i}")
        if math.isfinite(cap):
            h = []
            for u in range(n):
                if is_var(f[u]) or is_var(g[u]):
                    hu = pulp.LpVariable(f"h_{i}_{u}", lowBound=0, upBound=1)
                    prob.addConstraint(hu - f[u] >= 0)  # also when f[u] is a constant 1
                    prob.addConstraint(hu - g[u] >= 0)
                else:
                    hu = max(f[u], g[u])
                h.append(hu)
            acts = pulp.lpSum(problem.act[u] * (MODEL_UNIT / cap) * g[u] for u in range(n))
            params = pulp.lpSum(problem.param[u] * (MODEL_UNIT / cap) * h[u] for u in range(n))
            mem = rules.stage_memory(acts, params, float(tab.in_flight[i]), float(tab.versions[i]))
            prob.addConstraint(mem <= rules.memory_limit(MODEL_UNIT), f"memory_{i}")  # MODEL_UNIT = the capacity
    if problem.overlap and S > 1:
        _window_rows(prob, T, p, q, fwd, bwd, fwd_send, bwd_send, dl)
    return ModelRows(prob, T, p, q, f_op, b_op, fwd_send, bwd_send)


def build_model(problem: BipartitionProblem, scale: float, upper: float | None = None,
                lower: float | None = None, windows: list | None = None,
                deadline: Deadline | None = None):
    """:func:`model_rows` as ``(prob, T, p, q)``: the model, its objective variable and the
    staircase rows ``p[c][u]``, ``q[c][u]`` (``pulp.LpVariable`` or the constants 0 / 1)."""
    rows = model_rows(problem, scale, upper, lower, windows, deadline)
    return rows.prob, rows.T, rows.p, rows.q


def _window_rows(prob, T, p, q, fwd, bwd, fwd_send, bwd_send, dl: Deadline) -> None:
    """Add the window rows of the steady state (:func:`rules.steady_period`, no replication):
    for every ``i < l``, ``sum_{s=i..l} load_s + sum_{c=i..l-1} (x_c + y_c) <= (l - i + 1) T``.

    The loads telescope: ``sum_{s=i..l} load_s = E_l - E_{i-1}`` with ``E_c = sum_u fwd_u
    p[c, u] + bwd_u q[c, u]`` (the forward and backward work of stages 0..c; ``E_{-1} = 0``,
    ``E_{S-1}`` the total), so with one variable per ``E_c`` and per round trip
    ``r_c >= x_c + y_c`` each of the O(S^2) rows has O(S) terms. (``i = l`` is the stage's own
    row, added with the stages.)
    """
    S, n = len(p) + 1, len(fwd)
    E = [0.0]
    for c in range(S - 1):
        dl.check("building the MILP")
        e = pulp.LpVariable(f"work_{c}")
        prob.addConstraint(e - pulp.lpSum(fwd[u] * p[c][u] + bwd[u] * q[c][u] for u in range(n)) == 0,
                           f"work_{c}")
        E.append(e)
    E.append(float(np.sum(fwd) + np.sum(bwd)))  # E[c + 1] = E_c
    r = []
    for c in range(S - 1):
        rc = pulp.LpVariable(f"trip_{c}", lowBound=0)
        prob.addConstraint(rc - fwd_send[c] - bwd_send[c] >= 0, f"trip_{c}")
        r.append(rc)
    for i in range(S):
        dl.check("building the MILP")
        for l in range(i + 1, S):
            prob.addConstraint((l - i + 1) * T - (E[l + 1] - E[i]) - pulp.lpSum(r[i:l]) >= 0,
                               f"window_{i}_{l}")


def cuts_of_rows(rows, values: dict) -> list[int]:
    """Cut positions of the staircase rows ``rows`` (``p`` or ``q`` of :func:`build_model`) from
    the solver's ``{variable name: value}``: each row's sum, rounded."""
    return [round(sum(values.get(x.name, 0.0) if isinstance(x, pulp.LpVariable) else x for x in row))
            for row in rows]


def start_of_rows(rows, cuts) -> dict:
    """MIP start of the staircase rows for cut positions ``cuts``."""
    return {x.name: float(u < a) for row, a in zip(rows, cuts, strict=True)
            for u, x in enumerate(row) if isinstance(x, pulp.LpVariable)}
