"""Where a zero-bubble schedule's W actions may go: the gaps between a rank's other steps.

In the zero-bubble schedules (Qi et al., *Zero Bubble Pipeline Parallelism*, ICLR 2024) a weight
gradient W(s, j) depends only on its own input gradient I(s, j) (same chunk, same microbatch)
and nothing depends on W, so W may run anywhere on its rank after its I (deferred W fills
bubbles; it keeps the microbatch's activations alive until it runs, the memory rule of
:mod:`.actions`). **Free W placement** keeps every rank's other steps (F, B, I and fused steps)
in the schedule's order and puts each W in a *gap*: gap ``g`` of a rank is right after its
``g``-th non-W step (0-based; the last gap is the end of the rank's order), and W(s, j) may take
any gap at or after the step holding I(s, j).

Two facts make the gap the whole decision (used by the exact model,
:mod:`pipeopt.problems.schedule.w_placement`, and checked by the brute force over every
assignment in ``tests/problems/schedule/test_w_placement.py``):

* the W's of one gap run back to back between two non-W steps, and no operation waits for a W
  except the next step of its rank, so their order inside the gap changes no start time;
  memory peaks right after an F (:meth:`.Schedule.activation_profile`), never inside a gap;
* the W's of one chunk may run **in the order of their I's** without loss (exchange argument:
  two W's of one chunk last as long and free as many activation bytes, so swapping the gaps
  of two that run against their I order keeps every time and every memory count, and each
  still runs after its I).

:func:`place_w` builds the :class:`.Schedule` of a gap assignment (W's of one gap in the
order of their I's), :func:`schedule_gaps` reads the schedule's own assignment.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidPlanError, InvalidProblemError
from .actions import Action, Schedule

__all__ = ["RankGaps", "place_w", "rank_gaps", "schedule_gaps"]


@dataclass(frozen=True)
class RankGaps:
    """The W freedom of one rank.

    Attributes
    ----------
    steps
        ``tuple`` of the rank's non-W steps in the schedule's order (each a tuple of
        :class:`.Action`); gap ``g`` is right after ``steps[g]``.
    ws
        ``tuple[Action, ...]``: the rank's W actions, in the order of their I's on the rank.
    earliest
        ``tuple[int, ...]`` per W of ``ws``: the first gap it may take (the step of its I).
    chains
        ``tuple`` of tuples of indices into ``ws``: per chunk of the rank, its W's in the order
        of their I's (the order the model keeps, module docstring).
    """

    steps: tuple
    ws: tuple
    earliest: tuple
    chains: tuple

    @property
    def gaps(self) -> int:
        """Number of gaps (= non-W steps)."""
        return len(self.steps)


def rank_gaps(schedule: Schedule) -> tuple:
    """``tuple[RankGaps, ...]`` per rank of ``schedule`` (module docstring).

    Raises
    ------
    InvalidProblemError
        If the schedule has no W action, or a W shares a step with other actions (a fused step:
        its place is not free).
    """
    if not any(a.kind == "W" for r in range(schedule.ranks) for a in schedule.actions(r)):
        raise InvalidProblemError(
            f"{schedule.name} has no W (weight-gradient) action: free W placement applies to zero-bubble"
            " schedules (InterleavedZeroBubble, ZBVZeroBubble, DualPipeV)"
        )
    out = []
    for r in range(schedule.ranks):
        steps, i_step = [], {}
        for step in schedule.steps[r]:
            if any(a.kind == "W" for a in step):
                if len(step) > 1:
                    raise InvalidProblemError(f"{schedule.name}: rank {r} runs a W inside a fused step {step}")
                continue
            for a in step:
                if a.kind == "I":
                    i_step[(a.stage, a.microbatch)] = len(steps)
            steps.append(step)
        ws = sorted((a for a in schedule.actions(r) if a.kind == "W"),
                    key=lambda a: i_step[(a.stage, a.microbatch)])
        chains: dict = {}
        for q, a in enumerate(ws):
            chains.setdefault(a.stage, []).append(q)
        out.append(RankGaps(tuple(steps), tuple(ws), tuple(i_step[(a.stage, a.microbatch)] for a in ws),
                            tuple(tuple(c) for _, c in sorted(chains.items()))))
    return tuple(out)


def schedule_gaps(schedule: Schedule, gaps: tuple | None = None) -> tuple:
    """The schedule's own W placement: per rank, the gap of each W of ``gaps[r].ws``
    (``gaps``: :func:`rank_gaps`, computed if not given)."""
    gaps = rank_gaps(schedule) if gaps is None else gaps
    out = []
    for r, rg in enumerate(gaps):
        where, done = {}, -1
        for step in schedule.steps[r]:
            if any(a.kind == "W" for a in step):
                where[step[0]] = done
            else:
                done += 1
        out.append(tuple(where[w] for w in rg.ws))
    return tuple(out)


def place_w(schedule: Schedule, assignment, gaps: tuple | None = None, name: str | None = None) -> Schedule:
    """The schedule with its W's moved to the gaps ``assignment`` (per rank, one gap per W of
    ``gaps[r].ws``; W's of one gap in the order of their I's); other steps keep their order.

    Parameters
    ----------
    schedule
        A :class:`.Schedule` with W actions.
    assignment
        Per rank, a sequence of gap indices, one per W of :func:`rank_gaps` ``[r].ws``.
    gaps
        :func:`rank_gaps` of ``schedule`` (computed if not given).
    name
        Name of the new schedule (default: the schedule's name + ``"+freeW"``).

    Returns
    -------
    Schedule

    Raises
    ------
    InvalidPlanError
        If a W is put in a gap before its I or outside the rank's gaps, or an assignment has
        the wrong length.
    """
    gaps = rank_gaps(schedule) if gaps is None else gaps
    if len(assignment) != schedule.ranks:
        raise InvalidPlanError(f"W placement for {len(assignment)} ranks, the schedule has {schedule.ranks}")
    ranks = []
    for r, (rg, where) in enumerate(zip(gaps, assignment, strict=True)):
        where = [int(g) for g in where]
        if len(where) != len(rg.ws):
            raise InvalidPlanError(f"rank {r}: {len(where)} gaps given for its {len(rg.ws)} W actions")
        per_gap: list = [[] for _ in range(rg.gaps)]
        for a, g, lo in zip(rg.ws, where, rg.earliest, strict=True):
            if not lo <= g < rg.gaps:
                raise InvalidPlanError(f"rank {r}: {a} in gap {g}; its I is in step {lo}, gaps end at {rg.gaps - 1}")
            per_gap[g].append(a)
        steps = []
        for step, ws in zip(rg.steps, per_gap, strict=True):
            steps.append(step)
            steps += [(Action(*w),) for w in ws]
        ranks.append(tuple(steps))
    return Schedule(name or f"{schedule.name}+freeW", schedule.ranks, schedule.stages_per_rank,
                    schedule.microbatches, schedule.placement, tuple(ranks), schedule.parameter_copies,
                    schedule.source)
