"""The seven schedules of ``torch.distributed.pipelining`` (torch 2.13), as data.

Each generator gives the order torch runs, rewritten from
``torch/distributed/pipelining/schedules.py`` (the function named in its docstring); torch's
idle slots (``None``) and ``REDUCE_GRAD`` bookkeeping are left out, and its send/receive
actions follow from the data (:mod:`.dag`). ``tests/schedules/test_torch_orders.py`` compares
every order with torch's own (``_schedule_visualizer.get_schedule_ops``) for p in {2, 4},
m in {4, 8} when torch is installed.

========================  ====  ===========  ===================================================
name                      v     placement    order
========================  ====  ===========  ===================================================
GPipe                     1     -            all F, then all B
1F1B                      1     -            p - r F, then B and F in turn, then the rest of B
Interleaved1F1B           >= 1  looped       depth first over local stages (Narayanan et al. 2021)
LoopedBFS                 >= 1  looped       breadth first: all F stage by stage, B in reverse
InterleavedZeroBubble     >= 1  looped       ZB1P: interleaved, I instead of B, W delayed r steps
ZBVZeroBubble             2     V            ZB-V (Qi et al. 2024, section 6)
DualPipeV                 2     V            DualPipe cut in half (DeepSeek-V3), fused F&B steps
========================  ====  ===========  ===================================================

One finding: torch 2.13's ``Schedule1F1B._get_pipeline_order`` (the order its visualizer
shows) numbers the last rank's forwards 1..m instead of 0..m-1; the order torch *runs*,
``Schedule1F1B._step_microbatches``, is the one here (the test checks both facts).
"""

from __future__ import annotations

from collections import defaultdict

from ..cost.schedule import lane_orders
from ..errors import InvalidProblemError
from ..units import MAX_DEVICES, MAX_MICROBATCHES
from .actions import Action, Schedule, looped_placement, positive_int, v_placement
from .names import schedule_name

TORCH_FILE = "torch/distributed/pipelining/schedules.py (torch 2.13)"


def _single(name: str, ranks: int, microbatches: int, kind: str, source: str) -> Schedule:
    p, m = positive_int(ranks, "ranks"), positive_int(microbatches, "microbatches")
    steps = []
    for r in range(p):
        (ops,) = lane_orders(kind, list(range(m)), p - r, False).values()
        steps.append(tuple((Action(op, r, j),) for op, j in ops))
    return Schedule(name, p, 1, m, tuple(range(p)), tuple(steps), source=f"{TORCH_FILE}: {source}")


def gpipe(ranks: int, microbatches: int) -> Schedule:
    """GPipe (fill-drain; Huang et al., NeurIPS 2019): each rank runs the forwards of every
    microbatch, then their backwards, in microbatch order (torch ``ScheduleGPipe``, the same
    order as :func:`pipeopt.cost.schedule.lane_orders` ``"gpipe"``). Memory: m microbatches in
    flight on every stage."""
    return _single("GPipe", ranks, microbatches, "gpipe", "ScheduleGPipe._step_microbatches")


def one_f_one_b(ranks: int, microbatches: int) -> Schedule:
    """1F1B (PipeDream-Flush; Narayanan et al., ICML 2021): rank r runs ``min(m, p - r)``
    forwards, then one backward and one forward in turn, then the remaining backwards (torch
    ``Schedule1F1B._step_microbatches``; :func:`pipeopt.cost.schedule.lane_orders` ``"1f1b"``
    with window ``p - r``). Memory: ``min(m, p - r)`` in flight
    (:func:`pipeopt.cost.rules.in_flight`). torch refuses m < p; pipeopt runs it as its cost
    model does."""
    return _single("1F1B", ranks, microbatches, "1f1b", "Schedule1F1B._step_microbatches")


