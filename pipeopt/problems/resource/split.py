"""The forward/backward resource split of one worker (Duan & Wu's allocation step).

A worker with pooled resources ``R_k`` runs a stage whose forward pass takes ``F_k`` seconds
on one unit of kind k and whose backward pass takes ``B_k``. Giving the share ``beta_k`` of
kind k to the forward pass (the rest to the backward pass, concurrently on another
microbatch) yields the forward and backward times (docs/cost-model.md, "A stage's compute time";
:func:`pipeopt.cost.stage_compute`)

    f = 1 / sum_k beta_k R_k / F_k,    b = 1 / sum_k (1 - beta_k) R_k / B_k.

A kind that runs only one of the two passes of the stage (the other load is ``inf``) serves
that pass alone; a kind that runs neither is idle.

Two questions are asked of one worker:

* :func:`best_split` - the least stage time ``tau = max(f, b)``: the linear program
  ``max r s.t. sum_k beta_k a_k >= r, sum_k (1 - beta_k) b_k >= r, 0 <= beta_k <= 1`` with
  ``a_k = R_k / F_k`` and ``b_k = R_k / B_k``. It has two constraints, so its optimum is a
  fractional knapsack: give whole kinds to the forward pass in decreasing order of
  ``a_k / b_k = B_k / F_k`` until the forward rate would overtake the backward rate, and
  split the next kind so that both rates are equal (O(K log K)).
* :func:`least_busy` - the least ``f + b`` with ``f <= T`` and ``b <= T``: what the 1F1B
  window rows ask of a split-execution stage at a trial period T (the objective's steady
  period, :func:`pipeopt.cost.rules.steady_period`). Its optimum lies on the same knapsack
  frontier, in closed form on each of its segments (the derivation is in its docstring).

The tests check both against a general LP solver and fine grids.

References
----------
Duan, Y. and Wu, J., *Optimizing Resource Allocation in Pipeline Parallelism for Distributed
DNN Training*, ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029 (split execution, the theorem
beta = c / (c + 1) when F_k / B_k = c for every kind).
"""

from __future__ import annotations

import math

import numpy as np

from ...jit import njit
from ...cost.rules import stage_compute
from ...cost.tolerance import FLOAT_NOISE

EPS_SHARE = 1e-9
"""Share given to a kind whose load in one pass is zero (its rate there is infinite for any
positive share): the supremum of the LP is not attained, ``EPS_SHARE`` gets within a factor
``1 + EPS_SHARE`` of it."""


THETA_SLACK = FLOAT_NOISE
""":func:`least_busy` accepts a share interval that float rounding made empty by up to this much
(at T equal to the least stage time the caps meet at one share: then both passes are within
about 1e-12 of T)."""


def _usable(res: dict, fwd: dict, bwd: dict) -> list:
    """Kinds of the worker that can run both passes of the stage."""
    return [
        k
        for k, r in res.items()
        if r > 0 and math.isfinite(fwd.get(k, math.inf)) and math.isfinite(bwd.get(k, math.inf))
    ]


def _sides(res: dict, fwd: dict, bwd: dict) -> tuple[list, list, list]:
    """Kinds of the worker that run both passes, the forward pass only, the backward pass only."""
    both, fwd_only, bwd_only = [], [], []
    for k, r in res.items():
        if r <= 0:
            continue
        f, b = math.isfinite(fwd.get(k, math.inf)), math.isfinite(bwd.get(k, math.inf))
        (both if f and b else fwd_only if f else bwd_only if b else []).append(k)
    return both, fwd_only, bwd_only


