"""Execute a schedule: start and end of every action, and the iteration time.

:func:`execute` gives each operation of the schedule's graph (:mod:`.dag`) its duration from
:class:`pipeopt.cost.passes.PassTimes` - F, B, I, W of the chunk, and the transfer of the
boundary; without overlap the sending action carries its transfer - and takes the longest path
(:func:`pipeopt.cost.schedule.makespan`): every operation starts as soon as the operations it
depends on have ended. With GPipe or 1F1B on one stage per rank this is the value
:func:`pipeopt.cost.schedule.makespan` gives the same plan (``evaluate(...).gpipe_time`` /
``.iteration_time``), to float rounding.

:func:`run_schedule` does the whole thing for an instance and a plan of chunks
(:func:`chunk_plan` builds one from layer lists and the schedule's placement).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..cost import rules
from ..cost.passes import PassTimes, pass_times
from ..cost.schedule import makespan
from ..errors import InvalidPlanError, InvalidProblemError
from ..plan import Plan, Stage
from .actions import Schedule
from .dag import ScheduleGraph, schedule_graph


@dataclass
class Execution:
    """A schedule run with given durations (seconds; bytes).

    Attributes
    ----------
    schedule
        The :class:`Schedule`.
    time
        The iteration time: from the first action's start to the last one's end, plus the
        data-parallel synchronisation after the flush (``PassTimes.sync``; 0 without).
    ops
        ``list`` of operations (:mod:`.dag`): actions ``(kind, stage, microbatch)`` and
        transfers ``("X" | "Y", boundary, microbatch)``.
    start, end
        ``ndarray`` per op.
    rank
        ``tuple[int, ...]`` per op: the rank that runs it (a transfer: the sender).
    memory
        ``tuple[float, ...]`` per rank: peak bytes, the schedule's memory rule (activations of
        the microbatches in flight, :meth:`Schedule.activation_profile`, plus
        ``parameter_copies`` times the parameters of its stages).
    memory_capacity
        ``tuple[float, ...]`` per rank.
    assumptions
        ``tuple[str, ...]``: what the durations assumed (e.g. W = B / 2).
    """

    schedule: Schedule
    time: float
    ops: list
    start: np.ndarray
    end: np.ndarray
    rank: tuple
    memory: tuple = ()
    memory_capacity: tuple = ()
    assumptions: tuple = field(default_factory=tuple)

    @property
    def feasible(self) -> bool:
        """Every rank's peak memory fits its capacity (:func:`pipeopt.cost.rules.fits`)."""
        return all(bool(rules.fits(m, c)) for m, c in zip(self.memory, self.memory_capacity, strict=True))

    @property
    def objective(self) -> float:
        """The iteration time, seconds (:attr:`time`): what a :class:`pipeopt.Result` of the
        schedule problem reads as its objective (this execution is its evaluation)."""
        return float(self.time)

    @property
    def violations(self) -> list:
        """``list[str]``: each rank whose peak memory exceeds its capacity."""
        return [f"rank {r}: peak memory {m / 2**30:.3f} GiB over its {c / 2**30:.3f} GiB"
                for r, (m, c) in enumerate(zip(self.memory, self.memory_capacity, strict=True))
                if not rules.fits(m, c)]

    def chunk_lines(self, plan) -> list:
        """One line per chunk of ``plan`` (the chunk plan this execution ran): its layers and
        rank, for :meth:`pipeopt.Result.summary`."""
        place = self.schedule.placement
        return [f"  chunk {s} on rank {place[s]}: {len(st.layers)} layers [{st.layers[0]} .. {st.layers[-1]}]"
                for s, st in enumerate(plan.stages)]

    def busy(self) -> tuple:
        """``tuple[float, ...]`` per rank: seconds spent on actions (transfers excluded)."""
        out = [0.0] * self.schedule.ranks
        for q, op in enumerate(self.ops):
            if op[0] not in ("X", "Y"):
                out[self.rank[q]] += float(self.end[q] - self.start[q])
        return tuple(out)

    @property
    def bubble_fraction(self) -> float:
        """Share of the ranks' time idle during the iteration."""
        if self.time <= 0:
            return 0.0
        return 1.0 - sum(self.busy()) / (self.schedule.ranks * self.time)

    def summary(self) -> str:
        """A few lines: the iteration time and bubble, each rank's busy time and peak memory
        against its capacity, and the assumptions (as ``assumed: ...`` lines)."""
        s = self.schedule
        lines = [f"{s.name} on {s.ranks} ranks x {s.stages_per_rank} stages, {s.microbatches} microbatches:"
                 f" iteration {self.time * 1e3:.4f} ms, bubble {self.bubble_fraction:.1%}"]
        for r, busy in enumerate(self.busy()):
            cap = self.memory_capacity[r]
            of = f" of {cap / 2**30:.3f}" if math.isfinite(cap) else ""
            lines.append(f"  rank {r} (stages {list(s.stages_on(r))}): busy {busy * 1e3:.4f} ms,"
                         f" peak memory {self.memory[r] / 2**30:.3f}{of} GiB")
        lines += [f"  assumed: {a}" for a in self.assumptions]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def action_times(self) -> dict:
        """``dict[(kind, stage, microbatch), (start, end)]`` of every action."""
        return {op: (float(self.start[q]), float(self.end[q])) for q, op in enumerate(self.ops)
                if op[0] not in ("X", "Y")}


