"""The one cost model: :func:`evaluate` scores every plan of every method.

See DESIGN.md, "The cost model". Summary, for stage i on worker V_i with pooled resources
R_{i,k} (per replica), forward layer set P_i and backward layer set Q_i (= P_i unless
Bi-Partition):

* F_k = sum of fwd[k] over P_i, B_k = sum of bwd[k] over Q_i (seconds on one unit of k).
* sequential execution: tau_i = 1 / sum_k R_k / (F_k + B_k).
* split execution (share beta_k of kind k to the forward pass, Duan & Wu 2022):
  tau_i = 1 / min(sum_k beta_k R_k / F_k, sum_k (1 - beta_k) R_k / B_k).
* replication on m workers (PipeDream): tau_i = (c_i + W_i) / m with c_i the per-replica
  compute time and W_i = 2 (m - 1) / m * param_bytes / bandwidth (ring all-reduce).
* communication at the cut after stage c: forward bytes (activations of crossing edges) and
  backward bytes (gradients of crossing edges); with Bi-Partition a layer whose forward runs on
  stage a and backward on stage b != a also sends its stashed activation a -> b every
  microbatch and its updated weights b -> a once per iteration (param_bytes / M per
  microbatch), across every cut between a and b; time
  C_c = (forward + backward bytes) / (bandwidth * min(m_c, m_{c+1})).
* with overlap (default) the time per microbatch (bottleneck) is max(max_i tau_i, max_c C_c);
  without overlap each stage pays what it sends (its forward bytes and its backward bytes,
  divided by its replicas, each of which sends its own microbatches' transfers).
* memory (1F1B): stage i keeps k_i = ceil(W_i / m_i) microbatches in flight, W_i the workers
  of stages i..S-1 (k_i = S - i without replication; M under GPipe); memory = k_i * act +
  v_i * params, v_i = k_i with weight stashing, else 1. Capacity = the worker's memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidPlanError, InvalidProblemError
from ..instance import Instance
from ..plan import Plan
from . import rules
from .rules import stage_compute


@dataclass
class Evaluation:
    """What :func:`evaluate` computes for a plan (times in seconds, sizes in bytes).

    Attributes
    ----------
    objective
        The value of ``instance.settings.objective`` (default the bottleneck).
    bottleneck
        Steady-state time per microbatch.
    throughput
        ``1 / bottleneck``, microbatches per second.
    stage_time
        ``list[float]`` per stage: tau_i (plus its transfers without overlap).
    forward_time, backward_time
        ``list[float]`` per stage: time of its forward / backward pass alone on its share.
    comm_time
        ``list[float]`` per cut (S - 1 entries).
    comm_bytes
        ``list[float]`` per cut, forward + backward bytes crossing it.
    comm_bytes_forward, comm_bytes_backward
        ``list[float]`` per cut: bytes towards later stages (activations, migrated stashed
        activations) and towards earlier stages (gradients, migrated weights).
    memory, memory_capacity
        ``list[float]`` per stage (per replica).
    iteration_time
        Estimate for M microbatches: ``sum_i t_i + (M - 1) * bottleneck`` (flow shop).
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
    iteration_time: float
    feasible: bool
    violations: list = field(default_factory=list)
    comm_bytes_forward: list = field(default_factory=list)
    comm_bytes_backward: list = field(default_factory=list)

    @property
    def bottleneck_stage(self) -> int:
        """Index of the slowest stage."""
        return int(np.argmax(self.stage_time))


def check_plan(instance, plan: Plan) -> None:
    """Raise :class:`InvalidPlanError` unless ``plan`` is a structurally valid split.

    Checks: at least one stage; every layer in exactly one stage's forward set and exactly
    one stage's backward set; no empty stage; every edge goes forward (stage of tail <=
    stage of head) in both passes; pinned input layers in stage 0; devices known, not
    shared between stages, at least one per stage and a multiple of ``replicas``; shares in
    [0, 1] on kinds the worker has.
    """
    if not isinstance(instance, Instance):
        raise InvalidProblemError(f"a plan is scored on a pipeopt.Instance, got {type(instance).__name__}")
    graph = instance.graph
    if not isinstance(plan, Plan) or plan.num_stages == 0:
        raise InvalidPlanError("plan has no stages")
    names = {d.name for d in instance.cluster.devices}
    for pass_name, getter in (("forward", lambda s: s.layers), ("backward", lambda s: s.backward_layers)):
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


def _sum_costs(graph, layers, key: str) -> dict:
    out: dict = {}
    kinds = {k for n in layers for k in graph.nodes[n][key]}
    for k in kinds:
        out[k] = sum(graph.nodes[n][key].get(k, math.inf) for n in layers)
    return out


