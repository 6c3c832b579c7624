"""The one cost model: :func:`evaluate` scores every plan of every method.

See docs/cost-model.md (the cost model, and "Objectives: the schedule, exactly"). For stage i on
worker V_i with pooled resources R_{i,k} (per replica), forward layer set P_i and backward
layer set Q_i (= P_i unless Bi-Partition):

* F_k = sum of fwd[k] over P_i, B_k = sum of bwd[k] over Q_i (seconds on one unit of k).
* sequential execution: tau_i = 1 / sum_k R_k / (F_k + B_k); split execution (share beta_k
  of kind k to the forward pass, Duan & Wu 2022): tau_i = max(forward, backward) with
  the two passes running concurrently on their shares. A stage's runtime overhead
  (:func:`rules.stage_overhead`, measured by the torch profile, 0 otherwise) is added to each
  pass once per microbatch (:func:`rules.stage_compute`).
* replication on m workers (PipeDream): a replica runs every m-th microbatch and is busy
  tau_i + W_i per microbatch, W_i = 2 (m - 1) / m * param_bytes / bandwidth (ring
  all-reduce; plus 2 (m - 1) messages' latency): stage time (tau_i + W_i) / m. Each replica's forward and backward ops are
  :func:`rules.replica_ops`.
* communication: a tensor crosses a cut once (:func:`rules.crossing_bytes`); activations go
  forward, gradients back, each direction on its own (full-duplex links): x_c and y_c seconds
  per microbatch over ``min(m_c, m_{c+1})`` links, one message each (alpha-beta:
  ``latency + bytes / bandwidth``, :func:`rules.transfer_time`). With Bi-Partition a layer whose forward
  runs on stage a and backward on stage b != a also sends its input activation a -> b every
  microbatch and its updated weights b -> a once per iteration (param_bytes / M per
  microbatch). With overlap (default) transfers run beside compute; without, the sender's
  ops carry them.
* the objective is the schedule (:mod:`.rules`, :mod:`.schedule`):
  ``bottleneck`` - the steady-state time per microbatch of 1F1B (and of asynchronous
  PipeDream), :func:`rules.steady_period`: the largest of the replicas' own work, each cut
  direction, and the window rows; ``iteration`` - the time of M microbatches under
  1F1B with a flush; ``gpipe`` - the time of M microbatches under GPipe (fill-drain). The
  last two are the longest path through the run's operations (:mod:`.schedule`), the
  value :func:`pipeopt.simulate` measures.
* memory: a replica keeps k_i = ceil(W_i / m_i) microbatches in flight under 1F1B (W_i the
  workers of stages i..S-1; S - i without replication; 2 k_i under split execution; M under
  GPipe); memory = k_i * act + v_i * params, v_i = k_i with weight stashing, else 1.
* measured transients (:mod:`.transient`, graph attribute ``transient_memory``): memory adds
  the outputs a stage keeps (k_i microbatches; the last stage M) and its backward's excess
  over one microbatch's activations (:func:`rules.transient_memory`, :func:`rules.backward_excess`).
* activation recomputation (``Stage.recompute``, :func:`rules.recompute_terms`): a recomputed
  layer keeps its kept bytes per microbatch in flight instead of its ``act_bytes``, and its
  backward load per kind grows by the recomputed forward (so B_k, tau, both ops and every
  objective include it); while a layer's backward runs, the stage holds the kept bytes of the
  layers before it plus that layer's whole ``act_bytes`` (re-created) and its temporaries
  (:func:`rules.backward_peak`): beyond one microbatch's kept bytes this is the backward's
  excess (:func:`rules.backward_excess`), in memory whenever a stage recomputes or the profile
  measured the transients. A recomputed layer's ``saved_twice_bytes`` no longer apply
  (either end of the edge recomputed: counted twice, never under-counted).
* data parallelism and ZeRO (``Settings.dp``, ``zero``, ``gradient_ratio``, ``optimizer_ratio``;
  defaults: none): memory adds the gradients and optimizer state, sharded over the d replicas of
  the pipeline by the ZeRO stage (:func:`rules.sharded_state`); ZeRO-2/3's per-microbatch
  collectives join the ops (:func:`rules.zero_op_times`), and the synchronisation after the flush
  (:func:`rules.zero_sync_time`, the stages in parallel: the largest) is added to ``iteration``
  and ``gpipe`` (:attr:`Evaluation.dp_sync`), not to ``bottleneck``.
* tied parameters (:mod:`.ties`): params of a stage include the ``state_bytes`` of every tie one
  of whose layers it holds (in either pass); each tie's gradient is all-reduced between the
  workers of the stages holding it once per iteration, after the flush
  (:func:`rules.tie_sync_time`): added to ``iteration`` and ``gpipe``, not to ``bottleneck``.
  A stage whose backward holds k >= 2 of a tie's layers also sums their gradient contributions
  k - 1 times per microbatch (:func:`rules.tie_sum_time` of the tie's measured ``sum_s``): added
  to that stage's backward like a layer's time.
* ``max_load`` (Tarnawski et al., NeurIPS 2020): the largest stage *load*, the stage's compute
  tau_i plus the seconds of every tensor it sends or receives (:func:`rules.stage_transfers`,
  each tensor once per stage; none on a ``host`` device); no overlap, no window rows; each
  layer's memory counted once (k_i = 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidPlanError, InvalidProblemError
from ..graph import edge_bytes
from ..instance import Instance
from ..plan import Plan
from . import rules
from .arrays import layer_arrays
from .rules import stage_compute
from .schedule import makespan, run_graph
from .ties import stage_ties, ties_of
from .transient import bwd_temp, has_transient, sink_out_bytes


@dataclass
class Evaluation:
    """What :func:`evaluate` computes for a plan (times in seconds, sizes in bytes).

    Attributes
    ----------
    objective
        The value of ``instance.settings.objective``: :attr:`bottleneck`,
        :attr:`iteration_time` or :attr:`gpipe_time`.
    bottleneck
        Steady-state time per microbatch under 1F1B (:func:`rules.steady_period`): equal to
        what :func:`pipeopt.simulate` measures in the middle of a long 1F1B run.
    throughput
        ``1 / bottleneck``, microbatches per second.
    stage_time
        ``list[float]`` per stage: the time a microbatch takes of the stage
        (``(forward op + backward op) / m``; split execution: the longer op / m).
    forward_time, backward_time
        ``list[float]`` per stage: time of its forward / backward pass alone on its share
        (per microbatch, over its m replicas).
    forward_op, backward_op
        ``list[float]`` per stage: what one replica's forward / backward op takes
        (:func:`rules.replica_ops`; without overlap, with the transfer it sends).
    comm_time
        ``list[float]`` per cut (S - 1 entries): the busier direction's transfer time per
        microbatch over the cut's links (:func:`rules.cut_time`).
    round_trip
        ``list[float]`` per cut: one microbatch's activations forward plus gradients back,
        on one link (what the window rows add; zero without overlap).
    comm_bytes
        ``list[float]`` per cut, forward + backward bytes crossing it.
    comm_bytes_forward, comm_bytes_backward
        ``list[float]`` per cut: bytes towards later stages (activations, migrated input
        activations) and towards earlier stages (gradients, migrated weights).
    memory, memory_capacity
        ``list[float]`` per stage (per replica).
    in_flight
        ``list[int]`` per stage: microbatches a replica keeps under the objective's schedule.
    load
        ``list[float]`` per stage under the ``max_load`` objective: compute plus the transfers
        it sends and receives (empty under the other objectives).
    tied
        ``list[dict]`` per tied parameter (:mod:`pipeopt.cost.ties`): ``name``, ``stages``
        (the stages holding it), ``sync_s`` (its gradient's all-reduce, seconds per iteration),
        ``sum_s`` (seconds per microbatch its gradient sums add to the backward of the stages that
        hold two or more of its layers, :func:`rules.tie_sum_time`; the largest kind's; 0 if none).
    tie_sync
        Seconds per iteration of every tie's all-reduce, one after the other after the flush
        (in :attr:`iteration_time` and :attr:`gpipe_time`; 0 without ties).
    dp_sync
        Seconds per iteration of the data-parallel synchronisation after the flush
        (:func:`rules.zero_sync_time`, the slowest stage's; in :attr:`iteration_time` and
        :attr:`gpipe_time`; 0 with ``Settings.dp = 1``).
    stage_sync
        ``list[float]`` per stage: its own synchronisation after the flush (seconds; the largest
        is :attr:`dp_sync`); empty unless ``Settings.data_parallel``.
    synced_bytes
        ``list[float]`` per stage: the weight bytes its data-parallel collectives move (its
        layers' ``param_bytes`` and its tied weights); empty unless ``Settings.data_parallel``.
    state
        ``list[float]`` per stage, bytes (in :attr:`memory`): the training state beyond one copy
        of the weights (:func:`rules.sharded_state`: gradients, optimizer state, ZeRO-3's
        shards); empty unless the settings ask for it (``Settings.data_parallel``).
    transient
        ``list[float]`` per stage, bytes (in :attr:`memory`): the outputs it keeps and its
        backward's excess, when the profile measured them (:mod:`.transient`; empty otherwise).
    activations
        ``list[float]`` per stage: activation bytes a replica keeps per microbatch in flight,
        a recomputed layer's kept bytes instead of its ``act_bytes``
        (:func:`rules.recompute_terms`); what the simulator and the schedule executor hold per
        microbatch.
    recompute_excess
        ``list[float]`` per stage, bytes: when some stage recomputes, the backward's excess of
        each stage without the measured temporaries (:func:`rules.backward_excess` of
        :func:`rules.backward_peak` with ``temp = 0``: a recomputed layer re-creates its
        activations while its backward runs); empty when nothing is recomputed. In
        :attr:`memory` unless the profile measured the transients, whose excess (in
        :attr:`transient`) includes it; the simulator and the schedule executor add it to a
        microbatch's kept bytes (:attr:`activations`).
    recomputed
        ``list[int]`` per stage: layers whose activations the stage recomputes.
    notes
        ``list[str]``: what the plan adds to the cost model's assumptions (e.g. the
        recomputation it carries), for a result to print.
    iteration_time
        M microbatches under 1F1B with a flush (exact, :mod:`pipeopt.cost.schedule`).
    gpipe_time
        M microbatches under GPipe (exact).
    feasible
        False if a stage exceeds its memory or cannot run a layer.
    violations
        ``list[str]`` naming each violation.
    """

    objective: float
    bottleneck: float
    throughput: float
    stage_time: list
    forward_time: list
    backward_time: list
    comm_time: list
    comm_bytes: list
    memory: list
    memory_capacity: list
    feasible: bool
    violations: list = field(default_factory=list)
    comm_bytes_forward: list = field(default_factory=list)
    comm_bytes_backward: list = field(default_factory=list)
    forward_op: list = field(default_factory=list)
    backward_op: list = field(default_factory=list)
    round_trip: list = field(default_factory=list)
    in_flight: list = field(default_factory=list)
    load: list = field(default_factory=list)
    tied: list = field(default_factory=list)
    tie_sync: float = 0.0
    dp_sync: float = 0.0
    stage_sync: list = field(default_factory=list)
    synced_bytes: list = field(default_factory=list)
    state: list = field(default_factory=list)
    transient: list = field(default_factory=list)
    activations: list = field(default_factory=list)
    recompute_excess: list = field(default_factory=list)
    recomputed: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    pipeline: dict = field(default_factory=dict, repr=False)

    @property
    def bottleneck_stage(self) -> int:
        """Index of the slowest stage."""
        return int(np.argmax(self.stage_time))

    def run_time(self, schedule: str) -> float:
        """Seconds of M microbatches under ``"1f1b"`` (with a flush) or ``"gpipe"``: the longest
        path through the run's operations (:func:`pipeopt.cost.schedule.makespan`), plus the
        tied parameters' all-reduce after the flush (:attr:`tie_sync`) and the data-parallel
        synchronisation (:attr:`dp_sync`)."""
        key = "time_" + schedule
        p = self.pipeline
        if key not in p:
            if not math.isfinite(self.bottleneck):
                p[key] = math.inf
            elif schedule == "gpipe" and max(p["replicas"]) == 1 and not any(p["split"]):
                p[key] = rules.gpipe_time(self.forward_op, self.backward_op, p["x"], p["y"], p["microbatches"])
            else:
                graph = run_graph(schedule, p["replicas"], p["window"], p["split"], p["links"],
                                  p["microbatches"], p["overlap"])
                p[key] = makespan(graph, graph.durations(self.forward_op, self.backward_op, p["x"], p["y"]))[0]
            p[key] = p[key] + self.tie_sync + self.dp_sync  # after the flush: ties, then data parallelism
        return p[key]

    @property
    def iteration_time(self) -> float:
        """M microbatches under 1F1B with a flush (seconds, exact)."""
        return self.run_time("1f1b")

    @property
    def gpipe_time(self) -> float:
        """M microbatches under GPipe, fill-drain (seconds, exact)."""
        return self.run_time("gpipe")


def max_load_objective(settings) -> bool:
    """True under Tarnawski et al.'s ``max_load`` objective (each layer's memory counted once)."""
    return settings.objective == "max_load"


def check_plan(instance, plan: Plan) -> None:
    """Raise :class:`InvalidPlanError` unless ``plan`` is a structurally valid split.

    Checks: at least one stage; every layer in exactly one stage's forward set and exactly
    one stage's backward set; no empty stage; every edge goes forward (stage of tail <=
    stage of head) in both passes; pinned input layers in stage 0; devices known, not
    shared between stages, at least one per stage and a multiple of ``replicas``; shares in
    [0, 1] on kinds the worker has; a stage's ``recompute`` names only its own layers, is not
    on a stage whose backward set differs from its forward set (Bi-Partition: not modelled),
    and asks ``"selective"`` only of layers whose profile measured it
    (:func:`rules.recompute_terms`).

    Raises
    ------
    InvalidPlanError
        Naming the first fault found.
    InvalidProblemError
        If ``instance`` is not a :class:`pipeopt.Instance`.
    """
    _checked(instance, plan)


def recompute_of(graph, plan: Plan) -> list:
    """Each stage's recomputation, checked: ``list`` per stage of ``dict[layer, (kept, extra)]``
    (:func:`rules.recompute_terms`; empty for a stage that recomputes nothing).

    Raises
    ------
    InvalidPlanError
        If a stage recomputes a layer that is not one of its layers, recomputes on a stage
        whose backward set differs from its forward set (Bi-Partition), or asks a mode its
        layer's profile does not give (the message names the stage and the layer).
    """
    out = []
    for i, st in enumerate(plan.stages):
        rc = st.recompute
        if not rc:
            out.append({})
            continue
        if st.bwd_layers is not None and tuple(st.bwd_layers) != tuple(st.layers):
            raise InvalidPlanError(
                f"stage {i} recomputes {len(rc)} layer(s) but its backward set differs from its forward set "
                "(Bi-Partition): recomputation is modelled only where a stage runs both passes of its layers"
            )
        own = set(st.layers)
        foreign = [x for x in rc if x not in own]
        if foreign:
            raise InvalidPlanError(
                f"stage {i} recomputes {foreign[0]!r}, which is not one of its layers"
                + (f" ({len(foreign)} such)" if len(foreign) > 1 else "")
            )
        terms = {}
        for x, mode in rc.items():
            try:
                terms[x] = rules.recompute_terms(graph, x, mode)
            except InvalidPlanError as err:
                raise InvalidPlanError(f"stage {i}: {err}") from None
        out.append(terms)
    return out


def recompute_note(plan: Plan) -> str | None:
    """The assumption line of a plan that recomputes activations (``None`` if it does not):
    how many layers, in which modes, and what that changes in the cost model."""
    modes: dict = {}
    for st in plan.stages:
        for mode in (st.recompute or {}).values():
            modes[mode] = modes.get(mode, 0) + 1
    if not modes:
        return None
    n = sum(modes.values())
    how = ", ".join(f"{c} {m}" for m, c in sorted(modes.items()))
    return (f"recomputed: {n} layer{'s' if n != 1 else ''} ({how}): each keeps its input (full) or its "
            "selective bytes per microbatch in flight instead of its activations, and reruns that forward "
            "before its backward (before I in split-backward schedules)")


@dataclass
class _Pass:
    """Where one pass (forward or backward) puts the layers: ``order`` the layers' indices
    (:class:`pipeopt.cost.arrays.LayerArrays`) stage by stage in the plan's order, ``stage`` the
    stage of each entry of ``order``, ``pos`` the stage of each layer in the arrays' order."""

    order: np.ndarray
    stage: np.ndarray
    pos: np.ndarray


