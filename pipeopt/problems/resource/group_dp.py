"""Exact grouping by a DP over device *types*: its size grows with the number of types and the
count of each, not with the number of devices.

**Types.** Two devices are of the same type when they have the same resources (every kind,
same amount) and the same memory (:attr:`~pipeopt.problems.resource.GroupProblem.device_classes`).
The cluster has one bandwidth between consecutive workers (:class:`pipeopt.Cluster`), so a
worker's cut transfers do not depend on its devices, and devices of one type are
interchangeable in every rule of the cost model: a worker is a *composition*, a count of each
type, and a plan is a sequence of compositions summing to the type counts. A cluster of 64
devices of 4 types has ``17**4 = 83,521`` count vectors (16 of each), whatever the names.

**The probe at a limit T** (:class:`TypesProbe`): is there a plan whose period (evaluate's
``bottleneck``, :meth:`~pipeopt.problems.resource.ResourceProblem.period`) is at most T? A DP
over stage boundaries k = 0..S: a *label* ``(k, j, u, G)`` says that stages 0..k-1 can cover
units ``0..j-1`` with ``u`` devices of each type (a count vector) and leave the window state
``G`` (:func:`pipeopt.cost.rules.window_step`: ``G_l = w_l + max(-D_l T, G_{l-1} + C_{l-1})``,
every window row ending at stage l holds iff ``G_l <= -U_l T``; split execution: ``D_l = 2 (S
- l)``, ``U_l = 0``). Stage k over units ``j..j'-1`` on a composition c is allowed iff

* its own rows pass T: some forward share keeps both passes within T - by LP duality the best
  split's rate is linear in the worker's resources, ``min_lambda sum_k R_k c_k(lambda)``
  (:func:`~pipeopt.problems.resource.intervals.interval_cover_coefficients`), so this is a
  few dot products per composition;
* its memory with split execution's ``2 (S - k)`` microbatches in flight fits the worker
  (:meth:`~pipeopt.problems.resource.ResourceProblem.stage_memory`, :func:`pipeopt.cost.rules.fits`);
* the cut before unit j' passes T (its own row, :attr:`~pipeopt.problems.resource.ResourceProblem.cut_time`);
* and the window rows ending at stage k hold with the stage's least busy time ``w = f + b``
  at T (:func:`~pipeopt.problems.resource.split.least_busy`: the best share at T is best for
  every window row at once, as :meth:`~pipeopt.problems.resource.ResourceProblem.check` uses).

Every rule is the one of :mod:`pipeopt.cost` and :mod:`pipeopt.problems.resource.split`; the
DP only chooses. The last stage takes every device left (a worker with more devices is never
worse: its busy time and memory only improve), so a plan uses every device exactly once.

**Dominance (exact).** At one boundary ``(k, j)`` a label ``(u, G)`` is dropped when another
has ``u' <= u`` (type by type) and ``G' <= G``: any completion of the first is one of the
second (more devices left, a smaller window state). ``G`` below the next stage's floor
``-D_k T - C_j`` is clipped to it (the recursion forgets it there). So a stage's composition
is worth trying only if every composition with one device fewer either breaks a rule or
leaves a larger clipped window state (:meth:`TypesProbe.menu`): the minimal compositions of
the stage, and above them only those that still lower ``G``.

**Pruning (valid necessary conditions).** For any prices ``pi >= 0`` per kind, a stage that
passes T on resources R has ``T pi.R >= sum_i (min_k pi_k fwd[i,k] + min_k pi_k bwd[i,k])``
(multiply the stage LP's rows ``T R_k >= psi_k F_k + phi_k B_k`` by ``pi_k``), additive over
units and stages; so the devices left after a label must reach the work of the units left,
for each of a few price vectors (the cover rows of the whole chain), and their memory the
parameters plus two microbatches' activations of those units; every stage left needs a
device and a unit. Each stage rounds its priced power up to a whole composition: for the first
price, the stages left need at least the least total power of a split of the units left into
stages each on its least powerful passing composition (:meth:`TypesProbe.least_power`, a DP
over stage ends at T), which bounds the devices a label may leave and a stage may take. Pruned
labels have no completion: the DP's "infeasible" is a proof.

The DP runs at ``T (1 + RELAX)`` (float rounding of the rules' two readings, the cover rows
and the knapsack frontier, cannot turn a feasible T into a proven infeasible one); its plan is
scored exactly (:meth:`~pipeopt.problems.resource.ResourceProblem.plan_value`). The search on
T is the exact methods' common bisection (:func:`pipeopt.problems.resource.search.exact_search`),
so ``OPTIMAL`` means optimal within a relative gap of
:data:`~pipeopt.problems.resource.search.MIN_REL_GAP`, with the bound the largest T the DP
proved infeasible. Before the bisection, the stage relaxation of :mod:`.relax` (each worker read
as its priced power, with the window rows, the cuts' round trips and memory; cheap, compiled)
raises the lower end from the priced work bound to the largest T it refutes, within
:data:`RELAX_SHARE` of the time left; then the relaxed plans just above that bound guide a
search for a better incumbent (:func:`_guided`: the exact DP over stage ends near theirs, within
:data:`GUIDE_SHARE`), and the best plan so far is polished by the local search over groupings
(:func:`.local.improve_best`, within :data:`POLISH_SHARE`; a heuristic, it proves nothing).

Size: one probe visits at most ``S * n * (count vectors)`` labels; stage menus are computed
over the compositions whose priced power fits between a stage's work and what the other
stages leave, so a tight T (near the optimum) visits few. :data:`MAX_COUNT_VECTORS` bounds the
count vectors (16 distinct devices: 65,536). The two inner loops - the scan of a stage range's
compositions and the pairing of labels with a stage's menu, hundreds of millions of pairs per
stage on 64 devices of 4 types - are compiled with numba (:mod:`.kernels`); they test the same
rules on arrays this module prepares.

References
----------
Duan, Y. and Wu, J., *Optimizing Resource Allocation in Pipeline Parallelism for Distributed
DNN Training*, ICPADS 2022 (the problem; Algorithm 2 is the start heuristic).
"""

from __future__ import annotations

import itertools
import math
from functools import cached_property

import numpy as np

from ...backends.bisection import FEASIBLE, INFEASIBLE, UNKNOWN, Probe
from ...backends.deadline import Deadline, DeadlineReached
from ...cost import rules
from ...cost.tolerance import SUM_ORDER
from ...errors import InvalidProblemError
from ...result import Result
from .intervals import interval_cover_coefficients
from .problem import GroupProblem
from .bounds import top_limit
from .search import MIN_REL_GAP, exact_search
from .kernels import least_pairs, menu_scan, undominated
from .local import improve_best
from .relax import guide_splits, relaxed_bound
from .split import least_busy, least_busy_many

MAX_COUNT_VECTORS = 2**21
"""Most count vectors (the product over types of count + 1) the type DP accepts: 21 distinct
devices, or e.g. 4 types of 37. Beyond it :func:`solve_dp` refuses (use the MILP or CP-SAT)."""

RELAX = SUM_ORDER
"""The probe decides ``T (1 + RELAX)`` (a proof of infeasibility there holds at T)."""

BEAM_SCAN = 8
"""A heuristic pass of beam ``b`` scans at most ``BEAM_SCAN * b`` of the least powerful
compositions per stage range."""

BEAMS = ((8, 1.5), (32, 2.5), (128, None))
"""The heuristic passes (:meth:`TypesProbe.heuristic`'s default): ``(beam, spread)`` of
:meth:`TypesProbe.solve` - narrow ones over stages of at most 1.5 and 2.5 even shares of the
work left, then a wider one over every stage end."""

PROBE_BEAMS = BEAMS[:2]
"""The heuristic passes a probe tries before the exact pass: the narrow ones only (the probes
go below the start, where the exact pass decides; the start has tried the wide pass)."""

START_BEAMS = BEAMS + ((512, 2.5),)
"""The heuristic passes of the start's bisection (:func:`_starts`): the three of :data:`BEAMS`,
then a wider one over stages of at most 2.5 even shares. The wide pass of :data:`BEAMS` finds the
unbalanced optima the even-share spread excludes (GNMT distinct16: one unit on each of the first
two single-device workers); beam 512 finds ResNet-50 distinct16's optimum (23.456 ms; about 3 s,
where the exact probe just below the 23.711 ms the others reach takes 28 s and finds only
23.687 ms). Each costs a few seconds at a limit where the narrower ones fail."""

START_SHARE = 0.3
"""Share of the time the beam start (:func:`solve_dp`'s heuristic start) may use (GPT-2 XL on 64
devices of 4 types at 60 s: its wide pass finds the optimum 13 s into the start's 18 s; the
rejection below it takes 30-33 s)."""

