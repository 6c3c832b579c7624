"""Schedules as data: the seven torch orders (frozen here for p = 2, m = 4 as torch 2.13
prints them), every order valid over a grid of p, v, m, the memory rule each schedule is known
for, and the refusals. (``test_torch_schedule_orders.py`` compares with torch itself.)"""

from __future__ import annotations

import doctest
import re

import pytest

import pipeopt.schedules
from pipeopt.errors import InvalidPlanError, InvalidProblemError
from pipeopt.schedules import GENERATORS, Action, Schedule, check_schedule, make_schedule
from pipeopt.schedules.actions import looped_placement, v_placement
from pipeopt.schedules.torch_orders import _rounds, _warmup

ACTION = re.compile(r"(\d+)([FBIW])(\d+)")

# torch 2.13, get_schedule_ops(name, 2, 4) without idle slots and REDUCE_GRAD; "(a;b)" is an
# OVERLAP_F_B step; 1F1B as Schedule1F1B._step_microbatches runs it
TORCH_2_4 = {
    "GPipe": ["0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3", "1F0 1F1 1F2 1F3 1B0 1B1 1B2 1B3"],
    "1F1B": ["0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3", "1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3"],
    "Interleaved1F1B": ["0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
                        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3"],
    "LoopedBFS": ["0F0 0F1 0F2 0F3 2F0 2F1 2F2 2F3 2B3 2B2 2B1 2B0 0B3 0B2 0B1 0B0",
                  "1F0 1F1 1F2 1F3 3F0 3F1 3F2 3F3 3B3 3B2 3B1 3B0 1B3 1B2 1B1 1B0"],
    "InterleavedZeroBubble": [
        "0F0 0F1 2F0 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0 2F2 0I1 0W1 2F3 2I2 2W2 2I3 2W3 0I2 0W2 0I3 0W3",
        "1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 3W3 1I3 1W2 1W3"],
    "ZBVZeroBubble": [
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 0I3 0W3",
        "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 2W3 1W3"],
    "DualPipeV": ["0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0F3;3B1) (3F2;0B0) 3B2 (3F3;0B1) 3B3 0I2 0W2 0I3 0W3",
                  "1F0 2F0 1F1 2F1 1F2 2B0 (2F2;1B0) (1F3;2B1) (2F3;1B1) 2B2 1B2 2I3 1I3 2W3 1W3"],
}


def parse(text: str) -> tuple:
    """Steps from torch's notation ``"0F0 (0F3;3B1)"``."""
    return tuple(tuple(Action(k, int(s), int(j)) for s, k, j in ACTION.findall(cell)) for cell in text.split())


@pytest.mark.parametrize("name", list(GENERATORS))
def test_orders_are_torchs_for_two_ranks_and_four_microbatches(name):
    s = make_schedule(name, 2, 4)
    assert s.steps == tuple(parse(t) for t in TORCH_2_4[name])
    assert str(s).splitlines()[1:] == [f"  rank {r}: {t}" for r, t in enumerate(TORCH_2_4[name])]


def test_placements():
    assert looped_placement(4, 2) == (0, 1, 2, 3, 0, 1, 2, 3)
    assert v_placement(4, 2) == (0, 1, 2, 3, 3, 2, 1, 0)
    assert v_placement(2, 3) == (0, 1, 1, 0, 0, 1)
    assert make_schedule("ZBVZeroBubble", 3, 6).stages_on(0) == (0, 5)
    assert make_schedule("Interleaved1F1B", 3, 6, 3).stages_on(1) == (1, 4, 7)


def grid():
    for name in GENERATORS:
        vs = [1] if name in ("GPipe", "1F1B") else [2] if name in ("ZBVZeroBubble", "DualPipeV") else [1, 2, 3]
        for p in range(1, 5):
            for m in range(1, 10):
                for v in vs:
                    yield name, p, m, v


def peak_per_rank(s: Schedule) -> list:
    return [max(sum(c) for c in s.activation_profile(r)) for r in range(s.ranks)]


def test_every_order_is_a_valid_schedule_with_its_memory_rule():
    """Over p = 1..4, m = 1..9 and v: the order is valid (each microbatch's F before its B on
    its stage, I before W, no deadlock with or without overlap) and holds the microbatches
    in flight its schedule is known for (per rank, in chunk-microbatches)."""
    made = 0
    for name, p, m, v in grid():
        try:
            s = make_schedule(name, p, m, v)
        except InvalidProblemError:
            assert name == "DualPipeV" and m < 2 * p or name in ("Interleaved1F1B", "InterleavedZeroBubble",) and (
                m % max(1, m // p) != 0)
            continue
        made += 1
        check_schedule(s)
        assert (s.ranks, s.stages_per_rank, s.microbatches) == (p, v, m)
        assert s.splits_backward == (name in ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"))
        peaks = peak_per_rank(s)
        if name == "GPipe":
            assert s.in_flight() == (m,) * p
        elif name == "1F1B":  # PipeDream-Flush: p - s in flight (the cost model's rules.in_flight)
            assert s.in_flight() == tuple(min(p - r, m) for r in range(p))
        elif name == "LoopedBFS":
            assert peaks == [v * m] * p
        elif name == "Interleaved1F1B":  # the warm-up plus the first steady forward
            per = _rounds(name, p, m)
            assert peaks == [min(_warmup(r, v, per, p, m, 2) + 1, v * m) for r in range(p)]
        elif name == "InterleavedZeroBubble":  # ZB-H1: the same count on every rank
            per = _rounds(name, p, m)
            assert peaks == [min(_warmup(r, v, per, p, m, 1) + 1 + r, v * m) for r in range(p)]
            assert m < p or len(set(peaks)) == 1
        elif name == "ZBVZeroBubble":  # 2p half-size chunks: 1F1B's first-stage peak
            assert all(k <= 2 * p for k in peaks)
            assert m < 2 * p - 1 or peaks == [2 * p] * p
        else:
            assert peaks == [2 * p + 1] * p
    assert made > 250


def test_refusals():
    with pytest.raises(InvalidProblemError, match="unknown schedule 'ZB2'"):
        make_schedule("ZB2", 2, 4)
    assert make_schedule("interleaved1f1b", 2, 4).name == "Interleaved1F1B"
    with pytest.raises(InvalidProblemError, match="1F1B runs 1 stage"):
        make_schedule("1F1B", 2, 4, 2)
    with pytest.raises(InvalidProblemError, match="2p = 8"):
        make_schedule("DualPipeV", 4, 7)
    with pytest.raises(InvalidProblemError, match="multiple of the number of rounds"):
        make_schedule("InterleavedZeroBubble", 4, 9)
    with pytest.raises(InvalidProblemError, match="ranks must be an integer"):
        make_schedule("GPipe", 0, 4)


def one(kind, stage, mb):
    return (Action(kind, stage, mb),)


@pytest.mark.parametrize("steps, message", [
    (((one("F", 0, 0), one("B", 0, 0)), (one("F", 0, 0), one("B", 1, 0))), "a stage it does not hold"),
    (((one("B", 0, 0), one("F", 0, 0)), (one("F", 1, 0), one("B", 1, 0))), "before its F"),
    (((one("F", 0, 0), one("I", 0, 0)), (one("F", 1, 0), one("B", 1, 0))), r"runs \['F', 'I'\]"),
    (((one("F", 0, 0), one("W", 0, 0), one("I", 0, 0)), (one("F", 1, 0), one("B", 1, 0))), "before its I"),
    (((one("F", 0, 0), one("F", 0, 0), one("B", 0, 0)), (one("F", 1, 0), one("B", 1, 0))), "twice"),
    (((one("F", 0, 1), one("B", 0, 1)), (one("F", 1, 0), one("B", 1, 0))), "out of 0..0"),
    (((one("F", 0, 0), one("X", 0, 0)), (one("F", 1, 0), one("B", 1, 0))), "unknown action kind"),
    (((one("F", 0, 0), one("I", 0, 0), one("B", 0, 0)), (one("F", 1, 0), one("B", 1, 0))), "both B and I"),
    (((one("F", 0, 0), one("B", 0, 0)),), "orders for 1 ranks"),
])
def test_invalid_orders_are_refused(steps, message):
    with pytest.raises(InvalidPlanError, match=message):
        Schedule("bad", 2, 1, 1, (0, 1), steps)


def test_placement_must_balance_the_ranks():
    with pytest.raises(InvalidProblemError, match="must put 2 of the 4 stages"):
        Schedule("bad", 2, 2, 1, (0, 0, 0, 1), ((), ()))


def test_a_deadlock_is_found():
    """Rank 0 runs stage 2's forward before stage 0's, but stage 2 waits for stage 1 on rank 1,
    which waits for stage 0: a cycle of waits."""
    good = make_schedule("Interleaved1F1B", 2, 1, 2)
    rank0 = list(good.steps[0])
    i, j = rank0.index(one("F", 0, 0)), rank0.index(one("F", 2, 0))
    rank0[i], rank0[j] = rank0[j], rank0[i]
    bad = Schedule("swapped", 2, 2, 1, good.placement, (tuple(rank0), good.steps[1]))
    with pytest.raises(InvalidPlanError, match="deadlocks.*2F0"):
        check_schedule(bad)


def test_activation_profile_keeps_the_peaks_no_other_dominates():
    s = make_schedule("ZBVZeroBubble", 2, 4)
    prof = s.activation_profile(0)
    assert set(prof) == {(4, 0), (3, 1)}  # rank 0 holds stages 0 and 3; (3, 0), (2, 0) are dominated
    assert all(not all(a >= b for a, b in zip(x, y, strict=True)) for x in prof for y in prof if x != y)
    assert max(sum(c) for c in prof) == 4


def test_package_docstring_example():
    assert doctest.testmod(pipeopt.schedules, report=False).failed == 0