def evaluate(instance, plan: Plan) -> Evaluation:
    """Score a plan under the instance's cost model (module docstring; DESIGN.md).

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
    check_plan(instance, plan)
    graph, cluster, settings = instance.graph, instance.cluster, instance.settings
    S = plan.num_stages
    bw = cluster.bandwidth
    fstage = {n: i for i, st in enumerate(plan.stages) for n in st.layers}
    bstage = {n: i for i, st in enumerate(plan.stages) for n in st.backward_layers}
    reps = [st.replicas for st in plan.stages]

    # bytes per cut, forward direction (earlier -> later) and backward direction
    fwd_b = rules.crossing_bytes(graph, fstage, S)
    bwd_b = rules.crossing_bytes(graph, bstage, S)
    M = settings.microbatches
    for n in graph.nodes:
        a, b = fstage[n], bstage[n]
        if a != b:  # Bi-Partition: the stashed activation travels a -> b every microbatch;
            # the weights updated where the backward runs travel back b -> a once per M microbatches
            act, par = rules.migration_bytes(graph.nodes[n]["act_bytes"], graph.nodes[n]["param_bytes"], M)
            if a < b:
                fwd_b[a:b] += act
                bwd_b[a:b] += par
            else:
                bwd_b[b:a] += act
                fwd_b[b:a] += par
    links = [min(reps[c], reps[c + 1]) for c in range(S - 1)]
    comm_time = [rules.cut_time(fwd_b[c], bwd_b[c], bw, links[c]) for c in range(S - 1)]

    stage_time, f_time, b_time, memory, capacity = [], [], [], [], []
    violations: list[str] = []
    workers_after = np.cumsum(reps[::-1])[::-1]  # workers of stages i..S-1
    for i, st in enumerate(plan.stages):
        m = st.replicas
        res, mem_cap = rules.pool((cluster.device(d) for d in st.devices), m)
        F = _sum_costs(graph, st.layers, "fwd")
        B = _sum_costs(graph, st.backward_layers, "bwd")
        f, b, tau = stage_compute(res, F, B, st.beta)
        params = sum(graph.nodes[n]["param_bytes"] for n in set(st.layers) | set(st.backward_layers))
        if m > 1:
            tau = rules.replicated_time(tau, params, m, bw)
            f, b = f / m, b / m
        if not settings.overlap:  # each replica sends its own microbatches' transfers
            if i < S - 1:
                tau += rules.transfer_time(fwd_b[i], bw, m)
            if i > 0:
                tau += rules.transfer_time(bwd_b[i - 1], bw, m)
        if not math.isfinite(tau):
            violations.append(f"stage {i} holds a layer that none of its worker's resource kinds can run")
        in_flight = rules.in_flight(i, S, workers_after=int(workers_after[i]), replicas=m,
                                    gpipe=settings.objective == "gpipe", microbatches=M)
        acts = sum(graph.nodes[n]["act_bytes"] for n in st.backward_layers)
        versions = rules.weight_versions(in_flight, settings.weight_stashing)
        mem = rules.stage_memory(acts, params, in_flight, versions)
        if not rules.fits(mem, mem_cap):
            violations.append(
                f"stage {i} needs {mem / 2**30:.3f} GiB but its worker has {mem_cap / 2**30:.3f} GiB"
            )
        stage_time.append(tau)
        f_time.append(f)
        b_time.append(b)
        memory.append(float(mem))
        capacity.append(float(mem_cap))

    if settings.overlap:
        bottleneck = max(stage_time + comm_time)
        flow = [x for i in range(S) for x in ([stage_time[i], comm_time[i]] if i < S - 1 else [stage_time[i]])]
    else:
        bottleneck = max(stage_time)
        flow = list(stage_time)
    iteration = sum(flow) + (M - 1) * bottleneck
    if settings.objective == "bottleneck":
        objective = bottleneck
    elif settings.objective == "makespan":
        objective = iteration
    else:  # gpipe: max_i F_i + max_i B_i, each phase also limited by its transfers
        fc = [rules.transfer_time(fwd_b[c], bw, links[c]) for c in range(S - 1)]
        bc = [rules.transfer_time(bwd_b[c], bw, links[c]) for c in range(S - 1)]
        objective = max(f_time + (fc if settings.overlap else [])) + max(b_time + (bc if settings.overlap else []))
    return Evaluation(
        objective=float(objective),
        bottleneck=float(bottleneck),
        throughput=1.0 / bottleneck if bottleneck > 0 else math.inf,
        stage_time=[float(x) for x in stage_time],
        forward_time=[float(x) for x in f_time],
        backward_time=[float(x) for x in b_time],
        comm_time=[float(x) for x in comm_time],
        comm_bytes=[float(fwd_b[c] + bwd_b[c]) for c in range(S - 1)],
        comm_bytes_forward=[float(x) for x in fwd_b],
        comm_bytes_backward=[float(x) for x in bwd_b],
        memory=memory,
        memory_capacity=capacity,
        iteration_time=float(iteration),
        feasible=not violations,
        violations=violations,
    )
