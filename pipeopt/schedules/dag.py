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

With one stage per rank, these are exactly the operations and dependencies of
:func:`pipeopt.cost.schedule.run_graph` for the same order (its links carry microbatches in
order, which is the order a 1F1B or GPipe stage produces them), so the iteration time is the
same longest path (``tests/schedules/test_execute.py``).
"""

from __future__ import annotations

import graphlib
from dataclasses import dataclass

from ..cost.schedule import RunGraph
from ..errors import InvalidPlanError
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
    deps: dict = {}
    rank_of: dict = {}
    release: dict = {}  # action -> the action whose end releases its outputs (its step's last)
    grad_of: dict = {}  # (stage, microbatch) -> the action that sends its input gradient (B or I)
    for r in range(schedule.ranks):
        for step in schedule.steps[r]:
            for a in step:
                release[a] = step[-1]
                rank_of[a] = r
                if a.kind in ("B", "I"):
                    grad_of[(a.stage, a.microbatch)] = a
    channels: dict = {}  # (sender rank, receiver rank) -> the last transfer queued on it
    for r in range(schedule.ranks):
        prev = None
        for a in schedule.actions(r):
            kind, s, j = a
            after = [prev] if prev is not None else []
            if kind == "F" and s > 0:
                after.append(_arrival(("X", s - 1, j), release[("F", s - 1, j)], cross[s - 1], overlap))
            elif kind in ("B", "I"):
                after.append(("F", s, j))
                if s < S - 1:
                    after.append(_arrival(("Y", s, j), release[grad_of[(s + 1, j)]], cross[s], overlap))
            elif kind == "W":
                after.append(("I", s, j))
            deps[a] = after
            prev = a
        if overlap:  # this rank's sends, channel by channel, in the order its steps produce them
            for step in schedule.steps[r]:
                for kind, s, j in step:
                    if kind == "F" and s < S - 1 and cross[s]:
                        op, to = ("X", s, j), place[s + 1]
                    elif kind in ("B", "I") and s > 0 and cross[s - 1]:
                        op, to = ("Y", s - 1, j), place[s - 1]
                    else:
                        continue
                    key = (r, to)
                    deps[op] = [release[(kind, s, j)]] + ([channels[key]] if key in channels else [])
                    channels[key] = op
                    rank_of[op] = r
    sorter = graphlib.TopologicalSorter(deps)
    try:
        order = list(sorter.static_order())
    except graphlib.CycleError as exc:
        cycle = " -> ".join(_name(op) for op in exc.args[1][:8])
        raise InvalidPlanError(f"{schedule.name}: the order deadlocks (a cycle of waits: {cycle})") from None
    index = {op: q for q, op in enumerate(order)}
    after = [tuple(index[d] for d in deps[op]) for op in order]
    return ScheduleGraph(RunGraph(order, after), tuple(rank_of[op] for op in order), cross, overlap)


def _arrival(transfer, sender, crosses: bool, overlap: bool):
    """What a consumer waits for: the transfer (across ranks, with overlap) or the sender."""
    return transfer if crosses and overlap else sender


def _name(op) -> str:
    kind, index, j = op
    return f"{kind}{j}@cut{index}" if kind in ("X", "Y") else f"{index}{kind}{j}"


def check_schedule(schedule: Schedule) -> None:
    """Raise :class:`InvalidPlanError` unless ``schedule`` can run: its structure is checked
    when it is built (:class:`Schedule`), this adds the deadlock check (:func:`schedule_graph`,
    with transfers on the links and without)."""
    schedule_graph(schedule, overlap=True)
    schedule_graph(schedule, overlap=False)