FIRST_TOP_SHARE = 1.0
"""Share of the time left the first probe just below the start gets (:func:`solve_dp`; the
bisection's ``first_top_share``). The start is the DP's own beam passes, often optimal, and a
probe near the optimum is all-or-nothing (GPT-2 XL on 64 devices of 4 types: its rejection just
below the 34.680 ms start takes 39 s; a third of the time left would only be spent)."""

STEP_SHARE = 0.6
"""Share of the time left each midpoint probe gets (:func:`solve_dp`; the bisection's ``step_share``,
0.34 for the MILP and CP-SAT probes). The exact pass decides all or nothing: a probe stopped by its
share has spent it for nothing (GPT-2 XL on 64 edge SoCs, 60 s: six midpoints in a row stopped
undecided at 0.34, each just below what it needed)."""

TOP_CLOCK = 1.0
"""Share of the time left a probe just below the best plan found so far gets (:class:`_TopClock`),
whatever share the bisection gives it: near the optimum the exact pass decides all or nothing,
and a rejection just below a plan proves that plan optimal (GPT-2 XL on 64 server GPUs, seed 0:
the probe just below the 2.8720 ms plan an exact probe found needs 12 CPU s; the bisection's
share for it was 9.4 s, spent for nothing, and the solve ended at a 0.39 % gap)."""

RELAX_SHARE = 0.3
"""Share of the time left the stage relaxation's bound (:func:`~.relax.relaxed_bound`, after the
starts) may use: a lower bound that sees the cut transfers, the window rows and memory (GPT-2 XL
on 64 mixed devices over 10 GbE, seed 2: 6.92 ms, the priced work bound, -> 8.20 ms at its coarse
level in about 4 CPU s, 8.32 ms at the next in about 9 s more; the optimum is 8.4406 ms, and the
exact probe just below it needs minutes)."""

GUIDE_SHARE = 0.3
"""Share of the time left the guided search (:func:`_guided`, after the stage relaxation's bound)
may use."""

POLISH_SHARE = 0.02
"""Share of the time left the local search over groupings (:func:`.local.improve_best`) may use to
improve the best plan of the starts and the guided search, before the bisection (GPT-2 XL over
64 mixed devices, the group-scale benchmark's seed 3: the guided search's 16.248 ms -> 16.168 ms
in 0.3 CPU s, where the 60-s solve had ended at 16.248 ms; the optimum is 16.114 ms). Small: on
a plan that is already a local optimum the search runs to its end, about 1 CPU s on GPT-2 XL over
64 devices, which the proof then lacks."""

GUIDE_MISSES = 2
""":func:`_guided` stops after this many limits in a row its restricted DP rejects (the proof is the
exact probes' work; a rejection costs about 0.5 s on GPT-2 XL over 64 devices)."""

GUIDE_RADIUS = 3
""":func:`_guided` lets each stage end move this many units from a guide split's."""

START_GAP = 1e-3
"""The beam start stops when its bracket is this narrow (relative)."""

FRONT = 32
"""Most points kept per front of the window bound (:meth:`TypesProbe._window_fronts`)."""

CHUNK = 20000
"""Compositions per vectorised block of :meth:`TypesProbe.menus` (bounds its temporary arrays)."""

PAIRS_CHUNK = 2**24
"""Most label x menu pairs :meth:`TypesProbe._extend` scans between two checks of the deadline
(:func:`~pipeopt.problems.resource.kernels.least_pairs` scans tens of millions a second)."""

LEAST_SCAN = 1024
"""Count vectors :meth:`TypesProbe.least_power` scans per stage range, in order of power, for the
least powerful that passes (beyond it the bound is the power it reached)."""

PAIRWISE = 64
""":meth:`TypesProbe._pareto` compares the labels of one boundary pair by pair (compiled,
:func:`~.kernels.undominated`) while their count squared is below this many times the count
vectors; beyond it, on a prefix minimum over every count vector."""

GROUP_BITS = 8
"""Tests on the items' device counts (bits) that group the menu items for the exact pairing
(:meth:`TypesProbe._item_groups`): at most ``2**8`` groups per end."""

BIG = 1e300
"""Stand-in for an infinite cover coefficient (a pass without work on a kind): finite, so that
zero devices of a type contribute 0, not nan."""


class DeviceTypes:
    """The device types of a group problem and every count vector over them.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.GroupProblem`.

    Attributes
    ----------
    classes
        ``list[list[int]]``: device indices of each type (cluster order), = ``problem.device_classes``.
    counts
        ``ndarray (tau,)``: devices of each type.
    res
        ``ndarray (tau, K)``: units of each kind (``problem.kinds``) on one device of each type.
    mem
        ``ndarray (tau,)``: bytes of memory of one device of each type (``inf``: unlimited).
    size
        Number of count vectors ``prod(counts + 1)``.
    stride
        ``ndarray (tau,)``: index of a count vector = ``c @ stride`` (C order over
        ``counts + 1``); the index of ``u + c`` is the sum of the indices when ``u + c <= counts``.
    comps
        ``ndarray (size, tau)``: every count vector, by index.
    R, M, ndev
        Per count vector: pooled resources ``(size, K)``, memory ``(size,)`` and devices ``(size,)``.
    full
        Index of ``counts`` (every device).
    subsets
        True when every type has one device: indices are bitmasks and ``u + c <= counts`` iff
        ``u & c == 0``.
    guard
        Guard bits of the packed count vectors (:meth:`pack`; 0 with bitmasks), for
        :func:`~pipeopt.problems.resource.kernels.fits`.

    Raises
    ------
    InvalidProblemError
        If there are more than :data:`MAX_COUNT_VECTORS` count vectors.
    """

    def __init__(self, problem: GroupProblem):
        devices = problem.instance.cluster.devices
        self.classes = problem.device_classes
        reps = [devices[cls[0]] for cls in self.classes]
        self.counts = np.array([len(cls) for cls in self.classes], dtype=np.int64)
        self.size = int(np.prod(self.counts + 1))
        if self.size > MAX_COUNT_VECTORS:
            raise InvalidProblemError(
                f"{problem.instance.name}: {len(devices)} devices of {len(self.classes)} types give {self.size:,} "
                f"count vectors, more than the type DP's {MAX_COUNT_VECTORS:,}; use the group milp or cpsat"
            )
        self.res = np.array([[d.resources.get(k, 0.0) for k in problem.kinds] for d in reps], dtype=float)
        self.mem = np.array([d.memory for d in reps], dtype=float)
        shape = tuple(int(c) + 1 for c in self.counts)
        self.shape = shape
        self.stride = np.array([int(np.prod(shape[t + 1:])) for t in range(len(shape))], dtype=np.int64)
        self.comps = np.ascontiguousarray(np.indices(shape).reshape(len(shape), -1).T, dtype=np.int64)
        self.R = self.comps @ self.res
        with np.errstate(invalid="ignore"):  # 0 devices * inf memory
            self.M = np.where(self.comps > 0, self.comps * self.mem, 0.0).sum(axis=1)
        self.ndev = self.comps.sum(axis=1)
        self.full = int(self.counts @ self.stride)
        self.subsets = bool((self.counts == 1).all())
        # packed count vectors (kernels.fits): type t in a field of bits[t] bits, its top bit a
        # guard; 2**(bits - 1) > count, and sum(bits) <= log2(size) + 2 tau <= 63 bits
        bits = np.array([int(c).bit_length() + 1 for c in self.counts], dtype=np.int64)
        shift = np.concatenate([[0], np.cumsum(bits)[:-1]]).astype(np.int64)
        self.guard = 0 if self.subsets else int(sum(1 << int(s + b - 1) for s, b in zip(shift, bits, strict=True)))
        self._packed = (self.comps << shift[None, :]).sum(axis=1)

    @property
    def tau(self) -> int:
        """Number of types."""
        return len(self.classes)

    def pack(self, idx: np.ndarray) -> np.ndarray:
        """The packed count vectors of indices ``idx`` (int64; bitmasks are their own packing):
        :func:`~pipeopt.problems.resource.kernels.fits` tests ``c <= room`` on them with
        :attr:`guard`."""
        return idx if self.subsets else self._packed[idx]

    def prefix_min(self, values: np.ndarray) -> np.ndarray:
        """``out[u] = min over v <= u of values[v]`` (a zeta transform over the count vectors; a new
        float array). Type by type, each count's slice takes the minimum with the one below it
        (one vectorised step per count: with distinct devices, 16 steps over 65,536 values)."""
        out = np.array(values, dtype=float)
        for t in range(self.tau):
            grid = out.reshape(int(np.prod(self.shape[:t])), self.shape[t], -1)  # a view
            for c in range(1, self.shape[t]):
                np.minimum(grid[:, c, :], grid[:, c - 1, :], out=grid[:, c, :])
        return out

    def within(self, rooms: np.ndarray) -> np.ndarray:
        """``ndarray (size,)`` uint8: ``out[v] = 1`` iff some count vector of ``rooms`` (indices) is
        ``>= v`` type by type: :meth:`prefix_min` over the complements (``counts - r <= counts - v``;
        the complement of index i is ``full - i``, the reversed order)."""
        missing = np.ones(self.size)
        missing[self.full - rooms] = 0.0
        return np.ascontiguousarray(self.prefix_min(missing)[::-1] == 0.0, dtype=np.uint8)

    def below(self, values: np.ndarray) -> np.ndarray:
        """``out[u] = min over v <= u, v != u of values[v]`` (``inf`` for the zero vector)."""
        pm = self.prefix_min(values)
        out = np.full(self.size, np.inf)
        for t in range(self.tau):
            has = np.flatnonzero(self.comps[:, t] > 0)
            out[has] = np.minimum(out[has], pm[has - self.stride[t]])
        return out


