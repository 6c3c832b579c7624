"""A lower bound on the iteration time of every order of every split: per stage, by its two boundaries.

For a :class:`~.problem.ScheduleProblem` of any order (the free order included) the iteration
time of a split is at least, for every stage s (chunk of layers ``a..c-1``, on one rank), a
value ``g_s(a, c)`` that depends on the stage's two boundaries only (:func:`pair_bounds`). With F,
I, W the stage's seconds per microbatch (without overlap F and I include the transfers they
carry), ``sin`` / ``sout`` the transfer over its first / last boundary (0 where the neighbour is
on the same rank), m microbatches and k the most microbatches whose activations fit the rank
beside the stage's own parameters (:func:`pipeopt.cost.rules.memory_limit`;
``parameter_copies`` of them; m without a memory limit):

* ``head`` - the first F(s, 0) starts after the forwards of every earlier stage and the
  transfer into s: ``F(0..a) + sin``;
* ``fill`` - the first I(s, 0) starts after microbatch 0's forward through the whole chain and
  its input gradient back to s: ``F(0..n) + I(c..n) + sin + 2 sout``;
* ``tail`` - after the last I(s, m - 1) ends: the input gradients of the earlier stages and the
  first stage's W (at least its first layer's): ``I(0..a) + sin + W(0..1)``; after the last
  F: the rest of the chain;
* the rank runs one action at a time; at most k forwards of s run before the first I(s, 0) (the
  k + 1-th waits for W(s, 0)), so from ``max(fill + (m - k) F, head + m F)`` on, the rank still
  has every I and W of the stage to run, and after the last I its last W or the tail.

``g_s`` is the largest of these sums (one-machine bounds with release times and tails). They
hold for every order whose microbatches run each stage in index order - the free order's
symmetry breaking (:mod:`.free_order`) keeps an optimum of that form - and for every fixed
order of torch (their microbatches run in index order; a fused B only adds constraints). The
best split for the bound, ``min over splits of max_s g_s`` (:func:`split_lower_bound`), is a
bottleneck path over boundaries: an exact DP in ``O(S n^2)``. It is a valid lower bound on the
optimum of every order of the problem's placement; :mod:`.free_order` states ``g_s`` as
element constraints on the boundaries and the bound as a constant row of its CP-SAT model.
(GPT-2 XL p = 8, m = 16: 375.99 ms, the proven optimum; the CP-SAT bound alone reached
338-362 ms in 60 s.) ``tests/problems/schedule/test_split_bound.py`` checks it below the
brute-force optimum on small instances.
"""

from __future__ import annotations

import numpy as np

from ...cost import rules
from .problem import ScheduleProblem

__all__ = ["pair_bounds", "split_lower_bound", "splits_below"]

_K_SLACK = 1e-9
"""Relative slack on the in-flight count k = room / act (rounded up at the tolerance: a larger k
only weakens the bound, so a split exactly at capacity keeps its k)."""


def pair_bounds(problem: ScheduleProblem) -> list[np.ndarray]:
    """Per stage s, ``ndarray (n+1, n+1)`` of seconds: ``g_s[a, c]`` is a lower bound on the
    iteration time of every order (microbatches in index order per stage) of every split whose
    stage s covers units ``a..c-1`` (module docstring); ``inf`` where ``c <= a`` or where not one
    microbatch's activations fit beside the stage's parameters.

    Parameters
    ----------
    problem
        A :class:`ScheduleProblem` (any order and placement; with ``recompute`` other than
        ``"none"`` the memory term is left out: k = m).
    """
    P = problem.prefixes
    n, S, m = problem.n, problem.S, problem.microbatches
    sched = problem.schedule
    overlap = problem.instance.settings.overlap
    PF, PI, PW, snd = (np.asarray(P[k], dtype=float) for k in ("F", "I", "W", "send"))
    PI = np.maximum.accumulate(np.maximum(PI, 0.0))  # I = B - W may dip a few ulps: keep it a prefix sum
    idx = np.arange(n + 1)
    a, c = idx[:, None], idx[None, :]
    valid = c > a
    F = np.maximum(PF[c] - PF[a], 0.0)
    I = np.maximum(PI[c] - PI[a], 0.0)
    W = np.maximum(PW[c] - PW[a], 0.0)
    cap = problem.capacity
    k = np.full((n + 1, n + 1), float(m))
    if np.isfinite(cap) and problem.recompute == "none":
        act = P["act"][c] - P["act"][a]
        room = rules.memory_limit(cap) - sched.parameter_copies * (P["param"][c] - P["param"][a])
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.floor(room / np.where(act > 0, act, 1.0) * (1 + _K_SLACK))
        k = np.where(act > 0, np.minimum(q, m), np.where(room >= 0, m, -1.0))
    w0 = float(max(PW[1] - PW[0], 0.0))
    out = []
    for s in range(S):
        cross_in = s > 0 and sched.placement[s - 1] != sched.placement[s]
        cross_out = s < S - 1 and sched.placement[s + 1] != sched.placement[s]
        sin = snd[a] * cross_in + 0.0 * c
        sout = snd[c] * cross_out + 0.0 * a
        Fd = F + (0.0 if overlap else sout)
        Id = I + (0.0 if overlap else sin)
        head = PF[a] - PF[0] + sin
        fill = PF[n] - PF[0] + (PI[n] - PI[c]) + sin + 2 * sout
        first = W if s == 0 else w0
        tail_i = (PI[a] - PI[0]) + (sin if overlap else 0.0) + first
        tail_f = (PF[n] - PF[c]) + (sout if overlap else 0.0) + (PI[n] - PI[0]) + sin + first
        kk = np.maximum(k, 0.0)
        start = np.maximum(fill + (m - kk) * Fd, head + m * Fd)
        g = np.maximum.reduce([start + m * (Id + W), start + m * Id + np.maximum(tail_i, W),
                               head + m * Fd + tail_f])
        out.append(np.where(valid & (k >= 1), g, np.inf))
    return out


