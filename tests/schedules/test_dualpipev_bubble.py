"""DualPipeV's bubble, derived from torch 2.13's order (docs/schedules.md, "DualPipeV's bubble"):
with per-chunk F, I, W (B = I + W), free transfers and m >= 2p, every rank idles

    b = (p - 1)(F + max(0, I - W)) + max((p - 1) F, (p - 1) I - F)

per iteration, whatever m: the longest of four dependency chains of the order. The executor's
iteration time of pipeopt's DualPipeV order (pipeopt/schedules/torch_orders.py, tested equal to
torch's own) is 2m(F + B) + b. DeepSeek's table, (PP/2 - 1)(F&B + B - 3W) with PP = 2p stages and
F&B = F + B (torch runs a fused step's two actions one after the other), agrees only where its
chain is the longest."""

from __future__ import annotations

import math
import random

import pytest

from pipeopt.cost.passes import PassTimes
from pipeopt.schedules import execute, make_schedule


def bubble(p: int, m: int, F: float, I: float, W: float) -> float:  # noqa: E741 - the field's letters
    """Each rank's idle time in the executor's run of DualPipeV (2p equal chunks, free transfers)."""
    S = 2 * p
    times = PassTimes(forward=(F,) * S, backward=(I + W,) * S, input_grad=(I,) * S, weight_grad=(W,) * S,
                      send_forward=(0.0,) * (S - 1), send_backward=(0.0,) * (S - 1), act_bytes=(0.0,) * S,
                      param_bytes=(0.0,) * S, memory_capacity=(math.inf,) * S)
    ex = execute(make_schedule("DualPipeV", p, m), times)
    idle = [ex.time - busy for busy in ex.busy()]
    assert all(busy == pytest.approx(2 * m * (F + I + W)) for busy in ex.busy())  # 2m actions of each kind
    assert max(idle) - min(idle) < 1e-9  # the same on every rank
    return idle[0]


def closed_form(p, F, I, W):  # noqa: E741
    return (p - 1) * (F + max(0.0, I - W)) + max((p - 1) * F, (p - 1) * I - F)


def deepseek_table(p, F, I, W):  # noqa: E741
    """(PP/2 - 1)(F&B + B - 3W), PP = 2p stages, F&B = F + B (torch's fused step), B = I + W."""
    B = I + W
    return (2 * p / 2 - 1) * ((F + B) + B - 3 * W)


def test_p8_ratio_2_1_1_is_14_not_10_5():
    for m in (16, 21, 32):  # m >= 2p; the bubble does not depend on m
        assert bubble(8, m, 1.0, 0.5, 0.5) == closed_form(8, 1.0, 0.5, 0.5) == 14.0
    assert deepseek_table(8, 1.0, 0.5, 0.5) == 10.5
    # the chain that makes 14: microbatch 0's forward to stage p - 1, the middle rank's 2p F and
    # 2(m - p) (F + B) without a gap, the last microbatch's F climbing p - 1 fused steps, then
    # B, the I's down to the middle rank and its I and p W's
    p, m, F, I, W = 8, 16, 1.0, 0.5, 0.5  # noqa: E741
    B = I + W
    chain = (p - 1) * F + 2 * p * F + 2 * (m - p) * (F + B) + (p - 1) * (F + B) + B + (p - 1) * I + I + p * W
    assert chain == 2 * m * (F + B) + 14.0


@pytest.mark.parametrize("F, I, W, p, expected", [
    (1.0, 2.0, 1.0, 8, 27.0),   # I > F: the first microbatch's backward delays the middle rank
    (1.0, 3.0, 5.0, 4, 11.0),   # F < I < W
    (3.0, 2.0, 1.0, 4, 21.0),   # I > W: the last microbatch's I's run down to stage 0
    (1.0, 1.0, 1.0, 8, 14.0),   # F = I = W: DeepSeek's table agrees
])
def test_other_ratios(F, I, W, p, expected):  # noqa: E741
    assert bubble(p, 2 * p + 3, F, I, W) == closed_form(p, F, I, W) == expected
    if F == I == W:
        assert deepseek_table(p, F, I, W) == expected
    else:
        assert deepseek_table(p, F, I, W) != expected


def test_closed_form_on_random_ratios():
    rnd = random.Random(5)
    for _ in range(40):
        F, I, W = (float(rnd.randint(1, 9)) for _ in range(3))  # noqa: E741
        p = rnd.randint(2, 8)
        assert bubble(p, rnd.randint(2 * p, 3 * p), F, I, W) == closed_form(p, F, I, W), (F, I, W, p)
