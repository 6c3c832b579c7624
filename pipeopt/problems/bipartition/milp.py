"""Exact methods of the Bi-Partition problem: a MILP (PuLP) and the memory relaxation by bisection.

Both methods read the model of :mod:`pipeopt.problems.bipartition.problem` from the problem
object (its :class:`~pipeopt.cost.CostTable` and :mod:`pipeopt.cost.rules`), draw every step
from one :class:`~pipeopt.backends.deadline.Deadline` created at entry, and report a status
that is proven (see *Claims* below). The objective is the time per microbatch of the steady
state of 1F1B, window rows included (:func:`pipeopt.cost.rules.steady_period`, the
``bottleneck`` :func:`pipeopt.evaluate` reports): both methods optimise exactly that value.

The MILP (:func:`solve_milp`, :func:`build_model`)
--------------------------------------------------
Stages i = 0..S-1, cuts c = 0..S-2, units u = 0..n-1:

* ``p[c, u] = 1`` iff unit u runs its forward pass on a stage <= c (a staircase:
  ``p[c, u] >= p[c, u+1]``, ``p[c, u] <= p[c+1, u]``); the forward cut is
  ``a_c = sum_u p[c, u]`` and ``a_{c+1} >= a_c + 1`` keeps every stage non-empty. ``q[c, u]``
  is the same for the backward pass. Stage i holds unit u in the forward pass iff
  ``p[i, u] - p[i-1, u] = 1`` (``p[-1] = 0``, ``p[S-1] = 1``), so loads are linear:
  ``load_i = sum_u fwd_u (p[i,u] - p[i-1,u]) + bwd_u (q[i,u] - q[i-1,u])``.
* Seconds of the edges crossing the forward split at cut c:
  ``sum_j transfer(boundary_bytes_j) (p[c, j-1] - p[c, j])`` (the indicator of ``a_c = j``);
  the same with q.
* Migrations at cut c (:func:`pipeopt.cost.rules.migration_bytes`; the migrated activation
  is the unit's input, :attr:`BipartitionProblem.migrated
  <pipeopt.problems.bipartition.problem.BipartitionProblem.migrated>`): the units between the
  two cuts are those with ``p[c,u] != q[c,u]``, one interval, so
  ``sum_u act_u |p - q| = |sum_u act_u (p - q)|``; four non-negative variables bound the
  positive and negative parts of ``sum act (p - q)`` and ``sum param/M (p - q)`` from below
  (exact at the optimum, since they only raise T). ``x_c`` / ``y_c``: the seconds of the
  forward / backward bytes of cut c.
* Overlap: ``T >= load_i``, ``T >= x_c`` and ``T >= y_c`` (full-duplex links), and the
  **window rows** for every ``i < l``:
  ``sum_{s=i..l} load_s + sum_{c=i..l-1} (x_c + y_c) <= (l - i + 1) T``. The loads telescope
  (``sum_{s=i..l} load_s = E_l - E_{i-1}``, ``E_c`` the forward and backward work of stages
  0..c, linear in p and q), so with one variable per ``E_c`` and per round trip each of the
  O(S^2) rows has O(S) terms (:func:`_window_rows`). Without overlap
  ``T >= load_i + sends_i`` (the window rows are then implied). The max of these rows is
  :func:`rules.steady_period <pipeopt.cost.rules.steady_period>` of the plan, so the model's
  optimum is the problem's.
* Memory (finite capacity only): ``h[u, i] >=`` the forward and backward indicators (the
  union), :func:`rules.stage_memory` of the backward activations and the union's weights
  (scaled so that the capacity is :data:`MODEL_UNIT`) <= :func:`rules.memory_limit` (the
  slack of :func:`rules.fits`: the model relaxes memory, never tightens it; the plan is
  re-checked by :func:`pipeopt.evaluate`).
* ``max_shift``: ``|sum_u p[c,u] - sum_u q[c,u]| <= max_shift``.

Times are scaled so that the incumbent's bottleneck is :data:`MODEL_UNIT` (1000), memory so
that the capacity is 1000: the solvers' absolute tolerances are then negligible. The model is
capped by the incumbent (``T <= U (1 + 1e-6)``) and floored by the best bound known
(``T >= L (1 - 1e-6)``); with ``dp_bound`` the cut positions are also
restricted to the states the memory relaxation can reach and complete at ``T <= U``
(:meth:`_Relaxation.windows`): every plan with a bottleneck <= U lies inside them, so the
model keeps the optimum. The incumbent is handed to the solver as a MIP start. The solve goes
through :func:`pipeopt.backends.pulp.solve_pulp` (CBC in a child process ended at the
deadline, or HiGHS).

The memory relaxation (:func:`relaxation_optimum`, method :func:`solve_bisection`)
-------------------------------------------------------------------------------
Without the memory limit the problem has an exact O(S n^2) feasibility test for a given T:
a stage from states ``(a, b)`` to ``(a', b')`` is busy ``G(a', b') - H(a, b)`` with G and H
depending on one end each (loads are differences of prefix sums, and each cut's transfers
depend on its own two positions only), and the window rows ending at a stage hold iff the
stage's window slack ``V' = G - T - max [H - max(0, V + C)]`` (V the slack of the previous
stage, C the cut's round trip) is <= 0; the least slack per state dominates, so the states
reached follow from a 2-D prefix maximum (:class:`_Relaxation`). The one bisection on T
(:func:`pipeopt.backends.bisection.bisect`) over that
exact probe gives the relaxation's optimum; if its plan fits in memory it is optimal for the
problem, and in any case its lower end bounds the problem from below. The probes after the
first two look only inside the boxes of the states a plan as good as the start can pass
through (:class:`_Relaxation`), which makes them cheap.

Ties
----
Once a plan is proven optimal, both methods hand it to the tie-break
(:func:`pipeopt.problems.bipartition.tiebreak.break_ties`): among the plans of period at most
the proven one, the least 1F1B-flush iteration time of M microbatches (the partition problem's
secondary objective), by the event-time MILP over the model's rows (:mod:`.model`) within the
relaxation's windows at the cap; ``info["secondary"]`` says whether it was proven. The MILP's
rows are written in :mod:`.model` (:func:`~pipeopt.problems.bipartition.model.build_model`).

Claims
------
* ``InfeasibleError`` only when no same-cut plan fits (the exact partition DP proves it): the
  backward split fixes the activation memory and ``a = b`` needs the fewest weights, so then
  no plan fits at all.
* ``lower_bound`` (seconds) is at most the true optimum: the simple bound, the largest T the
  relaxation probe rejected (the probe accepts a relative 1e-12 and a few float roundings of
  the prefix sums above T, so a rejection is a proof), and the solver's proven dual bound of
  the capped model (when the solver says optimal: its incumbent less the gap it was allowed;
  in any case less a relative :data:`SOLVER_SLACK` = 1e-8 for its tolerances).
* Status ``OPTIMAL`` iff the returned plan fits and its objective is within the relative
  tolerance ``gap`` of that bound (``info["gap_tolerance"]``); otherwise ``TIME_LIMIT`` if the
  deadline passed, else ``FEASIBLE`` (e.g. the relaxation's plan breaks memory and no MILP was
  run, or the solver's plan broke memory by its tolerance).
* At the time limit every step stops where it is (the DP between stages, the bisection
  inside a probe, the model building between rows, the solver by the door's kill): the result
  has the best plan found, which is at worst the best same-cut plan, and the best bound. A
  method returns within ``max(limit + 1 s, 1.1 limit)`` (CBC is ended
  :func:`~pipeopt.backends.pulp.kill_grace` after the deadline; writing the model for the
  solver is skipped when too little time is left for it).

References
----------
Cui et al., *Bi-Partition*, Journal of Cloud Computing (Springer) -- the problem.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ...lazy import lazy_module
from ...backends.bisection import FEASIBLE, INFEASIBLE, UNKNOWN, Probe, bisect
from ...backends.deadline import Deadline, DeadlineReached
from ...backends.pulp import SOLVERS, solve_pulp
from ...cost import rules
from ...cost.tolerance import FLOAT_NOISE, SOLVER_CLAIM, SUM_ORDER
from ...errors import InfeasibleError, InvalidPlanError, InvalidProblemError
from ...result import Result, Status
from ..secondary import CAP_REL
from .greedy import best_same_cut
from .model import MODEL_UNIT, SOLVER_SLACK, build_model, cuts_of_rows, start_of_rows
from .problem import BipartitionProblem
from .tiebreak import SECONDARY, break_ties

pulp = lazy_module("pulp")

MILP_GAP = SOLVER_CLAIM
"""Default relative tolerance of the MILP's optimality claim (above the solvers' feasibility
tolerances; the solver itself is asked for a tenth of it)."""
BISECTION_GAP = SUM_ORDER
"""Default relative tolerance of the bisection's optimality claim (the bracket is closed to a
tenth of it)."""
CAP_MARGIN = 1e-6
"""Relative margin of the model's caps on T around the incumbent and the bound (a window as
narrow as the solvers' tolerances makes them report the model infeasible)."""
_EPS = np.finfo(float).eps


