"""A finite run of M microbatches as a graph of operations: the flush schedules, exactly.

Synchronous training runs M microbatches and flushes the pipeline. With the order of the
operations on every resource fixed by the schedule, the run is a directed acyclic graph:

* ``("F", s, j)`` / ``("B", s, j)``: the forward / backward op of microbatch j on stage s
  (on replica ``j mod m_s``), lasting :func:`pipeopt.cost.rules.replica_ops`;
* ``("X", c, j)`` / ``("Y", c, j)``: microbatch j's activations / gradients over cut c, on
  link ``j mod L_c`` (``L_c = min(m_c, m_{c+1})``), in microbatch order on that link. Links
  are full duplex: X and Y never wait for each other. Without overlap there are no X / Y
  ops: the sender's op carries its transfer and the data is there when the op ends.

Each op starts when every op it depends on has ended (its predecessor in its replica's or
link's order, and its data); so the iteration time is the longest path through the graph.
:func:`lane_graph` is the one builder of such graphs: from the order of every lane (a
replica's lane here, a rank of any schedule in :func:`pipeopt.schedules.schedule_graph`),
which cuts cross between lanes, and the order of every link channel, it states the data and
link waits. :func:`run_graph` hands it the flush run's lanes (:func:`replica_lanes`),
:func:`makespan` measures the graph, and the MILP / CP-SAT models of the iteration objectives
state one start time per op over the same graph (:mod:`pipeopt.problems.partition.events`).
:func:`pipeopt.simulate` plays the same orders with an event-driven engine, an independent
check (the tests compare the two).

Orders per replica (``mbs`` its microbatches, k its window, :func:`rules.in_flight`):

``"1f1b"`` (PipeDream-Flush, Narayanan et al. ICML 2021)
    ``k`` forwards, then one backward and one forward in turn, then the remaining backwards.
    A split-execution stage (Duan & Wu) runs its forwards and backwards on two lanes at once;
    its forward of microbatch j waits for the backward of microbatch ``j - 2 k m``.
``"gpipe"`` (fill-drain, Huang et al. NeurIPS 2019)
    All forwards, then all backwards (split execution: each lane in microbatch order).
"""

from __future__ import annotations

import functools
import graphlib
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidPlanError, InvalidProblemError

FLUSH_SCHEDULES = ("1f1b", "gpipe")


def lane_orders(schedule: str, mbs: list, window: int, split: bool) -> dict:
    """The op order of one replica: ``{lane: [(op, microbatch), ...]}``.

    Parameters
    ----------
    schedule
        ``"1f1b"`` or ``"gpipe"``.
    mbs
        The replica's microbatches, in order.
    window
        k, its 1F1B window (:func:`pipeopt.cost.rules.in_flight` without the split factor).
    split
        Split execution: lanes ``"F"`` and ``"B"``; else one lane ``"FB"``.
    """
    if split:
        return {"F": [("F", j) for j in mbs], "B": [("B", j) for j in mbs]}
    if schedule == "gpipe":
        return {"FB": [("F", j) for j in mbs] + [("B", j) for j in mbs]}
    w = min(window, len(mbs))
    ops = [("F", j) for j in mbs[:w]]
    for q in range(len(mbs) - w):
        ops += [("B", mbs[q]), ("F", mbs[w + q])]
    ops += [("B", j) for j in mbs[len(mbs) - w:]]
    return {"FB": ops}


@dataclass(frozen=True)
class RunGraph:
    """The operations of a run of M microbatches, in a topological order.

    Attributes
    ----------
    ops
        ``list[tuple[kind, index, microbatch]]``: kind ``"F"``, ``"B"`` (index: the stage),
        ``"X"``, ``"Y"`` (index: the cut).
    after
        ``list[tuple[int, ...]]``: for each op, the ops (positions in ``ops``) that must end
        before it starts.
    """

    ops: list
    after: list

    def durations(self, f_op, b_op, x, y) -> np.ndarray:
        """``ndarray (len(ops),)``: seconds of each op from per-stage op times and per-cut
        transfer times."""
        table = {"F": f_op, "B": b_op, "X": x, "Y": y}
        return np.array([table[k][i] for k, i, _ in self.ops], dtype=float)


def replica_lanes(schedule: str, replicas, window, split, microbatches: int) -> dict:
    """The lanes of a flush run: every replica's :func:`lane_orders`, microbatches dealt
    round robin over a stage's replicas (replica r of stage s runs ``j = r, r + m_s, ...``).

    Parameters
    ----------
    schedule
        ``"1f1b"`` or ``"gpipe"``.
    replicas, window, split
        Per stage: m, the 1F1B window k, split execution or not.
    microbatches
        M >= 1.

    Returns
    -------
    dict
        ``{(stage, replica, lane): [(op, microbatch), ...]}``, stage-major, every replica
        (a replica beyond M has empty lanes); lane ``"FB"``, or ``"F"`` and ``"B"`` under
        split execution.
    """
    M = int(microbatches)
    out = {}
    for s, m in enumerate(replicas):
        m = int(m)
        for r in range(m):
            mine = list(range(r, M, m))
            for lane, ops in lane_orders(schedule, mine, int(window[s]), bool(split[s])).items():
                out[(s, r, lane)] = ops
    return out


