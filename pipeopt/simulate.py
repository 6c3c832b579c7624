"""Discrete-event simulation of one training iteration of a pipeline plan.

:func:`simulate` plays M microbatches of a :class:`~pipeopt.plan.Plan` through its stages
under one of four schedules and measures what the pipeline does: the iteration time, the
steady-state time per microbatch, the bubble, per-stage utilisation and peak memory, and the
full event trace (for :func:`pipeopt.plot.plot_schedule`).

One cost model
--------------
The simulator takes every duration from :func:`pipeopt.cost.evaluate`, so that it can only
disagree with the cost model through *scheduling*, never through different numbers:

* a replica of stage i runs microbatch j's forward op for ``forward_op[i]`` seconds and its
  backward op for ``backward_op[i]`` (:class:`~pipeopt.cost.Evaluation`,
  :func:`pipeopt.cost.rules.replica_ops`): its compute plus the share of the replicas'
  all-reduce the cost model spreads over the microbatches, split between the two ops in the
  ratio forward : backward. With one resource kind and no replication these are exactly the
  stage's forward and backward times;
* split execution (Duan & Wu): the forward op runs on the forward share beta of the worker
  and the backward op on the other share, concurrently, each in its own *lane*;
* replicated stages: microbatch j goes to replica ``j mod m_i`` (round robin);
* communication: microbatch j's activations leave stage i when its forward op ends and
  occupy a link to stage i+1 for ``x_i = comm_bytes_forward[i] / bandwidth`` seconds; its
  gradients go back the same way, ``y_i = comm_bytes_backward[i] / bandwidth``, when the
  backward op of stage i+1 ends. A tensor crosses a cut once
  (:func:`pipeopt.cost.rules.crossing_bytes`). Links are **full duplex** (NVLink,
  InfiniBand, Ethernet): each direction is its own channel, so activations and gradients
  travel at once, and a channel carries its microbatches in program order (the order its
  sender produces them). A cut between replicated stages has ``L = min(m_i, m_{i+1})`` links;
  microbatch j uses link ``j mod L``. Transfers overlap compute: they occupy the link, not
  the worker. Without overlap (``Settings(overlap=False)``) the sender's op carries its
  transfer (a blocking send) and the data is there when the op ends;
* ``half_duplex=True``: each link is one channel for both directions, serving transfers first
  come first served (outside the cost model; below);
* memory: a microbatch's activations are held from the start of its forward to the end of its
  backward on the stage (``act_bytes`` of the stage's layers; a recomputed layer's kept bytes
  instead, ``Evaluation.activations``), plus the stage's parameters (one version, or one per
  microbatch in flight under ``"async"``); while it holds a microbatch a stage that recomputes
  also holds its backward's excess (``Evaluation.recompute_excess``: a recomputed layer's
  re-created activations); with data parallelism the training state beyond the weights
  (``Evaluation.state``: gradients, optimizer state, ZeRO's shards) is held throughout;
* data parallelism (``Settings.dp``, ``zero``): the ZeRO collectives per microbatch are in the
  ops (from ``evaluate``); the synchronisation after the flush (``Evaluation.dp_sync``) is added
  to the iteration time of a finite run (1F1B, GPipe, split), as the cost model adds it;
* tied parameters: their gradients' all-reduce after the flush (``Evaluation.tie_sync``) is added
  the same way, and a stage holding two of a tie's layers sums their gradients in its backward
  op (from ``evaluate``: :func:`pipeopt.cost.rules.tie_sum_time`).

Bi-Partition plans (different forward and backward cuts) play like any other: a stage's
forward op covers its forward layers and its backward op its backward layers, and each link
carries the bytes :class:`~pipeopt.cost.Evaluation` reports per direction
(``comm_bytes_forward`` / ``comm_bytes_backward``, migrated inputs and weights included).

Schedules
---------
The op order of every replica is :func:`pipeopt.cost.schedule.lane_orders`, microbatches
dealt round robin over a stage's replicas (:func:`pipeopt.cost.schedule.replica_lanes`): the
one definition the cost model's longest paths read too. Every op starts as soon as the op
before it in its lane has ended and its data is there (the activation from the previous stage, the
gradient from the next one).

``"gpipe"``
    Fill-drain (Huang et al., GPipe, NeurIPS 2019): every replica runs the forwards of all its
    microbatches, then their backwards, in microbatch order. Holds all M activations.
``"1f1b"``
    PipeDream-Flush (Narayanan et al., PipeDream-2BW, ICML 2021): a replica of stage i runs a
    warm-up of ``k_i = ceil(W_i / m_i)`` forwards (``W_i`` workers of stages i..S-1; ``S - i``
    without replication; PipeDream's runtime computes the same number as
    ``num_warmup_minibatches + 1 = (W_i - 1) // m_i + 1``), then alternates one backward and
    one forward, then cools down; a flush ends the iteration.
``"async"``
    Asynchronous PipeDream (Narayanan et al., SOSP 2019) with weight stashing: 1F1B without
    flushes. Simulated as a long run; ``time_per_microbatch`` is the steady-state spacing of
    completions in the middle of the run and ``iteration_time`` is
    ``M * time_per_microbatch``. Every in-flight microbatch keeps its own weight version.
``"split"``
    Duan & Wu (ICPADS 2022) split execution: the forward and backward passes of different
    microbatches run concurrently on the beta / 1 - beta shares of each worker (the plan's
    ``Stage.beta``), each lane in microbatch order. A replica admits the forward of microbatch
    j only after the backward of microbatch ``j - 2 k_i m_i`` (at most ``2 k_i`` in flight:
    twice 1F1B's window, so that both lanes can be busy).

The simulator equals the cost model
-----------------------------------
:func:`pipeopt.evaluate`'s objectives are this simulation, computed another way
(docs/cost-model.md, "Objectives: the schedule, exactly"):

* **steady state**: with every order fixed the pipeline is a max-plus linear system, and
  ``evaluate(...).bottleneck`` is its cycle time in closed form
  (:func:`pipeopt.cost.rules.steady_period`): the largest of each replica's own work, each
  link direction's transfers and the **window rows** (a microbatch's round trip from stage i
  up to stage l and back, over the microbatches the window lets stages i..l hold). The
  simulated ``time_per_microbatch`` of ``"1f1b"`` and ``"async"`` equals ``bottleneck``, and
  that of ``"split"`` equals the ``bottleneck`` of the plan with its beta;
* **finite M**: ``evaluate(...).iteration_time`` (1F1B with a flush; a split plan: the split
  schedule) and ``.gpipe_time`` are the longest path through the run's operations under the
  same orders (:func:`pipeopt.cost.schedule.run_graph`; GPipe without replication or split
  execution in closed form, :func:`pipeopt.cost.rules.gpipe_time`), equal to the simulated
  ``iteration_time`` of ``"1f1b"`` / ``"split"`` and ``"gpipe"``;
* **links**: full duplex, each direction in program order, in both.

``tests/cost/test_schedule_exact.py`` keeps them equal (relative error <= 1e-9) on random
layer graphs (chains and DAGs with skip edges), random straight, replicated, split-execution
and Bi-Partition plans, overlap on and off, random M, and on random splits of the real
PipeDream profiles. The engine here is event driven and shares nothing with the longest path
but the op orders and the durations, so each checks the other.

What remains different
----------------------
* **Half-duplex links** (``half_duplex=True``) are outside the cost model. They matter when
  a light stage sits between two heavy cuts: its activations and the gradients coming back
  queue behind each other. VGG16 on 4 stages at the split [5, 6, 13] (the DP's before the
  window rows) runs at 252.1 ms per microbatch half duplex, ``C_0 + tau_1 + C_1`` (the round
  trips of both cuts and the light stage between them, serialised), against 235.6 ms full
  duplex, which is ``evaluate(...).bottleneck``.
* **Memory** is measured, not counted. 1F1B peaks at the cost model's ``k_i`` microbatches of
  activations plus one weight version once M fills the windows (fewer with fewer
  microbatches); GPipe holds M, as ``Settings(objective="gpipe")`` counts; split execution
  admits up to ``2 k_i`` microbatches (:func:`pipeopt.cost.rules.in_flight` with
  ``split=True``, what ``evaluate`` counts for a plan with beta). Asynchronous PipeDream keeps
  ``k_i`` weight versions besides ``k_i`` activations, while the cost model counts weight
  versions only with ``Settings(weight_stashing=True)``.
* **Asynchronous PipeDream has no iteration**: its ``iteration_time`` is
  ``M * time_per_microbatch``, not ``evaluate(...).iteration_time`` (which flushes).
* **GPipe's rate** (its ``time_per_microbatch``, the slope of the iteration time in M) is
  the slowest forward machine plus the slowest backward machine, not the 1F1B ``bottleneck``
  that :attr:`SimulationResult.bottleneck` reports for every schedule.

References
----------
Narayanan et al., PipeDream: Generalized Pipeline Parallelism for DNN Training, SOSP 2019.
Narayanan et al., Memory-Efficient Pipeline-Parallel DNN Training (PipeDream-2BW / Flush),
ICML 2021. Huang et al., GPipe, NeurIPS 2019. Duan & Wu, Optimizing Resource Allocation in
Pipeline Parallelism for Distributed DNN Training, ICPADS 2022. Jia, Zaharia & Aiken, Beyond
Data and Model Parallelism for Deep Neural Networks (FlexFlow's execution simulator), SysML
2019. Baccelli, Cohen, Olsder & Quadrat, Synchronization and Linearity, Wiley 1992 (the cycle
time of a max-plus system).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .cost import Evaluation, evaluate, rules
from .cost.schedule import replica_lanes
from .instance import Instance
from .errors import InvalidPlanError, InvalidProblemError
from .plan import Plan

SCHEDULES = ("gpipe", "1f1b", "async", "split")
"""Schedule names accepted by :func:`simulate`."""


class Event(NamedTuple):
    """One interval of the trace.

    Attributes
    ----------
    stage
        Stage index (0-based). For ``"comm"`` events: the *sending* stage.
    kind
        ``"F"`` (forward), ``"B"`` (backward) or ``"comm"`` (a transfer).
    microbatch
        Microbatch index (0-based).
    start, end
        Seconds from the start of the iteration.
    """

    stage: int
    kind: str
    microbatch: int
    start: float
    end: float


@dataclass
class SimulationResult:
    """What :func:`simulate` measured (times in seconds, memory in bytes).

    Attributes
    ----------
    schedule
        ``"gpipe"``, ``"1f1b"``, ``"async"`` or ``"split"``.
    microbatches
        M.
    iteration_time
        Time from the first forward to the last backward of the M microbatches (async:
        ``M * time_per_microbatch``).
    time_per_microbatch
        Steady-state time per microbatch: for GPipe the slope of the iteration time in M
        (``(t(2N) - t(N)) / N`` for a large N); for the other schedules the spacing of the first
        backward completions (and link transfers) in the middle of a run of 2N microbatches,
        taken where they are slowest (a stage with slack can lag in a long transient).
    throughput
        ``1 / time_per_microbatch``, microbatches per second (steady state).
    bubble_fraction
        Share of worker time spent idle during the iteration (async: in steady state).
    utilisation
        ``list[float]`` per stage: share of its replicas' time spent computing.
    peak_memory
        ``list[float]`` per stage, bytes per replica: peak activations plus weight versions.
    peak_in_flight
        ``list[int]`` per stage: most microbatches whose activations a replica held at once.
    memory_capacity
        ``list[float]`` per stage: memory of one replica's worker (from ``evaluate``).
    replicas
        ``list[int]`` per stage.
    bottleneck
        The cost model's 1F1B steady-state time per microbatch,
        ``evaluate(instance, plan).bottleneck`` (equal to ``time_per_microbatch`` under
        ``"1f1b"``, ``"async"`` and, for the plan with its beta, ``"split"``).
    analytic_iteration_time
        The cost model's time of the same M microbatches under this schedule:
        ``evaluate(...).iteration_time`` (``"1f1b"``, ``"split"``), ``.gpipe_time``
        (``"gpipe"``), ``M * bottleneck`` (``"async"``); equal to ``iteration_time``.
    events
        ``list[Event]``: ``(stage, kind, microbatch, start, end)`` in order of completion.
    event_details
        ``list[tuple[replica, lane, direction]]`` parallel to ``events``: the replica, the lane
        (``"FB"`` sequential, ``"F"`` / ``"B"`` in split execution, ``"link"`` or ``"worker"``
        for transfers) and ``"fwd"`` / ``"bwd"`` for transfers (``""`` otherwise).
    memory_trace
        ``list[tuple[stage, replica, time, bytes]]``: a replica's memory after every change.
    notes
        ``list[str]``: modelling choices that applied to this plan.
    """

    schedule: str
    microbatches: int
    iteration_time: float
    time_per_microbatch: float
    throughput: float
    bubble_fraction: float
    utilisation: list
    peak_memory: list
    peak_in_flight: list
    memory_capacity: list
    replicas: list
    bottleneck: float
    analytic_iteration_time: float
    events: list = field(default_factory=list, repr=False)
    event_details: list = field(default_factory=list, repr=False)
    memory_trace: list = field(default_factory=list, repr=False)
    notes: list = field(default_factory=list)

    @property
    def num_stages(self) -> int:
        """S."""
        return len(self.replicas)

    def summary(self) -> str:
        """A few lines: iteration and steady state, each beside the cost model's value
        (:func:`pipeopt.evaluate`, exact: equal to the simulated one unless ``half_duplex``),
        bubble, and per stage utilisation and peak memory."""
        ratio = self.time_per_microbatch / self.bottleneck if self.bottleneck > 0 else math.nan
        head = (
            f"{self.schedule}: {self.microbatches} microbatches, iteration {self.iteration_time * 1e3:.4f} ms"
            f" (evaluation, pipeopt.evaluate: {self.analytic_iteration_time * 1e3:.4f} ms)"
        )
        steady = (
            f"  steady state {self.time_per_microbatch * 1e3:.4f} ms per microbatch"
            f" = {ratio:.4f} x the bottleneck of pipeopt.evaluate {self.bottleneck * 1e3:.4f} ms;"
            f" bubble {self.bubble_fraction:.1%}"
        )
        lines = [head, steady]
        for i in range(self.num_stages):
            rep = f" x{self.replicas[i]}" if self.replicas[i] > 1 else ""
            cap = self.memory_capacity[i]
            cap_text = f" of {cap / 2**30:.3f}" if math.isfinite(cap) else ""
            lines.append(
                f"  stage {i}{rep}: utilisation {self.utilisation[i]:.1%}, peak memory"
                f" {self.peak_memory[i] / 2**30:.3f}{cap_text} GiB, in flight {self.peak_in_flight[i]}"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def to_dict(self, events: bool = False) -> dict:
        """JSON-ready dict of the measurements (seconds, bytes).

        Parameters
        ----------
        events
            Also include the trace as ``"events"``: a list of ``[stage, kind, microbatch,
            start, end]``.
        """
        d = {
            "schedule": self.schedule,
            "microbatches": self.microbatches,
            "stages": self.num_stages,
            "replicas": list(self.replicas),
            "iteration_time": self.iteration_time,
            "time_per_microbatch": self.time_per_microbatch,
            "throughput": self.throughput,
            "bubble_fraction": self.bubble_fraction,
            "utilisation": list(self.utilisation),
            "peak_memory": list(self.peak_memory),
            "peak_in_flight": list(self.peak_in_flight),
            "memory_capacity": [c if math.isfinite(c) else None for c in self.memory_capacity],
            "bottleneck": self.bottleneck,
            "analytic_iteration_time": self.analytic_iteration_time,
            "notes": list(self.notes),
        }
        if events:
            d["events"] = [[e.stage, e.kind, e.microbatch, e.start, e.end] for e in self.events]
        return d

    def to_frame(self):
        """The trace as a :class:`pandas.DataFrame`.

        Columns: ``stage, replica, lane, kind, direction, microbatch, start, end, duration``.
        """
        import pandas as pd

        rows = [
            (e.stage, d[0], d[1], e.kind, d[2], e.microbatch, e.start, e.end, e.end - e.start)
            for e, d in zip(self.events, self.event_details, strict=True)
        ]
        cols = ["stage", "replica", "lane", "kind", "direction", "microbatch", "start", "end", "duration"]
        return pd.DataFrame(rows, columns=cols)


# ---------------------------------------------------------------------------------------------
# per-stage numbers, all read from evaluate()


@dataclass(frozen=True)
class _Pipeline:
    """Durations the engine plays (seconds per op on one replica) and memory per microbatch."""

    replicas: list  # m_i
    f_op: list  # forward op on one replica
    b_op: list  # backward op on one replica
    fwd_xfer: list  # per cut: one activation transfer on one link
    bwd_xfer: list  # per cut: one gradient transfer on one link
    links: list  # per cut: parallel links
    overlap: bool
    window: list  # k_i, 1F1B warm-up / in-flight bound per replica
    act: list  # activation bytes kept per microbatch, per stage
    params: list  # parameter bytes per stage
    fwd_share: list  # split execution: forward share of the worker's resources
    half_duplex: bool = False  # one channel per link for both directions, first come first served
    excess: list | None = None  # per stage: the backward's excess while a microbatch is held (recomputation)
    state: list | None = None  # per stage: training state beyond the weights (data parallelism), always held

    @property
    def S(self) -> int:
        return len(self.replicas)


def _pipeline(instance, plan: Plan, split: bool, notes: list, half_duplex: bool) -> tuple[_Pipeline, Evaluation]:
    if not split and any(st.beta is not None for st in plan.stages):
        plan = Plan(tuple(dataclasses.replace(st, beta=None) for st in plan.stages))
        notes.append("forward shares (beta) ignored: this schedule runs forward and backward one after the other")
    ev = evaluate(instance, plan)
    if not ev.feasible and any("cannot run" in v for v in ev.violations):
        raise InvalidPlanError("; ".join(v for v in ev.violations if "cannot run" in v))
    reps = [st.replicas for st in plan.stages]
    bw, alpha = instance.cluster.bandwidth, instance.cluster.latency
    graph = instance.graph
    act = list(ev.activations)  # kept bytes per microbatch (recomputed layers: their kept bytes)
    params = [
        float(sum(graph.nodes[n]["param_bytes"] for n in set(st.layers) | set(st.backward_layers)))
        for st in plan.stages
    ]
    share = []
    for st in plan.stages:
        if st.beta is None:
            share.append(1.0)
            continue
        res: dict = {}
        for d in st.devices:
            for k, r in instance.cluster.device(d).resources.items():
                res[k] = res.get(k, 0.0) + r
        tot = sum(res.values())
        share.append(sum(st.beta.get(k, 0.0) * r for k, r in res.items()) / tot if tot > 0 else 0.5)
    pipe = _Pipeline(
        replicas=reps,
        f_op=list(ev.forward_op),
        b_op=list(ev.backward_op),
        fwd_xfer=[float(rules.transfer_time(v, bw, 1, alpha)) for v in ev.comm_bytes_forward],
        bwd_xfer=[float(rules.transfer_time(v, bw, 1, alpha)) for v in ev.comm_bytes_backward],
        links=list(ev.pipeline["links"]),
        overlap=instance.settings.overlap,
        window=list(ev.pipeline["window"]),
        act=act,
        params=params,
        fwd_share=share,
        half_duplex=half_duplex,
        excess=list(ev.recompute_excess) or None,
        state=list(ev.state) or None,
    )
    return pipe, ev


# ---------------------------------------------------------------------------------------------
# the engine


@dataclass
class _Run:
    """Raw output of one engine run."""

    events: list
    details: list
    f_start: list  # [stage][mb]
    held: dict  # (stage, replica) -> [(time, +1 / -1)] in causal order: activations taken / freed
    b_end: list  # [stage][mb]
    arrivals: list  # per cut: activation and gradient arrival times, [2 (S - 1)][mb]
    makespan: float


def _run(p: _Pipeline, kind: str, M: int) -> _Run:
    """Play M microbatches; ``kind`` is ``"gpipe"``, ``"1f1b"`` or ``"split"``."""
    S, reps = p.S, p.replicas
    nan = math.nan
    act_at = [[0.0] * M] + [[nan] * M for _ in range(S - 1)]  # activation j available at stage i
    grad_at = [[nan] * M for _ in range(S - 1)] + [[nan] * M]  # gradient j available at stage i
    f_end = [[nan] * M for _ in range(S)]
    f_start = [[nan] * M for _ in range(S)]
    b_end = [[nan] * M for _ in range(S)]
    split = kind == "split"
    orders = replica_lanes("gpipe" if kind == "gpipe" else "1f1b", reps, p.window, [split] * S, M)
    # (i, r, lane) -> [ops, ptr, busy, op_start]
    lanes: dict = {key: [ops, 0, False, 0.0] for key, ops in orders.items()}
    f_lane = "F" if split else "FB"
    b_lane = "B" if split else "FB"
    # a link: full duplex (default), one channel per direction serving its microbatches in
    # order (j, j + L, ...: the senders' program order); half duplex, one channel for both
    # directions serving transfers first come first served
    if p.half_duplex:
        chans = {(c, q): [deque(), False] for c in range(S - 1) for q in range(p.links[c])}
    else:
        chans = {(c, q, d): [{}, False, q] for c in range(S - 1) for q in range(p.links[c]) for d in ("fwd", "bwd")}
    heap: list = []
    seq = 0
    events: list = []
    details: list = []
    held: dict = {(i, r): [] for i in range(S) for r in range(reps[i])}

    def ready(i: int, op: str, j: int) -> bool:
        if op == "F":
            if act_at[i][j] != act_at[i][j]:  # nan: not arrived
                return False
            if split:
                back = j - 2 * p.window[i] * reps[i]
                if back >= 0 and b_end[i][back] != b_end[i][back]:
                    return False
            return True
        if f_end[i][j] != f_end[i][j]:
            return False
        return i == S - 1 or grad_at[i][j] == grad_at[i][j]

    def try_lane(key, t: float) -> None:
        nonlocal seq
        st = lanes[key]
        ops, ptr, busy = st[0], st[1], st[2]
        if busy or ptr == len(ops):
            return
        op, j = ops[ptr]
        i = key[0]
        if not ready(i, op, j):
            return
        total = p.f_op[i] if op == "F" else p.b_op[i]  # without overlap: with the send it carries
        sends = rules.carried(i, S, 0.0, 0.0, p.fwd_xfer, p.bwd_xfer, p.overlap)  # the part that is a send
        send = sends[0] if op == "F" else sends[1]
        st[2], st[3] = True, t
        if op == "F":
            f_start[i][j] = t
            held[(i, key[1])].append((t, 1))
        seq += 1
        heapq.heappush(heap, (t + total, seq, 0, key, max(total - send, 0.0)))

    def try_chan(key, t: float) -> None:
        nonlocal seq
        ch = chans[key]
        if ch[1] or not ch[0]:
            return
        c = key[0]
        if p.half_duplex:
            direction, j = ch[0].popleft()
        else:  # the next microbatch in this link's order, once it is there
            direction, j = key[2], ch[2]
            if j not in ch[0]:
                return
            del ch[0][j]
            ch[2] = j + p.links[c]
        dur = p.fwd_xfer[c] if direction == "fwd" else p.bwd_xfer[c]
        ch[1] = True
        seq += 1
        heapq.heappush(heap, (t + dur, seq, 1, key, (direction, j, t)))

    def deliver(i: int, direction: str, j: int, t: float) -> None:
        """Data of microbatch j from stage i arrives at its neighbour at time t."""
        if direction == "fwd":
            act_at[i + 1][j] = t
            try_lane((i + 1, j % reps[i + 1], f_lane), t)
        else:
            grad_at[i - 1][j] = t
            try_lane((i - 1, j % reps[i - 1], b_lane), t)

    def send(i: int, direction: str, j: int, t: float) -> None:
        c = i if direction == "fwd" else i - 1
        if p.half_duplex:
            key = (c, j % p.links[c])
            chans[key][0].append((direction, j))
        else:
            key = (c, j % p.links[c], direction)
            chans[key][0][j] = True
        try_chan(key, t)

    for key in lanes:
        try_lane(key, 0.0)
    while heap:
        t, _, typ, key, payload = heapq.heappop(heap)
        if typ == 0:  # op end
            st = lanes[key]
            i, r, lane = key
            op, j = st[0][st[1]]
            start, dur = st[3], payload
            events.append(Event(i, op, j, start, start + dur))
            details.append((r, lane, ""))
            st[1] += 1
            st[2] = False
            if op == "F":
                f_end[i][j] = t
                if i < S - 1:
                    if p.overlap:
                        send(i, "fwd", j, t)
                    else:
                        if t > start + dur:  # the blocking send
                            events.append(Event(i, "comm", j, start + dur, t))
                            details.append((r, "worker", "fwd"))
                        deliver(i, "fwd", j, t)
                else:
                    try_lane((i, r, b_lane), t)
            else:
                b_end[i][j] = t
                held[(i, r)].append((t, -1))
                if i > 0:
                    if p.overlap:
                        send(i, "bwd", j, t)
                    else:
                        if t > start + dur:
                            events.append(Event(i, "comm", j, start + dur, t))
                            details.append((r, "worker", "bwd"))
                        deliver(i, "bwd", j, t)
                if split:
                    try_lane((i, r, f_lane), t)
            try_lane(key, t)
        else:  # transfer end
            direction, j, start = payload
            c = key[0]
            sender = c if direction == "fwd" else c + 1
            if t > start:  # empty transfers (no bytes cross the cut) leave no trace
                events.append(Event(sender, "comm", j, start, t))
                details.append((key[1], "link", direction))
            chans[key][1] = False
            deliver(sender, direction, j, t)
            try_chan(key, t)
    stuck = [k for k, st in lanes.items() if st[1] < len(st[0])]
    if stuck:  # pragma: no cover - a bug, not bad input
        raise RuntimeError(f"simulation deadlocked: lanes {stuck[:3]} did not finish")
    makespan = max((e.end for e in events), default=0.0)
    arrivals = act_at[1:] + grad_at[:-1]
    return _Run(events, details, f_start, held, b_end, arrivals, makespan)


# ---------------------------------------------------------------------------------------------
# measurements


def _busy(run: _Run, p: _Pipeline, split: bool, lo: float, hi: float) -> list:
    """Weighted compute time of each stage's replicas inside [lo, hi]."""
    busy = [0.0] * p.S
    for e, d in zip(run.events, run.details, strict=True):
        if e.kind == "comm":
            continue
        x = min(e.end, hi) - max(e.start, lo)
        if x <= 0:
            continue
        if split:
            w = p.fwd_share[e.stage] if e.kind == "F" else 1.0 - p.fwd_share[e.stage]
            x *= w
        busy[e.stage] += x
    return busy