class _Labels:
    """Labels at one boundary ``(k, j)``: ``u`` (count-vector indices), ``G`` (window states),
    and the label each came from (``prev_j``, ``prev_u``)."""

    __slots__ = ("u", "G", "prev_j", "prev_u")

    def __init__(self, u, G, prev_j, prev_u):
        self.u, self.G, self.prev_j, self.prev_u = u, G, prev_j, prev_u


class TypesProbe:
    """``probe(T, deadline)`` for :func:`pipeopt.backends.bisection.bisect`: the type DP at a
    fixed limit T (module docstring). Exact: a plan found has period <= ``T (1 + RELAX)``
    (scored exactly), "infeasible" is a proof.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.GroupProblem`.

    Raises
    ------
    InvalidProblemError
        If the problem has too many count vectors (:class:`DeviceTypes`).
    """

    def __init__(self, problem: GroupProblem):
        self.problem = problem
        self.types = DeviceTypes(problem)
        p, n = problem, problem.n
        self.kinds = p.kinds
        self._rows: dict = {}
        self._kind_rows: dict = {}
        self._kind_stacks: dict = {}  # _kind_stack's cache
        self._least_at = None  # least_power's last (key, result)
        self._least_stage_at = None  # least_stage's last (key, result)
        self.beam_floor = 0.0  # the largest T at which the probe's beam passes failed (:meth:`__call__`)
        self._pairbuf = None  # buffers of least_pairs
        self._mem_cap = np.asarray(rules.memory_limit(self.types.M), dtype=float)  # menu_scan's memory test
        self._everything = np.ones(self.types.size, np.uint8)  # menu_scan's allowed count vectors
        # prices for the necessary conditions: the cover rows of the whole chain (finite ones)
        F, B = p.load(0, n)
        prices = []
        for row in interval_cover_coefficients(F, B, self.kinds):
            vec = np.array([row.get(k, 0.0) for k in self.kinds], dtype=float)
            if np.all(np.isfinite(vec)) and vec.max() > 0:
                prices.append(vec / vec.max())
        prices.append(np.ones(len(self.kinds)))
        self.prices = np.unique(np.array(prices), axis=0)  # (P, K)
        unit = np.zeros((n, len(self.prices)))
        for name, arr in (("fwd", p.fwd), ("bwd", p.bwd)):
            times = np.stack([arr[k] for k in self.kinds], axis=1)  # (n, K)
            with np.errstate(invalid="ignore"):
                priced = np.where(np.isfinite(times)[:, None, :], times[:, None, :] * self.prices[None, :, :], np.inf)
            unit += priced.min(axis=2)
        self.work = np.vstack([np.zeros(len(self.prices)), np.cumsum(unit, axis=0)])  # (n+1, P) priced work prefix
        self.power = self.types.R @ self.prices.T  # (size, P) priced power of every count vector
        self.memory_limited = bool(np.isfinite(self.types.mem).any())
        # bytes units j..n-1 need at least (every stage keeps >= 2 microbatches with split execution)
        self.mem_rest = np.asarray(p.table.memory(np.arange(n + 1), n, 2), dtype=float)
        # count vectors sorted by the priced power of the tightest price (the whole chain's work
        # over the cluster's power): menus are slices of this order
        tight = self.work[-1] / np.maximum(self.power[self.types.full], 1e-300)
        self._order_key = int(np.argmax(tight))
        self._order = np.argsort(self.power[:, self._order_key], kind="stable")
        self._sorted_power = self.power[self._order, self._order_key]
        self._sorted_R = self.types.R[self._order]  # least_power's scan reads these in order
        self._sorted_busy = self.types.ndev[self._order] >= 1
        # the window bound (module docstring): priced forward and backward work of the tightest price
        price = self.prices[self._order_key]
        priced = {}
        for name, arr in (("fwd", p.fwd), ("bwd", p.bwd)):
            times = np.stack([arr[k] for k in self.kinds], axis=1)
            with np.errstate(invalid="ignore"):
                priced[name] = np.where(np.isfinite(times), times * price[None, :], np.inf).min(axis=1)
        self._fwd_prefix = np.concatenate([[0.0], np.cumsum(priced["fwd"])])
        self._bwd_prefix = np.concatenate([[0.0], np.cumsum(priced["bwd"])])
        self._fronts = self._window_fronts()

    def _root(self, a, b) -> np.ndarray:
        """``sqrt(priced forward work) + sqrt(priced backward work)`` of units ``a..b-1`` (arrays)."""
        with np.errstate(invalid="ignore"):
            return (np.sqrt(self._fwd_prefix[b] - self._fwd_prefix[a])
                    + np.sqrt(self._bwd_prefix[b] - self._bwd_prefix[a]))

    def _window_fronts(self) -> dict:
        """``{k: (A, B)}``, ``ndarray (n+1, FRONT)`` each: for stages k..S-1 covering units j..n-1,
        the Pareto front of (sum over the stages of :meth:`_root`, sum of the round trips of
        their cuts) over every split (cuts allowed anywhere: a relaxation), padded with ``inf``;
        fronts longer than :data:`FRONT` are replaced by the lower-left corners of consecutive
        groups (still below every split)."""
        p = self.problem
        n, S = p.n, p.num_stages
        trip = p.round_trip
        fronts = {}
        A = np.full((n + 1, 1), np.inf)
        B = np.full((n + 1, 1), np.inf)
        A[:n, 0] = self._root(np.arange(n), n)
        B[:n, 0] = 0.0
        fronts[S - 1] = (A, B)
        for k in range(S - 2, 0, -1):
            nA, nB = fronts[k + 1]
            A = np.full((n + 1, FRONT), np.inf)
            B = np.full((n + 1, FRONT), np.inf)
            for j in range(k, n - (S - 1 - k)):
                j2 = np.arange(j + 1, n - (S - 2 - k))
                ca = (self._root(j, j2)[:, None] + nA[j2]).ravel()
                cb = (trip[j2][:, None] + nB[j2]).ravel()
                fin = np.isfinite(ca) & np.isfinite(cb)
                fa, fb = _front(ca[fin], cb[fin])
                A[j, :fa.size], B[j, :fb.size] = fa, fb
            fronts[k] = (A, B)
        return fronts

    def window_need(self, k: int, j: np.ndarray, power: np.ndarray) -> np.ndarray:
        """A lower bound on ``sum_{s>=k} w_s + sum_{s>k} (round trip of stage s's first cut)`` for
        stages k..S-1 covering units ``j..n-1`` on devices of priced power ``power`` (first price;
        arrays broadcast): each stage's least busy time is at least ``root**2 / P_s``
        (``f >= Phi / x``, ``b >= Beta / (P_s - x)`` for the priced power x its forward share has),
        and ``sum root_s**2 / P_s >= (sum root_s)**2 / sum P_s``; minimised over the front of
        :meth:`_window_fronts`."""
        A2, B = self._fronts_sq[k]  # fronts padded with inf: inf * x + inf = inf, never nan
        val = A2[j] * (1.0 / np.maximum(power, 1e-300))[:, None]
        val += B[j]
        return val.min(axis=1)

    @cached_property
    def _fronts_sq(self) -> dict:
        """:meth:`_window_fronts` with the roots squared (what :meth:`window_need` reads), cut to
        the longest front's width (the fronts are left-aligned; most hold one or two points)."""
        out = {}
        for k, (A, B) in self._fronts.items():
            width = max(1, int(np.isfinite(A).sum(axis=1).max()))
            out[k] = (A[:, :width] ** 2, B[:, :width])
        return out

    def work_bound(self) -> float:
        """The priced work bound (seconds): no plan has a period below ``max_pi W_pi / P_pi`` (the
        chain's priced work over the cluster's priced power, module docstring)."""
        P = self.power[self.types.full]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(P > 0, self.work[-1] / np.where(P > 0, P, 1.0), np.inf)
        return float(np.max(ratio))

    # ---- per range, T-independent --------------------------------------------------------------
    def rows(self, a: int, b: int) -> np.ndarray:
        """``ndarray (tau, L)``: per type, the coefficient of each cover row of units ``a..b-1``
        (:func:`~pipeopt.problems.resource.intervals.interval_cover_coefficients`): a worker with
        counts c passes T iff ``min_l c @ rows[:, l] >= 1 / T``."""
        key = (a, b)
        out = self._rows.get(key)
        if out is None:
            F, B = self.problem.load(a, b)
            coef = interval_cover_coefficients(F, B, self.kinds)
            out = np.zeros((self.types.tau, len(coef)))
            kind_coef = np.zeros((len(self.kinds), len(coef)))
            for l, row in enumerate(coef):
                for q, k in enumerate(self.kinds):
                    c = row.get(k, 0.0)
                    if c > 0:
                        out[:, l] += np.where(self.types.res[:, q] > 0, self.types.res[:, q] * min(c, BIG), 0.0)
                        kind_coef[q, l] = min(c, BIG)
            out = np.minimum(out, BIG)
            if len(self._rows) > 200_000:
                self._rows.clear()
                self._kind_rows.clear()
            self._rows[key] = out
            self._kind_rows[key] = kind_coef
        return out

    def kind_rows(self, a: int, b: int) -> np.ndarray:
        """``ndarray (K, L)``: :meth:`rows` per resource kind (``rows = res @ kind_rows``, each
        coefficient capped at :data:`BIG`): a worker with pooled resources R passes T iff
        ``min_l R @ kind_rows[:, l] >= 1 / T`` (up to float rounding)."""
        self.rows(a, b)
        return self._kind_rows[(a, b)]

    def rate(self, a: int, b: int, idx: np.ndarray) -> np.ndarray:
        """Best-split rate (microbatches per second) of units ``a..b-1`` on count vectors ``idx``."""
        return (self.types.comps[idx] @ self.rows(a, b)).min(axis=1)

    def busy(self, a: int, b: int, idx: np.ndarray, T: float) -> np.ndarray:
        """Least busy time ``f + b`` at T of units ``a..b-1`` on count vectors ``idx``
        (:func:`~pipeopt.problems.resource.split.least_busy_many`; ``inf`` where no share passes T).
        The rule depends on the worker only through ``R_k / F_k`` and ``R_k / B_k``, so each worker
        is read as one unit of every kind running loads ``F_k / R_k`` and ``B_k / R_k``."""
        if idx.size == 0:
            return np.zeros(0)
        F, B = self.problem.load(a, b)
        R = self.types.R[idx]
        fw, bw = {}, {}
        with np.errstate(divide="ignore", invalid="ignore"):
            for q, k in enumerate(self.kinds):
                fw[k] = np.where(R[:, q] > 0, F[k] / np.where(R[:, q] > 0, R[:, q], 1.0), np.inf)
                bw[k] = np.where(R[:, q] > 0, B[k] / np.where(R[:, q] > 0, R[:, q], 1.0), np.inf)
        unit = {k: 1.0 for k in self.kinds}
        w, _, _ = least_busy_many(unit, fw, bw, T, kinds=self.kinds)
        for i in np.flatnonzero(np.isnan(w)):  # a free pass, or nothing to choose
            res = {k: float(R[i, q]) for q, k in enumerate(self.kinds)}
            _, f, bb = least_busy(res, F, B, T)
            w[i] = f + bb
        return w

    # ---- the probe -----------------------------------------------------------------------------
    def __call__(self, T: float, deadline: Deadline | None = None) -> Probe:
        """:class:`~pipeopt.backends.bisection.Probe`: feasible with ``(starts, groups)`` and its
        exact period, infeasible (proven), or unknown at the deadline.

        The beam passes of :data:`PROBE_BEAMS` run first only above :attr:`beam_floor`, the largest
        T at which they (or the start's wider passes, :func:`_starts`) failed: below it they
        would almost surely fail again, and near the optimum they cost seconds the exact pass
        needs (GPT-2 XL on 64 server GPUs: 6 s of a 34 s probe). The exact pass decides alone."""
        try:
            found = None
            if T > self.beam_floor:  # a plan fast when T is generous
                found = self.heuristic(T, deadline, PROBE_BEAMS)
                if found is None:
                    self.beam_floor = T
            if found is None:
                found = self.solve(T, deadline)
        except DeadlineReached:
            return Probe(UNKNOWN)
        if found is None:
            return Probe(INFEASIBLE)
        starts, groups = found
        return Probe(FEASIBLE, (starts, groups), self.problem.plan_value(starts, groups))

    def heuristic(self, T: float, deadline: Deadline | None = None, passes=BEAMS) -> tuple[list, list] | None:
        """The beam passes ``passes`` (``(beam, spread)`` pairs, default :data:`BEAMS`) in turn: a
        plan with period <= ``T (1 + RELAX)`` or ``None`` (which proves nothing)."""
        for beam, spread in passes:
            found = self.solve(T, deadline, beam=beam, spread=spread)
            if found is not None:
                return found
        return None

    def solve(self, T: float, deadline: Deadline | None = None, beam: int | None = None,
              spread: float | None = None, ends_ok: np.ndarray | None = None) -> tuple[list, list] | None:
        """A plan ``(starts, groups)`` with period <= ``T (1 + RELAX)``, or ``None`` if there is none.

        Of the plans the last boundary completes (one per start of the last stage, the label of
        least final window state), the one of least period
        (:meth:`~pipeopt.problems.resource.ResourceProblem.plan_value`).

        Parameters
        ----------
        T
            The limit, seconds.
        deadline
            Checked once per boundary and start unit.
        beam
            If given, keep at most this many labels per boundary (those with the most priced
            power left, then the least window state) and try at most this many compositions
            per stage range (the least powerful): a heuristic that finds plans fast at a
            generous T; its ``None`` proves nothing.
        spread
            With ``beam``: try only stage ends whose share of the priced work left is at most
            ``spread`` even shares (``1 / (S - k)``), and the shortest stage.
        ends_ok
            ``ndarray (S, n + 1)`` of bool, or ``None``: stage k may end only at units ``e`` with
            ``ends_ok[k, e]`` (the last stage ends at n). A restriction: its ``None`` proves
            nothing about the whole problem (:func:`_guided`).

        Raises
        ------
        DeadlineReached
            If ``deadline`` passes.
        """
        p = self.problem
        n, S = p.n, p.num_stages
        Tp = T * (1.0 + RELAX)
        if not Tp > 0:
            return None
        D, _ = rules.window_tokens(rules.windows(S), np.ones(S), [True] * S)
        self._D = D
        trip = p.round_trip
        cut_ok = p.cut_time <= Tp
        self._least_rest = self.least_power(Tp, cut_ok, deadline)
        labels = {0: _Labels(np.zeros(1, np.int64), np.full(1, -np.inf), np.full(1, -1), np.full(1, -1))}
        history = [labels]
        for k in range(S - 1):
            ends = np.array([e for e in range(1, n - (S - 1 - k) + 1) if cut_ok[e]], dtype=np.int64)
            if ends_ok is not None:
                ends = ends[ends_ok[k, ends]]
            parts: dict = {}
            first = self._order_key
            for j in sorted(labels):
                if deadline is not None:
                    deadline.check(f"the type DP (stage {k}, start unit {j})")
                lab = labels[j]
                h = rules.window_carry(lab.G, trip[j], D[k], Tp)  # the window state entering stage k
                j2s = ends[ends > j]
                if spread is not None and j2s.size:  # heuristic: stages of at most a few even shares
                    with np.errstate(invalid="ignore", divide="ignore"):  # no priced work left: any end
                        share = (self.work[j2s, first] - self.work[j, first]) / (self.work[-1, first] - self.work[j, first])
                    share = np.nan_to_num(share, nan=0.0)
                    j2s = j2s[(share <= spread / (S - k)) | (j2s == j2s[0])]
                floors = -D[k + 1] * Tp - trip[j2s]  # below them the next stage forgets G
                menus = self.menus(k, j, j2s, Tp, lab, h, floors, beam, deadline)
                self._extend(k, j, Tp, lab, h, floors, menus, parts, beam, deadline)
            labels = {}
            for j2 in sorted(parts):
                lab2 = self._pareto(parts[j2])
                if beam is not None and lab2.u.size > beam:
                    lab2 = self._trim(lab2, j2, Tp, beam)
                if lab2.u.size:
                    labels[j2] = lab2
            if beam is not None and len(labels) > beam:  # heuristic: the ends with the most power left
                score = {j2: float(self._slack(lab2, j2, Tp).max()) for j2, lab2 in labels.items()}
                labels = {j2: labels[j2] for j2 in sorted(sorted(labels, key=lambda e: -score[e])[:beam])}
            history.append(labels)
            if not labels:
                return None
        best = None  # the last stage's start with the plan of least period (a cheap improvement)
        for j in sorted(history[-1]):
            found = self._finish(history, j, Tp, D, trip)
            if found is not None:
                value = p.plan_value(*found)
                if best is None or value < best[0]:
                    best = (value, found)
        return None if best is None else best[1]

    def least_power(self, T: float, cut_ok: np.ndarray, deadline: Deadline | None = None) -> np.ndarray:
        """``ndarray (S + 1, n + 1)``: ``out[s, j]``, the least first-price power that s stages
        covering units ``j..n-1`` at T can have in all (``inf``: none can) - a necessary condition
        on the devices a label leaves, stronger than the priced work ``W / T`` because each stage
        rounds up to a whole composition.

        Each stage ``j..j2-1`` takes at least the least powerful composition whose own rows pass
        T (:meth:`kind_rows`; memory and window rows are left out: a relaxation), found by
        scanning the count vectors in order of power from the stage's priced work, at most
        :data:`LEAST_SCAN` of them (if none passes, the power where the scan stopped is still a
        lower bound); stage ends only where the cut passes T (``cut_ok``), as in the DP. ``T`` is
        read with a relative slack of 1e-9 (float rounding cannot make it cut off a composition
        the DP accepts)."""
        p = self.problem
        n, S = p.n, p.num_stages
        key = (T, cut_ok.tobytes(), LEAST_SCAN)
        if self._least_at is not None and self._least_at[0] == key:  # the beam passes at one T
            return self._least_at[1]
        least = self.least_stage(T, cut_ok, deadline)
        ends_ok = cut_ok.copy()
        ends_ok[n] = True
        out = np.full((S + 1, n + 1), np.inf)
        out[0, n] = 0.0
        masked = np.where(ends_ok[None, :], least, np.inf)  # a stage may end only at a cut that passes
        for s_ in range(1, S + 1):
            out[s_, :n] = (masked[:n] + out[s_ - 1][None, :]).min(axis=1)
        self._least_at = (key, out)
        return out

    def least_stage(self, T: float, cut_ok: np.ndarray, deadline: Deadline | None = None) -> np.ndarray:
        """``ndarray (n + 1, n + 1)``: ``out[j, j2]``, a lower bound on the first-price power of a
        composition (at least one device) whose own rows pass T on units ``j..j2-1`` (``inf``:
        none passes; :meth:`least_power`'s per-stage term, the scan described there). ``cut_ok``
        is only part of the cache key."""
        p = self.problem
        n, first = p.n, self._order_key
        ty = self.types
        key = (T, LEAST_SCAN)
        if self._least_stage_at is not None and self._least_stage_at[0] == key:
            return self._least_stage_at[1]
        least = np.full((n + 1, n + 1), np.inf)  # least[j, j2]: one stage over units j..j2-1
        rate_need = (1.0 - 1e-9) / T
        for j in range(n):
            if deadline is not None:
                deadline.check(f"the type DP's least stage powers (start unit {j})")
            rows, full_rate = self._kind_stack(j)
            j2s = np.arange(j + 1, n + 1)
            reach = full_rate >= rate_need
            j2s, rows = j2s[reach], rows[reach]
            need = (self.work[j2s, first] - self.work[j, first]) / T
            pos = np.searchsorted(self._sorted_power, need * (1 - 1e-7), side="left")
            best = np.full(j2s.size, np.inf)
            todo = np.arange(j2s.size)
            step = min(256, LEAST_SCAN, ty.size)
            for _ in range(LEAST_SCAN // step):
                at = pos[todo][:, None] + np.arange(step)[None, :]  # (m, step)
                valid = at < ty.size
                at_c = np.minimum(at, ty.size - 1)
                rates = np.matmul(self._sorted_R[at_c], rows[todo]).min(axis=2)  # (m, step)
                hit = valid & (rates >= rate_need) & self._sorted_busy[at_c]
                found = hit.any(axis=1)
                best[todo[found]] = self._sorted_power[at[found, hit[found].argmax(axis=1)]]
                pos[todo] += step
                todo = todo[~found & (pos[todo] < ty.size)]
                if not todo.size:
                    break
            # not found within the scan: every composition below pos fails, so the least passing
            # one has at least pos's power (none left: no composition passes)
            best[todo] = np.where(pos[todo] < ty.size, self._sorted_power[np.minimum(pos[todo], ty.size - 1)], np.inf)
            least[j, j2s] = best
        self._least_stage_at = (key, least)
        return least

    def _kind_stack(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`kind_rows` of units ``j..j2-1`` for every end ``j2 = j+1..n``, stacked ``(J, K, L)``
        (padded with copies of the first row: no minimum changes), and the whole cluster's rate
        on each (cached: they do not depend on T)."""
        out = self._kind_stacks.get(j)
        if out is None:
            rows = _stack([self.kind_rows(j, e) for e in range(j + 1, self.problem.n + 1)], len(self.kinds))
            full_rate = np.einsum("k,jkl->jl", self.types.R[self.types.full], rows).min(axis=1)
            out = self._kind_stacks[j] = (rows, full_rate)
        return out

    def _slack(self, lab: _Labels, j: int, T: float) -> np.ndarray:
        """Per label at end ``j``: priced power left beyond the work of the units left, relative to
        that work (the tightest price)."""
        first = self._order_key
        rest = (self.work[-1, first] - self.work[j, first]) / T
        return (self.power[self.types.full - lab.u, first] - rest) / max(rest, 1e-300)

    def _trim(self, lab: _Labels, j: int, T: float, beam: int) -> _Labels:
        """The ``beam`` labels with the most priced power left over the units left (the tightest
        price), ties by the least window state."""
        keep = np.lexsort((lab.G, -self._slack(lab, j, T)))[:beam]
        return _Labels(lab.u[keep], lab.G[keep], lab.prev_j[keep], lab.prev_u[keep])

    def _stacked_rows(self, j: int, j2s: np.ndarray) -> np.ndarray:
        """``ndarray (J, tau, L)``: :meth:`rows` of units ``j..j2-1`` for every end, padded to the
        largest row count with copies of the first row (a copy changes no minimum)."""
        return _stack([self.rows(j, int(e)) for e in j2s], self.types.tau)

    def menus(self, k: int, j: int, j2s: np.ndarray, T: float, lab: _Labels, h: np.ndarray, floors: np.ndarray,
              beam: int | None = None, deadline: Deadline | None = None):
        """The compositions worth trying for stage k = units ``j..j2-1``, for every end ``j2`` in
        ``j2s`` (increasing) at once, given the labels ``lab`` at ``(k, j)`` (entering window
        states ``h``) and the next stage's floors.

        A composition passes the stage's own rows and memory (with distinct devices, it also fits
        the devices some label leaves, :meth:`DeviceTypes.within`); its priced power fits between
        the stage's priced work and what the rest of the chain leaves, and its busy time's lower
        bound ``root**2 / P`` with the most favourable label leaves the rest of the window rows
        room (:meth:`window_need`) - the necessary conditions of the module docstring; and every
        composition with one device fewer that passes too has a busy time above the end's
        threshold ``floor - max(h)`` (at or below it the window state is clipped and the smaller
        composition dominates). A composition is dropped as soon as one passing predecessor has
        ``2 tau <= threshold`` (``tau`` its best-split time from the cover rows; the least busy
        time is at most ``2 tau``), so least busy times are computed only for those kept and
        their predecessors. With ``beam``, at most that many (the least powerful) per end.

        Returns
        -------
        (idx, w, wp, block, j2s)
            Count-vector indices, their least busy times at T, the least busy time of their
            passing predecessors (``inf`` if none), and the position in ``j2s`` of their end,
            sorted by end and then by the first price's power; ``j2s`` is cut before the first
            end no worker reaches within T (nor does it any later end).

        Raises
        ------
        DeadlineReached
            If ``deadline`` passes (checked per block of :data:`CHUNK` compositions).
        """
        ty, first = self.types, self._order_key
        rows = self._stacked_rows(j, j2s)
        full_rate = (rows * ty.counts[None, :, None]).sum(axis=1).min(axis=1)
        reach = np.flatnonzero(full_rate < 1.0 / T)
        J = int(reach[0]) if reach.size else j2s.size
        j2s, rows, floors = j2s[:J], rows[:J], floors[:J]
        theta = floors - h.max()
        need = (self.work[j2s] - self.work[j]) / T  # (J, P) priced power each stage needs
        top = self.power[ty.full] - (self.work[j] - self.work[0] + self.work[-1] - self.work[j2s]) / T
        # the first price: what the labels' stages used and the least power of the stages after k
        used = float(self.power[lab.u, first].min())
        top[:, first] = np.minimum(top[:, first], self.power[ty.full, first] - used
                                   - self._least_rest[self.problem.num_stages - 1 - k, j2s])
        lo = np.searchsorted(self._sorted_power, need[:, first] * (1 - 1e-12), side="left")
        hi = np.maximum(lo, np.searchsorted(self._sorted_power, top[:, first] * (1 + 1e-12) + 1e-300, side="right"))
        window = bool(k + 1 < self.problem.num_stages)
        if window:  # the window rows with the most favourable label: least entering state, most power left
            A2, B = (a[j2s] for a in self._fronts_sq[k + 1])
            with np.errstate(invalid="ignore"):
                root2 = self._root(j, j2s) ** 2
            left_max = float(self.power[ty.full - lab.u, first].max())
            floor_k1 = float(-self._D[k + 1] * T)
        else:
            A2 = B = np.zeros((J, 1))
            root2, left_max, floor_k1 = np.zeros(J), 0.0, 0.0
        mem_need = np.asarray(self.problem.table.memory(j, j2s, self.problem.in_flight(k)), dtype=float)
        total = int((hi - lo).sum())
        out = [np.empty(total, np.int64) for _ in range(3)]
        if deadline is not None:
            deadline.check(f"the type DP's menus (stage {k}, start unit {j})")
        # distinct devices: only the subsets of the devices some label leaves (with types the mask
        # was only measured as a cost: about 1 s a probe on GPT-2 XL 4x16, before prefix_min's
        # faster form; it is not applied there)
        allowed = ty.within(ty.full - lab.u) if ty.subsets else self._everything
        m = menu_scan(self._order, lo, hi, ty.ndev, allowed, self.power, np.ascontiguousarray(need * (1 - 1e-12)),
                      np.ascontiguousarray(top * (1 + 1e-12) + 1e-300), first, window, np.ascontiguousarray(A2),
                      np.ascontiguousarray(B), left_max, root2, float(h.min()),
                      np.ascontiguousarray(self.problem.round_trip[j2s], dtype=float), floor_k1, 1e-9 * T,
                      0 if beam is None else BEAM_SCAN * int(beam), ty.comps, rows, 1.0 / T, mem_need,
                      self._mem_cap, ty.stride, np.ascontiguousarray(theta, dtype=float), *out)
        idx, block, pmask = (a[:m] for a in out)
        if beam is not None and idx.size:  # the least powerful first: menus are sorted by end, then power
            start = np.searchsorted(block, block, side="left")
            rank = np.arange(idx.size) - start
            sel = rank < beam
            idx, block, pmask = idx[sel], block[sel], pmask[sel]
        if idx.size == 0:
            return idx, np.zeros(0), np.zeros(0), block, j2s
        ok_p = ((pmask[:, None] >> np.arange(ty.tau)[None, :]) & 1).astype(bool)  # passing predecessors
        preds = np.where(ok_p, idx[:, None] - ty.stride[None, :], 0)
        pi, pt = np.nonzero(ok_p)
        both = np.concatenate([idx, preds[pi, pt]])
        bb = np.concatenate([block, block[pi]])
        busy = np.empty(both.size)
        for lo_c in range(0, both.size, CHUNK):
            if deadline is not None:
                deadline.check(f"the type DP's busy times (stage {k}, start unit {j})")
            sl = slice(lo_c, lo_c + CHUNK)
            busy[sl] = self.busy_ranges(j, j2s, bb[sl], both[sl], T)
        w = busy[:idx.size]
        vals = np.full(ok_p.shape, np.inf)
        vals[pi, pt] = busy[idx.size:]
        wp = vals.min(axis=1)
        fin = np.isfinite(w) & (wp > theta[block])
        return idx[fin], w[fin], wp[fin], block[fin], j2s

    def busy_ranges(self, j: int, j2s: np.ndarray, block: np.ndarray, idx: np.ndarray, T: float) -> np.ndarray:
        """:meth:`busy` of units ``j..j2s[block]-1`` on count vectors ``idx`` (element by element)."""
        if idx.size == 0:
            return np.zeros(0)
        Fd, Bd = self.problem.loads(np.full(j2s.size, j), j2s)
        R = self.types.R[idx]
        fw, bw = {}, {}
        with np.errstate(divide="ignore", invalid="ignore"):
            for q, kd in enumerate(self.kinds):
                pos = R[:, q] > 0
                safe = np.where(pos, R[:, q], 1.0)
                fw[kd] = np.where(pos, Fd[kd][block] / safe, np.inf)
                bw[kd] = np.where(pos, Bd[kd][block] / safe, np.inf)
        w, _, _ = least_busy_many({kd: 1.0 for kd in self.kinds}, fw, bw, T, kinds=self.kinds)
        for i in np.flatnonzero(np.isnan(w)):  # a free pass, or nothing to choose
            res = {kd: float(R[i, q]) for q, kd in enumerate(self.kinds)}
            F = {kd: float(Fd[kd][block[i]]) for kd in self.kinds}
            B = {kd: float(Bd[kd][block[i]]) for kd in self.kinds}
            _, f, bb = least_busy(res, F, B, T)
            w[i] = f + bb
        return w

    def _extend(self, k: int, j: int, T: float, lab: _Labels, h: np.ndarray, floors: np.ndarray, menus,
                parts: dict, beam: int | None, deadline: Deadline | None = None) -> None:
        """Every label at ``(k, j)`` times every menu composition of stage k (units ``j..j2-1``, every
        end) that leaves the rest enough priced power of the first price: into ``parts[j2]``, the
        labels at ``(k + 1, j2)`` that pass the rules and the necessary conditions (:meth:`_join`).

        One pass of :func:`~pipeopt.problems.resource.kernels.least_pairs` over the pairs (no pair
        is materialised: one boundary can pair billions) keeps the least window state per end and
        count vector; ``deadline`` is checked every :data:`PAIRS_CHUNK` label x item pairs (runs of
        labels)."""
        idx, _, _, block, j2s = menus
        if idx.size == 0:
            return
        ty, first = self.types, self._order_key
        J = j2s.size
        rest = (self.work[-1] - self.work[j2s]) / T  # (J, P)
        # the first price: at least the least power of the stages left (each a whole composition)
        rest[:, first] = np.maximum(rest[:, first], self._least_rest[self.problem.num_stages - 1 - k, j2s])
        # label l may take the menu items of end b whose first-price power leaves the rest its work
        room = self.power[ty.full - lab.u, first][:, None] - rest[None, :, first]  # (L, J)
        room = room * (1 + 1e-12) + 1e-300
        p0 = self.power[idx, first]
        best, own_l, touched = self._pair_buffers(J * ty.size)
        n_touched = np.zeros(1, np.int64)
        rooms = ty.full - lab.u  # the count vectors the labels leave
        room_p = ty.pack(rooms)
        guard = np.int64(ty.guard)
        _, w, wp, _, _ = menus
        perm, cells, lab_g = self._item_groups(idx, block, rooms, J, beam)
        item_c = idx if perm is None else idx[perm]
        if perm is not None:
            p0, w, wp = p0[perm], w[perm], wp[perm]
        item_p = ty.pack(item_c)
        step = max(1, PAIRS_CHUNK // idx.size)  # runs of labels of at most PAIRS_CHUNK pairs
        cuts = list(range(0, lab.u.size, step)) + [lab.u.size]
        try:
            for lo, hi in itertools.pairwise(cuts):
                if deadline is not None:
                    deadline.check(f"the type DP's pairs (stage {k}, start unit {j})")
                least_pairs(lab.u[lo:hi], h[lo:hi], room[lo:hi], room_p[lo:hi], lab_g[lo:hi], lo, item_c, item_p, p0,
                            w, wp, cells, floors, 0 if beam is None else int(beam), guard, ty.size,
                            best, own_l, touched, n_touched)
        finally:
            keys = touched[:n_touched[0]].copy()
            G = best[keys]
            li = own_l[keys]
            best[keys] = np.inf  # the buffer is all inf again, whatever happened
        if keys.size:
            self._join(k, j, T, lab, floors, j2s, rest, li, keys // ty.size, keys % ty.size, G, parts)

    def _join(self, k: int, j: int, T: float, lab: _Labels, floors: np.ndarray, j2s: np.ndarray, rest: np.ndarray,
              li: np.ndarray, b: np.ndarray, nu: np.ndarray, G: np.ndarray, parts: dict) -> None:
        """The least pairs of :meth:`_extend` (label ``li``, end position ``b`` in ``j2s``, count vector
        ``nu``, window state ``G``, one per end and count vector) that pass the necessary conditions
        of the rest (priced power, devices, memory, :meth:`window_need`): into ``parts[j2]``."""
        ty, S, first = self.types, self.problem.num_stages, self._order_key
        left = ty.full - nu
        ok = (self.power[left] >= rest[b] * (1 - 1e-12)).all(axis=1) & (ty.ndev[left] >= S - 1 - k)
        if self.memory_limited:
            ok &= rules.fits(self.mem_rest[j2s[b]], ty.M[left])
        li, nu, b, G = li[ok], nu[ok], b[ok], G[ok]
        if not li.size:
            return
        # the window rows ending at the last stage: what the rest adds at least must fit
        rest_need = self.window_need(k + 1, j2s[b], self.power[ty.full - nu, first])
        enter = rules.window_carry(G, self.problem.round_trip[j2s[b]], self._D[k + 1], T)
        ok = enter + rest_need <= 1e-9 * T
        li, nu, b, G = li[ok], nu[ok], b[ok], G[ok]
        if not li.size:
            return
        G = np.maximum(G, floors[b])
        order = np.argsort(b, kind="stable")
        li, nu, b, G = li[order], nu[order], b[order], G[order]
        cuts = np.flatnonzero(np.diff(b)) + 1
        for lo_i, hi_i in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [b.size]]), strict=True):
            parts.setdefault(int(j2s[b[lo_i]]), []).append(
                (nu[lo_i:hi_i], G[lo_i:hi_i], np.full(hi_i - lo_i, j), lab.u[li[lo_i:hi_i]]))

    def _item_groups(self, idx: np.ndarray, block: np.ndarray, rooms: np.ndarray, J: int,
                     beam: int | None) -> tuple:
        """The menu items in groups for :func:`~.kernels.least_pairs`: ``(perm, cells, lab_g)``, the
        items' order (by end, group, first-price power; ``None``: the menus' own), each (end,
        group) cell's first position ``(J, G + 1)`` and per label (``rooms``: the count vectors
        the labels leave) the groups it may take.

        An exact pass groups the items by :data:`GROUP_BITS` tests ``c_t > theta`` on their
        counts (:meth:`_group_tests`); an item with such a test true needs ``room_t > theta``, so a
        label scans only the groups whose tests its room passes (the device test rejects the
        others anyway: GPT-2 XL on 64 devices of 4 types, 84 % of the pairs within the power
        room; ResNet-50 on 16 distinct devices at 23 ms, 90 %). A beam pass (or
        :data:`GROUP_BITS` 0): one group, the menus' own order."""
        tests = self._group_tests(idx) if beam is None else []
        if not tests:
            cells = np.searchsorted(block, np.arange(J + 1), side="left")
            return None, np.stack([cells[:-1], cells[1:]], axis=1), np.zeros(rooms.size, np.int64)
        comps = self.types.comps
        gid = np.zeros(idx.size, np.int64)
        lab_g = np.zeros(rooms.size, np.int64)
        for q, (t, theta) in enumerate(tests):
            gid |= (comps[idx, t] > theta).astype(np.int64) << q
            lab_g |= (comps[rooms, t] > theta).astype(np.int64) << q
        G = 1 << len(tests)
        cell = block * G + gid
        perm = np.argsort(cell, kind="stable")  # the menus are sorted by end, then power: kept per cell
        flat = np.searchsorted(cell[perm], np.arange(J * G + 1), side="left")
        cells = flat[np.arange(J)[:, None] * G + np.arange(G + 1)[None, :]]
        return perm, cells, lab_g

    def _group_tests(self, idx: np.ndarray) -> list[tuple[int, int]]:
        """At most :data:`GROUP_BITS` tests ``(t, theta)``, "the item has more than theta devices of
        type t", that split the menu items ``idx`` (on a sample): with more types than tests, one
        device or more of the types the items use most; otherwise, per type, thresholds at even
        quantiles of the items' counts (distinct values below the largest)."""
        ty = self.types
        sample = ty.comps[idx[::max(1, idx.size // 4096)]]
        if ty.tau > GROUP_BITS:
            used = (sample > 0).sum(axis=0)
            return [(int(t), 0) for t in np.argsort(-used, kind="stable")[:GROUP_BITS] if used[t] > 0]
        per = GROUP_BITS // ty.tau
        ordered = np.sort(sample, axis=0)  # the quantiles (numpy's "lower" method) read off one sort
        at = np.floor(np.arange(1, per + 1) / (per + 1) * (len(ordered) - 1)).astype(np.int64)
        levels, top = ordered[at].T.tolist(), ordered[-1].tolist()
        return [(t, v) for t in range(ty.tau) for v in sorted(set(levels[t])) if v < top[t]]

    def _pair_buffers(self, size: int) -> tuple:
        """Reused buffers of :func:`~.kernels.least_pairs` for ``size`` keys: ``best`` (all ``inf``
        between calls), ``own_l``, ``touched``."""
        if self._pairbuf is None or self._pairbuf[0].size < size:
            self._pairbuf = (np.full(size, np.inf), np.empty(size, np.int64), np.empty(size, np.int64))
        return self._pairbuf

    def _pareto(self, parts: list) -> _Labels:
        """The non-dominated labels (module docstring) among ``parts`` at one boundary."""
        ty = self.types
        u = np.concatenate([q[0] for q in parts])
        G = np.concatenate([q[1] for q in parts])
        pj = np.concatenate([q[2] for q in parts])
        pu = np.concatenate([q[3] for q in parts])
        order = np.lexsort((G, u))
        u, G, pj, pu = u[order], G[order], pj[order], pu[order]
        first = np.concatenate([[True], u[1:] != u[:-1]])  # least G per count vector
        u, G, pj, pu = u[first], G[first], pj[first], pu[first]
        if u.size > 1:
            if u.size * u.size < PAIRWISE * ty.size:  # few labels: pairwise
                keep = undominated(ty.comps[u], G)
            else:
                best = np.full(ty.size, np.inf)
                best[u] = G
                keep = G < ty.below(best)[u]
            u, G, pj, pu = u[keep], G[keep], pj[keep], pu[keep]
        return _Labels(u, G, pj, pu)

    def _finish(self, history: list, j: int, T: float, D: np.ndarray, trip: np.ndarray):
        """The last stage, units ``j..n-1``, takes every device left: among the labels at the last
        boundary and j it completes, the one of least final window state, as a plan."""
        p, ty = self.problem, self.types
        n, S = p.n, p.num_stages
        k = S - 1
        lab = history[k][j]
        c = ty.full - lab.u
        ok = (ty.ndev[c] >= 1) & (self.rate(j, n, c) >= 1.0 / T) & rules.fits(p.stage_memory(j, n, k), ty.M[c])
        if not ok.any():
            return None
        sel = np.flatnonzero(ok)
        w = self.busy(j, n, c[sel], T)
        G = rules.window_step(lab.G[sel], trip[j], w, D[k], 0.0, T)[0]
        G = np.where(np.isfinite(G), G, np.inf)
        best = int(np.argmin(G))
        if not G[best] <= 0.0:
            return None
        return self._plan(history, j, int(lab.u[sel[best]]))

    def _plan(self, history: list, j: int, u: int) -> tuple[list, list]:
        """Walk the labels back from the last boundary: stage starts and workers."""
        ty, p = self.types, self.problem
        S = p.num_stages
        comps = [ty.comps[ty.full - u]]
        starts = [j]
        for k in range(S - 1, 0, -1):
            lab = history[k][j]
            at = int(np.flatnonzero(lab.u == u)[0])
            pj, pu = int(lab.prev_j[at]), int(lab.prev_u[at])
            comps.append(ty.comps[u - pu])
            j, u = pj, pu
            if k > 1:
                starts.append(j)
        comps = comps[::-1]
        starts = starts[::-1] if S > 1 else []
        counts = np.array(comps).T  # (tau, S)
        return starts, p.groups_from_counts(counts.tolist())


def _stack(mats: list[np.ndarray], height: int) -> np.ndarray:
    """``ndarray (len(mats), height, L)``: the ``(height, L_i)`` matrices of cover rows padded to
    the widest with copies of their first column (a copy changes no minimum over the rows)."""
    out = np.empty((len(mats), height, max((m.shape[1] for m in mats), default=1)))
    for b, m in enumerate(mats):
        out[b, :, :m.shape[1]] = m
        out[b, :, m.shape[1]:] = m[:, :1]
    return out


def _front(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Pareto front (least a, least b) of points ``(a, b)``, at most :data:`FRONT` points:
    beyond that, consecutive groups become their lower-left corners (below every point)."""
    if a.size == 0:
        return a, b
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    keep = b < np.minimum.accumulate(np.concatenate([[np.inf], b[:-1]]))
    a, b = a[keep], b[keep]
    if a.size > FRONT:
        groups = np.array_split(np.arange(a.size), FRONT)
        a = np.array([a[g[0]] for g in groups])
        b = np.array([b[g[-1]] for g in groups])
    return a, b


class _TopClock:
    """The type DP's probe as the bisection sees it, with one change to the clock: a probe at a
    limit just below the best plan found so far (the starts' or an earlier probe's, within the
    bisection's relative tolerance) runs on :data:`TOP_CLOCK` of the solve's time left instead of
    the bisection's share (never beyond the solve's deadline). The answers are the probe's own:
    only how long it may take changes, so every claim stays a proof.

    Parameters
    ----------
    probe
        :class:`TypesProbe`.
    deadline
        The solve's :class:`~pipeopt.backends.deadline.Deadline`.
    rel_tol
        The bisection's relative gap (a limit ``T >= best / (1 + rel_tol)`` is "just below").
    """

    def __init__(self, probe: TypesProbe, deadline: Deadline, rel_tol: float):
        self.probe, self.deadline, self.rel_tol = probe, deadline, rel_tol
        self.best = math.inf  # least period of a plan seen (starts and feasible probes)

    def seen(self, value: float) -> None:
        """Record a plan's period (seconds)."""
        if math.isfinite(value):
            self.best = min(self.best, float(value))

    def __call__(self, T: float, clock: Deadline | None = None) -> Probe:
        if (clock is not None and self.deadline.bounded and math.isfinite(self.best)
                and T * (1.0 + self.rel_tol) >= self.best):
            seconds = max(clock.remaining(), TOP_CLOCK * self.deadline.remaining())
            if seconds > 0:
                clock = self.deadline.sub(seconds=seconds)
        out = self.probe(T, clock)
        if out.outcome == FEASIBLE and out.value is not None:
            self.seen(out.value)
        return out


def _starts(problem: GroupProblem, probe: TypesProbe):
    """Heuristic starts: Algorithm 2's and round-robin's groupings with the binary-search
    partition (the MILP and CP-SAT methods' starts, :mod:`pipeopt.problems.resource.group`), then
    the type DP's beam passes (:meth:`TypesProbe.heuristic`) bisected between the priced work
    bound (:meth:`TypesProbe.work_bound`) and the best plan so far, with at most
    :data:`START_SHARE` of the time; every plan they find is a start."""
    from .group import _starts as group_starts

    heuristics = group_starts(problem)

    def starts(deadline: Deadline) -> list[tuple]:
        out = heuristics(deadline)
        values = [problem.plan_value(*cand) for cand in out]
        hi = min((v for v in values if math.isfinite(v)), default=None)
        lo = probe.work_bound()
        sub = deadline.sub(fraction=START_SHARE)
        try:
            if hi is None:  # nothing fits memory yet: a limit every plan that fits passes
                found = probe.heuristic(top_limit(problem), sub)
                if found is None:
                    return out
                out.append(found)
                hi = problem.plan_value(*found)
            while hi - lo > START_GAP * lo and not sub.expired():
                mid = 0.5 * (lo + hi)
                found = probe.heuristic(mid, sub, START_BEAMS)
                if found is None:
                    lo = mid
                    probe.beam_floor = max(probe.beam_floor, mid)  # the probe's passes are among these
                else:
                    out.append(found)
                    hi = min(mid, problem.plan_value(*found))
        except DeadlineReached:
            pass
        return out

    return starts


def solve_dp(problem: GroupProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
             threads: int = 2) -> Result:
    """Exact grouping + partition + split by the DP over device types at fixed T, bisected on T.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.resource.GroupProblem`.
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline`, for everything
        (bounds, starts, every probe).
    solver
        Used by the lower bound's work LP only (HiGHS in this process) - accepted and ignored.
    seed, threads
        Unused (the DP is deterministic and single-threaded).

    Returns
    -------
    Result
        ``OPTIMAL`` (within a relative gap of 1e-4) or ``TIME_LIMIT`` with the incumbent and the
        proven bound; each stage's devices and forward shares in the plan. ``info["types"]``:
        the devices of each type.

    Raises
    ------
    InfeasibleError
        If the DP proved that no plan fits memory.

    With more count vectors than :data:`MAX_COUNT_VECTORS` (about 21 distinct devices), the
    group MILP (:func:`pipeopt.problems.resource.group.solve_milp`) solves the problem on the same
    clock instead; ``info["fallback"]`` says so, so the default method always answers.
    """
    deadline = Deadline.of(time_limit)
    size = math.prod(len(cls) + 1 for cls in problem.device_classes)
    if size > MAX_COUNT_VECTORS:
        return _fallback(problem, deadline, solver, seed, threads,
                         f"{size:,} count vectors, more than the type DP's {MAX_COUNT_VECTORS:,}: "
                         f"solved by the group milp")
    probe = TypesProbe(problem)
    types = [int(c) for c in probe.types.counts]
    clocked = _TopClock(probe, deadline, MIN_REL_GAP)
    heuristics = _starts(problem, probe)
    started: list[tuple] = []  # the starts' plans, for the polish

    def starts(dl: Deadline) -> list[tuple]:
        out = heuristics(dl)
        for cand in out:
            clocked.seen(problem.plan_value(*cand))
        started[:] = out
        return out

    def raise_lower(lower: float, top: float, dl: Deadline) -> tuple[float, list]:
        bound = relaxed_bound(probe, lower, top, dl.sub(fraction=RELAX_SHARE))
        guided = _guided(probe, bound, top, dl.sub(fraction=GUIDE_SHARE))
        return bound, guided + improve_best(problem, [*started, *guided], dl.sub(fraction=POLISH_SHARE))

    return exact_search(problem, "types", clocked, deadline, starts,
                        {"bound": "largest T the type DP or its stage relaxation (relax.py) proved infeasible",
                         "types": types, "count_vectors": probe.types.size}, probe_top=True,
                        first_top_share=FIRST_TOP_SHARE, step_share=STEP_SHARE, raise_lower=raise_lower)


def _guided(probe: TypesProbe, bound: float, top: float, deadline: Deadline) -> list[tuple]:
    """Plans of the type DP restricted to stage ends near the stage relaxation's plans.

    The relaxed plans just above the relaxation's ``bound`` (:func:`~.relax.guide_splits`) give
    splits; the exact type DP with every stage end within :data:`GUIDE_RADIUS` units of one of
    theirs (:meth:`TypesProbe.solve`'s ``ends_ok``: far fewer stage ranges than the whole DP) is
    bisected between ``bound`` and ``top`` (the incumbent's period), until it rejects
    :data:`GUIDE_MISSES` limits in a row. A heuristic: what the
    restricted DP rejects proves nothing. GPT-2 XL over 64 mixed devices, seed 2: the local
    search's 8.58 ms -> the optimum, 8.4406 ms, in about 2 s.

    Returns
    -------
    list of (starts, groups)
        Every plan found (better ones last); empty if none or at the deadline.
    """
    problem = probe.problem
    n, S = problem.n, problem.num_stages
    out: list[tuple] = []
    try:
        splits = guide_splits(probe, bound, top, deadline)
        if not splits:
            return out
        ends_ok = np.zeros((S, n + 1), dtype=bool)
        for split in splits:
            for k, end in enumerate(split):
                ends_ok[k, max(1, end - GUIDE_RADIUS):min(n, end + GUIDE_RADIUS) + 1] = True
        lo, hi, misses = bound, top, 0
        while hi - lo > MIN_REL_GAP * lo and misses < GUIDE_MISSES:
            mid = 0.5 * (lo + hi)
            found = probe.solve(mid, deadline, ends_ok=ends_ok)
            if found is None:
                lo, misses = mid, misses + 1
            else:
                out.append(found)
                hi, misses = min(mid, problem.plan_value(*found)), 0
    except DeadlineReached:
        pass
    return out


def _fallback(problem: GroupProblem, deadline: Deadline, solver, seed, threads, why: str) -> Result:
    """The group MILP in place of the type DP (too many count vectors), its result named ``types``."""
    from .group import solve_milp

    res = solve_milp(problem, time_limit=deadline, solver=solver, seed=seed, threads=threads)
    return res.as_fallback("types", why)
