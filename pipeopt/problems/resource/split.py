"""The forward/backward resource split of one worker (Duan & Wu's allocation step).

A worker with pooled resources ``R_k`` runs a stage whose forward pass takes ``F_k`` seconds
on one unit of kind k and whose backward pass takes ``B_k``. Giving the share ``beta_k`` of
kind k to the forward pass (the rest to the backward pass, concurrently on another
microbatch) yields the stage time (DESIGN.md, "Split execution"; :func:`pipeopt.cost.stage_compute`)

    tau = 1 / min(sum_k beta_k R_k / F_k, sum_k (1 - beta_k) R_k / B_k).

The best split is the linear program

    maximise r  s.t.  sum_k beta_k a_k >= r,  sum_k (1 - beta_k) b_k >= r,  0 <= beta_k <= 1,

with ``a_k = R_k / F_k`` and ``b_k = R_k / B_k``. It has two constraints, so its optimum is a
fractional knapsack: give whole kinds to the forward pass in decreasing order of
``a_k / b_k = B_k / F_k`` until the forward rate would overtake the backward rate, and split
the next kind so that both rates are equal. :func:`best_split` computes exactly that in
O(K log K); the tests check it against a general LP solver and a fine grid.

References
----------
Duan, Y. and Wu, J., *Optimizing Resource Allocation in Pipeline Parallelism for Distributed
DNN Training*, ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029 (split execution, the theorem
beta = c / (c + 1) when F_k / B_k = c for every kind).
"""

from __future__ import annotations

import math

from ...cost.rules import stage_compute

EPS_SHARE = 1e-9
"""Share given to a kind whose load in one pass is zero (its rate there is infinite for any
positive share): the supremum of the LP is not attained, ``EPS_SHARE`` gets within a factor
``1 + EPS_SHARE`` of it."""


def _usable(res: dict, fwd: dict, bwd: dict) -> list:
    return [
        k
        for k, r in res.items()
        if r > 0 and math.isfinite(fwd.get(k, math.inf)) and math.isfinite(bwd.get(k, math.inf))
    ]


def best_split(res: dict, fwd: dict, bwd: dict) -> tuple[dict, float]:
    """The optimal forward share per resource kind of one worker, and its stage time.

    Parameters
    ----------
    res
        ``dict[kind, units]``: the worker's pooled resources R_k.
    fwd, bwd
        ``dict[kind, seconds]``: F_k and B_k, the stage's forward and backward time on one
        unit of kind k (``inf`` or missing: the stage cannot run on k).

    Returns
    -------
    (beta, tau)
        ``beta``: ``dict[kind, float]`` in [0, 1] for every kind in ``res``; ``tau``: the
        stage time in seconds (``inf`` if no kind of the worker can run the stage, ``0.0``
        if the stage has no work).
    """
    beta = {k: 0.0 for k in res}
    usable = _usable(res, fwd, bwd)
    if not usable:
        return beta, math.inf
    a = {k: (res[k] / fwd[k] if fwd[k] > 0 else math.inf) for k in usable}
    b = {k: (res[k] / bwd[k] if bwd[k] > 0 else math.inf) for k in usable}
    a_inf = [k for k in usable if math.isinf(a[k])]
    b_inf = [k for k in usable if math.isinf(b[k])]
    if a_inf and b_inf:  # both passes can be made free
        both = [k for k in a_inf if k in b_inf]
        if both:
            beta[both[0]] = 0.5
        else:
            for k in a_inf:
                beta[k] = 1.0
        return beta, 0.0
    if a_inf:  # forward is free on a tiny share; everything else to backward
        beta[a_inf[0]] = EPS_SHARE
        rate = sum((1.0 - beta[k]) * b[k] for k in usable)
        return beta, 1.0 / rate
    if b_inf:
        for k in usable:
            beta[k] = 1.0
        beta[b_inf[0]] = 1.0 - EPS_SHARE
        rate = sum(beta[k] * a[k] for k in usable)
        return beta, 1.0 / rate
    order = sorted(usable, key=lambda k: (-a[k] / b[k], k))
    x, y = 0.0, sum(b.values())  # forward and backward rates, all kinds on backward
    for k in order:
        if x + a[k] <= y - b[k]:
            beta[k] = 1.0
            x, y = x + a[k], y - b[k]
            continue
        theta = (y - x) / (a[k] + b[k])
        beta[k] = min(1.0, max(0.0, theta))
        x, y = x + beta[k] * a[k], y - beta[k] * b[k]
        break
    rate = min(x, y)
    return beta, (1.0 / rate if rate > 0 else math.inf)


def sequential_time(res: dict, fwd: dict, bwd: dict) -> float:
    """Stage time without the split, ``1 / sum_k R_k / (F_k + B_k)`` seconds: the rule
    :func:`pipeopt.cost.stage_compute` with ``beta=None``.

    Parameters and units as in :func:`best_split`.
    """
    return stage_compute(res, fwd, bwd, None)[2]


def theorem_split(res: dict, fwd: dict, bwd: dict) -> dict:
    """Duan & Wu's closed-form split ``beta_k = c / (c + 1)`` for every kind.

    ``c`` is the worker's overall forward/backward ratio: the time of the forward pass on
    all its resources divided by that of the backward pass. When ``F_k / B_k = c`` for every
    kind this split is optimal (the paper's theorem); otherwise it is a heuristic.

    Parameters
    ----------
    res, fwd, bwd
        As in :func:`best_split`.

    Returns
    -------
    dict
        ``dict[kind, float]``, the same share for every kind of ``res``.
    """
    usable = _usable(res, fwd, bwd)
    rf = sum(res[k] / fwd[k] if fwd[k] > 0 else math.inf for k in usable)
    rb = sum(res[k] / bwd[k] if bwd[k] > 0 else math.inf for k in usable)
    if not usable or (math.isinf(rf) and math.isinf(rb)):
        share = 0.5
    elif math.isinf(rf):  # forward free: c = 0
        share = EPS_SHARE
    elif math.isinf(rb):
        share = 1.0 - EPS_SHARE
    else:
        c = rb / rf  # = T_f / T_b
        share = c / (c + 1.0)
    return {k: share for k in res}
