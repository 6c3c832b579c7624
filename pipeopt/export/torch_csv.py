"""Export an action order to the CSV that torch's ``_PipelineScheduleRuntime`` loads, and read
one back (a CSV the user may have edited), checked before anything runs.

**The format** (PyTorch 2.13, ``torch/distributed/pipelining/schedules.py``,
``_PipelineScheduleRuntime._load_csv`` with its default ``format="compute_only"``, which calls
``PipelineScheduleMulti._load_csv``): one CSV row per pipeline rank, rank 0 first; each cell
one action in torch's spelling ``<stage><kind><microbatch>`` (``_Action.from_str``: ``0F1`` the
forward of microbatch 1 on stage 0; kinds ``F``, ``B`` (whole backward), ``I`` (input
gradient), ``W`` (weight gradient)); an empty cell is an idle step; a step of actions run back
to back is ``(0F3;1B1)OVERLAP_F_B``. Stage numbers are global (0 .. S - 1); the rank of each
stage is the row it appears in (``_validate_schedule`` infers ``stage_index_to_group_rank``
from the rows). The file holds **computation only**: in ``compute_only`` form the runtime adds
the sends and receives itself (``_PipelineScheduleRuntime._prepare_schedule_with_comms``:
``_add_unshard_reshard``, ``_add_reduce_grad``, then ``_add_send_recv``, which places each
send right after the action that produces the data and the matching receive on the other
rank). A CSV with ``SEND_F``/``RECV_F``/``SEND_B``/``RECV_B`` cells is torch's other form,
``compute_comms``, which ``_load_csv`` reads only when asked with ``format="compute_comms"``
and which it does not validate; pipeopt neither writes nor reads it.

torch checks little: ``_validate_schedule`` counts each stage's F, B, I, W and checks an F
before its B/I and an I before its W on the same row; an order that deadlocks between ranks
fails in ``_add_send_recv`` ("Malformed compute schedule") or hangs. :func:`read_csv` and
:func:`check_order` check everything first and name the **first broken action**: a cell that
is not an action, a stage on two ranks, an action run twice, a backward before its forward, a
missing action, or - simulating the ranks in order - the first action of the lowest rank
that can never start (a cycle of waits between ranks), with what it waits for.

:func:`order_for` gives the order a plan runs: its own (``plan.schedule``, e.g. a free order
of the schedule problem) or one of torch's seven built for its ranks.
"""

from __future__ import annotations

import csv
import io

from ..errors import InvalidPlanError, ReadError, UnsupportedPlanError
from ..plan import Plan
from ..schedules.actions import Action, Schedule, parse_action
from .layout import ModelLayout, plan_ranks, split_stages

RUNTIME = "torch.distributed.pipelining (_PipelineScheduleRuntime)"
TARGET = ("PyTorch 2.13 torch/distributed/pipelining/schedules.py: _PipelineScheduleRuntime._load_csv "
          "(format='compute_only')")
FUSED = "OVERLAP_F_B"
"""torch's computation type of a step of several actions run back to back."""
COMMS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD")
"""torch's non-compute action types (the ``compute_comms`` form): refused by :func:`read_csv`."""


# ---- writing ---------------------------------------------------------------------------------
def _cell(step: tuple) -> str:
    if len(step) == 1:
        return str(step[0])
    return "(" + ";".join(str(a) for a in step) + ")" + FUSED


def to_csv(schedule: Schedule) -> str:
    """``schedule``'s per-rank orders as torch's compute-only CSV text (module docstring): row r
    is rank r's steps in order, ``\\r\\n``-terminated as :mod:`csv` writes them.

    >>> from pipeopt.schedules import make_schedule
    >>> print(to_csv(make_schedule("1F1B", ranks=2, microbatches=2)), end="")
    0F0,0F1,0B0,0B1
    1F0,1B0,1F1,1B1
    """
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for r in range(schedule.ranks):
        writer.writerow([_cell(step) for step in schedule.steps[r]])
    return buf.getvalue()