def _check_gap(gap: float) -> float:
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not 0 < gap < 1:
        raise InvalidProblemError(f"bipartition: gap must be a number in (0, 1), got {gap!r}")
    return float(gap)


# ---- the memory relaxation, solved exactly by bisection on T ------------------------------------


class _Relaxation:
    """Feasibility of a period T for the Bi-Partition problem without its memory limit.

    A state ``(a, b)`` is the start of a stage in the forward and the backward pass. Stage i
    from ``(a, b)`` to ``(a', b')`` (``a < a'``, ``b < b'``) is busy
    ``w_i = G_i(a', b') - H_i(a, b)`` per microbatch, with ``G_i = Fp[a'] + Bp[b'] (+ forward
    sends at the cut after, without overlap)`` and ``H_i = Fp[a] + Bp[b] (- backward sends at
    the cut before)``. The steady state's rows (:func:`rules.steady_period
    <pipeopt.cost.rules.steady_period>`, no replication: stages i..l span ``l - i + 1``
    microbatches) hold iff every cut direction takes at most T (overlap), the cuts respect
    ``max_shift``, and the **window slack** stays <= 0 at every stage:

        ``V_l = w_l - T + max(0, V_{l-1} + C_{l-1})``, ``V_{-1} = -inf``

    (``V_l`` is the largest ``sum_{s=i..l} w_s + sum_{c=i..l-1} C_c - (l - i + 1) T`` over
    i, :func:`rules.window_step <pipeopt.cost.rules.window_step>` shifted by ``U_l T``; C the
    cut's round trip :func:`rules.round_trip <pipeopt.cost.rules.round_trip>` with overlap, 0
    without, where the window rows are implied by the stages' own). ``V_l`` depends on the
    plan's past only through the state at the end of stage l, and a smaller one is better for
    every later stage, so keeping the least ``V`` per state is exact:

        ``V'(a', b') = G_i(a', b') - T - max_{(a, b) < (a', b')} [H_i(a, b) - max(0, V(a, b) + C(a, b))]``

    a 2-D prefix maximum over the states reached after i stages: O(S n^2) per value of T
    (:meth:`reach`; backward from the end, the mirror recursion with a suffix minimum).

    The float test is made at ``T + slack(T)`` (:meth:`relaxed`): a relative 1e-12 plus a few
    roundings of the prefix sums, so that a plan whose evaluated period is <= T is never
    rejected.

    **Boxes.** After :meth:`restrict` ``(T0)`` every test at ``T <= T0`` looks only at the
    states of each stage boundary inside the bounding box of the states some plan of
    period <= T0 passes through (:meth:`windows`): every plan of period <= T lies in
    them, so the tests stay exact, and near the optimum the boxes are small (tens of units
    wide on 1000-unit chains), which makes a test cost little.
    """

    def __init__(self, problem: BipartitionProblem):
        self.p = problem
        n, S, bw = problem.n, problem.stages, problem.bandwidth
        x = np.arange(n + 1)
        fwd_b, bwd_b = problem.cut_bytes(x[:, None], x[None, :])
        base = problem.fwd_prefix[:, None] + problem.bwd_prefix[None, :]
        if problem.overlap:
            self.G_mid = self.G_last = self.H_first = self.H_mid = base
            self.comm = rules.cut_time(fwd_b, bwd_b, bw)  # the busier direction (full duplex)
            self.trip = rules.round_trip(fwd_b, bwd_b, bw)  # what a cut adds to the window rows
        else:  # a stage pays its forward sends at the cut after it, its backward sends at the cut before
            self.G_mid, self.G_last = base + rules.transfer_time(fwd_b, bw), base
            self.H_first, self.H_mid = base, base - rules.transfer_time(bwd_b, bw)
            self.comm = self.trip = None  # nothing on the links: the window rows are implied
        self.mask = None
        if problem.max_shift is not None:
            self.mask = np.abs(x[:, None] - x[None, :]) <= problem.max_shift
        finite = [np.abs(g[np.isfinite(g)]).max(initial=0.0) for g in (self.G_mid, self.H_mid)]
        self.scale = max(finite)  # size of the prefix sums, for the rounding slack
        self.full = [(0, 0, 0, 0), *[(0, n, 0, n)] * (S - 1), (n, n, n, n)]
        self.boxes, self.box_T = self.full, math.inf

    def G(self, i: int, box) -> np.ndarray:
        g = self.G_last if i == self.p.stages - 1 else self.G_mid
        return g[box[0] : box[1] + 1, box[2] : box[3] + 1]

    def H(self, i: int, box) -> np.ndarray:
        h = self.H_first if i == 0 else self.H_mid
        return h[box[0] : box[1] + 1, box[2] : box[3] + 1]

    def carry(self, V: np.ndarray, box) -> np.ndarray:
        """``max(0, V + C)`` over the states of ``box``: what the window rows ending at a stage
        carry into the next one (0 without overlap, where ``V <= 0`` on every reached state)."""
        if self.trip is None:
            return np.zeros_like(V)
        with np.errstate(invalid="ignore"):
            return np.maximum(V + self.trip[box[0] : box[1] + 1, box[2] : box[3] + 1], 0.0)

    def relaxed(self, T: float) -> float:
        """The limit the float test uses for T: ``T (1 + 1e-12) + 64 eps scale`` (see the class)."""
        return T * (1 + FLOAT_NOISE) + 64 * _EPS * self.scale

    def _boxes(self, T: float) -> list[tuple[int, int, int, int]]:
        """Per stage boundary 0..S, ``(a_lo, a_hi, b_lo, b_hi)``: where the states may be at T."""
        return self.boxes if T <= self.box_T else self.full

    def _cut_ok(self, T: float, box) -> np.ndarray:
        """Cut positions in ``box`` that respect ``max_shift``, take <= T and leave units after."""
        n = self.p.n
        sl = (slice(box[0], box[1] + 1), slice(box[2], box[3] + 1))
        ok = np.ones((box[1] - box[0] + 1, box[3] - box[2] + 1), dtype=bool) if self.mask is None \
            else self.mask[sl].copy()
        if self.comm is not None:
            ok &= self.comm[sl] <= T
        if box[1] == n:
            ok[-1, :] = False
        if box[3] == n:
            ok[:, -1] = False
        return ok

    @staticmethod
    def _shift(lo: int, hi: int, src_lo: int, src_hi: int, step: int) -> tuple[int, int, int]:
        """For the indices ``x + step``, x in ``lo..hi``, clipped into ``src_lo..src_hi``: the number
        of leading x outside on the wrong side, the number inside, and (rest) those clipped to
        the far end -- as ``(skip, take, src_start)`` with ``src_start`` the first source index."""
        first = lo + step
        if step < 0:  # prefix max: below src_lo nothing precedes; above src_hi the last row holds
            skip = min(max(src_lo - first, 0), hi - lo + 1)
            start = max(first, src_lo)
            take = max(min(hi + step, src_hi) - start + 1, 0)
            return skip, take, start - src_lo
        # suffix min: beyond src_hi nothing follows; below src_lo the first row holds
        take_end = min(hi + step, src_hi)  # last index inside
        lead = min(max(src_lo - first, 0), hi - lo + 1)  # clipped up to src_lo
        take = max(take_end - max(first, src_lo) + 1, 0)
        return lead, take, max(first, src_lo) - src_lo

    @classmethod
    def _gather(cls, V: np.ndarray, src, dst, step: int, fill: float) -> np.ndarray:
        """``out[x, y] = V[x + step, y + step]`` for the states (x, y) of box ``dst``, the index
        clipped into box ``src`` (V is a prefix max for ``step = -1``: an index past the box's
        end reads its last row / column, one before its start reads ``fill``; a suffix min for
        ``step = +1``: the mirror image). Slices and broadcasts only (no fancy indexing)."""
        ha, hb = dst[1] - dst[0] + 1, dst[3] - dst[2] + 1
        out = np.full((ha, hb), fill)
        ra = cls._shift(dst[0], dst[1], src[0], src[1], step)
        rb = cls._shift(dst[2], dst[3], src[2], src[3], step)
        # row segments of out: (out rows, source rows or a single clipped row)
        if step < 0:
            rows = [(slice(ra[0], ra[0] + ra[1]), slice(ra[2], ra[2] + ra[1])),
                    (slice(ra[0] + ra[1], ha), slice(V.shape[0] - 1, V.shape[0]))]
            cols = [(slice(rb[0], rb[0] + rb[1]), slice(rb[2], rb[2] + rb[1])),
                    (slice(rb[0] + rb[1], hb), slice(V.shape[1] - 1, V.shape[1]))]
        else:
            rows = [(slice(0, ra[0]), slice(0, 1)), (slice(ra[0], ra[0] + ra[1]), slice(ra[2], ra[2] + ra[1]))]
            cols = [(slice(0, rb[0]), slice(0, 1)), (slice(rb[0], rb[0] + rb[1]), slice(rb[2], rb[2] + rb[1]))]
        for o_r, s_r in rows:
            if o_r.stop <= o_r.start:
                continue
            for o_c, s_c in cols:
                if o_c.stop > o_c.start:
                    out[o_r, o_c] = V[s_r, s_c]
        return out

    def reach(self, T: float, deadline: Deadline | None = None, *, backward: bool = False):
        """The least window slack of each state of each stage boundary that the start reaches
        (``backward``: from which the end is reached) with every row of the steady state <= T
        (float test at :meth:`relaxed` ``(T)``).

        Forward, stage i: ``V'(a', b') = G_i(a', b') - T - max [H_i - carry(V)]`` over the
        reached ``(a, b) < (a', b')`` (a prefix max; the class docstring); reached iff
        ``V' <= 0`` and the cut passes. Backward: ``K(a, b) = min [G_i + carry(K')] - T -
        H_i(a, b)`` over the ``(a', b') > (a, b)`` that reach the end (a suffix min), the same
        rows summed from the other end.

        Returns
        -------
        (boxes, slack) or None
            ``slack[i]``: float array over box ``boxes[i]`` of boundary i (i = 0..S), the least
            slack (<= 0) of a reached state, ``inf`` elsewhere (``-inf`` at the start / end:
            no row yet); ``None`` as soon as a boundary has no state (no plan passes T).

        Raises
        ------
        DeadlineReached
            If ``deadline`` passes (checked before each stage).
        """
        S = self.p.stages
        Tr, boxes = self.relaxed(T), self._boxes(T)
        V = np.full((1, 1), -np.inf)  # the state (0, 0), or (n, n) backward
        out = [V]
        for i in range(S - 1, -1, -1) if backward else range(S):
            if deadline is not None:
                deadline.check(f"relaxation stage {i}" + (" (backward)" if backward else ""))
            if backward:
                src, dst = boxes[i + 1], boxes[i]
                W = np.where(V <= 0, self.G(i, src) + self.carry(V, src), np.inf)[::-1, ::-1]
                np.minimum.accumulate(W, axis=0, out=W)  # suffix min = reversed prefix min
                np.minimum.accumulate(W, axis=1, out=W)
                V = self._gather(W[::-1, ::-1], src, dst, +1, np.inf) - Tr - self.H(i, dst)
            else:
                src, dst = boxes[i], boxes[i + 1]
                W = np.where(V <= 0, self.H(i, src) - self.carry(V, src), -np.inf)
                np.maximum.accumulate(W, axis=0, out=W)
                np.maximum.accumulate(W, axis=1, out=W)
                V = self.G(i, dst) - Tr - self._gather(W, src, dst, -1, -np.inf)
            ok = V <= 0
            if 0 < (i if backward else i + 1) < S:  # an inner cut
                ok &= self._cut_ok(Tr, dst)
            if not ok.any():
                return None
            V = np.where(ok, V, np.inf)
            out.append(V)
        return boxes, out[::-1] if backward else out

    def cuts(self, T: float, reach) -> tuple[list[int], list[int]]:
        """Backtrack a plan whose rows pass the float test at ``T`` from the forward
        :meth:`reach` ``(T)``: each stage's start is the predecessor that gave its end state
        its least slack (so the slacks along the plan are the recorded ones, all <= 0)."""
        n, S = self.p.n, self.p.stages
        boxes, V = reach
        a2, b2 = n, n
        fa, fb = [], []
        for i in range(S - 1, 0, -1):
            box = boxes[i]
            ok = V[i] <= 0
            ok[max(a2 - box[0], 0) :, :] = False
            ok[:, max(b2 - box[2], 0) :] = False
            W = np.where(ok, self.H(i, box) - self.carry(V[i], box), -np.inf)
            r, c = np.unravel_index(np.argmax(W), W.shape)
            a2, b2 = box[0] + int(r), box[2] + int(c)
            fa.append(a2)
            fb.append(b2)
        return fa[::-1], fb[::-1]

    def windows(self, T: float, deadline: Deadline | None = None) -> list[tuple[int, int, int, int]] | None:
        """Per cut c, ``(a_lo, a_hi, b_lo, b_hi)``: the range of forward and backward cut
        positions of every plan whose rows are <= T, memory ignored (so of every plan of the
        problem with period <= T: a state on such a plan is reached from the start and reaches
        the end); ``None`` if no plan passes T.

        Raises
        ------
        DeadlineReached
            If ``deadline`` passes.
        """
        fwd = self.reach(T, deadline)
        if fwd is None:
            return None
        boxes, F = fwd
        _, B = self.reach(T, deadline, backward=True)  # not None: the forward sweep found a plan
        out = []
        for c in range(self.p.stages - 1):
            box = boxes[c + 1]
            both = (F[c + 1] <= 0) & (B[c + 1] <= 0)
            rows, cols = np.flatnonzero(both.any(axis=1)), np.flatnonzero(both.any(axis=0))
            if rows.size == 0:  # pragma: no cover - the end is reachable, so every boundary is
                return None
            out.append((box[0] + int(rows[0]), box[0] + int(rows[-1]), box[2] + int(cols[0]), box[2] + int(cols[-1])))
        return out

    def restrict(self, T: float, deadline: Deadline | None = None) -> None:
        """Confine every later test at a limit <= T to the :meth:`windows` of T (see the class).

        Raises
        ------
        DeadlineReached
            If ``deadline`` passes (the boxes stay as they were).
        """
        if T >= self.box_T:
            return
        win = self.windows(T, deadline)
        if win is not None:
            n = self.p.n
            self.boxes, self.box_T = [(0, 0, 0, 0), *win, (n, n, n, n)], T


