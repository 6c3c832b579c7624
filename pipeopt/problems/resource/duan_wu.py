"""Duan & Wu's heuristics: binary-search partition, two steps, Algorithm 2; and round-robin.

* :func:`bisection_partition` - the paper's partition step: binary search on the bottleneck
  T; a limit T is checked greedily (each stage takes as many units as fit under T on its
  worker and ends at a cut whose transfer also fits); a plan with fewer stages than workers
  gets its missing cuts where they cost least
  (:func:`pipeopt.backends.bisection.complete_stages`, later stages moving to later
  workers). The same generic core (:mod:`pipeopt.backends.bisection`) as
  :func:`pipeopt.problems.partition.binary_search.binary_search` (single-kind identical
  workers), with this problem's stage time (:class:`~pipeopt.problems.resource.problem.WorkerStages`):
  multi-kind, split or sequential, any workers. The greedy check is exact for monotone
  stage costs without communication; with transfers (cuts are not monotone) it is a heuristic.
* :func:`two_step` - joint problem baseline: partition by binary search on the *sequential*
  stage time (step 1 knows the layers' costs, not the split), then the optimal split of
  each stage (step 2, the allocation LP).
* :func:`algorithm2` - group problem baseline (the paper's Algorithm 2), then the same two
  steps on the workers it forms.
* :func:`algorithm2_staged` - the stage-aware reading of Algorithm 2 (a second baseline):
  grouping and partition iterated to a fixed point, each worker costed on its own stage.
* :func:`round_robin` - devices sorted by speed dealt round robin, then the same two steps.

Which stage a worker runs: the reading of p_i
----------------------------------------------
Algorithm 2 grows each worker greedily by its cost ``max{f_i, g_i}``, the forward and
backward time of p_i, the work the worker runs, on the worker's pooled resources. The
grouping comes *before* the partition, so the paper leaves open which work p_i is. pipeopt
offers both readings, each a baseline of the group problem:

* ``algorithm2`` (:func:`worker_cost`): p_i is the **average stage**, 1/q of every layer's
  forward and backward work, the same for every worker (the grouping knows no partition);
  the workers are then ordered by decreasing memory and partitioned once.
* ``algorithm2_staged`` (:func:`staged_groups`): p_i is **worker i's own stage** of a
  partition: start from the first reading's workers, partition by binary search, regroup with
  each worker costed on the stage it was assigned, partition again, ... until a grouping
  repeats (a fixed point or a cycle) or :data:`STAGED_ROUNDS` rounds; the best plan by
  :func:`pipeopt.evaluate`'s objective is kept.

Both are heuristics: status ``FEASIBLE`` (``INFEASIBLE`` if the plan breaks memory), no lower
bound, and their gaps are measured like any baseline's.

References
----------
Duan, Y. and Wu, J., *Optimizing Resource Allocation in Pipeline Parallelism for Distributed
DNN Training*, ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029.
"""

from __future__ import annotations

import math

from ...backends.bisection import bisect_limit, bottleneck, complete_stages, greedy_starts
from ...backends.deadline import Deadline
from ...cost import evaluate
from ...result import Result, Status
from .problem import GroupProblem, JointProblem, ResourceProblem, WorkerStages
from .split import best_split, sequential_time

STAGED_ROUNDS = 20
"""Most group -> partition rounds of :func:`algorithm2_staged` (a repeated grouping stops it sooner)."""


def bisection_partition(problem: ResourceProblem, groups: list, mode: str = "sequential",
                        rel_tol: float = 1e-9, deadline: Deadline | None = None) -> tuple[list[int], float]:
    """Duan & Wu's binary-search partition of the chain over fixed workers.

    The generic core (:mod:`pipeopt.backends.bisection`) with this problem's stage time:
    greedy check of a limit T (stage t, on worker ``groups[t]``, extends to the farthest end
    whose compute and memory fit T and whose cut transfer fits T), bisection on T between 0
    and the bottleneck of the plan the greedy makes at T = inf, and completion of a plan with
    fewer stages (cheapest extra cuts, later stages moving to later workers). Every accepted
    plan is completed and the one of smallest bottleneck is kept.

    Parameters
    ----------
    problem
        A joint, group or allocate problem (its chain, memory and transfers).
    groups
        ``list[tuple[str, ...]]``: device names of the worker of each stage, in pipeline order.
    mode
        Stage time the search balances: ``"sequential"`` (the paper's first step, before
        any allocation) or ``"split"`` (optimal split per stage).
    rel_tol
        Stop when the bracket ``[lo, hi]`` on T is this narrow (relative).
    deadline
        No bisection step starts after it (:class:`~pipeopt.backends.deadline.Deadline`); the
        best plan accepted so far is kept.

    Returns
    -------
    (starts, value)
        Unit index where each stage after the first begins, and the plan's bottleneck under
        ``mode`` in seconds per microbatch (``inf`` if even the greedy at T = inf breaks
        memory; then the stages have equal unit counts).

    References
    ----------
    Duan & Wu, ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029.
    """
    n, S = problem.n, len(groups)
    stages = WorkerStages(problem, groups, mode)

    def check(T):
        return greedy_starts(n, S, stages.time, T, bound=stages.fit)

    completed: dict = {}

    def complete(st):
        key = tuple(st)
        if key not in completed:
            full = complete_stages(n, S, stages.time, st, insert="shift")
            completed[key] = (full, bottleneck(n, stages.time, full))
        return completed[key]

    starts = check(math.inf)
    if starts is None:  # nothing fits memory greedily: equal unit counts, scored as they are
        starts = [round(n * s / S) for s in range(1, S)]
        return starts, problem.plan_value(starts, groups, mode)
    hi = complete(starts)[1]
    if not math.isfinite(hi):
        return complete(starts)
    found = bisect_limit(check, 0.0, hi, starts, rel_tol=rel_tol, deadline=deadline, score=lambda st: complete(st)[1])
    return complete(found.starts)


