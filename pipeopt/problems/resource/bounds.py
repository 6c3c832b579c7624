"""Bounds on the objective of the joint and group problems (the steady period with its window
rows, :meth:`~pipeopt.problems.resource.ResourceProblem.period`), for their exact methods.

* :func:`lower_bound` - a valid lower bound on the optimum: the larger of the slowest single
  unit on the strongest conceivable worker (:func:`unit_bound`) and the total work spread over
  the whole cluster (:func:`work_bound`, an LP through the PuLP door).
* :func:`top_limit` - a limit that the period of every plan that fits memory stays under
  (if any plan fits at all): the bisection's upper end when no heuristic plan fits memory, so
  that the exact methods never need a feasible start.

Both draw from the method's :class:`~pipeopt.backends.deadline.Deadline`.
"""

from __future__ import annotations

import math

import numpy as np

from ...lazy import lazy_module
from ...backends.deadline import Deadline
from ...backends.pulp import solve_pulp
from ...cost.tolerance import SOLVER_GAP, SUM_ORDER
from .problem import GroupProblem, ResourceProblem

pulp = lazy_module("pulp")

LP_TOLERANCE = SOLVER_GAP
"""Relative amount taken off the work LP's optimum: HiGHS's feasibility tolerance on its
(scaled) rows, so that the bound stays below the true LP optimum."""

TOP_MARGIN = SUM_ORDER
"""Relative margin on :func:`top_limit` against the float rounding of a stage time."""

WORK_BOUND_SHARE = 0.2
"""Share of the time left the work LP may use."""


def strongest_worker(problem: ResourceProblem) -> tuple[dict, float]:
    """Resources and memory that no worker of a plan can exceed.

    Fixed workers (joint): per kind and for memory, the largest over the workers. Group: the
    other q - 1 workers hold at least one device each, so a worker has at most the D - q + 1
    largest amounts of each kind (and of memory) - summed per kind, possibly over different
    devices.

    Returns
    -------
    (res, memory)
        ``dict[kind, units]`` and bytes (``inf`` if some device is unlimited).
    """
    if not isinstance(problem, GroupProblem):
        pooled = [problem.pooled(g) for g in problem.groups]
        res = {k: max(p.get(k, 0.0) for p in pooled) for k in problem.kinds}
        return res, max(problem.capacity(g) for g in problem.groups)
    devices = problem.instance.cluster.devices
    keep = len(devices) - problem.num_stages + 1
    res = {k: math.fsum(sorted((d.resources.get(k, 0.0) for d in devices), reverse=True)[:keep])
           for k in problem.kinds}
    memory = math.fsum(sorted((d.memory for d in devices), reverse=True)[:keep])
    return res, memory


def unit_bound(problem: ResourceProblem, res: dict) -> float:
    """``max_i`` compute time of unit i alone on resources ``res`` (seconds): a lower bound when
    no worker has more than ``res`` (a stage's time only grows with its units and shrinks with
    its resources)."""
    return max(problem.compute_time(i, i + 1, res) for i in range(problem.n))