def split_lower_bound(problem: ScheduleProblem, pairs: list[np.ndarray] | None = None) -> tuple[float, list[int]]:
    """``(bound seconds, starts)``: ``min over splits of max_s g_s`` (:func:`pair_bounds`) by a
    bottleneck DP over the boundaries, and a split that attains it (stage starts after the
    first). A valid lower bound on every order's iteration time for the problem's placement;
    ``(inf, [])`` if no split has one microbatch's activations fit on every stage."""
    g = pair_bounds(problem) if pairs is None else pairs
    n, S = problem.n, problem.S
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    arg = []
    for s in range(S):
        M = np.maximum(best[:, None], g[s])
        arg.append(np.argmin(M, axis=0))
        best = M.min(axis=0)
    value = float(best[n])
    if not np.isfinite(value):
        return value, []
    bounds = [n]
    for s in range(S - 1, 0, -1):
        bounds.append(int(arg[s][bounds[-1]]))
    return value, bounds[::-1][:-1]


def splits_below(problem: ScheduleProblem, upper: float, most: int,
                 pairs: list[np.ndarray] | None = None) -> tuple[list[tuple[float, list[int]]], float]:
    """The splits whose bound (``max_s g_s``, :func:`pair_bounds`) is below ``upper`` seconds,
    least bound first, at most ``most`` of them.

    Returns ``(splits, rest)``: ``splits`` a list of ``(bound, starts)``; ``rest`` a lower bound
    on the bound of every split not listed (``upper`` if all are listed; else the least bound
    left out). Counting the splits below a threshold is a DP over boundaries; the threshold is
    lowered by bisection until at most ``most`` remain, then they are listed depth-first
    (boundaries that cannot reach the end below the threshold are never entered)."""
    g = pair_bounds(problem) if pairs is None else pairs
    n, S = problem.n, problem.S

    def count(t):
        c = np.zeros(n + 1)
        c[0] = 1.0
        for s in range(S):
            c = c @ (g[s] < t).astype(float)
        return c[n]

    rest = float(upper)
    if count(rest) > most:
        lo, hi = split_lower_bound(problem, g)[0], rest
        for _ in range(60):  # the least threshold with more than `most` below it
            mid = 0.5 * (lo + hi)
            if count(mid) > most:
                hi = mid
            else:
                lo = mid
        rest = lo
        vals = np.unique(np.concatenate([x[np.isfinite(x)].ravel() for x in g]))
        above = vals[vals >= rest]  # the next pair value is where the count grows past `most`
        rest = float(above[0]) if above.size else rest
    ok = [g[s] < rest for s in range(S)]
    back = np.zeros((S + 1, n + 1), dtype=bool)  # back[s, b]: stages s.. can end at n from b
    back[S, n] = True
    for s in range(S - 1, -1, -1):
        back[s] = (ok[s] & back[s + 1][None, :]).any(axis=1)
    out = []

    def walk(s, b, path, worst):
        if s == S:
            out.append((worst, path[:-1]))
            return
        for c in np.flatnonzero(ok[s][b] & back[s + 1]):
            path.append(int(c))
            walk(s + 1, int(c), path, max(worst, float(g[s][b, c])))
            path.pop()

    if back[0, 0]:
        walk(0, 0, [], 0.0)
    out.sort(key=lambda x: x[0])
    return out[:most], rest
