"""Duan & Wu's resource problems: allocate, joint, group (DESIGN.md problems 2-4).

All three share :class:`ResourceProblem`: the per-unit forward and backward times of every
resource kind, the cut transfer times and the memory of a contiguous stage, the stage time of
a unit range on a worker (split or sequential), and the translation of cut positions and
device groups into a :class:`~pipeopt.plan.Plan` scored by :func:`~pipeopt.cost.evaluate`.

Scope of the models (the exact methods rely on it; the constructors check it): the
objective is the steady-state bottleneck with communication overlapped (the default
:class:`~pipeopt.instance.Settings`), no replication, one worker per stage.

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

from ...backends.deadline import Deadline
from ...cost import CostTable, check_plan, rules, stage_compute
from ...errors import InvalidProblemError
from ...instance import Instance
from ..partition.problem import check_stage_count
from ...plan import Plan, Stage
from ...result import Result
from .split import best_split, theorem_split

SPLIT_MODES = ("split", "sequential", "theorem")


class ResourceProblem:
    """Data shared by the allocate, joint and group problems (a mixin of the three classes).

    Subclasses provide ``instance`` and :attr:`num_stages`. Units are those of the chain
    (:class:`pipeopt.graph.Chain`): layers, with pinned input layers glued to the first one.
    """

    instance: Instance

    def _check_settings(self) -> None:
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

    @property
    def cut_time(self) -> np.ndarray:
        """``ndarray (n+1,)``: seconds to send activations forward and gradients back across
        the boundary before unit c (:attr:`CostTable.cut_time`; 0 at both ends)."""
        return self.table.cut_time

    def stage_memory(self, a: int, b: int, stage: int) -> float:
        """Bytes that units ``a..b-1`` need as stage ``stage`` (activations in flight + parameters)."""
        return float(self.table.stage_memory(a, b, stage))

    # ---- workers -----------------------------------------------------------------------
    def pooled(self, devices) -> dict:
        """``dict[kind, units]``: resources pooled over device names ``devices``."""
        return rules.pool(self.instance.cluster.device(name) for name in devices)[0]

    def capacity(self, devices) -> float:
        """Bytes of memory of the worker made of ``devices``."""
        return float(rules.pool(self.instance.cluster.device(d) for d in devices)[1])

    @staticmethod
    def share(res: dict, F: dict, B: dict, mode: str = "split") -> dict | None:
        """The forward share per kind a stage with loads ``F``, ``B`` gets on resources ``res``.

        ``mode``: ``"split"`` (optimal, :func:`best_split`), ``"theorem"`` (beta = c / (c + 1),
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
        """Compute time per microbatch (seconds) of units ``a..b-1`` on resources ``res`` with the
        share of ``mode`` (:meth:`share`): :func:`pipeopt.cost.stage_compute`, the rule
        :func:`pipeopt.evaluate` applies to the plan."""
        F, B = self.load(a, b)
        return stage_compute(res, F, B, self.share(res, F, B, mode))[2]

    def stage_time(self, a: int, b: int, devices, stage: int, mode: str = "split") -> float:
        """Time per microbatch of stage ``stage`` = units ``a..b-1`` on the worker ``devices``,
        with its two cuts (overlap) and ``inf`` if it does not fit in memory."""
        return max(self.fit_time(a, b, devices, stage, mode), float(self.cut_time[a]), float(self.cut_time[b]))

    @cached_property
    def _compute_cache(self) -> dict:
        return {}

    def fit_time(self, a: int, b: int, devices, stage: int, mode: str = "split") -> float:
        """Compute time of stage ``stage`` = units ``a..b-1`` on worker ``devices``, ``inf`` if
        it does not fit in memory (non-decreasing in b, non-increasing in a). The compute time
        is cached per unit range, pooled resources and mode (workers with equal resources share it)."""
        if not rules.fits(self.stage_memory(a, b, stage), self.capacity(devices)):
            return math.inf
        res = self.pooled(devices)
        key = (a, b, tuple(sorted(res.items())), mode)
        v = self._compute_cache.get(key)
        if v is None:
            v = self._compute_cache[key] = self.compute_time(a, b, res, mode)
        return v

    def plan_value(self, starts, groups, mode: str = "split") -> float:
        """Bottleneck of the plan given by ``starts`` and ``groups`` as computed here (equals
        ``evaluate(...).objective`` of :meth:`plan`, which the tests check)."""
        bounds = [0, *starts, self.n]
        return max(self.stage_time(bounds[s], bounds[s + 1], groups[s], s, mode) for s in range(len(groups)))

    # ---- plans and results ------------------------------------------------------------
    def plan(self, starts, groups, mode: str = "split") -> Plan:
        """The plan whose stages start at units ``[0, *starts]`` on workers ``groups``.

        Parameters
        ----------
        starts
            Unit index where each stage after the first begins, increasing (S - 1 entries).
        groups
            ``list[tuple[str, ...]]``: device names of each stage's worker (S entries).
        mode
            ``"split"``: each stage gets its optimal forward share (LP); ``"theorem"``: the
            closed form c / (c + 1); ``"sequential"``: no split (``beta = None``).
        """
        starts = [int(c) for c in starts]
        layer_sets = self.instance.chain.stages_from_cuts(starts)
        if len(layer_sets) != len(groups):
            raise InvalidProblemError(f"{len(layer_sets)} stages but {len(groups)} workers")
        bounds = [0, *starts, self.n]
        stages = []
        for s, (layers, devs) in enumerate(zip(layer_sets, groups, strict=True)):
            F, B = self.load(bounds[s], bounds[s + 1])
            beta = self.share(self.pooled(devs), F, B, mode)
            stages.append(Stage(layers=layers, devices=tuple(devs), beta=beta))
        return Plan(tuple(stages))

    def starts_of(self, plan: Plan) -> list[int]:
        """The unit index where each stage after the first begins."""
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
    """The same stages with the optimal forward share per worker and resource kind.

    Parameters
    ----------
    instance
        The instance.
    plan
        A valid contiguous plan (layers and devices are kept; ``beta`` is replaced).

    Returns
    -------
    Plan
        Each stage's ``beta`` solves the allocation LP (:func:`pipeopt.problems.resource.split.best_split`).

    Raises
    ------
    InvalidPlanError
        If the plan is invalid (dropped layer, share outside [0, 1], ...).
    """
    check_plan(instance, plan)
    graph = instance.graph
    stages = []
    for st in plan.stages:
        res: dict = {}
        for name in st.devices:
            for k, r in instance.cluster.device(name).resources.items():
                res[k] = res.get(k, 0.0) + r / st.replicas
        F = {k: sum(graph.nodes[n]["fwd"].get(k, math.inf) for n in st.layers) for k in res}
        B = {k: sum(graph.nodes[n]["bwd"].get(k, math.inf) for n in st.backward_layers) for k in res}
        stages.append(Stage(st.layers, st.devices, st.replicas, best_split(res, F, B)[0], st.bwd_layers))
    return Plan(tuple(stages))


# ---- exact references for tiny instances --------------------------------------------------

def minmax_chain_dp(problem: ResourceProblem, groups: list, mode: str = "split",
                    deadline: Deadline | None = None) -> tuple[list[int], float]:
    """Best contiguous split of the chain over the fixed workers ``groups`` (stage s on groups[s]).

    ``best[s][j] = min_i max(best[s-1][i], stage_time(i, j, groups[s-1], s-1))``: exact for
    any stage time (it enumerates every cut through the DP), O(S n^2) stage-time calls.

    Parameters
    ----------
    problem
        A resource problem.
    groups
        ``list[tuple[str, ...]]``: the worker of each stage.
    mode
        Stage time: ``"split"``, ``"sequential"`` or ``"theorem"``.
    deadline
        Checked once per table row (:class:`~pipeopt.backends.deadline.Deadline`, or ``None``).

    Returns
    -------
    (starts, value)
        Cut positions and the bottleneck (``inf`` if nothing fits memory).

    Raises
    ------
    DeadlineReached
        If ``deadline`` passes before the table is complete.
    """
    n, S = problem.n, len(groups)
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    args = []
    for s in range(S):
        new = np.full(n + 1, np.inf)
        arg = np.zeros(n + 1, dtype=int)
        lo_j, hi_j = s + 1, n - (S - 1 - s)
        for j in range(lo_j, hi_j + 1):
            if deadline is not None:
                deadline.check(f"the min-max DP (stage {s}, unit {j})")
            for i in range(s, j):
                if not math.isfinite(best[i]) or best[i] >= new[j]:
                    continue
                v = max(best[i], problem.stage_time(i, j, groups[s], s, mode))
                if v < new[j]:
                    new[j], arg[j] = v, i
        best = new
        args.append(arg)
    value = float(best[n])
    starts, j = [], n
    for s in range(S - 1, 0, -1):
        j = int(args[s][j])
        starts.append(j)
    return starts[::-1], value


def groupings(num_devices: int, q: int):
    """Every assignment of devices 0..num_devices-1 to q ordered, non-empty workers
    (``list[tuple[int, ...]]`` per assignment). q^d of them: tiny instances only."""
    for assign in itertools.product(range(q), repeat=num_devices):
        groups = [tuple(d for d in range(num_devices) if assign[d] == s) for s in range(q)]
        if all(groups):
            yield groups


def brute_force(problem: ResourceProblem, mode: str = "split") -> tuple[list[int], list[tuple], float]:
    """Enumerate every plan of a tiny joint or group problem: all cut sets, all groupings.

    Returns
    -------
    (starts, groups, value)
        A best plan and its bottleneck.

    Raises
    ------
    InvalidProblemError
        If the enumeration would exceed 10^6 plans.
    """
    n, S = problem.n, problem.num_stages
    if isinstance(problem, GroupProblem):
        names = problem.device_names
        all_groups = [[tuple(names[d] for d in g) for g in gs] for gs in groupings(len(names), S)]
    else:
        all_groups = [problem.groups]
    count = math.comb(n - 1, S - 1) * len(all_groups)
    if count > 10**6:
        raise InvalidProblemError(f"brute force would enumerate {count} plans")
    best = (None, None, math.inf)
    for groups in all_groups:
        for starts in itertools.combinations(range(1, n), S - 1):
            v = problem.plan_value(list(starts), groups, mode)
            if v < best[2]:
                best = (list(starts), groups, v)
    return best
