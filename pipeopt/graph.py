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

A reader may build a :class:`LazyDiGraph` instead (the PipeDream reader does): networkx's own
dicts, filled and read without importing networkx, switched in place to a ``networkx.DiGraph``
the first time anything asks it for more (a solve of a profile never does).

A long chain is best given as arrays (:meth:`pipeopt.Instance.from_chain`, a
:class:`ChainGraph`): the same graph, whose networkx dicts are built only if something reads
them (10^6 layers in under a second instead of most of a minute).

Graph attribute ``tensors`` (optional): ``list[[source layer, [reader layers...], bytes]]``,
the tensors of the ``max_load`` objective (Tarnawski et al.'s communication rule,
:func:`pipeopt.cost.rules.stage_transfers`) where they are not the edges' activations and
gradients: a workload whose forward and backward operators send tensors of their own
(:func:`pipeopt.io.read_dnn_partitioning`). Absent: derived from the edges
(:func:`pipeopt.cost.rules.tensors_of`).

Graph attribute ``tied`` (optional): ``list[{"name", "bytes", "state_bytes", "layers"}]``, the
tied parameters (one weight used by two or more layers, :func:`ties_of`), their bytes in no
layer's ``param_bytes`` (:mod:`pipeopt.cost.ties` charges them).
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import math
import numbers
import re
import sys
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .errors import InvalidGraphError
from .lazy import lazy_module
from .units import MAX_BYTES, MAX_SECONDS

nx = lazy_module("networkx")  # imported where a graph needs it: a profile read and solved needs none

NODE_NUMBERS = ("out_bytes", "param_bytes", "act_bytes")


def _natural_key(name: object) -> tuple:
    parts = re.split(r"(\d+)", str(name))
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts)


