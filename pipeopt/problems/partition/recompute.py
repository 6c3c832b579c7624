"""The exact choice of recomputed layers per stage, for the partition problem's exact methods.

Activation recomputation (checkpointing) trades time for memory layer by layer: a recomputed
layer keeps fewer bytes per microbatch in flight and its backward reruns (part of) its forward
(:func:`pipeopt.cost.rules.recompute_terms`, the one rule). For a stage of units ``a..b-1``
keeping ``k`` microbatches in flight, the exact methods need

    ``extra(a, b, k) = min over recompute choices R of the seconds R adds,
    subject to the stage's memory with R fitting the worker``

(``inf`` if no choice fits). Every stage's time grows with its own extra and the period of a
split (window rows included, :func:`pipeopt.cost.rules.steady_period`) does not decrease when a
stage's time grows, so the least extra of each stage is the optimal choice for every split: the
joint problem of split and recompute sets is the split problem on these stage costs.

**The memory of a stage with a choice R** (:func:`pipeopt.evaluate`'s rule): with ``kept_l``
the bytes layer l keeps per microbatch (its ``act_bytes``, or the kept bytes of its mode),
``K = sum kept_l`` and ``X = max over layers L of (act_L + temp_L - kept_L - sum_{l after L}
kept_l)`` (the backward of a recomputed layer L holds its whole activations again while the
layers before it still hold what they keep: :func:`pipeopt.cost.rules.backward_peak` less
``K``), the stage needs ``k K + versions (params + ties) + max(X, 0)`` bytes. This is not a
sum over layers (a 0/1 knapsack with one extra term), so the choice is made **exactly** on a
Pareto frontier: walking the stage's layers from its last to its first, each partial choice
is a point ``(K, X, seconds)`` of the layers seen (adding a layer L in front adds its
``kept`` to K, its seconds to the time, and makes ``X = max(X, act_L + temp_L - kept_L -
K)``). With the peak ``P = X + K`` (the adding of L makes it ``max(P + kept_L, act_L +
temp_L)``, whatever K) the memory of every completion, ``k K + max(P - K, 0)``, does not
decrease in K or P for ``k >= 1``: a point that another beats or equals in (K, P, seconds) is
dropped (it can never lead to a better full choice).

With the **measured transients** (graph attribute ``transient_memory``) ``temp_L`` is the
layer's backward temporaries, the stage also keeps its outputs (a constant of the stage) and a
tensor two consecutive layers both save (``saved_twice_bytes``) is held once while neither is
recomputed: each point then also carries the bytes in flight ``W`` (K less those tensors) and
whether the suffix's first layer is recomputed, the memory is ``k W + ... + max(X, 0)``, and
points are compared pairwise (:func:`_pareto_held`). A ``saved_twice_bytes`` edge between
layers that are not consecutive is refused. Identical blocks give equal
points, which are kept once (points within :data:`SAME_POINT` relative of each other count
as equal: far below :data:`pipeopt.cost.rules.MEMORY_SLACK`). Walking backwards, one pass
over the layers from each end ``b`` gives the frontiers of every stage ``a..b-1``.

If a frontier grows beyond :data:`FRONTIER_LIMIT` points it is thinned to that many (the
points kept are real choices, so every stage cost is attained, but smaller ones may be
missed): :attr:`RecomputeModel.exact` becomes False and the methods do not claim optimality.

References
----------
Chen et al., "Training Deep Nets with Sublinear Memory Cost", arXiv:1604.06174, 2016
(checkpointing); Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models", MLSys 2023 (full and selective recomputation); Sun et al., AdaPipe, ASPLOS 2024
(recomputation chosen per stage with the split by a DP).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ...cost import rules
from ...cost.transient import bwd_temp
from ...errors import InvalidProblemError

RECOMPUTE = ("none", "full", "auto")
"""The partition problem's ``recompute`` option: ``"none"`` (keep every activation),
``"full"`` (every layer recomputed, full mode), ``"auto"`` (the exact choice per layer and
stage: none or full, and selective where every layer's profile measures it)."""

FRONTIER_LIMIT = 200_000
"""Points a stage's frontier may hold; beyond it the frontier is thinned (evenly in time, the
least-memory points kept) and the result is no longer proven."""

PAIRWISE_LIMIT = 2_000
""":data:`FRONTIER_LIMIT` when the frontiers are pruned pairwise (measured transients with tensors
held once, :func:`_pareto_held`: quadratic in the points)."""

SAME_POINT = 1e-12
"""Two frontier points whose bytes differ by at most this times the chain's activation bytes
(and whose times are in order) count as one: the same choice of identical blocks summed in
another order."""


def check_recompute(value) -> str:
    """Raise :class:`InvalidProblemError` unless ``value`` is one of :data:`RECOMPUTE`."""
    if value not in RECOMPUTE:
        raise InvalidProblemError(f"recompute must be one of {list(RECOMPUTE)}, got {value!r}")
    return value


@dataclass(frozen=True)
class LayerChoices:
    """One layer's options: ``modes[o]`` keeps ``kept[o]`` bytes per microbatch and adds
    ``seconds[o]`` to its stage's backward; option 0 is ``None`` (nothing recomputed) unless the
    choice is forced (``"full"``). ``temp``: its backward's temporaries (measured transients, else
    0); ``twice``: the ``saved_twice_bytes`` of its edge to the next layer (held once while
    neither end is recomputed; measured transients, else 0)."""

    name: object
    act: float
    temp: float
    modes: tuple
    kept: tuple
    seconds: tuple
    twice: float = 0.0


@dataclass
class Frontier:
    """The Pareto frontier of the choices for the layers seen (a suffix of a stage).

    Attributes
    ----------
    kept, excess, time
        ``ndarray (N,)``: K (bytes kept per microbatch), X (bytes the backward's peak exceeds K
        by, ``-inf`` for no layer) and the seconds added, per point.
    held, first
        ``ndarray (N,)``: the bytes per microbatch in flight, K less the tensors held once
        (measured transients' ``saved_twice_bytes``; else K), and whether the suffix's first layer
        is recomputed (True for no layer).
    parent, option
        ``ndarray (N,)`` of int: the point of the previous frontier each point extends and the
        option it took.
    """

    kept: np.ndarray
    excess: np.ndarray
    time: np.ndarray
    parent: np.ndarray | None = None
    option: np.ndarray | None = None
    held: np.ndarray | None = None
    first: np.ndarray | None = None

    @classmethod
    def empty(cls) -> Frontier:
        return cls(np.zeros(1), np.full(1, -np.inf), np.zeros(1), np.zeros(1, dtype=np.int64),
                   np.zeros(1, dtype=np.int64), np.zeros(1), np.ones(1, dtype=bool))

    def __len__(self) -> int:
        return len(self.time)


def _pareto(kept, excess, time, tol: float) -> np.ndarray:
    """Indices of the points no other point beats or equals in (kept, peak, time), in order of
    time, the peak being ``excess + kept`` (the backward's peak, which a layer added in front
    raises to ``max(peak + kept_L, act_L + temp_L)`` whatever K: the memory ``k K + max(peak -
    K, 0)`` of every completion is monotone in K and the peak for k >= 1); points within ``tol``
    bytes count as equal (the one of least time is kept)."""
    excess = excess + kept  # the peak
    order = np.lexsort((excess, kept, time))
    keep = []
    stair_k: list = []  # kept ascending, excess strictly descending: the (K, X) staircase so far
    stair_x: list = []
    K, X = kept.tolist(), excess.tolist()
    for idx in order.tolist():
        k, x = K[idx], X[idx]
        pos = bisect.bisect_right(stair_k, k + tol) - 1
        if pos >= 0 and stair_x[pos] <= x + tol:
            continue  # an earlier point (no more time) keeps no more bytes and peaks no higher
        keep.append(idx)
        ins = bisect.bisect_left(stair_k, k)
        j = ins
        while j < len(stair_k) and stair_x[j] >= x:
            j += 1
        stair_k[ins:j] = [k]
        stair_x[ins:j] = [x]
    return np.asarray(keep, dtype=np.int64)


def _pareto_held(kept, held, excess, time, first, tol: float) -> np.ndarray:
    """:func:`_pareto` where the bytes in flight (``held``, W) differ from the bytes kept (K:
    tensors held once): with the peak ``P = excess + kept``, point p replaces point q if both have
    the same ``first``, p takes no more time and ``W_p + max(0, max(P_p - P_q, 0) + K_q - K_p) <=
    W_q`` (every completion's memory ``k W + max(P - K, 0)`` is then no larger for every k >= 1:
    the peak difference never grows, the K difference stays, and k >= 1 held bytes pay for them).
    Pairwise: O(N^2)."""
    peak = excess + kept
    order = np.lexsort((peak, held, time))
    keep: list = []
    for idx in order.tolist():
        if keep:
            j = np.asarray(keep)
            gap = np.maximum(np.maximum(peak[j] - peak[idx], 0.0) + kept[idx] - kept[j], 0.0)
            beat = (first[j] == first[idx]) & (held[j] + gap <= held[idx] + tol)
            if beat.any():
                continue
        keep.append(idx)
    return np.asarray(keep, dtype=np.int64)


def extend(front: Frontier, layer: LayerChoices, tol: float, limit: int | None = None,
           pairwise: bool = False) -> tuple[Frontier, bool]:
    """The frontier of the choices with ``layer`` added in front of the layers of ``front``
    (at most ``limit`` points, default :data:`FRONTIER_LIMIT`); ``pairwise``: prune with
    :func:`_pareto_held` (the chain has tensors held once, ``saved_twice_bytes``), else
    :func:`_pareto`.

    Returns
    -------
    (Frontier, thinned)
        ``thinned``: the frontier exceeded ``limit`` and was thinned (not exact any more).
    """
    ks, ws, xs, ts, ps, os, fs = [], [], [], [], [], [], []
    base = np.arange(len(front), dtype=np.int64)
    for o, (kept, sec) in enumerate(zip(layer.kept, layer.seconds, strict=True)):
        ks.append(front.kept + kept)
        redone = layer.modes[o] is not None
        # the tensor this layer and the next (the suffix's first) both save is held once while neither recomputes
        once = 0.0 if redone or not layer.twice else np.where(front.first, 0.0, layer.twice)
        ws.append(front.held + kept - once)
        xs.append(np.maximum(front.excess, layer.act + layer.temp - kept - front.kept))
        ts.append(front.time + sec)
        ps.append(base)
        os.append(np.full(len(front), o, dtype=np.int64))
        fs.append(np.full(len(front), redone))
    K, W, X, T, P, O, F = (np.concatenate(v) for v in (ks, ws, xs, ts, ps, os, fs))
    idx = _pareto_held(K, W, X, T, F, tol) if pairwise else _pareto(K, X, T, tol)
    limit = (PAIRWISE_LIMIT if pairwise else FRONTIER_LIMIT) if limit is None else int(limit)
    thinned = False
    if len(idx) > limit:  # keep the least-time, least-kept and least-peak points and an even spread
        thinned = True
        extra = {int(idx[np.argmin(K[idx])]), int(idx[np.argmin(X[idx])])}
        pick = idx[np.linspace(0, len(idx) - 1, limit - 2).astype(np.int64)]
        idx = np.asarray(sorted(set(pick.tolist()) | extra, key=lambda i: (T[i], K[i])), dtype=np.int64)
    return Frontier(K[idx], X[idx], T[idx], P[idx], O[idx], W[idx], F[idx]), thinned


class RecomputeModel:
    """The recompute choices of a partition problem and the least extra seconds of every stage.

    Parameters
    ----------
    problem
        :class:`~pipeopt.problems.partition.problem.PartitionProblem` with ``recompute`` ``"full"``
        or ``"auto"``.

    Raises
    ------
    InvalidProblemError
        (when :attr:`units` is first read) if a ``saved_twice_bytes`` edge joins layers that are not
        consecutive in the layer order.

    Attributes
    ----------
    mode
        ``"full"`` or ``"auto"``.
    modes
        The modes ``"auto"`` chooses from besides none: ``("full",)``, or ``("full",
        "selective")`` when every layer has the ``selective`` attribute.
    exact
        False once a frontier was thinned (:data:`FRONTIER_LIMIT`); then no optimum is claimed.
    pairwise
        True if the chain has tensors two consecutive layers both save (measured transients'
        ``saved_twice_bytes``): the frontiers are pruned pairwise (:func:`_pareto_held`).
    largest
        The most points a frontier held.
    """

    def __init__(self, problem) -> None:
        self.problem = problem
        self.mode = problem.recompute
        graph = problem.instance.graph
        self.modes = ("full",)
        if self.mode == "auto" and all(isinstance(graph.nodes[v].get("selective"), dict) for v in graph.nodes):
            self.modes = ("full", "selective")
        self.exact = True
        self.largest = 1
        self.pairwise = any(layer.twice for unit in self.units for layer in unit)
        self._extra: dict = {}
        self._over: dict = {}

    @cached_property
    def units(self) -> list[list[LayerChoices]]:
        """Per unit, its layers' :class:`LayerChoices` in the unit's order."""
        p = self.problem
        graph = p.instance.graph
        kind = p.kind
        units = p.instance.cluster.devices[0].resources[kind]
        transient = bool(p.table.transient)
        order = [x for unit in p.instance.chain.units for x in unit]
        nxt = dict(zip(order[:-1], order[1:]))
        twice = {}
        if transient:
            for u, v, nb in graph.edges(data="saved_twice_bytes"):
                if not nb:
                    continue
                if nxt.get(u) != v:
                    raise InvalidProblemError(
                        f"{p.instance.name}: recompute={self.mode!r} models a tensor saved by two layers "
                        f"(saved_twice_bytes) only on an edge between consecutive layers; {u!r} -> {v!r} is not one"
                    )
                twice[u] = float(nb)
        out = []
        for unit in p.instance.chain.units:
            layers = []
            for name in unit:
                act = float(graph.nodes[name]["act_bytes"])
                modes, kept, sec = [], [], []
                if self.mode == "auto":
                    modes, kept, sec = [None], [act], [0.0]
                for mode in self.modes:
                    k, extra = rules.recompute_terms(graph, name, mode)
                    modes.append(mode)
                    kept.append(float(k))
                    sec.append(float(extra.get(kind, math.inf)) / units)
                temp = bwd_temp(graph, name) if transient else 0.0
                layers.append(LayerChoices(name, act, temp, tuple(modes), tuple(kept), tuple(sec),
                                           twice.get(name, 0.0)))
            out.append(layers)
        return out

    @cached_property
    def tol(self) -> float:
        """Bytes within which two points count as one (:data:`SAME_POINT` of the chain's activations)."""
        return SAME_POINT * max(float(self.problem.act_prefix[-1]), 1.0)

    def fixed(self, a: int, b: int, k: float) -> float:
        """Bytes of a stage of units ``a..b-1`` keeping ``k`` microbatches that no choice changes:
        ``versions * (parameters + tied parameters)``, and with measured transients the outputs it
        keeps (:func:`pipeopt.cost.rules.outputs_kept` times what it sends, the last stage the
        model's output), and with data parallelism the training state the ZeRO stage leaves it
        (:meth:`pipeopt.cost.CostTable.sharded_state`)."""
        p = self.problem
        tab = p.table
        params = p.param_prefix[b] - p.param_prefix[a]
        if tab.ties:
            params = params + float(tab.ties.state_bytes(a, b))
        out = float(rules.stage_memory(0.0, params, k, rules.weight_versions(k, p.instance.settings.weight_stashing)))
        if p.data_parallel:  # gradients and optimizer state, sharded by the ZeRO stage
            out += float(tab.sharded_state(a, b))
        if tab.transient:
            last = b == p.n
            sent = tab.transient.final_out if last else float(tab.boundary_bytes[b])
            out += float(rules.transient_memory(sent, rules.outputs_kept(k, last, p.instance.settings.microbatches), 0.0))
        return out

    def excess(self, excess, act, b: int):
        """Bytes a stage ending at unit ``b`` holds beyond its kept activations (``act``, per
        frontier point) and :meth:`fixed`: the larger of its backward's excess and, with measured
        transients, what the last stage's merge of the outputs adds beyond ``act``
        (:func:`pipeopt.cost.rules.transient_memory`, :func:`pipeopt.cost.rules.merged_output`)."""
        tab = self.problem.table
        merged = 0.0
        if tab.transient:
            merged = rules.merged_output(tab.transient.final_out, b == self.problem.n,
                                         self.problem.instance.settings.microbatches)
        return rules.transient_memory(0.0, 0.0, np.maximum(excess, 0.0), merged, act)

    def least(self, front: Frontier, a: int, b: int, k: float, memory: float | None = None) -> int | None:
        """The point of least time on ``front`` whose stage memory fits.

        Parameters
        ----------
        front
            :class:`Frontier` of the choices of every layer of the stage of units ``a..b-1``
            (a walk from its last layer to its first, as :meth:`choose` builds it).
        a, b
            The stage's first unit and one past its last.
        k
            Microbatches the stage keeps in flight (>= 1).
        memory
            Bytes the stage may use (:func:`pipeopt.cost.rules.fits`); default: the worker's
            (``problem.fits``).

        Returns
        -------
        int or None
            Index into ``front`` of the least-time point whose memory, ``k held + fixed(a, b, k)
            + excess`` bytes (:meth:`fixed`, :meth:`excess`), fits; ``None`` if no point fits.
        """
        mem = k * front.held + self.fixed(a, b, k) + self.excess(front.excess, k * front.held, b)
        ok = np.flatnonzero(self.problem.fits(mem) if memory is None else rules.fits(mem, memory))
        if not ok.size:
            return None
        return int(ok[np.argmin(front.time[ok])])

    def extra(self, k: float) -> np.ndarray:
        """``ndarray (n+1, n+1)``, end-major: ``extra[j, i]`` the least seconds a stage of units
        ``i..j-1`` keeping ``k`` microbatches adds by recomputation with its memory fitting
        (``inf`` if no choice fits, or ``j <= i``). Built for every ``k`` of :meth:`prepare` at once."""
        if float(k) not in self._extra:
            self.prepare([k])
        return self._extra[float(k)]

    def prepare(self, ks, deadline=None) -> None:
        """Build :meth:`extra` and :meth:`overshoot` for every in-flight count of ``ks``: one
        backward walk per stage end; ``deadline`` (a :class:`~pipeopt.backends.deadline.Deadline`)
        is checked per end and raises :class:`~pipeopt.backends.deadline.DeadlineReached`."""
        ks = [float(k) for k in ks if float(k) not in self._extra]
        if not ks:
            return
        n = self.problem.n
        out = {k: np.full((n + 1, n + 1), np.inf) for k in ks}
        over = {k: np.full((n + 1, n + 1), np.inf) for k in ks}
        for b in range(1, n + 1):
            if deadline is not None:
                deadline.check("recompute frontiers")
            front = Frontier.empty()
            for a in range(b - 1, -1, -1):
                if deadline is not None and self.pairwise:
                    deadline.check("recompute frontiers")
                for layer in reversed(self.units[a]):
                    front, thinned = extend(front, layer, self.tol, pairwise=self.pairwise)
                    self.exact &= not thinned
                self.largest = max(self.largest, len(front))
                for k in ks:
                    mem = k * front.held + self.fixed(a, b, k) + self.excess(front.excess, k * front.held, b)
                    ok = np.flatnonzero(self.problem.fits(mem))
                    if ok.size:
                        out[k][b, a] = front.time[ok].min()
                    over[k][b, a] = float(mem.min()) - self.problem.memory
        self._extra.update(out)
        self._over.update(over)

    def overshoot(self, k: float) -> np.ndarray:
        """``ndarray (n+1, n+1)``, end-major: the fewest bytes by which a stage of units ``i..j-1``
        keeping ``k`` microbatches exceeds the worker's memory over every recompute choice
        (``<= 0``: some choice fits, as does one within :data:`pipeopt.cost.rules.MEMORY_SLACK`;
        ``inf`` if ``j <= i``)."""
        if k not in self._over:
            self.prepare([k])
        return self._over[float(k)]

    def choose(self, a: int, b: int, k: float) -> tuple[float, dict]:
        """The least-time choice of a stage of units ``a..b-1`` keeping ``k`` microbatches.

        Returns
        -------
        (seconds, recompute)
            The seconds it adds and ``dict[layer, mode]`` of the layers recomputed (as
            :class:`pipeopt.plan.Stage` ``recompute`` takes it); if no choice fits, ``inf``
            and the choice of least memory.
        """
        fronts = [Frontier.empty()]
        layers = [layer for u in range(a, b) for layer in self.units[u]][::-1]
        for layer in layers:
            front, _ = extend(fronts[-1], layer, self.tol, pairwise=self.pairwise)
            fronts.append(front)
        last = fronts[-1]
        i = self.least(last, a, b, k)
        seconds = math.inf
        if i is None:  # none fits: the choice of least memory (a plan that says what it misses by)
            i = int(np.argmin(k * last.held + np.maximum(last.excess, 0.0)))
        else:
            seconds = float(last.time[i])
        return seconds, backtrack(fronts, layers, i)


def backtrack(fronts: list, layers: list, i: int) -> dict:
    """``dict[layer name, mode]``: the layers point ``i`` of the last frontier recomputes, read
    back through the frontiers a walk built (``fronts[s]`` after the first ``s`` of ``layers``,
    each point's ``option`` its layer's mode and ``parent`` its point in the frontier before)."""
    chosen = {}
    for step in range(len(layers), 0, -1):
        f = fronts[step]
        layer = layers[step - 1]
        mode = layer.modes[int(f.option[i])]
        if mode is not None:
            chosen[layer.name] = mode
        i = int(f.parent[i])
    return chosen


def overshoot_hint(recompute: str) -> str:
    """How a shortfall's message ends for the ``recompute`` option: what was tried, or (none) the
    option to try."""
    return {"auto": " with every recompute choice tried", "full": " with every layer recomputed"}.get(
        recompute, " (no recomputation: try recompute='auto')")


def min_max_overshoot(matrices, S: int) -> tuple[float, list[int]]:
    """The smallest, over every straight split into ``S`` stages, of the largest overshoot of
    its stages: a min-max DP over ``matrices[s]`` (``ndarray (n+1, n+1)`` end-major, the
    overshoot in bytes of stage s of units ``i..j-1``, ``inf`` where ``j <= i``).

    Returns
    -------
    (bytes, starts)
        The least worst-stage overshoot (``<= 0``: a split fits) and the split attaining it.
    """
    n = matrices[0].shape[0] - 1
    best = np.full(n + 1, np.inf)
    best[0] = -np.inf
    args = []
    for s in range(S):
        cand = np.maximum(best[None, :], matrices[s])
        cand[:, :] = np.where(np.isnan(cand), np.inf, cand)
        pick = np.argmin(cand, axis=1)
        best = cand[np.arange(n + 1), pick]
        args.append(pick)
    starts, j = [], n
    for s in range(S - 1, 0, -1):
        j = int(args[s][j])
        starts.append(j)
    return float(best[n]), starts[::-1]