class Relaxed(NamedTuple):
    """Outcome of :func:`relaxation_optimum` (seconds)."""

    lower: float
    """A valid lower bound on the problem's optimum (memory or not): the bracket's lower end."""
    fwd_cuts: list
    """Forward cuts of the best plan of the relaxation found (the start if none better)."""
    bwd_cuts: list
    """Backward cuts of that plan."""
    value: float
    """Its bottleneck (memory ignored)."""
    closed: bool
    """The bracket closed: ``value <= (1 + rel_tol) lower`` (up to float rounding)."""
    probes: int
    """Probes made (one O(S n^2) feasibility test each)."""


def relaxation_optimum(problem: BipartitionProblem, *, deadline: Deadline | float | None = None,
                       start: list[int] | None = None, rel_tol: float = BISECTION_GAP / 10,
                       relaxation: _Relaxation | None = None) -> Relaxed:
    """The optimum of the Bi-Partition problem with its memory limit ignored, by bisection on T.

    Parameters
    ----------
    problem
        The Bi-Partition problem (its memory capacity is ignored).
    deadline
        A :class:`~pipeopt.backends.deadline.Deadline`, seconds or ``None`` (no limit). The
        bisection stops at it (a probe is cut short inside; its T stays undecided).
    start
        Cut positions of a same-cut plan (the bracket's upper end); default the best same-cut
        plan with memory ignored (exact partition DP).
    rel_tol
        The bisection closes when ``upper - lower <= rel_tol * lower``.
    relaxation
        Internal: a :class:`_Relaxation` of ``problem`` already built.

    Returns
    -------
    Relaxed
        ``lower`` is a valid bound (every T at or below it was proven infeasible for every
        plan, or it is the simple bound); the plan is the relaxation's best (its bottleneck
        within ``rel_tol`` of ``lower`` if ``closed``). If that plan fits in memory it is
        optimal for the problem.

    Notes
    -----
    First the boxes of the start's bottleneck are fixed (:meth:`_Relaxation.restrict`: two
    O(S n^2) passes, 0.3 s each for n = 1250, S = 16); every probe after that looks inside
    them only (milliseconds on the PipeDream profiles), and about 30 probes close the bracket.
    """
    deadline = Deadline.of(deadline)
    if start is None:
        start = best_same_cut(problem, ignore_memory=True)
    relax = _Relaxation(problem) if relaxation is None else relaxation

    def probe(T: float, dl: Deadline | None) -> Probe:
        try:
            reach = relax.reach(T, dl)
        except DeadlineReached:
            return Probe(UNKNOWN)
        return Probe(INFEASIBLE) if reach is None else Probe(FEASIBLE, ("reach", T, reach))

    upper = problem.score(start, start).bottleneck
    lower = problem.simple_lower_bound()
    try:  # the boxes of every plan at least as good as the start (also those the MILP may want)
        relax.restrict(upper * (1 + 2 * CAP_MARGIN), deadline)
    except DeadlineReached:
        pass  # no time left: the bisection below makes no probe either
    out = bisect(probe, min(lower, upper), upper, start=("cuts", start), start_value=upper,
                 rel_tol=rel_tol, deadline=deadline)
    if out.plan[0] == "reach":
        a, b = relax.cuts(out.plan[1], out.plan[2])
    else:
        a, b = list(start), list(start)
    return Relaxed(out.lower, a, b, problem.score(a, b).bottleneck, out.closed, len(out.steps))


