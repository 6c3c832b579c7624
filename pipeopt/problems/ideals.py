"""The ideal lattice of a layer DAG: the space of convex, ordered splits.

A split of a layer DAG into pipeline stages is **convex** when no path leaves a stage and comes
back into it; convex stages can be ordered so that every edge goes forward or stays inside (the
pipeline order). Then the union of the first t stages is an **ideal** (a down-closed set: with a
layer, all its predecessors), and stage t is the difference of two nested ideals. So every
convex ordered split of S stages is a chain of ideals ``{} = I_0 < I_1 < ... < I_S = all``, and
every such chain is one: the DP over ideals of Tarnawski et al. (NeurIPS 2020, their
``throughput-dp/dp.cpp``) searches exactly this space.

* :class:`UnitDag` -- the layers grouped into *units* (the nodes of the lattice): pinned input
  layers form one unit that every non-empty ideal contains (so they sit in the first stage);
  optionally, layers that cost nothing and touch one other unit only are merged into it (a
  dominance: :meth:`UnitDag.build`).
* :class:`Lattice` -- every ideal of a unit DAG (by breadth-first growth, in non-decreasing
  size, so every sub-ideal of an ideal comes before it), with the one-unit transitions
  ``I -> I + {v}``; or the chain of prefixes of one layer order (:meth:`Lattice.chain`: the
  one-order space, the same DPs restricted to it).
* :func:`walk_supersets` -- for one ideal ``A``, every ideal ``J`` containing it whose
  difference ``J - A`` passes a monotone test (compute within a bound, memory within a
  capacity), depth first with one stamp per ideal, the transfers of ``J - A`` updated as units
  join (compiled with numba). The exact DPs (:mod:`pipeopt.problems.partition.convex`,
  :mod:`pipeopt.problems.placement.dp`) call it once per ideal.

Where the ideal count explodes: an antichain of w independent branches of lengths l_1..l_w has
``prod (l_i + 1)`` ideals. The layer graphs of real models have from a few dozen (BERT, ResNet
layer graphs) to 221,566 (Inception-v3's PipeDream profile) ideals; :class:`Lattice` stops at
``limit`` ideals (default :data:`IDEAL_LIMIT`) with :class:`LatticeTooLarge`, and the methods
then say so and name the alternative (the placement MILP needs no enumeration; the partition
problem's one-order methods solve the smaller space).

References
----------
Tarnawski, Phanishayee, Devanur, Mahajan, Nina Paravecino, Efficient Algorithms for Device
Placement of DNN Graph Operators, NeurIPS 2020 (the DP over ideals, section 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..jit import njit
from ..errors import InvalidProblemError
from ..graph import layer_order

IDEAL_LIMIT = 400_000
"""Most ideals a :class:`Lattice` enumerates before it gives up (:class:`LatticeTooLarge`);
400,000 ideals of 500 units take about 200 MB."""


class LatticeTooLarge(InvalidProblemError):
    """The DAG has more ideals than the limit: the DP over ideals is not run (the convex MILP
    and CP-SAT models are the methods for such a graph)."""


@dataclass(frozen=True)
class UnitDag:
    """Layers grouped into units, and the precedence between units.

    Attributes
    ----------
    units
        ``tuple[tuple[layer, ...], ...]``: the layers of each unit, units in a topological
        order, layers of a unit in the graph's layer order.
    preds
        ``tuple[tuple[int, ...], ...]``: the units each unit needs in an earlier or the same stage.
    merged
        The layers merged into a neighbour by the dominance of :meth:`build` (a frozenset).
    """

    units: tuple
    preds: tuple
    merged: frozenset = frozenset()

    @property
    def n(self) -> int:
        """Number of units."""
        return len(self.units)

    @cached_property
    def unit_of(self) -> dict:
        """``dict[layer, int]``."""
        return {x: i for i, u in enumerate(self.units) for x in u}

    @classmethod
    def build(cls, graph, *, free=None, groups=None) -> UnitDag:
        """The unit DAG of a validated layer graph.

        Parameters
        ----------
        graph
            The layer graph (``pin_first`` layers and their ancestors are glued into one unit
            that precedes every other source, so that they sit in the first stage).
        free
            Optional predicate ``free(layer) -> bool``: a layer that costs nothing wherever it
            runs (no time, no transfer with a third unit). Such a layer whose only neighbour
            (predecessor or successor, one edge in all) is one unit is merged into that unit,
            repeatedly. Where a stage may be left out (at most S stages) this is a dominance
            for everything but memory: moving the layer next to its neighbour removes the one
            transfer it takes part in and changes no time; a layer with bytes adds them to its
            neighbour's device, which the caller must check (Tarnawski et al.'s ``dp.cpp``
            merges the same layers, ``performTrivialNodeOptimizations``). ``None``: no merge.
        groups
            Optional ``Iterable[Iterable[layer]]``: layers that must share a stage (they are
            glued into one unit first).

        Raises
        ------
        InvalidProblemError
            If glued layers form a cycle with the rest of the graph (no convex split keeps them
            together).
        """
        import networkx as nx

        order = layer_order(graph)
        rank = {x: i for i, x in enumerate(order)}
        parent = {x: x for x in order}
        size = dict.fromkeys(order, 1)

        def find(x):
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        def union(a, b):
            ra, rb = find(a), find(b)
            if ra != rb:
                if rank[rb] < rank[ra]:
                    ra, rb = rb, ra
                parent[rb] = ra
                size[ra] += size[rb]

        pinned = [x for x in order if graph.nodes[x].get("pin_first")]
        if pinned:  # the pinned layers sit in stage 0, and so do their ancestors
            first = set(pinned)
            for x in pinned:
                first |= nx.ancestors(graph, x)
            pinned = [x for x in order if x in first]
        for x in pinned[1:]:
            union(pinned[0], x)
        for grp in groups or ():
            grp = list(grp)
            for x in grp[1:]:
                union(grp[0], x)
        merged: set = set()
        if free is not None:
            changed = True
            while changed:
                changed = False
                for x in order:
                    if find(x) != x or not free(x):
                        continue
                    if size[x] != 1 or graph.nodes[x].get("pin_first"):
                        continue
                    nbrs = {find(y) for y in graph.predecessors(x)} | {find(y) for y in graph.successors(x)}
                    nbrs.discard(x)
                    if graph.in_degree(x) + graph.out_degree(x) == 1 and len(nbrs) == 1:
                        union(nbrs.pop(), x)
                        merged.add(x)
                        changed = True
        roots = sorted({find(x) for x in order}, key=rank.__getitem__)
        q = nx.DiGraph()
        q.add_nodes_from(roots)
        for u, v in graph.edges:
            ru, rv = find(u), find(v)
            if ru != rv:
                q.add_edge(ru, rv)
        if pinned:
            p = find(pinned[0])
            for r in roots:
                if r != p and q.in_degree(r) == 0:
                    q.add_edge(p, r)
        if not nx.is_directed_acyclic_graph(q):
            cyc = nx.find_cycle(q)
            raise InvalidProblemError(
                f"layers that must share a stage form a cycle with other layers ({cyc[0][0]!r} -> ... ->"
                f" {cyc[-1][1]!r}): no convex split keeps them together"
            )
        topo = list(nx.lexicographical_topological_sort(q, key=rank.__getitem__))
        idx = {r: i for i, r in enumerate(topo)}
        members: dict = {r: [] for r in topo}
        for x in order:
            members[find(x)].append(x)
        units = tuple(tuple(members[r]) for r in topo)
        preds = tuple(tuple(sorted(idx[p] for p in q.predecessors(r))) for r in topo)
        return cls(units, preds, frozenset(merged))

    def sums(self, values) -> np.ndarray:
        """``ndarray (n,)``: a per-layer mapping ``values[layer]`` summed over each unit."""
        return np.array([sum(values[x] for x in u) for u in self.units], dtype=float)


@dataclass(frozen=True)
class Lattice:
    """Ideals of a unit DAG (or the prefixes of a chain), ids in non-decreasing size.

    Attributes
    ----------
    member
        ``ndarray (N, n)`` of bool: the units of each ideal; ideal 0 is empty, the last is full.
    ptr, unit, to
        The transitions in CSR form: ideal ``a`` grows by unit ``unit[e]`` into ideal ``to[e]``
        for ``e`` in ``ptr[a] .. ptr[a+1]-1`` (every ideal one unit larger, once).
    space
        ``"convex"`` (every ideal) or ``"one-order"`` (the prefixes of one layer order).
    """

    member: np.ndarray
    ptr: np.ndarray
    unit: np.ndarray
    to: np.ndarray
    space: str

    @property
    def size(self) -> int:
        """N, the number of ideals."""
        return self.member.shape[0]

    @property
    def full(self) -> int:
        """Id of the ideal of every unit."""
        return self.size - 1

    @classmethod
    def of(cls, dag: UnitDag, *, limit: int = IDEAL_LIMIT, deadline=None) -> Lattice:
        """Every ideal of ``dag``, by breadth-first growth from the empty set.

        ``deadline`` (a :class:`~pipeopt.backends.deadline.Deadline`) is checked every 1,024
        ideals.

        Raises
        ------
        LatticeTooLarge
            If there are more than ``limit`` ideals (the message says how many were found).
        DeadlineReached
            If the deadline passes.
        """
        n = dag.n
        need = [0] * n
        succ: list[list[int]] = [[] for _ in range(n)]
        for v, ps in enumerate(dag.preds):
            for p in ps:
                need[v] |= 1 << p
                succ[p].append(v)
        ids = {0: 0}
        masks = [0]
        src, add, dst = [], [], []
        # breadth first; each ideal carries the units it may grow by (all predecessors in it),
        # updated from its parent's through the successors of the unit added
        level = [(0, sum(1 << v for v in range(n) if not need[v]))]
        while level:
            nxt = []
            for a, ready in level:
                ia = ids[a]
                r = ready
                while r:
                    low = r & -r
                    r ^= low
                    v = low.bit_length() - 1
                    b = a | low
                    ib = ids.get(b)
                    if ib is None:
                        ib = ids[b] = len(masks)
                        masks.append(b)
                        grown = ready & ~low
                        for w in succ[v]:
                            if not need[w] & ~b:
                                grown |= 1 << w
                        nxt.append((b, grown))
                        if deadline is not None and not ib % 1024:
                            deadline.check(f"listing the ideals ({ib:,} so far)")
                        if len(masks) > limit:
                            raise LatticeTooLarge(
                                f"the layer DAG ({n} units) has more than {limit:,} ideals (convex split"
                                " prefixes): the DP over ideals is not run"
                            )
                    src.append(ia)
                    add.append(v)
                    dst.append(ib)
            level = nxt
        N = len(masks)
        nbytes = (n + 7) // 8
        raw = np.frombuffer(b"".join(m.to_bytes(max(nbytes, 1), "little") for m in masks), dtype=np.uint8)
        member = np.unpackbits(raw.reshape(N, max(nbytes, 1)), axis=1, bitorder="little")[:, :n].astype(bool)
        return cls._from_edges(member, np.array(src), np.array(add), np.array(dst), "convex")

    @classmethod
    def chain(cls, n: int) -> Lattice:
        """The prefixes ``{0..j-1}`` of ``n`` units in order: the one-order space."""
        member = np.tri(n + 1, n, -1, dtype=bool)
        src = np.arange(n)
        return cls._from_edges(member, src, src, src + 1, "one-order")

    @classmethod
    def _from_edges(cls, member, src, add, dst, space) -> Lattice:
        N = member.shape[0]
        order = np.argsort(src, kind="stable")
        ptr = np.zeros(N + 1, dtype=np.int64)
        np.add.at(ptr, np.asarray(src, dtype=np.int64) + 1, 1)
        ptr = np.cumsum(ptr)
        member.setflags(write=False)
        return cls(member, ptr, np.asarray(add, dtype=np.int64)[order], np.asarray(dst, dtype=np.int64)[order], space)

    def sums(self, per_unit: np.ndarray) -> np.ndarray:
        """``ndarray (N,)`` (or ``(N, k)`` for ``(n, k)`` input): each ideal's sum of a per-unit
        quantity. Infinite entries must be handled by the caller (:meth:`finite_sums`)."""
        return self.member.astype(float) @ np.asarray(per_unit, dtype=float)

    def finite_sums(self, per_unit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(sum of the finite entries, count of the infinite ones)`` per ideal, so that a
        difference of two nested ideals is exact in kind (``inf - inf`` never arises)."""
        v = np.asarray(per_unit, dtype=float)
        bad = ~np.isfinite(v)
        return self.sums(np.where(bad, 0.0, v)), self.member.astype(np.int64) @ bad.astype(np.int64)

    def difference(self, a: int, b: int) -> np.ndarray:
        """Unit indices of ideal ``b`` minus ideal ``a`` (``a`` a sub-ideal of ``b``)."""
        return np.flatnonzero(self.member[b] & ~self.member[a])

    def chain_of(self, ids) -> list[np.ndarray]:
        """The stages (unit indices) of a chain of ideal ids ``[0, i_1, ..., full]``."""
        return [self.difference(a, b) for a, b in zip(ids[:-1], ids[1:], strict=True)]


