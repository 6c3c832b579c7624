"""A cheap relaxation of the type DP's probe (:mod:`.group_dp`): a lower bound on the group
problem's period that sees the window rows, the cut transfers, memory and whole compositions.

The priced work bound (:meth:`~.group_dp.TypesProbe.work_bound`) spreads the chain's work over
the whole cluster; on slow links (10 GbE) the optimum is far above it, because every cut's round
trip enters the window rows and the early stages keep many microbatches in memory. This module
decides, at a limit T, a *relaxation* of the probe's question "is there a plan of period <= T?"
- if the relaxation has no solution, neither has the probe, so T is a proven lower bound.

**The relaxation.** A worker is read only through its priced power ``x`` (the first price of the
probe, the tightest one: :attr:`~.group_dp.TypesProbe._order_key`). A plan at T gives stages
``k = 0..S-1`` over units ``j_k..j_{k+1}-1`` with powers ``x_k`` such that

* ``x_k >= L_k(j_k, j_{k+1})``: the least power of a composition (at least one device) whose own
  rows pass T (:meth:`~.group_dp.TypesProbe.least_stage`) and, separately, the least power of
  one whose memory holds the stage with ``2 (S - k)`` microbatches in flight (the larger of the
  two: a composition that does both has at least either);
* ``sum_k x_k <= P`` (the cluster's power; the last stage takes all that is left);
* the stage's least busy time ``w_k >= root_k**2 / x_k``
  (:meth:`~.group_dp.TypesProbe.window_need`'s per-stage rule) and the window rows of
  :func:`pipeopt.cost.rules.window_step` hold on these busy times and the cuts' round trips;
* every cut passes T (:attr:`~pipeopt.problems.resource.ResourceProblem.cut_time`).

A DP over boundaries ``(k, j)`` keeps a front of labels ``(X, G)`` - power used, window state - and
tries each stage's power on a geometric grid of :data:`BINS` points between the least the stage
needs and the most the stages after it leave: a power anywhere in ``[x_m, x_{m+1}]`` is read
as using ``x_m`` and busy ``root**2 / x_{m+1}`` (optimistic on both). Fronts longer than
:data:`FRONT` become the lower-left corners of consecutive groups (optimistic again). So every
step only enlarges what is feasible: "infeasible" here is a proof for the exact problem. The DP
runs at ``T (1 + RELAX)`` like the probe (``RELAX`` is :data:`~pipeopt.cost.tolerance.SUM_ORDER`).

:func:`relaxed_bound` bisects T with it between a valid lower bound and the incumbent: the
largest T it refutes is a lower bound on the optimum (a refutation at one T needs no
monotonicity). Cost: ``S * n**2 * FRONT * BINS`` steps in the worst case per T, compiled with
numba (:func:`_stage_step`); tens of milliseconds on GPT-2 XL (98 units, 16 stages).
"""

from __future__ import annotations

import math

import numpy as np

from ...backends.deadline import Deadline
from ...cost import rules
from ...cost.tolerance import SUM_ORDER
from ...jit import njit

BINS = 24
"""Grid points of a stage's power between the least it needs and the most it may take."""

FRONT = 32
"""Most labels ``(X, G)`` kept per boundary (beyond it, lower-left corners of groups)."""

CELLS = 4096
"""Cells of the power axis in which a boundary's candidate labels are merged to their
lower-left corner (least power, least window state) before the front is taken."""

BOUND_REL_TOL = 1e-4
""":func:`relaxed_bound` stops when its bracket is this narrow (relative)."""

BOUND_STEPS = 40
"""Most relaxation calls :func:`relaxed_bound` makes."""


