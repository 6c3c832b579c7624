"""Exact joint partition and forward/backward split on identical multi-resource workers.

The objective is evaluate's ``bottleneck``: the 1F1B steady period with its window rows, every
stage in split execution (``2 (S - s)`` microbatches in flight) with the shares of least
period (:meth:`~pipeopt.problems.resource.ResourceProblem.period`). Three exact methods for
:class:`~pipeopt.problems.resource.JointProblem`, each a probe at a trial period T bisected on
T (:mod:`pipeopt.problems.resource.search`):

* :func:`solve_dp` - the chain DP at T (:class:`~pipeopt.problems.resource.problem.ChainProbe`):
  each unit range takes its least busy time ``f + b`` with both passes within T (closed form,
  :func:`~pipeopt.problems.resource.split.least_busy`), and the least window slack per
  (stage, end unit) is kept - exact; O(S n^2) per probe, bisected down to a relative gap of
  :data:`~pipeopt.problems.resource.problem.CHAIN_REL_TOL`.
* :func:`solve_milp` - the MILP of :mod:`pipeopt.problems.resource.formulation` at T (the
  stages' own rows exactly, the window rows over busy-time variables with the exact busy
  times added as cuts where a plan breaks a row), bisected on T.
* :func:`solve_cpsat` - CP-SAT at T over stage starts (each range's split time checked
  exactly beforehand, the window rows as in the MILP; :mod:`pipeopt.problems.resource.intervals`),
  bisected on T.

Every plan a probe returns is checked exactly (:func:`~pipeopt.problems.resource.search.certify`),
and the bound is the largest T a probe proved infeasible. The MILP and CP-SAT report
``OPTIMAL`` *within a relative gap of 1e-4* (:data:`pipeopt.problems.resource.search.MIN_REL_GAP`),
the DP within 1e-12; a probe that cannot settle its T leaves status ``FEASIBLE`` (or
``TIME_LIMIT``) with a valid bound. Once optimal, all three break ties the same way: among the
plans of the proven period, one of least latency of a microbatch
(:mod:`pipeopt.problems.resource.tiebreak`, ``info["secondary"]``).

References
----------
Duan, Y. and Wu, J., *Optimizing Resource Allocation in Pipeline Parallelism for Distributed
DNN Training*, ICPADS 2022 (the model; they solve it in two heuristic steps).
"""

from __future__ import annotations

from ...backends.bisection import FEASIBLE, Probe
from ...backends.deadline import Deadline
from ...result import Result
from .duan_wu import bisection_partition
from .formulation import MilpProbe
from .intervals import IntervalProbe
from .problem import CHAIN_REL_TOL, ChainProbe, JointProblem
from .search import exact_search


def _starts(problem: JointProblem):
    """The exact methods' heuristic start: Duan & Wu's binary-search partition on the split time."""

    def starts(deadline: Deadline) -> list[tuple]:
        found, _ = bisection_partition(problem, problem.groups, mode="split", deadline=deadline)
        return [(found, problem.groups)]

    return starts


def solve_dp(problem: JointProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
             threads: int = 2) -> Result:
    """Exact joint optimum by the chain DP at a trial period T, bisected on T.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.JointProblem`.
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline` (bounds, start,
        every probe; the DP checks it once per stage).
    solver, seed, threads
        Unused; accepted for the common signature.

    Returns
    -------
    Result
        Status ``OPTIMAL`` within a relative gap of
        :data:`~pipeopt.problems.resource.problem.CHAIN_REL_TOL` (``lower_bound``: the largest
        T the DP proved infeasible), space ``"split"``; at the deadline ``TIME_LIMIT`` with the
        best plan found (the binary-search start if nothing better) and the bound.

    Raises
    ------
    InfeasibleError
        If no split fits the workers' memory (the DP proved it at a limit every split that
        fits passes).
    """
    deadline = Deadline.of(time_limit)
    chain = ChainProbe(problem, problem.groups, "split")

    def probe(T: float, step: Deadline | None) -> Probe:
        out = chain(T, step)
        return Probe(FEASIBLE, (out.plan, problem.groups), out.value) if out.outcome == FEASIBLE else out

    return exact_search(problem, "dp", probe, deadline, _starts(problem),
                        {"bound": "largest T the chain DP proved infeasible"}, rel_tol=CHAIN_REL_TOL)


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
