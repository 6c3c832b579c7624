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
from ...errors import InvalidProblemError
from ...instance import Instance
from ...plan import Plan, Stage
from ...result import Result, Status

SPACES = ("straight", "replicated")


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

    Raises
    ------
    InvalidProblemError
        If S < 1, S exceeds the number of layers (units) or of devices, the devices differ,
        or a device has several usable resource kinds, or the objective is not
        ``"bottleneck"`` (the exact partition methods optimise the bottleneck).
    """

    instance: Instance
    stages: int
    replication: bool = False

    def __post_init__(self) -> None:
        inst = self.instance
        check_stage_count(inst, self.stages)
        if not inst.cluster.is_homogeneous:
            raise InvalidProblemError("the partition problem needs identical devices; use the group problem")
        if inst.settings.objective != "bottleneck":
            raise InvalidProblemError(
                f"the partition methods minimise the bottleneck; objective {inst.settings.objective!r} is not supported"
            )
        _ = self.kind

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
    def memory(self) -> float:
        """Bytes of memory per worker."""
        return self.instance.cluster.devices[0].memory

    @property
    def space(self) -> str:
        """``"replicated"`` or ``"straight"``."""
        return "replicated" if self.replication else "straight"

    # ---- the cost of one stage, as the exact methods see it ----------------------------
    def in_flight(self, stage: int) -> int:
        """Microbatches stage ``stage`` (0-based) keeps under 1F1B without replication: S - stage."""
        return rules.in_flight(stage, self.stages)

    def stage_memory(self, a, b, in_flight):
        """Bytes a stage of units ``a..b-1`` needs with ``in_flight`` microbatches (arrays broadcast)."""
        return self.table.memory(a, b, in_flight)

    def stage_time(self, a, b, *, in_flight, replicas: int = 1, memory: bool = True):
        """Time per microbatch of a stage of units ``a .. b-1`` on ``replicas`` workers, as
        :func:`pipeopt.evaluate` scores it (vectorised: ``a``, ``b`` broadcast).

        Compute ``(work + 2 (m-1)/m params / bandwidth) / m``; the cuts before unit ``a`` and
        before unit ``b`` cost ``2 bytes / (bandwidth m)`` each. With overlap the stage time
        is the max of compute and its cuts (so the bottleneck, a max over stages, counts the
        cut between stages with m and m' replicas at ``2 bytes / (bandwidth min(m, m'))``);
        without overlap the stage pays what it sends, ``(in + out bytes) / (bandwidth m)``.

        Parameters
        ----------
        a, b
            First unit and end (exclusive): ints or integer arrays.
        in_flight
            Microbatches the stage keeps under 1F1B (``S - t`` for stage t without replication).
        replicas
            m >= 1.
        memory
            If True, a stage that exceeds the worker's memory costs ``inf``.

        Returns
        -------
        ndarray
            Seconds, shaped like ``a`` and ``b`` broadcast.
        """
        a, b = np.asarray(a), np.asarray(b)
        m, bw, tab = replicas, self.bandwidth, self.table
        comp = rules.replicated_time(self.work_prefix[b] - self.work_prefix[a],
                                     self.param_prefix[b] - self.param_prefix[a], m, bw)
        if self.instance.settings.overlap:
            t = np.maximum(comp, np.maximum(tab.cut_time[a], tab.cut_time[b]) / m)
        else:
            t = comp + (tab.send_time[a] + tab.send_time[b]) / m
        if memory and math.isfinite(self.memory):
            t = np.where(rules.fits(self.stage_memory(a, b, in_flight), self.memory), t, np.inf)
        return t

    # ---- plans and results -------------------------------------------------------------
    def plan(self, starts: list[int], replicas: list[int] | None = None) -> Plan:
        """The plan whose stages start at units ``[0, *starts]``.

        Parameters
        ----------
        starts
            Unit index where each stage after the first begins, increasing.
        replicas
            Replica count per stage (default 1 each); devices are dealt in order.
        """
        starts = [int(c) for c in starts]
        layer_sets = self.instance.chain.stages_from_cuts(starts)
        replicas = [1] * len(layer_sets) if replicas is None else [int(m) for m in replicas]
        if len(replicas) != len(layer_sets):
            raise InvalidProblemError(f"{len(layer_sets)} stages but {len(replicas)} replica counts")
        names = [d.name for d in self.instance.cluster.devices]
        if sum(replicas) > len(names):
            raise InvalidProblemError(f"plan needs {sum(replicas)} devices, the cluster has {len(names)}")
        stages, used = [], 0
        for layers, m in zip(layer_sets, replicas, strict=True):
            stages.append(Stage(layers=layers, devices=tuple(names[used : used + m]), replicas=m))
            used += m
        return Plan(tuple(stages))

    def starts_of(self, plan: Plan) -> list[int]:
        """Inverse of :meth:`plan`: the unit index where each stage after the first begins."""
        unit_of = self.instance.chain.unit_of
        return [unit_of[st.layers[0]] for st in plan.stages[1:]]

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
        """max(total work / S, largest unit, memory-free): a valid bound on the straight optimum."""
        if self.n == 0:
            return 0.0
        return float(max(self.work_prefix[-1] / self.stages, self.work.max() if not self.replication else 0.0))


def is_close(a: float, b: float, rel: float = 1e-9) -> bool:
    """Float comparison used across methods (relative tolerance, inf-safe)."""
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)