# ---- reading ---------------------------------------------------------------------------------
def _parse_cell(text: str, where: str) -> tuple:
    """One CSV cell -> a step (tuple of Action); ``()`` for an empty (idle) cell."""
    text = text.strip()
    if not text:
        return ()
    if text.startswith("("):
        close = text.find(")")
        if close < 0 or text[close + 1:].strip() != FUSED:
            raise ReadError(f"{where}: {text!r} is not a step of actions run back to back, "
                            f"'(<action>;<action>){FUSED}'")
        parts = [t for t in text[1:close].split(";") if t.strip()]
        if not parts:
            raise ReadError(f"{where}: {text!r} holds no action")
        return tuple(_parse_one(t, where) for t in parts)
    return (_parse_one(text, where),)


def _parse_one(text: str, where: str) -> Action:
    text = text.strip()
    for comm in COMMS:
        if comm in text:
            raise ReadError(
                f"{where}: {text!r} is a communication action; pipeopt reads torch's compute-only CSV "
                "(F, B, I, W), to which _PipelineScheduleRuntime adds the sends and receives itself"
            )
    try:
        return parse_action(text)
    except InvalidPlanError:
        raise ReadError(f"{where}: {text!r} is not an action <stage><F|B|I|W><microbatch> (e.g. '0F1')") from None


def read_csv(source, *, name: str = "csv", microbatches: int | None = None) -> Schedule:
    """Read a torch compute-only CSV (module docstring) into a checked :class:`Schedule`.

    Parameters
    ----------
    source
        A path (``str`` or ``os.PathLike``) or a file object; its name is used in messages.
    name
        The schedule's name.
    microbatches
        m, if known (the plan's or the run's): every stage must run each of 0 .. m - 1; default
        the largest microbatch in the file + 1.

    Returns
    -------
    Schedule
        Placement: each stage on the rank (row) that runs it; ``stages_per_rank`` = S / p.

    Raises
    ------
    ReadError
        If the file cannot be read or a cell is not an action (named by row and column).
    InvalidPlanError
        Naming the first broken action: a stage on two ranks, ranks holding different numbers
        of stages, an action run twice, a backward before its forward (or a W before its I), a
        missing action, or an order that deadlocks (:func:`check_order`).
    """
    if hasattr(source, "read"):
        label, text = getattr(source, "name", "<csv>"), source.read()
    else:
        label = str(source)
        try:
            with open(source, newline="") as fh:
                text = fh.read()
        except OSError as exc:
            raise ReadError(f"cannot read {label}: {exc.strerror or exc}") from None
    rows = [row for row in csv.reader(io.StringIO(text))]
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()  # trailing blank lines
    if not rows:
        raise ReadError(f"{label}: no rows (one row of actions per pipeline rank expected)")
    steps = []
    for r, row in enumerate(rows):
        rank_steps = []
        for q, cell in enumerate(row):
            step = _parse_cell(cell, f"{label}: row {r + 1} (rank {r}), column {q + 1}")
            if step:
                rank_steps.append(step)
        steps.append(tuple(rank_steps))
    return order_from_steps(steps, name=name, microbatches=microbatches, label=label)


