"""The problem data every method reads: a layer graph, a cluster and the settings."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import cached_property

import networkx as nx

from .cluster import Cluster
from .errors import InvalidClusterError, InvalidProblemError
from .graph import Chain, validate_graph

OBJECTIVES = ("bottleneck", "gpipe", "makespan")


@dataclass(frozen=True)
class Settings:
    """How a plan is scored (DESIGN.md, "The cost model").

    Parameters
    ----------
    overlap
        Communication overlaps compute (default, as in PipeDream): the time per microbatch
        is ``max(max_i tau_i, max_i C_i)``. Without it each stage also pays the transfers it
        sends (its activations forward, its input gradients back).
    weight_stashing
        Stage i (0-based, S stages) keeps ``S - i`` weight versions (PipeDream) instead of one.
    microbatches
        M, microbatches per iteration (used for the iteration-time estimates and the simulator).
    objective
        ``"bottleneck"`` (steady-state time per microbatch, 1F1B / PipeDream; default),
        ``"gpipe"`` (``max_i F_i + max_i B_i``) or ``"makespan"`` (``sum_i t_i + (M-1) max_i t_i``).
    """

    overlap: bool = True
    weight_stashing: bool = False
    microbatches: int = 8
    objective: str = "bottleneck"

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise InvalidProblemError(f"unknown objective {self.objective!r}; choose from {OBJECTIVES}")
        if not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise InvalidProblemError(f"microbatches must be a positive integer, got {self.microbatches!r}")


@dataclass(frozen=True)
class Instance:
    """A validated problem instance.

    Parameters
    ----------
    graph
        Layer graph (``networkx.DiGraph``, see :mod:`pipeopt.graph`). Not copied: do not
        mutate it after building the instance.
    cluster
        The devices and the network.
    settings
        Scoring settings.
    name
        A label for tables.
    assumptions
        ``tuple[str, ...]``: inputs the reader had to assume (a default bandwidth, ...);
        shown with every result.

    Raises
    ------
    InvalidGraphError
        If the graph is invalid (see :func:`pipeopt.graph.validate_graph`).
    InvalidClusterError
        If some layer can run on no resource kind the cluster has.
    """

    graph: nx.DiGraph
    cluster: Cluster
    settings: Settings = field(default_factory=Settings)
    name: str = "instance"
    assumptions: tuple = ()

    def __post_init__(self) -> None:
        validate_graph(self.graph)
        object.__setattr__(self, "assumptions", tuple(self.assumptions))
        have = set(self.cluster.kinds)
        for node, fwd in self.graph.nodes(data="fwd"):
            if not any(math.isfinite(t) and k in have for k, t in fwd.items()):
                raise InvalidClusterError(
                    f"layer {node!r} runs only on {sorted(fwd)} but the cluster has {sorted(have)}"
                )

    @cached_property
    def chain(self) -> Chain:
        """The chain of units over the deterministic layer order (:class:`pipeopt.graph.Chain`)."""
        return Chain.from_graph(self.graph)

    @property
    def num_layers(self) -> int:
        """Number of layers (graph nodes)."""
        return self.graph.number_of_nodes()

    def replace(self, **changes) -> Instance:
        """A copy with some fields replaced (``settings=...``, ``cluster=...``, ...)."""
        return dataclasses.replace(self, **changes)

    def with_settings(self, **changes) -> Instance:
        """A copy whose settings have some fields replaced."""
        return self.replace(settings=dataclasses.replace(self.settings, **changes))