class LazyDiGraph:
    """A layer graph held in :class:`networkx.DiGraph`'s own storage (the same dicts), built
    and read without importing networkx; it becomes a ``networkx.DiGraph`` the first time
    anything asks for what it does not answer itself.

    Reading a profile and solving it (``pipeopt solve profile.txt``) reads the graph only
    through the calls below, so the process never imports networkx (about a tenth of a second
    of start-up). Any other attribute (``graph.subgraph``, ``graph.copy``, ``graph.in_edges``,
    a networkx algorithm's internals, ...) turns the object into a plain ``networkx.DiGraph``
    in place (:meth:`to_networkx`: its class is switched, the dicts are kept, nothing is
    copied), and from then on it is one: same nodes, attributes, edges and orders as if it
    had been built with ``networkx.DiGraph()`` and the same ``add_node``/``add_edge`` calls.
    Code that must see a networkx graph calls :meth:`to_networkx`, or :func:`as_networkx`.

    Answered without networkx: ``add_node``, ``add_edge``, ``graph`` (the graph attribute
    dict), ``len``, iteration, ``in``, ``number_of_nodes``, ``number_of_edges``,
    ``is_directed``, ``is_multigraph``, ``adjacency()``, ``successors(u)``,
    ``predecessors(v)``, ``in_degree(v)``, ``out_degree(u)`` (one node), ``has_node``,
    ``has_edge``, ``nodes`` (iteration, ``len``, ``in``, ``nodes[u]``, ``nodes(data=...)``)
    and ``edges`` (iteration, ``len``, ``in``, ``edges[u, v]``, ``edges(data=...)``), each
    with networkx's meaning and order.
    """

    def __init__(self, **attr) -> None:
        d = self.__dict__  # networkx's storage attributes, as networkx.DiGraph.__init__ sets them
        d["graph"] = dict(attr)
        d["_node"] = {}
        d["_adj"] = d["_succ"] = {}
        d["_pred"] = {}
        d["__networkx_cache__"] = {}

    # ---- building (networkx's add_node / add_edge) -----------------------------------------------
    def add_node(self, node, **attr) -> None:
        """Add ``node`` (or update its attributes), as ``networkx.DiGraph.add_node``."""
        if node not in self._succ:
            if node is None:
                raise ValueError("None cannot be a node")
            self._succ[node] = {}
            self._pred[node] = {}
            self._node[node] = attr
        else:
            self._node[node].update(attr)

    def add_edge(self, u, v, **attr) -> None:
        """Add the edge ``u -> v`` (and its nodes), as ``networkx.DiGraph.add_edge``."""
        for x in (u, v):
            if x not in self._succ:
                if x is None:
                    raise ValueError("None cannot be a node")
                self._succ[x] = {}
                self._pred[x] = {}
                self._node[x] = {}
        data = self._succ[u].get(v, {})
        data.update(attr)
        self._succ[u][v] = data
        self._pred[v][u] = data

    # ---- what it answers itself ----------------------------------------------------------------
    def __iter__(self):
        return iter(self._node)

    def __len__(self) -> int:
        return len(self._node)

    def __contains__(self, node) -> bool:
        try:
            return node in self._node
        except TypeError:
            return False

    def number_of_nodes(self) -> int:
        return len(self._node)

    def number_of_edges(self, u=None, v=None) -> int:
        if u is not None or v is not None:
            return self.to_networkx().number_of_edges(u, v)
        return sum(len(nbrs) for nbrs in self._succ.values())

    def is_directed(self) -> bool:
        return True

    def is_multigraph(self) -> bool:
        return False

    def adjacency(self):
        """``(node, {successor: edge attributes})`` in node order."""
        return iter(self._succ.items())

    def successors(self, node):
        if node not in self._succ:
            return self.to_networkx().successors(node)  # networkx's error
        return iter(self._succ[node])

    def predecessors(self, node):
        if node not in self._pred:
            return self.to_networkx().predecessors(node)
        return iter(self._pred[node])

    def has_node(self, node) -> bool:
        return node in self

    def has_edge(self, u, v) -> bool:
        try:
            return v in self._succ[u]
        except (KeyError, TypeError):
            return False

    def in_degree(self, node=None):
        if node is None or node not in self._pred:
            return self.to_networkx().in_degree(node)
        return len(self._pred[node])

    def out_degree(self, node=None):
        if node is None or node not in self._succ:
            return self.to_networkx().out_degree(node)
        return len(self._succ[node])

    @property
    def nodes(self) -> _Nodes:
        return _Nodes(self)

    @property
    def edges(self) -> _Edges:
        return _Edges(self)

    def is_acyclic(self) -> bool:
        """True if the graph has no directed cycle (Kahn's algorithm)."""
        indegree = {u: len(p) for u, p in self._pred.items()}
        ready = [u for u, d in indegree.items() if d == 0]
        seen = 0
        while ready:
            u = ready.pop()
            seen += 1
            for v in self._succ[u]:
                indegree[v] -= 1
                if indegree[v] == 0:
                    ready.append(v)
        return seen == len(indegree)

    # ---- everything else: a networkx.DiGraph -----------------------------------------------------
    def to_networkx(self):
        """This graph as a ``networkx.DiGraph``: the object itself, its class switched (networkx
        imported now); its dicts, and so every node, attribute, edge and order, are kept."""
        self.__class__ = nx.DiGraph
        return self

    def __getattr__(self, name: str):
        if "_node" not in self.__dict__ or (name.startswith("__") and name.endswith("__")):
            # not built yet (a copy or an unpickling under way), or a protocol's optional hook
            # (__getstate__, __getnewargs_ex__, ...), which a DiGraph does not define either
            raise AttributeError(name)
        return getattr(self.to_networkx(), name)

    def __getitem__(self, node):
        return self.to_networkx()[node]


class _Nodes:
    """``graph.nodes`` of a :class:`LazyDiGraph`: networkx's ``NodeView`` for the calls the
    solve path makes (iteration, ``len``, ``in``, ``nodes[u]``, ``nodes(data=...)``)."""

    __slots__ = ("_node",)

    def __init__(self, graph: LazyDiGraph) -> None:
        self._node = graph._node

    def __iter__(self):
        return iter(self._node)

    def __len__(self) -> int:
        return len(self._node)

    def __contains__(self, node) -> bool:
        try:
            return node in self._node
        except TypeError:
            return False

    def __getitem__(self, node) -> dict:
        return self._node[node]

    def __call__(self, data=False, default=None):
        if data is False:
            return self
        if data is True:
            return iter(self._node.items())
        return ((u, d.get(data, default)) for u, d in self._node.items())


