"""A lower bound on the iteration time of every order of every split: per rank of two chunks.

With two chunks per rank (v = 2, looped or V placement) the per-stage bound of
:mod:`.split_bound` sees one chunk and misses that the rank runs the other chunk's actions too.
Here a rank r holding chunks ``s1 < s2`` (units ``a1..c1-1`` and ``a2..c2-1``) gets one-machine
bounds (release times and tails) on *both* chunks' actions, each a function of the four
boundaries. With F, I, W a chunk's seconds per microbatch (prefix differences; transfers left
out of the rank's work, which only lowers the bound), m microbatches, and microbatches in index
order per stage (every torch order, and the free order's symmetry breaking):

* ``head`` - no action of the rank starts before microbatch 0's forward reaches ``s1``:
  ``F(0..a1) + sin(s1)``;
* ``fill`` - no I or W of the rank starts before the first I of ``s2`` (an I of ``s1`` waits
  for the I of ``s2`` of its microbatch), which waits for microbatch 0's forward through the whole
  chain and its input gradient back to ``s2``: ``F(0..n) + I(c2..n) + sin(s2) + 2 sout(s2)``;
  before it the rank runs forwards only, at most ``X`` seconds of them: ``fill - head``, and with
  a memory limit (no recomputation) the most ``k1 F1 + k2 F2`` whose activations fit beside both
  chunks' parameters (``k1 act1 + k2 act2 <= room``, ``k1, k2 <= m``: a two-item knapsack);
* ``tail_i`` - the rank's last I is one of ``s1`` (index order), after which the input
  gradients of the earlier chunks and the first chunk's W remain: ``I(0..a1) + sin(s1) +
  W(0..1)`` (for ``s1 = 0`` its own last W);
* ``tail_f`` - the rank's last F is one of ``s2`` (its input is ``s1``'s output), after which the
  rest of the forward and the whole backward remain: ``F(c2..n) + sout(s2) + I(0..n) + W(0..1)``.

The rank's bound ``h_r`` is the largest of ``head + m (F + I + W)``, ``head + m (F + I) +
tail_i``, ``fill + m (I + W) + (m F - X)+``, ``fill + m I + (m F - X)+ + tail_i`` and ``head + m F
+ tail_f`` (F, I, W summed over both chunks), and every chunk's own per-stage bound
(:func:`.split_bound.pair_bounds`). :func:`rank_lower_bound` finds ``min over splits of max_r
h_r`` to a relative tolerance: at a limit T a DP over the ranks keeps the boundary pairs a
partial split can reach with every bound so far at most T - from the outside in for the V
placement (rank r holds chunks r and 2p-1-r, nested), left to right for the looped one (rank r
holds r and r+p; the pair ``(b_r, b_{r+p})`` and ``b_p``, where the first half must end) - and the
largest T it refutes is the bound. Each rank's candidates are cut first by what the bound itself
implies (its two chunks' work at most ``(T - head) / m``, the later ranks' at most ``(T - head) / m``
each); a DP that would hold more than :data:`MAX_PAIRS` candidate
tuples at one rank gives up at that T (counted as not refuted: the bound stays valid, only
weaker). ``tests/problems/schedule/test_rank_bound.py`` checks it below the brute force over every
order and split (p = 2), below the executor's time of torch's two-chunk orders on sampled splits,
and equal to the least over every split of small chains.

Shipped instances, free order, V / looped (the busiest rank's work, which the per-stage bound does
not pass here: 338.13 ms on GPT-2 XL, 708.88 ms on BERT-large on V100s): GPT-2 XL on 4 A100s, m = 8:
342.92 / 343.67 ms; on 8 A100s, m = 16: 349.29 / 347.05 ms; BERT-large on 4 V100s, m = 8: 738.31 /
748.76 ms; 0.01-0.2 s each.
"""

from __future__ import annotations

import math

import numpy as np

from ...backends.deadline import Deadline, DeadlineReached
from ...cost import rules
from ...schedules.free import placement_kind
from .problem import ScheduleProblem
from .split_bound import pair_bounds

__all__ = ["MAX_PAIRS", "rank_bounds", "rank_lower_bound"]

