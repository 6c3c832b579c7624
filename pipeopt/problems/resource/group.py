"""Exact grouping of heterogeneous devices into workers, with the partition and the split.

The objective is evaluate's ``bottleneck``: the 1F1B steady period with its window rows, every
stage in split execution (``2 (S - s)`` microbatches in flight) with the shares of least
period (:meth:`~pipeopt.problems.resource.ResourceProblem.period`). Two exact methods for
:class:`~pipeopt.problems.resource.GroupProblem`, both a model at a fixed limit T bisected on
T (:mod:`pipeopt.problems.resource.search`); identical devices are counted, not named, to
break their symmetry; worker s runs stage s, so workers are not interchangeable:

* :func:`solve_milp` - the MILP of :mod:`pipeopt.problems.resource.formulation`
  (device-to-worker counts ``n``, unit-to-stage binaries ``x``, per-stage work fractions
  per resource kind, products linearised exactly), PuLP door (CBC or HiGHS).
* :func:`solve_cpsat` - CP-SAT over stage intervals, whose split feasibility on the worker's
  devices is linear by LP duality (:mod:`pipeopt.problems.resource.intervals`).

Both hold the stages' own rows and relax the window rows (busy-time variables bounded below
by supporting planes linear in the worker's devices, added where a plan breaks a row); every
plan is checked exactly (:func:`~pipeopt.problems.resource.search.certify`), so a feasible
answer passes T and an infeasible one is a proof. Both start from the better of Algorithm 2
and round-robin when one of them fits memory, and otherwise from a limit every plan that
fits passes (no feasible start needed). Bound: the largest T proven infeasible. ``OPTIMAL``
means optimal *within a relative gap of 1e-4*
(:data:`pipeopt.problems.resource.search.MIN_REL_GAP`); a limit a probe cannot settle (after
its repairs, or out of time) leaves status ``FEASIBLE`` or ``TIME_LIMIT`` with a valid bound.
Once optimal, both break ties the same way: among the plans of the proven period, one of least
latency of a microbatch, over every grouping (:mod:`pipeopt.problems.resource.tiebreak`,
``info["secondary"]``).

References
----------
Duan, Y. and Wu, J., *Optimizing Resource Allocation in Pipeline Parallelism for Distributed
DNN Training*, ICPADS 2022 (the problem; Algorithm 2 is their heuristic).
"""

from __future__ import annotations

from ...backends.deadline import Deadline
from ...result import Result
from .duan_wu import algorithm2_groups, bisection_partition, round_robin_groups
from .formulation import MilpProbe
from .intervals import IntervalProbe
from .local import improve_best
from .problem import GroupProblem
from .search import exact_search


LOCAL_SHARE = 0.2
"""Share of the time the local search (:func:`~pipeopt.problems.resource.local.improve`) may use
to improve the better of the two heuristic starts (GPT-2 XL over 64 devices of 4 kinds into 16
workers: 4-12 CPU seconds to its local optimum)."""


def _starts(problem: GroupProblem):
    """The exact methods' heuristic starts: Algorithm 2's and round-robin's groupings, each with
    the binary-search partition on the split time, then the better of them improved by the local
    search over groupings (:mod:`.local`, at most :data:`LOCAL_SHARE` of the time)."""

    def starts(deadline: Deadline) -> list[tuple]:
        out = []
        for groups in (algorithm2_groups(problem), round_robin_groups(problem)):
            found, _ = bisection_partition(problem, groups, mode="split", deadline=deadline)
            out.append((found, groups))
        return out + improve_best(problem, out, deadline.sub(fraction=LOCAL_SHARE))

    return starts


def solve_milp(problem: GroupProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
               threads: int = 2) -> Result:
    """Exact grouping + partition + split by MILP at fixed T, bisected on T.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.GroupProblem`.
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline`, for everything
        (bounds, starts, every bisection step).
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
        none) and the proven bound; each stage's devices and forward shares in the plan.

    Raises
    ------
    InfeasibleError
        If the MILP proved that no plan fits memory.
    """
    deadline = Deadline.of(time_limit)
    return exact_search(problem, "milp", MilpProbe(problem, solver=solver, seed=seed), deadline, _starts(problem),
                        {"solver": solver, "bound": "largest T the MILP proved infeasible"})


def solve_cpsat(problem: GroupProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
                threads: int = 2) -> Result:
    """Exact grouping + partition + split by CP-SAT over stage intervals, bisected on T.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.GroupProblem`.
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
        If CP-SAT proved that no plan fits memory.
    """
    deadline = Deadline.of(time_limit)
    return exact_search(problem, "cpsat", IntervalProbe(problem, threads=threads, seed=seed), deadline,
                        _starts(problem), {"solver": "cp-sat", "bound": "largest T CP-SAT proved infeasible"})
