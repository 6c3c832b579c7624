"""The passes a schedule runs on each chunk: forward F, backward B, and B split into the
input gradient I and the weight gradient W; and the transfers between chunks.

Zero-bubble schedules (Qi et al., *Zero Bubble Pipeline Parallelism*, ICLR 2024) run the
backward of a chunk as two actions: I, the gradient of the chunk's input, which the previous
chunk waits for, and W, the gradient of its weights, which nobody waits for and which fills
bubbles. Layer costs carry the split as the optional node attribute ``bwd_w`` (seconds of W
per resource kind, :mod:`pipeopt.graph`); I = ``bwd`` - W.

**The default, W = B / 2.** A layer without ``bwd_w`` (every reader's layers unless a
profiler measured the split) is taken to spend half of its backward on W
(:data:`DEFAULT_W_SHARE`): the split torch's automatic-partitioning work assumes when none is
given (pytorch/pytorch pull request #179212, ``torch/distributed/pipelining/_partition.py``,
``_normalize_backward_split``: ``I = floor(B / 2)``, ``W = B - I`` in FLOPs; not in the torch
2.13 release); it is exact for a matrix product ``Y = X A``, whose input gradient ``dY A^T``
and weight gradient ``X^T dY`` take the same FLOPs. Results that use the split say so
(:func:`weight_split_assumption`).

:func:`pass_times` gives every duration a schedule executor needs
(:mod:`pipeopt.schedules.execute`). It does not re-derive a rule: F, B and the transfers are
:func:`pipeopt.cost.evaluate`'s ``forward_op``, ``backward_op`` and per-cut transfer times of
the same chunks (so with one stage per rank they are exactly the durations
:mod:`pipeopt.cost.schedule` runs), and B is shared between I and W in the ratio of their
times on the chunk's resources (:func:`pipeopt.cost.rules.load_time`) - with one resource
kind exactly the layers' I and W sums, as :func:`pipeopt.cost.rules.replica_ops` shares a
stage time between F and B.

**Data parallelism** (``Settings.dp``, ``zero``): ZeRO-3's all-gather of the weights adds to F
and (before I) to I; ZeRO-2/3's reduce-scatter of each microbatch's gradients adds to W (it
follows the weight gradient, :func:`pipeopt.cost.rules.zero_backward_scatter`). A chunk holds
its training state beyond the weights (``Evaluation.state``), and after the flush each rank
synchronises its chunks one after the other (``Evaluation.stage_sync``).

**Recomputation** (``Stage.recompute``, :func:`pipeopt.cost.rules.recompute_terms`): a chunk's
recomputed forward runs right before its input gradient, so it adds to B and to I, never to W:
W is the chunk's W without recomputation, I the rest of B. A chunk holds its kept bytes per
microbatch in flight (``Evaluation.activations``) and, while a backward runs, the excess of a
recomputed layer's re-created activations (``Evaluation.recompute_excess``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..cluster import Device
from ..errors import InvalidPlanError, InvalidProblemError
from ..instance import Instance, Settings
from ..plan import Plan, Stage
from . import rules
from .evaluate import evaluate

DEFAULT_W_SHARE = 0.5
"""Share of a layer's backward time spent on the weight gradient W when its ``bwd_w`` does
not give it (module docstring: torch's automatic partitioning assumes the same)."""


def weight_gradient_time(attrs: dict, kind: str, shift: int = 0) -> float:
    """Seconds of W of one layer on one unit of ``kind``.

    Parameters
    ----------
    attrs
        The layer's node attributes (``bwd``, optional ``bwd_w``).
    kind
        A resource kind.
    shift
        Scale the times by ``2 ** shift`` first (exactly, :func:`math.ldexp`): a ratio of
        subnormal times keeps its precision (default 0: seconds).

    Returns
    -------
    float
        ``bwd_w[kind]`` if given, else ``DEFAULT_W_SHARE * bwd[kind]``; ``inf`` where the layer
        cannot run on ``kind``.
    """
    b = attrs["bwd"].get(kind, math.inf)
    if not math.isfinite(b):
        return math.inf
    given = attrs.get("bwd_w") or {}
    return math.ldexp(float(given[kind]), shift) if kind in given else DEFAULT_W_SHARE * math.ldexp(float(b), shift)


def backward_split(graph, layers, shift: int = 0) -> tuple[dict, dict]:
    """The I and W loads of a set of layers: ``(I, W)``, each ``dict[kind, seconds]`` on one
    unit of the kind, ``I_k + W_k = B_k`` (``inf`` on kinds some layer cannot run on); times
    scaled by ``2 ** shift`` (:func:`weight_gradient_time`)."""
    kinds = {k for n in layers for k in graph.nodes[n]["bwd"]}
    i_load, w_load = {}, {}
    for k in kinds:
        w = i = 0.0
        for n in layers:
            b = graph.nodes[n]["bwd"].get(k, math.inf)
            b = math.ldexp(float(b), shift) if math.isfinite(b) else b
            wn = weight_gradient_time(graph.nodes[n], k, shift)
            w += wn
            i += b - wn if math.isfinite(b) else math.inf
        i_load[k], w_load[k] = i, w
    return i_load, w_load


def layers_without_split(graph) -> list:
    """Layers whose ``bwd_w`` misses a kind on which they have a finite backward time (the
    default W = B / 2 applies to them)."""
    out = []
    for n, attrs in graph.nodes(data=True):
        given = attrs.get("bwd_w") or {}
        if any(math.isfinite(t) and k not in given for k, t in attrs["bwd"].items()):
            out.append(n)
    return out


def weight_split_assumption(graph) -> str | None:
    """The assumption to print when a result uses the I/W split, or ``None`` if every layer
    gives its own (``bwd_w`` on every kind it runs on)."""
    missing = layers_without_split(graph)
    if not missing:
        return None
    n = graph.number_of_nodes()
    which = "every layer" if len(missing) == n else f"{len(missing)} of {n} layers (e.g. {missing[0]!r})"
    return (f"weight gradient W = B/2 of the backward for {which} (no bwd_w given; the default torch's "
            "automatic partitioning assumes)")


@dataclass(frozen=True)
class PassTimes:
    """Durations of one microbatch's actions on each chunk, and the transfers between chunks
    (seconds; bytes for memory).

    Attributes
    ----------
    forward, backward, input_grad, weight_grad
        ``tuple[float, ...]`` per chunk (pipeline order): F, B, I and W, ``I + W = B``
        (without the transfers their chunk sends; see ``overlap``).
    send_forward, send_backward
        ``tuple[float, ...]`` per boundary c (between chunks c and c + 1): one microbatch's
        activations c -> c + 1 and its gradients c + 1 -> c on one link
        (:func:`pipeopt.cost.rules.transfer_time` of the bytes that cross,
        :func:`pipeopt.cost.rules.crossing_bytes`).
    act_bytes, param_bytes
        ``tuple[float, ...]`` per chunk: activation bytes kept per microbatch in flight (a
        recomputed layer's kept bytes instead of its ``act_bytes``), and parameter bytes.
    memory_capacity
        ``tuple[float, ...]`` per chunk: memory of the worker (rank) that runs it.
    overlap
        Transfers run beside compute (``Settings.overlap``); without it the executor adds a
        transfer to the action that sends it.
    assumptions
        ``tuple[str, ...]``: the instance's assumptions and, if some layer lacks ``bwd_w``,
        :func:`weight_split_assumption` (and the plan's recomputation, if any).
    act_excess
        ``tuple[float, ...]`` per chunk: bytes its backward holds beyond one microbatch's
        ``act_bytes`` while a recomputed layer's activations are re-created
        (``Evaluation.recompute_excess``); ``()``: none.
    state_bytes
        ``tuple[float, ...]`` per chunk: training state beyond its weights, held throughout
        (``Evaluation.state``: gradients, optimizer state, ZeRO's shards); ``()``: none.
    sync
        ``tuple[float, ...]`` per chunk: seconds of its data-parallel synchronisation after the
        flush (``Evaluation.stage_sync``); ``()``: none.
    """

    forward: tuple
    backward: tuple
    input_grad: tuple
    weight_grad: tuple
    send_forward: tuple
    send_backward: tuple
    act_bytes: tuple
    param_bytes: tuple
    memory_capacity: tuple
    overlap: bool = True
    assumptions: tuple = ()
    act_excess: tuple = ()
    state_bytes: tuple = ()
    sync: tuple = ()

    @property
    def chunks(self) -> int:
        """Number of chunks."""
        return len(self.forward)


def _check_chunks(plan: Plan) -> None:
    """Chunks run once each (no replication, no split execution, one backward set), and two
    chunks share devices only if they run on the same worker (the same device list). A chunk
    may recompute (``Stage.recompute``; checked by :func:`pipeopt.cost.check_plan`)."""
    owner: dict = {}
    for s, st in enumerate(plan.stages):
        own_backward = st.bwd_layers is not None and st.bwd_layers != st.layers
        if st.replicas != 1 or st.beta is not None or own_backward:
            raise InvalidPlanError(
                f"chunk {s}: a schedule's chunk runs on one worker with its forward and backward in one"
                " place (no replicas, no forward share beta, no separate bwd_layers)"
            )
        for d in st.devices:
            first = owner.setdefault(d, s)
            if tuple(plan.stages[first].devices) != tuple(st.devices):
                raise InvalidPlanError(
                    f"device {d!r} is used by chunks {first} and {s} with different device lists; chunks on"
                    " one rank must list the same devices"
                )


def pass_times(instance: Instance, plan: Plan) -> PassTimes:
    """F, B, I, W of every chunk and the transfers between chunks, for a schedule to run.

    Parameters
    ----------
    instance
        :class:`pipeopt.Instance` (its cluster's bandwidth and ``settings.overlap`` apply).
    plan
        :class:`pipeopt.Plan` whose stages are the chunks in pipeline order (``p * v`` of them
        for p ranks with v stages each). Chunks on the same rank list the same devices (that
        rank's worker); chunks on different ranks use different devices.

    Returns
    -------
    PassTimes

    Raises
    ------
    InvalidPlanError
        If the chunks are not a valid split (:func:`pipeopt.cost.check_plan`: a dropped or
        repeated layer, an empty chunk, an edge going backwards, a recompute it cannot
        score), a chunk is replicated, has a
        forward share or its own backward set, devices are shared between chunks with
        different device lists, or a chunk holds a layer its worker cannot run.
    """
    if not isinstance(instance, Instance):
        raise InvalidProblemError(f"pass_times needs a pipeopt.Instance, got {type(instance).__name__}")
    if not isinstance(plan, Plan) or plan.num_stages == 0:
        raise InvalidPlanError("a schedule's plan needs at least one chunk")
    _check_chunks(plan)
    cluster = instance.cluster
    known = {d.name for d in cluster.devices}
    for s, st in enumerate(plan.stages):
        missing = [d for d in st.devices if d not in known]
        if missing:
            raise InvalidPlanError(f"chunk {s} uses unknown device {missing[0]!r}")
    # evaluate scores each chunk on its own copy of its rank's devices (a plan's stages may
    # not share devices), with transfers beside compute: its ops are the chunks' F and B
    copies, stages = [], []
    for s, st in enumerate(plan.stages):
        names = []
        for d in st.devices:
            dev = cluster.device(d)
            names.append(f"{d}#{s}")
            copies.append(Device(names[-1], dict(dev.resources), dev.memory))
        stages.append(Stage(st.layers, tuple(names), recompute=st.recompute))
    taken = {c.name for c in copies}  # the unused devices stay (the instance checks the kinds it has)
    copies += [d for d in cluster.devices if d.name not in taken]
    settings = dataclasses.replace(instance.settings, overlap=True, weight_stashing=False, objective="bottleneck")
    virtual = instance.replace(cluster=dataclasses.replace(cluster, devices=tuple(copies)), settings=settings)
    ev = evaluate(virtual, Plan(tuple(stages)))
    bad = [v for v in ev.violations if "can run" in v]
    if bad:
        raise InvalidPlanError(bad[0].replace("stage", "chunk", 1))
    plain = ev  # the chunks without recomputation nor ZeRO: W is theirs, recomputation adds to I only
    data_parallel = settings.data_parallel
    if data_parallel or any(st.recompute for st in stages):
        alone = virtual.replace(settings=Settings(overlap=True, microbatches=settings.microbatches))
        plain = evaluate(alone, Plan(tuple(Stage(st.layers, st.devices) for st in stages)))
    graph = instance.graph
    i_ops, w_ops = [], []
    for s, (st, b_op, b_plain) in enumerate(zip(plan.stages, ev.backward_op, plain.backward_op, strict=True)):
        res, _ = rules.pool((cluster.device(d) for d in st.devices), 1)
        # the ratio of I to W is scale-free: take it on times scaled to about 1 (exactly, by a
        # power of two), so that subnormal times keep their shares
        top = max((t for n in st.layers for t in graph.nodes[n]["bwd"].values() if math.isfinite(t) and t > 0),
                  default=1.0)
        i_load, w_load = backward_split(graph, st.layers, -math.frexp(top)[1])
        ti, tw = rules.load_time(res, i_load), rules.load_time(res, w_load)
        w_op = b_plain * (tw / (ti + tw) if ti + tw > 0 else DEFAULT_W_SHARE)  # no load: the overhead by the default
        if data_parallel:  # ZeRO-2/3's reduce-scatter of the gradients follows W (evaluate's bytes of the chunk)
            w_op += float(rules.zero_backward_scatter(ev.synced_bytes[s], zero=settings.zero, dp=settings.dp,
                                                      bandwidth=cluster.bus_bandwidth, latency=cluster.latency))
        w_ops.append(float(w_op))
        i_ops.append(float(b_op - w_op))
    note = weight_split_assumption(graph)
    return PassTimes(
        forward=tuple(ev.forward_op),
        backward=tuple(ev.backward_op),
        input_grad=tuple(i_ops),
        weight_grad=tuple(w_ops),
        send_forward=tuple(ev.pipeline["x"]),
        send_backward=tuple(ev.pipeline["y"]),
        act_bytes=tuple(ev.activations),
        param_bytes=tuple(float(sum(graph.nodes[n]["param_bytes"] for n in st.layers)) for st in plan.stages),
        memory_capacity=tuple(ev.memory_capacity),
        overlap=instance.settings.overlap,
        assumptions=tuple(instance.assumptions) + ((note,) if note else ()) + tuple(ev.notes),
        act_excess=tuple(ev.recompute_excess),
        state_bytes=tuple(ev.state),
        sync=tuple(ev.stage_sync),
    )