# ---- transfers that a set of units takes part in (Tarnawski et al.'s communication rule) --------
@dataclass(frozen=True)
class Incidence:
    """Tensors between units in CSR form, for :func:`walk_supersets`.

    A tensor has one source unit, a set of destination units (without the source) and a cost
    (seconds). A set X of units *touches* it if the source is in X and some destination is not,
    or the source is not and some destination is (Tarnawski et al.: the device of the source
    sends it once, every other device that reads it receives it once): the rule of
    :func:`pipeopt.cost.rules.stage_transfers`, kept up to date here as units join a set.
    """

    cost: np.ndarray  # (T,)
    ndst: np.ndarray  # (T,) distinct destination units
    src_ptr: np.ndarray  # (n+1,) tensors whose source is unit v
    src_t: np.ndarray
    dst_ptr: np.ndarray  # (n+1,) tensors that unit v reads
    dst_t: np.ndarray

    @classmethod
    def of(cls, n: int, tensors) -> Incidence:
        """From ``Iterable[(src unit, Iterable[dst unit], seconds)]``; destinations equal to
        the source are dropped, and so is a tensor left without destination."""
        cost, ndst, by_src, by_dst = [], [], [[] for _ in range(n)], [[] for _ in range(n)]
        for s, dsts, c in tensors:
            d = sorted(set(int(x) for x in dsts) - {int(s)})
            if not d:
                continue
            t = len(cost)
            cost.append(float(c))
            ndst.append(len(d))
            by_src[int(s)].append(t)
            for x in d:
                by_dst[x].append(t)

        def csr(lists):
            ptr = np.zeros(n + 1, dtype=np.int64)
            ptr[1:] = np.cumsum([len(x) for x in lists])
            flat = np.array([t for x in lists for t in x], dtype=np.int64)
            return ptr, flat

        sp, st = csr(by_src)
        dp, dt = csr(by_dst)
        return cls(np.array(cost, dtype=float), np.array(ndst, dtype=np.int64), sp, st, dp, dt)

    @classmethod
    def empty(cls, n: int) -> Incidence:
        """No tensors."""
        return cls.of(n, ())


