"""Exact joint partition and forward/backward split on identical multi-resource workers.

Three exact methods for :class:`~pipeopt.problems.resource.JointProblem`:

* :func:`solve_dp` - with the workers fixed (stage s on device s), the best split of a unit
  range is a closed-form LP (:func:`pipeopt.problems.resource.best_split`), so the min-max DP over
  cut positions is exact: O(S n^2) stage evaluations. Status OPTIMAL, bound = objective.
* :func:`solve_milp` - the MILP of :mod:`pipeopt.problems.resource.formulation` (products of a
  share and a binary assignment linearised exactly) at fixed T, bisected on T. Bound: the
  largest T the solver proved infeasible.
* :func:`solve_cpsat` - CP-SAT at fixed T over stage intervals (each interval's split time
  checked exactly beforehand), bisected on T. Bound: the largest T proven infeasible.

References
----------
Duan, Y. and Wu, J., *Optimizing Resource Allocation in Pipeline Parallelism for Distributed
DNN Training*, ICPADS 2022 (the model; they solve it in two heuristic steps).
"""

from __future__ import annotations

import math
import time

from .duan_wu import bisection_partition
from ...errors import InfeasibleError
from .formulation import MIN_REL_GAP, run_cpsat, run_milp, unit_lower_bound, work_lower_bound
from .problem import JointProblem, minmax_chain_dp
from ...result import Result, Status


def _start(problem: JointProblem) -> tuple:
    starts, value = bisection_partition(problem, problem.groups, mode="split")
    if not math.isfinite(value):  # the greedy found no plan that fits memory: ask the DP
        starts, value = minmax_chain_dp(problem, problem.groups, "split")
        if not math.isfinite(value):
            raise InfeasibleError(f"no split of {problem.instance.name} into {problem.stages} stages fits in memory")
    return starts, problem.groups


def _lower(problem: JointProblem) -> float:
    total = problem.pooled([d for g in problem.groups for d in g])
    return max(unit_lower_bound(problem, problem.pooled(problem.groups[0])), work_lower_bound(problem, total))


def solve_dp(problem: JointProblem, *, time_limit: float = 60.0, solver: str = "cbc", seed: int = 0, **_kw) -> Result:
    """Exact joint optimum by the min-max DP over cut positions with the LP split per stage.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.JointProblem`.
    time_limit, solver, seed
        Unused (the DP always finishes); accepted for the common signature.

    Returns
    -------
    Result
        Status ``OPTIMAL``, ``lower_bound`` = objective, space ``"split"``.

    Raises
    ------
    InfeasibleError
        If no split fits the workers' memory.
    """
    started = time.perf_counter()
    starts, value = minmax_chain_dp(problem, problem.groups, "split")
    if not math.isfinite(value):
        raise InfeasibleError(f"no split of {problem.instance.name} into {problem.stages} stages fits in memory")
    plan = problem.plan(starts, problem.groups, "split")
    res = problem.result("dp", plan, Status.OPTIMAL, started=started, space="split", info={"dp_value": value})
    res.lower_bound = min(value, res.objective)
    return res


def solve_milp(problem: JointProblem, *, time_limit: float = 60.0, solver: str = "cbc", seed: int = 0,
               rel_gap: float = MIN_REL_GAP, **_kw) -> Result:
    """Exact joint optimum by MILP (PuLP; ``solver`` ``"cbc"`` or ``"highs"``) bisected on T.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.JointProblem`.
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
        ``OPTIMAL`` (within ``rel_gap``) or ``TIME_LIMIT`` with the incumbent and the bound.
    """
    return run_milp(problem, method="milp", fixed_groups=problem.groups, start=_start(problem),
                    lower=_lower(problem), time_limit=time_limit, solver=solver, rel_gap=rel_gap)


def solve_cpsat(problem: JointProblem, *, time_limit: float = 60.0, solver: str = "cbc", seed: int = 0,
                workers: int = 2, rel_gap: float = MIN_REL_GAP, **_kw) -> Result:
    """Exact joint optimum by CP-SAT over stage intervals, bisected on T (:func:`pipeopt.problems.resource.formulation.run_cpsat`).

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.JointProblem`.
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
    return run_cpsat(problem, method="cpsat", fixed_groups=problem.groups, start=_start(problem),
                     lower=_lower(problem), time_limit=time_limit, seed=seed, workers=workers, rel_gap=rel_gap)