def _rounds(name: str, ranks: int, microbatches: int) -> int:
    """Microbatches per round of the interleaved schedules (torch: ``number_of_rounds = max(1,
    m // p)``, ``microbatches_per_round = m // number_of_rounds``, m a multiple of the rounds)."""
    rounds = max(1, microbatches // ranks)
    if microbatches % rounds:
        raise InvalidProblemError(
            f"{name} needs the microbatches ({microbatches}) to be a multiple of the number of rounds"
            f" max(1, m // p) = {rounds} (as torch does)"
        )
    return microbatches // rounds


def _warmup(rank: int, v: int, per_round: int, ranks: int, microbatches: int, factor: int) -> int:
    """Forwards before the first backward on a rank of an interleaved schedule (torch
    ``_get_warmup_ops``): ``(v - 1) * per_round + factor * (p - 1 - rank)``, at most ``v m``."""
    return min((v - 1) * per_round + factor * (ranks - 1 - rank), microbatches * v)


def _interleaved(name: str, ranks: int, microbatches: int, stages_per_rank: int, zero_bubble: bool,
                 source: str) -> Schedule:
    """The interleaved family, torch ``_get_1f1b_rank_ops``: on rank r, op q of ``v m +
    warmup`` runs a forward on local stage ``(q // per_round) mod v`` while q < ``v m``, and
    from q = ``warmup`` on a backward after it, on local stage ``v - 1 - ((q - warmup) //
    per_round) mod v`` (the local stages in reverse). With ``zero_bubble`` the backward is I
    and, from the r-th backward on, each I is followed by the W of the oldest backward without
    one (ZB1P's delay of r); the rest of the Ws close the order."""
    p, m = positive_int(ranks, "ranks"), positive_int(microbatches, "microbatches")
    v = positive_int(stages_per_rank, "stages_per_rank")
    per_round = _rounds(name, p, m)
    steps = []
    for r in range(p):
        warm = _warmup(r, v, per_round, p, m, 1 if zero_bubble else 2)
        total = v * m

        def fwd_stage(q: int, r: int = r) -> int:
            return ((q // per_round) % v) * p + r

        def bwd_stage(q: int, r: int = r, warm: int = warm) -> int:
            return (v - 1 - ((q - warm) // per_round) % v) * p + r

        nxt = {k: defaultdict(int) for k in "FBW"}
        ops: list = []
        backs: list = []
        w_done = 0

        def add(kind: str, stage: int, counter: str) -> None:
            ops.append(Action(kind, stage, nxt[counter][stage]))
            nxt[counter][stage] += 1

        for q in range(total + warm):  # warm-up (F), steady (F then B), cool-down (B)
            if q < total:
                add("F", fwd_stage(q), "F")
            if q >= warm:
                add("I" if zero_bubble else "B", bwd_stage(q), "B")
                backs.append(q)
                if zero_bubble and q - warm >= r:
                    add("W", bwd_stage(backs[w_done]), "W")
                    w_done += 1
        while zero_bubble and w_done < len(backs):
            add("W", bwd_stage(backs[w_done]), "W")
            w_done += 1
        steps.append(tuple((a,) for a in ops))
    return Schedule(name, p, v, m, looped_placement(p, v), tuple(steps), source=f"{TORCH_FILE}: {source}")


def interleaved_1f1b(ranks: int, microbatches: int, stages_per_rank: int = 2) -> Schedule:
    """Interleaved 1F1B (Narayanan et al., SC 2021; torch ``ScheduleInterleaved1F1B``,
    ``_calculate_single_rank_operations`` with ``_get_warmup_ops(multiply_factor=2)`` and
    ``_get_1f1b_rank_ops``): v stages per rank, looped placement, depth first. Memory: rank r
    holds at most ``warmup + 1`` chunk-microbatches, ``warmup = min((v - 1) m_r + 2 (p - 1 -
    r), v m)`` with ``m_r`` the microbatches per round."""
    return _interleaved("Interleaved1F1B", ranks, microbatches, stages_per_rank, False,
                        "ScheduleInterleaved1F1B._calculate_single_rank_operations, _get_1f1b_rank_ops")


def interleaved_zero_bubble(ranks: int, microbatches: int, stages_per_rank: int = 2) -> Schedule:
    """Interleaved zero bubble, ZB1P (Qi et al., ICLR 2024; torch
    ``ScheduleInterleavedZeroBubble``: ``_get_warmup_ops(multiply_factor=1)``,
    ``_get_1f1b_rank_ops(enable_zero_bubble=True, num_1f1b_microbatches=rank)``): as
    interleaved 1F1B with one hop per rank in the warm-up, I instead of B, and rank r's Ws r
    backwards behind its Is. (torch's ``_add_bubbles_to_actions`` only inserts idle slots.)"""
    return _interleaved("InterleavedZeroBubble", ranks, microbatches, stages_per_rank, True,
                        "ScheduleInterleavedZeroBubble._calculate_single_rank_operations, _get_1f1b_rank_ops")


def looped_bfs(ranks: int, microbatches: int, stages_per_rank: int = 2) -> Schedule:
    """Breadth-first pipeline parallelism (Lamy-Poirier, 2022; torch ``ScheduleLoopedBFS.
    _calculate_single_rank_operations``): each rank runs the forwards of all microbatches on
    its first local stage, then on its next one, ...; then the backwards of its last local
    stage first, microbatches in reverse order. Memory: every microbatch on every local stage
    (``v m``) in flight."""
    p, m = positive_int(ranks, "ranks"), positive_int(microbatches, "microbatches")
    v = positive_int(stages_per_rank, "stages_per_rank")
    steps = []
    for r in range(p):
        mine = [k * p + r for k in range(v)]
        ops = [Action("F", s, j) for s in mine for j in range(m)]
        ops += [Action("B", s, j) for s in reversed(mine) for j in reversed(range(m))]
        steps.append(tuple((a,) for a in ops))
    return Schedule("LoopedBFS", p, v, m, looped_placement(p, v), tuple(steps),
                    source=f"{TORCH_FILE}: ScheduleLoopedBFS._calculate_single_rank_operations")


def zbv_zero_bubble(ranks: int, microbatches: int) -> Schedule:
    """ZB-V (Qi et al., ICLR 2024, section 6; torch ``ScheduleZBVZeroBubble.
    _calculate_single_rank_operations``): two stages per rank in a V (rank r holds stages r and
    2p - 1 - r). Rank r: ``2 (p - r) - 1`` forwards of its first stage; r pairs (second stage,
    first stage); p - r triples F, I, W of the second stage; then F, I, W of the first stage
    and of the second in turn until every forward is issued; then the remaining Is and Ws.
    torch builds it for ``max(m, 2p - 1)`` microbatches and drops the actions of microbatches
    >= m; so does this."""
    p, m = positive_int(ranks, "ranks"), positive_int(microbatches, "microbatches")
    n = max(2 * p - 1, m)
    steps = []
    for r in range(p):
        first, second = r, 2 * p - 1 - r
        cnt = {(s, k): 0 for s in (first, second) for k in "FIW"}
        ops: list = []

        def add(kind: str, stage: int, index: int | None = None) -> None:
            j = cnt[(stage, kind)] if index is None else index
            ops.append(Action(kind, stage, j))
            cnt[(stage, kind)] += 1

        for _ in range(2 * (p - r) - 1):
            add("F", first)
        for _ in range(r):
            add("F", second)
            add("F", first)
        for _ in range(p - r):
            add("F", second)
            add("I", second)
            add("W", second)
        while cnt[(second, "F")] < cnt[(first, "F")] or cnt[(first, "F")] < n:
            if cnt[(first, "F")] < n:
                add("F", first)
            add("I", first)
            add("W", first)
            add("F", second)
            add("I", second)
            add("W", second)
        for _ in range(r):
            add("I", first)
            add("I", second)
        for _ in range(p - r):
            add("I", first)
            add("W", first)
        while cnt[(second, "W")] < cnt[(second, "I")]:
            add("W", second)
        while cnt[(first, "W")] < cnt[(first, "I")]:
            add("W", first)
        steps.append(tuple((a,) for a in ops if a.microbatch < m))
    return Schedule("ZBVZeroBubble", p, 2, m, v_placement(p, 2), tuple(steps),
                    source=f"{TORCH_FILE}: ScheduleZBVZeroBubble._calculate_single_rank_operations")


def dualpipe_v(ranks: int, microbatches: int) -> Schedule:
    """DualPipeV (DeepSeek-V3 technical report's DualPipe, cut in half; torch
    ``ScheduleDualPipeV._calculate_single_rank_operations``, after deepseek-ai/DualPipe): two
    stages per rank in a V. Its main phase fuses a forward of one local stage with the
    backward of the other into one step (torch ``OVERLAP_F_B``; DualPipe overlaps their
    communication with computation, which pipeopt's cost model does not describe: the two run
    back to back, as torch's default runtime runs them). The first half of the backwards are
    whole B, the second half split into I and W, Ws drained from a queue. Needs m >= 2p (as
    torch). Parameters: one copy (the V placement is what spares DualPipe's second copy)."""
    p, m = positive_int(ranks, "ranks"), positive_int(microbatches, "microbatches")
    if m < 2 * p:
        raise InvalidProblemError(
            f"DualPipeV needs at least as many microbatches as stages (2p = {2 * p}), got {m}"
        )
    steps = []
    for r in range(p):
        first, second = r, 2 * p - 1 - r
        nxt = defaultdict(int)  # (stage, "F" | "I" | "W") -> next microbatch
        queue: list = []  # (stage, microbatch) of Is whose W is pending
        out: list = []

        def act(stage: int, kind: str) -> Action:
            counter = "I" if kind == "B" else kind
            a = Action(kind, stage, nxt[(stage, counter)])
            if kind == "B":  # a whole backward advances both the I and the W counters
                nxt[(stage, "W")] += 1
            elif kind == "I":
                queue.append((stage, a.microbatch))
            nxt[(stage, counter)] += 1
            return a

        def single(stage: int, kind: str) -> None:
            out.append((act(stage, kind),))

        def fused(f_stage: int, b_stage: int) -> None:
            out.append((act(f_stage, "F"), act(b_stage, "B")))

        def weight() -> None:
            if queue:
                stage, j = queue.pop(0)
                out.append((Action("W", stage, j),))
                nxt[(stage, "W")] += 1

        for _ in range(2 * (p - r - 1)):
            single(first, "F")
        for _ in range(r + 1):
            single(first, "F")
            single(second, "F")
        for _ in range(p - r - 1):
            single(second, "I")
            weight()
            single(second, "F")
        for i in range(m - 2 * p + r + 1):
            if i == 0 and r == p - 1:  # not fused, to shrink the bubble (torch's note)
                single(first, "F")
                single(second, "B")
            else:
                fused(first, second)
            fused(second, first)
        for _ in range(p - r - 1):
            single(second, "B")
            fused(second, first)
        split = False
        half = (r + 1) // 2
        for i in range(r + 1):
            if i == half and r % 2 == 1:
                split = True
            single(second, "I" if split else "B")
            if i == half and r % 2 == 0:
                split = True
            single(first, "I" if split else "B")
        for _ in range(p - r - 1):
            weight()
            single(first, "I" if split else "B")
        for _ in range(r + 1):
            weight()
        steps.append(tuple(out))
    return Schedule("DualPipeV", p, 2, m, v_placement(p, 2), tuple(steps),
                    source=f"{TORCH_FILE}: ScheduleDualPipeV._calculate_single_rank_operations")


GENERATORS = {
    "GPipe": gpipe,
    "1F1B": one_f_one_b,
    "Interleaved1F1B": interleaved_1f1b,
    "LoopedBFS": looped_bfs,
    "InterleavedZeroBubble": interleaved_zero_bubble,
    "ZBVZeroBubble": zbv_zero_bubble,
    "DualPipeV": dualpipe_v,
}
"""torch's schedule names -> generators (torch ``get_schedule_class``'s names)."""

STAGES_PER_RANK = {"GPipe": 1, "1F1B": 1, "ZBVZeroBubble": 2, "DualPipeV": 2}
"""Schedules whose stages per rank are fixed; the others take any v >= 1 (default 2)."""


def make_schedule(name: str, ranks: int, microbatches: int, stages_per_rank: int | None = None) -> Schedule:
    """The schedule ``name`` (any spelling :func:`pipeopt.schedules.names.schedule_name`
    accepts: torch's names and class names in any case, or a short alias) for p ranks, m
    microbatches and v stages per rank (default: 1 for GPipe and 1F1B, else 2).

    Raises
    ------
    InvalidProblemError
        Unknown name (the known ones listed), a v the schedule does not take, p, m, v it
        refuses, m above :data:`pipeopt.units.MAX_MICROBATCHES`, p above
        :data:`pipeopt.units.MAX_DEVICES`, or more than :data:`MAX_OPERATIONS` operations
        (checked before any work).
    """
    key = schedule_name(name)
    p, m = positive_int(ranks, "ranks"), positive_int(microbatches, "microbatches")
    if m > MAX_MICROBATCHES:
        raise InvalidProblemError(f"{key}: microbatches must be at most {MAX_MICROBATCHES}, got {m}")
    if p > MAX_DEVICES:
        raise InvalidProblemError(f"{key}: ranks must be at most {MAX_DEVICES}, got {p}")
    fixed = STAGES_PER_RANK.get(key)
    if fixed is not None and stages_per_rank not in (None, fixed):
        raise InvalidProblemError(f"{key} runs {fixed} stage(s) per rank, not {stages_per_rank!r}")
    v = fixed if fixed is not None else 2 if stages_per_rank is None else positive_int(stages_per_rank,
                                                                                       "stages_per_rank")
    ops = operation_count(p, v, m)
    if ops > MAX_OPERATIONS:
        raise InvalidProblemError(
            f"{key} on {p} ranks x {v} stages over {m} microbatches has about {ops:,} operations, more than"
            f" {MAX_OPERATIONS:,} (pipeopt.schedules.MAX_OPERATIONS); ask for fewer microbatches or ranks"
        )
    if fixed is not None:
        return GENERATORS[key](p, m)
    return GENERATORS[key](p, m, v)


MAX_OPERATIONS = 1_000_000
"""Most operations (actions and transfers, :func:`operation_count`) of a schedule that
:func:`make_schedule` builds: its graph, execution and the schedule problem's models are
linear in them (one Python object per operation), so a larger request is refused before any
work instead of running for minutes."""


def operation_count(ranks: int, stages_per_rank: int, microbatches: int) -> int:
    """An upper bound on the operations of one iteration of ``S = p v`` chunks over m
    microbatches: at most three actions (F, I, W) per chunk and microbatch, and two transfers
    (activations and gradients) per boundary and microbatch, ``3 S m + 2 (S - 1) m``."""
    S = ranks * stages_per_rank
    return 3 * S * microbatches + 2 * (S - 1) * microbatches