def order_from_steps(steps, *, name: str = "csv", microbatches: int | None = None, label: str = "") -> Schedule:
    """A :class:`Schedule` from per-rank steps (tuples of :class:`Action`), each stage placed on
    the rank that runs it, checked action by action in rank order so that the first broken
    action is the one named (see :func:`read_csv` for the checks), then :func:`check_order`.

    Raises
    ------
    InvalidPlanError
        As :func:`read_csv`.
    """
    where = f"{label}: " if label else ""
    p = len(steps)
    owner: dict = {}
    done: dict = {}
    position: dict = {}
    top_mb = -1
    for r, rank_steps in enumerate(steps):
        q = 0
        for step in rank_steps:
            for a in step:
                at = f"{where}rank {r}, step {q} ({a})"
                if owner.setdefault(a.stage, r) != r:
                    raise InvalidPlanError(f"{at}: stage {a.stage} also runs on rank {owner[a.stage]}; a stage "
                                           "lives on one rank")
                kinds = done.setdefault((a.stage, a.microbatch), [])
                if a.kind in kinds:
                    raise InvalidPlanError(f"{at}: {a} runs twice (first at rank {r}, step "
                                           f"{position[(a.kind, a.stage, a.microbatch)]})")
                need = {"F": (), "B": ("F",), "I": ("F",), "W": ("I",)}[a.kind]
                if any(k not in kinds for k in need):
                    first = {"F": "forward", "I": "input gradient"}[need[0]]
                    raise InvalidPlanError(f"{at}: {a} runs before its {first} "
                                           f"{Action(need[0], a.stage, a.microbatch)}")
                if (a.kind == "B" and "I" in kinds) or (a.kind == "I" and "B" in kinds):
                    raise InvalidPlanError(f"{at}: microbatch {a.microbatch} of stage {a.stage} runs both B and I")
                kinds.append(a.kind)
                position[(a.kind, a.stage, a.microbatch)] = q
                top_mb = max(top_mb, a.microbatch)
            q += 1
    if not owner:
        raise InvalidPlanError(f"{where}the order holds no action")
    S = max(owner) + 1
    m = top_mb + 1 if microbatches is None else microbatches
    absent = [s for s in range(S) if s not in owner]
    if absent:
        raise InvalidPlanError(f"{where}stage {absent[0]} runs no action on any rank (stages 0..{S - 1} expected)")
    counts = [sum(1 for s in owner if owner[s] == r) for r in range(p)]
    if S % p or len(set(counts)) > 1:
        raise InvalidPlanError(f"{where}the ranks hold {counts} stages; every rank must hold the same number "
                               f"(S = {S} stages over {p} ranks)")
    for s in range(S):  # missing actions, first stage and microbatch first
        for j in range(m):
            kinds = done.get((s, j), [])
            if "F" not in kinds:
                raise InvalidPlanError(f"{where}rank {owner[s]} never runs {Action('F', s, j)} (the forward of "
                                       f"microbatch {j} on stage {s})")
            if "I" in kinds and "W" not in kinds:
                raise InvalidPlanError(f"{where}rank {owner[s]} never runs {Action('W', s, j)} (runs {Action('I', s, j)})")
            if "B" not in kinds and "I" not in kinds:
                raise InvalidPlanError(f"{where}rank {owner[s]} never runs the backward of microbatch {j} on stage "
                                       f"{s} ({Action('B', s, j)}, or {Action('I', s, j)} and {Action('W', s, j)})")
    extra = sorted(j for (_s, j) in done if j >= m)
    if extra:
        raise InvalidPlanError(f"{where}microbatch {extra[0]} is out of 0..{m - 1} (m = {m})")
    placement = tuple(owner[s] for s in range(S))
    order = Schedule(name, p, S // p, m, placement, tuple(tuple(rs) for rs in steps),
                     source=label or "a torch compute-only CSV")
    check_order(order, label=label)
    return order


# ---- the deadlock check ----------------------------------------------------------------------
def _needs(a: Action, S: int, grad: dict) -> list:
    """The actions on other stages ``a`` waits for (data dependencies), besides its own stage's."""
    if a.kind == "F":
        return [Action("F", a.stage - 1, a.microbatch)] if a.stage > 0 else []
    if a.kind in ("B", "I"):
        own = [Action("F", a.stage, a.microbatch)]
        if a.stage < S - 1:
            own.append(grad.get((a.stage + 1, a.microbatch), Action("B", a.stage + 1, a.microbatch)))
        return own
    return [Action("I", a.stage, a.microbatch)]