# ---- shared by both methods ----------------------------------------------------------------------


def _infeasible(problem: BipartitionProblem) -> InfeasibleError:
    # memory depends on the backward split, and a = b needs the fewest weights: if no same-cut
    # plan fits, no plan does
    return InfeasibleError(
        f"no Bi-Partition plan of {problem.instance.name} into {problem.stages} stages fits in "
        f"{problem.memory / 2**30:.3f} GiB per worker (no same-cut plan fits, and moving the "
        "forward cuts away from the backward cuts only adds weight memory)")


class _Incumbent:
    """The best plan that fits among the candidates offered (the first wins ties)."""

    def __init__(self, problem: BipartitionProblem):
        self.problem = problem
        self.label: str | None = None
        self.cuts: tuple[list[int], list[int]] | None = None
        self.value = math.inf
        self.rejected: dict[str, str] = {}

    def offer(self, label: str, a, b) -> bool:
        """Keep ``(a, b)`` if it fits and is better by more than a relative 1e-12; True if kept."""
        sc = self.problem.score(a, b)
        if not sc.fits:
            self.rejected[label] = f"breaks memory by {sc.excess:.6g} bytes"
            return False
        if sc.bottleneck < self.value * (1 - FLOAT_NOISE):
            self.label, self.cuts, self.value = label, (list(a), list(b)), sc.bottleneck
            return True
        return False


