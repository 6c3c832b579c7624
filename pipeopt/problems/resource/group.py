"""Exact grouping of heterogeneous devices into workers, with the partition and the split.

Two exact methods for :class:`~pipeopt.problems.resource.GroupProblem`, sharing the formulation of
:mod:`pipeopt.problems.resource.formulation` (device-to-worker binaries ``g``, unit-to-stage binaries
``x``, per-stage work fractions per resource kind, products linearised exactly; identical
devices ordered to break their symmetry; worker s runs stage s, so workers are not
interchangeable):

* :func:`solve_milp` - PuLP (CBC or HiGHS) at fixed T, bisected on T. Bound: the largest T
  proven infeasible.
* :func:`solve_cpsat` - CP-SAT at fixed T over stage intervals, whose split feasibility on
  the worker's devices is linear by LP duality
  (:func:`pipeopt.problems.resource.formulation.interval_cover_coefficients`), bisected on T with the
  same driver. Bound: the largest T proven infeasible.

Both start from the better of Algorithm 2 and round-robin (upper bound and hint).

References
----------
Duan, Y. and Wu, J., *Optimizing Resource Allocation in Pipeline Parallelism for Distributed
DNN Training*, ICPADS 2022 (the problem; Algorithm 2 is their heuristic).
"""

from __future__ import annotations

import math

from .duan_wu import algorithm2_groups, bisection_partition, round_robin_groups
from ...errors import InfeasibleError
from .formulation import MIN_REL_GAP, run_cpsat, run_milp, unit_lower_bound, work_lower_bound
from .problem import GroupProblem
from ...result import Result


def _start(problem: GroupProblem) -> tuple:
    best = None
    for groups in (algorithm2_groups(problem), round_robin_groups(problem)):
        starts, value = bisection_partition(problem, groups, mode="split")
        if best is None or value < best[2]:
            best = (starts, groups, value)
    if not math.isfinite(best[2]):
        raise InfeasibleError(
            f"neither Algorithm 2 nor round-robin found a plan of {problem.instance.name} that fits in memory;"
            " the exact group methods need a feasible start"
        )
    return best[0], best[1]


def _lower(problem: GroupProblem) -> float:
    total = problem.pooled(problem.device_names)
    return max(unit_lower_bound(problem, total), work_lower_bound(problem, total))


def solve_milp(problem: GroupProblem, *, time_limit: float = 60.0, solver: str = "cbc", seed: int = 0,
               rel_gap: float = MIN_REL_GAP, **_kw) -> Result:
    """Exact grouping + partition + split by MILP bisected on T.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.GroupProblem`.
    time_limit
        Seconds for the whole bisection.
    solver
        ``"cbc"`` or ``"highs"``.
    seed
        Unused.
    rel_gap
        Stop (OPTIMAL) when (objective - bound) <= rel_gap * objective.

    Returns
    -------
    Result
        ``OPTIMAL`` (within ``rel_gap``) or ``TIME_LIMIT`` with incumbent and bound; each
        stage's devices and forward shares in the plan.

    Raises
    ------
    InfeasibleError
        If no heuristic start fits memory.
    """
    return run_milp(problem, method="milp", fixed_groups=None, start=_start(problem), lower=_lower(problem),
                    time_limit=time_limit, solver=solver, rel_gap=rel_gap)


def solve_cpsat(problem: GroupProblem, *, time_limit: float = 60.0, solver: str = "cbc", seed: int = 0,
                workers: int = 2, rel_gap: float = MIN_REL_GAP, **_kw) -> Result:
    """Exact grouping + partition + split by CP-SAT over stage intervals, bisected on T.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.GroupProblem`.
    time_limit
        Seconds for CP-SAT.
    solver
        Unused.
    seed
        CP-SAT's random seed.
    workers
        CP-SAT search workers.
    rel_gap
        Stop (OPTIMAL) when (objective - bound) <= rel_gap * objective.

    Returns
    -------
    Result
        ``OPTIMAL`` (within ``rel_gap``) or ``TIME_LIMIT`` with the incumbent and the bound.
    """
    return run_cpsat(problem, method="cpsat", fixed_groups=None, start=_start(problem), lower=_lower(problem),
                     time_limit=time_limit, seed=seed, workers=workers, rel_gap=rel_gap)
