"""A schedule as data: the per-rank order of actions, the placement of stages on ranks, and
the memory rule that follows from the order.

p ranks (pipeline workers) run ``S = p * v`` stages (the model's chunks, in pipeline order),
v on each rank, over m microbatches. Each rank runs its **steps** one after the other; a step
is one action, or several run back to back whose outputs leave together when the step ends
(torch's ``OVERLAP_F_B``, which DualPipeV uses: torch's runtime runs the sub-actions in turn,
``_PipelineScheduleRuntime._step_microbatches``, and ``_add_send_recv`` puts their sends after
the whole step). An action is ``(kind, stage, microbatch)``:

``"F"``
    the forward of the microbatch on the stage;
``"B"``
    its whole backward (input and weight gradients);
``"I"``, ``"W"``
    the backward split in two (Qi et al., *Zero Bubble Pipeline Parallelism*, ICLR 2024): I,
    the gradient of the stage's input, which the previous stage waits for; W, the gradient of
    its weights, which nothing waits for.

Sends and receives are not actions: a transfer follows from the data (an F's activations to
the next stage, a B's or I's gradients to the previous one) whenever the two stages sit on
different ranks (torch sends nothing between two stages of one rank, the "V-schedule special
case" of ``_PipelineScheduleRuntime``), and each direction of a link carries its transfers in
the order the sending rank produces them (:mod:`.dag`).

**The memory rule.** A microbatch's activations stay on a stage from the start of its F to
the end of its last backward action (B, or W when the backward is split: W still reads the
stage's inputs). A rank runs its actions one at a time, so the microbatches in flight on each
of its stages at any point of its order follow from the order alone, whatever the durations:
:meth:`Schedule.in_flight` (peak per stage) and :meth:`Schedule.activation_profile` (the
count vectors a rank's memory peaks at, so that a rank's peak memory for any chunk sizes is
the largest of a few linear forms - what a MILP's memory rows need). Parameters count
``parameter_copies`` times per stage (1 for every torch schedule; DeepSeek's bidirectional
DualPipe keeps 2, which DualPipeV's V placement avoids).
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import InvalidPlanError, InvalidProblemError

KINDS = ("F", "B", "I", "W")
"""Action kinds: forward, whole backward, input gradient, weight gradient."""


class Action(NamedTuple):
    """One action of a rank: ``kind`` (``"F"``, ``"B"``, ``"I"``, ``"W"``) of ``microbatch``
    on ``stage`` (0-based). Printed in torch's notation, ``"2F0"``: stage 2, forward of
    microbatch 0."""

    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


_ACTION = re.compile(r"^\s*(\d+)\s*([FBIW])\s*(\d+)\s*$")


def parse_action(text, where: str = "") -> Action:
    """Parse ``"<stage><kind><microbatch>"`` (``"3F0"``, ``"0W12"``: torch's spelling of an
    action, :meth:`Action.__str__`) into an :class:`Action`.

    Raises
    ------
    InvalidPlanError
        If ``text`` is not a string of that form (the message names ``where``).
    """
    m = _ACTION.match(text) if isinstance(text, str) else None
    if m is None:
        at = f" at {where}" if where else ""
        raise InvalidPlanError(f"action {text!r}{at} is not <stage><F|B|I|W><microbatch> (e.g. '0F1')")
    return Action(m.group(2), int(m.group(1)), int(m.group(3)))


def looped_placement(ranks: int, stages_per_rank: int) -> tuple:
    """Rank of each stage when stages loop over the ranks: stage s on rank ``s mod p``
    (interleaved schedules; torch ``generate_stage_to_rank_mapping(style="loop")``)."""
    return tuple(s % ranks for s in range(ranks * stages_per_rank))


def v_placement(ranks: int, stages_per_rank: int) -> tuple:
    """Rank of each stage when stages zigzag over the ranks: 0, 1, ..., p-1, p-1, ..., 0, 0,
    1, ... (ZBV and DualPipeV with v = 2: rank r holds stages r and 2p - 1 - r, so the first
    and last stage share rank 0; torch ``generate_stage_to_rank_mapping(style="v")``)."""
    out = []
    for s in range(ranks * stages_per_rank):
        q, r = divmod(s, ranks)
        out.append(r if q % 2 == 0 else ranks - 1 - r)
    return tuple(out)


def positive_int(value, what: str, low: int = 1) -> int:
    """``value`` as an int if it is an integer >= ``low`` (not a bool), else
    :class:`InvalidProblemError` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise InvalidProblemError(f"{what} must be an integer >= {low}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Schedule:
    """The per-rank order of actions of one iteration (module docstring).

    Parameters
    ----------
    name
        The schedule's name (torch's, e.g. ``"Interleaved1F1B"``).
    ranks, stages_per_rank, microbatches
        p, v and m.
    placement
        ``tuple[int, ...]`` of length ``p * v``: the rank of each stage.
    steps
        ``tuple`` per rank of its steps in order; a step is a tuple of :class:`Action` run
        back to back (usually one).
    parameter_copies
        Copies of each stage's parameters a rank keeps (1; DualPipe 2).
    source
        The code the order reproduces (e.g. torch's function).

    Raises
    ------
    InvalidProblemError
        If p, v or m is not a positive integer or the placement does not put v stages on
        each rank.
    InvalidPlanError
        If the order is not a schedule of one iteration: an action of a stage on another
        rank, a microbatch out of range, a (stage, microbatch) without exactly one F and
        either one B or one I and one W, or a backward before its forward (an I before its W
        is checked too). Deadlocks between ranks are found by :func:`pipeopt.schedules.dag`
        (:func:`pipeopt.schedules.check_schedule` runs both).
    """

    name: str
    ranks: int
    stages_per_rank: int
    microbatches: int
    placement: tuple
    steps: tuple
    parameter_copies: int = 1
    source: str = ""

    def __post_init__(self) -> None:
        p = positive_int(self.ranks, "ranks")
        v = positive_int(self.stages_per_rank, "stages_per_rank")
        m = positive_int(self.microbatches, "microbatches")
        positive_int(self.parameter_copies, "parameter_copies")
        placement = tuple(int(r) for r in self.placement)
        if len(placement) != p * v or any(not 0 <= r < p for r in placement) or any(
            placement.count(r) != v for r in range(p)
        ):
            raise InvalidProblemError(
                f"{self.name}: the placement {placement} must put {v} of the {p * v} stages on each of {p} ranks"
            )
        object.__setattr__(self, "placement", placement)
        steps = tuple(tuple(tuple(Action(*a) for a in step) for step in rank) for rank in self.steps)
        object.__setattr__(self, "steps", steps)
        if len(steps) != p:
            raise InvalidPlanError(f"{self.name}: orders for {len(steps)} ranks, expected {p}")
        seen: dict = {}
        for r, rank_steps in enumerate(steps):
            for step in rank_steps:
                if not step:
                    raise InvalidPlanError(f"{self.name}: rank {r} has an empty step")
                for a in step:
                    if a.kind not in KINDS:
                        raise InvalidPlanError(f"{self.name}: rank {r}: unknown action kind {a.kind!r} in {a}")
                    if not 0 <= a.stage < p * v or placement[a.stage] != r:
                        raise InvalidPlanError(f"{self.name}: rank {r} runs {a}, a stage it does not hold")
                    if not 0 <= a.microbatch < m:
                        raise InvalidPlanError(f"{self.name}: rank {r} runs {a}: microbatch out of 0..{m - 1}")
                    key = (a.stage, a.microbatch)
                    done = seen.setdefault(key, [])
                    if a.kind in done:
                        raise InvalidPlanError(f"{self.name}: rank {r} runs {a} twice")
                    need = {"F": (), "B": ("F",), "I": ("F",), "W": ("I",)}[a.kind]
                    if any(k not in done for k in need):
                        raise InvalidPlanError(f"{self.name}: rank {r} runs {a} before its {need[0]}")
                    if a.kind == "B" and "I" in done or a.kind == "I" and "B" in done:
                        raise InvalidPlanError(f"{self.name}: {a} runs both B and I")
                    done.append(a.kind)
        for s in range(p * v):
            for j in range(m):
                done = sorted(seen.get((s, j), []))
                if done not in (["B", "F"], ["F", "I", "W"]):
                    raise InvalidPlanError(
                        f"{self.name}: microbatch {j} on stage {s} runs {done or 'nothing'}; it must run F and"
                        " then B, or F, I and W"
                    )

    @property
    def stages(self) -> int:
        """S = p * v."""
        return self.ranks * self.stages_per_rank

    def actions(self, rank: int) -> tuple:
        """The rank's actions in order (steps flattened)."""
        return tuple(a for step in self.steps[rank] for a in step)

    def stages_on(self, rank: int) -> tuple:
        """The stages the rank holds, in pipeline order."""
        return tuple(s for s, r in enumerate(self.placement) if r == rank)

    @property
    def splits_backward(self) -> bool:
        """True if some backward runs as I and W."""
        return any(a.kind == "I" for r in range(self.ranks) for a in self.actions(r))

    def _peaks(self, rank: int) -> list:
        """Count vectors (over :meth:`stages_on`) right after each F of the rank: where its
        activations peak (only an F adds a microbatch in flight)."""
        local = {s: q for q, s in enumerate(self.stages_on(rank))}
        last = {}  # (stage, microbatch) -> the kind that frees its activations
        for a in self.actions(rank):
            if a.kind in ("B", "W"):
                last[(a.stage, a.microbatch)] = a.kind
        counts = [0] * len(local)
        out = []
        for a in self.actions(rank):
            if a.kind == "F":
                counts[local[a.stage]] += 1
                out.append(tuple(counts))
            elif last.get((a.stage, a.microbatch)) == a.kind:
                counts[local[a.stage]] -= 1
        return out

    def in_flight(self) -> tuple:
        """``tuple[int, ...]`` per stage: the most microbatches whose activations the stage
        holds at once (module docstring, the memory rule)."""
        out = [0] * self.stages
        for r in range(self.ranks):
            mine = self.stages_on(r)
            for vec in self._peaks(r):
                for s, k in zip(mine, vec, strict=True):
                    out[s] = max(out[s], k)
        return tuple(out)

    def activation_profile(self, rank: int) -> tuple:
        """The count vectors (microbatches in flight on each of :meth:`stages_on` ``(rank)``)
        at which the rank's activation memory can peak, none dominated by another: for
        activation bytes ``a_s`` per microbatch the rank's peak is ``max over vectors c of
        sum_s c_s a_s``."""
        vecs = sorted(set(self._peaks(rank)), reverse=True)
        keep: list = []
        for c in vecs:
            if not any(all(x >= y for x, y in zip(k, c, strict=True)) for k in keep):
                keep.append(c)
        return tuple(keep)

    def to_dict(self) -> dict:
        """JSON-ready dict: ``name``, ``ranks``, ``stages_per_rank``, ``microbatches``,
        ``placement`` (rank of each stage), ``orders`` (per rank, its steps in order; a step is
        an action string ``"<stage><kind><microbatch>"`` such as ``"3F0"``, torch's spelling,
        or a list of them when run back to back), ``parameter_copies`` and ``source``."""
        def cell(step):
            return str(step[0]) if len(step) == 1 else [str(a) for a in step]

        return {"name": self.name, "ranks": self.ranks, "stages_per_rank": self.stages_per_rank,
                "microbatches": self.microbatches, "placement": list(self.placement),
                "orders": [[cell(step) for step in rank] for rank in self.steps],
                "parameter_copies": self.parameter_copies, "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> Schedule:
        """Inverse of :meth:`to_dict` (``parameter_copies`` and ``source`` optional).

        Raises
        ------
        InvalidPlanError
            If ``d`` is not such a dict, a field is missing or unknown, or an action string is
            not ``<stage><F|B|I|W><microbatch>`` (named), or the order is not one iteration's
            (the checks of :class:`Schedule`). Deadlocks are :func:`check_schedule`'s.
        """
        need = {"name", "ranks", "stages_per_rank", "microbatches", "placement", "orders"}
        if not isinstance(d, dict) or not need <= set(d):
            missing = sorted(need - set(d)) if isinstance(d, dict) else sorted(need)
            raise InvalidPlanError(f"a schedule must be a JSON object with {sorted(need)}; missing {missing}")
        unknown = sorted(set(d) - need - {"parameter_copies", "source"})
        if unknown:
            raise InvalidPlanError(f"a schedule has unknown field(s) {unknown}")
        if not isinstance(d["orders"], list) or not all(isinstance(r, list) for r in d["orders"]):
            raise InvalidPlanError("a schedule's 'orders' must be a list (per rank) of lists of actions")
        steps = []
        for r, rank in enumerate(d["orders"]):
            row = []
            for q, cell in enumerate(rank):
                texts = cell if isinstance(cell, list) else [cell]
                row.append(tuple(parse_action(t, f"rank {r}, step {q}") for t in texts))
            steps.append(tuple(row))
        return cls(str(d["name"]), d["ranks"], d["stages_per_rank"], d["microbatches"], tuple(d["placement"]),
                   tuple(steps), d.get("parameter_copies", 1), str(d.get("source", "")))

    def __str__(self) -> str:
        head = f"{self.name}: {self.ranks} ranks x {self.stages_per_rank} stages, {self.microbatches} microbatches"
        lines = [head]
        for r in range(self.ranks):
            cells = [str(s[0]) if len(s) == 1 else "(" + ";".join(map(str, s)) + ")" for s in self.steps[r]]
            lines.append(f"  rank {r}: " + " ".join(cells))
        return "\n".join(lines)