class StageRelaxation:
    """The relaxation of the type DP's probe at a limit T (module docstring).

    Parameters
    ----------
    probe
        :class:`~pipeopt.problems.resource.group_dp.TypesProbe` of the problem (its prices,
        priced power, work roots and least stage powers are read, not recomputed).
    """

    def __init__(self, probe):
        self.probe = probe
        p = probe.problem
        ty = probe.types
        n, S = p.n, p.num_stages
        first = probe._order_key
        self.P = float(probe.power[ty.full, first])
        a = np.arange(n + 1)
        with np.errstate(invalid="ignore"):
            root = probe._root(a[:, None], a[None, :])
        self.root2 = np.where(a[None, :] > a[:, None], np.nan_to_num(root, nan=np.inf) ** 2, np.inf)
        # least power of a composition (>= 1 device) holding units j..j2-1 as stage k in memory
        self.mem_least = np.zeros((S, n + 1, n + 1))
        if probe.memory_limited:
            busy = ty.ndev >= 1
            cap = np.asarray(rules.memory_limit(ty.M), dtype=float)[busy]
            power = probe.power[busy, first]
            order = np.argsort(cap, kind="stable")
            cap, power = cap[order], power[order]
            suffix = np.minimum.accumulate(power[::-1])[::-1]  # least power among caps >= cap[i]
            suffix = np.concatenate([suffix, [np.inf]])
            for k in range(S):
                need = np.asarray(p.table.memory(a[:, None], a[None, :], p.in_flight(k)), dtype=float)
                at = np.searchsorted(cap, need, side="left")  # first cap >= need (fits: need <= cap)
                self.mem_least[k] = suffix[at]
        D, _ = rules.window_tokens(rules.windows(S), np.ones(S), [True] * S)
        self.D = np.asarray(D, dtype=float)

    def feasible(self, T: float, deadline: Deadline | None = None) -> bool:
        """False only if no plan has period <= T (a proof); True: the relaxation allows one.

        Raises
        ------
        DeadlineReached
            If ``deadline`` passes (checked once per stage).
        """
        probe, p = self.probe, self.probe.problem
        n, S = p.n, p.num_stages
        Tp = T * (1.0 + SUM_ORDER)  # the probe's RELAX
        if not Tp > 0:
            return False
        cut_ok = p.cut_time <= Tp
        rows = probe.least_stage(Tp, cut_ok, deadline)  # (n+1, n+1), inf where nothing passes
        ends_ok = cut_ok.copy()
        ends_ok[n] = True
        trip = np.asarray(p.round_trip, dtype=float)
        L = [np.where(ends_ok[None, :], np.maximum(rows, self.mem_least[k]), np.inf) for k in range(S)]
        # rest[k][j]: least power stages k..S-1 need over units j..n-1
        rest = np.full((S + 1, n + 1), np.inf)
        rest[S, n] = 0.0
        for k in range(S - 1, -1, -1):
            rest[k, :n] = (L[k][:n] + rest[k + 1][None, :]).min(axis=1)
        if not rest[0, 0] <= self.P * (1 + 1e-9):
            return False
        X = np.full((n + 1, FRONT), np.inf)
        G = np.full((n + 1, FRONT), np.inf)
        X[0, 0], G[0, 0] = 0.0, -np.inf
        for k in range(S - 1):
            if deadline is not None:
                deadline.check(f"the stage relaxation (stage {k})")
            X, G = _stage_step(X, G, L[k], self.root2, trip, rest[k + 1], self.P * (1 + 1e-9),
                               float(self.D[k]), float(self.D[k + 1]), Tp, k, n, S, BINS, FRONT, CELLS)
            if not np.isfinite(X).any():
                return False
        return bool(_last_stage(X, G, L[S - 1], self.root2, trip, self.P * (1 + 1e-9), float(self.D[S - 1]), Tp, n))


def relaxed_bound(relax: StageRelaxation, lo: float, hi: float, deadline: Deadline | None = None) -> float:
    """The largest T in ``[lo, hi]`` the relaxation refutes found by bisection (``lo`` if it refutes
    none): a lower bound on the optimum when ``lo`` is one. At most :data:`BOUND_STEPS` calls,
    stops at a relative bracket of :data:`BOUND_REL_TOL` or when ``deadline`` passes (what it
    proved so far is returned)."""
    from ...backends.deadline import DeadlineReached

    best = lo
    try:
        if not relax.feasible(hi, deadline):
            return hi
        for _ in range(BOUND_STEPS):
            if hi - best <= BOUND_REL_TOL * best:
                break
            mid = 0.5 * (best + hi)
            if relax.feasible(mid, deadline):
                hi = mid
            else:
                best = mid
    except DeadlineReached:
        pass
    return best