def durations(sg: ScheduleGraph, times: PassTimes):
    """``ndarray`` per op of ``sg``: seconds of each action and transfer (module docstring).

    Raises
    ------
    InvalidProblemError
        If ``times`` has another number of chunks than the schedule has stages.
    """
    S = len(sg.cross) + 1
    if times.chunks != S:
        raise InvalidProblemError(f"the schedule has {S} stages but the durations are for {times.chunks} chunks")
    x, y = times.send_forward, times.send_backward
    own = {"F": times.forward, "B": times.backward, "I": times.input_grad, "W": times.weight_grad}
    out = np.empty(len(sg.graph.ops))
    # without overlap the sender carries its transfer (rules.carried), across ranks only
    xc = [x[c] if sg.cross[c] else 0.0 for c in range(S - 1)]
    yc = [y[c] if sg.cross[c] else 0.0 for c in range(S - 1)]
    for q, (kind, i, _) in enumerate(sg.graph.ops):
        if kind == "X":
            out[q] = x[i]
        elif kind == "Y":
            out[q] = y[i]
        elif kind == "F":
            out[q] = rules.carried(i, S, own[kind][i], 0.0, xc, yc, sg.overlap)[0]
        elif kind in ("B", "I"):
            out[q] = rules.carried(i, S, 0.0, own[kind][i], xc, yc, sg.overlap)[1]
        else:
            out[q] = own[kind][i]
    return out


def rank_memory(schedule: Schedule, times: PassTimes) -> tuple:
    """``tuple[float, ...]`` per rank: peak bytes under the schedule's memory rule
    (activations in flight by :meth:`Schedule.activation_profile`, parameters
    ``parameter_copies`` times; :func:`pipeopt.cost.rules.stage_memory` per stage), plus, at
    each point, the largest backward excess (``times.act_excess``: a recomputed layer's
    re-created activations) of the rank's chunks holding a microbatch (a rank runs one backward
    at a time), plus its chunks' training state beyond the weights (``times.state_bytes``, data
    parallelism; ZeRO-3's one gathered layer counted per chunk)."""
    excess = times.act_excess or (0.0,) * times.chunks
    state = times.state_bytes or (0.0,) * times.chunks
    out = []
    for r in range(schedule.ranks):
        mine = schedule.stages_on(r)
        peak = 0.0
        for counts in schedule.activation_profile(r) or ((0,) * len(mine),):
            total = sum(rules.stage_memory(times.act_bytes[s], times.param_bytes[s], k, schedule.parameter_copies)
                        for s, k in zip(mine, counts, strict=True))
            total += max((excess[s] for s, k in zip(mine, counts, strict=True) if k > 0), default=0.0)
            total += sum(state[s] for s in mine)
            peak = max(peak, float(total))
        out.append(peak)
    return tuple(out)


