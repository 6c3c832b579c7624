"""Exact feasibility probes of the partition problem at trial periods T, for long chains.

"Is there a split of period <= T?" -- the question a search over T asks (:mod:`.probe`). The
probes here answer it exactly for the whole cost model (every window row of the 1F1B steady
state, the one-way time of every cut, each stage's memory with its in-flight count) and answer
it for several trial periods at once (one array row per T), in time proportional to the
*frontier* -- the (stage, end unit) states that can still lie on a split of period <= T --
rather than to n^2 S like the dense DP (:mod:`.dp`).

**The recursion** (:func:`pipeopt.cost.rules.window_step`). Stage l of a split holds units
``p_l .. p_{l+1}-1``; the window rows ending at l hold iff ``G_l <= -U_l T`` with
``G_l = w_l + max(-D_l T, G_{l-1} + C_{l-1})`` (w_l the stage's busy time per replica, C the
round trip of the cut before it, D and U its window tokens, :func:`rules.window_tokens`). G
is non-decreasing in ``G_{l-1}``, so keeping, per state, the least G over the partial splits
that meet every row so far is exact (the dense DP's argument).

**Separability.** A stage's busy time is a difference of two prefix terms (the table's
:meth:`PartitionProblem.stage_work`): ``w(i, j) = a[j] - b[i]`` with ``a[j] = W[j] + added[j]``
and ``b[i] = W[i] - added[i]`` (W the prefix sums of compute, plus the all-reduce prefix with
replication; ``added`` the transfer a stage sends without overlap, :attr:`cut_terms`). Hence

    G_s(j) = a[j] + min_{i in window(j)} K_s(i),   K_s(i) = -b[i] + max(-D_s T, G_{s-1}(i) + trip[i]),

a minimum of ``K_s`` over a *window* of starts i: ``i < j`` (non-empty stage) and
``i >= lo_s(j)``, the first start whose stage ending at j fits the memory with the stage's
in-flight count (the stage's memory only grows as it gains units, so the starts that fit form a
suffix, and ``lo_s(j)`` is non-decreasing in j). Both ends of the window move right with j, so
the minima over all j take a prefix minimum (memory not binding), one ``reduceat`` (short
windows) or a sparse table (:func:`window_min`). Each state is then exact: every feasible
predecessor is in its window, every window member is feasible.

**The frontier** (why it is small). A state can lie on a split of period <= T only inside
bounds that relaxations give in O(S) scalar steps:

* one-order space, forward: ``R_s``, the farthest end of stage s. A stage needs
  ``a[j] - b[i] <= T`` and, for a cut, ``bound[j] <= T`` (the one-way transfer). With the
  monotone envelopes ``a_env[j] = min_{j' >= j} a[j']`` and ``b_env[i] = max_{i' <= i} b[i']``,
  ``a_env[j] <= a[j] <= T + b[i] <= T + b_env[R_{s-1}]``, so ``p_{s+1} <= R_s`` := the last
  allowed cut j with ``a_env[j] <= T + b_env[R_{s-1}]`` (by induction on s), capped so that the
  later stages keep one unit each; plus the memory relaxations ``k act(i, j) <= cap`` and
  ``v param(i, j) <= cap``. Backward, symmetrically, ``L_s`` the earliest end.
* replicated-one-order space: the w workers of a prefix do at most ``w T`` of busy time, so its end j has
  ``a_env[j] <= w T`` and the rest ``b_env[j] >= a[n] - (S - w) T`` (telescoping the stages'
  busy times, every ``a[p] - b[p] = 2 added[p] >= 0``).

Only states with ends in ``[L_s, R_s]`` are computed, narrowed further, for trial periods
below one already probed, to the ends that had a finite G there (:attr:`Outcome.band`: G only
grows as T shrinks). Near the optimum the band is the
*slack* ``S T - W[n]`` wide (in units of work): a few hundred units at S = 1,024 on the
synthetic chains of ``benchmarks/partition_scale.py``. Nothing is assumed about the costs'
monotonicity: communication at the cuts, the cut's one-way bound and the window rows are all
exact inside the band.

**Several T at once.** The recursion is vectorised over a column vector of trial periods (the
frontier of the largest, a superset of the others'): a K-way search on T (:mod:`.probe`) takes
about log_{K-1} instead of log_2 probes for little more per stage, the stage loop's Python
overhead being what dominates at S = 1,024.

**Memory use.** O(n) for the arrays over the chain (no n x n matrix) plus, to rebuild the split
of the smallest feasible T, the K values of each frontier state: O(K sum_s |F_s|), the band
above (``stored`` in :attr:`StraightProbe.last`; 61 MB at n = 10^5, S = 1,024 on the benchmark's
chains). The replicated probe: :class:`ReplicatedProbe`.

References
----------
Nicol, Rectilinear partitioning of irregular data parallel computations, JPDC 23 (1994);
Pinar & Aykanat, Fast optimal load balancing algorithms for 1D partitioning, JPDC 64 (2004)
(chains-on-chains: probes on prefix sums and bounds on the separators); Baccelli et al.,
Synchronization and Linearity, 1992 (the window rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...cost import rules
from ...cost.tolerance import SUM_ORDER
from .problem import PartitionProblem

STORE_LIMIT = 1 << 24
"""Keys (floats) the straight probe keeps to rebuild a split, for all its trial periods at once;
beyond, it rebuilds the split by a second pass at the smallest feasible trial period alone,
whose keys are K times fewer (128 MiB at this limit)."""

CHUNK = 1 << 21
"""Array elements (replica counts x trials x starts) the replicated probe handles at once."""

SLACK = SUM_ORDER
"""Relative slack of the frontier bounds (valid supersets despite float rounding); the
states inside are judged by the exact rows, without slack."""


@dataclass
class Outcome:
    """What one probe of trial periods ``T_1 < ... < T_K`` found.

    Attributes
    ----------
    first
        Index of the smallest feasible T (``K`` if none is).
    starts
        Stage starts (after the first) of a split meeting every row at ``T[first]`` (``None`` if
        none is feasible or ``keep`` was False).
    replicas
        Replica count per stage (replicated-one-order space; ``None`` for one-order).
    states
        Frontier states computed (a measure of the work).
    """

    first: int
    starts: list | None = None
    replicas: list | None = None
    states: int = 0
    band: tuple | None = None
    """``(L, R)``: per stage (straight) or per row w (replicated), the first and last end with a
    finite G at ``T[first]``: every partial split that meets the rows at a smaller T ends there
    (G only grows as T shrinks), so a later probe of smaller periods may start from it."""


def window_min(K: np.ndarray, hi: np.ndarray, lo: np.ndarray | None) -> np.ndarray:
    """Minimum of each row of ``K`` over columns ``lo[q] .. hi[q]`` (inclusive) for every query q.

    Parameters
    ----------
    K
        ``(rows, m)`` floats.
    hi
        ``(Q,)`` int, non-decreasing, in ``-1 .. m-1`` (``< lo`` or ``< 0``: empty window).
    lo
        ``(Q,)`` int, non-decreasing, or ``None`` (every window starts at column 0).

    Returns
    -------
    ndarray (rows, Q)
        ``inf`` where the window is empty.
    """
    rows, m = K.shape
    if lo is None or not (lo > 0).any():
        acc = np.minimum.accumulate(K, axis=1)
        out = acc[:, np.maximum(hi, 0)]
        empty = hi < 0  # hi is non-decreasing: a prefix of the queries
    elif int(np.maximum(hi - np.maximum(lo, 0) + 1, 0).sum()) > 4 * m * max(m.bit_length(), 1):
        return _range_min(K[None], lo[None], hi[None])[0].T  # long windows: a sparse table
    else:
        lo = np.maximum(lo, 0)
        empty = hi < lo
        Kx = np.concatenate([K, np.full((rows, 1), np.inf)], axis=1)
        idx = np.empty(2 * hi.size, dtype=np.int64)
        idx[0::2] = np.minimum(lo, m)
        idx[1::2] = np.minimum(np.maximum(hi + 1, idx[0::2] + 1), m)  # column m: the inf sentinel
        out = np.minimum.reduceat(Kx, idx, axis=1)[:, 0::2]
    if hi[0] < 0 or (lo is not None and empty.any()):
        out[:, empty] = np.inf
    return out


class Memory:
    """The memory rule of a stage, read from the problem (:meth:`PartitionProblem.stage_memory`,
    :meth:`PartitionProblem.fits`), answered for many stages at once.

    ``lower_end(k, j, floor)``: for each end j, the first start ``i >= floor`` whose stage
    ``i .. j-1`` keeping k microbatches fits (``j`` if none does). A candidate comes from a
    binary search on the stage's memory as a difference of prefix terms
    (:func:`rules.stage_memory` of the prefix sums) and is then moved by the exact rule itself,
    so the answer is the rule's, not the prefix sums' rounding; with tied parameters (a
    stage-level term, :mod:`pipeopt.cost.ties`) by a bisection on the rule itself.
    """

    def __init__(self, problem: PartitionProblem):
        self.p = problem
        self.finite = math.isfinite(problem.memory)
        self.act = np.asarray(problem.act_prefix, dtype=float)
        self.par = np.asarray(problem.param_prefix, dtype=float)
        self.limit = rules.memory_limit(problem.memory) if self.finite else math.inf
        self.stashing = problem.instance.settings.weight_stashing

    def fits(self, i, j, k) -> np.ndarray:
        p = self.p
        return np.asarray(p.fits(p.stage_memory(i, j, k)))

    def lower_end(self, k: int, j: np.ndarray, floor: int) -> np.ndarray:
        j = np.asarray(j, dtype=np.int64)
        if not self.finite or j.size == 0:
            return np.full(j.shape, floor, dtype=np.int64)
        if self.p.table.ties:  # tied parameters: a stage-level term, so bisect on the rule itself
            lo, hi = np.full(j.shape, floor, dtype=np.int64), np.maximum(j, floor)
            while (lo < hi).any():
                mid = (lo + hi) // 2
                ok = self.fits(mid, j, k)
                hi = np.where(ok, mid, hi)
                lo = np.where(ok, lo, np.minimum(mid + 1, hi))
            return lo
        top = int(j.max())
        v = rules.weight_versions(k, self.stashing)
        pref = rules.stage_memory(self.act[floor:top + 1], self.par[floor:top + 1], k, v)
        i = floor + np.searchsorted(pref, pref[j - floor] - self.limit, side="left")
        i = np.minimum(i, j)
        for _ in range(64):  # the rule moves the candidate by a unit or two at most
            up = (i < j) & ~self.fits(i, j, k)
            down = (i > floor) & self.fits(np.maximum(i - 1, floor), j, k) & ~up
            if not (up.any() or down.any()):
                break
            i = i + up - down
        return i

    def first_start(self, k: int, j: int, floor: int = 0) -> int:
        """The first start ``i >= floor`` whose stage ``i .. j-1`` keeping k microbatches fits
        (``j`` if not even unit ``j - 1`` fits): a scalar bisection on the rule itself."""
        if not self.finite:
            return floor
        lo, hi = floor, j  # the empty stage at j fits
        while lo < hi:
            mid = (lo + hi) // 2
            if bool(self.fits(mid, j, k)):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def reach_bounds(self, k: int):
        """Relaxed reach of a stage keeping k microbatches: its activations alone
        (``k act <= cap``) and its parameters alone (``v param <= cap``) must fit; returns the
        two byte budgets (with :data:`SLACK`), ``inf`` without a memory limit."""
        if not self.finite:
            return math.inf, math.inf
        v = rules.weight_versions(k, self.stashing)
        grow = self.limit * (1 + SLACK)
        return (grow / k if k > 0 else math.inf), (grow / v if v > 0 else math.inf)


class StraightProbe:
    """Exact "period <= T?" for the one-order space (one worker per stage, exactly S stages).

    Parameters
    ----------
    problem
        A straight :class:`PartitionProblem` with the ``bottleneck`` objective.

    The module docstring gives the recursion, the frontier and the proof. :meth:`run` probes a
    vector of trial periods; ``last`` records the frontier size and the states stored.
    """

    def __init__(self, problem: PartitionProblem):
        self.p = problem
        n, S = problem.n, problem.stages
        self.n, self.S = n, S
        W = self.W = np.asarray(problem.work_prefix, dtype=float)
        added, bound = problem.cut_terms
        self.bound = np.asarray(bound, dtype=float)
        self.trip = np.asarray(problem.trip, dtype=float)
        self.a = W + added  # stage_work(i, j) = a[j] - b[i]
        self.b = W - added
        self.a_env = np.minimum.accumulate(self.a[::-1])[::-1]
        self.b_env = np.maximum.accumulate(self.b)
        self.k = np.array([problem.in_flight(s) for s in range(S)], dtype=np.int64)
        self.D, self.U = rules.window_tokens(self.k, np.ones(S), np.zeros(S, dtype=bool))
        self.mem = Memory(problem)
        self.index = np.arange(n + 1)
        self.last: dict = {}

    def memory_split(self) -> list[int] | None:
        """A split that fits memory, or ``None`` if none does (a proof).

        Backward greedy: the last stage starts as early as its memory allows, then the one
        before it, and so on (each stage at least one unit, stage s starting at unit >= s).
        Exact for "does any split fit?": an earlier stage keeps more microbatches in flight, so
        a unit that fits a stage fits every later one, and by induction on s (from S down) the
        greedy's start ``g_s`` is at most the start ``p_s`` of any split that fits -- so
        ``g_0 = 0`` whenever some split fits.
        """
        S, n = self.S, self.n
        g = [n]
        for s in range(S - 1, -1, -1):
            j = g[-1]
            i = max(self.mem.first_start(int(self.k[s]), j), s)
            if i >= j:
                return None
            g.append(i)
        if g[-1] != 0:
            return None
        return g[::-1][1:-1]

    def lower_bound(self) -> float:
        """A valid lower bound on the optimum, seconds: the window row over every stage
        (``sum w / S >= W[n] / S``) and the unit of most work (its stage busies at least it)."""
        W = self.W
        return float(max(W[-1] / self.S, np.diff(W).max(initial=0.0)))

    def balanced_split(self) -> list[int]:
        """Cuts at equal shares of the compute (stage s ends near ``(s + 1) W[n] / S``), made
        strictly increasing: a start for the search."""
        W, S, n = self.W, self.S, self.n
        cuts = np.searchsorted(W, np.arange(1, S) * W[-1] / S)
        lo, hi = np.arange(1, S), n - S + np.arange(1, S)
        cuts = np.maximum.accumulate(np.clip(cuts, lo, hi) - lo) + lo
        return [int(c) for c in np.minimum(cuts, hi)]

    def fits(self, starts) -> bool:
        """True if every stage of the split fits its worker's memory."""
        if not self.mem.finite:
            return True
        p = np.array([0, *starts, self.n])
        return bool(self.mem.fits(p[:-1], p[1:], self.k).all())

    # ---- the band of ends each stage can have ----------------------------------------------
    def band(self, T: float):
        """``(L, R, allowed)``: earliest and latest end of each stage over the splits that pass
        the relaxations at T, and the cuts whose one-way transfer is <= T; ``None`` if the band
        is empty (then no split has period <= T: a proof)."""
        n, S = self.n, self.S
        Tx = T * (1 + SLACK)
        allowed = self.bound <= Tx
        allowed[0] = allowed[n] = True
        idx = np.arange(n + 1)
        last_ok = np.maximum.accumulate(np.where(allowed, idx, -1))
        first_ok = np.minimum.accumulate(np.where(allowed, idx, n + 1)[::-1])[::-1]
        a_env, b_env = self.a_env, self.b_env
        mem = self.mem
        act, par = mem.act, mem.par
        R = np.empty(S, dtype=np.int64)
        cur = 0
        for s in range(S):
            x = int(a_env.searchsorted(b_env[cur] + Tx, "right")) - 1
            if mem.finite:
                ca, cp = mem.reach_bounds(int(self.k[s]))
                x = min(x, int(act.searchsorted(act[cur] + ca, "right")) - 1,
                        int(par.searchsorted(par[cur] + cp, "right")) - 1)
            x = min(x, n - (S - 1 - s))
            x = int(last_ok[x]) if x >= 0 else -1
            if x < s + 1:  # s + 1 non-empty stages cannot end before unit s + 1
                return None
            R[s] = cur = x
        if R[S - 1] != n:
            return None
        L = np.empty(S, dtype=np.int64)
        L[S - 1] = cur = n
        for s in range(S - 1, 0, -1):
            x = int(b_env.searchsorted(a_env[cur] - Tx, "left"))
            if mem.finite:
                ca, cp = mem.reach_bounds(int(self.k[s]))
                x = max(x, int(act.searchsorted(act[cur] - ca, "left")),
                        int(par.searchsorted(par[cur] - cp, "left")))
            x = max(x, s)
            x = int(first_ok[x]) if x <= n else n + 1
            if x > R[s - 1]:
                return None
            L[s - 1] = cur = x
        return L, R, allowed

    def _lower_ends(self, L: np.ndarray, R: np.ndarray) -> list:
        """Per stage s, for its ends ``L[s] .. R[s]``: the first start (at or after the previous
        stage's first end) whose stage fits memory (:meth:`Memory.lower_end`)."""
        floors = np.concatenate([[0], L[:-1]])
        return [self.mem.lower_end(int(self.k[s]), self.index[L[s]:R[s] + 1], int(floors[s])) for s in range(self.S)]

    def band_empty(self, T: float) -> bool:
        """True if no split passes the relaxations at T (so none has period <= T), O(S)."""
        return self.band(T) is None

    # ---- the probe ---------------------------------------------------------------------------
    def run(self, periods, *, keep: bool = True, deadline=None, within=None) -> Outcome:
        """Probe the trial periods ``periods`` (ascending) at once.

        Parameters
        ----------
        periods
            ``(K,)`` seconds, ascending.
        keep
            Rebuild the split of the smallest feasible T (stores the frontier's keys).
        deadline
            Checked every 64 stages (:class:`~pipeopt.backends.deadline.Deadline` or None).
        within
            ``Outcome.band`` of an earlier probe at a period >= every one of ``periods`` (or
            None): the ends to consider are narrowed to it.

        Returns
        -------
        Outcome
        """
        Ts = np.asarray(periods, dtype=float)
        nT = Ts.size
        n, S = self.n, self.S
        band = self.band(float(Ts[-1]))
        if band is None:
            return Outcome(nT)
        L, R, _ = band
        if within is not None:
            L, R = np.maximum(L, within[0]), np.minimum(R, within[1])
            if (L > R).any():
                return Outcome(nT)
        col = Ts[:, None]
        aT = np.where(self.bound[None, :] <= col, self.a[None, :], np.inf)
        aT[:, 0] = self.a[0]
        aT[:, n] = self.a[n]
        b, trip, mem = self.b, self.trip, self.mem
        lows = self._lower_ends(L, R) if mem.finite else None
        G = np.full((nT, 1), -np.inf)
        pl = pr = 0
        store: list | None = []
        states = peak = 0
        for s in range(S):
            if deadline is not None and s % 64 == 0:
                deadline.check(f"probe, stage {s}")
            Ks, _ = rules.window_step(G, trip[pl:pr + 1], -b[pl:pr + 1], self.D[s], self.U[s], col)
            lo_, hi_ = int(L[s]), int(R[s])
            j = self.index[lo_:hi_ + 1]
            hi = np.minimum(j, pr + 1) - (pl + 1)  # last start: j - 1, within the previous band
            lo = lows[s] - pl if lows is not None else None
            best = window_min(Ks, hi, lo)
            Gs = aT[:, lo_:hi_ + 1] + best
            G = np.where(Gs <= -self.U[s] * col, Gs, np.inf)
            if store is not None and keep:
                store.append((pl, Ks))
                peak += Ks.size
                if nT > 1 and peak > STORE_LIMIT:  # keep one trial period's keys instead (rerun below)
                    store, peak = None, 0
            states += j.size
            pl, pr = lo_, hi_
            if s % 16 == 15 and not (G[-1] < np.inf).any():
                self.last = {"states": states, "stored": peak, "died": s}
                return Outcome(nT, states=states)
        ok = np.flatnonzero(G[:, -1] < np.inf)
        self.last = {"states": states, "stored": peak}
        if not ok.size:
            return Outcome(nT, states=states)
        f = int(ok[0])
        if not keep:
            return Outcome(f, states=states)
        if store is None:  # the keys of every trial period outgrew STORE_LIMIT: rebuild at T[f] alone
            again = self.run(Ts[f:f + 1], keep=True, deadline=deadline, within=(L, R))
            self.last["stored"] = None
            return Outcome(f, again.starts, None, states + again.states, again.band)
        fin = [np.flatnonzero(Ks[f] < np.inf) for _, Ks in store[1:]]
        first = np.array([pls + x[0] for (pls, _), x in zip(store[1:], fin)] + [n])
        last = np.array([pls + x[-1] for (pls, _), x in zip(store[1:], fin)] + [n])
        starts = []
        jj = n
        for s in range(S - 1, 0, -1):
            pls, Ks = store[s]
            lo = max(pls, int(lows[s][jj - int(L[s])])) if lows is not None else pls
            hi = min(jj - 1, pls + Ks.shape[1] - 1)
            i = lo + int(np.argmin(Ks[f, lo - pls:hi - pls + 1]))
            starts.append(i)
            jj = i
        return Outcome(f, starts[::-1], None, states, (first, last))


