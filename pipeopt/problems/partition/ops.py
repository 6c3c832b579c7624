"""The op durations of a straight split and its run graph, read by the event-time MILP
(:mod:`.events`) and by the tie-break's enumeration and descent (:mod:`.tiebreak`) without the
MILP's imports: stage ``s`` of a split runs one forward and one backward op per microbatch,
each cut one transfer each way, on the graph of :func:`pipeopt.cost.schedule.run_graph`
(sequential execution, one replica per stage, window ``S - s``).
"""

from __future__ import annotations

import numpy as np

from ...cost import rules
from ...cost.schedule import RunGraph, makespan, run_graph
from .problem import PartitionProblem

__all__ = ["event_graph", "op_prefixes", "op_times", "run_time", "schedule_reach"]


# ---- the op durations of a split ------------------------------------------------------------
def op_prefixes(problem: PartitionProblem) -> dict[str, np.ndarray]:
    """The arrays whose differences are the op durations (seconds, ``ndarray (n+1,)`` each).

    Stage s of units ``p_s..p_{s+1}-1`` has forward op ``f_end[p_{s+1}] - f_begin[p_s]``,
    backward op ``b_end[p_{s+1}] - b_begin[p_s]``; a transfer over the cut at ``p_c`` lasts
    ``xfer[p_c]`` (each direction, one link; zeros without overlap, where the sends are in
    the ops).

    Returns
    -------
    dict
        ``"f_begin"``, ``"f_end"``, ``"b_begin"``, ``"b_end"``, ``"xfer"``.
    """
    tab = problem.table
    units = problem.instance.cluster.devices[0].resources[problem.kind]
    F = np.asarray(tab.pass_prefix("fwd", problem.kind, units), dtype=float)
    B = np.asarray(tab.pass_prefix("bwd", problem.kind, units), dtype=float)
    send = np.asarray(tab.send_time, dtype=float)
    # without overlap the sender carries its transfer: the forward op of the stage before a cut,
    # the backward op of the stage after it; with overlap it is on the link (xfer)
    added, xfer, _ = rules.boundary_terms(send, send, send, problem.instance.settings.overlap)
    # the stage overhead (CostTable.overhead), once per stage and pass: half at each of its two
    # boundaries (PartitionProblem.cut_terms)
    of, ob = (o / 2 for o in tab.overhead)
    return {"f_begin": F - of, "f_end": F + added + of, "b_begin": B - added - ob, "b_end": B + ob, "xfer": xfer}


def op_times(problem: PartitionProblem, starts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seconds of each stage's forward and backward op and of each cut's transfer (one
    direction) of the split whose stages 1..S-1 start at ``starts`` (the backward with its tied
    parameters' gradient sums, :meth:`PartitionProblem.tie_sum`, which :func:`op_prefixes` leaves out).

    Returns
    -------
    (f_op, b_op, x)
        ``ndarray (S,)``, ``(S,)``, ``(S-1,)``; ``x`` is zero without overlap.
    """
    a = op_prefixes(problem)
    p = np.array([0, *[int(c) for c in starts], problem.n])
    f = a["f_end"][p[1:]] - a["f_begin"][p[:-1]]
    b = a["b_end"][p[1:]] - a["b_begin"][p[:-1]] + problem.tie_sum(p[:-1], p[1:])  # tied gradients' sums
    return f, b, a["xfer"][p[1:-1]]


def event_graph(problem: PartitionProblem, schedule: str, microbatches: int | None = None) -> RunGraph:
    """The run graph of a straight split of ``problem.stages`` stages
    (:func:`pipeopt.cost.schedule.run_graph` with one replica per stage, window ``S - s``,
    sequential execution, one link per cut); M defaults to the instance's."""
    S = problem.stages
    M = problem.instance.settings.microbatches if microbatches is None else int(microbatches)
    return run_graph(schedule, [1] * S, rules.windows(S), [False] * S, [1] * max(S - 1, 0), M,
                     bool(problem.instance.settings.overlap))


def run_time(problem: PartitionProblem, starts, schedule: str,
             graph: RunGraph | None = None) -> tuple[float, np.ndarray]:
    """Iteration time (seconds) and op start times of a split on the table's numbers, memory
    aside: :func:`pipeopt.cost.schedule.makespan` of :func:`event_graph` with :func:`op_times`."""
    graph = event_graph(problem, schedule) if graph is None else graph
    f, b, x = op_times(problem, starts)
    return makespan(graph, graph.durations(f, b, x, x))


def schedule_reach(problem: PartitionProblem, schedule: str) -> np.ndarray:
    """``reach[t, a]`` (:func:`pipeopt.problems.partition.model.memory_reach`) with the
    schedule's in-flight count: ``S - t`` under 1F1B, M under GPipe. ``ndarray (S, n+1)``."""
    S, M = problem.stages, problem.instance.settings.microbatches
    flight = rules.windows(S) if schedule == "1f1b" else [rules.in_flight(t, S, gpipe=True, microbatches=M) for t in range(S)]
    return np.array([problem.memory_reach(k) for k in flight], dtype=np.int64)