def _same_cut_start(problem: BipartitionProblem, deadline: Deadline) -> list[int] | None:
    """Cut positions of the best same-cut plan; ``None`` if the deadline stopped the DP.

    Raises
    ------
    InfeasibleError
        If no same-cut plan fits, hence no plan at all (:func:`_infeasible`).
    """
    try:
        cuts = best_same_cut(problem, deadline=deadline)
    except DeadlineReached:
        return None
    if cuts is None:
        raise _infeasible(problem)
    return cuts


def _finish(problem: BipartitionProblem, method: str, best: _Incumbent, lower: float, gap: float,
            deadline: Deadline, info: dict, tie: dict) -> Result:
    """The incumbent as a Result: ``OPTIMAL`` iff its bottleneck <= ``lower (1 + gap)``, else
    ``TIME_LIMIT`` if the deadline passed or stopped a step (``info["stopped"]``), else
    ``FEASIBLE``; ``lower`` is quoted as it is. An ``OPTIMAL`` plan goes through the tie-break
    (:func:`pipeopt.problems.bipartition.tiebreak.break_ties`; ``tie``: its ``solver``,
    ``threads``, ``seed`` and the ``relaxation`` already built, if any), which may return a
    plan of the same period and shorter iteration."""
    timed_out = deadline.expired() or "stopped" in info
    info.update(gap_tolerance=gap, incumbent=best.label, time_limit_reached=timed_out)
    if best.rejected:
        info["rejected_candidates"] = dict(best.rejected)
    if best.cuts is None:  # the deadline passed inside the same-cut DP: no plan yet
        return problem.result(method, None, Status.TIME_LIMIT, lower_bound=lower, started=deadline.started,
                              info=info)
    a, b = best.cuts
    if best.value <= lower * (1 + gap):
        status = Status.OPTIMAL
        tie = dict(tie)
        relax = tie.pop("relaxation", None)

        def windows(T: float, clock: Deadline):
            return (relax if relax is not None else _Relaxation(problem)).windows(T, clock)

        within = min(best.value * (1 + CAP_REL), max(best.value, lower * (1 + gap)))
        a2, b2 = break_ties(problem, (a, b), deadline, info, within=within, windows=windows, **tie)
        if (a2, b2) != (a, b):
            a, b = a2, b2
            info["incumbent"] = f"second phase (tie-break of {best.label})"
    elif timed_out:
        status = Status.TIME_LIMIT
        info["secondary"] = {"objective": SECONDARY, "proven": False,
                             "note": "no second phase: the primary optimum is not proven"}
    else:
        status = Status.FEASIBLE
        info["secondary"] = {"objective": SECONDARY, "proven": False,
                             "note": "no second phase: the primary optimum is not proven"}
    info.update(fwd_cuts=a, bwd_cuts=b)
    return problem.result(method, problem.plan(a, b), status, lower_bound=lower, started=deadline.started,
                          info=info)


