"""Every rule of the cost model, written once (docs/cost-model.md).

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

import functools
import math

import numpy as np

from .arrays import layer_arrays
from .tolerance import SUM_ORDER

MEMORY_SLACK = SUM_ORDER
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
        ``1 / sum_k res_k / times_k`` seconds; ``0`` for an empty load or one that takes no time
        on a kind the resources name; ``inf`` if no kind of the resources can run it (a layer
        without a time for any of them cannot run there, even if it takes 0 s elsewhere).
    """
    if not times or (all(t == 0 for t in times.values()) and any(k in res for k in times)):
        return 0.0
    rate = _rate(res, times)
    return 1.0 / rate if rate > 0 else math.inf


def stage_compute(res: dict, fwd: dict, bwd: dict, beta: dict | None,
                  overhead: tuple = (0.0, 0.0)) -> tuple[float, float, float]:
    """Forward time, backward time and stage time tau of one worker (one replica).

    Sequential execution (``beta is None``): forward then backward on all resources,
    ``tau = 1 / sum_k R_k / (F_k + B_k)``. Split execution (Duan & Wu): a share ``beta_k`` of
    kind k runs the forward pass, the rest the backward pass, concurrently on different
    microbatches: ``tau = max(forward, backward)``. The stage's runtime overhead (``overhead``,
    :func:`stage_overhead`) is added once per microbatch to each pass, whatever the resources.

    Parameters
    ----------
    res
        ``dict[kind, units]``: the worker's pooled resources.
    fwd, bwd
        ``dict[kind, seconds]``: F_k and B_k, the stage's load on one unit of each kind.
    beta
        Forward share per kind in [0, 1] (split execution) or ``None`` (sequential).
    overhead
        ``(forward, backward)`` seconds per microbatch a stage's runtime adds to its passes
        (:func:`stage_overhead`; default none).

    Returns
    -------
    (forward, backward, tau)
        Seconds: forward / backward pass alone (on its share, or on all resources if
        sequential), and the stage time per microbatch.
    """
    of, ob = overhead
    if beta is None:
        f = load_time(res, fwd)
        b = load_time(res, bwd)
        both = {k: fwd.get(k, math.inf) + bwd.get(k, math.inf) for k in set(fwd) | set(bwd)}
        tau = load_time(res, both)
        if of or ob:
            return f + of, b + ob, tau + (of + ob)
        return f, b, tau
    f = load_time({k: beta.get(k, 0.0) * r for k, r in res.items()}, fwd) + of
    b = load_time({k: (1.0 - beta.get(k, 0.0)) * r for k, r in res.items()}, bwd) + ob
    return f, b, max(f, b)


def stage_overhead(graph) -> tuple[float, float]:
    """``(forward, backward)`` seconds per microbatch that a stage's runtime adds to its two
    passes beyond its layers' own times, **once per stage and microbatch** (the graph attribute
    ``stage_overhead``, a dict ``{"forward": s, "backward": s}``; ``(0, 0)`` without it, as for
    every paper profile). :func:`pipeopt.torch.from_torch` measures it as the whole model's
    forward and backward minus the sums of its layers' (docs/cost-model.md).

    Parameters
    ----------
    graph
        The layer graph (``networkx``), or anything with a ``graph`` dict attribute.

    Raises
    ------
    InvalidGraphError
        If the attribute is not such a dict of finite seconds >= 0.
    """
    from ..errors import InvalidGraphError

    given = graph.graph.get("stage_overhead")
    if not given:
        return 0.0, 0.0
    try:
        extra = set(given) - {"forward", "backward"}
        f, b = float(given.get("forward", 0.0)), float(given.get("backward", 0.0))
    except (TypeError, ValueError, AttributeError):
        extra, f, b = {"?"}, math.nan, math.nan
    if extra or not (math.isfinite(f) and math.isfinite(b) and f >= 0 and b >= 0):
        raise InvalidGraphError(
            f"graph attribute stage_overhead must be {{'forward': s, 'backward': s}} with finite seconds >= 0, "
            f"got {given!r}"
        )
    return f, b


# ---- communication ---------------------------------------------------------------------------
def transfer_time(nbytes, bandwidth: float, links=1, latency: float = 0.0):
    """Seconds of **one message** of ``nbytes`` over ``links`` parallel links of ``bandwidth``
    bytes/s each, the alpha-beta model: ``latency + nbytes / (bandwidth * links)`` for
    ``nbytes > 0``, and 0 for 0 bytes (no message). ``latency`` is the cluster's per-message
    alpha (:attr:`pipeopt.Cluster.latency`, seconds; paid once, the parallel links carry their
    shares at once). What one message is: one cut, one direction, one microbatch
    (:func:`crossing_bytes` sums the tensors that cross a cut into it; docs/cost-model.md).
    With ``latency = 0`` (the default) the time is linear in the bytes."""
    time = nbytes / (bandwidth * links)
    if not latency:
        return time
    out = np.where(np.asarray(nbytes) > 0, time + latency, 0.0)
    return out if out.ndim else float(out)


def cut_time(forward_bytes, backward_bytes, bandwidth: float, links=1, latency: float = 0.0):
    """Seconds per microbatch the busier direction of a cut is busy: links are full duplex
    (NVLink, InfiniBand, Ethernet), so activations forward and gradients back travel at once,
    each over ``links = min(m, m')`` links between a stage on m replicas and one on m'
    (PipeDream). :func:`transfer_time` of ``max(forward, backward)`` (one message each way)."""
    return transfer_time(np.maximum(forward_bytes, backward_bytes), bandwidth, links, latency)