def run_graph(schedule: str, replicas, window, split, links, microbatches: int, overlap: bool = True) -> RunGraph:
    """The dependency graph of a run of ``microbatches`` microbatches (module docstring):
    :func:`lane_graph` of the replicas' lanes (:func:`replica_lanes`), every cut crossing
    between workers, link ``j mod L_c`` of cut c carrying its microbatches in order.

    The graph depends only on the arguments, not on any time: the last :data:`RUN_GRAPHS`
    distinct ones are kept (a search that evaluates many splits of one shape builds its graph
    once). Callers read the graph and never change it.

    Parameters
    ----------
    schedule
        ``"1f1b"`` (flush) or ``"gpipe"``.
    replicas, window, split
        Per stage: m, the 1F1B window k, split execution or not.
    links
        Per cut: parallel links.
    microbatches
        M >= 1.
    overlap
        Transfers run on the links beside compute (else the sender's ops carry them).

    Returns
    -------
    RunGraph
    """
    return _run_graph(str(schedule), tuple(int(m) for m in replicas), tuple(int(k) for k in window),
                      tuple(bool(x) for x in split), tuple(int(L) for L in links), int(microbatches),
                      bool(overlap))


RUN_GRAPHS = 8
"""How many distinct run graphs :func:`run_graph` keeps (a graph holds about 4 S M ops)."""


@functools.lru_cache(maxsize=RUN_GRAPHS)
def _run_graph(schedule: str, replicas: tuple, window: tuple, split: tuple, links: tuple, microbatches: int,
               overlap: bool) -> RunGraph:
    """:func:`run_graph` on hashable arguments (its cache)."""
    S, M = len(replicas), int(microbatches)
    orders = replica_lanes(schedule, replicas, window, split, M)
    lanes = [[((op, s, j),) for op, j in ops] for (s, _, _), ops in orders.items()]
    channels = []
    if overlap:
        for c in range(S - 1):
            L = int(links[c])
            for kind in ("X", "Y"):
                channels += [[(kind, c, j) for j in range(q, M, L)] for q in range(min(L, M))]
    also = {}
    if schedule == "1f1b":
        for s in range(S):
            if split[s]:  # a split stage admits microbatch j once j - 2 k m has left
                admit = 2 * int(window[s]) * int(replicas[s])
                also.update({("F", s, j): (("B", s, j - admit),) for j in range(admit, M)})
    graph = lane_graph(lanes, S, channels=channels, overlap=overlap, also=also)[0]
    return RunGraph(tuple(graph.ops), tuple(graph.after))  # shared by the cache's callers: read-only


