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
:func:`run_graph` builds the graph, :func:`makespan` measures it, and the MILP / CP-SAT
models of the iteration objectives state one start time per op over the same graph
(:mod:`pipeopt.problems.partition.events`). :func:`pipeopt.simulate` plays the same orders
with an event-driven engine, an independent check (the tests compare the two).

Orders per replica (``mbs`` its microbatches, k its window, :func:`rules.in_flight`):

``"1f1b"`` (PipeDream-Flush, Narayanan et al. ICML 2021)
    ``k`` forwards, then one backward and one forward in turn, then the remaining backwards.
    A split-execution stage (Duan & Wu) runs its forwards and backwards on two lanes at once;
    its forward of microbatch j waits for the backward of microbatch ``j - 2 k m``.
``"gpipe"`` (fill-drain, Huang et al. NeurIPS 2019)
    All forwards, then all backwards (split execution: each lane in microbatch order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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


def run_graph(schedule: str, replicas, window, split, links, microbatches: int, overlap: bool = True) -> RunGraph:
    """The dependency graph of a run of ``microbatches`` microbatches (module docstring).

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
    S, M = len(replicas), int(microbatches)
    index: dict = {}
    deps: dict = {}
    lane_next: dict = {}

    def add(key, *after):
        deps[key] = [a for a in after if a is not None]

    for s in range(S):
        m = int(replicas[s])
        for r in range(min(m, M)):
            for ops in lane_orders(schedule, list(range(r, M, m)), int(window[s]), bool(split[s])).values():
                for prev, cur in zip(ops, ops[1:]):
                    lane_next[(cur[0], s, cur[1])] = (prev[0], s, prev[1])
    for s in range(S):
        admit = 2 * int(window[s]) * int(replicas[s]) if split[s] and schedule == "1f1b" else None
        for j in range(M):
            data = None
            if s > 0:
                data = ("X", s - 1, j) if overlap else ("F", s - 1, j)
            back = ("B", s, j - admit) if admit is not None and j - admit >= 0 else None
            add(("F", s, j), lane_next.get(("F", s, j)), data, back)
            grad = None
            if s < S - 1:
                grad = ("Y", s, j) if overlap else ("B", s + 1, j)
            add(("B", s, j), lane_next.get(("B", s, j)), ("F", s, j), grad)
    if overlap:
        for c in range(S - 1):
            L = int(links[c])
            for j in range(M):
                add(("X", c, j), ("F", c, j), ("X", c, j - L) if j >= L else None)
                add(("Y", c, j), ("B", c + 1, j), ("Y", c, j - L) if j >= L else None)
    # Kahn's algorithm: a topological order
    users: dict = {k: [] for k in deps}
    missing = {}
    for k, ds in deps.items():
        missing[k] = len(ds)
        for d in ds:
            users[d].append(k)
    ready = [k for k, c in missing.items() if c == 0]
    order = []
    while ready:
        k = ready.pop()
        index[k] = len(order)
        order.append(k)
        for u in users[k]:
            missing[u] -= 1
            if missing[u] == 0:
                ready.append(u)
    if len(order) != len(deps):  # pragma: no cover - a bug, not bad input
        raise RuntimeError("the schedule's dependency graph has a cycle")
    return RunGraph(order, [tuple(index[d] for d in deps[k]) for k in order])


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