def _two_step_result(problem: ResourceProblem, method: str, groups: list, deadline: Deadline) -> Result:
    starts, value = bisection_partition(problem, groups, mode="sequential", deadline=deadline)
    plan = problem.plan(starts, groups, "split")
    info = {"partition_bottleneck_sequential": value}
    return problem.result(method, plan, Status.FEASIBLE, started=deadline.started, space="split", info=info)


def two_step(problem: JointProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
             threads: int = 2) -> Result:
    """Duan & Wu's two steps on identical workers: binary-search partition, then the LP split.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.JointProblem`.
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline`: the bisection
        stops at it (a fast heuristic; it rarely matters).
    solver, seed, threads
        Unused; accepted for the common method signature.

    Returns
    -------
    Result
        Status ``FEASIBLE`` (``INFEASIBLE`` if its plan breaks memory), space ``"split"``.
    """
    return _two_step_result(problem, "two_step", problem.groups, Deadline.of(time_limit))


def _model_load(problem: ResourceProblem) -> tuple[dict, dict]:
    return problem.load(0, problem.n)


def worker_cost(problem: GroupProblem, res: dict) -> float:
    """Algorithm 2's cost of a worker with pooled resources ``res``: ``max{f, g}``, p_i read
    as the **average stage** (``algorithm2``; the module docstring compares the readings).

    ``f`` and ``g`` are the forward and the backward time (seconds) of an average stage -
    1/q of every layer's forward and backward work, q the number of workers - on the
    worker's forward and backward shares, with the shares chosen optimally (the allocation
    LP). Every worker is costed on the same work, whatever stage it will run. An empty worker
    costs ``inf``.
    """
    if not res:
        return math.inf
    F, B = _model_load(problem)
    q = problem.num_stages
    return best_split(res, {k: v / q for k, v in F.items()}, {k: v / q for k, v in B.items()})[1]


def algorithm2_groups(problem: GroupProblem) -> list[tuple]:
    """Duan & Wu's Algorithm 2: greedy grouping of heterogeneous devices into q workers.

    Start with q empty workers. While devices remain: take the worker of largest cost
    (:func:`worker_cost`; ties: an empty worker, then the lowest index) and give it the
    remaining device that lowers its cost most (ties: cluster order). An empty worker costs
    ``inf``, and so does one whose devices cannot run some layer; the tie rule gives every
    worker a device before any gets a second one while all costs are infinite, so no worker
    stays empty (q <= devices). Workers are then ordered by decreasing memory
    (stage 0 keeps the most microbatches in flight; ties keep the creation order).

    Returns
    -------
    list[tuple[str, ...]]
        Device names of each worker, in pipeline order.
    """
    groups = _greedy_groups(problem, lambda w, res: worker_cost(problem, res))
    order = sorted(range(len(groups)), key=lambda w: (-problem.capacity(groups[w]), w))
    return [groups[w] for w in order]


def _greedy_groups(problem: GroupProblem, cost) -> list[tuple]:
    """Algorithm 2's greedy: while devices remain, the worker of largest ``cost(w, pooled)``
    (ties: an empty worker, then the lowest index) gets the remaining device that lowers its
    cost most (ties: cluster order). Workers in creation order (worker w = index w)."""
    devices = list(problem.instance.cluster.devices)
    q = problem.num_stages
    groups: list[list] = [[] for _ in range(q)]
    pooled: list[dict] = [{} for _ in range(q)]
    remaining = list(range(len(devices)))
    while remaining:
        costs = [cost(w, pooled[w]) if groups[w] else math.inf for w in range(q)]
        w = max(range(q), key=lambda i: (costs[i], not groups[i], -i))  # among infinite costs, empty first
        best = None
        for d in remaining:
            res = dict(pooled[w])
            for k, r in devices[d].resources.items():
                res[k] = res.get(k, 0.0) + r
            c = cost(w, res)
            if best is None or c < best[0]:
                best = (c, d, res)
        _, d, res = best
        groups[w].append(devices[d].name)
        pooled[w] = res
        remaining.remove(d)
    return [tuple(g) for g in groups]