class _Edges:
    """``graph.edges`` of a :class:`LazyDiGraph`: networkx's ``OutEdgeView`` for the calls the
    solve path makes (iteration over ``(u, v)``, ``len``, ``in``, ``edges[u, v]``,
    ``edges(data=...)``), in networkx's order (tails in node order, each tail's heads in the
    order they were added)."""

    __slots__ = ("_graph", "_succ")

    def __init__(self, graph: LazyDiGraph) -> None:
        self._graph = graph
        self._succ = graph._succ

    def __iter__(self):
        return ((u, v) for u, nbrs in self._succ.items() for v in nbrs)

    def __len__(self) -> int:
        return sum(len(nbrs) for nbrs in self._succ.values())

    def __contains__(self, edge) -> bool:
        try:
            u, v = edge
            return v in self._succ[u]
        except (KeyError, TypeError, ValueError):
            return False

    def __getitem__(self, edge) -> dict:
        u, v = edge
        return self._succ[u][v]

    def __call__(self, nbunch=None, data=False, default=None):
        if nbunch is not None:
            return as_networkx(self._graph).edges(nbunch, data=data, default=default)
        if data is False:
            return self
        if data is True:
            return ((u, v, d) for u, nbrs in self._succ.items() for v, d in nbrs.items())
        return ((u, v, d.get(data, default)) for u, nbrs in self._succ.items() for v, d in nbrs.items())


def as_networkx(graph):
    """``graph`` as a ``networkx.DiGraph``: a :class:`LazyDiGraph` switched in place
    (:meth:`LazyDiGraph.to_networkx`), any other graph unchanged."""
    return graph.to_networkx() if isinstance(graph, LazyDiGraph) else graph