MAX_PAIRS = 1_000_000
"""Most candidate (state, next pair) tuples, or states times units, the DP of
:func:`rank_lower_bound` builds at one rank before it gives up at that limit (a work limit: the same
call gives the same bound on any machine; a few tens of MB of arrays at the limit)."""

GALLOP = 2e-3
""":func:`rank_lower_bound` tries limits ``lo (1 + GALLOP 2**i)`` upward (near the bound the DP's
states are few) before it bisects."""

REL_TOL = 1e-5
"""Relative width of the bracket at which :func:`rank_lower_bound` stops."""

_K_SLACK = 1e-9
"""Relative slack on the knapsack's memory room (a plan exactly at capacity keeps its counts)."""


class _Ranks:
    """The per-rank terms of one problem (module docstring), evaluated on arrays of boundaries."""

    def __init__(self, problem: ScheduleProblem) -> None:
        P = problem.prefixes
        self.n, self.m = problem.n, problem.microbatches
        sched = problem.schedule
        self.p, self.S = sched.ranks, problem.S
        self.PF, self.PI, self.PW, snd = (np.asarray(P[k], dtype=float) for k in ("F", "I", "W", "send"))
        self.PI = np.maximum.accumulate(np.maximum(self.PI, 0.0))  # I = B - W may dip a few ulps
        self.w0 = float(max(self.PW[1] - self.PW[0], 0.0))
        place = sched.placement
        S = self.S
        self.sin = [snd if s > 0 and place[s - 1] != place[s] else np.zeros_like(snd) for s in range(S)]
        self.sout = [snd if s < S - 1 and place[s + 1] != place[s] else np.zeros_like(snd) for s in range(S)]
        cap = problem.capacity
        self.memory = math.isfinite(cap) and problem.recompute == "none"
        if self.memory:
            self.act = np.asarray(P["act"], dtype=float)
            self.param = np.asarray(P["param"], dtype=float) * sched.parameter_copies
            self.limit = float(rules.memory_limit(cap))

    def _span(self, arr, a, c):
        return np.maximum(arr[c] - arr[a], 0.0)

    def _forwards_before(self, a1, c1, a2, c2, F1, F2):
        """Most forward seconds the rank can run before its first I: their activations all held
        (no W, which frees them, runs before an I), beside both chunks' parameters - a two-item
        knapsack over the counts ``k1, k2 <= m`` (``k1`` enumerated)."""
        m = self.m
        act1, act2 = self._span(self.act, a1, c1), self._span(self.act, a2, c2)
        room = (self.limit - self._span(self.param, a1, c1) - self._span(self.param, a2, c2)) * (1 + _K_SLACK)
        best = np.zeros(np.broadcast(a1, c1, a2, c2).shape)
        for k1 in range(m + 1):
            left = room - k1 * act1
            with np.errstate(divide="ignore", invalid="ignore"):
                k2 = np.where(act2 > 0, np.floor(left / np.where(act2 > 0, act2, 1.0)), m)
            k2 = np.clip(k2, 0, m)
            value = np.where(left >= 0, k1 * F1 + k2 * F2, -np.inf)
            np.maximum(best, value, out=best)
        return best

    def h(self, s1: int, s2: int, a1, c1, a2, c2):
        """The rank bound (seconds) of chunks ``s1 < s2`` over units ``a1..c1-1`` and ``a2..c2-1``
        (int arrays, broadcast)."""
        PF, PI, PW, n, m = self.PF, self.PI, self.PW, self.n, self.m
        F1, I1, W1 = self._span(PF, a1, c1), self._span(PI, a1, c1), self._span(PW, a1, c1)
        F2, I2, W2 = self._span(PF, a2, c2), self._span(PI, a2, c2), self._span(PW, a2, c2)
        sin1 = self.sin[s1][a1]
        head = PF[a1] - PF[0] + sin1
        fill = PF[n] - PF[0] + (PI[n] - PI[c2]) + self.sin[s2][a2] + 2 * self.sout[s2][c2]
        first = W1 if s1 == 0 else self.w0
        tail_i = PI[a1] - PI[0] + sin1 + first
        tail_f = PF[n] - PF[c2] + self.sout[s2][c2] + (PI[n] - PI[0]) + self.w0
        forwards = m * (F1 + F2)
        ahead = np.maximum(fill - head, 0.0)
        if self.memory:
            ahead = np.minimum(ahead, self._forwards_before(a1, c1, a2, c2, F1, F2))
        late = np.maximum(forwards - ahead, 0.0)
        return np.maximum.reduce([head + forwards + m * (I1 + W1 + I2 + W2),
                                  head + forwards + m * (I1 + I2) + tail_i,
                                  fill + m * (I1 + W1 + I2 + W2) + late,
                                  fill + m * (I1 + I2) + late + tail_i,
                                  head + forwards + tail_f])