@njit(cache=True, nogil=True)
def _touch(v, sign, inc_cost, ndst, src_ptr, src_t, dst_ptr, dst_t, insrc, cnt):  # pragma: no cover - compiled
    """Unit v joins (sign +1) or leaves (-1) the set; returns the change of the touched cost."""
    delta = 0.0
    for e in range(src_ptr[v], src_ptr[v + 1]):
        t = src_t[e]
        before = (insrc[t] == 1 and cnt[t] < ndst[t]) or (insrc[t] == 0 and cnt[t] > 0)
        insrc[t] = 1 if sign > 0 else 0
        after = (insrc[t] == 1 and cnt[t] < ndst[t]) or (insrc[t] == 0 and cnt[t] > 0)
        delta += inc_cost[t] * (int(after) - int(before))
    for e in range(dst_ptr[v], dst_ptr[v + 1]):
        t = dst_t[e]
        before = (insrc[t] == 1 and cnt[t] < ndst[t]) or (insrc[t] == 0 and cnt[t] > 0)
        cnt[t] += sign
        after = (insrc[t] == 1 and cnt[t] < ndst[t]) or (insrc[t] == 0 and cnt[t] > 0)
        delta += inc_cost[t] * (int(after) - int(before))
    return delta


@njit(cache=True, nogil=True)
def _passes(a, j, qty, lim, bad):  # pragma: no cover - compiled
    """Whether ``J - a`` passes the walk's monotone test for some class c: every quantity q
    within ``lim[c, q]`` and no unit the class cannot run (``bad[c]``)."""
    for c in range(lim.shape[0]):
        if bad[c, j] != bad[c, a]:
            continue
        ok = True
        for q in range(lim.shape[1]):
            if qty[q, j] - qty[q, a] > lim[c, q]:
                ok = False
                break
        if ok:
            return True
    return False