def _single_plan(problem: BipartitionProblem) -> bool:
    """S = 1 or S = n: both splits are forced, the same-cut plan is the only plan."""
    return problem.stages in (1, problem.n)


# ---- the methods ---------------------------------------------------------------------------------


def solve_bisection(problem: BipartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc",
                    seed: int = 0, threads: int = 2, gap: float = BISECTION_GAP) -> Result:
    """Solve the Bi-Partition problem by bisection on T over the memory relaxation.

    :func:`relaxation_optimum` finds the optimum with the memory limit ignored, exactly (to a
    tenth of ``gap``), starting from the best same-cut plan. If the relaxation's plan fits in
    memory it is optimal; otherwise the best same-cut plan is returned with the relaxation's
    value as lower bound.

    Parameters
    ----------
    problem
        The Bi-Partition problem.
    time_limit
        Seconds, or the :class:`~pipeopt.backends.deadline.Deadline` of the solve: the same-cut
        DP and every probe of the bisection draw from it.
    solver, seed, threads
        For the tie-break's event-time MILP only (:mod:`pipeopt.problems.bipartition.tiebreak`).
    gap
        Relative tolerance of the optimality claim (default 1e-9).

    Returns
    -------
    Result
        ``lower_bound``: the largest T proven infeasible for the relaxation (or the simple
        bound), seconds, valid for every plan. Status ``OPTIMAL`` if the plan returned is within
        ``gap`` of it; ``TIME_LIMIT`` if the deadline stopped the bisection first (the best
        plan found and the bound reached); ``FEASIBLE`` if memory binds (the relaxation's plan
        does not fit and the same-cut plan is not within ``gap``). ``info``:
        ``relaxation_bound``, ``relaxed_plan_fits``, ``bisection_closed``, ``probes``,
        ``incumbent`` (``"same_cut"`` or ``"bisection"``), ``fwd_cuts``, ``bwd_cuts``.

    Raises
    ------
    InfeasibleError
        If no plan fits the workers' memory (proven by the same-cut DP, module docstring).
    InvalidProblemError
        If ``gap`` is not in (0, 1) or ``time_limit`` is not a positive number.
    """
    deadline = Deadline.of(time_limit)
    if solver not in SOLVERS:
        raise InvalidProblemError(f"unknown MILP solver {solver!r}; choose from {list(SOLVERS)}")
    gap = _check_gap(gap)
    best = _Incumbent(problem)
    lower = problem.simple_lower_bound()
    info: dict = {}
    tie = {"solver": solver, "threads": int(threads), "seed": int(seed)}
    start = _same_cut_start(problem, deadline)
    if start is not None:
        best.offer("same_cut", start, start)
        if _single_plan(problem):
            info["proof"] = "the only plan (S = 1 or S = n)"
            return _finish(problem, "bisection", best, best.value, gap, deadline, info, tie)
        tie["relaxation"] = relax = _Relaxation(problem)
        rel = relaxation_optimum(problem, deadline=deadline, start=start, rel_tol=gap / 10, relaxation=relax)
        best.offer("bisection", rel.fwd_cuts, rel.bwd_cuts)
        lower = max(lower, rel.lower)
        info.update(relaxation_bound=rel.lower, relaxed_plan_fits=problem.score(rel.fwd_cuts, rel.bwd_cuts).fits,
                    bisection_closed=rel.closed, probes=rel.probes)
    return _finish(problem, "bisection", best, lower, gap, deadline, info, tie)