def _rate(r: float, t: float) -> float:
    return math.inf if t == 0 else r / t


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
        ``beta``: ``dict[kind, float]`` in [0, 1] for every kind in ``res`` (1 for a kind that
        runs the forward pass only, 0 for one that runs the backward pass only or nothing);
        ``tau``: the stage time in seconds (``inf`` if no share runs both passes, ``0.0`` if
        the stage has no work).
    """
    beta = {k: 0.0 for k in res}
    both, fwd_only, bwd_only = _sides(res, fwd, bwd)
    for k in fwd_only:
        beta[k] = 1.0
    x0 = sum(_rate(res[k], fwd[k]) for k in fwd_only)  # forward rate of the kinds that only run it
    y0 = sum(_rate(res[k], bwd[k]) for k in bwd_only)
    a = {k: _rate(res[k], fwd[k]) for k in both}
    b = {k: _rate(res[k], bwd[k]) for k in both}
    a_inf = [k for k in both if math.isinf(a[k])]
    b_inf = [k for k in both if math.isinf(b[k])]
    if not both or math.isinf(x0) or math.isinf(y0) or a_inf or b_inf:
        if math.isinf(y0) and not math.isinf(x0):  # backward free: every two-pass kind to forward
            for k in both:
                beta[k] = 1.0
        elif not math.isinf(x0):
            both_free = [k for k in a_inf if k in b_inf]
            if both_free:
                beta[both_free[0]] = 0.5
            elif a_inf and (b_inf or math.isinf(y0)):
                for k in a_inf:
                    beta[k] = 1.0
            elif a_inf:  # forward free on a tiny share; everything else to backward
                beta[a_inf[0]] = EPS_SHARE
            elif b_inf:
                for k in both:
                    beta[k] = 1.0
                beta[b_inf[0]] = 1.0 - EPS_SHARE
        # (forward free through a forward-only kind: every two-pass kind stays on backward)
        return beta, stage_compute(res, fwd, bwd, beta)[2]
    order = sorted(both, key=lambda k: (-a[k] / b[k], k))
    x, y = x0, y0 + sum(b.values())  # forward and backward rates, two-pass kinds on backward
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


# ---- the least busy time at a period T (the window rows) ------------------------------------

def least_busy_many(res: dict, fwd: dict, bwd: dict, limit: float,
                    kinds=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`least_busy` for P stage loads on one worker at once (the chain DP's inner loop;
    compiled with numba, one load at a time).

    Parameters
    ----------
    res
        ``dict[kind, units]``: the worker's pooled resources.
    fwd, bwd
        ``dict[kind, ndarray (P,)]``: forward and backward loads (``inf`` or missing: the kind
        cannot run that pass of the stage).
    limit
        T, seconds (``inf``: no cap on either pass).
    kinds
        The kinds to read, in this order (default: those of ``res``); kinds without units
        are left out.

    Returns
    -------
    (busy, segment, theta)
        ``ndarray (P,)`` each: the least ``f + b`` (``inf`` where no share keeps both passes
        within T), the position, in the frontier order (a stable sort of ``-R/F : R/B`` over
        ``kinds``, kinds that do not run both passes last), of the kind split fractionally,
        and its share. Loads with a free pass (a zero load, :func:`least_busy` handles them
        with :func:`best_split`) and loads no kind runs in both passes (no choice) give
        ``nan``, ``-1``, ``nan``.
    """
    kinds = [k for k in (res if kinds is None else kinds) if res.get(k, 0.0) > 0]
    first = next(iter(fwd.values()), None)
    P = 0 if first is None else len(first)
    if not kinds or P == 0:
        return np.full(P, np.inf), np.full(P, -1), np.full(P, np.nan)
    R = np.array([res[k] for k in kinds], dtype=float)
    F = np.stack([np.asarray(fwd.get(k, np.full(P, np.inf)), dtype=float) for k in kinds], axis=1)
    B = np.stack([np.asarray(bwd.get(k, np.full(P, np.inf)), dtype=float) for k in kinds], axis=1)
    inv = 0.0 if math.isinf(limit) else (math.inf if limit <= 0 else 1.0 / limit)
    busy, seg, theta = np.empty(P), np.empty(P, np.int64), np.empty(P)
    _least_busy_rows(R, F, B, inv, THETA_SLACK, busy, seg, theta)
    return busy, seg, theta