def rank_bounds(problem: ScheduleProblem, starts) -> list[float]:
    """Seconds per rank: the bound ``h_r`` of the split ``starts`` (stage starts after the first),
    for a problem with two chunks per rank; each is at most the iteration time of every order of
    the problem's placement on that split (module docstring)."""
    t = _Ranks(problem)
    b = [0, *[int(x) for x in starts], problem.n]
    out = []
    for r in range(problem.schedule.ranks):
        s1, s2 = problem.schedule.stages_on(r)
        out.append(float(t.h(s1, s2, b[s1], b[s1 + 1], b[s2], b[s2 + 1])))
    return out


def _ranges(lo, hi):
    """``(owner, values)``: for each i the integers ``lo[i]..hi[i]`` (empty where ``hi < lo``),
    concatenated, and the index i of each."""
    size = np.maximum(hi - lo + 1, 0)
    owner = np.repeat(np.arange(size.size), size)
    start = np.repeat(np.cumsum(size) - size, size)
    return owner, lo[owner] + np.arange(owner.size) - start


def _feasible(t: _Ranks, ok: list, kind: str, T: float) -> bool:
    """Whether some split has every rank bound and every stage bound at most T (``ok[s]``: the
    stage's pairs within T); ``True`` also when the DP gives up (:data:`MAX_PAIRS`).

    A rank's bound is at least ``head + m (F + I + W)`` of its two chunks, so once the first
    chunk's end is chosen the second chunk's work has a budget: its candidate ends are one range
    of units, of which the stage bounds and then the whole rank bound keep some."""
    n, p, S, m = t.n, t.p, t.S, t.m
    work = t.PF + t.PI + t.PW  # prefix of F + I + W, non-decreasing
    head_of = t.PF - t.PF[0]
    ranks = range(p - 1) if kind == "v" else range(p)
    if kind == "v":  # state (b_r, b_{2p-r}): chunks r and 2p-1-r from the outside in
        A, Z, X = np.array([0]), np.array([n]), np.array([0])
    else:  # state (b_r, b_{r+p}, b_p): chunks r and r+p left to right; the first half ends at b_p
        X = np.arange(p, n - p + 1)
        A, Z = np.zeros(X.size, dtype=np.int64), X.copy()
    for r in ranks:
        s1, s2 = (r, S - 1 - r) if kind == "v" else (r, r + p)
        last = kind == "looped" and r == p - 1
        if A.size * (n + 1) > MAX_PAIRS:
            return True
        k, a2 = np.nonzero(ok[s1][A])  # chunk s1 = A[k]..a2-1 within its stage bound
        if kind == "looped":
            sel = a2 == X[k] if last else a2 <= X[k] - (p - 1 - r)
            k, a2 = k[sel], a2[sel]
        budget = (T - head_of[A[k]]) / m - (work[a2] - work[A[k]])  # work left for chunk s2
        sel = budget >= 0
        k, a2, budget = k[sel], a2[sel], budget[sel]
        if k.size == 0:
            return False
        # the ranks after r take the units left, each at most (T - its head) / m of work, and
        # every later head is at least head(a2): at most `rest` of work in all
        rest = (p - 1 - r) * (T - head_of[a2]) / m
        if kind == "v":  # chunk s2 = z2..Z-1: z2 from the least start the budget allows
            hi = np.minimum(Z[k] - 1, np.searchsorted(work, work[a2] + rest, side="right") - 1)
            lo = np.maximum(np.searchsorted(work, work[Z[k]] - budget, side="left"), a2 + 2 * (p - 1 - r))
        else:  # chunk s2 = Z..z2-1
            room = rest - (work[X[k]] - work[a2])  # what the later ranks can take of units z2..n-1
            lo = np.maximum(Z[k] + 1, np.searchsorted(work, work[n] - room, side="left"))
            top = n if last else n - (p - 1 - r)
            hi = np.minimum(np.searchsorted(work, work[Z[k]] + budget, side="right") - 1, top)
            if last:
                lo = np.where(hi >= n, n, n + 1)
        if np.maximum(hi - lo + 1, 0).sum() > MAX_PAIRS:
            return True
        i, z2 = _ranges(lo, hi)
        kk, a2 = k[i], a2[i]
        a1, z1, x = A[kk], Z[kk], X[kk]
        stage_ok = ok[s2][z2, z1] if kind == "v" else ok[s2][z1, z2]
        a1, a2, z1, z2, x = a1[stage_ok], a2[stage_ok], z1[stage_ok], z2[stage_ok], x[stage_ok]
        h = t.h(s1, s2, a1, a2, z2, z1) if kind == "v" else t.h(s1, s2, a1, a2, z1, z2)
        keep = h <= T
        if not keep.any():
            return False
        if last:
            return True
        state = np.unique(np.stack([a2[keep], z2[keep], x[keep]], axis=1), axis=0)
        A, Z, X = state[:, 0], state[:, 1], state[:, 2]
    # V: the middle rank holds two adjacent chunks A..b-1 and b..Z-1
    s1, s2 = p - 1, p
    lo, hi = A + 1, Z - 1
    if np.maximum(hi - lo + 1, 0).sum() > MAX_PAIRS:
        return True
    i, b = _ranges(lo, hi)
    a1, z1 = A[i], Z[i]
    sel = ok[s1][a1, b] & ok[s2][b, z1]
    a1, b, z1 = a1[sel], b[sel], z1[sel]
    return bool(a1.size and (t.h(s1, s2, a1, b, b, z1) <= T).any())