@njit(cache=True, nogil=True)
def walk_supersets(a, ptr, unit, to, stamp, mark, qty, lim, bad, out_j, out_comm, inc_cost, ndst, src_ptr, src_t,
                   dst_ptr, dst_t, insrc, cnt, stack_i, stack_e, stack_v):  # pragma: no cover - compiled
    """Every ideal ``J`` that strictly contains ideal ``a`` and whose difference ``J - a``
    passes a monotone test; the transfers ``J - a`` touches.

    The test (:func:`_passes`): for some class c (a kind of device), each per-ideal quantity
    grows by at most ``lim[c, q]`` from ``a`` to ``J`` (``qty (Q, N)``: compute seconds,
    bytes, ...; non-decreasing along inclusion) and ``J - a`` holds no unit the class cannot
    run (``bad (C, N)``, counts per ideal). A set that fails fails for all its supersets, so the
    walk does not grow past it, and it returns exactly the passing ideals. The walk is depth
    first over the transitions; an ideal is visited once per ``a`` (``stamp[J] == mark``); the
    transfers are updated as units join and leave the walk's path (:class:`Incidence`).

    Returns
    -------
    int
        The number of ideals written to ``out_j`` (ids) and ``out_comm`` (seconds of the
        tensors ``J - a`` touches).
    """
    found = 0
    depth = 0
    comm = 0.0
    stack_i[0] = a
    stack_e[0] = ptr[a]
    stamp[a] = mark
    while depth >= 0:
        i = stack_i[depth]
        e = stack_e[depth]
        if e == ptr[i + 1]:
            if depth > 0:
                comm += _touch(stack_v[depth], -1, inc_cost, ndst, src_ptr, src_t, dst_ptr, dst_t, insrc, cnt)
            depth -= 1
            continue
        stack_e[depth] = e + 1
        j = to[e]
        if stamp[j] == mark:
            continue
        stamp[j] = mark
        if not _passes(a, j, qty, lim, bad):
            continue
        v = unit[e]
        comm += _touch(v, 1, inc_cost, ndst, src_ptr, src_t, dst_ptr, dst_t, insrc, cnt)
        out_j[found] = j
        out_comm[found] = comm
        found += 1
        depth += 1
        stack_i[depth] = j
        stack_e[depth] = ptr[j]
        stack_v[depth] = v
    return found