def solve_milp(problem: BipartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc",
               seed: int = 0, threads: int = 1, gap: float = MILP_GAP, dp_bound: bool = True) -> Result:
    """Solve the Bi-Partition problem exactly with a MILP (module docstring).

    Steps, all on one deadline: the best same-cut plan (exact partition DP; the incumbent and
    the infeasibility proof); with ``dp_bound`` the memory relaxation by bisection (at most
    half of the time when memory is limited, all of it otherwise), which proves the optimum
    on its own when its plan fits; then the MILP, capped by the incumbent, restricted to the
    relaxation's windows, warm-started, through :func:`pipeopt.backends.pulp.solve_pulp`.

    Parameters
    ----------
    problem
        The Bi-Partition problem.
    time_limit
        Seconds, or the :class:`~pipeopt.backends.deadline.Deadline` of the solve.
    solver
        ``"cbc"`` or ``"highs"`` (through the PuLP door; CBC runs in a child process that is
        ended at the deadline).
    seed
        Solver random seed (>= 0).
    threads
        Solver threads (>= 1; default 1, deterministic).
    gap
        Relative tolerance of the optimality claim (default 1e-6); the solver is asked for a
        tenth of it.
    dp_bound
        Run the memory relaxation first (above). ``False`` gives the plain MILP with only the
        same-cut plan as start and cap (an independent check).

    Returns
    -------
    Result
        Status ``OPTIMAL`` (the plan is within ``gap`` of the bound: proven by the solver, the
        relaxation or, for S = 1 or S = n, by enumeration; ``info["proof"]`` when not the
        solver), ``TIME_LIMIT`` (the deadline passed: the best plan found, at worst the best
        same-cut plan, and the best bound: the solver's, the relaxation's or the simple bound),
        or ``FEASIBLE`` (finished without proof, e.g. the solver's plan broke memory within its
        tolerance; ``info["rejected_candidates"]``). ``lower_bound`` in seconds;
        ``info["milp_objective"]`` is the model's value of the solver's plan, seconds (equal to
        ``evaluate`` up to the solver's tolerances); ``info["incumbent"]`` says which plan was
        returned (``"same_cut"``, ``"bisection"`` or ``"milp"``; ties keep the earlier).

    Raises
    ------
    InvalidProblemError
        Unknown solver, bad ``gap`` / ``seed`` / ``threads`` / ``time_limit``.
    InfeasibleError
        If no plan fits the workers' memory (then no same-cut plan fits either: the
        backward split fixes the activation memory and ``a = b`` minimises the weights).

    References
    ----------
    Cui et al., *Bi-Partition*, Journal of Cloud Computing (the problem).
    """
    deadline = Deadline.of(time_limit)
    if solver not in SOLVERS:
        raise InvalidProblemError(f"unknown MILP solver {solver!r}; choose from {list(SOLVERS)}")
    gap = _check_gap(gap)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InvalidProblemError(f"threads must be an integer >= 1, got {threads!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidProblemError(f"seed must be an integer >= 0, got {seed!r}")
    best = _Incumbent(problem)
    lower = problem.simple_lower_bound()
    info: dict = {"solver": solver, "seed": seed, "threads": threads, "dp_bound": dp_bound}
    tie = {"solver": solver, "threads": threads, "seed": seed}
    start = _same_cut_start(problem, deadline)
    if start is None:
        return _finish(problem, "milp", best, lower, gap, deadline, info, tie)
    best.offer("same_cut", start, start)
    info["same_cut"] = {"cuts": start, "bottleneck": best.value}
    if _single_plan(problem):
        info["proof"] = "the only plan (S = 1 or S = n)"
        return _finish(problem, "milp", best, best.value, gap, deadline, info, tie)
    try:
        windows = None
        if dp_bound:
            tie["relaxation"] = relax = _Relaxation(problem)
            share = deadline if not math.isfinite(problem.memory) else deadline.sub(fraction=0.5)
            rel = relaxation_optimum(problem, deadline=share, start=start, rel_tol=gap / 10, relaxation=relax)
            lower = max(lower, rel.lower)
            info.update(relaxation_bound=rel.lower, bisection_closed=rel.closed)
            best.offer("bisection", rel.fwd_cuts, rel.bwd_cuts)
            if best.value <= lower * (1 + gap):
                info["proof"] = "the relaxation's bound meets the incumbent"
                return _finish(problem, "milp", best, lower, gap, deadline, info, tie)
            windows = relax.windows(best.value * (1 + 2 * CAP_MARGIN), deadline)
        if best.value <= lower * (1 + gap):
            return _finish(problem, "milp", best, lower, gap, deadline, info, tie)
        lower = _milp(problem, best, lower, windows, deadline, solver, gap, seed, threads, info)
    except DeadlineReached as stop:
        info["stopped"] = str(stop)
    return _finish(problem, "milp", best, lower, gap, deadline, info, tie)


def _milp(problem: BipartitionProblem, best: _Incumbent, lower: float, windows, deadline: Deadline,
          solver: str, gap: float, seed: int, threads: int, info: dict) -> float:
    """Build and solve the capped MILP; offer its plan to ``best``; return the new lower bound.

    Raises
    ------
    DeadlineReached
        If the deadline passes while the model is built.
    """
    scale = best.value / MODEL_UNIT if best.value > 0 else 1.0
    t0 = deadline.elapsed()
    prob, T, p, q = build_model(problem, scale, best.value * (1 + CAP_MARGIN), lower * (1 - CAP_MARGIN),
                                windows, deadline)
    built = deadline.elapsed() - t0
    info.update(binaries=sum(v.cat == pulp.LpInteger for v in prob.variables()), build_seconds=built)
    if deadline.remaining() < 0.5 * built:  # writing the model for the solver takes about 0.35x its build
        raise DeadlineReached("handing the model to the solver", deadline.elapsed())
    a0, b0 = best.cuts
    warm = {**start_of_rows(p, a0), **start_of_rows(q, b0)}
    rel_gap, abs_gap = gap / 10, MODEL_UNIT * gap / 100  # the model's T is about MODEL_UNIT
    out = solve_pulp(prob, solver=solver, deadline=deadline, rel_gap=rel_gap, abs_gap=abs_gap, threads=threads,
                     seed=seed, warm_start=warm)
    info.update(out.info())
    if out.status in ("feasible", "no_solution"):  # the solver stopped without proof: its time was up
        info["stopped"] = f"the solver stopped at the deadline ({out.solver_status})"
    if out.has_solution:
        a, b = cuts_of_rows(p, out.values), cuts_of_rows(q, out.values)
        try:
            problem.check_cuts(a, b)
        except InvalidPlanError:  # pragma: no cover - a solver returning garbage
            info["solver_note"] = f"solver returned invalid cuts {a}, {b}"
        else:
            info["milp_objective"] = out.value(T) * scale
            best.offer("milp", a, b)
    bound = out.bound
    if out.status == "optimal" and out.objective is not None:
        # a solver that stops at its gap may quote its incumbent's value as the bound (HiGHS's
        # dual bound, CBC's final objective): only the incumbent less the allowed gap is proven
        proof = out.objective - max(abs_gap, rel_gap * max(abs(out.objective), 1.0)) * (1 + 1e-9)
        bound = proof if bound is None else min(bound, proof)
    if out.status == "infeasible":  # pragma: no cover - the incumbent lies inside the caps
        info["solver_note"] = "the solver called the capped model infeasible (its tolerances): no proof"
    elif bound is not None:
        lower = max(lower, bound * scale * (1 - SOLVER_SLACK))
    return lower