def check_order(order: Schedule, label: str = "") -> None:
    """Raise unless every rank can run its order to the end (:func:`first_blocked`); then the
    graph check :func:`pipeopt.schedules.check_schedule` (transfers on the links and not) runs
    as a second opinion.

    Raises
    ------
    InvalidPlanError
        ``"... the order deadlocks at rank 0, step 1 (0B0): rank 0, step 1 (0B0) waits for
        1B0; which rank 1 runs at step 2, after its step 0 (1F1) that waits for 0F1; ..."``.
    """
    from ..schedules.dag import check_schedule

    blocked = first_blocked(order)
    if blocked is not None:
        raise InvalidPlanError((f"{label}: " if label else "") + blocked)
    check_schedule(order)


def first_blocked(order: Schedule) -> str | None:
    """Play the ranks with zero durations - each rank starts its next step when every action
    that step waits for (the previous stage's F, the next stage's B or I, its own F or I) has
    run, on any rank - until no rank can move. ``None`` if every rank finished; else the first
    blocked step (lowest rank) and the chain of waits that closes the cycle, as a sentence."""
    S = order.stages
    grad = {(a.stage, a.microbatch): a for r in range(order.ranks) for a in order.actions(r) if a.kind in ("B", "I")}
    at = {a: (r, q) for r in range(order.ranks) for q, step in enumerate(order.steps[r]) for a in step}
    pos = [0] * order.ranks
    ran: set = set()
    moved = True
    while moved:
        moved = False
        for r in range(order.ranks):
            while pos[r] < len(order.steps[r]):
                step = order.steps[r][pos[r]]
                inside = set(step)
                if any(d not in ran and d not in inside for a in step for d in _needs(a, S, grad)):
                    break
                ran.update(step)
                pos[r] += 1
                moved = True
    blocked = [r for r in range(order.ranks) if pos[r] < len(order.steps[r])]
    if not blocked:
        return None

    def waits(r: int) -> list:
        step = order.steps[r][pos[r]]
        return [d for a in step for d in _needs(a, S, grad) if d not in ran and d not in set(step)]

    r = blocked[0]
    first = order.steps[r][pos[r]]
    chain = [f"rank {r}, step {pos[r]} ({_cell(first)}) waits for {waits(r)[0]}"]
    seen = {r}
    d = waits(r)[0]
    while True:
        r2, q2 = at[d]
        stuck = order.steps[r2][pos[r2]]
        chain.append(f"which rank {r2} runs at step {q2}, after its step {pos[r2]} ({_cell(stuck)}) that waits for "
                     f"{waits(r2)[0]}")
        if r2 in seen or len(chain) > order.ranks + 1:
            break
        seen.add(r2)
        d = waits(r2)[0]
    return f"the order deadlocks at rank {r}, step {pos[r]} ({_cell(first)}): " + "; ".join(chain)


