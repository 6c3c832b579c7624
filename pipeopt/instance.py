"""The problem data every method reads: a layer graph, a cluster and the settings."""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from .cluster import Cluster
from .errors import InvalidClusterError, InvalidProblemError
from .graph import Chain, is_array_chain, validate_graph
from .units import DEFAULT_MICROBATCHES, MAX_MICROBATCHES

if TYPE_CHECKING:  # a graph is a networkx.DiGraph, or a LazyDiGraph that becomes one (pipeopt.graph)
    import networkx as nx

OBJECTIVES = ("bottleneck", "iteration", "gpipe", "max_load")
OBJECTIVE_TEXT = {
    "bottleneck": "bottleneck: 1F1B steady-state time per microbatch (window rows included)",
    "iteration": "iteration: M microbatches under 1F1B with a flush",
    "gpipe": "gpipe: M microbatches under GPipe (fill-drain)",
    "max_load": "max_load: the largest stage load, its compute plus every transfer it sends or receives"
                " (Tarnawski et al., NeurIPS 2020; no overlap, no pipeline windows)",
}
"""What each objective measures, printed with every result (docs/cost-model.md, "Objectives")."""


@dataclass(frozen=True)
class Settings:
    """How a plan is scored (docs/cost-model.md).

    Parameters
    ----------
    overlap
        Communication overlaps compute (default, as in PipeDream): transfers run on the
        links beside compute. Without it each stage's ops also carry the transfers it sends
        (its activations forward, its input gradients back).
    weight_stashing
        Stage i (0-based, S stages) keeps ``S - i`` weight versions (PipeDream) instead of one.
    microbatches
        M, microbatches per iteration (the ``iteration`` and ``gpipe`` objectives, the
        secondary objective of the exact methods, the simulator, the schedule problem, ``pipeopt
        run``), an integer in 1 .. :data:`pipeopt.units.MAX_MICROBATCHES`; default
        :data:`pipeopt.units.DEFAULT_MICROBATCHES`. Every command and function takes the M
        given, else this one (the one rule).
    objective
        What the exact methods minimise, each equal to the simulator's value for every plan
        (docs/cost-model.md, "Objectives"): ``"bottleneck"`` (steady-state time per
        microbatch under 1F1B and asynchronous PipeDream, window rows included; default),
        ``"iteration"`` (M microbatches under 1F1B with a flush), ``"gpipe"`` (M
        microbatches under GPipe, fill-drain) or ``"max_load"`` (Tarnawski et al.'s max-load:
        the largest stage load, compute plus the transfers the stage sends and receives, each
        tensor once per stage, nothing on a ``host`` device; each layer's memory counted
        once; the *placement* problem's objective).
    zero
        ZeRO stage of the data-parallel training state (Rajbhandari et al., SC 2020), 0..3:
        0 replicates everything, 1 shards the optimizer state over the ``dp`` replicas, 2 also
        the gradients, 3 also the weights (FSDP's full sharding). Default 0.
    dp
        d >= 1, data-parallel replicas of the whole pipeline (each stage's worker has d - 1
        twins holding the same layers, on links of the cluster's bandwidth and latency).
        Default 1: no data parallelism, nothing to shard or synchronise.
    gradient_ratio, optimizer_ratio
        Bytes of gradients and of optimizer state per byte of ``param_bytes``, held beside the
        weights (e.g. 1 and 2 for Adam in fp32 when ``param_bytes`` are the weights alone, as
        in the model zoo). Default 0 and 0: the memory holds ``param_bytes`` only (today's
        model; a torch profile folds the whole training state into ``param_bytes``, where these
        stay 0 and ZeRO cannot tell the parts apart). The rules:
        :func:`pipeopt.cost.rules.sharded_state`, :func:`pipeopt.cost.rules.zero_op_times`,
        :func:`pipeopt.cost.rules.zero_sync_time` (docs/cost-model.md, "Data parallelism and
        ZeRO").

    Raises
    ------
    InvalidProblemError
        If a flag is not a bool, the objective is unknown, ``microbatches`` is not an
        integer in range, ``zero`` is not 0..3, ``dp`` not a positive integer, a ratio not a
        finite number >= 0, or ZeRO-3 is asked with weight stashing (sharded weights have no
        stashed versions).
    """

    overlap: bool = True
    weight_stashing: bool = False
    microbatches: int = DEFAULT_MICROBATCHES
    objective: str = "bottleneck"
    zero: int = 0
    dp: int = 1
    gradient_ratio: float = 0.0
    optimizer_ratio: float = 0.0

    def __post_init__(self) -> None:
        for name in ("overlap", "weight_stashing"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise InvalidProblemError(f"setting {name!r} must be True or False, got {getattr(self, name)!r}")
            object.__setattr__(self, name, bool(getattr(self, name)))
        if not isinstance(self.objective, str) or self.objective not in OBJECTIVES:
            hint = " ('makespan' is now 'iteration': the exact 1F1B-flush time)" if self.objective == "makespan" else ""
            raise InvalidProblemError(f"unknown objective {self.objective!r}; choose from {OBJECTIVES}{hint}")
        m = self.microbatches
        if isinstance(m, (bool, np.bool_)) or not isinstance(m, numbers.Integral) or not 1 <= m <= MAX_MICROBATCHES:
            raise InvalidProblemError(
                f"microbatches must be an integer in 1..{MAX_MICROBATCHES}, got {self.microbatches!r}"
            )
        object.__setattr__(self, "microbatches", int(m))
        z = self.zero
        if isinstance(z, (bool, np.bool_)) or not isinstance(z, numbers.Integral) or not 0 <= z <= 3:
            raise InvalidProblemError(f"zero must be a ZeRO stage 0, 1, 2 or 3, got {z!r}")
        object.__setattr__(self, "zero", int(z))
        d = self.dp
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, numbers.Integral) or d < 1:
            raise InvalidProblemError(f"dp (data-parallel replicas) must be a positive integer, got {d!r}")
        object.__setattr__(self, "dp", int(d))
        for name in ("gradient_ratio", "optimizer_ratio"):
            r = getattr(self, name)
            if isinstance(r, (bool, np.bool_)) or not isinstance(r, numbers.Real) or not (math.isfinite(r) and r >= 0):
                raise InvalidProblemError(f"{name} must be a finite number >= 0 (bytes per parameter byte), got {r!r}")
            object.__setattr__(self, name, float(r))
        if self.zero == 3 and self.weight_stashing:
            raise InvalidProblemError("ZeRO-3 shards the weights: weight stashing (a version per microbatch) does not apply")

    @property
    def data_parallel(self) -> bool:
        """True if the settings add data parallelism or training state to today's model (``dp > 1``,
        a ZeRO stage, or gradient / optimizer bytes)."""
        return self.dp > 1 or self.zero > 0 or self.gradient_ratio > 0 or self.optimizer_ratio > 0


