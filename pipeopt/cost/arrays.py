"""The layer graph's numbers as numpy arrays, read once per instance.

:func:`pipeopt.evaluate`, :class:`pipeopt.cost.CostTable` and
:func:`pipeopt.cost.rules.crossing_bytes` apply the cost model's rules to whole arrays of
layers and edges instead of walking the networkx graph: on a graph of 10^5 layers one walk
costs tenths of a second, and a solve scores its plan and tabulates its cut bytes at least
once each. This module only *reads* the graph (no rule lives here): a node's times per kind,
its bytes, and each edge's bytes (the ``bytes`` attribute, else the tail's ``out_bytes``:
:func:`pipeopt.graph.edge_bytes`).
"""

from __future__ import annotations

import functools
import gc
import math
from functools import cached_property

import numpy as np

from ..graph import is_array_chain, is_networkx_graph

CACHE_KEY = "_pipeopt_layer_arrays"
"""Where :func:`layer_arrays` keeps an instance's arrays (its ``__dict__``, as
``functools.cached_property`` keeps ``Instance.chain``)."""


def _without_gc(fn):
    """Run ``fn`` with the cyclic garbage collector paused: reading a large graph creates some
    10^5 short-lived tuples, and each collection they trigger walks every object of the graph
    (most of the time such a read takes). Reference counting still frees them at once; the
    collector's state is restored on the way out."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()

    return run


class LayerArrays:
    """Node and edge arrays of a layer graph, in the graph's node (adjacency) order.

    The edge arrays are read when the object is built; the node arrays on first use (a bare
    graph given to :func:`pipeopt.cost.rules.crossing_bytes` needs only ``out_bytes`` and the
    edges).

    Attributes
    ----------
    nodes
        ``list``: the layers, in ``graph.adjacency()`` order (= ``graph.nodes`` order).
    index
        ``dict[node, int]``: position of each layer in :attr:`nodes`.
    tail, head
        ``ndarray (E,)`` of int: node indices of each edge, in adjacency order (edges of one
        tail together, tails in node order, each tail's successors in insertion order).
    edge_bytes
        ``ndarray (E,)``: bytes each edge carries forward per microbatch.
    param, act
        ``ndarray (N,)``: ``param_bytes`` and ``act_bytes`` of each layer.
    fwd, bwd
        ``dict[kind, ndarray (N,)]``: seconds on one unit of the kind (``inf`` where the
        layer's dict has no entry for the kind).
    has_fwd, has_bwd
        ``dict[kind, ndarray (N,) of bool]``: whether the layer's dict names the kind.
    pinned
        ``ndarray (N,) of bool``: the ``pin_first`` flag.
    """

    @_without_gc
    def __init__(self, graph) -> None:
        self._graph = graph
        adjacency = list(graph.adjacency())
        self.nodes = nodes = [u for u, _ in adjacency]
        self.index = index = {u: i for i, u in enumerate(nodes)}
        succs = [succ for _, succ in adjacency]
        self.tail = np.repeat(np.arange(len(nodes), dtype=np.int64), [len(succ) for succ in succs])
        self.head = np.array([index[v] for succ in succs for v in succ], dtype=np.int64)
        given = [attrs.get("bytes") for succ in succs for attrs in succ.values()]
        missing = np.array([w is None for w in given], dtype=bool)
        self.edge_bytes = np.array([0.0 if w is None else float(w) for w in given], dtype=float)
        if missing.any():  # an edge without ``bytes`` carries its tail's out_bytes
            # the distinct tails, sorted (np.unique without its import of numpy.ma: start-up)
            tails = np.flatnonzero(np.bincount(self.tail[missing], minlength=len(nodes)))
            out = np.zeros(len(nodes))
            data = self._data
            out[tails] = [float(data[i]["out_bytes"]) for i in tails.tolist()]
            self.edge_bytes[missing] = out[self.tail[missing]]

    @cached_property
    @_without_gc
    def _data(self) -> list:
        attrs = dict(self._graph.nodes(data=True))
        return [attrs[u] for u in self.nodes]

    def _column(self, key: str) -> np.ndarray:
        return np.array([d[key] for d in self._data], dtype=float)

    @cached_property
    def param(self) -> np.ndarray:
        return self._column("param_bytes")

    @cached_property
    def act(self) -> np.ndarray:
        return self._column("act_bytes")

    @cached_property
    def pinned(self) -> np.ndarray:
        out = np.zeros(len(self.nodes), dtype=bool)
        out[[i for i, d in enumerate(self._data) if d.get("pin_first")]] = True
        return out

    @_without_gc
    def _times(self, key: str) -> tuple[dict, dict]:
        costs = [d[key] for d in self._data]
        vals, has = {}, {}
        for k in sorted(set().union(*costs)):
            vals[k] = v = np.array([c.get(k, math.inf) for c in costs], dtype=float)
            # inf is either a missing entry or an explicit one: ask the dicts only then
            has[k] = np.ones(v.size, dtype=bool) if np.isfinite(v).all() else np.array([k in c for c in costs], dtype=bool)
        return vals, has

    @cached_property
    def _fwd(self) -> tuple[dict, dict]:
        return self._times("fwd")

    @cached_property
    def _bwd(self) -> tuple[dict, dict]:
        return self._times("bwd")

    @property
    def fwd(self) -> dict:
        return self._fwd[0]

    @property
    def has_fwd(self) -> dict:
        return self._fwd[1]

    @property
    def bwd(self) -> dict:
        return self._bwd[0]

    @property
    def has_bwd(self) -> dict:
        return self._bwd[1]

    def positions(self, position) -> np.ndarray:
        """``ndarray (N,)`` of int: ``position`` (a ``dict[node, int]``, or already an array in
        :attr:`nodes` order) per layer. Raises ``KeyError`` for a layer the dict misses."""
        if isinstance(position, np.ndarray):
            return position.astype(np.int64, copy=False)
        return np.array([position[u] for u in self.nodes], dtype=np.int64).reshape(-1)

    def unit_positions(self, units) -> np.ndarray:
        """``ndarray (N,)`` of int: the index of the unit holding each layer, given ``units``
        (``list[tuple[node, ...]]``, :attr:`pipeopt.graph.Chain.units`, every layer once)."""
        pos = np.empty(len(self.nodes), dtype=np.int64)
        pos[[self.index[x] for unit in units for x in unit]] = np.repeat(
            np.arange(len(units), dtype=np.int64), [len(unit) for unit in units])
        return pos


def _of_chain(graph) -> LayerArrays:
    """:class:`LayerArrays` of a :class:`pipeopt.graph.ChainGraph`, taken from its arrays (the
    same values, in the same node and edge order, as reading its networkx dicts would give)."""
    arr = LayerArrays.__new__(LayerArrays)
    arr._graph = graph
    arr.nodes = list(graph.names)
    arr.index = graph.index
    arr.tail, arr.head, arr.edge_bytes = graph.edge_arrays()
    d = arr.__dict__  # the cached properties, filled
    d["param"], d["act"] = graph.param, graph.act
    d["pinned"] = np.zeros(graph.n, dtype=bool)
    d["_fwd"] = (dict(graph.fwd), {k: np.isfinite(v) for k, v in graph.fwd.items()})
    d["_bwd"] = (dict(graph.bwd), {k: np.isfinite(v) for k, v in graph.bwd.items()})
    return arr


def layer_arrays(source) -> LayerArrays:
    """:class:`LayerArrays` of a :class:`pipeopt.Instance` (read once and kept with the instance,
    whose graph must not change after it is built) or of a bare graph (read now). A
    :class:`pipeopt.graph.ChainGraph` is read from its arrays, not its networkx dicts."""
    if isinstance(source, LayerArrays):
        return source
    if is_array_chain(source):
        return _of_chain(source)
    if is_networkx_graph(source):  # a networkx graph (or a LazyDiGraph, which reads as one)
        return LayerArrays(source)
    cached = source.__dict__.get(CACHE_KEY)
    if cached is None:
        graph = source.graph
        cached = _of_chain(graph) if is_array_chain(graph) else LayerArrays(graph)
        source.__dict__[CACHE_KEY] = cached  # like functools.cached_property (frozen dataclass)
    return cached
