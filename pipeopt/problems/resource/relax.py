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

:func:`relaxed_bound` bisects T with it between a valid lower bound and the incumbent, at finer
resolutions in turn (:data:`LEVELS`): the largest T it refutes is a lower bound on the optimum (a
refutation at one T needs no monotonicity). Where it allows a T, it also gives the split of one
relaxed plan (:meth:`StageRelaxation.split`); :func:`guide_splits` collects them just above the
bound, as guides for the type DP's search for a better plan (they prove nothing).

Cost: ``S * n**2 * front * bins`` steps in the worst case per T, compiled with numba
(:func:`_stage_step`); on GPT-2 XL (98 units, 16 stages) 0.3 and 1.0 CPU s per T at the two
resolutions of :data:`LEVELS`.
"""

from __future__ import annotations

import numpy as np

from ...backends.deadline import Deadline
from ...cost import rules
from ...cost.tolerance import SUM_ORDER
from ...jit import njit

LEVELS = ((24, 32, 4096), (24, 128, 16384))
"""The resolutions ``(bins, front, cells)`` :func:`relaxed_bound` runs in turn, each from the bound
the one before proved: the coarse one is cheap (about 0.3 s a limit on GPT-2 XL, 98 units and 16
stages), the finer one tighter and slower (about 1 s; GPT-2 XL over 64 mixed devices, seed 2,
optimum 8.4406 ms: 8.20 and 8.32 ms). A third level, ``(48, 256, 32768)``, reaches 8.38 ms at 3 s
a limit (the limit of ever finer grids is about 8.39 ms); it is left out: on the group-scale
benchmark (GPT-2 XL, 24 mixes) it changed no gap within the relaxation's share of the time, and
without the rule that ends the levels at one that adds less than :data:`GALLOP` its seconds cost a
proof (server seed 4)."""

BINS, FRONT, CELLS = LEVELS[0]
"""The default resolution of :class:`StageRelaxation`: ``BINS`` grid points of a stage's power
between the least it needs and the most it may take; at most ``FRONT`` labels ``(X, G)`` per
boundary (beyond it, lower-left corners of groups, :func:`_compress`); ``CELLS`` cells of the
power axis in which a boundary's candidate labels are merged to their lower-left corner (least
power, least window state) before the front is taken."""

POWER_WEIGHT = 100.0
""":func:`_compress` measures a front's length as ``POWER_WEIGHT * |dX| / (P / S) + |dG| / T``:
groups of nearly equal power span (GPT-2 XL mixed seed 2 at (24, 32, 4096): 8.20 ms, against
8.11 ms at weight 1 and 8.13 ms for groups of equal point counts)."""

BOUND_REL_TOL = 1e-4
""":func:`relaxed_bound` stops a level when its bracket is this narrow (relative)."""

BOUND_STEPS = 40
"""Most relaxation calls :func:`relaxed_bound` makes per level."""

GUIDE_FACTORS = (1.0005, 1.002, 1.005, 1.01, 1.02, 1.04)
""":func:`guide_splits` reads the relaxed plans at these multiples of the bound."""

GALLOP = 2.5e-3
"""A finer level of :func:`relaxed_bound` first tries limits ``bound (1 + GALLOP 2**i)`` above the
bound the coarser one proved (its bound is a few per cent above at most), then bisects; if it
allows the first of them it ends there (it would add less than ``GALLOP``: GPT-2 XL over 64 server
devices, seed 4: 3.1548, 3.1617, 3.1637 ms at the three levels, the optimum 3.3104 ms)."""


class StageRelaxation:
    """The relaxation of the type DP's probe at a limit T (module docstring).

    Parameters
    ----------
    probe
        :class:`~pipeopt.problems.resource.group_dp.TypesProbe` of the problem (its prices,
        priced power, work roots and least stage powers are read, not recomputed).
    bins, front, cells
        The resolution (:data:`BINS`, :data:`FRONT`, :data:`CELLS`): any resolution gives a
        relaxation (finer: tighter and slower).
    """

    def __init__(self, probe, bins: int = BINS, front: int = FRONT, cells: int = CELLS):
        self.probe = probe
        self.bins, self.front, self.cells = int(bins), int(front), int(cells)
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
        return self.split(T, deadline) is not None

    def split(self, T: float, deadline: Deadline | None = None) -> list[int] | None:
        """The relaxation at T (:meth:`feasible`) with the stage starts of one relaxed plan it
        allows (``S - 1`` unit indices, each label followed back to the parent of its least power),
        or ``None`` if it refutes T. The split is a guide for a heuristic (its powers and window
        states may come from different candidates): it proves nothing.

        Raises
        ------
        DeadlineReached
            If ``deadline`` passes (checked once per stage).
        """
        probe, p = self.probe, self.probe.problem
        n, S = p.n, p.num_stages
        Tp = T * (1.0 + SUM_ORDER)  # the probe's RELAX
        if not Tp > 0:
            return None
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
            return None
        X = np.full((n + 1, self.front), np.inf)
        G = np.full((n + 1, self.front), np.inf)
        X[0, 0], G[0, 0] = 0.0, -np.inf
        parents = []
        for k in range(S - 1):
            if deadline is not None:
                deadline.check(f"the stage relaxation (stage {k})")
            X, G, pj, pq = _stage_step(X, G, L[k], self.root2, trip, rest[k + 1], self.P * (1 + 1e-9),
                                       float(self.D[k]), float(self.D[k + 1]), Tp, k, n, S, self.bins, self.front,
                                       self.cells, POWER_WEIGHT)
            parents.append((pj, pq))
            if not np.isfinite(X).any():
                return None
        j, q = _last_stage(X, G, L[S - 1], self.root2, trip, self.P * (1 + 1e-9), float(self.D[S - 1]), Tp, n)
        if j < 0:
            return None
        starts = []
        for pj, pq in reversed(parents):  # stage k's start is the end of stage k - 1
            starts.append(int(j))
            j, q = pj[j, q], pq[j, q]
        return starts[::-1]


def relaxed_bound(probe, lo: float, hi: float, deadline: Deadline | None = None, levels=LEVELS) -> float:
    """The largest T in ``[lo, hi]`` the relaxation refutes, found level by level: at each
    resolution of ``levels`` (``(bins, front, cells)``, coarse to fine; default :data:`LEVELS`)
    a search above the bound proved so far - limits ``bound (1 + GALLOP 2**i)`` up to the first
    the level allows (none above the first: the level ends), then bisection to a relative bracket of :data:`BOUND_REL_TOL` (at most
    :data:`BOUND_STEPS` calls). A refutation at one T needs no monotonicity, and every level is
    a relaxation, so the result is a lower bound on the optimum when ``lo`` is one (``lo`` if none
    refutes more). Stops when ``deadline`` passes (what it proved so far is returned).

    Parameters
    ----------
    probe
        :class:`~pipeopt.problems.resource.group_dp.TypesProbe`.
    lo, hi
        Seconds: a lower bound and a limit some plan meets (the incumbent's period).
    """
    from ...backends.deadline import DeadlineReached

    best = lo
    try:
        for at, (bins, front, cells) in enumerate(levels):
            relax = StageRelaxation(probe, bins, front, cells)
            top = hi
            if at == 0:
                if not relax.feasible(hi, deadline):
                    return hi
            else:  # gallop up from the coarser level's bound
                step = GALLOP
                if best * (1 + step) < top and relax.feasible(best * (1 + step), deadline):
                    break  # this level adds less than GALLOP: neither it nor a finer one is worth a bisection
                while best * (1 + step) < top:
                    T = best * (1 + step)
                    if relax.feasible(T, deadline):
                        top = T
                        break
                    best = T
                    step *= 2
            for _ in range(BOUND_STEPS):
                if top - best <= BOUND_REL_TOL * best:
                    break
                mid = 0.5 * (best + top)
                if relax.feasible(mid, deadline):
                    top = mid
                else:
                    best = mid
    except DeadlineReached:
        pass
    return best


def guide_splits(probe, bound: float, hi: float, deadline: Deadline | None = None,
                 level=LEVELS[1], factors=GUIDE_FACTORS) -> list[list[int]]:
    """The distinct splits of the relaxed plans (:meth:`StageRelaxation.split` at ``level``) at
    ``bound * f`` for each f of ``factors`` below ``hi``: near the bound the relaxation is tight
    enough that the optimum's split is often among them or close (GPT-2 XL over 64 mixed devices,
    seed 2: the first is the optimum's). Guides for a heuristic; they prove nothing. Stops at
    ``deadline`` with what it has."""
    from ...backends.deadline import DeadlineReached

    relax = StageRelaxation(probe, *level)
    out: list[list[int]] = []
    try:
        for f in factors:
            if not bound * f < hi:
                break
            split = relax.split(bound * f, deadline)
            if split is not None and split not in out:
                out.append(split)
    except DeadlineReached:
        pass
    return out


@njit(cache=True, nogil=True)
def _stage_step(X, G, L, root2, trip, rest, P, Dk, Dk1, T, k, n, S, bins, front, cells, weight):  # pragma: no cover - compiled
    """One stage of :meth:`StageRelaxation.feasible`: the labels ``(X, G)`` at boundary k (per
    start unit, ``(n+1, front)``, ``inf`` padding) to those at k + 1, fronts compressed; and each
    new label's parent ``(j, q)`` (the label and stage start of its least power; a guide for
    :meth:`StageRelaxation.split`, not part of the proof)."""
    cX = np.empty(cells)  # per cell of X: the least X and the least G of its candidates
    cG = np.empty(cells)
    cJ = np.empty(cells, np.int64)  # the parent of the cell's least X
    cQ = np.empty(cells, np.int64)
    pJ = np.full((n + 1, front), -1, np.int64)
    pQ = np.full((n + 1, front), -1, np.int64)
    fj = np.empty(cells, np.int64)
    fq = np.empty(cells, np.int64)
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
    xs = P / S / weight  # the power scale of :func:`_compress`
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
                if floor - h > 0.0:  # beyond a / (floor - h), more power leaves G at the floor
                    xmax = min(xmax, max(a / (floor - h), lk))
                xmin = max(lk, a / (-h))
                if not xmin <= xmax:
                    continue
                if xmin <= 0.0 or xmax <= xmin * (1 + 1e-12):
                    nb = 1
                    step = 1.0
                else:
                    nb = bins
                    step = (xmax / xmin) ** (1.0 / nb)
                hi_x = xmin
                for m in range(nb):
                    lo_x = hi_x
                    hi_x = xmax if m + 1 == nb else min(lo_x * step, xmax)
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
                        cJ[cell] = j
                        cQ[cell] = q
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
                fj[m] = cJ[i]
                fq[m] = cQ[i]
                m += 1
                bestg = cG[i]
        if m <= front:
            for t in range(m):
                nX[j2, t] = fx[t]
                nG[j2, t] = fg[t]
                pJ[j2, t] = fj[t]
                pQ[j2, t] = fq[t]
        else:  # groups of consecutive points -> their lower-left corners (least X, least G)
            _compress(fx, fg, fj, fq, m, front, xs, T, nX[j2], nG[j2], pJ[j2], pQ[j2])
    return nX, nG, pJ, pQ


@njit(cache=True, nogil=True)
def _compress(fx, fg, fj, fq, m, front, xs, gs, outX, outG, outJ, outQ):  # pragma: no cover - compiled
    """Replace the front ``fx[:m], fg[:m]`` (X increasing, G decreasing) by at most ``front``
    lower-left corners of consecutive groups (least X, least G: optimistic), the groups cut at
    equal shares of the front's length, ``sum |dX| / xs + |dG| / gs``, so that no group spans
    more than a ``1 / front`` share of it."""
    total = 0.0
    for i in range(1, m):
        total += (fx[i] - fx[i - 1]) / xs + (fg[i - 1] - fg[i]) / gs
    t = 0
    start = 0
    run = 0.0
    for i in range(1, m + 1):
        if i < m:
            run += (fx[i] - fx[i - 1]) / xs + (fg[i - 1] - fg[i]) / gs
        if i == m or (run * front > (t + 1) * total and t + 1 < front):
            outX[t] = fx[start]
            outG[t] = fg[i - 1]
            outJ[t] = fj[start]
            outQ[t] = fq[start]
            t += 1
            start = i
    return t


@njit(cache=True, nogil=True)
def _last_stage(X, G, L, root2, trip, P, Dk, T, n):  # pragma: no cover - compiled
    """The first label ``(j, q)`` at the last boundary that completes (the last stage takes all
    power left), or ``(-1, -1)``."""
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
                return j, q
    return -1, -1
