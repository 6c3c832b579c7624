"""Every rule of the cost model, written once (DESIGN.md, "The cost model").

:func:`pipeopt.evaluate` scores a plan with these rules; :class:`pipeopt.cost.CostTable`
tabulates them over the chain for the exact methods and baselines. No other module turns
bytes into seconds, counts microbatches in flight or compares memory with a capacity.

Units: seconds, bytes, bytes/s. Every function broadcasts over numpy arrays where its
arguments are numbers.

References
----------
Narayanan et al., PipeDream: Generalized Pipeline Parallelism for DNN Training, SOSP 2019
(1F1B, weight stashing, replication with all-reduce). Duan & Wu, Optimizing Resource
Allocation in Pipeline Parallelism for Distributed DNN Training, ICPADS 2022 (split execution).
"""

from __future__ import annotations

import math

import numpy as np

from ..graph import edge_bytes

MEMORY_SLACK = 1e-9
"""Relative slack on a memory capacity: a stage fits if ``memory <= capacity * (1 + 1e-9)``
(a stage that needs exactly its capacity fits whatever the float rounding of its sum,
whether it is summed layer by layer or taken as a difference of prefix sums)."""


# ---- workers ----
def pool(devices, replicas: int = 1) -> tuple[dict, float]:
    """Resources and memory of one replica of a worker made of ``devices``.

    Parameters
    ----------
    devices
        ``Iterable[Device]``: the worker's devices (all replicas).
    replicas
        m: the devices form m equal replicas (data parallelism).

    Returns
    -------
    (resources, memory)
        ``dict[kind, units]`` summed over the devices and divided by m; bytes, likewise.
    """
    res: dict = {}
    memory = 0.0
    for dev in devices:
        memory += dev.memory
        for k, r in dev.resources.items():
            res[k] = res.get(k, 0.0) + r / replicas
    return res, memory / replicas


# ---- compute ---------------------------------------------------------------------------------
def _rate(res: dict, times: dict) -> float:
    """Work rate (loads per second) of resources ``res`` on a load whose time per unit is ``times``."""
    rate = 0.0
    for k, r in res.items():
        if r <= 0:
            continue
        t = times.get(k, math.inf)
        if t == 0:
            return math.inf
        if math.isfinite(t):
            rate += r / t
    return rate


def load_time(res: dict, times: dict) -> float:
    """Seconds to run one load on pooled resources (linear separability: n units of a kind
    take 1/n of the time, kinds work in parallel on shares of the load).

    Parameters
    ----------
    res
        ``dict[kind, units]``.
    times
        ``dict[kind, seconds]``: the load's time on one unit of each kind (``inf``: cannot run).

    Returns
    -------
    float
        ``1 / sum_k res_k / times_k`` seconds; ``0`` for an empty load, ``inf`` if no kind can run it.
    """
    if all(t == 0 for t in times.values()):
        return 0.0
    rate = _rate(res, times)
    return 1.0 / rate if rate > 0 else math.inf


def stage_compute(res: dict, fwd: dict, bwd: dict, beta: dict | None) -> tuple[float, float, float]:
    """Forward time, backward time and stage time tau of one worker (one replica).

    Sequential execution (``beta is None``): forward then backward on all resources,
    ``tau = 1 / sum_k R_k / (F_k + B_k)``. Split execution (Duan & Wu): a share ``beta_k`` of
    kind k runs the forward pass, the rest the backward pass, concurrently on different
    microbatches: ``tau = max(forward, backward)``.

    Parameters
    ----------
    res
        ``dict[kind, units]``: the worker's pooled resources.
    fwd, bwd
        ``dict[kind, seconds]``: F_k and B_k, the stage's load on one unit of each kind.
    beta
        Forward share per kind in [0, 1] (split execution) or ``None`` (sequential).

    Returns
    -------
    (forward, backward, tau)
        Seconds: forward / backward pass alone (on its share, or on all resources if
        sequential), and the stage time per microbatch.
    """
    if beta is None:
        f = load_time(res, fwd)
        b = load_time(res, bwd)
        both = {k: fwd.get(k, math.inf) + bwd.get(k, math.inf) for k in set(fwd) | set(bwd)}
        return f, b, load_time(res, both)
    f = load_time({k: beta.get(k, 0.0) * r for k, r in res.items()}, fwd)
    b = load_time({k: (1.0 - beta.get(k, 0.0)) * r for k, r in res.items()}, bwd)
    return f, b, max(f, b)