class Walker:
    """:func:`walk_supersets` with its buffers, for one lattice, one incidence and one test.

    Parameters
    ----------
    lattice
        The ideals.
    qty
        ``ndarray (Q, N)``: per-ideal quantities, non-decreasing along inclusion.
    bad
        ``ndarray (C, N)`` of int: per class, the units of each ideal it cannot run.
    incidence
        The tensors whose transfers are summed (default none).
    """

    def __init__(self, lattice: Lattice, qty: np.ndarray, bad: np.ndarray, incidence: Incidence | None = None):
        n = lattice.member.shape[1]
        self.lat = lattice
        self.inc = incidence or Incidence.empty(n)
        N = lattice.size
        self.qty = np.ascontiguousarray(qty, dtype=float).reshape(-1, N)
        self.bad = np.ascontiguousarray(bad, dtype=np.int64).reshape(-1, N)
        self.stamp = np.full(N, -1, dtype=np.int64)
        self.out_j = np.empty(N, dtype=np.int64)
        self.out_comm = np.empty(N, dtype=float)
        self.insrc = np.zeros(self.inc.cost.size, dtype=np.int64)
        self.cnt = np.zeros(self.inc.cost.size, dtype=np.int64)
        self.stack_i = np.empty(n + 2, dtype=np.int64)
        self.stack_e = np.empty(n + 2, dtype=np.int64)
        self.stack_v = np.empty(n + 2, dtype=np.int64)

    def __call__(self, a: int, lim: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(J ids, transfer seconds)`` of the supersets of ideal ``a`` within ``lim (C, Q)``."""
        lat, inc = self.lat, self.inc
        lim = np.ascontiguousarray(lim, dtype=float).reshape(self.bad.shape[0], self.qty.shape[0])
        k = walk_supersets(a, lat.ptr, lat.unit, lat.to, self.stamp, a, self.qty, lim, self.bad, self.out_j,
                           self.out_comm, inc.cost, inc.ndst, inc.src_ptr, inc.src_t, inc.dst_ptr, inc.dst_t,
                           self.insrc, self.cnt, self.stack_i, self.stack_e, self.stack_v)
        return self.out_j[:k], self.out_comm[:k]


def ideal_count_text(lattice: Lattice) -> str:
    """A short description for a result's info."""
    return f"{lattice.size:,} ideals of {lattice.member.shape[1]} units ({lattice.space})"