def _memory(run: _Run, p: _Pipeline, stash: bool) -> tuple[list, list, list]:
    """Peak memory and peak in-flight microbatches per stage, and the memory trace."""
    S = p.S
    peak_k = [0] * S
    trace = []
    excess = p.excess or [0.0] * S
    state = p.state or [0.0] * S

    def held(i: int, k: int, versions) -> float:  # a stage holding k > 0 microbatches also holds its excess
        return rules.stage_memory(p.act[i], p.params[i], k, versions) + state[i] + (excess[i] if k > 0 else 0.0)

    for i in range(S):
        m = p.replicas[i]
        for r in range(m):
            k = 0
            for t, dk in run.held[(i, r)]:
                k += dk
                peak_k[i] = max(peak_k[i], k)
                trace.append((i, r, t, held(i, k, rules.weight_versions(max(k, 1), stash))))
    peak = [held(i, k, rules.weight_versions(max(k, 1), stash)) for i, k in enumerate(peak_k)]
    return peak, peak_k, trace


def _spacing(done: np.ndarray) -> float:
    """Mean spacing of sorted completion times in the periodic regime.

    Completions settle into a periodic pattern (period p microbatches: round robin over
    replicas, a link batching transfers, ...). If the second half of the window is periodic
    the exact mean over one period is returned, else the mean over the whole window.
    """
    d = np.diff(done)
    half = d[len(d) // 2 :]
    scale = max(float(np.abs(half).max(initial=0.0)), 1e-300)
    for p in range(1, len(half) // 2 + 1):
        if np.allclose(half[p:], half[:-p], rtol=1e-9, atol=1e-12 * scale):
            return float(half[-p:].mean())
    return float((done[-1] - done[0]) / max(len(done) - 1, 1))


def _long_run_length(p: _Pipeline, M: int) -> int:
    """N: steady states are measured on runs of N and 2N microbatches (a multiple of every
    replica and link count, so that round robin completes its cycles)."""
    period = 1
    for x in p.replicas + p.links:
        period = period * x // math.gcd(period, x)
    n = max(2 * M, 8 * sum(p.replicas), 32)
    return period * math.ceil(n / period)


def simulate(instance, plan: Plan, *, schedule: str = "1f1b", microbatches: int | None = None,
             half_duplex: bool = False) -> SimulationResult:
    """Simulate one training iteration of M microbatches of ``plan``.

    Parameters
    ----------
    instance
        :class:`pipeopt.Instance`; its cluster's bandwidth, ``settings.overlap`` and (by
        default) ``settings.microbatches`` apply.
    plan
        :class:`pipeopt.Plan` (checked by :func:`pipeopt.cost.check_plan`). Op and transfer
        durations come from :func:`pipeopt.evaluate` (see the module docstring).
    schedule
        ``"gpipe"``, ``"1f1b"`` (default), ``"async"`` or ``"split"``, in any spelling of
        :func:`pipeopt.schedules.schedule_name` (``"GPipe"``, ``"Schedule1F1B"``,
        ``"pipedream-async"``, ...); the result names it by these keys.
    microbatches
        M >= 1; default ``instance.settings.microbatches``.
    half_duplex
        Links serve both directions one transfer at a time, first come first served
        (default False: full duplex, as NVLink, InfiniBand and Ethernet are, each direction
        in program order). It matters when a light stage sits between two heavy cuts: its
        activations and the gradients coming back queue behind each other (VGG16 on 4 stages
        at the split [5, 6, 13]: 252.1 ms per microbatch half duplex against 235.6 ms full
        duplex). The cost model assumes full duplex: a half-duplex run is outside it (a note
        says so).

    Returns
    -------
    SimulationResult

    Raises
    ------
    InvalidProblemError
        Unknown schedule, or M < 1.
    InvalidPlanError
        The plan is not a valid split; the split schedule on a plan without a forward share
        ``beta`` on every stage; a stage whose worker cannot run one of its layers.

    References
    ----------
    See the module docstring (PipeDream, PipeDream-Flush, GPipe, Duan & Wu, FlexFlow).

    Examples
    --------
    >>> from pipeopt import PartitionProblem
    >>> from pipeopt.problems.partition.dp import solve_dp
    >>> from pipeopt.io.pipedream import read_pipedream
    >>> inst = read_pipedream("../shared/data/pipedream-profiles/vgg16.txt")  # doctest: +SKIP
    >>> plan = solve_dp(PartitionProblem(inst, 4)).plan  # doctest: +SKIP
    >>> sim = simulate(inst, plan, schedule="1f1b", microbatches=16)  # doctest: +SKIP
    >>> math.isclose(sim.time_per_microbatch, sim.bottleneck, rel_tol=1e-9)  # doctest: +SKIP
    True
    >>> math.isclose(sim.iteration_time, sim.analytic_iteration_time, rel_tol=1e-9)  # doctest: +SKIP
    True
    """
    from .schedules.names import schedule_key

    schedule = schedule_key(schedule, where="by the simulator")  # the one vocabulary -> "1f1b", "gpipe", ...
    if not isinstance(half_duplex, (bool, np.bool_)):
        raise InvalidProblemError(f"half_duplex must be True or False, got {half_duplex!r}")
    if not isinstance(instance, Instance):
        raise InvalidProblemError(f"simulate needs a pipeopt.Instance, got {type(instance).__name__}")
    M = instance.settings.microbatches if microbatches is None else microbatches
    if isinstance(M, bool) or not isinstance(M, (int, np.integer)) or M < 1:
        raise InvalidProblemError(f"microbatches must be a positive integer, got {M!r}")
    M = int(M)
    split = schedule == "split"
    if split:
        missing = [i for i, st in enumerate(plan.stages) if st.beta is None]
        if missing:
            raise InvalidPlanError(
                f"the split schedule needs a forward share beta on every stage; stage(s) {missing} have none "
                "(solve the allocate problem, or give Stage(beta={kind: share}))"
            )
    notes: list = []
    instance = instance.with_settings(microbatches=M, objective="gpipe" if schedule == "gpipe" else "bottleneck")
    pipe, analytic = _pipeline(instance, plan, split, notes, bool(half_duplex))
    if half_duplex:
        notes.append("half-duplex links: the cost model (full duplex) does not describe this run")
    kind = "1f1b" if schedule == "async" else schedule
    N = _long_run_length(pipe, M)
    stash = schedule == "async"
    if kind == "gpipe":  # a fill-drain run has no periodic regime: the slope of the iteration time in M
        run = _run(pipe, kind, M)
        iteration = run.makespan + analytic.tie_sync + analytic.dp_sync  # after the flush: ties, then data parallelism
        tpm = (_run(pipe, kind, 2 * N).makespan - _run(pipe, kind, N).makespan) / N
        lo, hi = 0.0, run.makespan
    else:  # the spacing of backward completions in the middle of a long run
        long = _run(pipe, kind, 2 * N)
        a, b = N // 2, N // 2 + N
        tpm, lo, hi = 0.0, 0.0, 0.0
        # the slowest resource's completions (stages, then links): others may lag in a long transient
        for i, times in enumerate(long.b_end + long.arrivals):
            done = np.sort(times)
            rate = _spacing(done[a - 1 : b])
            if rate > tpm or i == 0:
                tpm, lo, hi = rate, done[a - 1], done[b - 1]
        if schedule == "async":
            run, iteration = long, M * tpm
            notes.append(f"steady state measured over microbatches {a}..{b} of a {2 * N}-microbatch run")
        else:
            run = _run(pipe, kind, M)
            iteration = run.makespan + analytic.tie_sync + analytic.dp_sync  # after the flush: ties, then data parallelism
            lo, hi = 0.0, run.makespan
    busy = _busy(run, pipe, split, lo, hi)
    span = hi - lo
    reps = pipe.replicas
    util = [busy[i] / (reps[i] * span) if span > 0 else 0.0 for i in range(pipe.S)]
    bubble = 1.0 - sum(busy) / (sum(reps) * span) if span > 0 else 0.0
    peak, peak_k, trace = _memory(run, pipe, stash)
    return SimulationResult(
        schedule=schedule,
        microbatches=M,
        iteration_time=float(iteration),
        time_per_microbatch=float(tpm),
        throughput=1.0 / tpm if tpm > 0 else math.inf,
        bubble_fraction=float(max(0.0, bubble)),
        utilisation=[float(u) for u in util],
        peak_memory=[float(x) for x in peak],
        peak_in_flight=peak_k,
        memory_capacity=list(analytic.memory_capacity),
        replicas=list(reps),
        bottleneck=analytic.bottleneck,
        analytic_iteration_time=(analytic.gpipe_time if schedule == "gpipe" else
                                 M * analytic.bottleneck if schedule == "async" else analytic.iteration_time),
        events=run.events,
        event_details=run.details,
        memory_trace=trace,
        notes=notes,
    )