def staged_cost(problem: GroupProblem, starts, stage: int, res: dict) -> float:
    """Algorithm 2's cost ``max{f, g}`` of a worker with pooled resources ``res``, p_i read as
    **its own stage** ``stage`` of the partition ``starts`` (the stage-aware reading): the
    stage's forward and backward time with the optimal split (the allocation LP), seconds.
    An empty worker costs ``inf``."""
    if not res:
        return math.inf
    bounds = [0, *[int(c) for c in starts], problem.n]
    F, B = problem.load(bounds[stage], bounds[stage + 1])
    return best_split(res, F, B)[1]


def staged_groups(problem: GroupProblem, starts) -> list[tuple]:
    """Algorithm 2's greedy grouping with worker i costed on stage i of the partition
    ``starts`` (:func:`staged_cost`); worker i runs stage i (no reordering).

    Returns
    -------
    list[tuple[str, ...]]
        Device names of each worker, in pipeline order.
    """
    return _greedy_groups(problem, lambda w, res: staged_cost(problem, starts, w, res))


def round_robin_groups(problem: GroupProblem) -> list[tuple]:
    """Devices sorted by speed (descending; speed = 1 / sequential time of the whole model
    on the device) dealt round robin to the q workers (device i of the order to worker i mod q)."""
    F, B = _model_load(problem)
    devices = sorted(problem.instance.cluster.devices, key=lambda d: sequential_time(d.resources, F, B))
    q = problem.num_stages
    return [tuple(d.name for d in devices[w::q]) for w in range(q)]


def algorithm2(problem: GroupProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
               threads: int = 2) -> Result:
    """Duan & Wu's Algorithm 2 grouping, then the binary-search partition and the LP split.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.GroupProblem`.
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline` (bounds the
        partition's bisection).
    solver, seed, threads
        Unused; accepted for the common method signature.

    Returns
    -------
    Result
        Status ``FEASIBLE`` (``INFEASIBLE`` if its plan breaks memory), space ``"split"``.
    """
    deadline = Deadline.of(time_limit)
    return _two_step_result(problem, "algorithm2", algorithm2_groups(problem), deadline)


def round_robin(problem: GroupProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
                threads: int = 2) -> Result:
    """Devices dealt round robin by speed (:func:`round_robin_groups`), then the binary-search
    partition and the LP split. Status ``FEASIBLE``, space ``"split"``; arguments as
    :func:`algorithm2`."""
    deadline = Deadline.of(time_limit)
    return _two_step_result(problem, "round_robin", round_robin_groups(problem), deadline)


def algorithm2_staged(problem: GroupProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc",
                      seed: int = 0, threads: int = 2, rounds: int = STAGED_ROUNDS) -> Result:
    """Algorithm 2 with p_i read as each worker's own stage: grouping and partition iterated
    to a fixed point (a second baseline; the module docstring compares the readings).

    Round 0 groups as :func:`algorithm2_groups` (average stage) and partitions by binary
    search (:func:`bisection_partition` on the sequential stage time, the paper's first step);
    every later round regroups with each worker costed on the stage the last partition gave
    it (:func:`staged_groups`) and partitions again. It stops when a grouping repeats (a fixed
    point, or a cycle), after ``rounds`` rounds, or at the deadline, and keeps the best plan
    (each with the LP split per stage) by :func:`pipeopt.evaluate`'s objective (plans that
    fit memory first, ties: the earlier round).

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.GroupProblem`.
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline`: no round starts
        after it (round 0 always runs).
    solver, seed, threads
        Unused; accepted for the common method signature.
    rounds
        Most regroupings after round 0 (>= 0).

    Returns
    -------
    Result
        Status ``FEASIBLE`` (``INFEASIBLE`` if its plan breaks memory), space ``"split"``, no
        lower bound. ``info``: ``rounds`` (regroupings made), ``fixed_point`` (the last
        grouping repeated the one before it), ``cycle`` (it repeated an earlier one),
        ``objectives`` (per round), ``best_round``.

    References
    ----------
    Duan & Wu, ICPADS 2022, Algorithm 2; the stage-aware reading of its p_i is pipeopt's.
    """
    deadline = Deadline.of(time_limit)
    groups = algorithm2_groups(problem)
    seen: list = []
    objectives: list = []
    best = None
    fixed = cycle = False
    for r in range(rounds + 1):
        if r and deadline.expired():
            break
        key = tuple(groups)
        if key in seen:
            fixed, cycle = key == seen[-1], key != seen[-1]
            break
        seen.append(key)
        starts, _ = bisection_partition(problem, groups, mode="sequential", deadline=deadline)
        plan = problem.plan(starts, groups, "split")
        ev = evaluate(problem.instance, plan)
        objectives.append(ev.objective)
        if best is None or (not ev.feasible, ev.objective) < (not best[2], best[1]):
            best = (plan, ev.objective, ev.feasible, r)
        groups = staged_groups(problem, starts)
    info = {"rounds": len(seen) - 1, "fixed_point": fixed, "cycle": cycle, "objectives": objectives,
            "best_round": best[3], "reading": "p_i = the worker's own stage of the last partition"}
    return problem.result("algorithm2_staged", best[0], Status.FEASIBLE, started=deadline.started, space="split",
                          info=info)
