"""Framework-default partitions: equal layer counts, balanced parameters, balanced time.

These are what users of DeepSpeed and torchgpipe get without a planner. Each splits the units
of :attr:`pipeopt.instance.Instance.chain` into exactly S contiguous non-empty stages, one
worker each (one-order space), and is scored by :func:`pipeopt.evaluate`, which counts what
these methods ignore (communication, memory, the 1F1B in-flight activations).

* :func:`uniform` -- DeepSpeed ``partition_method="uniform"`` (``partition_uniform``): n // S
  units per stage, the first n mod S stages one more.
* :func:`param_balanced` -- DeepSpeed ``partition_method="parameters"``: its
  ``partition_balanced`` on per-unit parameter counts, a DP that minimises the *spread* (the
  heaviest minus the lightest stage), ties going to the latest cut.
* :func:`time_balanced` -- torchgpipe ``balance_by_time``: the block-partition algorithm of
  Barany et al. (``torchgpipe/balance/blockpartition.py``) on per-unit times.

References
----------
DeepSpeed, ``deepspeed/runtime/utils.py`` (``partition_uniform``, ``partition_balanced``) and
``deepspeed/runtime/pipe/module.py`` (``PipelineModule._partition_layers``),
github.com/microsoft/DeepSpeed (Apache-2.0).
C. Kim, H. Lee, M. Jeong, W. Baek, B. Yoon, I. Kim, S. Lim, S. Kim. torchgpipe: On-the-fly
Pipeline Parallelism for Training Giant Models. arXiv:2004.09910, 2020;
github.com/kakaobrain/torchgpipe, ``torchgpipe/balance/`` (BSD-3-Clause).
I. Barany, V. S. Grinberg. Block Partitions of Sequences. Israel J. Math. 206, 2015,
arXiv:1308.2452.
"""

from __future__ import annotations

import numpy as np

from ...backends.deadline import Deadline
from ...errors import InvalidProblemError
from ...result import Result, Status
from .. import spaces
from .binary_search import split_to_stages
from .problem import PartitionProblem


# ---------------------------------------------------------------------------------------
# The frameworks' splitting rules, on plain sequences (return stage boundaries [0, ..., n])
# ---------------------------------------------------------------------------------------
def uniform_parts(n: int, parts: int) -> list[int]:
    """DeepSpeed's ``partition_uniform``: boundaries of ``parts`` runs of n items.

    Parameters
    ----------
    n
        Number of items (units).
    parts
        Number of runs, 1 <= parts <= n.

    Returns
    -------
    list[int]
        ``parts + 1`` boundaries from 0 to n; the first ``n % parts`` runs hold one item more.

    Examples
    --------
    >>> uniform_parts(7, 3)
    [0, 3, 5, 7]
    """
    _check(n, parts)
    size, extra = divmod(n, parts)
    return [p * size + min(p, extra) for p in range(parts + 1)]


def spread_balanced_parts(weights, parts: int) -> list[int]:
    """DeepSpeed's ``partition_balanced``: the split minimising max - min of the run sums.

    A DP over (items, runs) (the "linear partition" DP DeepSpeed cites); among cut positions of
    equal spread the latest wins, as in DeepSpeed's ``>=`` comparison.

    Parameters
    ----------
    weights
        ``array (n,)``, non-negative weights (DeepSpeed: parameter counts per layer).
    parts
        Number of runs, 1 <= parts <= n.

    Returns
    -------
    list[int]
        ``parts + 1`` boundaries from 0 to n, every run non-empty.
    """
    w = np.asarray(weights, dtype=float)
    n = len(w)
    _check(n, parts)
    if n == parts:
        return uniform_parts(n, parts)
    prefix = np.concatenate([[0.0], np.cumsum(w)])
    dp_max = np.full((n + 1, parts + 1), np.inf)
    dp_min = np.full((n + 1, parts + 1), np.inf)
    position = np.zeros((n + 1, parts + 1), dtype=int)
    dp_max[0, 0] = 0.0
    for i in range(1, n + 1):
        run = prefix[i] - prefix[:i]  # sum of items k .. i-1 for k = 0 .. i-1
        for j in range(1, min(i, parts) + 1):
            hi = np.maximum(dp_max[:i, j - 1], run)
            lo = np.minimum(dp_min[:i, j - 1], run)
            cost = hi - lo
            k = i - 1 - int(np.argmin(cost[::-1]))  # the latest k of least spread
            dp_max[i, j], dp_min[i, j], position[i, j] = hi[k], lo[k], k
    bounds = [n]
    for j in range(parts, 0, -1):
        bounds.append(int(position[bounds[-1], j]))
    return bounds[::-1]