def _range_min(K: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``min K[m, t, lo[m, q] .. hi[m, q]]`` for every row m, trial t and query q (a sparse table
    over the last axis), shape ``(rows, queries, trials)``; ``inf`` where ``hi < lo``."""
    rows, _, width = K.shape
    lo = np.maximum(lo, 0)
    length = np.maximum(hi - lo + 1, 1)
    lvl = np.floor(np.log2(length)).astype(np.int64)
    top = int(lvl.max(initial=0))
    # table[l, ..., i] = min K[..., i .. i + 2^l - 1], valid for i <= width - 2^l (all a query reads)
    table = np.empty((top + 1, *K.shape))
    table[0] = K
    for level in range(1, top + 1):
        span = 1 << (level - 1)
        np.minimum(table[level - 1, ..., : width - span], table[level - 1, ..., span:],
                   out=table[level, ..., : width - span])
    r = np.arange(rows)[:, None]
    lo_c = np.clip(lo, 0, width - 1)
    hi_c = np.clip(hi - (1 << lvl) + 1, 0, width - 1)
    out = np.minimum(table[lvl, r, :, lo_c], table[lvl, r, :, hi_c])
    out[hi < lo] = np.inf
    return out


class ReplicatedProbe:
    """Exact "period <= T?" for the replicated-one-order space (PipeDream: stages on m_s workers each,
    ``sum m_s = S``), over states (workers used w, end unit j).

    A stage of units ``i .. j-1`` on m replicas taking the prefix from ``w - m`` to ``w`` workers
    keeps ``k = ceil((S - w + m) / m)`` microbatches per replica (:func:`rules.in_flight`), has
    window tokens ``(D, U) = (k m, (k - 1) m)`` (:func:`rules.window_tokens`) and busy time
    ``a_m[j] - b_m[i]`` (its compute, the all-reduce share of m replicas and, without overlap,
    its sends: :meth:`PartitionProblem.stage_work`). The recursion of the module docstring then
    reads, per target w and for every m at once (arrays ``(m, trial, start)``),

        G(w, j) = min_m [a_m[j] + min_{i in window} K_{w,m}(i)],
        K_{w,m}(i) = -b_m[i] + max(-D T, G(w - m, i) + trip[i]),

    kept where ``G <= -U T``, the cut's one-way transfer over the stage's m links is <= T at both
    ends (``bound / m``) and the stage fits memory (:meth:`PartitionProblem.memory_reach` of its
    k, the dense DP's own rule). The band of ends of row w is ``a_env[j] <= w T`` and
    ``b_env[j] >= a[n] - (S - w) T`` (module docstring). O(S) rows, each O(w K width) work;
    memory O(n) for the arrays over the chain, O(S K width) for G and O(S width) per row for the
    window keys (the per-replica-count terms are taken at the band's units only), plus, with a
    memory limit, one lower-end array per in-flight count (O(n S) at most).
    """

    def __init__(self, problem: PartitionProblem):
        self.p = problem
        n, S = problem.n, problem.stages
        self.n, self.S = n, S
        W = self.W = np.asarray(problem.work_prefix, dtype=float)
        added, bound = problem.cut_terms
        self.bound = np.asarray(bound, dtype=float)
        self.trip = np.asarray(problem.trip, dtype=float)
        self.a1 = W + added
        self.b1 = W - added
        self.a_env = np.minimum.accumulate(self.a1[::-1])[::-1]
        self.b_env = np.maximum.accumulate(self.b1)
        self.param = np.asarray(problem.param_prefix, dtype=float)
        self.bus_bandwidth = float(problem.bus_bandwidth)  # the replicas' all-reduce
        self.memory = math.isfinite(problem.memory)
        self._lo: dict = {}
        self.last: dict = {}

    def allreduce(self, m, pos) -> np.ndarray:
        """The all-reduce prefix of m replicas at units ``pos`` (:meth:`CostTable.allreduce_prefix`:
        :func:`rules.allreduce_time` of the parameter prefix sums), so that ``a_m = a_1 + it``
        and ``b_m = b_1 + it``; taken where needed, never as an S x n table."""
        return rules.allreduce_time(self.param[pos], m, self.bus_bandwidth)

    def tokens(self, w: int, m: np.ndarray):
        """In-flight k, and window tokens D, U of a stage on m replicas ending at w workers."""
        k = rules.in_flight(0, 0, workers_after=self.S - w + m, replicas=m)
        D, U = rules.window_tokens(k, m, np.zeros(m.size, dtype=bool))
        return k, D, U

    def lower_ends(self, k: int) -> np.ndarray:
        """``lo[j]``: the first start whose stage ending at j keeping k microbatches fits
        (from :meth:`PartitionProblem.memory_reach`, non-decreasing)."""
        if k not in self._lo:
            reach = self.p.memory_reach(k)
            self._lo[k] = np.searchsorted(reach, np.arange(self.n + 1), side="left")
        return self._lo[k]

    def band(self, T: float):
        """``(L, R)`` per row w = 0..S (``L > R``: no prefix uses exactly w workers)."""
        n, S = self.n, self.S
        Tx = T * (1 + SLACK)
        w = np.arange(S + 1)
        R = np.searchsorted(self.a_env, self.b1[0] + w * Tx, side="right") - 1
        R = np.minimum(R, np.where(w < S, n - 1, n))
        L = np.searchsorted(self.b_env, self.a1[n] - (S - w) * Tx, side="left")
        L = np.maximum(L, np.minimum(w, 1))
        L[0], R[0] = 0, 0
        L[S] = n  # the last row ends the chain (a1[n] - b1[n] is the stage overhead, not work left)
        return L, R

    def band_empty(self, T: float) -> bool:
        """True if no split passes the relaxations at T (the last row's band is empty)."""
        L, R = self.band(T)
        return bool(L[self.S] > R[self.S])

    def _stage(self, w: int, m: np.ndarray, src: np.ndarray, j: np.ndarray, Ts: np.ndarray, G: np.ndarray,
               L: np.ndarray, R: np.ndarray):
        """The last stage of the prefixes on w workers ending at units ``j``, on each replica count
        of ``m`` (sources ``src = w - m``): the least G over m and start per (end, trial) and the m
        that gives it, arrays ``(j, trial)``."""
        n = self.n
        k, D, U = self.tokens(w, m)
        span = int((R[src] - L[src]).max()) + 1
        pos = L[src][:, None] + np.arange(span)[None, :]
        valid = pos <= R[src][:, None]
        pos = np.minimum(pos, n)
        b_m = self.b1[pos] + self.allreduce(m[:, None], pos)
        Ks, _ = rules.window_step(G[src, :, :span], self.trip[pos][:, None, :], -b_m[:, None, :],
                                  D[:, None, None], U[:, None, None], Ts[None, :, None])
        link_bad = (self.bound[pos] / m[:, None])[:, None, :] > Ts[None, :, None]
        Ks[link_bad | ~valid[:, None, :]] = np.inf
        hi = np.minimum(R[src][:, None], j[None, :] - 1) - L[src][:, None]
        best = None
        if self.memory:
            lo = np.stack([self.lower_ends(int(x))[j] for x in k]) - L[src][:, None]
            if (lo > 0).any():
                best = _range_min(Ks, lo, hi)
        if best is None:  # every window runs from the source band's start to hi
            best = np.empty((m.size, j.size, Ts.size))
            full = R[src] < j[0]  # the whole source band precedes every end: one minimum
            if full.any():
                best[full] = Ks[full].min(axis=2)[:, None, :]
            part = ~full
            if part.any():
                acc = np.minimum.accumulate(Ks[part], axis=2)
                hp = hi[part]
                sub = acc[np.arange(hp.shape[0])[:, None], :, np.maximum(hp, 0)]
                sub[hp < 0] = np.inf
                best[part] = sub
        a_m = self.a1[j][None, :] + self.allreduce(m[:, None], j[None, :])
        cand = a_m[:, :, None] + best  # (m, j, trial)
        bad = (cand > -(U[:, None, None] * Ts[None, None, :])) | \
            ((self.bound[j][None, :] / m[:, None])[:, :, None] > Ts[None, None, :])
        cand[bad] = np.inf
        pick = np.argmin(cand, axis=0)  # (j, trial)
        return np.take_along_axis(cand, pick[None], axis=0)[0], m[pick]

    def run(self, periods, *, keep: bool = True, deadline=None, within=None) -> Outcome:
        """Probe the trial periods ``periods`` (ascending) at once (see :meth:`StraightProbe.run`)."""
        Ts = np.asarray(periods, dtype=float)
        nT = Ts.size
        n, S = self.n, self.S
        L, R = self.band(float(Ts[-1]))
        if within is not None:
            L, R = np.maximum(L, within[0]), np.minimum(R, within[1])
        if L[S] > R[S]:
            return Outcome(nT)
        width = int(np.maximum(R - L + 1, 0).max())
        G = np.full((S + 1, nT, width), np.inf)
        G[0, :, 0] = -np.inf
        arg: dict = {}
        states = 0
        alive = np.zeros(S + 1, dtype=bool)  # rows with a finite G
        alive[0] = True
        for w in range(1, S + 1):
            if deadline is not None and w % 16 == 0:
                deadline.check(f"probe, row {w}")
            if L[w] > R[w]:
                continue
            m = np.arange(1, w + 1)
            src = w - m
            live = (L[src] <= R[src]) & alive[src]
            m, src = m[live], src[live]
            if not m.size:
                continue
            j = np.arange(L[w], R[w] + 1)
            span = int((R[src] - L[src]).max()) + 1
            size = max(1, CHUNK // (nT * max(span, j.size)))  # replica counts per block: bounded arrays
            value = np.full((j.size, nT), np.inf)
            pick = np.zeros((j.size, nT), dtype=np.int64)
            for c in range(0, m.size, size):
                v, p_ = self._stage(w, m[c:c + size], src[c:c + size], j, Ts, G, L, R)
                better = v < value
                value = np.where(better, v, value)
                pick = np.where(better, p_, pick)
            G[w, :, : j.size] = value.T
            alive[w] = bool((value < np.inf).any())
            if keep:
                arg[w] = pick
            states += j.size * m.size
        ok = np.flatnonzero(G[S, :, 0] < np.inf)
        self.last = {"states": states, "width": width}
        if not ok.size:
            return Outcome(nT, states=states)
        f = int(ok[0])
        if not keep:
            return Outcome(f, states=states)
        fin = G[:, f, :] < np.inf
        has = fin.any(axis=1)
        first = np.where(has, L + np.argmax(fin, axis=1), n + 1)
        last = np.where(has, L + width - 1 - np.argmax(fin[:, ::-1], axis=1), -1)
        T = Ts[f]
        starts, reps = [], []
        w, jj = S, n
        while w > 0:
            mm = int(arg[w][jj - L[w], f])
            s = w - mm
            k, D, U = self.tokens(w, np.array([mm]))
            lo = max(int(L[s]), int(self.lower_ends(int(k[0]))[jj]) if self.memory else 0)
            hi = min(int(R[s]), jj - 1)
            i = np.arange(lo, hi + 1)
            Ki, _ = rules.window_step(G[s, f, i - L[s]], self.trip[i], -(self.b1[i] + self.allreduce(mm, i)), D[0], U[0],
                                      T)
            Ki = np.where(self.bound[i] / mm > T, np.inf, Ki)
            ii = int(i[np.argmin(Ki)])
            reps.append(mm)
            if ii > 0:
                starts.append(ii)
            w, jj = s, ii
        return Outcome(f, starts[::-1], reps[::-1], states, (first, last))

    def lower_bound(self) -> float:
        """A valid lower bound, seconds: the S workers do at least the whole compute,
        ``W[n] / S`` (the window row over all stages)."""
        return float(self.W[-1] / self.S)