@njit(cache=True, nogil=True)
def _stage_step(X, G, L, root2, trip, rest, P, Dk, Dk1, T, k, n, S, bins, front, cells):  # pragma: no cover - compiled
    """One stage of :meth:`StageRelaxation.feasible`: the labels ``(X, G)`` at boundary k (per
    start unit, ``(n+1, front)``, ``inf`` padding) to those at k + 1, fronts compressed."""
    cX = np.empty(cells)  # per cell of X: the least X and the least G of its candidates
    cG = np.empty(cells)
    width = P / cells
    nX = np.full((n + 1, front), np.inf)
    nG = np.full((n + 1, front), np.inf)
    carry = np.full((n + 1, front), np.inf)
    for j in range(n):
        for q in range(front):
            if X[j, q] < np.inf:
                carry[j, q] = max(-Dk * T, G[j, q] + trip[j])
    fx = np.empty(cells)
    fg = np.empty(cells)
    for j2 in range(k + 1, n - (S - 2 - k)):
        floor = -Dk1 * T - trip[j2]
        cX[:] = np.inf
        cG[:] = np.inf
        c = 0
        for j in range(j2):
            lk = L[j, j2]
            if not lk < np.inf:
                continue
            a = root2[j, j2]
            for q in range(front):
                x0 = X[j, q]
                if not x0 < np.inf:
                    continue
                h = carry[j, q]
                if not h < 0.0:
                    continue
                xmax = P - x0 - rest[j2]
                xmin = max(lk, a / (-h))
                if not xmin <= xmax:
                    continue
                if xmin <= 0.0 or xmax <= xmin * (1 + 1e-12):
                    nb = 1
                    step = 1.0
                else:
                    nb = bins
                    step = (xmax / xmin) ** (1.0 / nb)
                for m in range(nb):
                    lo_x = xmin * step ** m
                    hi_x = xmax if m + 1 == nb else min(xmin * step ** (m + 1), xmax)
                    if nb == 1 and xmin <= 0.0:
                        lo_x = 0.0
                    w = a / hi_x if hi_x > 0 else (0.0 if a == 0 else np.inf)
                    g = w + h
                    if g > 1e-9 * T:
                        continue
                    if g < floor:
                        g = floor
                    xv = x0 + lo_x
                    cell = int(xv / width)
                    if cell >= cells:
                        cell = cells - 1
                    if cell < 0:
                        cell = 0
                    if xv < cX[cell]:
                        cX[cell] = xv
                    if g < cG[cell]:
                        cG[cell] = g
                    c += 1
        if c == 0:
            continue
        m = 0
        bestg = np.inf
        for i in range(cells):  # Pareto front of the cells' corners: X increasing, G decreasing
            if cG[i] < bestg:
                fx[m] = cX[i]
                fg[m] = cG[i]
                m += 1
                bestg = cG[i]
        if m <= front:
            for t in range(m):
                nX[j2, t] = fx[t]
                nG[j2, t] = fg[t]
        else:  # groups of consecutive points -> their lower-left corners (least X, least G)
            for t in range(front):
                a0 = (t * m) // front
                a1 = ((t + 1) * m) // front
                nX[j2, t] = fx[a0]
                nG[j2, t] = fg[a1 - 1]
    return nX, nG


@njit(cache=True, nogil=True)
def _last_stage(X, G, L, root2, trip, P, Dk, T, n):  # pragma: no cover - compiled
    """Whether some label at the last boundary completes: the last stage takes all power left."""
    for j in range(n):
        for q in range(X.shape[1]):
            x0 = X[j, q]
            if not x0 < np.inf:
                continue
            x = P - x0
            if not x >= L[j, n]:
                continue
            carry = max(-Dk * T, G[j, q] + trip[j])
            a = root2[j, n]
            w = a / x if x > 0 else (0.0 if a == 0 else np.inf)
            if w + carry <= 1e-9 * T:
                return True
    return False
