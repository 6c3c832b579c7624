"""Duan & Wu's binary-search partition (a heuristic), and the stage-time pieces the straight
baselines share.

A bottleneck limit T is easy to check: walk the units left to right and pack each stage as far
as its time stays <= T. Binary search on T then finds the smallest limit the greedy check
accepts (Duan & Wu 2022, section on partitioning). The check here uses pipeopt's stage time:
compute (F + B) on the worker, the transfers at the stage's two cuts (overlapped or not, as
the instance says) and the memory of stage t under 1F1B (S - t microbatches in flight).

It is a **heuristic**: with communication the stage time is not monotone in the stage's end
(a later cut may carry fewer bytes), and with memory the greedy's early packing decides the
in-flight counts of later stages, so the smallest T the greedy accepts can exceed the optimum
(the exact DP, :func:`pipeopt.problems.partition.dp.solve_dp`, is the reference). It reports status
``FEASIBLE`` and no lower bound.

The greedy check, the bisection and the completion to S stages are the generic core
:mod:`pipeopt.backends.bisection` (shared with the resource problems'
:func:`pipeopt.problems.resource.duan_wu.bisection_partition`); this module supplies the partition
stage time (:func:`straight_stage_time`) and the bounds on T.

References
----------
Duan, Y., Wu, J. Optimizing Resource Allocation in Pipeline Parallelism for Distributed DNN
Training. ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029.
"""

from __future__ import annotations

import math

from ...backends.bisection import bisect_limit, bottleneck, complete_stages, greedy_starts
from ...backends.deadline import Deadline
from ...result import Result, Status
from .. import spaces
from .problem import PartitionProblem


def straight_stage_time(problem: PartitionProblem, a, b, stage: int, *, memory: bool = True):
    """Time per microbatch of a one-worker stage of units ``a .. b-1`` at position ``stage``:
    :meth:`PartitionProblem.stage_time` with one replica and the stage's 1F1B in-flight count
    (:meth:`PartitionProblem.in_flight`). The bottleneck of a straight plan is at least the
    max of this over its stages; the 1F1B window rows can add to it (:func:`plan_time`).

    Parameters
    ----------
    problem
        The partition problem (S = ``problem.stages``).
    a, b
        First unit and end (exclusive) of the stage: ints or integer ``ndarray``s that
        broadcast together (vectorised).
    stage
        0-based position of the stage in a plan of S stages (it keeps S - stage
        microbatches' activations under 1F1B).
    memory
        If True, a stage that exceeds the worker's memory costs ``inf``.

    Returns
    -------
    ndarray
        Seconds, shaped like ``a`` and ``b`` broadcast.
    """
    return problem.stage_time(a, b, in_flight=problem.in_flight(stage), memory=memory)


def plan_time(problem: PartitionProblem, starts: list[int], *, memory: bool = True) -> float:
    """Bottleneck of the straight plan whose stages start at ``[0, *starts]``: its exact
    steady-state period (:meth:`PartitionProblem.period`, the window rows included), equal to
    :func:`pipeopt.evaluate`'s bottleneck of the same plan when it fits memory.

    Parameters
    ----------
    problem
        The partition problem.
    starts
        Unit index where each stage after the first begins (increasing).
    memory
        If True, a stage that exceeds memory (:func:`straight_stage_time` is ``inf``) makes the
        result ``inf``.

    Returns
    -------
    float
        Seconds per microbatch. At least the max of :func:`straight_stage_time` over the
        stages (the window rows can only add to it).
    """
    starts = [int(c) for c in starts]
    if memory and math.isinf(bottleneck(problem.n, _stage_time(problem, True), starts)):
        return math.inf
    return float(problem.period(starts))


def _stage_time(problem: PartitionProblem, memory: bool):
    """The partition problem's stage time in the core's form ``(stage, a, b) -> seconds``."""
    return lambda t, a, b: straight_stage_time(problem, a, b, t, memory=memory)