def is_networkx_graph(graph) -> bool:
    """True if ``graph`` is a networkx graph (a :class:`LazyDiGraph` counts as one), checked
    without importing networkx when nothing has imported it yet."""
    if isinstance(graph, LazyDiGraph):
        return True
    module = sys.modules.get("networkx")
    return module is not None and isinstance(graph, module.Graph)


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
    lazy = isinstance(graph, LazyDiGraph)
    if not lazy and (not isinstance(graph, nx.DiGraph) or graph.is_multigraph()):
        raise InvalidGraphError(f"layer graph must be a networkx.DiGraph, got {type(graph).__name__}")
    if is_array_chain(graph) and not graph.materialized:
        return  # its arrays were checked by the same rules when it was built
    if graph.number_of_nodes() == 0:
        raise InvalidGraphError("layer graph has no layers")
    if not (graph.is_acyclic() if lazy else nx.is_directed_acyclic_graph(graph)):
        cycle = nx.find_cycle(as_networkx(graph))
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
    ties_of(graph)


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
    t = type(x)
    if t is float or t is int:  # the common case, without the ABC's isinstance (10^5 layers: seconds)
        return True
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
    if is_array_chain(graph):
        return graph.kinds()
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
    milliseconds instead of seconds. A :class:`ChainGraph`'s order is its layers' (the only
    topological order: an edge joins each layer to the next).
    """
    if is_array_chain(graph):
        return list(graph.names)
    with _gc_paused():
        pinned = sorted((n for n, p in graph.nodes(data="pin_first") if p), key=_natural_key)
        if pinned:  # networkx's node order of the subgraph of the other layers (its tie-break)
            rest = [n for n in graph.nodes if not graph.nodes[n].get("pin_first")]
            if isinstance(graph, LazyDiGraph) and 2 * len(rest) >= len(graph):
                nodes = rest  # the subgraph view's order when it keeps at least half the nodes: the graph's
            else:
                nodes = list(as_networkx(graph).subgraph(rest))
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
        """Build the chain of a validated layer graph over ``order`` (default :func:`layer_order`;
        a :class:`ChainGraph` in its layer order is read from its arrays)."""
        if is_array_chain(graph) and order is None:
            return graph.chain()
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

    @cached_property
    def _flat(self) -> tuple[list, np.ndarray]:
        """Every layer in unit order, and where each unit starts in that list (``(n+1,)``)."""
        flat = [node for unit in self.units for node in unit]
        starts = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum([len(unit) for unit in self.units], out=starts[1:])
        return flat, starts

    def layers(self, start: int, stop: int) -> tuple:
        """Layer names of units ``start .. stop-1``."""
        flat, starts = self._flat
        return tuple(flat[int(starts[start]):int(starts[stop])])

    def stages_from_cuts(self, cuts: list[int]) -> list[tuple]:
        """Layer tuples of the stages given the unit index where each stage after the first starts."""
        bounds = [0, *cuts, self.n]
        return [self.layers(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


# ---- a chain given as arrays -----------------------------------------------------------------
def is_array_chain(graph) -> bool:
    """True if ``graph`` is a :class:`ChainGraph` built from arrays (its numbers are read from them)."""
    cls = globals().get("ChainGraph")  # not defined yet: no graph is one
    return cls is not None and isinstance(graph, cls) and graph.from_arrays


def _define_chain_graph() -> type:
    """Define :class:`ChainGraph` (a subclass of ``networkx.DiGraph``: networkx is imported
    here, the first time the class is asked for, not with this module)."""
    import networkx as nx

    class _Stored:
        """Data descriptor of one of networkx's storage attributes (``_node``, ``_adj``, ``_succ``,
        ``_pred``) on a :class:`ChainGraph`: read, it builds the graph's dicts first if they are not
        built yet (:meth:`ChainGraph.materialize`); set, it does what networkx's own descriptor does."""

        def __init__(self, base) -> None:
            self.base = base

        def __set_name__(self, owner, name: str) -> None:
            self.name = name

        def __get__(self, obj, owner=None):
            if obj is None:
                return self
            d = obj.__dict__
            if self.name not in d:
                obj.materialize()
            return d[self.name]

        def __set__(self, obj, value) -> None:
            if self.base is not None and hasattr(self.base, "__set__"):
                self.base.__set__(obj, value)
            else:
                obj.__dict__[self.name] = value


    def _column(value, n: int | None, what: str) -> np.ndarray:
        """``value`` as a 1-D float array (of length ``n`` if given), or :class:`InvalidGraphError`."""
        try:
            arr = np.asarray(value, dtype=float)
        except (TypeError, ValueError):
            raise InvalidGraphError(f"chain: {what} must be an array of numbers, got {type(value).__name__}") from None
        if arr.ndim != 1 or (n is not None and arr.size != n):
            raise InvalidGraphError(f"chain: {what} must be a 1-D array of {n if n is not None else 'n'} numbers, "
                                    f"got shape {arr.shape}")
        return arr


    class ChainGraph(nx.DiGraph):
        """A layer graph given as arrays: layers 0 .. n-1 in pipeline order, an edge from each layer
        to the next, and optional forward skip edges -- built in O(n) numpy work, without a
        networkx dict per layer.

        Everything that reads only numbers (the layer order, :class:`Chain`,
        :class:`pipeopt.cost.arrays.LayerArrays`, hence :class:`pipeopt.cost.CostTable`,
        :func:`pipeopt.evaluate` and the partition methods) reads the arrays directly; the
        networkx dicts (``graph.nodes[...]``, ``graph.edges``, ...) are built the first time
        anything reads them (:meth:`materialize`), so the object is a valid
        :class:`networkx.DiGraph` everywhere, with the attributes of the module docstring. The
        numbers are the layers' own (no unit is glued: no layer is ``pin_first``). Build it with
        :meth:`pipeopt.Instance.from_chain`; do not mutate it.

        Parameters
        ----------
        fwd, bwd
            ``dict[kind, array (n,)]``: seconds of each layer's forward / backward pass on one unit
            of the kind (``inf``: the layer cannot run on it; the two must be finite on the same
            kinds).
        out_bytes, act_bytes, param_bytes
            ``array (n,)`` each: bytes a layer sends to each successor, keeps for its backward pass
            per microbatch, and holds as parameters.
        skips
            ``array (E, 2)`` of layer indices ``(tail, head)`` with ``tail + 1 < head`` (a skip
            edge goes forward past the next layer), or ``None``.
        skip_bytes
            ``array (E,)``: bytes each skip edge carries (default: its tail's ``out_bytes``).
        names
            ``list`` of n distinct layer names (strings or integers); default the integers
            ``0 .. n-1``.

        Raises
        ------
        InvalidGraphError
            As :func:`validate_graph` for the same graph: no layers, a negative, NaN or too large
            time or size, a layer without a finite time, forward and backward kinds that differ,
            and for the arrays themselves: wrong shapes, a skip edge that does not go forward past
            the next layer or repeats another, names that repeat.
        """

        _node = _Stored(nx.Graph.__dict__.get("_node"))
        _adj = _Stored(nx.DiGraph.__dict__.get("_adj"))
        _succ = _Stored(nx.DiGraph.__dict__.get("_adj"))
        _pred = _Stored(nx.DiGraph.__dict__.get("_pred"))

        from_arrays = False
        """True for a graph built from arrays; ``ChainGraph()`` without arguments (what networkx's
        ``copy``, ``subgraph`` and ``reverse`` build from ``G.__class__()``) is an ordinary empty
        DiGraph, to which none of the array paths apply (:func:`is_array_chain`)."""

        def __init__(self, fwd: dict | None = None, bwd: dict | None = None, out_bytes=None, act_bytes=None,
                     param_bytes=None, *, skips=None, skip_bytes=None, names=None, **attr) -> None:
            if fwd is None and bwd is None and out_bytes is None:
                nx.DiGraph.__init__(self, **attr)
                return
            self.from_arrays = True
            # networkx's __init__ would set empty storage dicts: set what it sets besides them
            self.__dict__["graph"] = dict(attr)
            self.__networkx_cache__ = {}
            for what, times in (("fwd", fwd), ("bwd", bwd)):
                if not isinstance(times, dict) or not times:
                    raise InvalidGraphError(f"chain: {what} must be a dict kind -> array of seconds, got {type(times).__name__}")
            first = next(iter(fwd.values()))
            n = int(np.size(first))
            if n == 0:
                raise InvalidGraphError("layer graph has no layers")
            self.n = n
            self.fwd = {str(k): _column(v, n, f"fwd[{k!r}]") for k, v in sorted(fwd.items())}
            self.bwd = {str(k): _column(v, n, f"bwd[{k!r}]") for k, v in sorted(bwd.items())}
            self.out = _column(out_bytes, n, "out_bytes")
            self.act = _column(act_bytes, n, "act_bytes")
            self.param = _column(param_bytes, n, "param_bytes")
            if skips is None:
                self.skip_tail = self.skip_head = np.zeros(0, dtype=np.int64)
            else:
                s = np.asarray(skips)
                if s.size == 0:
                    s = s.reshape(0, 2)
                if s.ndim != 2 or s.shape[1] != 2 or not np.issubdtype(s.dtype, np.integer):
                    raise InvalidGraphError(f"chain: skips must be an (E, 2) array of layer indices, got shape {s.shape}")
                self.skip_tail, self.skip_head = s[:, 0].astype(np.int64), s[:, 1].astype(np.int64)
            E = self.skip_tail.size
            self.skip_bytes = None if skip_bytes is None else _column(skip_bytes, E, "skip_bytes")
            if names is None:
                self.names = range(n)
            else:
                self.names = list(names)
                if len(self.names) != n:
                    raise InvalidGraphError(f"chain: {len(self.names)} names for {n} layers")
                if len(set(self.names)) != n:
                    raise InvalidGraphError("chain: layer names repeat")
            self._check()

        # ---- validation (validate_graph's rules, on arrays) ---------------------------------------
        def _name(self, i) -> object:
            return self.names[int(i)]

        def _check(self) -> None:
            for what, times in (("fwd", self.fwd), ("bwd", self.bwd)):
                for kind, t in times.items():
                    bad = np.flatnonzero(np.isnan(t) | (t < 0))
                    if bad.size:
                        raise InvalidGraphError(f"layer {self._name(bad[0])!r} has a negative or invalid {what} time "
                                                f"{t[bad[0]]!r} on {kind!r}")
                    big = np.flatnonzero(np.isfinite(t) & (t > MAX_SECONDS))
                    if big.size:
                        raise InvalidGraphError(
                            f"layer {self._name(big[0])!r} has a {what} time of {t[big[0]]!r} s on {kind!r}, above the "
                            f"maximum {MAX_SECONDS:g} s (times are seconds; inf = cannot run on the kind)")
            kinds = sorted(set(self.fwd) | set(self.bwd))
            inf = np.full(self.n, np.inf)
            fin_f = np.array([np.isfinite(self.fwd.get(k, inf)) for k in kinds])
            fin_b = np.array([np.isfinite(self.bwd.get(k, inf)) for k in kinds])
            none = np.flatnonzero(~fin_f.any(axis=0))
            if none.size:
                raise InvalidGraphError(f"layer {self._name(none[0])!r} cannot run on any resource kind (no finite forward time)")
            differ = np.flatnonzero((fin_f != fin_b).any(axis=0))
            if differ.size:
                i = differ[0]
                raise InvalidGraphError(
                    f"layer {self._name(i)!r} has forward times on {[k for k, f in zip(kinds, fin_f[:, i]) if f]} but "
                    f"backward times on {[k for k, f in zip(kinds, fin_b[:, i]) if f]}")
            for key, v in (("out_bytes", self.out), ("param_bytes", self.param), ("act_bytes", self.act)):
                bad = np.flatnonzero(~np.isfinite(v) | (v < 0))
                if bad.size:
                    raise InvalidGraphError(f"layer {self._name(bad[0])!r} has a negative or invalid {key} {v[bad[0]]!r}")
                big = np.flatnonzero(v > MAX_BYTES)
                if big.size:
                    raise InvalidGraphError(f"layer {self._name(big[0])!r} has {key} {v[big[0]]!r}, above the maximum "
                                            f"{MAX_BYTES:g} bytes (are the sizes in bytes?)")
            total = float(self.param.sum() + self.act.sum())
            if total > MAX_BYTES:
                raise InvalidGraphError(f"the layers' param_bytes and act_bytes add up to {total:.4g} bytes, above the "
                                        f"maximum {MAX_BYTES:g} (are the sizes in bytes?)")
            t, h = self.skip_tail, self.skip_head
            if t.size:
                bad = np.flatnonzero((t < 0) | (h >= self.n) | (h <= t + 1))
                if bad.size:
                    raise InvalidGraphError(f"chain: skip edge {int(t[bad[0]])} -> {int(h[bad[0]])} must go forward past "
                                            f"the next layer (0 <= tail, tail + 1 < head < n = {self.n})")
                key = t * self.n + h
                if np.unique(key).size != key.size:
                    raise InvalidGraphError("chain: a skip edge repeats")
            if self.skip_bytes is not None:
                bad = np.flatnonzero(~np.isfinite(self.skip_bytes) | (self.skip_bytes < 0) | (self.skip_bytes > MAX_BYTES))
                if bad.size:
                    raise InvalidGraphError(f"edge {self._name(t[bad[0]])!r} -> {self._name(h[bad[0]])!r} has a negative, "
                                            f"invalid or too large 'bytes' {self.skip_bytes[bad[0]]!r}")

        # ---- what networkx answers without the dicts ---------------------------------------------
        @property
        def materialized(self) -> bool:
            """True once the networkx dicts are built."""
            return "_node" in self.__dict__

        def number_of_nodes(self) -> int:
            return self.n if self.from_arrays else super().number_of_nodes()

        def __len__(self) -> int:
            return self.n if self.from_arrays else super().__len__()

        def __iter__(self):
            return iter(self.names) if self.from_arrays else super().__iter__()

        @property
        def index(self) -> dict:
            """``dict[name, int]``: each layer's index (built once)."""
            d = self.__dict__
            if "_index" not in d:
                d["_index"] = {x: i for i, x in enumerate(self.names)}
            return d["_index"]

        def __contains__(self, node) -> bool:
            if not self.from_arrays:
                return super().__contains__(node)
            try:
                return node in self.index
            except TypeError:
                return False

        def kinds(self) -> tuple:
            """Sorted resource kinds named by the ``fwd`` arrays (:func:`kinds_of`)."""
            return tuple(self.fwd)

        def runs_on(self, kinds) -> int | None:
            """Index of the first layer with no finite forward time on any of ``kinds`` (``None``
            if every layer runs on one of them)."""
            ok = np.zeros(self.n, dtype=bool)
            for k in kinds:
                if k in self.fwd:
                    ok |= np.isfinite(self.fwd[k])
            bad = np.flatnonzero(~ok)
            return int(bad[0]) if bad.size else None

        def edge_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            """``(tail, head, bytes)`` of every edge in networkx's adjacency order (tails in layer
            order; per tail the edge to the next layer first, then its skip edges as given)."""
            n = self.n
            chain = np.arange(n - 1, dtype=np.int64)
            tail = np.concatenate([chain, self.skip_tail])
            head = np.concatenate([chain + 1, self.skip_head])
            sb = self.out[self.skip_tail] if self.skip_bytes is None else self.skip_bytes
            nbytes = np.concatenate([self.out[:-1], sb])
            order = np.argsort(tail, kind="stable")
            return tail[order], head[order], nbytes[order]

        def chain(self) -> Chain:
            """The :class:`Chain` of the layers (one unit per layer, in index order)."""
            flat = list(self.names)
            out = Chain(units=[(x,) for x in flat], kinds=self.kinds(),
                        fwd={k: v.copy() for k, v in self.fwd.items()}, bwd={k: v.copy() for k, v in self.bwd.items()},
                        param=self.param.copy(), act=self.act.copy())
            out.__dict__["_flat"] = (flat, np.arange(self.n + 1, dtype=np.int64))  # Chain._flat, known here
            return out

        def materialize(self) -> None:
            """Build networkx's dicts from the arrays (nodes with their attribute dicts, the edges;
            a kind with an infinite time is left out of a layer's ``fwd``/``bwd`` dict)."""
            if self.materialized:
                return
            with _gc_paused():
                g = nx.DiGraph()
                names = list(self.names)
                kinds = list(self.fwd)
                fw = [self.fwd[k].tolist() for k in kinds]
                bw = [self.bwd[k].tolist() for k in kinds]
                out, act, par = self.out.tolist(), self.act.tolist(), self.param.tolist()
                g.add_nodes_from(
                    (names[i], {"fwd": {k: f[i] for k, f in zip(kinds, fw) if math.isfinite(f[i])},
                                "bwd": {k: b[i] for k, b in zip(kinds, bw) if math.isfinite(b[i])},
                                "out_bytes": out[i], "act_bytes": act[i], "param_bytes": par[i]})
                    for i in range(self.n))
                g.add_edges_from(zip(names[:-1], names[1:]))
                if self.skip_tail.size:
                    tails, heads = self.skip_tail.tolist(), self.skip_head.tolist()
                    if self.skip_bytes is None:
                        g.add_edges_from((names[a], names[b]) for a, b in zip(tails, heads))
                    else:
                        g.add_edges_from((names[a], names[b], {"bytes": w})
                                         for a, b, w in zip(tails, heads, self.skip_bytes.tolist()))
            d = self.__dict__
            d["_node"], d["_pred"] = g._node, g._pred
            d["_adj"] = d["_succ"] = g._adj

    ChainGraph.__qualname__ = "ChainGraph"  # pickled by reference as pipeopt.graph.ChainGraph
    return ChainGraph