def lane_graph(lanes, stages: int, *, cross=None, channels=(), overlap: bool = True, also=None,
               name: str = "the run") -> tuple[RunGraph, tuple]:
    """The operations of an iteration and what each waits for, from the order of every lane:
    the one builder of the run graphs (:func:`run_graph`'s flush runs and
    :func:`pipeopt.schedules.schedule_graph`'s per-rank orders).

    Operations: the actions ``(kind, stage, microbatch)`` (kind ``"F"``, ``"B"``, ``"I"``,
    ``"W"``) and, with overlap, the transfers ``("X", c, j)`` (activations over cut c) and
    ``("Y", c, j)`` (gradients back over it) at every cut that crosses. An op waits for:

    * **lane order**: the action before it in its lane;
    * **data**: ``F(s, j)`` for the activations of ``F(s - 1, j)``; ``B(s, j)`` / ``I(s, j)``
      for ``F(s, j)`` and the gradients of ``B(s + 1, j)`` / ``I(s + 1, j)``; ``W(s, j)`` for
      ``I(s, j)``. Data leaves when the step holding its producer ends, and arrives through
      its transfer if the cut crosses and transfers overlap, else at once (without overlap
      the sender carries the transfer, so the data is there when the step ends);
    * **links**: a transfer waits for its producer's step and the transfer before it on its
      channel;
    * ``also``: any further waits (a split-execution stage's admission).

    Parameters
    ----------
    lanes
        Sequence of lanes (a worker, a replica's lane, a rank); a lane is a sequence of
        steps run one after the other, a step a tuple of actions run back to back whose
        outputs leave together when it ends. Every (stage, microbatch) has one F and one B,
        or one I and one W.
    stages
        S.
    cross
        Per cut c: its two stages run on different lanes' devices, so data crosses it by a
        transfer (default: every cut).
    channels
        With overlap: sequences (lists, tuples) of transfers, each one channel carrying them
        one at a time in that order; every transfer of a crossing cut is on exactly one
        channel.
    overlap
        Transfers are operations of their own (else the sending step carries them).
    also
        ``{action: (op, ...)}``: further waits, appended to the action's.
    name
        What a deadlock's message calls the order.

    Returns
    -------
    (RunGraph, lane)
        The graph (ops in a topological order: lanes' actions and transfers breadth first
        from the ops that wait for nothing) and ``tuple`` per op of the index of its lane
        (a transfer: its sender's).

    Raises
    ------
    InvalidPlanError
        If the order deadlocks (a cycle of waits, named by a few of its operations).
    InvalidProblemError
        If a transfer of a crossing cut is on no channel.
    """
    S = int(stages)
    cross = (True,) * max(S - 1, 0) if cross is None else tuple(bool(c) for c in cross)
    also = {} if also is None else also
    release: dict = {}  # action -> the last action of its step (whose end releases its outputs)
    grad_of: dict = {}  # (stage, microbatch) -> the action that sends its input gradient (B or I)
    lane_of: dict = {}
    for q, lane in enumerate(lanes):
        for step in lane:
            for a in step:
                release[a] = step[-1]
                lane_of[a] = q
                if a[0] in ("B", "I"):
                    grad_of[(a[1], a[2])] = a
    queued: dict = {}  # transfer -> the transfer before it on its channel (or None)
    for chan in channels if overlap else ():
        queued.update(zip(chan, [None, *chan]))
    deps: dict = {}
    for q, lane in enumerate(lanes):
        prev = None
        for step in lane:
            for a in step:
                kind, s, j = a
                after = [prev] if prev is not None else []
                if kind == "F":
                    if s > 0:
                        data = ("X", s - 1, j) if overlap and cross[s - 1] else release[("F", s - 1, j)]
                        after.append(data)
                elif kind in ("B", "I"):
                    after.append(("F", s, j))
                    if s < S - 1:
                        after.append(("Y", s, j) if overlap and cross[s] else release[grad_of[(s + 1, j)]])
                else:
                    after.append(("I", s, j))
                after.extend(also.get(a, ()))
                deps[a] = after
                prev = a
        if overlap:  # this lane's transfers, in the order its steps produce them
            for step in lane:
                for a in step:
                    t = sent_by(a, cross)
                    if t is None:
                        continue
                    if t not in queued:
                        raise InvalidProblemError(f"{name}: transfer {_name(t)} is on no channel")
                    before = queued[t]
                    deps[t] = [release[a]] + ([before] if before is not None else [])
                    lane_of[t] = q
    order = _topological(deps, name)
    at = {op: q for q, op in enumerate(order)}.__getitem__
    graph = RunGraph(order, [tuple(map(at, deps[op])) for op in order])
    return graph, tuple(lane_of[op] for op in order)


def sent_by(action, cross) -> tuple | None:
    """The transfer ``action`` sends, or ``None``: ``F(s, j)`` sends ``("X", s, j)`` over cut
    s and ``B(s, j)`` / ``I(s, j)`` send ``("Y", s - 1, j)`` over cut s - 1, if that cut
    crosses (``cross``: ``bool`` per cut)."""
    kind, s, j = action
    if kind == "F":
        return ("X", s, j) if s < len(cross) and cross[s] else None
    if kind in ("B", "I"):
        return ("Y", s - 1, j) if s > 0 and cross[s - 1] else None
    return None


def _topological(deps: dict, name: str) -> list:
    """The ops of ``{op: [ops it waits for]}`` breadth first from those that wait for nothing
    (Kahn's algorithm; the order of :meth:`graphlib.TopologicalSorter.static_order`)."""
    users: dict = {}  # op -> the ops waiting for it; keys in order of first mention
    for k, ds in deps.items():
        users.setdefault(k, [])
        for d in ds:
            users.setdefault(d, []).append(k)
    missing = {k: len(ds) for k, ds in deps.items()}
    order = [k for k in users if not missing[k]]
    for op in order:  # grows as ops become ready: first in, first out
        for u in users[op]:
            missing[u] -= 1
            if not missing[u]:
                order.append(u)
    if len(order) < len(deps):
        try:  # name a cycle
            graphlib.TopologicalSorter(deps).prepare()
        except graphlib.CycleError as exc:
            cycle = " -> ".join(_name(op) for op in exc.args[1][:8])
            raise InvalidPlanError(f"{name}: the order deadlocks (a cycle of waits: {cycle})") from None
    return order


def _name(op) -> str:
    """An op in torch's notation (``"2F0"``), a transfer as ``X0@cut1``."""
    kind, index, j = op
    return f"{kind}{j}@cut{index}" if kind in ("X", "Y") else f"{index}{kind}{j}"


def makespan(graph: RunGraph, durations) -> tuple[float, np.ndarray]:
    """The iteration time: the longest path through ``graph`` with op ``durations``.

    Returns
    -------
    (seconds, starts)
        The time from the first op's start to the last op's end, and ``ndarray`` of each op's
        start time (as early as its dependencies allow).
    """
    d = np.asarray(durations, dtype=float)
    start = np.zeros(len(graph.ops))
    end = np.zeros(len(graph.ops))
    for q, after in enumerate(graph.after):
        t = 0.0
        for a in after:
            if end[a] > t:
                t = end[a]
        start[q] = t
        end[q] = t + d[q]
    return float(end.max(initial=0.0)), start