def round_trip(forward_bytes, backward_bytes, bandwidth: float, latency: float = 0.0):
    """Seconds one microbatch's activations forward plus its gradients back take on one link
    (two messages, :func:`transfer_time` each): what a cut adds to the window rows
    (:func:`steady_period`)."""
    if not latency:
        return transfer_time(forward_bytes + backward_bytes, bandwidth)
    return (transfer_time(forward_bytes, bandwidth, 1, latency)
            + transfer_time(backward_bytes, bandwidth, 1, latency))


def carried(stage: int, stages: int, forward, backward, x, y, overlap: bool):
    """A stage's forward and backward op under the overlap rule, written once.

    With overlap (``Settings.overlap``, PipeDream's default) transfers run on the links beside
    compute, so the ops are the compute alone (the links carry :func:`on_links`). **Without
    overlap the sender carries its transfer**: stage s's forward op also sends its activations
    over cut s (``x[s]``, if s < S - 1) and its backward op its gradients over cut s - 1
    (``y[s - 1]``, if s > 0), and nothing is left on the links.

    Parameters
    ----------
    stage, stages
        s (0-based) and S.
    forward, backward
        Seconds (numbers, arrays, or linear expressions of a model) of the stage's two ops
        without transfers.
    x, y
        Per cut (length S - 1): seconds of one microbatch's activations forward / gradients back.
    overlap
        ``Settings.overlap``.

    Returns
    -------
    (forward op, backward op)
    """
    if overlap:
        return forward, backward
    if stage < stages - 1:
        forward = forward + x[stage]
    if stage > 0:
        backward = backward + y[stage - 1]
    return forward, backward


def on_links(x, y, overlap: bool, stages: int | None = None):
    """What the links carry per cut: ``(x, y)`` with overlap; zeros without (:func:`carried`:
    the senders' ops carry the transfers). ``stages`` sizes the zeros (default ``len(x) + 1``)."""
    if overlap:
        return x, y
    cuts = len(x) if stages is None else max(stages - 1, 0)
    return [0.0] * cuts, [0.0] * cuts


def boundary_terms(send, busy, trip, overlap: bool):
    """The overlap rule per boundary, for the models that price a cut where a stage begins or
    ends: ``(added, bound, trip)``, arrays like ``send``.

    ``added[c]``: what a stage beside boundary c pays on top of its compute - the transfer it
    sends (``send``) without overlap (:func:`carried`), 0 with; ``bound[c]``: the time the stage
    cannot go below because of the cut - its busy time (``busy``, :func:`cut_time`) with
    overlap, 0 without; ``trip[c]``: what the cut adds to the window rows - the round trip
    (:func:`round_trip`) with overlap, 0 without (the senders' ops hold it).
    """
    zero = np.zeros_like(np.asarray(send, dtype=float))
    if overlap:
        return zero, busy, trip
    return send, zero, zero


def allreduce_time(param_bytes, replicas, bandwidth: float, latency: float = 0.0):
    """Seconds of a ring all-reduce of ``param_bytes`` over ``replicas`` workers:
    ``2 (m - 1) / m * param_bytes / bandwidth``, plus ``2 (m - 1)`` messages' latency (its
    2 (m - 1) steps each send one message; none for 0 bytes) - 0 for one replica."""
    time = 2.0 * (replicas - 1) / replicas * transfer_time(param_bytes, bandwidth)
    if not latency:
        return time
    return time + np.where(np.asarray(param_bytes) > 0, 2.0 * (np.asarray(replicas) - 1) * latency, 0.0)


def replicated_time(tau, param_bytes, replicas, bandwidth: float, latency: float = 0.0):
    """Time per microbatch of a stage replicated on m workers (PipeDream): each replica runs
    every m-th microbatch and the weights are all-reduced, ``(tau + allreduce) / m``."""
    return (tau + allreduce_time(param_bytes, replicas, bandwidth, latency)) / replicas


def tie_sync_time(nbytes, holders, bandwidth: float, latency: float = 0.0):
    """Seconds of synchronising a tied parameter's gradient (:mod:`pipeopt.cost.ties`): a ring
    all-reduce of its ``nbytes`` between the ``holders`` workers (replicas included) of the
    stages that hold it, :func:`allreduce_time` with the per-message ``latency`` (0 for one holder). Charged once per iteration,
    after the flush and before the optimizer step: added to the ``iteration`` and ``gpipe``
    objectives, not to the steady-state ``bottleneck``."""
    return allreduce_time(nbytes, holders, bandwidth, latency)


def tie_sum_time(users, seconds):
    """Seconds a stage's backward adds per microbatch for a tied parameter of which it holds
    ``users`` layers (arrays broadcast): autograd sums the gradient contributions of a
    parameter used by k modules of one stage before accumulating them, out of place (a fresh
    tensor of the weight's size each time), k - 1 sums of ``seconds`` each (the tie's measured
    ``sum_s``, :mod:`pipeopt.cost.ties`); 0 for a stage holding at most one of its layers. A
    pipeline whose stages each hold one user never pays it (each keeps its own copy)."""
    return np.maximum(np.asarray(users, dtype=float) - 1.0, 0.0) * seconds