# ---- the order a plan runs ---------------------------------------------------------------------
def order_for(plan: Plan, schedule: str | None = None, microbatches: int | None = None,
              stages_per_rank: int | None = None) -> Schedule:
    """The action order ``plan`` runs: its own ``plan.schedule`` (checked: :func:`check_order`)
    or, if it has none, torch's schedule ``schedule`` built for the plan's ranks
    (:func:`pipeopt.schedules.make_schedule`; ranks: the plan's distinct device lists, else
    S / v) and ``microbatches``.

    Raises
    ------
    UnsupportedPlanError
        The plan has no order and no ``schedule`` is named (the message says how to give one),
        or the plan's stages do not divide over the ranks.
    InvalidPlanError
        The plan's order is broken or does not match its stages (first broken action named),
        or ``schedule`` is named beside a plan that carries another order.
    InvalidProblemError
        ``schedule`` names no torch schedule (:func:`pipeopt.schedules.make_schedule`).
    """
    from ..schedules import make_schedule
    from ..schedules.names import schedule_name
    from ..schedules.torch_orders import STAGES_PER_RANK
    from ..units import DEFAULT_MICROBATCHES

    S = plan.num_stages
    if plan.schedule is not None:
        order = Schedule.from_dict(plan.schedule)
        if order.stages != S:
            raise InvalidPlanError(f"the plan's order ({order.name}) runs {order.stages} stages on {order.ranks} ranks;"
                                   f" the plan has {S}")
        if microbatches is not None and microbatches != order.microbatches:
            raise InvalidPlanError(f"the plan's order ({order.name}) runs {order.microbatches} microbatches, not "
                                   f"{microbatches}")
        if schedule is not None and schedule_name(schedule) != order.name:
            raise InvalidPlanError(f"the plan carries its own order ({order.name}); drop --schedule {schedule}")
        if all(st.devices for st in plan.stages):
            devs = {}
            for s, st in enumerate(plan.stages):
                if devs.setdefault(order.placement[s], tuple(st.devices)) != tuple(st.devices):
                    raise InvalidPlanError(f"stage {s} lists devices {list(st.devices)}, but its rank "
                                           f"{order.placement[s]} (the order's placement) has {list(devs[order.placement[s]])}")
        check_order(order, label=f"the plan's order ({order.name})")
        return order
    if schedule is None:
        raise UnsupportedPlanError(
            "the plan carries no action order (no 'schedule' field): name the torch schedule its chunks run with "
            "--schedule NAME (GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, "
            "DualPipeV), or export a plan that carries its order (pipeopt solve --schedule ... --save-plan)"
        )
    key = schedule_name(schedule)
    v = STAGES_PER_RANK.get(key, stages_per_rank or 2)
    ranks = plan_ranks(plan) or (S // v if S % v == 0 else None)
    if ranks is None or S % ranks or S // ranks != v:
        raise UnsupportedPlanError(f"{key} runs {v} stage(s) on each rank; the plan's {S} stages "
                                   f"on {ranks or 'its'} ranks do not divide so")
    return make_schedule(key, ranks=ranks, microbatches=microbatches or DEFAULT_MICROBATCHES, stages_per_rank=v)


def export(plan: Plan, layout: ModelLayout, order: Schedule) -> dict:
    """``order`` as torch's compute-only CSV, with the plan's split.

    Parameters
    ----------
    plan
        The plan (S stages = ``order.stages``).
    layout
        The model's layout (:meth:`~pipeopt.export.layout.ModelLayout.of`).
    order
        The plan's action order (:func:`order_for`).

    Returns
    -------
    dict
        ``{"format": "torch-csv", "target": ..., "num_stages": S, "ranks": p, "stages_per_rank":
        v, "microbatches": m, "placement": [rank of each stage], "order": name, "csv": "...",
        "stages": [[layer, ...], ...], "split_spec": {...} or None, "data_parallel": ...,
        "notes": [...]}``; ``split_spec`` (torch's ``pipeline``) when the layer names are
        module FQNs that split by the shared rules, else ``None`` and a note saying why.
    """
    from . import torch_pipelining

    if order.stages != plan.num_stages:
        raise InvalidPlanError(f"{order.name} runs {order.stages} stages; the plan has {plan.num_stages}")
    notes = [f"compute-only CSV: load with _PipelineScheduleRuntime(stages, n_microbatches={order.microbatches}, ...)"
             "._load_csv(path), which adds the sends and receives itself",
             f"rank r builds the stages {{s : placement[s] == r}}: "
             + ", ".join(f"rank {r}: {list(order.stages_on(r))}" for r in range(order.ranks))]
    try:
        split = split_stages(plan, layout, RUNTIME)
        spec = torch_pipelining.export(plan, layout)["split_spec"]
        stages, dp = [list(s) for s in split.stages], split.data_parallel
        notes += split.notes()
    except UnsupportedPlanError as exc:
        spec, stages, dp = None, plan.layer_lists(), None
        notes.append(f"no split_spec: {exc}")
    return {
        "format": "torch-csv",
        "target": TARGET,
        "num_stages": order.stages,
        "data_parallel": dp,
        "ranks": order.ranks,
        "stages_per_rank": order.stages_per_rank,
        "microbatches": order.microbatches,
        "placement": list(order.placement),
        "order": order.name,
        "csv": to_csv(order),
        "stages": stages,
        "split_spec": spec,
        "notes": notes,
    }