def __getattr__(name: str):
    """``ChainGraph``: the class, defined (networkx imported) on first read."""
    if name == "ChainGraph":
        cls = globals()["ChainGraph"] = _define_chain_graph()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- tied parameters -------------------------------------------------------------------------
@dataclass(frozen=True)
class Tie:
    """One tied parameter.

    Attributes
    ----------
    name
        The parameter's FQN (its first name).
    bytes
        Bytes of the weight (what synchronising its gradient moves).
    state_bytes
        Bytes of the weight, its gradient and its optimizer state (what a stage holding it keeps).
    layers
        ``tuple``: the layers that use it (at least two).
    sum_s
        ``tuple`` of ``(kind, seconds)``: one out-of-place sum of two of its gradient
        contributions on one unit of each resource kind (graph attribute key ``sum_s``, a dict;
        measured by :func:`pipeopt.torch.from_torch`; empty = 0 s, as in every paper profile):
        what a stage holding k of its layers adds to each microbatch's backward, k - 1 times
        (:func:`pipeopt.cost.rules.tie_sum_time`).
    """

    name: str
    bytes: float
    state_bytes: float
    layers: tuple
    sum_s: tuple = ()

    def sum_on(self, kind: str) -> float:
        """Seconds of one sum on ``kind`` (0.0 where not measured)."""
        return dict(self.sum_s).get(kind, 0.0)


