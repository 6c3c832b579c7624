"""A schedule's iteration as a graph of operations, the way :mod:`pipeopt.cost.schedule`
states the 1F1B-flush and GPipe runs.

Operations: the actions (``("F" | "B" | "I" | "W", stage, microbatch)``) and, with transfers
beside compute, the transfers ``("X", c, j)`` (microbatch j's activations over boundary c,
stage c -> c + 1) and ``("Y", c, j)`` (its gradients, c + 1 -> c) at every boundary whose two
stages sit on different ranks. Each operation starts when every operation it depends on has
ended:

* **rank order**: the action before it on its rank;
* **data**: ``F(s, j)`` after the activations of ``F(s - 1, j)``; ``B(s, j)`` / ``I(s, j)``
  after ``F(s, j)`` and the gradients of ``B(s + 1, j)`` / ``I(s + 1, j)``; ``W(s, j)`` after
  ``I(s, j)``. Data leaves when the step holding its action ends (a fused step releases its
  outputs together), through the transfer if the two stages are on different ranks, else at
  once (torch hands it over in memory);
* **links**: full duplex, as in :mod:`pipeopt.cost.schedule`: each direction between two
  ranks is one channel carrying its transfers one at a time, in the order the sending rank
  produces them. Without overlap there are no transfer operations: the sending action
  carries its transfer (:mod:`.execute`) and the data is there when it ends.

The graph is built by :func:`pipeopt.cost.schedule.lane_graph`, the one builder the flush
runs of :func:`pipeopt.cost.schedule.run_graph` use too: a rank is a lane, its steps the
lane's steps, and each direction between two ranks one channel in the sender's order. With
one stage per rank, these are exactly the operations and dependencies of ``run_graph`` for
the same order (its links carry microbatches in order, which is the order a 1F1B or GPipe
stage produces them), so the iteration time is the same longest path
(``tests/schedules/test_schedule_execute.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cost.schedule import RunGraph, lane_graph, sent_by
from .actions import Schedule


@dataclass(frozen=True)
class ScheduleGraph:
    """The operations of a schedule's iteration (module docstring).

    Attributes
    ----------
    graph
        :class:`pipeopt.cost.schedule.RunGraph`: ``ops`` in a topological order and, per op,
        the ops that must end before it starts (what
        :func:`pipeopt.cost.schedule.makespan` reads).
    rank
        ``tuple[int, ...]`` per op: the rank that runs it (for a transfer, the sender).
    cross
        ``tuple[bool, ...]`` per boundary: its two stages sit on different ranks.
    overlap
        Whether transfers are operations of their own.
    """

    graph: RunGraph
    rank: tuple
    cross: tuple
    overlap: bool


def schedule_graph(schedule: Schedule, overlap: bool = True) -> ScheduleGraph:
    """Build the operations and dependencies of ``schedule``'s iteration.

    Parameters
    ----------
    schedule
        A :class:`Schedule`.
    overlap
        Transfers are operations on the links (default); else the sending action carries
        them.

    Returns
    -------
    ScheduleGraph

    Raises
    ------
    InvalidPlanError
        If the order deadlocks: its dependencies have a cycle (ranks waiting on each other),
        named by a few of its operations.
    """
    S, place = schedule.stages, schedule.placement
    cross = tuple(place[c] != place[c + 1] for c in range(S - 1))
    channels: dict = {}  # (sender rank, receiver rank) -> its transfers, in the sender's order
    for r in range(schedule.ranks):
        for a in schedule.actions(r):
            t = sent_by(a, cross)
            if t is not None:
                kind, c, _ = t
                channels.setdefault((r, place[c + 1] if kind == "X" else place[c]), []).append(t)
    graph, rank = lane_graph(schedule.steps, S, cross=cross, channels=channels.values(), overlap=overlap,
                             name=schedule.name)
    return ScheduleGraph(graph, rank, cross, overlap)


def check_schedule(schedule: Schedule) -> None:
    """Raise :class:`InvalidPlanError` unless ``schedule`` can run: its structure is checked
    when it is built (:class:`Schedule`), this adds the deadlock check (:func:`schedule_graph`,
    with transfers on the links and without)."""
    schedule_graph(schedule, overlap=True)
    schedule_graph(schedule, overlap=False)
