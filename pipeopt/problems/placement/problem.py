"""The placement problem (Tarnawski et al., NeurIPS 2020): a layer DAG on k accelerators and l
CPUs, each device at most one convex stage, minimising the largest device load.

:class:`PlacementProblem` reads the instance once: the device classes (identical devices are
interchangeable), the units of the layer DAG (:class:`~pipeopt.problems.ideals.UnitDag`, with
the free layers merged), their per-kind times and bytes, and the tensors between units (the
``max_load`` transfers, :func:`pipeopt.cost.rules.stage_transfers`). Its plans are scored by
:func:`pipeopt.evaluate` under the ``max_load`` objective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ...cost import rules
from ...cost.ties import refuse_ties
from ...cost.transient import refuse_transient
from ...errors import InvalidProblemError
from ...graph import kinds_of
from ...instance import Instance
from ...plan import Plan, Stage
from ...result import Result, Status
from ..ideals import IDEAL_LIMIT, Incidence, Lattice, UnitDag

SPACES = ("convex", "one-order")


@dataclass(frozen=True)
class DeviceClass:
    """Identical devices: ``names`` and what each has (``resources``, ``memory``, ``host``)."""

    names: tuple
    resources: dict
    memory: float
    host: bool


@dataclass(frozen=True)
class PlacementProblem:
    """Place a layer DAG on the cluster's devices: every device runs at most one stage, the
    stages are convex and ordered (every edge goes to the same or a later stage).

    Parameters
    ----------
    instance
        Its settings' objective must be ``"max_load"`` (a workload of
        :func:`pipeopt.io.read_dnn_partitioning` has it); the devices may differ (Tarnawski et
        al.'s accelerators and CPUs) and may stay unused.

    Raises
    ------
    InvalidProblemError
        If the objective is not ``"max_load"`` (the pipeline objectives are the partition
        problem's).
    """

    instance: Instance

    def __post_init__(self) -> None:
        refuse_ties(self.instance, "the placement problem")
        refuse_transient(self.instance, "the placement problem")
        obj = self.instance.settings.objective
        if obj != "max_load":
            raise InvalidProblemError(
                f"the placement problem minimises the max-load (Tarnawski et al.); {self.instance.name} has objective"
                f" {obj!r}: use the partition problem, or read the workload with objective='max_load'"
            )

    # ---- devices -------------------------------------------------------------------------
    @cached_property
    def classes(self) -> tuple[DeviceClass, ...]:
        """Device classes in cluster order of their first device."""
        out: dict = {}
        for d in self.instance.cluster.devices:
            key = (tuple(sorted(d.resources.items())), d.memory, d.host)
            out.setdefault(key, []).append(d.name)
        return tuple(DeviceClass(tuple(names), dict(k[0]), k[1], k[2]) for k, names in out.items())

    # ---- units ---------------------------------------------------------------------------
    @cached_property
    def tensors(self) -> list:
        """``[(source layer, readers, bytes)]`` (:func:`pipeopt.cost.rules.tensors_of`)."""
        return rules.tensors_of(self.instance.graph)

    def _free(self, strict: bool) -> callable:
        """Layers that take no time anywhere and take part in no transfer with a third layer
        (:meth:`UnitDag.build`'s dominance, valid here since a device may stay unused);
        ``strict``: and hold no bytes (then the dominance holds for memory too)."""
        g = self.instance.graph
        partners: dict = {}  # the layers each layer exchanges a (non-empty) tensor with
        for src, readers, b in self.tensors:
            if b > 0:
                partners.setdefault(src, set()).update(readers)
                for r in readers:
                    partners.setdefault(r, set()).add(src)

        def free(x) -> bool:
            a = g.nodes[x]
            if any(a["fwd"].values()) or any(a["bwd"].values()):
                return False
            if strict and (a["param_bytes"] or a["act_bytes"]):
                return False
            if len(a["fwd"]) < len(kinds_of(g)):  # cannot run somewhere: not free
                return False
            nbrs = set(g.predecessors(x)) | set(g.successors(x))
            return partners.get(x, set()) - {x} <= nbrs

        return free

    @cached_property
    def dag(self) -> UnitDag:
        """The unit DAG (pinned layers glued, free layers merged into their neighbour); set
        :attr:`strict` to merge only layers without bytes."""
        return UnitDag.build(self.instance.graph, free=self._free(self.strict))

    strict = False
    """Merge only free layers without bytes (exact for memory too). Otherwise a merged layer's
    bytes are left out of the DP's memory (a relaxation: the DP's value is a lower bound, and
    its plan is optimal when it fits; :func:`pipeopt.problems.placement.dp.solve_dp` checks)."""

    def strictly(self) -> PlacementProblem:
        """The same problem, merging only free layers without bytes."""
        p = PlacementProblem(self.instance)
        object.__setattr__(p, "strict", True)
        return p

    @cached_property
    def kinds(self) -> tuple:
        """Resource kinds of the layers."""
        return kinds_of(self.instance.graph)

    @cached_property
    def unit_times(self) -> np.ndarray:
        """``ndarray (K, n)``: forward + backward seconds of each unit on one unit of each kind
        (``inf`` where a layer of the unit cannot run on it)."""
        g = self.instance.graph
        return np.array([[sum(g.nodes[x]["fwd"].get(k, math.inf) + g.nodes[x]["bwd"].get(k, math.inf) for x in u)
                          for u in self.dag.units] for k in self.kinds], dtype=float).reshape(len(self.kinds), -1)

    @cached_property
    def unit_memory(self) -> np.ndarray:
        """``ndarray (n,)``: bytes of each unit (activations once, parameters once: ``max_load``),
        leaving out the merged free layers (:attr:`strict`)."""
        g, merged = self.instance.graph, self.dag.merged
        return np.array([sum(rules.stage_memory(g.nodes[x]["act_bytes"], g.nodes[x]["param_bytes"], 1, 1)
                             for x in u if x not in merged) for u in self.dag.units], dtype=float)

    @cached_property
    def incidence(self) -> Incidence:
        """The tensors between units, each in seconds (:func:`pipeopt.cost.rules.transfer_time`)."""
        uo = self.dag.unit_of
        bw, alpha = self.instance.cluster.bandwidth, self.instance.cluster.latency
        return Incidence.of(self.dag.n, ((uo[s], [uo[r] for r in rd], rules.transfer_time(b, bw, 1, alpha))
                                         for s, rd, b in self.tensors))

    def lattice(self, space: str = "convex", limit: int = IDEAL_LIMIT, deadline=None) -> Lattice:
        """The ideals of the unit DAG (``"convex"``) or the prefixes of its unit order
        (``"one-order"``).

        Raises
        ------
        LatticeTooLarge
            If the DAG has more than ``limit`` ideals.
        """
        return Lattice.chain(self.dag.n) if space == "one-order" else Lattice.of(self.dag, limit=limit,
                                                                                   deadline=deadline)

    # ---- plans and results ---------------------------------------------------------------
    def plan(self, stages) -> Plan:
        """The plan of ``[(unit indices, class index), ...]`` in pipeline order; devices of a
        class are dealt in cluster order."""
        taken = [0] * len(self.classes)
        out = []
        for units, c in stages:
            names = self.classes[c].names
            if taken[c] >= len(names):
                raise InvalidProblemError(f"plan uses more than {len(names)} devices of class {c}")
            layers = tuple(x for u in sorted(int(i) for i in units) for x in self.dag.units[u])
            out.append(Stage(layers, (names[taken[c]],)))
            taken[c] += 1
        return Plan(tuple(out))

    def result(self, method: str, plan: Plan | None, status: Status, *, lower_bound=None, started=None,
               space: str = "convex", info: dict | None = None) -> Result:
        """Wrap a plan into a :class:`~pipeopt.Result` scored by :func:`pipeopt.evaluate`."""
        return Result.scored(self.instance, method, plan, status, lower_bound=lower_bound, started=started,
                             space=space, info=info)
