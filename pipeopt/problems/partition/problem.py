"""The partition problem: S identical workers, a contiguous split of the layer order.

:class:`PartitionProblem` checks the request once and precomputes the arrays every exact
method and baseline reads (per-unit compute time, cut bytes, memory), and turns cut
positions back into a :class:`~pipeopt.plan.Plan` scored by :func:`~pipeopt.cost.evaluate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ...cost import CostTable, rules
from ...cost.table import refuse_recompute
from ...errors import InfeasibleError, InvalidProblemError
from ...instance import Instance
from ...plan import Plan, Stage
from ...result import Result, Status
from .. import spaces

SPACES = (spaces.ONE_ORDER, spaces.REPLICATED_ONE_ORDER)


def check_stage_count(instance: Instance, count, what: str = "stages") -> None:
    """Check a number of stages (or workers) against an instance.

    Raises
    ------
    InvalidProblemError
        If ``count`` is not a positive integer, exceeds the splittable units of the layer
        chain, or exceeds the cluster's devices.
    """
    if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 1:
        raise InvalidProblemError(f"number of {what} must be a positive integer, got {count!r}")
    n, d = instance.chain.n, len(instance.cluster.devices)
    if count > n:
        raise InvalidProblemError(
            f"more {what} ({count}) than layers ({n} splittable units of {instance.num_layers} layers) in {instance.name}"
        )
    if count > d:
        raise InvalidProblemError(f"more {what} ({count}) than devices ({d}) in {instance.name}")


@dataclass(frozen=True)
class PartitionProblem:
    """Split an instance's layer chain into pipeline stages on identical workers.

    Parameters
    ----------
    instance
        Its cluster must have identical devices with one resource kind the layers run on
        (several kinds make stage time non-additive: that is the *joint* problem).
    stages
        S, the number of workers. Without replication the plan has exactly S non-empty
        stages, one worker each; with replication it has at most S stages whose replica
        counts add up to S.
    replication
        Allow data-parallel replication of stages (PipeDream).
    recompute
        Activation recomputation (:mod:`pipeopt.problems.partition.recompute`): ``"none"``
        (default: every layer keeps its activations), ``"full"`` (every layer recomputed in
        full mode), ``"auto"`` (the exact choice per layer with the split: none or full, and
        selective where every layer's profile measures it). Only the methods that model it
        take it (:func:`pipeopt.solve` refuses the others).

    Raises
    ------
    InvalidProblemError
        If S < 1, S exceeds the number of layers (units) or of devices, the devices differ,
        or a device has several usable resource kinds; ``recompute`` unknown.
    """

    instance: Instance
    stages: int
    replication: bool = False
    recompute: str = "none"

    def __post_init__(self) -> None:
        inst = self.instance
        check_stage_count(inst, self.stages)
        if not inst.cluster.is_homogeneous:
            raise InvalidProblemError("the partition problem needs identical devices; use the group problem")
        _ = self.kind
        self._check_times()
        if self.recompute != "none":  # the recompute model's module only where it is asked for
            from .recompute import check_recompute

            check_recompute(self.recompute)

    @cached_property
    def recomputation(self):
        """:class:`pipeopt.problems.partition.recompute.RecomputeModel` of this problem (``None``
        with ``recompute="none"``): the least seconds every stage adds by recomputation."""
        if self.recompute == "none":
            return None
        from .recompute import RecomputeModel

        return RecomputeModel(self)

    def _check_times(self) -> None:
        """Every unit must run on the kind, and the times must not overflow."""
        chain = self.instance.chain
        bad = np.flatnonzero(~np.isfinite(chain.fwd[self.kind]) | ~np.isfinite(chain.bwd[self.kind]))
        if bad.size:
            names = [str(x) for i in bad[:5] for x in chain.units[i]]
            raise InfeasibleError(
                f"{self.instance.name}: layer(s) {', '.join(names)} cannot run on {self.kind!r} "
                "(no forward or backward time for it): no plan can place them"
            )
        if not (math.isfinite(self.work_prefix[-1]) and np.isfinite(self.table.cut_time).all()):
            raise InvalidProblemError(
                f"{self.instance.name}: the layers' total time ({self.work_prefix[-1]!r} s) or a cut's "
                f"transfer time ({float(self.table.cut_time.max())!r} s) overflows a float; check the "
                "layer times, byte counts and bandwidth"
            )

    # ---- data every method reads -------------------------------------------------------
    @cached_property
    def kind(self) -> str:
        """The one resource kind the workers use."""
        dev = self.instance.cluster.devices[0]
        usable = [k for k, r in dev.resources.items() if r > 0 and k in self.instance.chain.kinds]
        if len(usable) != 1:
            raise InvalidProblemError(
                f"partition needs workers with one usable resource kind; device {dev.name!r} has {usable}"
                " (use the joint problem for several kinds)"
            )
        return usable[0]

    @property
    def n(self) -> int:
        """Number of units of the chain."""
        return self.instance.chain.n

    @cached_property
    def table(self) -> CostTable:
        """The cost model tabulated over the chain for S stages (:class:`pipeopt.cost.CostTable`)."""
        return CostTable(self.instance, self.stages)

    @cached_property
    def work_prefix(self) -> np.ndarray:
        """``ndarray (n+1,)``: prefix sums of forward + backward seconds of the units on one worker."""
        return self.table.work_prefix(self.kind, self.instance.cluster.devices[0].resources[self.kind])

    def tie_sum(self, a, b):
        """Seconds per microbatch the tied parameters' gradient sums add to the backward of a
        stage of units ``a..b-1`` on one worker (:meth:`pipeopt.cost.ties.ChainTies.sum_time`,
        :func:`pipeopt.cost.rules.tie_sum_time`; 0.0 without ties or measured sums; arrays
        broadcast): part of :meth:`stage_work` and :meth:`stage_time`."""
        ties = self.table.ties
        if not ties:
            return 0.0
        return ties.sum_time(a, b, self.kind, self.instance.cluster.devices[0].resources[self.kind])

    def refuse_tie_sums(self, method: str) -> None:
        """Raise unless the stages' tie sums (:meth:`tie_sum`) are the same in every split of
        this problem: for the methods whose models read the work as prefix sums (probe, milp,
        cpsat). One stage, or no tie with a measured sum two of whose layers one stage can hold
        (:meth:`pipeopt.cost.ties.ChainTies.sums_bind`; with replication any stage can hold the
        whole chain), passes.

        Raises
        ------
        InvalidProblemError
            Naming the ties and the method that handles them (``dp``)."""
        ties = self.table.ties
        if not ties or self.stages < 2:
            return
        # with replication a plan may have a single stage (all workers replicating it)
        bind = ties.sums_bind(self.n, 1 if self.replication else self.stages)
        if bind:
            raise InvalidProblemError(
                f"method {method!r} does not model the gradient sums of a tied parameter of which one stage may hold "
                f"two layers ({', '.join(bind[:3])}: autograd sums their contributions out of place, "
                "pipeopt.cost.rules.tie_sum_time); use method 'dp' (or 'auto', which picks it)")

    @cached_property
    def work(self) -> np.ndarray:
        """``ndarray (n,)``: forward + backward seconds of each unit on one worker."""
        return np.diff(self.work_prefix)

    @property
    def act_prefix(self) -> np.ndarray:
        """``ndarray (n+1,)``: prefix sums of activation bytes (:attr:`CostTable.act_prefix`)."""
        return self.table.act_prefix

    @property
    def param_prefix(self) -> np.ndarray:
        """``ndarray (n+1,)``: prefix sums of parameter bytes (:attr:`CostTable.param_prefix`)."""
        return self.table.param_prefix

    @property
    def boundary_bytes(self) -> np.ndarray:
        """``ndarray (n+1,)``: bytes crossing the boundary before unit c, 0 at both ends
        (:attr:`CostTable.boundary_bytes`)."""
        return self.table.boundary_bytes

    @property
    def bandwidth(self) -> float:
        """Bytes/s between workers."""
        return self.instance.cluster.bandwidth

    @property
    def bus_bandwidth(self) -> float:
        """Bytes/s of the collectives (all-reduces of replicas and ties, ZeRO's):
        :attr:`pipeopt.Cluster.bus_bandwidth`."""
        return self.instance.cluster.bus_bandwidth

    @property
    def latency(self) -> float:
        """Seconds per message between workers (:attr:`pipeopt.Cluster.latency`)."""
        return self.instance.cluster.latency

    def refuse_replicated_latency(self, method: str) -> None:
        """Raise :class:`InvalidProblemError` if this problem replicates stages and the cluster has a
        latency: a replicated stage's all-reduce pays ``2 (m - 1)`` messages' latency once per stage,
        which the prefix sums of ``method`` cannot hold (the dense DP prices every stage on its own
        and takes it: :meth:`stage_work`)."""
        if self.replication and self.latency:
            raise InvalidProblemError(
                f"{method} with replication does not model a message latency (the all-reduce's latency is paid "
                "once per replicated stage, not per unit); use the dp method, latency 0 or no replication"
            )

    def refuse_recompute(self, method: str) -> None:
        """Raise :class:`InvalidProblemError` if this problem asks for recomputation
        (``recompute != "none"``) and ``method`` does not choose it (only ``dp``, ``auto`` and
        ``milp`` do): such a method would prove its optimum over the splits without
        recomputation and state it for the larger space. ``pipeopt.solve`` refuses first; this
        guards the methods' functions called directly."""
        if self.recompute != "none":
            raise InvalidProblemError(
                f"{method} does not choose activation recomputation (recompute={self.recompute!r}); "
                "use the dp, auto or milp method, or recompute='none'"
            )

    @property
    def memory(self) -> float:
        """Bytes of memory per worker."""
        return self.instance.cluster.devices[0].memory

    @property
    def space(self) -> str:
        """``"replicated-one-order"`` or ``"one-order"``, with ``+recompute`` or ``+full-recompute``
        under the ``recompute`` option (:mod:`pipeopt.problems.spaces`)."""
        base = spaces.REPLICATED_ONE_ORDER if self.replication else spaces.ONE_ORDER
        return spaces.with_recompute(base, self.recompute)

    # ---- the cost of one stage, as the exact methods see it ----------------------------
    def in_flight(self, stage: int) -> int:
        """Microbatches stage ``stage`` (0-based) keeps under 1F1B without replication
        (:attr:`CostTable.in_flight`: S - stage)."""
        return int(self.table.in_flight[stage])

    @property
    def data_parallel(self) -> bool:
        """True if the settings ask for data parallelism or training state
        (:attr:`pipeopt.Settings.data_parallel`: ``dp > 1``, a ZeRO stage or the ratios): then
        :meth:`stage_memory` adds the sharded training state and :meth:`stage_work` /
        :meth:`stage_time` the ZeRO collectives per microbatch."""
        return self.instance.settings.data_parallel

    def stage_memory(self, a, b, in_flight):
        """Bytes a stage of units ``a..b-1`` needs with ``in_flight`` microbatches
        (:meth:`CostTable.memory`; arrays broadcast), with data parallelism its gradients and
        optimizer state as the ZeRO stage shards them (:meth:`CostTable.sharded_state`,
        :func:`pipeopt.cost.rules.sharded_state`: what :func:`pipeopt.evaluate` adds)."""
        out = self.table.memory(a, b, in_flight)
        if self.data_parallel:
            out = out + self.table.sharded_state(a, b)
        return out

    def zero_work(self, a, b):
        """Seconds ZeRO's per-microbatch collectives add to one replica's forward and backward ops
        of a stage of units ``a..b-1`` together (:meth:`CostTable.zero_ops`,
        :func:`pipeopt.cost.rules.zero_op_times`: ZeRO-2's reduce-scatter on the backward,
        ZeRO-3's all-gathers too); 0 without data parallelism (arrays broadcast)."""
        if not self.data_parallel:
            return 0.0
        zf, zb = self.table.zero_ops(np.asarray(a), np.asarray(b))
        return zf + zb

    def fits(self, memory):
        """True where ``memory`` bytes fit in a worker (:func:`pipeopt.cost.rules.fits`)."""
        return self.table.fits(memory, self.memory)

    @cached_property
    def _reach(self) -> dict:
        return {}

    def memory_reach(self, in_flight) -> np.ndarray:
        """``reach[a]``: the last end ``b`` such that a stage of units ``a..b-1`` keeping
        ``in_flight`` microbatches fits in a worker's memory (:meth:`fits` of
        :meth:`stage_memory`); ``reach[a] == a`` if not even one unit fits.

        Found by bisection on ``b`` for every ``a`` at once (a stage's memory does not
        decrease as it gains units), and made non-decreasing in ``a``, so that ``p_t <= a``
        implies ``p_{t+1} <= reach[p_t]`` for a stage that fits. Exact: every stage is judged
        by the cost model's own rule, no byte is rounded. Cached per ``in_flight``. With
        ``recompute`` set: the last end at which some recompute choice fits
        (:meth:`pipeopt.problems.partition.recompute.RecomputeModel.extra` finite).

        Returns
        -------
        ndarray (n+1,) of int
        """
        key = float(in_flight)
        if key not in self._reach:
            n = self.n
            a = np.arange(n + 1)
            if self.recomputation is not None and math.isfinite(self.memory):
                # with recomputation: the last end at which some recompute choice fits (a stage's least
                # memory over the choices grows with its units: recompute.RecomputeModel.extra)
                ok = np.isfinite(self.recomputation.extra(key))  # [end, start]
                ends = np.where(ok, a[:, None], a[None, :])
                out = np.maximum.accumulate(np.maximum(ends.max(axis=0), a))
                out.setflags(write=False)
                self._reach[key] = out
                return out
            if not math.isfinite(self.memory):
                out = np.full(n + 1, n, dtype=np.int64)
            else:
                lo, hi = a.copy(), np.full(n + 1, n + 1)  # lo: an end that fits (the empty stage); hi: none
                while np.any(hi - lo > 1):
                    mid = (lo + hi) // 2
                    ok = self.fits(self.stage_memory(a, mid, in_flight))
                    lo = np.where(ok, mid, lo)
                    hi = np.where(ok, hi, mid)
                out = np.maximum.accumulate(lo)
            out.setflags(write=False)
            self._reach[key] = out
        return self._reach[key]

    @cached_property
    def cut_terms(self) -> tuple[np.ndarray, np.ndarray]:
        """How the cut at each boundary enters the stage time: ``(added, bound)``.

        ``ndarray (n+1,)`` each, seconds on one link. ``added[c]`` is what a stage whose
        first unit or end is boundary c pays on top of its compute (the transfer it sends,
        :attr:`CostTable.send_time`, without overlap; 0 with overlap); ``bound[c]`` is the
        time the stage cannot go below because of the cut (the cut's busy time,
        :attr:`CostTable.cut_time`, with overlap; 0 without). A stage of units ``a..b-1`` on
        m replicas takes ``max(compute + (added[a] + added[b]) / m, max(bound[a],
        bound[b]) / m)`` (:meth:`stage_time`), the linear form the MILP and CP-SAT models
        read (:mod:`pipeopt.problems.partition.model`).

        **The stage overhead** (:attr:`CostTable.overhead`, seconds per microbatch a stage's
        runtime adds, :func:`pipeopt.cost.rules.stage_overhead`) is a constant per stage, which
        no prefix sum can hold; every stage has exactly two boundaries (its start and its end,
        0 and n included), so half of it is added to ``added`` at every boundary: each stage
        pays it once (``o / 2 + o / 2 = o`` exactly in floating point), the window rows and
        every model that reads ``added`` with it.
        """
        tab = self.table
        added, bound, _ = rules.boundary_terms(tab.send_time, tab.cut_time, tab.round_trip,
                                               self.instance.settings.overlap)
        half = sum(tab.overhead) / 2
        if half:
            added = added + half
        return added, bound

    @cached_property
    def trip(self) -> np.ndarray:
        """``ndarray (n+1,)``: what a cut at boundary c adds to the window rows, seconds: one
        microbatch's round trip over it with overlap (:attr:`CostTable.round_trip`), zero
        without (the stages' ops carry their sends, :attr:`cut_terms`).

        The window rows (:func:`pipeopt.cost.rules.steady_period`) of a straight split with
        stages starting at ``p_0 = 0 < p_1 < ... < p_S = n`` read: for every ``i <= l``,
        ``sum_{s=i..l} w_s + sum_{c=i+1..l} trip[p_c] <= (l - i + 1) T`` with
        ``w_s = work(p_s, p_{s+1}) + added[p_s] + added[p_{s+1}]`` a stage's busy time per
        microbatch.
        """
        tab = self.table
        return rules.boundary_terms(tab.send_time, tab.cut_time, tab.round_trip, self.instance.settings.overlap)[2]

    def stage_time(self, a, b, *, in_flight, replicas: int = 1, memory: bool = True):
        """Time per microbatch of a stage of units ``a .. b-1`` on ``replicas`` workers, as
        :func:`pipeopt.evaluate` scores it (vectorised: ``a``, ``b`` broadcast).

        Compute :func:`pipeopt.cost.rules.replicated_time` (``(work + all-reduce) / m``) and
        the cuts before unit ``a`` and before unit ``b`` as :attr:`cut_terms` says: with
        overlap the stage time is the max of compute and its cuts' busy times over m links
        (so the bottleneck, a max over stages, counts the cut between stages with m and m'
        replicas over ``min(m, m')`` links); without overlap the stage pays what it sends,
        over its m replicas.

        This is the one stage time of the partition problem: the DP's cost matrix, the
        baselines (:func:`pipeopt.problems.partition.binary_search.straight_stage_time`) and
        the MILP / CP-SAT arrays (:class:`pipeopt.problems.partition.model.StraightModel`)
        read it or its :attr:`cut_terms`.

        Parameters
        ----------
        a, b
            First unit and end (exclusive): ints or integer arrays.
        in_flight
            Microbatches the stage keeps under 1F1B (``S - t`` for stage t without replication).
        replicas
            m >= 1.
        memory
            If True, a stage that exceeds the worker's memory (:meth:`fits`) costs ``inf``.

        Returns
        -------
        ndarray
            Seconds, shaped like ``a`` and ``b`` broadcast.
        """
        a, b = np.asarray(a), np.asarray(b)
        m = replicas
        comp = rules.replicated_time(self.work_prefix[b] - self.work_prefix[a] + self.tie_sum(a, b),
                                     self.param_prefix[b] - self.param_prefix[a], m, self.bus_bandwidth, self.latency)
        added, bound = self.cut_terms
        t = np.maximum(comp + (added[a] + added[b] + self.zero_work(a, b)) / m, np.maximum(bound[a], bound[b]) / m)
        if memory and math.isfinite(self.memory):
            t = np.where(self.fits(self.stage_memory(a, b, in_flight)), t, np.inf)
        return t

    def stage_work(self, a, b, replicas=1):
        """Seconds one replica of a stage of units ``a..b-1`` is busy per microbatch: its
        compute (with its tied parameters' gradient sums, :meth:`tie_sum`), the all-reduce share
        of m replicas, and without overlap the transfers it sends
        (:func:`pipeopt.cost.rules.replica_ops` summed), and with data parallelism ZeRO's
        collectives per microbatch (:meth:`zero_work`); arrays broadcast, ``replicas`` an int or
        one count per element. The w_s of the window rows."""
        a, b, m = np.asarray(a), np.asarray(b), np.asarray(replicas)
        added, _ = self.cut_terms
        comp = self.work_prefix[b] - self.work_prefix[a] + self.tie_sum(a, b)
        if m.ndim:  # one replica count per stage
            many = m > 1
            if many.any():
                ar = rules.allreduce_time(self.param_prefix[b] - self.param_prefix[a], np.maximum(m, 1), self.bus_bandwidth,
                                          self.latency)
                comp = np.where(many, comp + ar, comp)
        elif replicas > 1:
            comp = comp + rules.allreduce_time(self.param_prefix[b] - self.param_prefix[a], replicas, self.bus_bandwidth,
                                               self.latency)
        return comp + added[a] + added[b] + self.zero_work(a, b)

    def period(self, starts, replicas=None, extra=None) -> float:
        """Steady-state time per microbatch (the ``bottleneck`` objective) of the split whose
        stages start at ``[0, *starts]`` on ``replicas`` (default one each), memory aside:
        :func:`pipeopt.cost.rules.steady_period` on the table's numbers, the window rows
        included. Equal to :func:`pipeopt.evaluate`'s bottleneck of :meth:`plan`. ``extra``:
        seconds each stage's backward adds by recomputation (default none; with
        ``recompute`` set, :meth:`stage_recompute` of the split, and ``inf`` if a stage fits
        with no recompute choice).

        Returns
        -------
        float
            Seconds.
        """
        p = np.array([0, *[int(c) for c in starts], self.n])
        S = len(p) - 1
        reps = np.ones(S, dtype=int) if replicas is None else np.asarray(replicas, dtype=int)
        work = np.asarray(self.stage_work(p[:-1], p[1:], reps), dtype=float)
        if extra is None and self.recompute != "none":
            extra = [sec for sec, _ in self.stage_recompute(list(starts), replicas)]
        if extra is not None:
            extra = np.asarray(extra, dtype=float)
            if not np.isfinite(extra).all():  # a stage no recompute choice fits
                return math.inf
            work = work + extra  # a replica's busy time per microbatch: its backward reruns the forwards
        after = np.cumsum(reps[::-1])[::-1]
        window = rules.in_flight(np.arange(S), S, workers_after=after, replicas=reps)
        cuts = p[1:-1]
        half = self.trip[cuts] / 2  # x = y: activations forward, as many gradient bytes back
        links = np.minimum(reps[:-1], reps[1:])
        return rules.steady_period(work, np.zeros(S), reps, window, np.zeros(S, dtype=bool), half, half, links)

    def stage_flight(self, stages: int, replicas=None) -> list[int]:
        """Microbatches each stage of a split into ``stages`` stages on ``replicas`` (default one
        each) keeps per replica: :meth:`in_flight` without replication, else
        :func:`pipeopt.cost.rules.in_flight` of the workers from the stage on."""
        if replicas is None:
            return [self.in_flight(t) for t in range(stages)]
        after = np.cumsum(np.asarray(replicas, dtype=int)[::-1])[::-1]
        return [int(rules.in_flight(t, stages, workers_after=int(after[t]), replicas=int(m)))
                for t, m in enumerate(replicas)]

    def stage_recompute(self, starts: list[int], replicas=None) -> list[tuple[float, dict]]:
        """Per stage of the split starting at ``[0, *starts]`` on ``replicas`` (default one each):
        the least seconds its recomputation adds to a replica's busy time per microbatch with its
        memory fitting and the layers it recomputes
        (:meth:`pipeopt.problems.partition.recompute.RecomputeModel.choose`; ``inf`` and the
        choice of least memory for a stage no choice fits). ``(0.0, {})`` each with ``recompute="none"``."""
        bounds = [0, *[int(c) for c in starts], self.n]
        S = len(bounds) - 1
        if self.recomputation is None:
            return [(0.0, {})] * S
        flight = self.stage_flight(S, replicas)
        return [self.recomputation.choose(bounds[t], bounds[t + 1], flight[t]) for t in range(S)]

    # ---- plans and results -------------------------------------------------------------
    def plan(self, starts: list[int], replicas: list[int] | None = None, recompute: list | None = None) -> Plan:
        """The plan whose stages start at units ``[0, *starts]``.

        Parameters
        ----------
        starts
            Unit index where each stage after the first begins, increasing.
        replicas
            Replica count per stage (default 1 each); devices are dealt in order.
        recompute
            Per stage, ``dict[layer, mode]`` of its recomputed layers (``None``: with the
            problem's ``recompute`` set, the least-time choice that fits, :meth:`stage_recompute`;
            else nothing recomputed).
        """
        starts = [int(c) for c in starts]
        layer_sets = self.instance.chain.stages_from_cuts(starts)
        replicas = [1] * len(layer_sets) if replicas is None else [int(m) for m in replicas]
        if len(replicas) != len(layer_sets):
            raise InvalidProblemError(f"{len(layer_sets)} stages but {len(replicas)} replica counts")
        if recompute is None:
            recompute = [rc for _, rc in self.stage_recompute(starts, replicas)] if self.recompute != "none" \
                else [None] * len(layer_sets)
        names = [d.name for d in self.instance.cluster.devices]
        if sum(replicas) > len(names):
            raise InvalidProblemError(f"plan needs {sum(replicas)} devices, the cluster has {len(names)}")
        stages, used = [], 0
        for layers, m, rc in zip(layer_sets, replicas, recompute, strict=True):
            stages.append(Stage(layers=layers, devices=tuple(names[used : used + m]), replicas=m, recompute=rc or None))
            used += m
        return Plan(tuple(stages))

    def starts_of(self, plan: Plan) -> list[int]:
        """Inverse of :meth:`plan` for a plan that recomputes nothing: the unit index where
        each stage after the first begins.

        Raises
        ------
        InvalidPlanError
            If a stage of ``plan`` recomputes a layer (the cuts alone would drop its recompute
            set: :func:`pipeopt.cost.table.refuse_recompute`); use :meth:`split_of`, which
            returns the recompute sets with the cuts.
        """
        refuse_recompute(plan, "PartitionProblem.starts_of (the cuts alone; split_of carries the recompute sets)")
        return self.split_of(plan)[0]

    def split_of(self, plan: Plan) -> tuple[list[int], list]:
        """Inverse of :meth:`plan`, recomputation included.

        Returns
        -------
        (starts, recompute)
            ``starts``: the unit index where each stage after the first begins;
            ``recompute``: per stage its ``dict[layer, mode]`` (``{}`` when it recomputes nothing),
            as :meth:`plan`'s ``recompute`` and
            :meth:`pipeopt.problems.schedule.ScheduleProblem.result`'s take it.
        """
        unit_of = self.instance.chain.unit_of
        return ([unit_of[st.layers[0]] for st in plan.stages[1:]],
                [dict(st.recompute or {}) for st in plan.stages])

    def result(
        self,
        method: str,
        plan: Plan | None,
        status: Status,
        *,
        lower_bound: float | None = None,
        started: float | None = None,
        space: str | None = None,
        info: dict | None = None,
    ) -> Result:
        """Wrap a plan into a :class:`Result`, scoring it with :func:`evaluate`.

        A heuristic whose plan breaks the memory limit gets status ``INFEASIBLE``.
        """
        return Result.scored(
            self.instance, method, plan, status, lower_bound=lower_bound, started=started,
            space=space or self.space, info=info,
        )

    # ---- a bound every method may quote ------------------------------------------------
    def simple_lower_bound(self) -> float:
        """max(total work / S, largest unit, memory-free): a valid bound on the one-order optimum."""
        if self.n == 0:
            return 0.0
        return float(max(self.work_prefix[-1] / self.stages, self.work.max() if not self.replication else 0.0))


def is_close(a: float, b: float, rel: float = 1e-9) -> bool:
    """Float comparison used across methods (relative tolerance, inf-safe)."""
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)