@dataclass(frozen=True)
class Instance:
    """A validated problem instance.

    Parameters
    ----------
    graph
        Layer graph (``networkx.DiGraph``, see :mod:`pipeopt.graph`; a reader may give a
        :class:`pipeopt.graph.LazyDiGraph`, the same storage built without networkx, which
        becomes a ``networkx.DiGraph`` in place when anything needs networkx). Not copied: do
        not mutate it after building the instance.
    cluster
        The devices and the network.
    settings
        Scoring settings.
    name
        A label for tables.
    default_stages
        ``tuple[int, ...]``: the stage counts S the instance is meant to be solved with (what
        ``pipeopt bench`` tries when given none); empty: the cluster's device count. A
        PipeDream profile, whose cluster is assumed, says (4, 8).
    assumptions
        ``tuple[str, ...]``: inputs the reader had to assume (a default bandwidth, ...);
        shown with every result.

    Raises
    ------
    InvalidGraphError
        If the graph is invalid (see :func:`pipeopt.graph.validate_graph`).
    InvalidClusterError
        If ``cluster`` is not a :class:`Cluster`, or some layer can run on no resource kind
        the cluster has.
    InvalidProblemError
        If ``settings`` is not a :class:`Settings`, or ``name`` or ``assumptions`` are not
        strings.
    """

    graph: nx.DiGraph
    cluster: Cluster
    settings: Settings = field(default_factory=Settings)
    name: str = "instance"
    assumptions: tuple = ()
    default_stages: tuple = ()

    def __post_init__(self) -> None:
        validate_graph(self.graph)
        if not isinstance(self.cluster, Cluster):
            raise InvalidClusterError(f"cluster must be a pipeopt.Cluster, got {type(self.cluster).__name__}")
        if not isinstance(self.settings, Settings):
            raise InvalidProblemError(f"settings must be a pipeopt.Settings, got {type(self.settings).__name__}")
        if not isinstance(self.name, str):
            raise InvalidProblemError(f"instance name must be a string, got {self.name!r}")
        if isinstance(self.assumptions, str) or not all(isinstance(a, str) for a in self.assumptions):
            raise InvalidProblemError(f"assumptions must be a sequence of strings, got {self.assumptions!r}")
        object.__setattr__(self, "assumptions", tuple(self.assumptions))
        stages = self.default_stages
        if isinstance(stages, (str, bytes)) or not all(
            isinstance(s, numbers.Integral) and not isinstance(s, (bool, np.bool_)) and s >= 1 for s in stages
        ):
            raise InvalidProblemError(f"default_stages must be positive integers, got {stages!r}")
        object.__setattr__(self, "default_stages", tuple(int(s) for s in stages))
        have = set(self.cluster.kinds)
        if is_array_chain(self.graph) and not self.graph.materialized:
            bad = self.graph.runs_on(have)
            if bad is not None:
                runs = [k for k, t in self.graph.fwd.items() if math.isfinite(t[bad])]
                raise InvalidClusterError(
                    f"layer {self.graph.names[bad]!r} runs only on {runs} but the cluster has {sorted(have)}"
                )
            return
        for node, fwd in self.graph.nodes(data="fwd"):
            if not any(math.isfinite(t) and k in have for k, t in fwd.items()):
                raise InvalidClusterError(
                    f"layer {node!r} runs only on {sorted(fwd)} but the cluster has {sorted(have)}"
                )

    @classmethod
    def from_chain(
        cls,
        fwd,
        bwd,
        *,
        out_bytes,
        act_bytes,
        param_bytes,
        cluster: Cluster,
        settings: Settings | None = None,
        kind: str = "gpu",
        skips=None,
        skip_bytes=None,
        names=None,
        name: str = "chain",
        assumptions: tuple = (),
        default_stages: tuple = (),
    ) -> Instance:
        """An instance whose layer graph is a chain given as arrays: the fast way to build a
        long one (10^6 layers in about a second, where a networkx graph with a dict per layer
        takes most of a minute).

        Layer i feeds layer i + 1 (its ``out_bytes`` travel forward, as many gradient bytes
        back) and, optionally, later layers through skip edges. The graph is a
        :class:`pipeopt.graph.ChainGraph`: a :class:`networkx.DiGraph` whose dicts are built
        only if something asks for them; the cost table, :func:`pipeopt.evaluate` and the
        partition methods read its arrays (one cost model: the same table as for any graph).

        Parameters
        ----------
        fwd, bwd
            ``array (n,)``: seconds of each layer's forward / backward pass on one unit of
            ``kind``; or ``dict[kind, array (n,)]`` for several kinds (``inf``: cannot run).
        out_bytes, act_bytes, param_bytes
            ``array (n,)`` each, bytes: what a layer sends to each successor, what it keeps
            per microbatch for its backward pass, its parameters.
        cluster
            The devices and the network (e.g. ``Cluster.homogeneous(1024)``).
        settings
            Scoring settings (default :class:`Settings`).
        kind
            The resource kind of array-valued ``fwd``/``bwd`` (default ``"gpu"``, the kind of
            :meth:`Cluster.homogeneous`).
        skips
            ``array (E, 2)`` of int, or ``None``: skip edges ``(tail, head)``, ``tail + 1 <
            head``, each carrying ``skip_bytes[e]`` (default its tail's ``out_bytes``).
        names
            n distinct layer names; default the integers ``0 .. n-1``.
        name, assumptions, default_stages
            As for the constructor.

        Returns
        -------
        Instance

        Raises
        ------
        InvalidGraphError
            Bad arrays (:class:`pipeopt.graph.ChainGraph`: the rules of
            :func:`pipeopt.graph.validate_graph`).
        InvalidClusterError, InvalidProblemError
            As the constructor.

        Examples
        --------
        >>> import numpy as np, pipeopt
        >>> n = 1_000_000
        >>> rng = np.random.default_rng(0)
        >>> f = rng.uniform(1e-4, 1e-3, n)
        >>> inst = pipeopt.Instance.from_chain(f, 2 * f, out_bytes=np.full(n, 1e6), act_bytes=np.full(n, 1e6),
        ...                                    param_bytes=np.zeros(n), cluster=pipeopt.Cluster.homogeneous(1024))
        >>> pipeopt.solve(inst, stages=1024).status  # doctest: +SKIP
        <Status.OPTIMAL: 'optimal'>
        """
        if not isinstance(fwd, dict):
            fwd = {kind: fwd}
        if not isinstance(bwd, dict):
            bwd = {kind: bwd}
        from .graph import ChainGraph  # defined (networkx imported) on first use

        graph = ChainGraph(fwd, bwd, out_bytes, act_bytes, param_bytes, skips=skips, skip_bytes=skip_bytes,
                           names=names)
        return cls(graph, cluster, Settings() if settings is None else settings, name, assumptions, default_stages)

    @cached_property
    def chain(self) -> Chain:
        """The chain of units over the deterministic layer order (:class:`pipeopt.graph.Chain`)."""
        return Chain.from_graph(self.graph)

    @property
    def num_layers(self) -> int:
        """Number of layers (graph nodes)."""
        return self.graph.number_of_nodes()

    @property
    def cost_terms(self) -> tuple:
        """The optional cost terms this instance carries, as assumption lines (``()`` when both are
        0, as for every paper profile): the cluster's per-message latency
        (:attr:`Cluster.latency`) and collective bandwidth (:attr:`Cluster.collective_bandwidth`),
        the graph's ``stage_overhead``
        (:func:`pipeopt.cost.rules.stage_overhead`), the tied parameters' measured gradient sums
        (:func:`pipeopt.cost.rules.tie_sum_time`) and the settings' data parallelism
        (:attr:`Settings.data_parallel`). Printed with every result, after
        :attr:`assumptions`."""
        out = []
        if self.cluster.latency:
            out.append(f"every message between workers takes {self.cluster.latency * 1e3:.4g} ms of latency on top of "
                       "bytes / bandwidth (one message per cut, direction and microbatch)")
        if self.cluster.collective_bandwidth is not None:
            out.append(f"collectives (all-reduces of tied weights and replicas, ZeRO's) run at a bus bandwidth of "
                       f"{self.cluster.collective_bandwidth:.4g} B/s, the links at {self.cluster.bandwidth:.4g} B/s")
        over = self.graph.graph.get("stage_overhead") if hasattr(self.graph, "graph") else None
        if over and (over.get("forward") or over.get("backward")):
            out.append(f"each stage's runtime adds {float(over.get('forward', 0.0)) * 1e3:.4g} ms to its forward and "
                       f"{float(over.get('backward', 0.0)) * 1e3:.4g} ms to its backward per microbatch "
                       "(stage_overhead)")
        from .graph import ties_of

        for t in ties_of(self.graph) if hasattr(self.graph, "graph") else ():
            if any(sec for _, sec in t.sum_s):
                each = ", ".join(f"{sec * 1e3:.4g} ms on {k}" for k, sec in t.sum_s)
                out.append(f"a stage holding k >= 2 layers of the tied {t.name} sums their gradients k - 1 times per "
                           f"microbatch in its backward ({each} each: tie_sum_time)")
        st = self.settings
        if st.data_parallel:
            out.append(f"data parallelism: {st.dp} replica{'s' if st.dp != 1 else ''} of the pipeline, ZeRO-{st.zero}; "
                       f"training state beside the weights: gradients {st.gradient_ratio:g}x and optimizer state "
                       f"{st.optimizer_ratio:g}x param_bytes (ring collectives, not overlapped with compute)")
        return tuple(out)

    def replace(self, **changes) -> Instance:
        """A copy with some fields replaced (``settings=...``, ``cluster=...``, ...).

        Raises
        ------
        InvalidProblemError
            If a field name is unknown (and the errors of the constructor).
        """
        return _replace(self, changes)

    def with_settings(self, **changes) -> Instance:
        """A copy whose settings have some fields replaced (``microbatches=16``, ...).

        Raises
        ------
        InvalidProblemError
            If a setting name is unknown or a value invalid.
        """
        return self.replace(settings=_replace(self.settings, changes))


def _replace(obj, changes: dict):
    """``dataclasses.replace`` that names an unknown field in an :class:`InvalidProblemError`."""
    known = {f.name for f in dataclasses.fields(obj)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise InvalidProblemError(
            f"{type(obj).__name__} has no field(s) {unknown}; its fields are {sorted(known)}"
        )
    return dataclasses.replace(obj, **changes)