def _farthest_first(tail: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``np.lexsort((-w, -b, tail))``; when ``tail`` is already sorted (the arrays' adjacency
    order), only the edges that share their tail with another are sorted (on a chain with a few
    skip edges, a small fraction of them): the same permutation."""
    if tail.size < 2 or (tail[1:] < tail[:-1]).any():
        return np.lexsort((-w, -b, tail))
    same = tail[1:] == tail[:-1]
    order = np.arange(tail.size)
    if same.any():
        shared = np.zeros(tail.size, dtype=bool)
        shared[1:] |= same
        shared[:-1] |= same
        idx = np.flatnonzero(shared)  # whole groups, contiguous, in tail order
        order[idx] = idx[np.lexsort((-w[idx], -b[idx], tail[idx]))]
    return order


_LEAST_BYTES = float(np.nextafter(0.0, 1.0))
"""The bytes of a boundary some tensor crosses when the rounding of the sum lost them all."""


def crossing_bytes(graph, position, count: int) -> np.ndarray:
    """Bytes that cross each boundary between consecutive positions ``0 .. count-1``.

    **A tensor crosses a boundary at most once per microbatch**, whatever the number of
    layers beyond it that read the tensor: a layer's output is sent once to the next
    stage, and a stage passes on what later stages need (PipeDream's generated stages
    forward the tensors of later stages this way). So a tensor feeding two layers of the
    next stage travels once, and one feeding layers of two later stages travels once to
    each, relayed through the stages between. Layer ``u``'s tensor crosses boundary c
    (``position[u] <= c < position[v]`` for some consumer v) carrying the largest ``bytes``
    of its edges to consumers beyond c (the edges of one tensor normally all carry its
    ``out_bytes``). Its gradient travels back the same way. A boundary no tensor of positive bytes
    crosses carries exactly 0 (no message: :func:`transfer_time`), one that some cross more than 0
    (at least the least subnormal float), whatever the rounding of the sum.

    Vectorised over the edges (:class:`pipeopt.cost.arrays.LayerArrays`): per tail, its edges
    that go forward sorted by head position (descending), a running maximum of their bytes
    (a segmented maximum over integer ranks, so exact), and each rise of that maximum added
    to the boundaries ``position[u] .. position[v] - 1`` through a difference array. The
    difference array is summed in the order a loop over the adjacency would add to it
    (``np.bincount`` adds sequentially), so the result does not depend on the vectorisation.

    Parameters
    ----------
    graph
        The layer graph (edge attribute ``bytes``, default the tail's ``out_bytes``), or its
        :class:`~pipeopt.cost.arrays.LayerArrays` (or a :class:`pipeopt.Instance`, whose
        arrays are read once and kept).
    position
        ``dict[node, int]``: a stage (or chain unit) index per layer; or an ``ndarray`` of
        them in the arrays' node order.
    count
        Number of positions.

    Returns
    -------
    ndarray (count - 1,)
        Bytes per boundary; entry c is the boundary between positions c and c + 1.
    """
    arr = layer_arrays(graph)
    pos = arr.positions(position)
    a, b = pos[arr.tail], pos[arr.head]
    keep = np.flatnonzero(b > a)  # edges to a consumer beyond the producer's position
    if not keep.size:
        return np.zeros(max(count - 1, 0))
    tail, w = arr.tail[keep], arr.edge_bytes[keep]
    a, b = a[keep], b[keep]
    order = _farthest_first(tail, b, w)  # per tail (in adjacency order): farthest consumer first
    a, b, w, tail = a[order], b[order], w[order], tail[order]
    vals, rank = np.unique(w, return_inverse=True)
    base = tail * vals.size
    top = vals[np.maximum.accumulate(base + rank.reshape(-1)) - base]  # running max per tail (exact: ranks)
    before = np.zeros_like(top)
    same = np.flatnonzero(tail[1:] == tail[:-1]) + 1
    before[same] = top[same - 1]
    rise = top - before
    up = rise > 0
    if not up.any():  # every tensor beyond a boundary is empty (np.bincount of nothing is int)
        return np.zeros(max(count - 1, 0))
    a, b, rise = a[up], b[up], rise[up]
    # boundaries a .. b-1 carry each rise: +rise at a, -rise at b, added in the loop's order
    diff = np.bincount(np.column_stack([a, b]).reshape(-1), weights=np.column_stack([rise, -rise]).reshape(-1),
                       minlength=count + 1)
    out = np.cumsum(diff)[: max(count - 1, 0)]
    # whether a boundary carries a message is decided by counting the tensors of positive bytes
    # that cross it, exactly (integers), not by the sign of the running sum's rounding: one that
    # none crosses carries exactly 0 bytes, one that some cross more than 0 (a tensor of a few
    # subnormal bytes beside large ones can vanish from the sum, in one order and not another)
    ends = np.concatenate([a, b])
    crossings = np.cumsum(np.bincount(ends, weights=np.concatenate([np.ones(a.size), -np.ones(b.size)]),
                                      minlength=count + 1))[: max(count - 1, 0)]
    return np.where(crossings > 0.5, np.maximum(out, _LEAST_BYTES), 0.0)


def tensors_of(graph) -> list[tuple]:
    """The tensors of the ``max_load`` objective: ``[(source, (readers...), bytes), ...]``.

    The graph attribute ``tensors`` if it has one (a workload whose operators send tensors of
    their own, forward and backward); otherwise one per layer with successors, its activation
    (the largest ``bytes`` of its out-edges) read by its successors, and one per edge, the
    gradient of that activation, sent back by the head to the tail.
    """
    given = graph.graph.get("tensors")
    if given is not None:
        return [(t[0], tuple(t[1]), float(t[2])) for t in given]
    out = []
    for u in graph.nodes:
        succ = list(graph.successors(u))
        if succ:
            out.append((u, tuple(succ), max(float(graph.edges[u, v].get("bytes", graph.nodes[u]["out_bytes"]))
                                            for v in succ)))
    for u, v, b in graph.edges(data="bytes"):
        out.append((v, (u,), float(graph.nodes[u]["out_bytes"] if b is None else b)))
    return out


def stage_transfers(tensors, stage_of: dict, stages: int) -> np.ndarray:
    """Bytes each stage sends or receives under Tarnawski et al.'s rule (the ``max_load``
    objective): a tensor is charged **once to the stage of its source** if some reader sits on
    another stage, and **once to every other stage that reads it** (each device reads and
    writes host memory; "sum" of compute and transfers, no overlap).

    Parameters
    ----------
    tensors
        ``[(source, readers, bytes)]`` (:func:`tensors_of`).
    stage_of
        ``dict[layer, int]``: the stage of each layer.
    stages
        S.

    Returns
    -------
    ndarray (S,)
        Bytes per stage (times: :func:`transfer_time`; a stage on a ``host`` device pays none).

    References
    ----------
    Tarnawski et al., NeurIPS 2020, section 3 and ``throughput-dp/dp.cpp``
    (``computeLoadForResultOrg``).
    """
    out = np.zeros(stages)
    for src, readers, b in tensors:
        s = stage_of[src]
        others = {stage_of[r] for r in readers} - {s}
        if others:
            out[s] += b
            for r in sorted(others):
                out[r] += b
    return out


def stage_transfer_times(tensors, stage_of: dict, stages: int, bandwidth: float, latency: float = 0.0) -> np.ndarray:
    """Seconds each stage sends or receives under :func:`stage_transfers`'s rule (the
    ``max_load`` objective), **one message per tensor** and stage charged
    (:func:`transfer_time` of its bytes). With ``latency = 0``: :func:`transfer_time` of
    :func:`stage_transfers`.

    Returns
    -------
    ndarray (S,)
    """
    if not latency:
        return transfer_time(stage_transfers(tensors, stage_of, stages), bandwidth)
    out = np.zeros(stages)
    for src, readers, b in tensors:
        s = stage_of[src]
        others = {stage_of[r] for r in readers} - {s}
        if others:
            t = transfer_time(b, bandwidth, 1, latency)
            out[s] += t
            for r in sorted(others):
                out[r] += t
    return out


def migration_bytes(input_bytes, param_bytes, microbatches: int):
    """Bytes per microbatch a layer moves when its forward and backward run on different
    stages (Bi-Partition), in pipeopt's reading of the Bi-Partition abstract (the paper's
    body is not public).

    The layer's backward needs its **input** activation (the tensors of its predecessors it
    read in its forward), so that input travels forward-stage -> backward-stage every
    microbatch; its weights, updated where the backward runs, travel back once per
    iteration of M microbatches.

    Parameters
    ----------
    input_bytes
        The layer's input activation per microbatch: the sum of the bytes on its in-edges
        (:func:`pipeopt.graph.edge_bytes` of each predecessor it reads); a layer without a
        predecessor (the first layer) moves its own ``act_bytes`` instead.
    param_bytes
        The layer's parameter bytes.
    microbatches
        M, microbatches per iteration.

    Returns
    -------
    (along, back)
        Bytes per microbatch towards the backward stage, and back towards the forward stage:
        ``(input_bytes, param_bytes / M)``.
    """
    return input_bytes, param_bytes / microbatches


# ---- the schedule: microbatches in flight and the steady state -------------------------------
def in_flight(stage: int, stages: int, *, workers_after=None, replicas=1, gpipe: bool = False,
              microbatches: int = 1, split: bool = False):
    """Microbatches whose activations a replica of stage ``stage`` (0-based) keeps.

    1F1B: ``k = ceil(W / m)`` with W the workers of stages ``stage .. S-1`` and m the stage's
    replicas (``S - stage`` without replication; PipeDream's runtime computes the same number
    as ``num_warmup_minibatches + 1``). Split execution (Duan & Wu): ``2 k`` (the forward share
    admits a new microbatch while fewer than ``2 k`` are in flight, so that both shares can
    be busy). GPipe (fill-drain): all M microbatches.
    """
    if gpipe:
        return microbatches
    k = stages - stage if workers_after is None else -(-workers_after // replicas)
    return 2 * k if split else k


def windows(stages: int, *, split: bool = False) -> list[int]:
    """:func:`in_flight` of every stage of a plan with one worker per stage (no replication):
    ``[S, S - 1, ..., 1]`` under 1F1B, ``[2 S, ..., 2]`` under split execution. The one place the
    one-order space's windows are written; the models' window rows and memory rows read it.

    Parameters
    ----------
    stages
        S.
    split
        Split execution (Duan & Wu): twice the 1F1B window.

    Returns
    -------
    list[int]
        Length S; entry s is stage s's microbatches in flight.
    """
    return [int(in_flight(s, stages, split=split)) for s in range(stages)]


def replica_ops(tau, forward, backward, allreduce=0.0, *, split: bool = False) -> tuple[float, float]:
    """Seconds one replica's forward op and backward op take per microbatch.

    A replica is busy ``tau + allreduce`` per microbatch it runs (its compute and the share of
    the all-reduce the cost model spreads over its microbatches, :func:`replicated_time`).
    Sequential execution splits that time between the two ops in the ratio ``forward :
    backward`` (with one resource kind: exactly the two passes' times, plus the all-reduce
    share); split execution stretches both ops, which run concurrently on their shares, by
    ``(tau + allreduce) / tau``.

    Returns
    -------
    (forward op, backward op)
    """
    busy = tau + allreduce
    if split:
        top = max(forward, backward)
        scale = busy / top if top > 0 else 0.0
        return forward * scale, (backward * scale if top > 0 else busy)
    total = forward + backward
    if total <= 0:
        return 0.0, busy
    # the shares first: busy * forward underflows to 0 for times of 1e-203 s and below
    return busy * (forward / total), busy * (backward / total)


def window_tokens(window, replicas, split) -> tuple[np.ndarray, np.ndarray]:
    """The two microbatch counts a stage contributes to the window rows.

    Under 1F1B a replica of stage s runs ``B(j)`` then ``F(j + k m)`` (it admits its k-th next
    microbatch) and ``F(j)`` then ``B(j - (k - 1) m)`` (k its window, m its replicas, microbatch
    j on replica ``j mod m``). A microbatch's round trip up from stage i to stage l and back
    therefore spans ``D_i - U_l`` microbatches, with ``D = k m`` and ``U = (k - 1) m``. Under
    split execution a replica admits ``F(j + 2 k m)`` after ``B(j)`` and runs a backward as soon
    as its data is there: ``D = 2 k m``, ``U = 0``.

    Parameters
    ----------
    window, replicas, split
        Per stage (arrays or lists of length S): k (:func:`in_flight` without the split
        factor), m, and whether the stage runs split execution.

    Returns
    -------
    (D, U)
        ``ndarray (S,)`` each.
    """
    k, m, sp = np.asarray(window, dtype=float), np.asarray(replicas, dtype=float), np.asarray(split, dtype=bool)
    return np.where(sp, 2 * k * m, k * m), np.where(sp, 0.0, (k - 1) * m)


def steady_period(f_op, b_op, replicas, window, split, x, y, links) -> float:
    """Steady-state time per microbatch of 1F1B (and asynchronous PipeDream) - exactly.

    With fixed orders (each replica's 1F1B order, each link's microbatch order) the pipeline
    is a max-plus linear system, and its period is the largest ratio (total duration) /
    (microbatches spanned) over the cycles of its dependency graph. These cycles are
    (docs/cost-model.md, "Objectives: the schedule, exactly"):

    * one replica's own work: ``(f_s + b_s) / m_s`` (split execution: ``f_s / m_s`` and
      ``b_s / m_s``, each share on its own);
    * one direction of a cut: ``x_c / L_c`` and ``y_c / L_c`` (links are full duplex);
    * **the window rows**: a microbatch's round trip from stage i up to stage l and back,
      ``(sum_{s=i..l} (f_s + b_s) + sum_{c=i..l-1} (x_c + y_c)) / (D_i - U_l)``
      (:func:`window_tokens`; without replication ``D_i - U_l = l - i + 1``: stages i..l hold
      l - i + 1 microbatches in flight, so a round trip through them bounds the period).

    Parameters
    ----------
    f_op, b_op
        ``(S,)`` seconds per microbatch of one replica's forward and backward op
        (:func:`replica_ops`; without overlap they include the transfers the stage sends).
    replicas, window, split
        ``(S,)``: m, the 1F1B window k, split execution or not.
    x, y
        ``(S-1,)`` seconds one microbatch's activations (gradients) take over one link of
        each cut (zeros without overlap: the sender's ops carry them).
    links
        ``(S-1,)`` parallel links of each cut, ``min(m_c, m_{c+1})``.

    Returns
    -------
    float
        Seconds per microbatch.

    References
    ----------
    Baccelli, Cohen, Olsder & Quadrat, Synchronization and Linearity, Wiley 1992 (the cycle
    time of a max-plus system); Narayanan et al., PipeDream-2BW / Flush, ICML 2021 (1F1B).
    """
    f, b = np.asarray(f_op, dtype=float), np.asarray(b_op, dtype=float)
    m = np.asarray(replicas, dtype=float)
    sp = np.asarray(split, dtype=bool)
    x, y, L = np.asarray(x, dtype=float), np.asarray(y, dtype=float), np.asarray(links, dtype=float)
    D, U = window_tokens(window, replicas, split)
    own = np.where(sp, np.maximum(f, b), f + b) / m
    period = float(max(own.max(initial=0.0), (x / L).max(initial=0.0), (y / L).max(initial=0.0)))
    # window (i, l): prefix sums of the work and of the round trips give every pair at once
    work = np.concatenate([[0.0], np.cumsum(f + b)])
    trip = np.concatenate([[0.0], np.cumsum(x + y)])
    i, l = _pairs(f.size)
    w = work[l + 1] - work[i] + trip[l] - trip[i]
    tokens = D[i] - U[l]
    return max(period, float((w / tokens).max(initial=0.0)))


@functools.lru_cache(maxsize=2)
def _pairs(S: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.triu_indices(S)``, read-only, kept for the last two S (:func:`steady_period` scores
    many splits of one S)."""
    i, l = np.triu_indices(S)
    i.setflags(write=False)
    l.setflags(write=False)
    return i, l


def gpipe_time(f_op, b_op, x, y, microbatches: int) -> float:
    """Seconds of M microbatches under GPipe (fill-drain) without replication or split
    execution - exactly: ``sum(f) + sum(x) + (M - 1) max(f, x)`` for the forward phase plus
    ``sum(b) + sum(y) + (M - 1) max(b, y)`` for the backward phase.

    Each phase is a flow shop (stages and link directions are its machines) whose M jobs are
    identical, so its makespan is the sum of one job's times plus M - 1 times the slowest
    machine. The backward phase starts when the last stage ends its last forward, which is
    after every other stage has ended its forwards, so the phases add up. (With replication or
    split execution :class:`pipeopt.cost.Evaluation` takes the longest path instead.)

    Parameters
    ----------
    f_op, b_op
        ``(S,)`` seconds of each stage's forward and backward op (without overlap, with the
        transfer it sends).
    x, y
        ``(S-1,)`` seconds of each cut's activation and gradient transfer (zeros without
        overlap).
    microbatches
        M.

    References
    ----------
    Huang et al., GPipe, NeurIPS 2019; Tarnawski et al., NeurIPS 2020 (the two phases' maxima).
    """
    fwd = np.concatenate([np.asarray(f_op, dtype=float), np.asarray(x, dtype=float)])
    bwd = np.concatenate([np.asarray(b_op, dtype=float), np.asarray(y, dtype=float)])
    M = int(microbatches)
    return float(fwd.sum() + bwd.sum() + (M - 1) * (fwd.max(initial=0.0) + bwd.max(initial=0.0)))


def window_step(G_prev, C_prev, w, D, U, T):
    """One step of the window rows' recursion at a trial period T (the DP's probe).

    ``G_l = max_i (sum_{s=i..l} w_s + sum_{c=i..l-1} C_c - D_i T)`` obeys ``G_l = w_l +
    max(-D_l T, G_{l-1} + C_{l-1})``, and every window row ending at stage l holds iff
    ``G_l <= -U_l T`` (:func:`steady_period`; ``G_{-1} = -inf``). Smaller G is better for every
    later stage, so a DP keeps the least G per state.

    Returns
    -------
    (G, ok)
        ``G_l`` and whether the rows ending at l hold (arrays broadcast).
    """
    G = w + window_carry(G_prev, C_prev, D, T)
    return G, G <= -U * T


def window_carry(G_prev, C_prev, D, T):
    """What the window rows carry into a stage before its own work: ``max(-D_l T, G_{l-1} +
    C_{l-1})`` (:func:`window_step` is ``w_l`` plus this; ``-D_l T`` when a new row starting at
    stage l is the binding one). Arrays broadcast."""
    return np.maximum(-D * T, G_prev + C_prev)


def weight_versions(in_flight_count, weight_stashing: bool):
    """Weight versions a stage keeps: one per microbatch in flight with weight stashing
    (PipeDream), else one."""
    return in_flight_count if weight_stashing else 1


# ---- memory ----------------------------------------------------------------------------------
def stage_memory(act_bytes, param_bytes, in_flight_count, versions):
    """Bytes a stage needs: ``in_flight * activations + versions * parameters``. The parameters
    include the ``state_bytes`` of every tied parameter the stage holds (:mod:`pipeopt.cost.ties`:
    each stage that uses a tie keeps its own copy)."""
    return in_flight_count * act_bytes + versions * param_bytes


def outputs_kept(in_flight_count, last, microbatches: int):
    """Microbatches whose stage output a stage keeps (torch.distributed.pipelining's runtime):
    each microbatch's output stays with the stage until that microbatch's backward (its
    ``fwd_cache``), so as many as it has in flight; the last stage also keeps every output of
    the iteration for the merged output ``step()`` returns: M. Arrays broadcast."""
    return np.where(last, microbatches, in_flight_count)


def backward_excess(peak, act_total):
    """Bytes a stage's backward needs beyond one microbatch's saved activations
    (``act_total``): while layer L's backward runs, the microbatch still holds the saved
    activations of the stage's layers up to L and L's temporaries, so ``peak`` is the largest
    over the stage's layers of (activations through L + ``bwd_temp_bytes`` of L), and the excess
    ``max(peak - act_total, 0)`` (the forward ends holding all of them). Arrays broadcast."""
    return np.maximum(peak - act_total, 0.0)


def saved_once(kept, twice_bytes):
    """Bytes to take off a stage's ``in_flight * act_bytes`` for the tensors two of its layers
    both save (``twice_bytes`` per microbatch: edge attribute ``saved_twice_bytes`` of the edges
    inside the stage; each layer's ``act_bytes`` is measured alone, so both count the storage
    they share): ``-kept * twice_bytes``. Arrays broadcast."""
    return -kept * twice_bytes


def merged_output(out_bytes, last, microbatches: int):
    """Bytes of the merged output the last stage builds at the end of an iteration: torch's
    ``step()`` concatenates the M outputs it kept (``merge_chunks``) while they are still held,
    so the stage then holds them twice (``out_bytes`` its output per microbatch); 0 for the
    other stages. Arrays broadcast."""
    return np.where(last, microbatches * out_bytes, 0.0)


def transient_memory(out_bytes, kept, excess, merged=0.0, act=0.0):
    """Bytes a stage needs on top of :func:`stage_memory` when the profile measured them (graph
    attribute ``transient_memory``, :mod:`pipeopt.cost.transient`): the outputs it keeps,
    ``kept * out_bytes`` (:func:`outputs_kept`; ``out_bytes`` the bytes it sends per microbatch,
    the last stage's the model's output), and the larger of its backward's excess
    (:func:`backward_excess` of its layers' ``bwd_temp_bytes``, measured with MemTracker) and
    what the merge of the outputs adds (:func:`merged_output`) beyond the ``act`` bytes of
    activations the stage holds in flight (a tensor two layers save counted once,
    :func:`saved_once`; freed by the time of the merge, at the end of the iteration). Measured on the shipped ``gpt`` (S = 2, M = 8, MemTracker): the last stage
    peaks at the merge, 49.59 MiB, predicted 42.28 MiB without the merge term and 49.08 MiB with
    it. Arrays broadcast."""
    return kept * out_bytes + np.maximum(excess, merged - act)


def recompute_terms(graph, layer, mode: str) -> tuple[float, dict]:
    """What recomputing one layer's activations changes: ``(kept, extra)``.

    ``kept``: bytes per microbatch in flight the layer keeps instead of its ``act_bytes``;
    ``extra``: ``dict[kind, seconds]`` its backward grows by on one unit of each kind (the
    recomputed forward runs right before the backward; in the split-backward schedules before
    I, so I grows and W does not).

    * ``"full"`` (torch.utils.checkpoint of the layer; Megatron's full recomputation): the layer
      keeps only its input, the bytes on its in-edges (:func:`pipeopt.graph.edge_bytes`; 0 for a
      layer without predecessors: the model's input is the data loader's), and reruns its whole
      forward: ``extra = fwd``, or the node attribute ``recompute_fwd`` (``{kind: seconds}``)
      where the profile measured what the recomputation adds (the rerun and the checkpoint's own
      work, :mod:`pipeopt.torch.profile`), per kind it gives.
    * ``"selective"``: the layer's profile gives node attribute ``selective`` =
      ``{"act_bytes": bytes kept, "fwd": {kind: seconds recomputed}}`` (the cheap-to-recompute
      operators dropped, as torchtitan's per-op policy does).

    Parameters
    ----------
    graph
        The layer graph (``networkx.DiGraph``).
    layer
        A node of ``graph``.
    mode
        ``"full"`` or ``"selective"`` (:data:`pipeopt.plan.RECOMPUTE_MODES`).

    Raises
    ------
    InvalidPlanError
        If ``mode`` is unknown, or ``"selective"`` where the layer has no ``selective``
        attribute (the message names the layer).
    """
    from ..errors import InvalidPlanError
    from ..graph import edge_bytes

    attrs = graph.nodes[layer]
    if mode == "full":
        kept = float(sum(edge_bytes(graph, u, layer) for u in graph.predecessors(layer)))
        measured = attrs.get("recompute_fwd") or {}
        return kept, {k: float(measured.get(k, v)) for k, v in attrs["fwd"].items()}
    if mode == "selective":
        sel = attrs.get("selective")
        if not isinstance(sel, dict) or "act_bytes" not in sel or "fwd" not in sel:
            raise InvalidPlanError(
                f"layer {layer!r}: selective recomputation needs the profile's node attribute "
                "selective = {'act_bytes': bytes, 'fwd': {kind: seconds}}; this layer has none (use 'full')"
            )
        return float(sel["act_bytes"]), {k: float(v) for k, v in sel["fwd"].items()}
    raise InvalidPlanError(f"layer {layer!r}: unknown recompute mode {mode!r} (full or selective)")


def memory_limit(capacity):
    """The most bytes that fit ``capacity``: ``fits(m, c)`` is ``m <= memory_limit(c)``
    (:data:`MEMORY_SLACK` included; a linear model's memory row uses it as its right-hand side)."""
    return capacity * (1 + MEMORY_SLACK)


def fits(memory, capacity):
    """True where ``memory <= capacity`` up to :data:`MEMORY_SLACK` (``inf`` capacity: always)."""
    return memory <= memory_limit(capacity)


def backward_peak(kept, act, temp=0.0):
    """The most bytes of one microbatch a stage holds while one of its layers' backward runs:
    ``max over L of (sum_{l before L} kept_l + act_L + temp_L)``, the layers in the stage's
    order (0 for none).

    While layer L's backward runs, the layers before L still hold what they keep for their own
    backward (``kept``: ``act_bytes``, or a recomputed layer's kept bytes, :func:`recompute_terms`),
    L holds its whole ``act_bytes`` (a recomputed layer has re-created them by rerunning its
    forward) and its backward's temporaries (``temp``: ``bwd_temp_bytes`` where the profile
    measured them, else 0); the layers after L have freed theirs. Without recomputation this is
    the activations through L plus L's temporaries (:func:`backward_excess`'s peak); with
    ``temp = 0`` and no recomputation it is one microbatch's activations, so
    ``backward_excess(backward_peak(...), sum(kept))`` adds nothing to today's model.

    Parameters
    ----------
    kept, act, temp
        ``array (n,)`` bytes per layer of the stage (``temp`` may be a scalar).

    Returns
    -------
    float
        Bytes.
    """
    kept = np.asarray(kept, dtype=float)
    act = np.asarray(act, dtype=float)
    if not kept.size:
        return 0.0
    # cumsum(kept) + (act - kept): exactly the activations through L when nothing is recomputed
    return float(np.max(np.cumsum(kept) + (act - kept) + temp))


# ---- data parallelism and ZeRO (Settings.zero, dp, gradient_ratio, optimizer_ratio) ----------
def ring_collective_time(nbytes, dp: int, bandwidth: float, latency: float = 0.0):
    """Seconds of one ring reduce-scatter or all-gather of ``nbytes`` over ``dp`` workers: its
    ``dp - 1`` steps each send one message of ``nbytes / dp`` (:func:`transfer_time`), so
    ``(d - 1) / d * nbytes / bandwidth + (d - 1) * latency``; 0 for one worker or no bytes. A
    ring all-reduce is a reduce-scatter then an all-gather (:func:`allreduce_time`)."""
    if dp <= 1:
        return 0.0 * np.asarray(nbytes, dtype=float) if np.ndim(nbytes) else 0.0
    return (dp - 1) * transfer_time(np.asarray(nbytes, dtype=float) / dp if np.ndim(nbytes) else nbytes / dp,
                                    bandwidth, 1, latency)


def sharded_state(param_bytes, largest_layer, *, gradient_ratio: float, optimizer_ratio: float, zero: int, dp: int):
    """Bytes a stage's training state needs beyond one copy of its weights (``param_bytes``,
    which :func:`stage_memory` charges): its gradients and optimizer state, and under ZeRO-3 the
    difference between the weights it keeps and a whole copy (Rajbhandari et al., *ZeRO*, SC
    2020; FSDP's full sharding).

    * gradients ``gradient_ratio * P``, divided by d from ZeRO-2 on;
    * optimizer state ``optimizer_ratio * P``, divided by d from ZeRO-1 on;
    * ZeRO-3: the weights are kept as 1/d shards, and each layer's are gathered in full while it
      runs, one layer at a time: ``P / d + (d - 1) / d * largest_layer - P``.

    With the defaults (ratios 0, ZeRO-0 or d = 1) it is 0: today's model. Arrays broadcast.

    Parameters
    ----------
    param_bytes
        P, the stage's weight bytes (its layers' ``param_bytes`` and its tied weights' state).
    largest_layer
        The largest ``param_bytes`` of one of its layers (what ZeRO-3 gathers at once).
    gradient_ratio, optimizer_ratio, zero, dp
        :class:`pipeopt.Settings` fields.
    """
    d = max(int(dp), 1)
    opt = optimizer_ratio * param_bytes / (d if zero >= 1 else 1)
    grad = gradient_ratio * param_bytes / (d if zero >= 2 else 1)
    if zero >= 3 and d > 1:
        return opt + grad + (param_bytes / d + (d - 1) / d * largest_layer - param_bytes)
    return opt + grad


def zero_op_times(param_bytes, *, zero: int, dp: int, bandwidth: float, latency: float = 0.0) -> tuple:
    """Seconds the ZeRO stage adds to one replica's forward op and backward op per microbatch:
    ``(forward, backward)``, the data-parallel collectives of a stage of ``param_bytes`` weight
    bytes (:func:`ring_collective_time` over the ``dp`` replicas, not overlapped with compute).

    * ZeRO-0 and ZeRO-1: none (the gradients accumulate in full over the M microbatches);
    * ZeRO-2: the backward reduce-scatters the microbatch's gradients (only a shard is kept);
    * ZeRO-3: the forward all-gathers the weights, the backward all-gathers them again and
      reduce-scatters the gradients.
    """
    c = ring_collective_time(param_bytes, dp, bandwidth, latency)
    scatter = zero_backward_scatter(param_bytes, zero=zero, dp=dp, bandwidth=bandwidth, latency=latency)
    if zero >= 3:
        return c, c + scatter
    return 0.0 * c, scatter


def zero_backward_scatter(param_bytes, *, zero: int, dp: int, bandwidth: float, latency: float = 0.0):
    """The part of :func:`zero_op_times`' backward that follows the weight gradient: ZeRO-2 and
    ZeRO-3 reduce-scatter each microbatch's gradients (in the split-backward schedules after W;
    ZeRO-3's all-gather of the weights comes before I). 0 below ZeRO-2."""
    c = ring_collective_time(param_bytes, dp, bandwidth, latency)
    return c if zero >= 2 else 0.0 * c


def zero_sync_time(param_bytes, *, zero: int, dp: int, bandwidth: float, latency: float = 0.0):
    """Seconds of a stage's data-parallel synchronisation once per iteration, after the flush
    (the ``dp`` replicas' stages in parallel): ZeRO-0 all-reduces the gradients, ZeRO-1
    reduce-scatters them and all-gathers the updated weights (the same bytes:
    ``2 (d - 1) / d * P / bandwidth``, :func:`allreduce_time`); ZeRO-2 only all-gathers the
    updated weights (its gradients were reduce-scattered per microbatch, :func:`zero_op_times`);
    ZeRO-3 nothing (its weights stay shards; each microbatch gathers them). 0 for d = 1."""
    c = ring_collective_time(param_bytes, dp, bandwidth, latency)
    if zero >= 3:
        return 0.0 * c
    return c if zero == 2 else 2 * c
