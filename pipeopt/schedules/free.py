"""The free-order schedule: every rank's order of F, I and W actions is a decision, not a given.

A fixed schedule (:mod:`.torch_orders`) fixes each rank's order; the free-order problem
(:mod:`pipeopt.problems.schedule.free_order`) chooses it, together with the split. What stays
fixed is the *shape*: p ranks, v stages per rank, m microbatches and the placement of stages on
ranks, one of

``"looped"``
    stage s on rank ``s mod p`` (:func:`.actions.looped_placement`; with v = 1 one stage per
    rank, the placement of GPipe, 1F1B, Interleaved1F1B, LoopedBFS and InterleavedZeroBubble);
``"v"``
    v = 2, stage s on rank s for s < p and ``2p - 1 - s`` after (:func:`.actions.v_placement`;
    ZBVZeroBubble and DualPipeV).

Every backward is split into I (input gradient) and W (weight gradient). This loses nothing:
any order with whole backwards B, or with fused steps (DualPipeV's overlapped F and B), becomes
a free order with the same or an earlier end when B is replaced by I followed at once by W and
every fused step by its actions one after the other (:func:`as_free`): the data an action
sends leaves when it ends, so an I releases the input gradient no later than its B did and a
fused step's first action no later than the step; the memory rule (a microbatch's activations
held from its F to its W, or B) gives the same counts at every F. So the free-order optimum is
at most every fixed-order optimum of the same shape, and its space contains theirs
(:func:`pipeopt.problems.spaces.contains`).

:func:`free_template` gives the order a free-order problem starts from (and whose shape it
keeps): torch's InterleavedZeroBubble order (looped, any v) or ZBVZeroBubble's (V), flattened,
named ``"free"``.
"""

from __future__ import annotations

from ..errors import InvalidProblemError
from .actions import Action, Schedule, positive_int

__all__ = ["FREE", "FREE_PLACEMENTS", "as_free", "free_template", "placement_kind"]

FREE = "free"
"""The canonical name of the free-order schedule (:func:`pipeopt.schedules.schedule_name`)."""

FREE_PLACEMENTS = ("looped", "v")
"""The placements of stages on ranks a free-order problem takes (module docstring)."""


def free_template(ranks: int, microbatches: int, stages_per_rank: int | None = None,
                  placement: str = "looped") -> Schedule:
    """The starting order of a free-order problem of this shape (module docstring).

    Parameters
    ----------
    ranks, microbatches
        p and m.
    stages_per_rank
        v (default 1 looped, 2 with the V placement, which takes only 2).
    placement
        ``"looped"`` or ``"v"``.

    Returns
    -------
    Schedule
        Named ``"free"``, one action per step, F/I/W actions.

    Raises
    ------
    InvalidProblemError
        Unknown placement, a v the placement does not take, or the sizes
        :func:`pipeopt.schedules.make_schedule` refuses.
    """
    from .torch_orders import make_schedule

    if placement not in FREE_PLACEMENTS:
        raise InvalidProblemError(f"unknown placement {placement!r} for the free order; choose from {list(FREE_PLACEMENTS)}")
    if placement == "v":
        if stages_per_rank not in (None, 2):
            raise InvalidProblemError(f"the V placement holds 2 stages per rank, not {stages_per_rank!r}")
        base = make_schedule("ZBVZeroBubble", ranks, microbatches)
    else:
        v = 1 if stages_per_rank is None else positive_int(stages_per_rank, "stages_per_rank")
        base = make_schedule("InterleavedZeroBubble", ranks, microbatches, v)
    return as_free(base, name=FREE,
                   source=f"free order; starts from {base.name}'s order ({base.source or 'torch'}) and reorders it")


def as_free(schedule: Schedule, name: str | None = None, source: str | None = None) -> Schedule:
    """``schedule`` as a free order of the same shape: each B becomes I then W, each fused step
    its actions one per step (module docstring: never later, same memory).

    Parameters
    ----------
    schedule
        Any :class:`Schedule`.
    name, source
        The result's name and source (default: the schedule's).

    Returns
    -------
    Schedule
    """
    steps = []
    for r in range(schedule.ranks):
        row = []
        for a in schedule.actions(r):
            if a.kind == "B":
                row += [(Action("I", a.stage, a.microbatch),), (Action("W", a.stage, a.microbatch),)]
            else:
                row.append((a,))
        steps.append(tuple(row))
    return Schedule(schedule.name if name is None else name, schedule.ranks, schedule.stages_per_rank,
                    schedule.microbatches, schedule.placement, tuple(steps), schedule.parameter_copies,
                    schedule.source if source is None else source)


def placement_kind(schedule: Schedule) -> str | None:
    """``"looped"`` or ``"v"`` if ``schedule``'s placement is that one (v = 1 counts as looped),
    else ``None``."""
    from .actions import looped_placement, v_placement

    p, v = schedule.ranks, schedule.stages_per_rank
    if schedule.placement == looped_placement(p, v):
        return "looped"
    if v == 2 and schedule.placement == v_placement(p, v):
        return "v"
    return None