def work_bound(problem: ResourceProblem, res: dict, deadline: Deadline | None = None) -> float:
    """A lower bound from the total work on resources ``res`` (the whole cluster), with every
    unit's forward and backward work divisible among kinds unit by unit.

    LP: minimise T s.t. ``sum_k psi_f[i,k] = sum_k psi_b[i,k] = 1`` for every unit i (over the
    kinds that run that pass of unit i) and ``sum_i psi_f[i,k] fwd[i,k] + psi_b[i,k] bwd[i,k]
    <= T R_k`` for every kind. Any plan of period T gives a feasible point (psi = its
    stages' work fractions: a stage's forward share of kind k does ``psi_f F_k`` unit-seconds
    of forward work in ``f <= T`` seconds on ``beta_k R_k`` units, its backward share likewise,
    so the two fit ``R_k T``), so the LP optimum (HiGHS through
    :func:`pipeopt.backends.pulp.solve_pulp`, in this process) bounds the bottleneck from
    below; :data:`LP_TOLERANCE` is taken off.

    Parameters
    ----------
    problem
        A joint or group problem.
    res
        ``dict[kind, units]``: the resources of all workers together.
    deadline
        The LP gets :data:`WORK_BOUND_SHARE` of the time left.

    Returns
    -------
    float
        Seconds; ``inf`` if some unit cannot run on ``res`` at all, 0.0 if the LP was not solved.
    """
    kinds = [k for k in problem.kinds if res.get(k, 0.0) > 0]
    scale = problem.compute_time(0, problem.n, res)
    if not math.isfinite(scale):
        scale = 1.0
    scale = max(scale, 1e-30)
    m = pulp.LpProblem("work_bound", pulp.LpMinimize)
    T = pulp.LpVariable("T", 0)
    m += T
    load: dict = {k: [] for k in kinds}
    for i in range(problem.n):
        for name, arr in (("f", problem.fwd), ("b", problem.bwd)):
            usable = [k for k in kinds if math.isfinite(arr[k][i])]  # kinds that run this pass of unit i
            if not usable:
                return math.inf
            psi = {k: pulp.LpVariable(f"p{name}_{i}_{k}", 0, 1) for k in usable}
            m += pulp.lpSum(psi.values()) == 1
            for k in usable:
                if arr[k][i] > 0:
                    load[k].append(float(arr[k][i]) / scale * psi[k])
    for k, terms in load.items():
        if terms:
            m += pulp.lpSum(terms) <= T * res[k]
    sub = None if deadline is None else deadline.sub(fraction=WORK_BOUND_SHARE)
    out = solve_pulp(m, solver="highs", deadline=sub, isolate=False)
    if out.status != "optimal" or out.bound is None:
        return 0.0
    return max(0.0, out.bound * scale * (1 - LP_TOLERANCE))


def lower_bound(problem: ResourceProblem, deadline: Deadline | None = None) -> float:
    """The larger of :func:`unit_bound` on the strongest worker (:func:`strongest_worker`) and
    :func:`work_bound` on all workers together (seconds)."""
    strongest, _ = strongest_worker(problem)
    if isinstance(problem, GroupProblem):
        total = problem.pooled(problem.device_names)
    else:
        total = problem.pooled([d for g in problem.groups for d in g])
    return max(unit_bound(problem, strongest), work_bound(problem, total, deadline))


def top_limit(problem: ResourceProblem) -> float:
    """A limit every plan that fits memory passes: its period is at most this (seconds).

    A stage with a finite time has a kind that runs its whole forward pass and a kind that
    runs its whole backward pass; giving each its whole amount (half each if they are the same
    kind) keeps ``f`` and ``b`` within ``tau = 2 max_k W_k / least_k`` (``W_k`` the chain's
    forward plus backward work on k over the units that run on k, ``least_k`` the smallest
    positive amount of k a worker can have) and ``f + b`` within ``2 tau``. So at
    ``T = tau + max cut`` every stage passes on its own, every cut (its own row) passes, and
    every window row ``(sum_{s>=i} (f_s + b_s) + sum round trips) / (2 (S - i))`` is at most
    ``tau + max cut`` (a round trip is twice a cut time). :data:`TOP_MARGIN` covers float
    rounding.
    """
    if isinstance(problem, GroupProblem):
        amounts = [d.resources for d in problem.instance.cluster.devices]
    else:
        amounts = [problem.pooled(g) for g in problem.groups]
    cut = float(max(problem.cut_time)) if problem.n > 1 else 0.0
    tau = 0.0
    for k in problem.kinds:
        least = min((r.get(k, 0.0) for r in amounts if r.get(k, 0.0) > 0), default=0.0)
        if least <= 0:
            continue
        f, b = problem.fwd[k], problem.bwd[k]
        work = math.fsum(float(v) for v in (*f[np.isfinite(f)], *b[np.isfinite(b)]))
        tau = max(tau, 2.0 * work / least)
    return (tau + cut) * (1 + TOP_MARGIN) + 1e-300
