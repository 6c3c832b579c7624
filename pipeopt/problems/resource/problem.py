"""Duan & Wu's resource problems: allocate, joint, group (docs/problems.md).

All three share :class:`ResourceProblem`: the per-unit forward and backward times of every
resource kind, the cut transfer times and the memory of a contiguous stage, the exact
objective of a partition on workers (:meth:`ResourceProblem.period`, the best shares
included) and the translation of cut positions and device groups into a
:class:`~pipeopt.plan.Plan` scored by :func:`~pipeopt.cost.evaluate`.

The objective is evaluate's ``bottleneck``: the 1F1B steady period with its window rows
(:func:`pipeopt.cost.rules.steady_period`). A split-execution stage keeps ``2 k``
microbatches in flight (``k = S - s``) and adds ``f + b`` to the window rows through it, so
its best share depends on the period: :meth:`ResourceProblem.check` decides "period <= T"
exactly, :class:`ChainProbe` is the exact DP over the splits of the chain on fixed workers at
a trial T, and both are bisected on T.

Scope of the models (the exact methods rely on it; the constructors check it): the
objective is the steady-state bottleneck with communication overlapped (the default
:class:`~pipeopt.instance.Settings`), no replication, one worker per stage; in the split
space every stage runs split execution.

References
----------
Duan, Y. and Wu, J., *Optimizing Resource Allocation in Pipeline Parallelism for Distributed
DNN Training*, ICPADS 2022, doi 10.1109/ICPADS56603.2022.00029.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ...backends.bisection import FEASIBLE, INFEASIBLE, UNKNOWN, Bisection, Probe, bisect
from ...backends.deadline import Deadline, DeadlineReached
from ...cost import CostTable, check_plan, rules, stage_compute
from ...cost.table import refuse_recompute
from ...cost.ties import refuse_ties
from ...cost.transient import refuse_transient
from ...cost.tolerance import BISECTION_WIDTH, SUM_ORDER
from ...errors import InvalidProblemError
from ...instance import Instance
from ..partition.problem import check_stage_count
from ...plan import Plan, Stage
from ...result import Result
from .kernels import chain_dp
from .split import best_split, least_busy, least_busy_many, theorem_split

SPLIT_MODES = ("split", "sequential", "theorem")


@dataclass
class Check:
    """What :meth:`ResourceProblem.check` finds for a plan at a limit T (seconds).

    Attributes
    ----------
    ok
        The plan has period <= T with the shares of the mode (split: the best shares at T).
    over
        ``[(s, a, b, group)]``: stages that cannot pass T on their own - over memory, or
        no share keeps both passes within T (sequential: ``tau > T``).
    cuts
        Stage starts whose cut transfer exceeds T.
    row
        ``(i, l)``: the first window row found to fail (stages i..l), or ``None``.
    ops
        Per stage ``(beta, f, b)``: the shares and the forward and backward op times at T
        (``(None, inf, inf)`` for a stage in ``over``).
    """

    ok: bool
    over: list
    cuts: list
    row: tuple | None
    ops: list


class ResourceProblem:
    """Data shared by the allocate, joint and group problems (a mixin of the three classes).

    Subclasses provide ``instance`` and :attr:`num_stages`. Units are those of the chain
    (:class:`pipeopt.graph.Chain`): layers, with pinned input layers glued to the first one.

    **The objective.** A plan's value is :func:`pipeopt.evaluate`'s ``bottleneck``, the 1F1B
    steady period :func:`pipeopt.cost.rules.steady_period` with its window rows. In the split
    space every stage runs split execution (its forward and backward shares concurrently,
    ``2 k`` microbatches in flight, ``k = S - s``), and the shares are a choice: the value of
    a partition on workers is the least period over all shares, :meth:`period`. At a trial
    period T the best share of every stage is the one of least ``f + b`` with ``f, b <= T``
    (:func:`~pipeopt.problems.resource.split.least_busy`), whatever the other stages: the
    window rows only bound sums of ``f_s + b_s``. So "is the period of this plan <= T?" is
    exact (:meth:`check`), and the period is the least T that passes (bisected to the float).
    """

    instance: Instance

    def _check_settings(self) -> None:
        refuse_ties(self.instance, "the resource problems (joint, group, allocate)")
        refuse_transient(self.instance, "the resource problems (joint, group, allocate)")
        s = self.instance.settings
        if s.objective != "bottleneck":
            raise InvalidProblemError(
                f"the resource problems minimise the bottleneck; objective {s.objective!r} is not supported"
            )
        if not s.overlap:
            raise InvalidProblemError("the resource problems assume communication overlaps compute (overlap=True)")

    # ---- per-unit data -----------------------------------------------------------------
    @property
    def n(self) -> int:
        """Number of units of the chain."""
        return self.instance.chain.n

    @cached_property
    def kinds(self) -> tuple:
        """Resource kinds that some layer can run on and some device has, sorted."""
        have = set(self.instance.cluster.kinds)
        return tuple(k for k in self.instance.chain.kinds if k in have)

    @cached_property
    def table(self) -> CostTable:
        """The cost model tabulated over the chain for S stages (:class:`pipeopt.cost.CostTable`)."""
        return CostTable(self.instance, self.num_stages)

    @cached_property
    def fwd(self) -> dict:
        """``dict[kind, ndarray (n,)]``: forward seconds of each unit on one unit of the kind."""
        return {k: self.instance.chain.fwd[k] for k in self.kinds}

    @cached_property
    def bwd(self) -> dict:
        """``dict[kind, ndarray (n,)]``: backward seconds of each unit on one unit of the kind."""
        return {k: self.instance.chain.bwd[k] for k in self.kinds}

    def load(self, a: int, b: int) -> tuple[dict, dict]:
        """F_k and B_k of units ``a..b-1``: ``(dict[kind, s], dict[kind, s])``, ``inf`` if a unit cannot run on k."""
        return self.table.load(a, b, self.kinds)

    @cached_property
    def load_prefix(self) -> dict:
        """``{(pass, kind): (prefix of the finite seconds, prefix of the units that cannot run)}``,
        ``ndarray (n+1,)`` each (pass ``"fwd"`` or ``"bwd"``): :meth:`loads` of many ranges at once."""
        out = {}
        for name, arrs in (("fwd", self.fwd), ("bwd", self.bwd)):
            for k, v in arrs.items():
                finite = np.isfinite(v)
                out[name, k] = (np.concatenate([[0.0], np.cumsum(np.where(finite, v, 0.0))]),
                                np.concatenate([[0], np.cumsum(~finite)]))
        return out

    @cached_property
    def ranges(self) -> tuple[np.ndarray, np.ndarray, dict, dict]:
        """Every unit range ``a..b-1`` (``0 <= a < b <= n``) and its loads: ``(a, b, F, B)``,
        the index arrays of :func:`numpy.triu_indices` ``(n + 1, 1)`` and :meth:`loads` of them
        (the chain DP's arrays, computed once per problem)."""
        ii, jj = np.triu_indices(self.n + 1, 1)
        F, B = self.loads(ii, jj)
        return ii, jj, F, B

    def range_memory(self, stage: int, mode: str = "split") -> np.ndarray:
        """Bytes every unit range of :attr:`ranges` needs as stage ``stage`` under ``mode``
        (:meth:`stage_memory`, vectorised; cached)."""
        key = (stage, mode)
        cache = self._memory_cache
        if key not in cache:
            ii, jj, _, _ = self.ranges
            cache[key] = self.table.memory(ii, jj, self.in_flight(stage, mode))
        return cache[key]

    @cached_property
    def _memory_cache(self) -> dict:
        return {}

    def range_busy(self, res: dict, T: float) -> np.ndarray:
        """``ndarray (P,)``: the least busy time ``f + b`` (seconds) of every unit range of
        :attr:`ranges` on resources ``res`` with both passes within T (split execution,
        :func:`~pipeopt.problems.resource.split.least_busy_many`), ``inf`` where no share passes
        T; memory aside."""
        _, _, F, B = self.ranges
        w, _, _ = least_busy_many(res, F, B, T, kinds=self.kinds)
        for q in np.flatnonzero(np.isnan(w)):  # a free pass, or nothing to choose
            _, f, b = least_busy(res, {k: float(v[q]) for k, v in F.items()}, {k: float(v[q]) for k, v in B.items()}, T)
            w[q] = f + b
        return w

    def loads(self, a, b) -> tuple[dict, dict]:
        """:meth:`load` of many unit ranges: ``a``, ``b`` integer arrays broadcast together;
        ``dict[kind, ndarray]`` each."""
        out = []
        for name in ("fwd", "bwd"):
            d = {}
            for k in self.kinds:
                s, bad = self.load_prefix[name, k]
                d[k] = np.where(bad[b] - bad[a] > 0, np.inf, s[b] - s[a])
            out.append(d)
        return out[0], out[1]

    @property
    def cut_time(self) -> np.ndarray:
        """``ndarray (n+1,)``: seconds the busier direction of the cut before unit c is busy per
        microbatch (:attr:`CostTable.cut_time`, one link; 0 at both ends): the cut's own row."""
        return self.table.cut_time

    @property
    def round_trip(self) -> np.ndarray:
        """``ndarray (n+1,)``: seconds of one microbatch's activations forward plus gradients back
        over the cut before unit c (:attr:`CostTable.round_trip`): what it adds to the window rows."""
        return self.table.round_trip

    # ---- memory ------------------------------------------------------------------------
    def in_flight(self, stage: int, mode: str = "split") -> int:
        """Microbatches stage ``stage`` keeps: ``S - s`` sequential, ``2 (S - s)`` with split
        execution (``"split"``, ``"theorem"``; :func:`pipeopt.cost.rules.in_flight`)."""
        return int(rules.in_flight(stage, self.num_stages, split=mode != "sequential"))

    def stage_memory(self, a: int, b: int, stage: int, mode: str = "split") -> float:
        """Bytes that units ``a..b-1`` need as stage ``stage`` (activations of the microbatches in
        flight under ``mode``, :meth:`in_flight`, and the weight versions)."""
        return float(self.table.memory(a, b, self.in_flight(stage, mode)))

    def fits(self, a: int, b: int, devices, stage: int, mode: str = "split") -> bool:
        """Do units ``a..b-1`` fit the memory of worker ``devices`` as stage ``stage``?"""
        return bool(rules.fits(self.stage_memory(a, b, stage, mode), self.capacity(devices)))

    # ---- workers -----------------------------------------------------------------------
    @cached_property
    def _pool_cache(self) -> dict:
        return {}

    def _pool(self, devices) -> tuple[dict, float]:
        key = tuple(devices)
        v = self._pool_cache.get(key)
        if v is None:
            v = self._pool_cache[key] = rules.pool(self.instance.cluster.device(name) for name in key)
        return v

    def pooled(self, devices) -> dict:
        """``dict[kind, units]``: resources pooled over device names ``devices``."""
        return self._pool(devices)[0]

    def capacity(self, devices) -> float:
        """Bytes of memory of the worker made of ``devices``."""
        return float(self._pool(devices)[1])

    @staticmethod
    def share(res: dict, F: dict, B: dict, mode: str = "split") -> dict | None:
        """The forward share per kind a stage with loads ``F``, ``B`` gets on resources ``res``
        when nothing else counts: ``"split"``, the least stage time (:func:`best_split`; the
        plan's best shares are :meth:`period`'s), ``"theorem"`` (beta = c / (c + 1),
        :func:`theorem_split`) or ``"sequential"`` (``None``: no split).

        Raises
        ------
        InvalidProblemError
            If ``mode`` is unknown.
        """
        if mode == "split":
            return best_split(res, F, B)[0]
        if mode == "theorem":
            return theorem_split(res, F, B)
        if mode == "sequential":
            return None
        raise InvalidProblemError(f"unknown split mode {mode!r}; choose from {SPLIT_MODES}")

    def compute_time(self, a: int, b: int, res: dict, mode: str = "split") -> float:
        """Stage time ``tau`` (seconds per microbatch) of units ``a..b-1`` on resources ``res`` with
        the share of ``mode`` (:meth:`share`): :func:`pipeopt.cost.stage_compute`. With
        ``"split"`` the least ``max(f, b)`` over all shares: a lower bound on the stage's own
        rows, hence on the period of any plan with this stage."""
        F, B = self.load(a, b)
        return stage_compute(res, F, B, self.share(res, F, B, mode))[2]

    def stage_time(self, a: int, b: int, devices, stage: int, mode: str = "split") -> float:
        """:meth:`fit_time` and the two cuts' own rows (seconds): the greedy probe's stage time
        (Duan & Wu's heuristics); a lower bound on the period of any plan with this stage
        (the window rows come on top)."""
        return max(self.fit_time(a, b, devices, stage, mode), float(self.cut_time[a]), float(self.cut_time[b]))

    @cached_property
    def _compute_cache(self) -> dict:
        return {}

    def fit_time(self, a: int, b: int, devices, stage: int, mode: str = "split") -> float:
        """Stage time of stage ``stage`` = units ``a..b-1`` on worker ``devices`` (:meth:`compute_time`),
        ``inf`` if it does not fit in memory under ``mode`` (non-decreasing in b, non-increasing
        in a). Cached per unit range, pooled resources and mode."""
        if not self.fits(a, b, devices, stage, mode):
            return math.inf
        res = self.pooled(devices)
        key = (a, b, tuple(sorted(res.items())), mode)
        v = self._compute_cache.get(key)
        if v is None:
            v = self._compute_cache[key] = self.compute_time(a, b, res, mode)
        return v

    def busy(self, a: int, b: int, devices, stage: int, limit: float) -> tuple[dict | None, float, float]:
        """The split of stage ``stage`` = units ``a..b-1`` on worker ``devices`` at a trial period
        T = ``limit``: :func:`least_busy` (least ``f + b`` with both passes within T), or
        ``(None, inf, inf)`` if the stage does not fit memory (split execution) or no share
        keeps both passes within T."""
        if not self.fits(a, b, devices, stage, "split"):
            return None, math.inf, math.inf
        F, B = self.load(a, b)
        return least_busy(self.pooled(devices), F, B, limit)

    # ---- the objective of a plan ---------------------------------------------------------
    def _fixed_ops(self, a: int, b: int, devices, stage: int, mode: str) -> tuple[dict | None, float, float]:
        """Shares and op times of a stage with the fixed share of ``mode`` (sequential or theorem);
        ``inf`` ops if it breaks memory."""
        if not self.fits(a, b, devices, stage, mode):
            return None, math.inf, math.inf
        res = self.pooled(devices)
        F, B = self.load(a, b)
        beta = self.share(res, F, B, mode)
        f, bb, tau = stage_compute(res, F, B, beta)
        if not math.isfinite(tau):
            return beta, math.inf, math.inf
        f_op, b_op = rules.replica_ops(tau, f, bb, split=beta is not None)
        return beta, f_op, b_op

    def steady(self, starts, ops, mode: str = "split") -> float:
        """:func:`pipeopt.cost.rules.steady_period` of the plan with stages starting at
        ``[0, *starts]`` whose stages' op times are ``ops`` (``[(beta, f, b), ...]``): the value
        :func:`pipeopt.evaluate` gives (one replica per stage, one link per cut, overlap)."""
        S = len(ops)
        f = [o[1] for o in ops]
        b = [o[2] for o in ops]
        if not all(map(math.isfinite, f + b)):
            return math.inf
        cuts = np.asarray([int(c) for c in starts], dtype=int)
        one = self.table.send_time[cuts]  # activations forward = gradients back, bytes / bandwidth
        split = [mode != "sequential"] * S
        return float(rules.steady_period(f, b, np.ones(S), rules.windows(S), split, one, one, np.ones(S - 1)))

    def check(self, starts, groups, limit: float, mode: str = "split") -> Check:
        """Is the period of the plan (stages starting at ``[0, *starts]`` on workers ``groups``)
        at most T = ``limit`` with the shares of ``mode``? Exact: ``"split"`` gives every stage
        its best share at T (:meth:`busy`), which is best for every window row at once.

        The window rows are checked by the recursion of :func:`pipeopt.cost.rules.window_step`
        (``G_l = w_l + max(-D_l T, G_{l-1} + C_{l-1})``, the rows ending at l hold iff
        ``G_l <= -U_l T``), keeping the first stage of the worst row.

        Returns
        -------
        Check
        """
        S = len(groups)
        bounds = [0, *[int(c) for c in starts], self.n]
        cuts = [c for c in bounds[1:-1] if self.cut_time[c] > limit]
        ops, over = [], []
        for s in range(S):
            a, b, g = bounds[s], bounds[s + 1], tuple(groups[s])
            if mode == "split":
                op = self.busy(a, b, g, s, limit)
            else:
                op = self._fixed_ops(a, b, g, s, mode)
                own = op[1] + op[2] if mode == "sequential" else max(op[1], op[2])
                if not own <= limit:
                    op = (None, math.inf, math.inf)
            if not math.isfinite(op[1]):
                over.append((s, a, b, g))
            ops.append(op)
        if over or cuts:
            return Check(False, over, cuts, None, ops)
        D, U = rules.window_tokens(rules.windows(S), np.ones(S), [mode != "sequential"] * S)
        G, first, row = -math.inf, 0, None
        for l in range(S):
            trip = self.round_trip[bounds[l]] if l else 0.0
            if -D[l] * limit >= G + trip:  # the worst row ending here starts here
                first = l
            G, ok = rules.window_step(G, trip, ops[l][1] + ops[l][2], D[l], U[l], limit)
            if not ok:
                row = (first, l)
                break
        return Check(row is None, [], [], row, ops)

    def period(self, starts, groups, mode: str = "split") -> tuple[float, list, float]:
        """The objective of a partition on workers: its least steady period (seconds) over the
        shares of ``mode``.

        ``"sequential"`` and ``"theorem"`` fix the shares: the period is
        :func:`~pipeopt.cost.rules.steady_period` of the plan. ``"split"``: the least period over
        all shares (the allocate problem of the partition), by bisection on T of the exact
        :meth:`check` between a lower bound (the largest cut and least stage time: every
        share has a stage or a cut that slow) and twice it (at ``2 tau`` every stage's
        least-time share has ``f + b <= 2 tau``, so every window row holds), down to adjacent
        floats; the shares are those of the upper end. ``inf`` if a stage breaks memory or
        holds a layer its worker cannot run.

        Returns
        -------
        (value, shares, lower)
            The period (= :func:`pipeopt.evaluate`'s bottleneck of the plan with ``shares``),
            the shares of each stage (``None`` per stage for sequential), and a lower bound on
            the period over all shares (the largest T the bisection found infeasible; = value
            for fixed shares).
        """
        S = len(groups)
        bounds = [0, *[int(c) for c in starts], self.n]
        if mode != "split":
            ops = [self._fixed_ops(bounds[s], bounds[s + 1], tuple(groups[s]), s, mode) for s in range(S)]
            value = self.steady(starts, ops, mode)
            return value, [o[0] for o in ops], value
        fallback, broken = [], False
        lo = max((float(self.cut_time[c]) for c in bounds[1:-1]), default=0.0)
        for s in range(S):
            a, b, g = bounds[s], bounds[s + 1], tuple(groups[s])
            F, B = self.load(a, b)
            beta, tau = best_split(self.pooled(g), F, B)
            fallback.append(beta)
            broken = broken or not self.fits(a, b, g, s) or not math.isfinite(tau)
            lo = max(lo, tau)
        if broken:
            return math.inf, fallback, math.inf
        chk = self.check(starts, groups, lo)
        if chk.ok:
            hi = lo
        else:
            hi = 2.0 * lo if lo > 0 else 1.0
            for _ in range(64):
                chk = self.check(starts, groups, hi)
                if chk.ok:
                    break
                lo, hi = hi, 2.0 * hi
            for _ in range(PERIOD_ITERATIONS):
                mid = 0.5 * (lo + hi)
                if not lo < mid < hi:
                    break
                c = self.check(starts, groups, mid)
                if c.ok:
                    hi, chk = mid, c
                else:
                    lo = mid
        value = self.steady(starts, chk.ops)
        return value, [o[0] for o in chk.ops], min(lo, value)

    def plan_value(self, starts, groups, mode: str = "split") -> float:
        """The objective of the plan given by ``starts`` and ``groups`` (:meth:`period`): equal to
        ``evaluate(...).bottleneck`` of :meth:`plan` (the tests check it)."""
        return self.period(starts, groups, mode)[0]

    # ---- plans and results ------------------------------------------------------------
    def plan(self, starts, groups, mode: str = "split", limit: float | None = None) -> Plan:
        """The plan whose stages start at units ``[0, *starts]`` on workers ``groups``.

        Parameters
        ----------
        starts
            Unit index where each stage after the first begins, increasing (S - 1 entries).
        groups
            ``list[tuple[str, ...]]``: device names of each stage's worker (S entries).
        mode
            ``"split"``: the shares of least period (:meth:`period`; the least-time shares if
            the plan breaks memory); ``"theorem"``: the closed form c / (c + 1);
            ``"sequential"``: no split (``beta = None``).
        limit
            ``"split"`` only: instead of the shares of least period, each stage's shares of
            least busy time ``f + b`` with both passes within T = ``limit`` seconds
            (:meth:`check`; the plan's period is then at most T). The tie-break's shares
            (:mod:`pipeopt.problems.resource.tiebreak`).

        Raises
        ------
        InvalidProblemError
            If the numbers of stages and workers differ, or the plan's period with the best
            shares exceeds ``limit``.
        """
        starts = [int(c) for c in starts]
        layer_sets = self.instance.chain.stages_from_cuts(starts)
        if len(layer_sets) != len(groups):
            raise InvalidProblemError(f"{len(layer_sets)} stages but {len(groups)} workers")
        if limit is not None and mode == "split":
            chk = self.check(starts, groups, limit)
            if not chk.ok:
                raise InvalidProblemError(f"the plan with starts {starts} has a period above {limit!r} s")
            shares = [o[0] for o in chk.ops]
        else:
            _, shares, _ = self.period(starts, groups, mode)
        stages = [Stage(layers=layers, devices=tuple(devs), beta=beta)
                  for layers, devs, beta in zip(layer_sets, groups, shares, strict=True)]
        return Plan(tuple(stages))

    def starts_of(self, plan: Plan) -> list[int]:
        """The unit index where each stage after the first begins.

        Raises
        ------
        InvalidPlanError
            If a stage of ``plan`` recomputes layers: the cuts alone would drop that choice,
            and the resource problems do not choose recomputation
            (:func:`pipeopt.cost.table.refuse_recompute`).
        """
        refuse_recompute(plan, f"{type(self).__name__}.starts_of (the cuts alone)")
        unit_of = self.instance.chain.unit_of
        return [unit_of[st.layers[0]] for st in plan.stages[1:]]

    def result(self, method, plan, status, *, lower_bound=None, started=None, space="split", info=None) -> Result:
        """Wrap a plan into a :class:`Result` scored by :func:`evaluate` (a heuristic whose plan
        breaks memory gets ``INFEASIBLE``)."""
        return Result.scored(self.instance, method, plan, status, lower_bound=lower_bound, started=started,
                             space=space, info=info)


class WorkerStages:
    """A resource problem's stage time on fixed workers, in the form of the greedy chain probe
    (:mod:`pipeopt.backends.bisection`): stage t (0-based position) runs on worker ``groups[t]``.

    ``time(t, a, b)`` is :meth:`ResourceProblem.stage_time` and ``fit(t, a, b)``
    :meth:`ResourceProblem.fit_time` (compute and memory, without the cuts: non-decreasing in
    ``b``), element by element over ``a`` and ``b`` broadcast together; seconds.

    Parameters
    ----------
    problem
        A joint, group or allocate problem.
    groups
        ``list[tuple[str, ...]]``: device names of the worker of each stage, in pipeline order.
    mode
        ``"split"``, ``"sequential"`` or ``"theorem"`` (:meth:`ResourceProblem.share`).
    """

    def __init__(self, problem: ResourceProblem, groups: list, mode: str):
        self.problem, self.groups, self.mode = problem, [tuple(g) for g in groups], mode

    def _each(self, fn, t: int, a, b) -> np.ndarray:
        a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
        out = np.empty(a.shape)
        for i in np.ndindex(a.shape):
            out[i] = fn(int(a[i]), int(b[i]), self.groups[t], t, self.mode)
        return out

    def fit(self, t: int, a, b) -> np.ndarray:
        """Compute time of stage t = units ``a..b-1`` on its worker, ``inf`` if it does not fit
        in memory (seconds)."""
        return self._each(self.problem.fit_time, t, a, b)

    def time(self, t: int, a, b) -> np.ndarray:
        """Stage time of stage t = units ``a..b-1``: compute and its two cuts (seconds)."""
        return self._each(self.problem.stage_time, t, a, b)


@dataclass(frozen=True)
class JointProblem(ResourceProblem):
    """Partition and forward/backward split at once, on identical multi-resource workers.

    Stage s runs on device s of the cluster (all devices identical); each stage gets its own
    forward share per resource kind. Minimises the bottleneck time per microbatch.

    Parameters
    ----------
    instance
        Its devices must be identical (any number of resource kinds each).
    stages
        S, number of stages = workers (<= layers, <= devices).

    Raises
    ------
    InvalidProblemError
        If S is not a positive integer, exceeds the layers or devices, the devices differ,
        or the settings are outside the model (objective other than the bottleneck, no overlap).

    References
    ----------
    Duan & Wu, ICPADS 2022 (two steps: partition, then allocation); pipeopt solves both at once.
    """

    instance: Instance
    stages: int

    def __post_init__(self) -> None:
        check_stage_count(self.instance, self.stages, "stages")
        if not self.instance.cluster.is_homogeneous:
            raise InvalidProblemError("the joint problem needs identical devices; use the group problem")
        self._check_settings()

    @property
    def num_stages(self) -> int:
        """S."""
        return int(self.stages)

    @cached_property
    def groups(self) -> list[tuple]:
        """The fixed workers: stage s on device s."""
        return [(d.name,) for d in self.instance.cluster.devices[: self.num_stages]]


@dataclass(frozen=True)
class GroupProblem(ResourceProblem):
    """Heterogeneous devices grouped into q workers, with the partition and the split.

    Every device joins exactly one worker; worker s runs stage s (its pooled resources and
    memory are the sums over its devices). Minimises the bottleneck time per microbatch.

    Parameters
    ----------
    instance
        Any devices (several resource kinds, different amounts and memory).
    workers
        q, number of workers = stages (<= devices, <= layers).

    Raises
    ------
    InvalidProblemError
        If q is not a positive integer, there are more workers than devices or layers, or
        the settings are outside the model.

    References
    ----------
    Duan & Wu, ICPADS 2022, Algorithm 2 (greedy grouping) is the baseline.
    """

    instance: Instance
    workers: int

    def __post_init__(self) -> None:
        check_stage_count(self.instance, self.workers, "workers")
        self._check_settings()

    @property
    def num_stages(self) -> int:
        """q."""
        return int(self.workers)

    @property
    def device_names(self) -> list[str]:
        """Device names in cluster order."""
        return [d.name for d in self.instance.cluster.devices]

    @cached_property
    def device_classes(self) -> list[list[int]]:
        """Indices of identical devices (same resources and memory), each class in cluster order."""
        classes: dict = {}
        for i, d in enumerate(self.instance.cluster.devices):
            key = (tuple(sorted(d.resources.items())), d.memory)
            classes.setdefault(key, []).append(i)
        return list(classes.values())

    def groups_from_counts(self, counts) -> list[tuple]:
        """Workers from the number of devices of each class per stage.

        Parameters
        ----------
        counts
            ``counts[c][s]``: devices of class c (:attr:`device_classes`) in worker s; each
            class's counts add up to its size. Identical devices are interchangeable, so the
            models choose counts; the devices of a class are dealt to the workers in cluster
            order.

        Returns
        -------
        list[tuple[str, ...]]
            Device names of each worker, in cluster order.
        """
        names = self.device_names
        members: list[list[int]] = [[] for _ in range(self.num_stages)]
        for cls, row in zip(self.device_classes, counts, strict=True):
            pos = 0
            for s, k in enumerate(row):
                members[s] += cls[pos:pos + int(k)]
                pos += int(k)
        return [tuple(names[d] for d in sorted(m)) for m in members]

    def class_counts(self, group) -> list[int]:
        """How many devices of each class (:attr:`device_classes`) the worker ``group`` (names) holds."""
        index = {name: i for i, name in enumerate(self.device_names)}
        inside = {index[name] for name in group}
        return [sum(1 for d in cls if d in inside) for cls in self.device_classes]


@dataclass(frozen=True)
class AllocateProblem(ResourceProblem):
    """The best forward share per worker and resource kind for a fixed partition.

    Parameters
    ----------
    instance
        The instance.
    stages
        S: without ``plan``, the partition is the binary-search partition of Duan & Wu on S
        identical workers (stage s on device s; :func:`pipeopt.problems.resource.allocate.base_partition`
        balancing the sequential stage time), the same for every method.
    plan
        A given plan (its layers and devices are kept, its shares replaced); checked with
        :func:`pipeopt.cost.check_plan`.

    Raises
    ------
    InvalidProblemError
        Neither or both of ``stages`` and ``plan`` (unless they agree), bad S, or settings
        outside the model.
    InvalidPlanError
        If ``plan`` is not a valid plan of the instance (e.g. a share outside [0, 1]).
    """

    instance: Instance
    stages: int | None = None
    plan_given: Plan | None = None

    def __post_init__(self) -> None:
        self._check_settings()
        if self.plan_given is None:
            if self.stages is None:
                raise InvalidProblemError("allocate needs stages=S or plan_given=a plan")
            check_stage_count(self.instance, self.stages, "stages")
        else:
            check_plan(self.instance, self.plan_given)
            if any(st.bwd_layers is not None or st.replicas != 1 for st in self.plan_given.stages):
                raise InvalidProblemError("allocate handles plans without Bi-Partition and replication")
            if self.stages is not None and self.stages != self.plan_given.num_stages:
                raise InvalidProblemError(f"stages={self.stages} but the plan has {self.plan_given.num_stages}")
            starts = self.starts_of(self.plan_given)
            if self.instance.chain.stages_from_cuts(starts) != [tuple(s.layers) for s in self.plan_given.stages]:
                raise InvalidProblemError("allocate needs a contiguous plan over the layer order")

    @property
    def num_stages(self) -> int:
        """S."""
        return self.plan_given.num_stages if self.plan_given is not None else int(self.stages)



def optimal_split(instance: Instance, plan: Plan) -> Plan:
    """The same stages with the best forward share per worker and resource kind.

    Within the allocate problem's scope (a contiguous plan without replication or
    Bi-Partition, the bottleneck objective with overlap) the shares of least period, window
    rows included (:meth:`ResourceProblem.period`); otherwise each stage's least-time share
    (:func:`pipeopt.problems.resource.split.best_split`), which ignores the window rows.

    Parameters
    ----------
    instance
        The instance.
    plan
        A valid plan (layers and devices are kept; ``beta`` is replaced).

    Returns
    -------
    Plan

    Raises
    ------
    InvalidPlanError
        If the plan is invalid (dropped layer, share outside [0, 1], ...).
    """
    check_plan(instance, plan)
    try:
        problem = AllocateProblem(instance, plan_given=plan)
    except InvalidProblemError:
        problem = None
    if problem is not None:
        return problem.plan(problem.starts_of(plan), [tuple(st.devices) for st in plan.stages], "split")
    graph = instance.graph
    stages = []
    for st in plan.stages:
        res, _ = rules.pool((instance.cluster.device(d) for d in st.devices), st.replicas)
        F = {k: sum(graph.nodes[n]["fwd"].get(k, math.inf) for n in st.layers) for k in res}
        B = {k: sum(graph.nodes[n]["bwd"].get(k, math.inf) for n in st.backward_layers) for k in res}
        stages.append(Stage(st.layers, st.devices, st.replicas, best_split(res, F, B)[0], st.bwd_layers))
    return Plan(tuple(stages))


# ---- the exact chain DP over fixed workers ----------------------------------------------------

CHAIN_REL_TOL = BISECTION_WIDTH
"""Relative width at which :func:`chain_optimum`'s bisection on T stops (or at adjacent floats):
its plan is optimal to within this factor, its bound the largest T the DP proved infeasible."""

PERIOD_ITERATIONS = 200
"""Most bisection steps of :meth:`ResourceProblem.period` (it stops at adjacent floats first)."""


class ChainProbe:
    """``probe(T, deadline)`` for :func:`pipeopt.backends.bisection.bisect`: is there a contiguous
    split of the chain over the fixed workers ``groups`` (stage s on ``groups[s]``) whose period
    is at most T? Exact.

    At a trial T every stage takes its least busy time ``w = f + b`` with ``f, b <= T``
    (split, :func:`least_busy_many`; sequential: ``w = tau <= T``), and the window rows are
    the recursion of :func:`pipeopt.cost.rules.window_step`: with ``G_s(j)`` the least
    ``G`` over the splits of units ``0..j-1`` into stages ``0..s``,
    ``G_s(j) = min_i w_s(i, j) + max(-D_s T, G_{s-1}(i) + C(i))``, kept only where
    ``G_s(j) <= -U_s T`` (the rows ending at stage s). A smaller G is better for every later
    stage, so keeping the least G per ``(s, j)`` loses nothing; memory (with the mode's
    in-flight count) and the cuts' own rows (``cut_time <= T``) prune the ranges. One probe
    is O(S n^2): the least busy times vectorised over the unit ranges, the recursion compiled
    (:func:`~pipeopt.problems.resource.kernels.chain_dp`).

    Parameters
    ----------
    problem
        A resource problem.
    groups
        ``list[tuple[str, ...]]``: the worker of each stage.
    mode
        ``"split"`` (the shares are chosen) or ``"sequential"``; ``"theorem"`` is scored range
        by range (slow, for small chains).
    """

    def __init__(self, problem: ResourceProblem, groups: list, mode: str = "split"):
        if mode not in SPLIT_MODES:
            raise InvalidProblemError(f"unknown split mode {mode!r}; choose from {SPLIT_MODES}")
        self.problem, self.groups, self.mode = problem, [tuple(g) for g in groups], mode
        n, S = problem.n, len(groups)
        self.ii, self.jj, self.F, self.B = problem.ranges
        self.room = np.empty((S, self.ii.size), dtype=bool)  # per stage: ranges that fit memory and leave
        for s in range(S):  # one unit to every other stage
            self.room[s] = (rules.fits(problem.range_memory(s, mode), problem.capacity(self.groups[s]))
                            & (self.ii >= s) & (self.jj <= n - (S - 1 - s)))
        self.D, self.U = rules.window_tokens(rules.windows(S), np.ones(S), [mode != "sequential"] * S)
        self.keys = [tuple(sorted(problem.pooled(g).items())) for g in self.groups]

    def busy(self, s: int, T: float, cache: dict) -> np.ndarray:
        """``ndarray (P,)``: the least busy time of every unit range on stage s's worker at T
        (``inf`` where no share passes T)."""
        key = (self.keys[s], self.mode)
        if key in cache:
            return cache[key]
        res, p = dict(self.keys[s]), self.problem
        if self.mode == "split":
            w = p.range_busy(res, T)
        elif self.mode == "sequential":
            rate = np.zeros(self.ii.shape)
            for k in p.kinds:
                r = res.get(k, 0.0)
                if r > 0:
                    t = self.F[k] + self.B[k]
                    with np.errstate(divide="ignore"):
                        rate = rate + np.where(np.isfinite(t), np.where(t > 0, r / np.where(t > 0, t, 1.0), np.inf), 0.0)
            with np.errstate(divide="ignore"):
                tau = np.where(rate > 0, 1.0 / rate, np.inf)
            w = np.where(tau <= T, tau, np.inf)
        else:
            w = np.full(self.ii.shape, np.inf)
            for q in range(w.size):
                F = {k: float(v[q]) for k, v in self.F.items()}
                B = {k: float(v[q]) for k, v in self.B.items()}
                f, b, tau = stage_compute(res, F, B, theorem_split(res, F, B))
                if tau <= T:
                    w[q] = f + b
        cache[key] = w
        return w

    def solve(self, T: float, deadline: Deadline | None = None, cache: dict | None = None) -> list[int] | None:
        """Stage starts of a split with period <= T, or ``None`` if there is none.

        ``cache``: the least busy times of workers at this T (keyed by their pooled resources)
        and the cuts' own rows at T (key ``"cuts"``), shared by calls at the same T on other
        groupings (:mod:`.local`); ``None``: a new one.

        Raises
        ------
        DeadlineReached
            If ``deadline`` has passed (checked once, before the compiled DP).
        """
        p, n, S = self.problem, self.problem.n, len(self.groups)
        if deadline is not None:
            deadline.check("the chain DP")
        cache = {} if cache is None else cache
        cuts = cache.get("cuts")
        if cuts is None or cuts[0] != T:  # the cuts' own rows at T, per range
            cut_ok = p.cut_time <= T
            cuts = cache["cuts"] = (T, cut_ok[self.ii], cut_ok[self.jj])
        w = np.stack([self.busy(s, T, cache) for s in range(S)])
        args = np.empty((S, n + 1), dtype=np.int64)
        if not chain_dp(self.ii, self.jj, w, self.room, cuts[1], cuts[2], np.asarray(p.round_trip, dtype=float),
                        np.asarray(self.D, dtype=float), np.asarray(self.U, dtype=float), float(T), n, args):
            return None
        starts, j = [], n
        for s in range(S - 1, 0, -1):
            j = int(args[s][j])
            starts.append(j)
        return starts[::-1]

    def __call__(self, T: float, deadline: Deadline | None = None) -> Probe:
        """:class:`~pipeopt.backends.bisection.Probe`: feasible with the starts and their exact
        period (:meth:`ResourceProblem.plan_value`), infeasible (proven), or unknown at the deadline."""
        try:
            starts = self.solve(T, deadline)
        except DeadlineReached:
            return Probe(UNKNOWN)
        if starts is None:
            return Probe(INFEASIBLE)
        return Probe(FEASIBLE, starts, self.problem.plan_value(starts, self.groups, self.mode))

    def top(self) -> float:
        """A limit every split that fits memory passes (seconds): a stage of finite time has a
        kind that runs its whole forward pass and one that runs its whole backward pass
        (sequential: one kind for both); giving each its whole amount (half each if they are
        the same kind) keeps both passes and ``f + b`` within ``tau_max = 2 max_k (chain's work
        on k) / (least amount of k on a worker)``, so every window row is within
        ``tau_max + 2 max cut``."""
        p = self.problem
        work = 0.0
        for k in p.kinds:
            least = min((p.pooled(g).get(k, 0.0) for g in self.groups if p.pooled(g).get(k, 0.0) > 0), default=0.0)
            if least > 0:
                f, b = p.fwd[k], p.bwd[k]
                total = math.fsum(float(v) for v in np.concatenate([f[np.isfinite(f)], b[np.isfinite(b)]]))
                work = max(work, 2.0 * total / least)
        return (work + 2.0 * float(max(p.cut_time, default=0.0))) * (1 + SUM_ORDER) + 1e-300


def chain_optimum(problem: ResourceProblem, groups: list, mode: str = "split",
                  deadline: Deadline | None = None) -> Bisection:
    """The least-period contiguous split of the chain over the fixed workers ``groups``:
    :class:`ChainProbe` bisected on T (:func:`pipeopt.backends.bisection.bisect`) from the split
    it finds at :meth:`ChainProbe.top` down to :data:`CHAIN_REL_TOL` (or adjacent floats).

    Returns
    -------
    Bisection
        ``plan`` (stage starts, ``None`` if no split fits memory - then ``closed``), ``value``
        (its period, = :func:`pipeopt.evaluate`'s bottleneck of ``problem.plan(plan, groups,
        mode)``), ``lower`` (the largest T proven infeasible), ``closed`` and ``stop``.
    """
    probe = ChainProbe(problem, groups, mode)
    deadline = deadline if deadline is not None else Deadline(None)
    return bisect(probe, 0.0, probe.top(), rel_tol=CHAIN_REL_TOL, deadline=deadline)


def minmax_chain_dp(problem: ResourceProblem, groups: list, mode: str = "split",
                    deadline: Deadline | None = None) -> tuple[list[int], float]:
    """Best contiguous split of the chain over the fixed workers ``groups`` (stage s on
    ``groups[s]``) for the objective - the steady period with its window rows
    (:func:`chain_optimum`; the name is that of the min-max stage-time DP it replaced, which
    ignored the window rows and the shares' effect on them).

    Parameters
    ----------
    problem
        A resource problem.
    groups
        ``list[tuple[str, ...]]``: the worker of each stage.
    mode
        ``"split"`` (the best shares), ``"sequential"`` or ``"theorem"``.
    deadline
        :class:`~pipeopt.backends.deadline.Deadline`, or ``None``.

    Returns
    -------
    (starts, value)
        Cut positions and the period (``inf`` if nothing fits memory), optimal within
        :data:`CHAIN_REL_TOL`.

    Raises
    ------
    DeadlineReached
        If ``deadline`` passes before the bisection closes.
    """
    found = chain_optimum(problem, groups, mode, deadline)
    if not found.closed and found.stop in ("deadline", "undecided"):
        raise DeadlineReached("the chain DP", deadline.elapsed() if deadline is not None else 0.0)
    if found.plan is None:
        return [round(problem.n * s / len(groups)) for s in range(1, len(groups))], math.inf
    return list(found.plan), float(found.value)


def groupings(num_devices: int, q: int):
    """Every assignment of devices 0..num_devices-1 to q ordered, non-empty workers
    (``list[tuple[int, ...]]`` per assignment). q^d of them: tiny instances only."""
    for assign in itertools.product(range(q), repeat=num_devices):
        groups = [tuple(d for d in range(num_devices) if assign[d] == s) for s in range(q)]
        if all(groups):
            yield groups


def brute_force(problem: ResourceProblem, mode: str = "split") -> tuple[list[int], list[tuple], float]:
    """Enumerate every plan of a tiny joint or group problem: all cut sets, all groupings, each
    with its exact period (:meth:`ResourceProblem.plan_value`: the best shares).

    Returns
    -------
    (starts, groups, value)
        A best plan and its period.

    Raises
    ------
    InvalidProblemError
        If the enumeration would exceed 10^5 plans.
    """
    n, S = problem.n, problem.num_stages
    if isinstance(problem, GroupProblem):
        names = problem.device_names
        all_groups = [[tuple(names[d] for d in g) for g in gs] for gs in groupings(len(names), S)]
    else:
        all_groups = [problem.groups]
    count = math.comb(n - 1, S - 1) * len(all_groups)
    if count > 10**5:
        raise InvalidProblemError(f"brute force would enumerate {count} plans")
    best = (None, None, math.inf)
    for groups in all_groups:
        for starts in itertools.combinations(range(1, n), S - 1):
            bounds = [0, *starts, n]
            # every stage's own rows and its cuts bound the period from below: skip what cannot win
            if max(problem.stage_time(bounds[s], bounds[s + 1], groups[s], s, mode) for s in range(S)) >= best[2]:
                continue
            v = problem.plan_value(list(starts), groups, mode)
            if v < best[2]:
                best = (list(starts), groups, v)
    return best