@njit(cache=True, nogil=True, error_model="numpy")  # x / 0 is inf, as in numpy
def _least_busy_rows(R, F, B, inv, slack, busy, seg, theta):  # pragma: no cover - compiled
    """:func:`least_busy_many`'s loop, load by load (``R (K,)``, ``F, B (P, K)``, ``inv = 1 / T``;
    writes ``busy, seg, theta (P,)``): the frontier segments of :func:`least_busy`'s derivation."""
    P, K = F.shape
    al = np.empty(K)
    be = np.empty(K)
    key = np.empty(K)
    order = np.empty(K, np.int64)
    for p in range(P):
        x0 = 0.0  # rates of the kinds that run one pass only
        y0 = 0.0
        n = 0  # kinds that run both passes (-1: one of them has a free pass)
        for k in range(K):
            ff, fb = math.isfinite(F[p, k]), math.isfinite(B[p, k])
            a = R[k] / F[p, k] if ff else 0.0  # a whole kind's rate on each pass (inf: free)
            b = R[k] / B[p, k] if fb else 0.0
            if ff and not fb:
                x0 += a
            elif fb and not ff:
                y0 += b
            elif ff and fb:
                if math.isinf(a) or math.isinf(b):
                    n = -1
                if n >= 0:
                    al[n], be[n] = a, b
                    key[n] = -a / b if b > 0 else -a
                    n += 1
        if n <= 0 or math.isinf(x0) or math.isinf(y0):  # no choice, or a free pass: left to least_busy
            busy[p], seg[p], theta[p] = np.nan, -1, np.nan
            continue
        for i in range(n):  # stable sort of the two-pass kinds by -R/F : R/B (insertion; K is small)
            order[i] = i
            q = i
            while q > 0 and key[order[q - 1]] > key[order[q]]:
                order[q - 1], order[q] = order[q], order[q - 1]
                q -= 1
        total_b = 0.0
        for i in range(n):
            total_b += be[order[i]]
        cs_a = 0.0  # running sums in frontier order (the same float operations as the numpy form)
        cs_b = 0.0
        best, best_i, best_t = np.inf, 0, np.nan
        for i in range(n):
            a, b = al[order[i]], be[order[i]]
            cs_a += a
            cs_b += b
            A0 = (x0 + cs_a) - a  # forward rate with the kinds before on forward
            B0 = (y0 + total_b) - (cs_b - b)  # this one on backward
            pos = a > 0
            da, db = (a, b) if pos else (1.0, 1.0)
            lo = max(0.0, (inv - A0) / da)
            hi = min(1.0, (B0 - inv) / db)
            rho = math.sqrt(b / da)
            t = min(max((B0 - rho * A0) / ((b + rho * a) if pos else 1.0), lo), hi)
            fr, br = A0 + t * a, B0 - t * b
            value = (1.0 / fr if fr > 0 else np.inf) + (1.0 / br if br > 0 else np.inf)
            if not (pos and lo <= hi + slack):
                value = np.inf
            if i == 0 or value < best:
                best, best_i, best_t = value, i, t
        busy[p], seg[p], theta[p] = best, best_i, best_t