def execute(schedule: Schedule, times: PassTimes) -> Execution:
    """Run ``schedule`` with the durations ``times`` (module docstring).

    Parameters
    ----------
    schedule
        A :class:`Schedule` with ``p * v`` stages.
    times
        :class:`pipeopt.cost.passes.PassTimes` for ``p * v`` chunks (``times.overlap``
        decides whether transfers run beside compute).

    Returns
    -------
    Execution

    Raises
    ------
    InvalidPlanError
        If the order deadlocks (:func:`pipeopt.schedules.dag.schedule_graph`).
    InvalidProblemError
        If the chunk count differs from the stage count.
    """
    sg = schedule_graph(schedule, overlap=times.overlap)
    d = durations(sg, times)
    total, start = makespan(sg.graph, d)
    if times.sync:  # data parallelism after the flush: each rank its chunks one after the other, in parallel
        total += max(sum(times.sync[s] for s in schedule.stages_on(r)) for r in range(schedule.ranks))
    capacity = []
    for r in range(schedule.ranks):
        mine = schedule.stages_on(r)
        capacity.append(float(min((times.memory_capacity[s] for s in mine), default=math.inf)))
    return Execution(schedule, total, list(sg.graph.ops), start, start + d, sg.rank,
                     rank_memory(schedule, times), tuple(capacity), tuple(times.assumptions))


def chunk_plan(instance, schedule: Schedule, chunks, rank_devices=None) -> Plan:
    """The :class:`pipeopt.Plan` of ``schedule``'s chunks: chunk s on the devices of rank
    ``schedule.placement[s]``.

    Parameters
    ----------
    instance
        :class:`pipeopt.Instance`.
    schedule
        A :class:`Schedule` with ``S = p * v`` stages.
    chunks
        S layer sequences in pipeline order (e.g. ``instance.chain.stages_from_cuts(cuts)``).
    rank_devices
        Per rank, the names of its devices; default: rank r is the cluster's r-th device.

    Returns
    -------
    Plan

    Raises
    ------
    InvalidPlanError
        If there are not S chunks, not p device lists, or the cluster has fewer than p devices.
    """
    chunks = [tuple(c) for c in chunks]
    if len(chunks) != schedule.stages:
        raise InvalidPlanError(f"{schedule.name} runs {schedule.stages} chunks; {len(chunks)} given")
    if rank_devices is None:
        names = [d.name for d in instance.cluster.devices]
        if len(names) < schedule.ranks:
            raise InvalidPlanError(f"{schedule.ranks} ranks need {schedule.ranks} devices; the cluster has {len(names)}")
        rank_devices = [(n,) for n in names[: schedule.ranks]]
    rank_devices = [tuple(d) for d in rank_devices]
    if len(rank_devices) != schedule.ranks:
        raise InvalidPlanError(f"{schedule.ranks} ranks, {len(rank_devices)} device lists given")
    return Plan(tuple(Stage(c, rank_devices[r]) for c, r in zip(chunks, schedule.placement, strict=True)))


def run_schedule(instance, schedule: Schedule, plan: Plan) -> Execution:
    """Execute ``schedule`` on ``plan``'s chunks: durations by
    :func:`pipeopt.cost.passes.pass_times`, then :func:`execute`.

    Parameters
    ----------
    instance
        :class:`pipeopt.Instance`.
    schedule
        A :class:`Schedule` with ``S = p * v`` stages.
    plan
        :class:`pipeopt.Plan` with S stages, the chunks in pipeline order; stage s lists the
        devices of rank ``schedule.placement[s]`` (chunks on one rank list the same devices).

    Returns
    -------
    Execution

    Raises
    ------
    InvalidPlanError
        If the plan has another number of chunks, or its chunks on one rank do not share
        their devices (or chunks of different ranks do), and the errors of
        :func:`pipeopt.cost.passes.pass_times`.
    """
    if not isinstance(plan, Plan) or plan.num_stages != schedule.stages:
        n = plan.num_stages if isinstance(plan, Plan) else type(plan).__name__
        raise InvalidPlanError(
            f"{schedule.name} on {schedule.ranks} ranks x {schedule.stages_per_rank} runs"
            f" {schedule.stages} chunks; the plan has {n}"
        )
    worker: dict = {}
    for s, st in enumerate(plan.stages):
        r = schedule.placement[s]
        devs = tuple(st.devices)
        if worker.setdefault(r, devs) != devs:
            raise InvalidPlanError(
                f"chunks {schedule.stages_on(r)} run on rank {r} ({schedule.name}'s placement) and must list"
                f" the same devices; chunk {s} lists {list(devs)}, not {list(worker[r])}"
            )
    owners = {}
    for r, devs in worker.items():
        for d in devs:
            if owners.setdefault(d, r) != r:
                raise InvalidPlanError(f"device {d!r} is on ranks {owners[d]} and {r}")
    return execute(schedule, pass_times(instance, plan))
