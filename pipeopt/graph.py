"""The layer graph: validation, a deterministic layer order, and the chain view solvers use.

A layer graph is a :class:`networkx.DiGraph` whose nodes are layers (or operators).
Node attributes (units as in docs/cost-model.md):

``fwd``, ``bwd``
    ``dict[str, float]``: forward / backward time in **seconds** on one unit of each
    resource kind (``"gpu"``, ``"cpu"``, ...). A kind missing from the dict means the layer
    cannot run on it (infinite time).
``out_bytes``
    activation bytes this layer sends to each successor (its gradient travels back).
``param_bytes``
    parameter bytes.
``act_bytes``
    activation bytes kept for the backward pass (per microbatch).
``pin_first`` (optional, default ``False``)
    data-loading nodes (PipeDream's ``Input``) that must sit in the first stage.
``bwd_w`` (optional)
    ``dict[str, float]``: the part of ``bwd`` that computes the **weight gradient** (W), in
    seconds on one unit of each kind, ``0 <= bwd_w[k] <= bwd[k]``; the rest, ``bwd[k] -
    bwd_w[k]``, is the **input gradient** (I) that the previous stage waits for (zero-bubble
    schedules run the two apart, Qi et al., ICLR 2024). A kind missing from the dict (or the
    attribute missing) takes the documented default W = B / 2
    (:data:`pipeopt.cost.passes.DEFAULT_W_SHARE`, reported among the assumptions).

Edge attribute ``bytes`` defaults to the tail's ``out_bytes``.

Graph attribute ``tensors`` (optional): ``list[[source layer, [reader layers...], bytes]]``,
the tensors of the ``max_load`` objective (Tarnawski et al.'s communication rule,
:func:`pipeopt.cost.rules.stage_transfers`) where they are not the edges' activations and
gradients: a workload whose forward and backward operators send tensors of their own
(:func:`pipeopt.io.read_dnn_partitioning`). Absent: derived from the edges
(:func:`pipeopt.cost.rules.tensors_of`).
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import math
import numbers
import re
from dataclasses import dataclass
from functools import cached_property

import networkx as nx
import numpy as np

from .errors import InvalidGraphError
from .units import MAX_BYTES, MAX_SECONDS

NODE_NUMBERS = ("out_bytes", "param_bytes", "act_bytes")


def _natural_key(name: object) -> tuple:
    parts = re.split(r"(\d+)", str(name))
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts)


def validate_graph(graph: nx.DiGraph) -> None:
    """Check that ``graph`` is a valid layer graph.

    Parameters
    ----------
    graph
        The layer graph (see the module docstring for the attributes).

    Raises
    ------
    InvalidGraphError
        If the graph is empty, not directed, a multigraph, has a cycle (named), a node
        misses an attribute, or a time or size is negative, not a number, or above its
        documented maximum (:data:`pipeopt.units.MAX_SECONDS` per time value,
        :data:`pipeopt.units.MAX_BYTES` per size and for all layers' bytes together), or a
        layer has no resource kind that can run it, or its forward and backward kinds differ.
    """
    if not isinstance(graph, nx.DiGraph) or graph.is_multigraph():
        raise InvalidGraphError(f"layer graph must be a networkx.DiGraph, got {type(graph).__name__}")
    if graph.number_of_nodes() == 0:
        raise InvalidGraphError("layer graph has no layers")
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        path = " -> ".join(str(u) for u, _ in cycle) + f" -> {cycle[0][0]}"
        raise InvalidGraphError(f"layer graph has a cycle: {path}")
    total_bytes = 0.0
    for node, attrs in graph.nodes(data=True):
        for key in ("fwd", "bwd"):
            if key not in attrs:
                raise InvalidGraphError(f"layer {node!r} has no {key!r} attribute (seconds per resource kind)")
            costs = attrs[key]
            if not isinstance(costs, dict):
                raise InvalidGraphError(f"layer {node!r}: {key!r} must be a dict kind -> seconds, got {costs!r}")
            for kind, t in costs.items():
                if not _is_number(t) or math.isnan(t) or t < 0:
                    raise InvalidGraphError(f"layer {node!r} has a negative or invalid {key} time {t!r} on {kind!r}")
                if math.isfinite(t) and t > MAX_SECONDS:
                    raise InvalidGraphError(
                        f"layer {node!r} has a {key} time of {t!r} s on {kind!r}, above the maximum"
                        f" {MAX_SECONDS:g} s (times are seconds; inf = cannot run on the kind)"
                    )
        fk = {k for k, t in attrs["fwd"].items() if math.isfinite(t)}
        bk = {k for k, t in attrs["bwd"].items() if math.isfinite(t)}
        if not fk:
            raise InvalidGraphError(f"layer {node!r} cannot run on any resource kind (no finite forward time)")
        if fk != bk:
            raise InvalidGraphError(
                f"layer {node!r} has forward times on {sorted(fk)} but backward times on {sorted(bk)}"
            )
        if "bwd_w" in attrs:
            _check_weight_gradient(node, attrs["bwd_w"], attrs["bwd"])
        for key in NODE_NUMBERS:
            if key not in attrs:
                raise InvalidGraphError(f"layer {node!r} has no {key!r} attribute (bytes)")
            v = attrs[key]
            if not _is_number(v) or not math.isfinite(v) or v < 0:
                raise InvalidGraphError(f"layer {node!r} has a negative or invalid {key} {v!r}")
            _check_bytes(v, f"layer {node!r} has {key}")
            total_bytes += float(v) if key != "out_bytes" else 0.0
    if total_bytes > MAX_BYTES:
        raise InvalidGraphError(
            f"the layers' param_bytes and act_bytes add up to {total_bytes:.4g} bytes, above the maximum"
            f" {MAX_BYTES:g} (are the sizes in bytes?)"
        )
    for u, v, attrs in graph.edges(data=True):
        b = attrs.get("bytes", graph.nodes[u]["out_bytes"])
        if not _is_number(b) or not math.isfinite(b) or b < 0:
            raise InvalidGraphError(f"edge {u!r} -> {v!r} has a negative or invalid 'bytes' {b!r}")
        _check_bytes(b, f"edge {u!r} -> {v!r} has bytes")
    if "tensors" in graph.graph:
        _check_tensors(graph, graph.graph["tensors"])


def _check_tensors(graph: nx.DiGraph, tensors) -> None:
    """The optional graph attribute ``tensors``: ``[source, [readers...], bytes]`` entries
    naming layers of the graph, with non-negative finite bytes."""
    if isinstance(tensors, (str, bytes, dict)) or not hasattr(tensors, "__iter__"):
        raise InvalidGraphError(f"graph attribute 'tensors' must be a list of [source, [readers], bytes], got {tensors!r:.60}")
    for i, t in enumerate(tensors):
        if not isinstance(t, (list, tuple)) or len(t) != 3 or not isinstance(t[1], (list, tuple)):
            raise InvalidGraphError(f"tensors[{i}] must be [source layer, [reader layers], bytes], got {t!r:.80}")
        src, readers, b = t
        for x in (src, *readers):
            if isinstance(x, (list, dict)) or x not in graph:
                raise InvalidGraphError(f"tensors[{i}] names unknown layer {x!r}")
        if not _is_number(b) or not math.isfinite(b) or b < 0:
            raise InvalidGraphError(f"tensors[{i}] has a negative or invalid byte count {b!r}")
        _check_bytes(b, f"tensors[{i}] has bytes")


def _check_weight_gradient(node, w, bwd: dict) -> None:
    """The optional ``bwd_w`` of a layer: a dict kind -> seconds with ``0 <= W <= bwd`` on
    kinds where the layer has a finite backward time."""
    if not isinstance(w, dict):
        raise InvalidGraphError(
            f"layer {node!r}: 'bwd_w' must be a dict kind -> seconds (the weight-gradient part"
            f" of bwd), got {w!r}"
        )
    for kind, t in w.items():
        b = bwd.get(kind, math.inf)
        if not math.isfinite(b):
            raise InvalidGraphError(
                f"layer {node!r} has a bwd_w time on {kind!r}, where it has no finite backward time"
            )
        if not _is_number(t) or math.isnan(t) or not 0 <= t <= b:
            raise InvalidGraphError(
                f"layer {node!r}: bwd_w on {kind!r} is {t!r}; it must be a number of seconds in"
                f" [0, bwd = {b!r}] (the weight-gradient part W of the backward; I = bwd - W)"
            )


def _is_number(x) -> bool:
    """A real number that is not a bool (numpy scalars included)."""
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def _check_bytes(value, what: str) -> None:
    if value > MAX_BYTES:
        raise InvalidGraphError(
            f"{what} {value!r}, above the maximum {MAX_BYTES:g} bytes (are the sizes in bytes?)"
        )


def edge_bytes(graph: nx.DiGraph, u, v) -> float:
    """Bytes an edge carries forward per microbatch (its gradient carries as many back)."""
    return float(graph.edges[u, v].get("bytes", graph.nodes[u]["out_bytes"]))


def kinds_of(graph: nx.DiGraph) -> tuple[str, ...]:
    """Sorted resource kinds that appear in any layer's ``fwd`` dict."""
    return tuple(sorted({k for _, d in graph.nodes(data="fwd") for k in d}))


@contextlib.contextmanager
def _gc_paused():
    """Pause the cyclic garbage collector while a large graph is read: the ~10^5 short-lived
    tuples and lists of one read would trigger collections that each walk every object of the
    graph (most of the read's time). Reference counting still frees them; the collector's
    state is restored on the way out."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def layer_order(graph: nx.DiGraph) -> list:
    """A deterministic topological order of the layers.

    Pinned (``pin_first``) layers come first; ties are broken by the natural order of the
    node names (``node2`` before ``node10``), so the order does not depend on how the graph
    was built. A chain comes out in its path order.

    The order is that of ``networkx.lexicographical_topological_sort`` with the natural key
    (ties between equal keys: the graph's node order), computed without building a key for a
    layer that is the only one ready (on a chain, none is built): 10^5 layers take tens of
    milliseconds instead of seconds.
    """
    with _gc_paused():
        pinned = sorted((n for n, p in graph.nodes(data="pin_first") if p), key=_natural_key)
        if pinned:  # networkx's node order of the subgraph of the other layers (its tie-break)
            nodes = list(graph.subgraph(n for n in graph.nodes if not graph.nodes[n].get("pin_first")))
        else:
            nodes = list(graph)
        return pinned + _lexicographic_topological_order(graph, nodes)


def _lexicographic_topological_order(graph: nx.DiGraph, nodes: list) -> list:
    """Kahn's algorithm on the subgraph induced by ``nodes``, always taking the ready layer of
    least ``(natural key, position in nodes)``: ``nx.lexicographical_topological_sort``'s
    order. A key is built only when two or more layers are ready at once."""
    index = {u: i for i, u in enumerate(nodes)}
    succ = dict(graph.adjacency())
    if len(nodes) == len(succ):  # every layer: no successor to filter out
        children = [[index[v] for v in succ[u]] for u in nodes]
    else:
        children = [[index[v] for v in succ[u] if v in index] for u in nodes]
    indegree = [0] * len(nodes)
    for ch in children:
        for j in ch:
            indegree[j] += 1
    ready = [i for i, d in enumerate(indegree) if d == 0]
    single = ready[0] if len(ready) == 1 else None  # the only ready layer (then heap is empty)
    heap = [] if single is not None else [(_natural_key(nodes[i]), i) for i in ready]
    heapq.heapify(heap)
    out = []
    while heap or single is not None:
        if single is not None:
            i, single = single, None
        else:
            i = heapq.heappop(heap)[1]
        out.append(nodes[i])
        for j in children[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                if single is None and not heap:
                    single = j
                    continue
                if single is not None:
                    heapq.heappush(heap, (_natural_key(nodes[single]), single))
                    single = None
                heapq.heappush(heap, (_natural_key(nodes[j]), j))
    if len(out) != len(nodes):
        raise nx.NetworkXUnfeasible("Graph contains a cycle or graph changed during iteration")
    return out


@dataclass(frozen=True)
class Chain:
    """The layer order seen as a chain of *units* over which contiguous splits are taken.

    A unit is one layer, except that pinned input layers are glued to the first unpinned
    layer, so that no cut can separate data loading from the first stage. Exact methods and
    baselines work on units; plans are given back in layer names.

    Attributes
    ----------
    units
        ``list[tuple[node, ...]]`` of length n, in pipeline order.
    kinds
        resource kinds, sorted.
    fwd, bwd
        ``dict[kind, ndarray (n,)]``, seconds on one unit of the kind (``inf`` = cannot run).
    param, act
        ``ndarray (n,)``, bytes.

    The bytes crossing each boundary, and every other cost, are tabulated by
    :class:`pipeopt.cost.CostTable` (the cost model's rules live in :mod:`pipeopt.cost.rules`).
    """

    units: list
    kinds: tuple
    fwd: dict
    bwd: dict
    param: np.ndarray
    act: np.ndarray

    @property
    def n(self) -> int:
        """Number of units."""
        return len(self.units)

    @classmethod
    def from_graph(cls, graph: nx.DiGraph, order: list | None = None) -> Chain:
        """Build the chain of a validated layer graph over ``order`` (default :func:`layer_order`)."""
        with _gc_paused():
            return cls._from_graph(graph, order)

    @classmethod
    def _from_graph(cls, graph: nx.DiGraph, order: list | None) -> Chain:
        order = layer_order(graph) if order is None else list(order)
        attrs = dict(graph.nodes(data=True))
        units: list[tuple] = []
        pending: list = []
        for node in order:
            pending.append(node)
            if not attrs[node].get("pin_first"):
                units.append(tuple(pending))
                pending = []
        if pending:  # only pinned layers: they form the last unit
            if units:
                units[-1] = units[-1] + tuple(pending)
            else:
                units.append(tuple(pending))
        kinds = kinds_of(graph)
        n = len(units)
        index = {node: i for i, unit in enumerate(units) for node in unit}
        flat = [attrs[node] for unit in units for node in unit]
        unit_ids = np.repeat(np.arange(n), [len(unit) for unit in units])

        def total(key: str, kind: str | None = None) -> np.ndarray:
            # each unit's sum over its layers in order (np.bincount adds one by one from 0.0)
            vals = [d[key].get(kind, math.inf) for d in flat] if kind is not None else [d[key] for d in flat]
            return np.bincount(unit_ids, weights=np.array(vals, dtype=float), minlength=n)

        for u, succ in graph.adjacency():
            iu = index[u]
            for v in succ:
                if iu > index[v]:
                    raise InvalidGraphError(f"edge {u!r} -> {v!r} goes backwards in the layer order")
        return cls(
            units=units,
            kinds=kinds,
            fwd={k: total("fwd", k) for k in kinds},
            bwd={k: total("bwd", k) for k in kinds},
            param=total("param_bytes"),
            act=total("act_bytes"),
        )

    @cached_property
    def unit_of(self) -> dict:
        """``dict[node, int]``: the unit index of each layer."""
        return {node: i for i, unit in enumerate(self.units) for node in unit}

    def layers(self, start: int, stop: int) -> tuple:
        """Layer names of units ``start .. stop-1``."""
        return tuple(node for unit in self.units[start:stop] for node in unit)

    def stages_from_cuts(self, cuts: list[int]) -> list[tuple]:
        """Layer tuples of the stages given the unit index where each stage after the first starts."""
        bounds = [0, *cuts, self.n]
        return [self.layers(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