def _layer_pass(arr, plan: Plan, getter) -> _Pass | None:
    """The pass's :class:`_Pass` if every layer is in exactly one non-empty stage, every edge
    goes forward and pinned layers are in stage 0; ``None`` otherwise (then
    :func:`_explain` names the fault)."""
    lens = [len(getter(st)) for st in plan.stages]
    if not all(lens):
        return None
    index, N = arr.index, len(arr.nodes)
    try:
        order = np.array([index[x] for st in plan.stages for x in getter(st)], dtype=np.int64).reshape(-1)
    except (KeyError, TypeError):
        return None
    if order.size != N or (np.bincount(order, minlength=N) != 1).any():
        return None
    stage = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    pos = np.empty(N, dtype=np.int64)
    pos[order] = stage
    if (pos[arr.tail] > pos[arr.head]).any() or (arr.pinned & (pos != 0)).any():
        return None
    return _Pass(order, stage, pos)


def _explain(graph, plan: Plan, same: bool) -> None:
    """Raise the :class:`InvalidPlanError` that names the first fault of the layer sets (the
    check layer by layer, run once :func:`_layer_pass` found one)."""
    for pass_name, getter in (("forward", lambda s: s.layers), ("backward", lambda s: s.backward_layers)):
        if pass_name == "backward" and same:
            break  # the backward pass holds the same layer tuples: checked above
        where: dict = {}
        for i, st in enumerate(plan.stages):
            if not getter(st):
                raise InvalidPlanError(f"stage {i} is empty in the {pass_name} pass")
            for layer in getter(st):
                if layer not in graph:
                    raise InvalidPlanError(f"stage {i} holds unknown layer {layer!r}")
                if layer in where:
                    raise InvalidPlanError(
                        f"layer {layer!r} is in stages {where[layer]} and {i} in the {pass_name} pass"
                    )
                where[layer] = i
        missing = [n for n in graph.nodes if n not in where]
        if missing:
            raise InvalidPlanError(
                f"{len(missing)} layer(s) dropped from the {pass_name} pass, e.g. {missing[:3]!r}"
            )
        for u, v in graph.edges:
            if where[u] > where[v]:
                raise InvalidPlanError(
                    f"edge {u!r} -> {v!r} goes from stage {where[u]} back to stage {where[v]} "
                    f"in the {pass_name} pass (stages must follow the graph)"
                )
        for n, pinned in graph.nodes(data="pin_first"):
            if pinned and where[n] != 0:
                raise InvalidPlanError(f"input layer {n!r} must be in the first stage, not stage {where[n]}")
    raise InvalidPlanError("plan does not split the layers into stages")  # not reached