def rank_lower_bound(problem: ScheduleProblem, lo: float, hi: float, pairs: list | None = None,
                     deadline: Deadline | None = None) -> float:
    """Seconds: the largest limit in ``[lo, hi]`` at which no split has every rank bound and every
    stage bound within it (module docstring) - a lower bound on every order's iteration time
    for the problem's placement when ``lo`` is one - or ``lo`` where the problem does not have two
    chunks per rank on the looped or V placement, where ``lo <= 0``, or where nothing above ``lo``
    is refuted.

    Parameters
    ----------
    problem
        :class:`ScheduleProblem` (any order; the bound holds for every order of its placement).
    lo, hi
        Seconds: a valid lower bound (e.g. :func:`.split_bound.split_lower_bound`) and the time
        of a known plan (the search stops there).
    pairs
        :func:`.split_bound.pair_bounds` of the problem, if computed.
    deadline
        Checked at each limit tried; when it passes, the bound proved so far is returned.
    """
    sched = problem.schedule
    kind = placement_kind(sched)
    if sched.stages_per_rank != 2 or kind is None or not (0 < lo < hi and math.isfinite(lo)):
        return lo  # (lo <= 0: nothing to gallop from)
    g = pair_bounds(problem) if pairs is None else pairs
    t = _Ranks(problem)

    def refuted(T):
        if deadline is not None:
            deadline.check("the rank bound")
        ok = [x <= T for x in g]
        return not _feasible(t, ok, kind, T)

    best, top = lo, hi
    try:
        step = GALLOP
        while best * (1 + step) < top:
            T = best * (1 + step)
            if not refuted(T):
                top = T
                break
            best = T
            step *= 2
        while top - best > REL_TOL * best:
            mid = 0.5 * (best + top)
            if refuted(mid):
                best = mid
            else:
                top = mid
    except DeadlineReached:
        pass
    return best * (1 - 1e-12) if best > lo else lo