def block_parts(weights, parts: int) -> list[int]:
    """torchgpipe's ``blockpartition.solve``: Barany et al.'s block-partition algorithm.

    Weights are normalised to [0, 1] (``(x - min) / (max - min)``); the split starts from
    ``n // parts`` items per block (the last block takes the rest) and moves one boundary
    item at a time from the block next to a lightest block towards it, until the heaviest
    block is at most the lightest plus 1 (one normalised item).

    Parameters
    ----------
    weights
        ``array (n,)``, non-negative weights (torchgpipe: measured times per layer).
    parts
        Number of blocks, 1 <= parts <= n.

    Returns
    -------
    list[int]
        ``parts + 1`` boundaries from 0 to n. As in torchgpipe, a block may end up empty and
        the boundaries may even decrease (torchgpipe then drops or repeats layers: its
        ``[sequence[i:j] ...]`` slices), e.g. ``block_parts([0, 0, 10, 1, 0], 3) == [0, 3, 3, 5]``;
        callers must repair that. Where torchgpipe's loop never ends (it can cycle, e.g. on
        GNMT's profile in 16 blocks) the boundaries at the first repeated state are returned;
        :func:`block_partition` says whether that happened.
    """
    return block_partition(weights, parts)[0]


def block_partition(weights, parts: int) -> tuple[list[int], bool]:
    """:func:`block_parts` and whether torchgpipe's loop terminated (``False``: it cycles).

    The moves are deterministic, so a repeated (boundaries, heaviest block, its size) state at
    the top of the inner loop means torchgpipe would loop forever; the search stops there. It
    also stops if a boundary leaves [0, n] (torchgpipe's slices would then wrap around or
    clamp). The states are then finite, so the search terminates.

    Returns
    -------
    (list[int], bool)
        The boundaries and ``True`` if the algorithm reached its stopping rule.

    Raises
    ------
    InvalidProblemError
        If not 1 <= parts <= n.
    """
    seq = [float(x) for x in np.asarray(weights, dtype=float)]
    n = len(seq)
    _check(n, parts)
    # the same float arithmetic as torchgpipe (a prefix sum would round differently and
    # change its "max <= min + 1" stopping test)
    low = min(seq)
    span = max(seq) - low
    norm = [0.0] * n if span == 0 else [(x - low) / span for x in seq]
    splits = [n // parts * (x + 1) for x in range(parts - 1)] + [n]

    def sizes() -> list[float]:  # torchgpipe's block_size: sum(normal_sequence[start:stop])
        return [sum(norm[a:b]) for a, b in zip([0, *splits[:-1]], splits, strict=True)]

    seen: set = set()
    while True:
        # (1) p: a heaviest block (ties: the last index, as Python's max over (size, i))
        size = sizes()
        p = max(range(parts), key=lambda i: (size[i], i))
        max_size = size[p]
        while True:
            state = (tuple(splits), p, max_size)
            if state in seen:  # a cycle: torchgpipe would never stop
                return [0, *splits], False
            seen.add(state)
            size = sizes()
            q = min(range(parts), key=lambda i: (size[i], i))  # (2) a lightest block
            if max_size <= size[q] + 1:
                return [0, *splits], True
            # (3) move one item from the neighbour h of q (towards p) into q
            if p < q:
                h = q - 1
                splits[h] -= 1
            else:
                h = q + 1
                splits[q] += 1
            if not 0 <= splits[min(h, q)] <= n:  # a boundary left the sequence
                return [0, *splits], False
            if p == h:
                break


def _check(n: int, parts: int) -> None:
    if not 1 <= parts <= n:
        raise InvalidProblemError(f"cannot split {n} units into {parts} non-empty stages")


# ---------------------------------------------------------------------------------------
# Methods
# ---------------------------------------------------------------------------------------
def _result(problem: PartitionProblem, name: str, bounds: list[int], started: float, info: dict) -> Result:
    """Repair empty stages (drop them, then split the cheapest way back to S) and score."""
    starts = sorted({b for b in bounds[1:-1] if 0 < b < problem.n})
    repaired = len(starts) + 1 < problem.stages
    if repaired:
        starts = split_to_stages(problem, starts)
    info = {**info, "repaired_empty_stages": repaired}
    plan = problem.plan(starts)
    return problem.result(name, plan, Status.FEASIBLE, started=started, space=spaces.ONE_ORDER, info=info)


def uniform(
    problem: PartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
    threads: int = 2,
) -> Result:
    """Equal unit counts per stage (DeepSpeed ``partition_method="uniform"``).

    Parameters
    ----------
    problem
        The partition problem (S stages over its n units).
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline`: only the clock
        of ``runtime`` (the split takes no time worth limiting).
    solver, seed, threads
        Unused (the common method signature).

    Returns
    -------
    Result
        Status ``FEASIBLE`` (``INFEASIBLE`` if the plan breaks memory), no lower bound,
        space ``"one-order"``; ``info["units_per_stage"]``.

    References
    ----------
    DeepSpeed ``deepspeed/runtime/utils.py``, ``partition_uniform``.
    """
    started = Deadline.of(time_limit).started
    bounds = uniform_parts(problem.n, problem.stages)
    return _result(problem, "uniform", bounds, started, {"units_per_stage": list(np.diff(bounds).tolist())})


def param_balanced(
    problem: PartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
    threads: int = 2,
) -> Result:
    """Parameter-balanced stages (DeepSpeed ``partition_method="parameters"``).

    DeepSpeed's ``partition_balanced`` (:func:`spread_balanced_parts`) on the parameter bytes
    of each unit (proportional to DeepSpeed's parameter counts).

    Parameters
    ----------
    problem
        The partition problem.
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline`: only the clock
        of ``runtime`` (the split takes no time worth limiting).
    solver, seed, threads
        Unused (the common method signature).

    Returns
    -------
    Result
        Status ``FEASIBLE`` (``INFEASIBLE`` if the plan breaks memory), no lower bound,
        space ``"one-order"``; ``info["stage_param_bytes"]``.

    References
    ----------
    DeepSpeed ``deepspeed/runtime/pipe/module.py`` (``_partition_layers``, method
    ``"parameters"``) and ``deepspeed/runtime/utils.py`` (``partition_balanced``).
    """
    started = Deadline.of(time_limit).started
    bounds = spread_balanced_parts(problem.instance.chain.param, problem.stages)
    sums = np.diff(problem.param_prefix[bounds]).tolist()
    return _result(problem, "param_balanced", bounds, started, {"stage_param_bytes": sums})


def time_balanced(
    problem: PartitionProblem,
    *,
    time_limit: float | Deadline = 60.0,
    solver: str = "cbc",
    seed: int = 0,
    times: str = "work",
    threads: int = 2,
) -> Result:
    """Time-balanced stages (torchgpipe ``balance_by_time``).

    torchgpipe's block partition (:func:`block_parts`) on per-unit times. torchgpipe profiles
    each layer's forward pass only, in whole microseconds; here the weights are seconds
    (its normalisation makes the scale irrelevant) and by default the forward + backward
    time the stage actually spends.

    Parameters
    ----------
    problem
        The partition problem.
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline`: only the clock
        of ``runtime`` (the split takes no time worth limiting).
    solver, seed, threads
        Unused (the common method signature).
    times
        ``"work"`` (default: forward + backward seconds per unit on one worker) or
        ``"forward"`` (forward only, as torchgpipe's profiler measures).

    Returns
    -------
    Result
        Status ``FEASIBLE`` (``INFEASIBLE`` if the plan breaks memory), no lower bound, space
        ``"one-order"``. ``info["repaired_empty_stages"]`` is True if the algorithm left a
        block empty (torchgpipe would then fail) and the plan was split back to S stages;
        ``info["converged"]`` is False where torchgpipe's loop would never end (the plan is
        then the one at the first repeated state).

    Raises
    ------
    InvalidProblemError
        If ``times`` is not ``"work"`` or ``"forward"``.

    References
    ----------
    Kim et al., torchgpipe, arXiv:2004.09910; ``torchgpipe/balance/blockpartition.py``;
    Barany & Grinberg, Block Partitions of Sequences, arXiv:1308.2452.
    """
    started = Deadline.of(time_limit).started
    if times == "work":
        weights = problem.work
    elif times == "forward":
        r = problem.instance.cluster.devices[0].resources[problem.kind]
        weights = problem.instance.chain.fwd[problem.kind] / r
    else:
        raise InvalidProblemError(f"time_balanced: times must be 'work' or 'forward', got {times!r}")
    bounds, converged = block_partition(weights, problem.stages)
    return _result(problem, "time_balanced", bounds, started, {"times": times, "converged": converged})