# ---- communication ---------------------------------------------------------------------------
def transfer_time(nbytes, bandwidth: float, links=1):
    """Seconds to move ``nbytes`` over ``links`` parallel links of ``bandwidth`` bytes/s each."""
    return nbytes / (bandwidth * links)


def cut_time(forward_bytes, backward_bytes, bandwidth: float, links=1):
    """Seconds a cut is busy per microbatch: activations forward plus gradients back, over
    ``links = min(m, m')`` links between a stage on m replicas and one on m' (PipeDream)."""
    return transfer_time(forward_bytes + backward_bytes, bandwidth, links)


def allreduce_time(param_bytes, replicas, bandwidth: float):
    """Seconds of a ring all-reduce of ``param_bytes`` over ``replicas`` workers:
    ``2 (m - 1) / m * param_bytes / bandwidth`` (0 for one replica)."""
    return 2.0 * (replicas - 1) / replicas * transfer_time(param_bytes, bandwidth)


def replicated_time(tau, param_bytes, replicas, bandwidth: float):
    """Time per microbatch of a stage replicated on m workers (PipeDream): each replica runs
    every m-th microbatch and the weights are all-reduced, ``(tau + allreduce) / m``."""
    return (tau + allreduce_time(param_bytes, replicas, bandwidth)) / replicas


def crossing_bytes(graph, position: dict, count: int) -> np.ndarray:
    """Bytes that cross each boundary between consecutive positions ``0 .. count-1``.

    An edge ``u -> v`` with ``position[u] < position[v]`` carries its bytes (activations;
    the same amount of gradient goes back) across every boundary between the two.

    Parameters
    ----------
    graph
        The layer graph (edge attribute ``bytes``, default the tail's ``out_bytes``).
    position
        ``dict[node, int]``: a stage (or chain unit) index per layer.
    count
        Number of positions.

    Returns
    -------
    ndarray (count - 1,)
        Bytes per boundary; entry c is the boundary between positions c and c + 1.
    """
    diff = np.zeros(count + 1)
    for u, v in graph.edges:
        a, b = position[u], position[v]
        if a < b:
            w = edge_bytes(graph, u, v)
            diff[a] += w
            diff[b] -= w
    return np.cumsum(diff)[: max(count - 1, 0)]


def migration_bytes(act_bytes, param_bytes, microbatches: int):
    """Bytes per microbatch a layer moves when its forward and backward run on different
    stages (Bi-Partition): its stashed activation travels forward-stage -> backward-stage
    every microbatch, and its weights, updated where the backward runs, travel back once per
    iteration of M microbatches.

    Returns
    -------
    (along, back)
        Bytes per microbatch towards the backward stage, and back towards the forward stage.
    """
    return act_bytes, param_bytes / microbatches


# ---- memory ----------------------------------------------------------------------------------
def in_flight(stage: int, stages: int, *, workers_after=None, replicas=1, gpipe: bool = False,
              microbatches: int = 1):
    """Microbatches whose activations stage ``stage`` (0-based) keeps.

    1F1B: ``ceil(W / m)`` with W the workers of stages ``stage .. S-1`` and m the stage's
    replicas (``S - stage`` without replication); GPipe (fill-drain): all M microbatches.
    """
    if gpipe:
        return microbatches
    if workers_after is None:
        return stages - stage
    return -(-workers_after // replicas)


def weight_versions(in_flight_count, weight_stashing: bool):
    """Weight versions a stage keeps: one per microbatch in flight with weight stashing
    (PipeDream), else one."""
    return in_flight_count if weight_stashing else 1


def stage_memory(act_bytes, param_bytes, in_flight_count, versions):
    """Bytes a stage needs: ``in_flight * activations + versions * parameters``."""
    return in_flight_count * act_bytes + versions * param_bytes


def memory_limit(capacity):
    """The most bytes that fit ``capacity``: ``fits(m, c)`` is ``m <= memory_limit(c)``
    (:data:`MEMORY_SLACK` included; a linear model's memory row uses it as its right-hand side)."""
    return capacity * (1 + MEMORY_SLACK)


def fits(memory, capacity):
    """True where ``memory <= capacity`` up to :data:`MEMORY_SLACK` (``inf`` capacity: always)."""
    return memory <= memory_limit(capacity)