def split_to_stages(problem: PartitionProblem, starts: list[int], *, memory: bool = True) -> list[int]:
    """Add cuts to a straight partition plan until it has exactly ``problem.stages`` non-empty
    stages (the partition problem's adapter of :func:`pipeopt.backends.bisection.complete_stages`).

    Each added cut splits one stage into two; among all stages and cut positions it takes the
    one whose two halves have the smallest time (:func:`straight_stage_time`; ties: the
    leftmost). The other stages keep their positions and times: on identical workers a stage
    moved later only keeps fewer microbatches in flight, so its time cannot grow. Splitting
    never adds compute to a stage, but the new cut's transfer can exceed the old bottleneck:
    hence the choice of the cheapest cut. This is
    :func:`pipeopt.backends.bisection.complete_stages` with ``insert="within"``.

    Parameters
    ----------
    problem
        The partition problem.
    starts
        Unit index where each stage after the first begins (increasing, fewer than S
        stages; entries outside ``1 .. n-1`` and duplicates are dropped).
    memory
        Count the memory limit in the stage times.

    Returns
    -------
    list[int]
        The S - 1 stage starts.

    References
    ----------
    Duan & Wu, ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029.
    """
    return complete_stages(problem.n, problem.stages, _stage_time(problem, memory), starts, insert="within")


def greedy_check(problem: PartitionProblem, limit: float, *, memory: bool = True) -> list[int] | None:
    """Duan & Wu's feasibility check of a bottleneck limit.

    Walks the units left to right; stage t (0-based) extends to the farthest end whose stage
    time (:func:`straight_stage_time`, with stage t's 1F1B memory) is <= ``limit``
    (:func:`pipeopt.backends.bisection.greedy_starts`).

    Parameters
    ----------
    problem
        The partition problem.
    limit
        T, seconds.
    memory
        Count the memory limit.

    Returns
    -------
    list[int] or None
        The stage starts of a plan with at most S stages whose every stage time is <=
        ``limit``, or ``None`` if the greedy needs more than S stages.

    References
    ----------
    Duan & Wu, ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029.
    """
    return greedy_starts(problem.n, problem.stages, _stage_time(problem, memory), limit)


def binary_search(
    problem: PartitionProblem,
    *,
    time_limit: float | Deadline = 60.0,
    solver: str = "cbc",
    seed: int = 0,
    rel_tol: float = 1e-9,
    threads: int = 2,
) -> Result:
    """Duan & Wu's binary-search partition into exactly S straight stages (a heuristic).

    Bisects the bottleneck limit T between a lower bound (total work / S, the largest unit)
    and the time of the whole model on one stage plus the largest cut transfer, keeping the
    smallest T that :func:`greedy_check` accepts; the greedy plan at that T is then split
    (:func:`split_to_stages`) until it has exactly S stages. If no limit passes because of
    memory, the search is repeated without the memory limit and the plan is reported
    ``INFEASIBLE`` by :func:`pipeopt.evaluate`.

    Parameters
    ----------
    problem
        The partition problem (one-order space; ``replication`` is ignored).
    time_limit
        Seconds, or the solve's :class:`~pipeopt.backends.deadline.Deadline`; the bisection
        stops (with its best plan so far) when it passes.
    solver, seed, threads
        Unused (the common method signature).
    rel_tol
        Bisection stops when ``hi - lo <= rel_tol * hi``.

    Returns
    -------
    Result
        Status ``FEASIBLE`` (or ``INFEASIBLE`` if the plan breaks memory), no lower bound,
        space ``"one-order"``. ``info``: ``limit`` (the smallest accepted T, s), ``iterations``,
        ``greedy_stages`` (stages the greedy used before splitting), ``memory_fit``.

    References
    ----------
    Duan & Wu, ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029.
    """
    deadline = Deadline.of(time_limit)
    lo = problem.simple_lower_bound()
    # a stage time is at most its compute plus its two cuts: never above all the work plus the dearest cut
    hi = float(problem.work_prefix[-1] + problem.table.cut_time.max()) * (1 + 1e-12)
    memory = True
    best = greedy_check(problem, hi, memory=True)
    if best is None:  # even the loosest limit fails: the greedy cannot meet the memory limit
        memory = False
        best = greedy_check(problem, hi, memory=False)
    found = bisect_limit(lambda T: greedy_check(problem, T, memory=memory), lo, hi, best,
                         rel_tol=rel_tol, deadline=deadline)
    best, hi, iterations = found
    greedy_stages = len(best) + 1
    starts = split_to_stages(problem, best, memory=memory)
    plan = problem.plan(starts)
    info = {"limit": hi, "iterations": iterations, "greedy_stages": greedy_stages, "memory_fit": memory}
    return problem.result("binary_search", plan, Status.FEASIBLE, started=deadline.started,
                          space=spaces.ONE_ORDER, info=info)