def _tie_number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidGraphError(f"{what} must be a finite number >= 0, got {value!r}")
    return float(value)


def ties_of(graph) -> tuple[Tie, ...]:
    """The graph's tied parameters (graph attribute ``tied``; none if absent), checked
    (:mod:`pipeopt.cost.ties` says how the cost model charges them).

    Parameters
    ----------
    graph
        A layer graph (``networkx.DiGraph``), or anything with a ``graph`` dict attribute.

    Returns
    -------
    tuple[Tie, ...]

    Raises
    ------
    InvalidGraphError
        If ``tied`` is not a list of ``{"name", "bytes", "state_bytes", "layers"}`` (and
        optionally ``"sum_s"``, kind -> seconds) with bytes and seconds >= 0 and at least two
        distinct layers of the graph.
    """
    raw = getattr(graph, "graph", {}).get("tied")
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)):
        raise InvalidGraphError(f"graph attribute 'tied' must be a list of tied parameters, got {type(raw).__name__}")
    out = []
    for i, t in enumerate(raw):
        where = f"tied[{i}]"
        if not isinstance(t, dict):
            raise InvalidGraphError(f"{where} must be a dict, got {type(t).__name__}")
        missing = [k for k in ("name", "bytes", "state_bytes", "layers") if k not in t]
        if missing:
            raise InvalidGraphError(f"{where} lacks {missing} (a tie is name, bytes, state_bytes, layers)")
        layers = t["layers"]
        if not isinstance(layers, (list, tuple)) or len(set(layers)) < 2:
            raise InvalidGraphError(f"{where} ({t['name']!r}): 'layers' must list at least two distinct layers")
        unknown = [x for x in layers if x not in graph]
        if unknown:
            raise InvalidGraphError(f"{where} ({t['name']!r}) names unknown layer(s) {unknown[:3]!r}")
        sums = t.get("sum_s", {})
        if not isinstance(sums, dict):
            raise InvalidGraphError(f"{where}.sum_s must be a dict of resource kind -> seconds, got {sums!r}")
        out.append(Tie(str(t["name"]), _tie_number(t["bytes"], f"{where}.bytes"),
                       _tie_number(t["state_bytes"], f"{where}.state_bytes"), tuple(dict.fromkeys(layers)),
                       tuple((str(k), _tie_number(v, f"{where}.sum_s[{k!r}]")) for k, v in sorted(sums.items()))))
    return tuple(out)
