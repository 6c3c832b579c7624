"""The allocate problem's methods: the LP split, the paper's closed form, no split.

All three keep the same partition (:attr:`pipeopt.problems.resource.AllocateProblem.base`) so that
their objectives compare directly.

* :func:`solve_lp` - the optimal forward share per worker and kind: the allocation LP
  ``max r s.t. sum_k beta_k R_k/F_k >= r, sum_k (1-beta_k) R_k/B_k >= r, 0 <= beta <= 1``
  per stage, solved exactly in closed form (:func:`pipeopt.problems.resource.best_split`). OPTIMAL.
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

import time

from .problem import AllocateProblem
from ...result import Result, Status


def _run(problem: AllocateProblem, method: str, mode: str, status: Status, space: str) -> Result:
    started = time.perf_counter()
    starts, groups = problem.base
    plan = problem.plan(starts, groups, mode)
    seq = problem.plan_value(starts, groups, "sequential")
    res = problem.result(method, plan, status, started=started, space=space,
                         info={"sequential_objective": seq})
    res.info["gain_over_sequential"] = seq / res.objective if res.objective > 0 else None
    return res


def solve_lp(problem: AllocateProblem, *, time_limit: float = 60.0, solver: str = "cbc", seed: int = 0, **_kw) -> Result:
    """The optimal split of the fixed partition (one LP per stage, closed form).

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.AllocateProblem`.
    time_limit, solver, seed
        Unused; accepted for the common signature.

    Returns
    -------
    Result
        Status ``OPTIMAL`` in the split space of the fixed partition (``lower_bound`` =
        objective); ``info["sequential_objective"]`` is the same plan without the split and
        ``info["gain_over_sequential"]`` their ratio.
    """
    res = _run(problem, "lp", "split", Status.OPTIMAL, "split")
    res.lower_bound = res.objective
    return res


def theorem(problem: AllocateProblem, *, time_limit: float = 60.0, solver: str = "cbc", seed: int = 0, **_kw) -> Result:
    """Duan & Wu's closed-form split beta_k = c/(c+1) on the fixed partition (FEASIBLE, space ``"split"``)."""
    return _run(problem, "theorem", "theorem", Status.FEASIBLE, "split")


def sequential(problem: AllocateProblem, *, time_limit: float = 60.0, solver: str = "cbc", seed: int = 0, **_kw) -> Result:
    """The fixed partition without the split (FEASIBLE, space ``"sequential"``)."""
    return _run(problem, "sequential", "sequential", Status.FEASIBLE, "sequential")