def least_busy(res: dict, fwd: dict, bwd: dict, limit: float = math.inf) -> tuple[dict | None, float, float]:
    """The forward share that minimises ``f + b`` with each pass within ``limit`` (split
    execution at a trial period T: what the window rows ask of a stage).

    Under 1F1B (:func:`pipeopt.cost.rules.steady_period`) a split-execution stage with
    forward time f and backward time b (:func:`pipeopt.cost.stage_compute`) must have
    ``f <= T`` and ``b <= T`` (its two shares' own rows) and adds ``f + b`` to every window
    row through it. So at a fixed T the best share is the one of least ``f + b`` with both
    passes within T: it is best for every row at once.

    **Derivation.** With forward rate ``a = sum_k beta_k R_k / F_k`` and backward rate
    ``b = sum_k (1 - beta_k) R_k / B_k`` the problem is ``min 1/a + 1/b`` subject to
    ``a >= 1/T`` and ``b >= 1/T``. The objective falls in both rates and the caps are
    bounds on the rates, so some optimum lies on the Pareto frontier of the rate polytope:
    the chain of segments of the fractional knapsack of :func:`best_split` (kinds that run
    one pass only serve it whole; the others move whole to the forward pass in decreasing
    order of ``B_k / F_k``). On the segment where kind j moves (rates ``A0 + theta a_j`` and
    ``B0 - theta b_j``, ``a_j = R_j / F_j``, ``b_j = R_j / B_j``, ``theta`` in [0, 1]) the
    objective is convex in theta, stationary at ``theta* = (B0 - rho A0) / (b_j + rho a_j)``
    with ``rho = sqrt(b_j / a_j)`` (there the backward rate is rho times the forward rate),
    and the caps keep theta in ``[(1/T - A0) / a_j, (B0 - 1/T) / b_j]``: theta* clipped to
    that interval is the segment's optimum, and the least over the segments is the optimum.
    With one kind: ``beta = sqrt F / (sqrt F + sqrt B)`` clipped to ``[F / (R T),
    1 - B / (R T)]``, giving ``f + b = (sqrt F + sqrt B)^2 / R`` when unclipped (more than the
    sequential ``(F + B) / R``, the price of running both passes at once). A pass that is
    free on some kind (a zero load) gets that kind's tiny share :data:`EPS_SHARE`, as in
    :func:`best_split`: that pass takes no time and the other keeps everything else, best for
    every objective. Infeasible iff :func:`best_split`'s stage time exceeds T.

    Parameters
    ----------
    res, fwd, bwd
        As in :func:`best_split`.
    limit
        T, seconds (default: no cap).

    Returns
    -------
    (beta, forward, backward)
        The shares (``dict[kind, float]`` over ``res``) and the two passes' times under them
        (:func:`pipeopt.cost.stage_compute`); ``(None, inf, inf)`` if no share keeps both
        passes within T (or no share runs both passes).
    """
    both, fwd_only, bwd_only = _sides(res, fwd, bwd)
    x0 = sum(_rate(res[k], fwd[k]) for k in fwd_only)
    y0 = sum(_rate(res[k], bwd[k]) for k in bwd_only)
    a = {k: _rate(res[k], fwd[k]) for k in both}
    b = {k: _rate(res[k], bwd[k]) for k in both}
    if not both or math.isinf(x0) or math.isinf(y0) or any(map(math.isinf, (*a.values(), *b.values()))):
        # a free pass, or nothing to choose: the least-time share is best for f + b too
        beta, _ = best_split(res, fwd, bwd)
        f, bb, _ = stage_compute(res, fwd, bwd, beta)
        return (beta, f, bb) if math.isfinite(max(f, bb)) and max(f, bb) <= limit else (None, math.inf, math.inf)
    inv = 0.0 if math.isinf(limit) else (math.inf if limit <= 0 else 1.0 / limit)
    order = sorted(both, key=lambda k: (-a[k] / b[k], k))
    A, Bv = x0, y0 + sum(b.values())  # rates with the kinds before k on forward, k on backward
    best = (math.inf, -1, 0.0)
    for j, k in enumerate(order):  # the same arithmetic as least_busy_many, one segment at a time
        lo = max(0.0, (inv - A) / a[k])
        hi = min(1.0, (Bv - inv) / b[k])
        if lo <= hi + THETA_SLACK:
            rho = math.sqrt(b[k] / a[k])
            theta = min(max((Bv - rho * A) / (b[k] + rho * a[k]), lo), hi)
            fr, br = A + theta * a[k], Bv - theta * b[k]
            value = (1.0 / fr if fr > 0 else math.inf) + (1.0 / br if br > 0 else math.inf)
            if value < best[0]:
                best = (value, j, theta)
        A, Bv = A + a[k], Bv - b[k]
    if not math.isfinite(best[0]):
        return None, math.inf, math.inf
    beta = {k: 0.0 for k in res}
    for k in fwd_only:
        beta[k] = 1.0
    _, j, theta = best
    for k in order[:j]:
        beta[k] = 1.0
    beta[order[j]] = theta
    f, bb, _ = stage_compute(res, fwd, bwd, beta)
    return beta, f, bb


