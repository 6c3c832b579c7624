"""Exact joint partition and forward/backward split on identical multi-resource workers.

Three exact methods for :class:`~pipeopt.problems.resource.JointProblem`:

* :func:`solve_dp` - with the workers fixed (stage s on device s), the best split of a unit
  range is a closed-form LP (:func:`pipeopt.problems.resource.best_split`), so the min-max DP over
  cut positions is exact: O(S n^2) stage evaluations. Status OPTIMAL, bound = objective.
* :func:`solve_milp` - the MILP of :mod:`pipeopt.problems.resource.formulation` (products of a
  share and a binary assignment linearised exactly) at fixed T, bisected on T
  (:mod:`pipeopt.problems.resource.search`). Bound: the largest T the solver proved infeasible.
* :func:`solve_cpsat` - CP-SAT at fixed T over stage intervals (each interval's split time
  checked exactly beforehand; :mod:`pipeopt.problems.resource.intervals`), bisected on T.

The MILP and CP-SAT report ``OPTIMAL`` *within a relative gap of 1e-4*
(:data:`pipeopt.problems.resource.search.MIN_REL_GAP`); the DP is exact.

References
----------
Duan, Y. and Wu, J., *Optimizing Resource Allocation in Pipeline Parallelism for Distributed
DNN Training*, ICPADS 2022 (the model; they solve it in two heuristic steps).
"""

from __future__ import annotations

import math

from ...backends.deadline import Deadline, DeadlineReached
from ...errors import InfeasibleError
from ...result import Result, Status
from .bounds import lower_bound
from .duan_wu import bisection_partition
from .formulation import MilpProbe
from .intervals import IntervalProbe
from .problem import JointProblem, minmax_chain_dp
from .search import exact_search


def _starts(problem: JointProblem):
    """The exact methods' heuristic start: Duan & Wu's binary-search partition on the split time."""

    def starts(deadline: Deadline) -> list[tuple]:
        found, _ = bisection_partition(problem, problem.groups, mode="split", deadline=deadline)
        return [(found, problem.groups)]

    return starts


def solve_dp(problem: JointProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
             threads: int = 2) -> Result:
    """Exact joint optimum by the min-max DP over cut positions with the LP split per stage.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.JointProblem`.
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline`; the DP checks it
        once per table row.
    solver, seed, threads
        Unused; accepted for the common signature.

    Returns
    -------
    Result
        Status ``OPTIMAL``, ``lower_bound`` = objective, space ``"split"``; at the deadline
        ``TIME_LIMIT`` with the binary-search plan (if it fits) and the lower bound of
        :func:`pipeopt.problems.resource.bounds.lower_bound`, both given a short extra time
        (5 % of the limit, at most 1 s).

    Raises
    ------
    InfeasibleError
        If no split fits the workers' memory (the DP enumerates every split).
    """
    deadline = Deadline.of(time_limit)
    try:
        starts, value = minmax_chain_dp(problem, problem.groups, "split", deadline)
    except DeadlineReached:  # the binary-search plan and the bounds, in a short extra time
        extra = Deadline(min(1.0, 0.05 * deadline.limit))
        bound = lower_bound(problem, extra)
        fallback, fvalue = bisection_partition(problem, problem.groups, mode="split", deadline=extra)
        plan = problem.plan(fallback, problem.groups, "split") if math.isfinite(fvalue) else None
        return problem.result("dp", plan, Status.TIME_LIMIT, lower_bound=bound, started=deadline.started,
                              space="split", info={"incumbent": "binary-search partition (the DP did not finish)"})
    if not math.isfinite(value):
        raise InfeasibleError(f"no split of {problem.instance.name} into {problem.stages} stages fits in memory "
                              "(the DP enumerated every split)")
    plan = problem.plan(starts, problem.groups, "split")
    return problem.result("dp", plan, Status.OPTIMAL, lower_bound=value, started=deadline.started, space="split",
                          info={"dp_value": value})


def solve_milp(problem: JointProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
               threads: int = 2) -> Result:
    """Exact joint optimum by MILP at fixed T (PuLP door: CBC or HiGHS), bisected on T.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.JointProblem`.
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline`, for everything
        (bounds, start, every bisection step).
    solver
        ``"cbc"`` or ``"highs"``.
    seed
        Solver seed.
    threads
        Unused (the MILP solver runs one thread).

    Returns
    -------
    Result
        ``OPTIMAL`` (within a relative gap of 1e-4) or ``TIME_LIMIT`` with the incumbent (or
        none) and the proven bound.

    Raises
    ------
    InfeasibleError
        If the MILP proved that no split fits memory.
    """
    deadline = Deadline.of(time_limit)
    return exact_search(problem, "milp", MilpProbe(problem, solver=solver, seed=seed), deadline, _starts(problem),
                        {"solver": solver, "bound": "largest T the MILP proved infeasible"})


def solve_cpsat(problem: JointProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
                threads: int = 2) -> Result:
    """Exact joint optimum by CP-SAT over stage intervals at fixed T, bisected on T.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.JointProblem`.
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline`.
    solver
        Unused.
    seed
        CP-SAT's random seed.
    threads
        CP-SAT search threads.

    Returns
    -------
    Result
        ``OPTIMAL`` (within a relative gap of 1e-4) or ``TIME_LIMIT`` with the incumbent (or
        none) and the proven bound.

    Raises
    ------
    InfeasibleError
        If CP-SAT proved that no split fits memory.
    """
    deadline = Deadline.of(time_limit)
    return exact_search(problem, "cpsat", IntervalProbe(problem, threads=threads, seed=seed), deadline,
                        _starts(problem), {"solver": "cp-sat", "bound": "largest T CP-SAT proved infeasible"})
