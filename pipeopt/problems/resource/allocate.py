"""The allocate problem's methods: the LP split, the paper's closed form, no split.

All three keep the same partition (:func:`base_partition`) so that their objectives compare
directly.

* :func:`solve_lp` - the optimal forward share per worker and kind for the objective,
  evaluate's ``bottleneck`` (the 1F1B steady period with its window rows, every stage in split
  execution): the least period over all shares,
  :meth:`~pipeopt.problems.resource.ResourceProblem.period`. At a trial period T every stage
  takes the share of least ``f + b`` with both passes within T (closed form,
  :func:`pipeopt.problems.resource.split.least_busy`) - best for every window row at once -
  so "period <= T" is decided exactly and bisected on T down to adjacent floats. OPTIMAL,
  with the largest T found infeasible as its bound. (Each stage's least-time share, the
  allocation LP of Duan & Wu, :func:`pipeopt.problems.resource.best_split`, is optimal only
  when no window row binds.)
* :func:`theorem` - Duan & Wu's beta = c/(c+1) with c the worker's forward/backward time
  ratio: optimal when F_k/B_k = c for every kind, a heuristic otherwise.
* :func:`sequential` - forward and backward one after the other on all resources (beta None),
  the classic model; space ``"sequential"``.

References
----------
Duan, Y. and Wu, J., *Optimizing Resource Allocation in Pipeline Parallelism for Distributed
DNN Training*, ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029.
"""

from __future__ import annotations

import math

from ...backends.deadline import Deadline
from ...errors import InfeasibleError
from ...result import Result, Status
from .duan_wu import bisection_partition
from .problem import AllocateProblem


def base_partition(problem: AllocateProblem, deadline: Deadline | None = None) -> tuple[list[int], list[tuple]]:
    """``(starts, groups)`` of the fixed partition every allocate method uses.

    The given plan's stages and workers, or (``stages=S``) Duan & Wu's binary-search partition
    (:func:`pipeopt.problems.resource.duan_wu.bisection_partition`, balancing the sequential
    stage time) of the chain on the first S devices, stage s on device s. Deterministic: every
    method gets the same partition.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.AllocateProblem`.
    deadline
        Bounds the bisection (its plan at the deadline is kept).
    """
    if problem.plan_given is not None:
        return problem.starts_of(problem.plan_given), [tuple(s.devices) for s in problem.plan_given.stages]
    groups = [(d.name,) for d in problem.instance.cluster.devices[: problem.num_stages]]
    starts, _ = bisection_partition(problem, groups, mode="sequential", deadline=deadline)
    return starts, groups


def _run(problem: AllocateProblem, method: str, mode: str, time_limit) -> Result:
    deadline = Deadline.of(time_limit)
    starts, groups = base_partition(problem, deadline)
    plan = problem.plan(starts, groups, mode)
    seq = problem.plan_value(starts, groups, "sequential")
    info = {"sequential_objective": seq}
    if mode == "split":  # the optimum of the fixed partition, and the largest T found infeasible
        value, _, lower = problem.period(starts, groups, "split")
        if not math.isfinite(value):  # the shares change neither memory nor which kinds can run a layer
            raise InfeasibleError(f"allocate on {problem.instance.name}: a stage of the partition breaks memory or "
                                  "holds a layer its worker cannot run, whatever the split")
        res = problem.result(method, plan, Status.OPTIMAL, lower_bound=lower, started=deadline.started,
                             space="split", info={**info, "bound": "largest period T found infeasible"})
    else:
        res = problem.result(method, plan, Status.FEASIBLE, started=deadline.started,
                             space="sequential" if mode == "sequential" else "split", info=info)
    res.info["gain_over_sequential"] = seq / res.objective if res.objective > 0 else None
    return res


def solve_lp(problem: AllocateProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
             threads: int = 2) -> Result:
    """The optimal split of the fixed partition: the shares of least period (window rows included).

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.AllocateProblem`.
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline` (bounds the
        partition's bisection when the problem gives ``stages``).
    solver, seed, threads
        Unused; accepted for the common signature.

    Returns
    -------
    Result
        Status ``OPTIMAL`` in the split space of the fixed partition (``lower_bound``: the
        largest period found infeasible, within float rounding of the objective);
        ``info["sequential_objective"]`` is the same plan without the split and
        ``info["gain_over_sequential"]`` their ratio.

    Raises
    ------
    InfeasibleError
        If a stage of the partition breaks memory under split execution (``2 (S - s)``
        microbatches in flight) or holds a layer its worker cannot run (the shares change
        neither: no split fits).
    """
    return _run(problem, "lp", "split", time_limit)


def theorem(problem: AllocateProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
            threads: int = 2) -> Result:
    """Duan & Wu's closed-form split beta_k = c/(c+1) on the fixed partition (FEASIBLE, space ``"split"``)."""
    return _run(problem, "theorem", "theorem", time_limit)


def sequential(problem: AllocateProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
               threads: int = 2) -> Result:
    """The fixed partition without the split (FEASIBLE, space ``"sequential"``)."""
    return _run(problem, "sequential", "sequential", time_limit)