def _checked(instance, plan: Plan):
    """:func:`check_plan`, returning ``(arrays, forward pass, backward pass, same, recompute)``
    for :func:`evaluate` (``same``: one split for both passes, ``backward is forward``;
    ``recompute``: :func:`recompute_of`)."""
    if not isinstance(instance, Instance):
        raise InvalidProblemError(f"a plan is scored on a pipeopt.Instance, got {type(instance).__name__}")
    if not isinstance(plan, Plan) or plan.num_stages == 0:
        raise InvalidPlanError("plan has no stages")
    graph = instance.graph
    arr = layer_arrays(instance)
    names = {d.name for d in instance.cluster.devices}
    same = all(st.backward_layers is st.layers for st in plan.stages)  # one split for both passes
    fwd = _layer_pass(arr, plan, lambda s: s.layers)
    bwd = fwd if same or fwd is None else _layer_pass(arr, plan, lambda s: s.backward_layers)
    if fwd is None or bwd is None:
        _explain(graph, plan, same)
    used: dict = {}
    for i, st in enumerate(plan.stages):
        if st.replicas < 1 or int(st.replicas) != st.replicas:
            raise InvalidPlanError(f"stage {i} has {st.replicas!r} replicas (a positive integer)")
        if not st.devices:
            raise InvalidPlanError(f"stage {i} has no device")
        if len(st.devices) % st.replicas:
            raise InvalidPlanError(f"stage {i}: {len(st.devices)} devices cannot form {st.replicas} equal replicas")
        for d in st.devices:
            if d not in names:
                raise InvalidPlanError(f"stage {i} uses unknown device {d!r}")
            if d in used:
                raise InvalidPlanError(f"device {d!r} is used by stages {used[d]} and {i}")
            used[d] = i
        if st.beta is not None:
            kinds = {k for d in st.devices for k in instance.cluster.device(d).resources}
            for k, b in st.beta.items():
                if not isinstance(b, (int, float)) or not 0.0 <= b <= 1.0:
                    raise InvalidPlanError(f"stage {i}: forward share of {k!r} is {b!r}, outside [0, 1]")
                if k not in kinds:
                    raise InvalidPlanError(f"stage {i}: share given for {k!r}, which its worker does not have")
    recompute = recompute_of(graph, plan) if any(st.recompute for st in plan.stages) else [{}] * plan.num_stages
    return arr, fwd, bwd, same, recompute