def busy_cut(res: dict, fwd: dict, bwd: dict, limit: float) -> tuple[dict, float]:
    """A lower bound on :func:`least_busy`'s ``f + b`` at T = ``limit`` that is *linear in the
    worker's resources* and tight at ``res``: ``f + b >= const - sum_k R_k coef_k`` for every
    worker R (same loads), with equality at ``R = res``.

    **Derivation (Lagrangian duality).** With the forward resources ``y_k`` in ``[0, R_k]``,
    the rates are ``a = sum_k y_k / F_k`` and ``b = sum_k (R_k - y_k) / B_k``, and ``f + b =
    1/a + 1/b`` with ``a, b >= 1/T``. For any prices ``A, Bm >= 0`` and any feasible point,
    ``1/a + 1/b >= kappa(A) + kappa(Bm) - (A a + Bm b) >= kappa(A) + kappa(Bm) - sigma_R(A, Bm)``
    with ``kappa(A) = min_{a >= 1/T} 1/a + A a`` (``2 sqrt A`` if ``sqrt A <= T``, else
    ``T + A / T``) and ``sigma_R(A, Bm) = max_y A a + Bm b = sum_k R_k max(A / F_k, Bm / B_k)``,
    linear in R: every pair of prices gives a valid bound for every worker. The problem is
    convex (jointly in y and R), so the prices of the optimum at ``res`` - its KKT
    multipliers: ``A = 1/a^2 + mu_a``, ``Bm = 1/b^2 + mu_b`` with ``mu`` the multipliers of the
    caps, and ``A / Bm`` in the normal cone of the rate polytope there, ``[max_{beta_k > 0}
    B_k^-1 / F_k^-1, min_{beta_k < 1} ...]`` over the kinds that run both passes - make the
    bound tight at ``res``. It is a supporting hyperplane of the convex function
    ``R -> least f + b``: the exact methods of the group problem add it where a plan breaks a
    window row (outer approximation).

    Returns
    -------
    (coef, const)
        ``dict[kind, seconds per unit]`` over the kinds of ``res``, ``fwd`` and ``bwd`` (``inf``
        where a pass is free on the kind: the bound says nothing for a worker with that kind)
        and seconds. ``({}, 0.0)`` if no share
        passes T on ``res`` (then nothing is claimed).
    """
    beta, f, b = least_busy(res, fwd, bwd, limit)
    if beta is None:
        return {}, 0.0
    A, Bm = f * f, b * b  # 1 / a^2 and 1 / b^2
    lo, hi = 0.0, math.inf
    for k in _usable(res, fwd, bwd):
        if fwd[k] > 0 and bwd[k] > 0:
            r = fwd[k] / bwd[k]  # (R / B_k) / (R / F_k): the ratio of prices at which kind k is indifferent
            if beta[k] > 0:
                lo = max(lo, r)
            if beta[k] < 1:
                hi = min(hi, r)
    if A > 0 and Bm > 0 and lo <= hi:
        ratio = A / Bm
        if ratio < lo:
            A = lo * Bm
        elif ratio > hi:
            Bm = A / hi
    const = _kappa(A, limit) + _kappa(Bm, limit)

    def price(p: float, load: float) -> float:
        if p == 0 or math.isinf(load):
            return 0.0
        return math.inf if load == 0 else p / load

    kinds = sorted(set(res) | set(fwd) | set(bwd), key=str)  # kinds absent from ``res`` count for other workers
    coef = {k: max(price(A, fwd.get(k, math.inf)), price(Bm, bwd.get(k, math.inf))) for k in kinds}
    return coef, const


def _kappa(price: float, limit: float) -> float:
    """``min_{a >= 1/T} 1/a + price a`` (seconds)."""
    root = math.sqrt(price)
    return 2.0 * root if root <= limit else limit + price / limit