def _stage_sums(times: dict, has: dict, layers: _Pass, S: int) -> list[dict]:
    """F_k (or B_k) of every stage: ``list[dict[kind, seconds]]``, the sum of the stage's layers'
    times on one unit of kind k (``inf`` if one of them has no time for k), over the kinds some
    layer of the stage names; each sum taken in the plan's layer order."""
    sums = {k: np.bincount(layers.stage, weights=v[layers.order], minlength=S).tolist() for k, v in times.items()}
    named = {k: (np.bincount(layers.stage, weights=h[layers.order], minlength=S) > 0).tolist() for k, h in has.items()}
    return [{k: sums[k][i] for k in sums if named[k][i]} for i in range(S)]


def evaluate(instance, plan: Plan) -> Evaluation:
    """Score a plan under the instance's cost model (module docstring; docs/cost-model.md).

    Parameters
    ----------
    instance
        :class:`pipeopt.Instance`.
    plan
        :class:`pipeopt.Plan`; checked first with :func:`check_plan`.

    Returns
    -------
    Evaluation
        Times in seconds, memory in bytes. A plan that exceeds memory is scored
        (``feasible=False`` and ``violations`` say why), not rejected.

    Raises
    ------
    InvalidPlanError
        If the plan is not a valid split (dropped layer, empty stage, ...).
    """
    arr, fpass, bpass, _, recompute = _checked(instance, plan)
    graph, cluster, settings = instance.graph, instance.cluster, instance.settings
    S = plan.num_stages
    bw, alpha = cluster.bandwidth, cluster.latency
    cbw = cluster.bus_bandwidth  # the collectives' (ties, replicas, ZeRO): Cluster.collective_bandwidth
    overhead = rules.stage_overhead(graph)
    reps = [st.replicas for st in plan.stages]
    fpos, bpos = fpass.pos, bpass.pos
    moved = np.flatnonzero(fpos != bpos)  # layers whose backward runs on another stage (Bi-Partition)

    # bytes per cut, forward direction (earlier -> later) and backward direction
    fwd_b = rules.crossing_bytes(arr, fpos, S)
    bwd_b = fwd_b.copy() if not moved.size else rules.crossing_bytes(arr, bpos, S)
    M = settings.microbatches
    for j in moved:  # in the graph's node order
        n = arr.nodes[j]
        a, b = int(fpos[j]), int(bpos[j])
        # Bi-Partition (pipeopt's reading of the abstract): the layer's input, what its backward
        # needs, travels a -> b every microbatch (the bytes on its in-edges; a layer without
        # predecessor: its own act_bytes); the weights updated where the backward runs travel
        # back b -> a once per M microbatches
        preds = list(graph.predecessors(n))
        inp = (sum(edge_bytes(graph, u, n) for u in preds) if preds
               else graph.nodes[n]["act_bytes"])
        act, par = rules.migration_bytes(inp, graph.nodes[n]["param_bytes"], M)
        if a < b:
            fwd_b[a:b] += act
            bwd_b[a:b] += par
        else:
            bwd_b[b:a] += act
            fwd_b[b:a] += par
    links = [min(reps[c], reps[c + 1]) for c in range(S - 1)]
    x = np.asarray(rules.transfer_time(fwd_b, bw, 1, alpha)).tolist()  # one message per cut, microbatch, link
    y = np.asarray(rules.transfer_time(bwd_b, bw, 1, alpha)).tolist()
    comm_time = np.asarray(rules.cut_time(fwd_b, bwd_b, bw, np.array(links, dtype=np.int64), alpha)).tolist()
    objective_name = settings.objective

    # per stage sums over its layers, each in the plan's layer order (np.bincount adds in order)
    F_all, B_all = _stage_sums(arr.fwd, arr.has_fwd, fpass, S), _stage_sums(arr.bwd, arr.has_bwd, bpass, S)
    params_all = np.bincount(fpass.stage, weights=arr.param[fpass.order], minlength=S)
    if moved.size:  # a layer whose passes sit on two stages holds its weights on both
        params_all += np.bincount(bpos[moved], weights=arr.param[moved], minlength=S)
    recomputing = any(recompute)
    kept_act = arr.act
    if recomputing:  # activation recomputation: kept bytes instead of act_bytes, the rerun forward on B
        kept_act = arr.act.copy()
        for i, terms in enumerate(recompute):
            extra_k: dict = {}
            for layer, (kept, extra) in terms.items():
                kept_act[arr.index[layer]] = kept
                for k in B_all[i]:
                    extra_k[k] = extra_k.get(k, 0.0) + extra.get(k, math.inf)
            B_all[i] = {k: v + extra_k.get(k, 0.0) for k, v in B_all[i].items()}
    acts_all = np.bincount(bpass.stage, weights=kept_act[bpass.order], minlength=S)
    ties = ties_of(graph)
    transient = has_transient(graph) and not max_load_objective(settings)
    peaks, rc_excess = [], []  # per stage: the most one microbatch holds while a layer's backward runs
    if transient or recomputing:
        for i, st in enumerate(plan.stages):
            idx = [arr.index[n] for n in st.backward_layers]
            if transient:
                temp = np.array([bwd_temp(graph, n) for n in st.backward_layers])
                peaks.append(rules.backward_peak(kept_act[idx], arr.act[idx], temp))
            if recomputing:  # rules.backward_peak without the measured temporaries
                peak = rules.backward_peak(kept_act[idx], arr.act[idx]) if recompute[i] else 0.0
                rc_excess.append(float(rules.backward_excess(peak, float(acts_all[i]))))
    if transient:  # the outputs a stage keeps and its backward temporaries (pipeopt.cost.transient)
        sent = [*fwd_b.tolist(), sink_out_bytes(graph)]  # per microbatch: what stage i sends; the last: the output
        twice = np.zeros(S)  # per stage: the tensors two of its layers both save, per microbatch
        redone = {n for terms in recompute for n in terms}
        for u, v, nb in graph.edges(data="saved_twice_bytes"):
            # a recomputed end does not save the shared tensor as measured: the term no longer applies
            if nb and bpos[arr.index[u]] == bpos[arr.index[v]] and u not in redone and v not in redone:
                twice[bpos[arr.index[u]]] += nb
    tie_state = np.zeros(S)  # each tie's state_bytes on every stage that holds one of its layers
    tie_bytes = np.zeros(S)  # and its weight bytes (what data parallelism synchronises)
    tied, tie_sync = [], 0.0
    if ties:
        idx = arr.index
        for t, held in zip(ties, stage_ties(ties, lambda x: {int(fpos[idx[x]]), int(bpos[idx[x]])}), strict=True):
            tie_state[held] += t.state_bytes
            tie_bytes[held] += t.bytes
            sync = float(rules.tie_sync_time(t.bytes, sum(reps[s] for s in held), cbw, alpha))
            summed = 0.0
            if t.sum_s:  # a stage whose backward holds k >= 2 of its layers sums their gradients k - 1 times
                users = np.bincount([int(bpos[idx[x]]) for x in t.layers], minlength=S)
                for i in np.flatnonzero(users > 1).tolist():
                    extra = {k: float(rules.tie_sum_time(users[i], t.sum_on(k))) for k in B_all[i]}
                    B_all[i] = {k: v + extra[k] for k, v in B_all[i].items()}
                    summed += max(extra.values(), default=0.0)
            tied.append({"name": t.name, "stages": held, "sync_s": sync, "sum_s": summed})
            tie_sync += sync
    device = {d.name: d for d in cluster.devices}

    max_load = objective_name == "max_load"
    if max_load:
        stage_of = {x: i for i, st in enumerate(plan.stages) for x in st.layers}
        sent = rules.stage_transfer_times(rules.tensors_of(graph), stage_of, S, bw, alpha)
    stage_time, f_time, b_time, f_ops, b_ops, memory, capacity, flight = [], [], [], [], [], [], [], []
    transients: list[float] = []
    data_parallel = settings.data_parallel
    zero = {"zero": settings.zero, "dp": settings.dp}
    states, syncs, synced, dp_sync = [], [], [], 0.0
    loads = []
    windows, splits = [], []
    violations: list[str] = []
    workers_after = np.cumsum(reps[::-1])[::-1]  # workers of stages i..S-1
    for i, st in enumerate(plan.stages):
        m = st.replicas
        split = st.beta is not None
        res, mem_cap = rules.pool((device[d] for d in st.devices), m)
        f, b, tau = stage_compute(res, F_all[i], B_all[i], st.beta, overhead)
        params = float(params_all[i])
        ar = float(rules.allreduce_time(params, m, cbw, alpha)) if m > 1 else 0.0
        if not all(math.isfinite(v) for v in (f, b, tau)):
            violations.append(f"stage {i} holds a layer that none of its worker's resource kinds can run")
            f_op = b_op = math.inf
        else:
            f_op, b_op = rules.replica_ops(tau, f, b, ar, split=split)
            if data_parallel:  # ZeRO-2/3's collectives per microbatch, on the ops
                zf, zb = rules.zero_op_times(params + float(tie_bytes[i]), bandwidth=cbw, latency=alpha, **zero)
                f_op, b_op = f_op + zf, b_op + zb
        if data_parallel:
            synced.append(params + float(tie_bytes[i]))
            syncs.append(float(rules.zero_sync_time(synced[-1], bandwidth=cbw, latency=alpha, **zero)))
            dp_sync = max(dp_sync, syncs[-1])
        f_op, b_op = rules.carried(i, S, f_op, b_op, x, y, settings.overlap)  # without overlap: the sends
        window = rules.in_flight(i, S, workers_after=int(workers_after[i]), replicas=m)
        kept = 1 if max_load else rules.in_flight(i, S, workers_after=int(workers_after[i]), replicas=m,
                                                  split=split, gpipe=objective_name == "gpipe", microbatches=M)
        if max_load:
            host = any(device[d].host for d in st.devices)
            loads.append(float(tau / m + (0.0 if host else sent[i])))
        acts = float(acts_all[i])
        versions = rules.weight_versions(kept, settings.weight_stashing)
        mem = rules.stage_memory(acts, params + float(tie_state[i]), kept, versions)
        if data_parallel:  # gradients and optimizer state, sharded by the ZeRO stage
            largest = max(float(graph.nodes[n]["param_bytes"]) for n in {*st.layers, *st.backward_layers})
            state = float(rules.sharded_state(params + float(tie_state[i]), largest,
                                              gradient_ratio=settings.gradient_ratio,
                                              optimizer_ratio=settings.optimizer_ratio, **zero))
            states.append(state)
            mem += state
        if transient:
            once = rules.saved_once(kept, twice[i])  # (<= 0) a tensor two layers save, held once
            extra = float(rules.transient_memory(sent[i], rules.outputs_kept(kept, i == S - 1, M),
                                                 rules.backward_excess(peaks[i], acts),
                                                 rules.merged_output(sent[i], i == S - 1, M), kept * acts + once)
                          + once)
            transients.append(extra)
            mem += extra
        elif recomputing:  # a recomputed layer re-creates its activations while its backward runs
            mem += rc_excess[i]
        if not rules.fits(mem, mem_cap):
            violations.append(
                f"stage {i} needs {mem / 2**30:.3f} GiB but its worker has {mem_cap / 2**30:.3f} GiB"
            )
        stage_time.append((max(f_op, b_op) if split else f_op + b_op) / m)
        f_time.append(f / m)
        b_time.append(b / m)
        f_ops.append(float(f_op))
        b_ops.append(float(b_op))
        memory.append(float(mem))
        capacity.append(float(mem_cap))
        flight.append(int(kept))
        windows.append(int(window))
        splits.append(split)

    on_links = rules.on_links(x, y, settings.overlap, S)
    if all(map(math.isfinite, f_ops + b_ops)):
        bottleneck = rules.steady_period(f_ops, b_ops, reps, windows, splits, *on_links, links)
    else:
        bottleneck = math.inf
    pipeline = {"replicas": reps, "window": windows, "split": splits, "links": links, "microbatches": M,
                "overlap": settings.overlap, "x": on_links[0], "y": on_links[1]}
    ev = Evaluation(
        objective=float(bottleneck),
        bottleneck=float(bottleneck),
        throughput=1.0 / bottleneck if bottleneck > 0 else math.inf,
        stage_time=[float(v) for v in stage_time],
        forward_time=[float(v) for v in f_time],
        backward_time=[float(v) for v in b_time],
        comm_time=comm_time,
        comm_bytes=(fwd_b + bwd_b).tolist(),
        comm_bytes_forward=fwd_b.tolist(),
        comm_bytes_backward=bwd_b.tolist(),
        memory=memory,
        memory_capacity=capacity,
        feasible=not violations,
        violations=violations,
        forward_op=f_ops,
        backward_op=b_ops,
        round_trip=[a + b for a, b in zip(*on_links, strict=True)],
        in_flight=flight,
        load=loads,
        tied=tied,
        tie_sync=float(tie_sync),
        dp_sync=float(dp_sync),
        stage_sync=syncs,
        synced_bytes=synced,
        state=states,
        transient=transients,
        activations=[float(v) for v in acts_all],
        recompute_excess=rc_excess,
        recomputed=[len(t) for t in recompute],
        notes=[n for n in (recompute_note(plan),) if n],
        pipeline=pipeline,
    )
    if objective_name == "iteration":
        ev.objective = ev.iteration_time
    elif objective_name == "gpipe":
        ev.objective = ev.gpipe_time
    elif max_load:
        ev.objective = max(loads)
    return ev
