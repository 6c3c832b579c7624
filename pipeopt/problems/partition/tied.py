"""The tied splits of a straight partition problem, in the order of their 1F1B-flush
iteration time: the exact second phase of :mod:`.tiebreak`.

After an exact method proves the optimal period T*, the splits whose period is at most T*
(relative slack :data:`~pipeopt.problems.secondary.CAP_REL`) are *tied*; the second phase
wants the first of them in the order (iteration time of M microbatches under 1F1B with a flush,
then ends) that passes :func:`pipeopt.evaluate`.

* :func:`_tie_states`: the tied splits as the paths of a graph of the DP's window states
  (:func:`pipeopt.cost.rules.window_step`), small where the list is huge (PipeDream's GNMT at
  S = 16: 8.5e10 tied splits on 2,962 states); :func:`tied_splits` lists them.
* :func:`run_times`: their iteration times, many at once, on the run graph.
* :class:`_Paths`: run-graph paths, whose lengths are sums over a split's stages and bound its
  time, and the exact timing of one split (its longest path added).
* :func:`least_run`: the order by :class:`_LeastFirst`, which times only the splits whose path
  bound is at most an upper bound (the same order and floats as timing them all).
* :func:`search_least`: the same answer past the graph's limits, by branch and bound over
  partial splits.

Every limit is work on the instance, not the clock, so the same call ends the same way on every
run.
"""

from __future__ import annotations

import math

import numpy as np

from ...backends.deadline import Deadline
from ...cost import evaluate, rules
from .. import secondary
from ..secondary import CAP_REL
from .problem import PartitionProblem


ENUM_WORK = 600_000
"""Most (window state, stage end) pairs the graph of the tied splits (:func:`_tie_states`) may
test on one stage (its states times ``n + 1``): a work limit on the instance, so the same call
builds the same graph, or gives up, on every run (a few milliseconds of numpy at the limit;
PipeDream's SqueezeNet at S = 8 needs 547,000, a graph that gives up costs up to ~6 ms)."""

ENUM_EDGES = 50_000
"""Most edges (a state and a stage end that extends it) the graph of the tied splits may have on
one stage before it gives up. The graph, not the splits, bounds the work: PipeDream's GNMT at
S = 16 has 8.5e10 tied splits on 2,962 states."""

ENUM_SPLITS = 50_000
"""Most tied splits listed as rows (:func:`tied_splits`; the second phase times all of them only
when it needs more than the first, :class:`_LeastFirst`). PipeDream's AlexNet at S = 16 has
18,372 tied splits."""

RUN_BLOCK = 4096
"""Splits :func:`run_times` scores at once (memory: block x ops floats)."""

FRONTIER = 50_000
"""Most partial splits :class:`_LeastFirst` extends at once on a stage (memory: a few arrays of
this many rows times the paths; PipeDream's GNMT at S = 8: 45,902 candidates on its first pass)."""


def tied_splits(problem: PartitionProblem, T: float) -> np.ndarray | None:
    """Every straight split that fits the workers' memory and whose window rows and cut bounds
    hold at period ``T``, or ``None`` past :data:`ENUM_WORK`, :data:`ENUM_EDGES` or
    :data:`ENUM_SPLITS`.

    The DP's feasibility probe (the recursion of :func:`pipeopt.cost.rules.window_step`, as
    :func:`has_tie` and :mod:`pipeopt.problems.partition.dp`), stage by stage over every partial
    split instead of the least window slack per state: a stage of units ``a..b-1`` extends a
    partial split iff ``b <= reach[a]`` (:meth:`PartitionProblem.memory_reach` with the 1F1B
    in-flight count ``S - s``, the event-time MILP's memory rows), the cut bounds at ``a`` and
    ``b`` are at most ``T`` and the window rows ending at the stage hold. A partial split that
    breaks one has no feasible completion (the rows of a prefix are rows of every split
    extending it), so none is missed. The caller passes a ``T`` slightly above the cap and
    re-checks a split it keeps with :meth:`PartitionProblem.period` (float summation order).

    Partial splits with the same last end and the same window slack ``G`` (equal floats) have
    the same completions, so the rows are tested once per such *state* (PipeDream's AlexNet at
    S = 16: at most 31 states per stage for up to 18,372 partial splits), each state counting
    the partial splits that reach it; the splits are then read off the states' graph, from the
    states that reach the last stage only. The graph gives up past :data:`ENUM_WORK` states
    times ``n + 1`` ends or :data:`ENUM_EDGES` edges on a stage, the list past
    :data:`ENUM_SPLITS` splits.

    Returns
    -------
    ndarray (L, S - 1) of int or None
        The stage starts after the first of each split, rows in lexicographic order.
    """
    tie = _tie_states(problem, T)
    return None if tie is None or tie.count > ENUM_SPLITS else tie.rows()


class _Extension:
    """How a stage extends a partial tied split at period ``T`` (:func:`tied_splits`): stage ``s``
    of units ``a..b-1`` needs ``b`` at most the memory reach of ``a`` with the 1F1B in-flight count
    ``S - s`` (and room for the stages after it), the cut bound at ``b`` at most ``T`` and the
    window rows ending at the stage to hold (:func:`pipeopt.cost.rules.window_step`); the last
    stage ends at ``n``. Read by the graph of the tied splits (:func:`_tie_states`, many states at
    once) and by the branch and bound (:func:`search_least`, one at a time)."""

    def __init__(self, problem: PartitionProblem, T: float) -> None:
        n, S = problem.n, problem.stages
        self.n, self.S, self.T = n, S, T
        self.added, bound = problem.cut_terms
        self.link_ok = bound <= T  # the cut at each unit passes T
        self.trip = np.asarray(problem.trip, dtype=float)
        self.wp = np.asarray(problem.work_prefix, dtype=float)
        self.flight = [rules.in_flight(s, S) for s in range(S)]
        # per stage: the last end of a stage starting at each unit
        self.top = [np.minimum(problem.memory_reach(k), n if s == S - 1 else n - (S - 1 - s))
                    for s, k in enumerate(self.flight)]

    def first_end(self, s: int, a):
        """The least end of stage ``s`` starting at units ``a`` (array or int)."""
        return np.full_like(a, self.n) if s == self.S - 1 else a + 1

    def ends(self, s: int, a: np.ndarray, G: np.ndarray):
        """Stage ``s`` from states ending at units ``a`` with window slacks ``G`` (arrays of one
        length): ``(cols, g, ok)``, the ends ``cols`` some state may take, each state's window slack
        ``g`` after a stage ending there and whether ``ok`` (``(len(a), len(cols))`` each)."""
        lo_b, top = self.first_end(s, a), self.top[s][a]
        lo, up = (int(lo_b.min()), int(top.max())) if a.size else (0, -1)
        cols = np.arange(lo, up + 1)  # only these columns: the same rows, elementwise, on fewer of them
        wp, added = self.wp, self.added
        w = wp[None, lo:up + 1] - wp[a][:, None] + added[a][:, None] + added[None, lo:up + 1]
        k = self.flight[s]
        g, ok = rules.window_step(G[:, None], self.trip[a][:, None], w, k, k - 1, self.T)
        ok &= (cols[None, :] >= lo_b[:, None]) & (cols[None, :] <= top[:, None]) & self.link_ok[lo:up + 1][None, :]
        return cols, g, ok


def _tie_states(problem: PartitionProblem, T: float) -> _TieStates | None:
    """The graph of the tied splits at period ``T`` (:func:`tied_splits`): the window states of
    each stage and the stage ends between them (:class:`_Extension`), or ``None`` past
    :data:`ENUM_WORK` or :data:`ENUM_EDGES`."""
    n, S = problem.n, problem.stages
    ext = _Extension(problem, T)
    size = 1 if ext.link_ok[0] else 0
    a = np.zeros(size, dtype=np.int64)  # each state's last end
    G = np.full(size, -np.inf)  # its window slack G (rules.window_step)
    count = np.ones(size)  # the partial splits reaching it
    starts = [a]  # per stage: the end of each state before it
    edges: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # per stage: (parent state, end, child state)
    for s in range(S):
        if a.size * (n + 1) > ENUM_WORK:
            return None
        cols, g, ok = ext.ends(s, a, G)
        parent, col = np.nonzero(ok)  # row-major: parents in order, ends increasing
        if parent.size > ENUM_EDGES:
            return None
        b, gv = cols[col], g[parent, col]
        order = np.lexsort((gv, b))  # the distinct (end, G) among the children (not np.unique: numpy.ma)
        first = np.ones(order.size, dtype=bool)
        first[1:] = (b[order][1:] != b[order][:-1]) | (gv[order][1:] != gv[order][:-1])
        child = np.empty(order.size, dtype=np.int64)
        child[order] = np.cumsum(first) - 1
        count = np.bincount(child, weights=count[parent], minlength=int(first.sum()))
        edges.append((parent, b, child))
        a, G = b[order][first].astype(np.int64), gv[order][first]
        starts.append(a)
    # the states that reach the last stage (every state after it ends at n), back to the first
    live = np.ones(a.size, dtype=bool)
    for s in range(S - 1, -1, -1):
        parent, b, child = edges[s]
        keep = live[child]
        edges[s] = (parent[keep], b[keep], child[keep])
        live = np.zeros(starts[s].size, dtype=bool)
        live[edges[s][0]] = True
    return _TieStates(starts, edges, int(round(count.sum())))


class _TieStates:
    """The tied splits as paths of a graph (:func:`_tie_states`): stage ``s`` goes from the
    states ``0 .. len(starts[s]) - 1`` (``starts[s][i]``: the unit state ``i`` ends at, where
    stage ``s`` starts) along ``edges[s] = (parent, end, child)`` (sorted by parent, then end;
    one edge per parent and end) to the states of stage ``s + 1``; only edges on a path from
    the first state to the last stage are kept, so every path is one tied split and every tied
    split one path. ``count``: how many."""

    def __init__(self, starts: list[np.ndarray], edges: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                 count: int) -> None:
        self.starts, self.edges, self.count = starts, edges, count
        self.first = []  # per stage: each state's first edge and its number of edges
        for s, (parent, _, _) in enumerate(edges):
            deg = np.bincount(parent, minlength=starts[s].size)
            self.first.append((np.cumsum(deg) - deg, deg))

    def expand(self, s: int, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every partial split whose last state (of stage ``s``) is ``at[i]`` extended by each of
        that state's edges: ``(row, e)``, the partial split ``i`` and the edge of each extension,
        in the order of the partial splits, then of the ends."""
        begin, deg = self.first[s]
        rep = deg[at]
        row = np.repeat(np.arange(at.size), rep)
        e = begin[at][row] + np.arange(row.size) - np.repeat(np.cumsum(rep) - rep, rep)
        return row, e

    def rows(self) -> np.ndarray:
        """``ndarray (count, S - 1)``: every split's stage starts after the first, in
        lexicographic order."""
        S = len(self.edges)
        if self.count == 0:
            return np.zeros((0, max(S - 1, 0)), dtype=np.int64)
        at = np.zeros(1, dtype=np.int64)  # each partial split's state
        picks: list[tuple[np.ndarray, np.ndarray]] = []  # per stage: (parent row, end) of each partial split
        for s, (_, b, child) in enumerate(self.edges):
            row, e = self.expand(s, at)
            picks.append((row, b[e]))
            at = child[e]
        rows = np.arange(at.size)
        out = np.zeros((at.size, max(S - 1, 0)), dtype=np.int64)
        for s in range(S - 1, 0, -1):  # follow the parents back: the start of stage s is stage s-1's end
            parent, b = picks[s]
            rows = parent[rows]
            out[:, s - 1] = picks[s - 1][1][rows]
        return out

    def path(self, ends) -> list[int] | None:
        """The edges of the split whose stages end at ``ends`` (S units, the last ``n``), or
        ``None`` if it is not one of the tied splits."""
        state, out = 0, []
        for s, (_, b, child) in enumerate(self.edges):
            begin, deg = self.first[s]
            if state >= begin.size or deg[state] == 0:
                return None
            lo, hi = int(begin[state]), int(begin[state] + deg[state])
            i = lo + int(np.searchsorted(b[lo:hi], int(ends[s])))
            if i >= hi or b[i] != ends[s]:
                return None
            out.append(i)
            state = int(child[i])
        return out


def _op_columns(graph, S: int) -> np.ndarray:
    """``ndarray (len(graph.ops),)``: the column of each run-graph op's duration in a split's
    ``f (S) | b (S) | x (S - 1)`` (a transfer back, Y, takes its cut's X column)."""
    base = {"F": 0, "B": S, "X": 2 * S, "Y": 2 * S}
    return np.array([base[k] + i for k, i, _ in graph.ops], dtype=np.int64)


def run_times(problem: PartitionProblem, splits) -> np.ndarray:
    """The 1F1B-flush iteration time (seconds) of each split on the table's numbers, memory
    aside: the longest path through the run graph of M microbatches
    (:func:`pipeopt.problems.partition.events.event_graph`) with the split's op durations
    (:func:`pipeopt.problems.partition.events.op_prefixes`), for many splits at once - the
    loop of :func:`pipeopt.cost.schedule.makespan` over the ops, each step on a column of
    splits. ``ndarray (len(splits),)``; equal to :func:`pipeopt.problems.partition.events.run_time`
    of each split."""
    from .ops import event_graph, op_prefixes

    graph = event_graph(problem, "1f1b")
    a = op_prefixes(problem)
    S, n = problem.stages, problem.n
    col = _op_columns(graph, S)
    out = np.empty(len(splits))
    for lo in range(0, len(splits), RUN_BLOCK):
        block = np.asarray(splits[lo:lo + RUN_BLOCK], dtype=np.int64).reshape(-1, S - 1)
        p = np.zeros((len(block), S + 1), dtype=np.int64)
        p[:, S] = n
        p[:, 1:S] = block
        f = a["f_end"][p[:, 1:]] - a["f_begin"][p[:, :-1]]
        b = a["b_end"][p[:, 1:]] - a["b_begin"][p[:, :-1]]
        x = a["xfer"][p[:, 1:-1]]
        dur = np.concatenate([f, b, x], axis=1)[:, col].T.copy()  # (ops, splits)
        end = np.empty_like(dur)
        for q, after in enumerate(graph.after):
            if not after:
                end[q] = dur[q]
            elif len(after) == 1:
                np.add(end[after[0]], dur[q], out=end[q])
            else:
                np.maximum(end[after[0]], end[after[1]], out=end[q])
                for d in after[2:]:
                    np.maximum(end[q], end[d], out=end[q])
                end[q] += dur[q]
        out[lo:lo + len(block)] = end.max(axis=0) if len(end) else 0.0
    return out


BOUND_SLACK = 1e-9
"""Relative margin by which :class:`_LeastFirst` lowers its path sums: a path's time summed in
another order than the longest-path loop of :func:`run_times` may differ by a few ulps."""


def _fill_drain_paths(graph, S: int, M: int, col: np.ndarray) -> list[np.ndarray]:
    """For each stage ``s``, the run-graph path through microbatch 0's forward from stage 0 to
    ``s``, every op of stage ``s`` in its worker's order, then the last microbatch's backward
    back to stage 0 (the fill, the busy stage and the drain of the usual 1F1B formula), kept
    only if every op waits for the one before it in the graph: each as its count of ops per
    duration column (``f (S) | b (S) | x (S - 1)``, ``col[q]`` the column of op ``q``)."""
    index = {op: q for q, op in enumerate(graph.ops)}
    worker_ops: list[list] = [[] for _ in range(S)]  # each stage's F and B in the graph's order
    for op in graph.ops:
        if op[0] in ("F", "B"):
            worker_ops[op[1]].append(op)
    out = []
    for s in range(S):
        path = []
        for t in range(s):
            path += [("F", t, 0)] + ([("X", t, 0)] if ("X", t, 0) in index else [])
        path += worker_ops[s]
        for t in range(s - 1, -1, -1):
            path += ([("Y", t, M - 1)] if ("Y", t, M - 1) in index else []) + [("B", t, M - 1)]
        if not all(op in index for op in path):
            continue
        qs = [index[op] for op in path]
        if all(u in graph.after[v] for u, v in zip(qs, qs[1:])):
            out.append(np.bincount(col[qs], minlength=3 * S - 1).astype(float))
    return out


class _Paths:
    """Run-graph paths as lower bounds on a split's 1F1B-flush iteration time, and the exact
    timing of one split.

    A split's time is the longest path of the run graph (:func:`run_times`), so any one path's
    length bounds it, and that length is a sum over the stages of the stage's op durations
    (forward, backward, the transfer after it) times the path's count of such ops. ``paths``:
    those counts (ops per duration column ``f (S) | b (S) | x (S - 1)``), each once: at first,
    for each stage, the fill, that stage's every op and the drain (:func:`_fill_drain_paths`),
    then the longest path of every split :meth:`time` times. ``timed``: how many it timed."""

    def __init__(self, problem: PartitionProblem) -> None:
        from .ops import event_graph, op_prefixes

        S = problem.stages
        self.S, self.n = S, problem.n
        self.graph = graph = event_graph(problem, "1f1b")
        self.col = _op_columns(graph, S)
        self.prefix = op_prefixes(problem)
        self.paths: list[np.ndarray] = []
        self.known: set[bytes] = set()
        self.timed = 0
        for counts in _fill_drain_paths(graph, S, problem.instance.settings.microbatches, self.col):
            self.add(counts)

    def add(self, counts: np.ndarray) -> bool:
        """Keep a path's counts; False if it is known."""
        key = counts.tobytes()
        if key in self.known:
            return False
        self.known.add(key)
        self.paths.append(counts)
        return True

    def coefficients(self, first: int = 0) -> np.ndarray:
        """``ndarray (3S, K - first)``: the counts per duration column of the paths from
        ``first`` on, with a zero row for the last stage's transfer (there is none), so stage
        ``s`` reads rows ``s, S + s, 2S + s``."""
        C = np.zeros((3 * self.S, len(self.paths) - first))
        C[:3 * self.S - 1] = np.array(self.paths[first:]).T
        return C

    def time(self, ends) -> float:
        """Time the split whose stages 1..S-1 start at ``ends`` alone (the loop of
        :func:`run_times` on one split: the same floats), keep its longest path (:meth:`add`)
        and return its time (seconds)."""
        a, p = self.prefix, np.array([0, *np.asarray(ends).tolist(), self.n])
        d = np.concatenate([a["f_end"][p[1:]] - a["f_begin"][p[:-1]], a["b_end"][p[1:]] - a["b_begin"][p[:-1]],
                            a["xfer"][p[1:-1]]])
        dur = d[self.col].tolist()
        end = [0.0] * len(dur)
        via = [-1] * len(dur)
        for q, after in enumerate(self.graph.after):
            if after:
                u = after[0]
                top = end[u]
                for w in after[1:]:  # the first of the latest predecessors, as max() picks
                    if end[w] > top:
                        u, top = w, end[w]
                via[q] = u
                end[q] = top + dur[q]
            else:
                end[q] = dur[q]
        q = end.index(max(end))
        qs = [q]
        while via[q] >= 0:
            q = via[q]
            qs.append(q)
        self.timed += 1
        self.add(np.bincount(self.col[qs], minlength=3 * self.S - 1).astype(float))
        return end[qs[0]]


class _TooMany(Exception):
    """:class:`_LeastFirst` would time all of more than :data:`ENUM_SPLITS` tied splits (past
    its candidates), or extend more than :data:`FRONTIER` partial splits on a stage."""


class _LeastFirst:
    """The tied splits in the order of (:func:`run_times`, then lexicographic order): the order
    of timing them all, timing only the splits that could come first.

    A split's 1F1B-flush iteration time is the longest path of the run graph
    (:func:`run_times`), so the length of any one path of that graph is a lower bound on it, and
    that length is a sum over the stages of the stage's op durations (forward, backward, the
    transfer after it) times the path's count of such ops: a sum over the edges of the split's
    path in the graph of the tied splits (:class:`_TieStates`). With a set of run-graph paths
    (at first, for each stage, the fill, that stage's every op and the drain), each state's
    least completion along each path (a backward pass over the graph) bounds every split
    through a partial split: the largest over the paths of its length so far plus the least
    completion, lowered by :data:`BOUND_SLACK`.

    An upper bound ``t``: the least time of the proven split and of up to :data:`DIVES` splits
    reached by taking the edge of least bound at each stage (each timed alone: its longest path
    joins the set, :class:`_Paths`). The *candidates*, every tied split whose bound is at most
    ``t``, are found stage by stage, partial splits of larger bound dropped on the way; if a
    stage would keep more than ``4`` :data:`CANDIDATES` of them, the split least along each path
    is timed too and the pass repeated with room for :data:`FRONTIER`; while there are more than
    :data:`CANDIDATES` candidates, :data:`PROBES` of them, evenly spread, are timed alone and the
    candidates found again. Then all are timed at once: every split not among them is slower
    than ``t``, so the candidates of time at most ``t``, in order, are the first splits of the
    whole order. Past them the rest comes from timing every tied split (:func:`run_times`; at
    most :data:`ENUM_SPLITS`), which the second phase rarely needs. Up to :data:`ALL` tied
    splits, all are timed at once from the start. The proven split ``extra`` (float order aside
    it may fall outside the list) is one more split. ``timed``: how many split timings it took
    (alone or together). Raises :class:`_TooMany` past :data:`FRONTIER` or :data:`ENUM_SPLITS`.
    All of it is work on the instance, not on the clock: the same call times the same splits.
    """

    ALL = 256
    """Tied splits up to which all are timed at once: cheaper than the bounds."""

    CANDIDATES = 2048
    """Candidates above which the bounds are tightened before the candidates are timed."""

    PROBES = 8
    """Candidates timed alone per tightening round."""

    DIVES = 4
    """Splits of least bound at each stage timed alone before the candidates are found."""

    def __init__(self, problem: PartitionProblem, tie: _TieStates, extra: list[int]) -> None:
        self.problem, self.tie = problem, tie
        S, n = problem.stages, problem.n
        self.S, self.n = S, n
        mine = np.array(extra, dtype=np.int64)[None, :]
        self.extra = mine if tie.path([*extra, n]) is None else None  # the proven split, if not listed
        self.timed = 0
        self.given = 0
        t = math.inf
        if tie.count <= self.ALL:
            cands = tie.rows()
        else:
            self._setup()
            t = self._timed(mine[0])  # an upper bound, and the proven split's longest path
            seen = {mine.tobytes()}
            for _ in range(self.DIVES):
                dive = self._dive()
                if dive.tobytes() in seen:  # the same split again: the paths did not change
                    break
                seen.add(dive.tobytes())
                t = min(t, self._timed(dive))
            try:
                cands = self._below(t, min(FRONTIER, 4 * self.CANDIDATES))
            except _TooMany:  # weak bounds: the split least along each path too, then all the room
                for along in [self._dive(k) for k in range(len(self.bounds.paths))]:
                    if along.tobytes() not in seen:
                        seen.add(along.tobytes())
                        t = min(t, self._timed(along, refresh=False))
                self._weights()
                cands = self._below(t)
            while len(cands) > self.CANDIDATES:
                for i in np.linspace(0, len(cands) - 1, self.PROBES).round().astype(np.int64).tolist():
                    t = min(t, self._timed(cands[i], refresh=False))
                self._weights()
                fewer = self._below(t)
                stop = len(fewer) > 0.75 * len(cands)
                cands = fewer
                if stop:
                    break
        if self.extra is not None:
            cands = np.vstack([cands, self.extra])
        times = run_times(problem, cands)
        self.timed += len(cands)
        order = np.lexsort([*cands.T[::-1], times])
        order = order[times[order] <= t]
        self.first = (cands[order], times[order])

    def _setup(self) -> None:
        """The paths and the edges' op durations."""
        tie, S = self.tie, self.S
        self.bounds = _Paths(self.problem)
        a = self.bounds.prefix
        self.D = []  # per stage: each edge's forward, backward and transfer-after durations (E, 3)
        for s, (parent, b, _) in enumerate(tie.edges):
            lo = tie.starts[s][parent]
            x = a["xfer"][b] if s < S - 1 else np.zeros(b.size)
            self.D.append(np.stack([a["f_end"][b] - a["f_begin"][lo], a["b_end"][b] - a["b_begin"][lo], x], axis=1))
        self.W: list[np.ndarray] = []
        self.H: list[np.ndarray] = []
        self._weights()

    def _weights(self) -> None:
        """Each edge's length along every path (``W[s]``, (E, K)) and each state's least
        completion (``H[s]``, (states, K)): the columns of the paths added since the last call
        (a path's column depends on that path alone)."""
        S, K = self.S, len(self.bounds.paths)
        k0 = self.W[0].shape[1] if self.W else 0
        if k0 == K:
            return
        C = self.bounds.coefficients(k0)
        W = [self.D[s] @ C[[s, S + s, 2 * S + s]] for s in range(S)]
        H = [None] * (S + 1)
        H[S] = np.zeros((self.tie.starts[S].size, K - k0))
        for s in range(S - 1, -1, -1):
            _, _, child = self.tie.edges[s]
            begin, deg = self.tie.first[s]
            h = np.full((self.tie.starts[s].size, K - k0), np.inf)
            has = deg > 0
            if has.any():
                h[has] = np.minimum.reduceat(W[s] + H[s + 1][child], begin[has], axis=0)
            H[s] = h
        self.W, self.H = self._columns(self.W, W, K), self._columns(self.H, H, K)

    @staticmethod
    def _columns(old: list, new: list, K: int) -> list:
        """``old`` (views of their buffers' first columns) with the columns ``new`` after them:
        written into the buffers, which double when full (no copy of the old columns per path)."""
        out = []
        for o, x in zip(old or [None] * len(new), new):
            k0 = 0 if o is None else o.shape[1]
            buf = None if o is None else o.base
            if buf is None or buf.shape[1] < K:
                grown = np.empty((x.shape[0], max(16, 2 * K)))
                if k0:
                    grown[:, :k0] = o
                buf = grown
            buf[:, k0:K] = x
            out.append(buf[:, :K])
        return out

    def _dive(self, k: int | None = None) -> np.ndarray:
        """``ndarray (S - 1,)``: the tied split reached from the first state by taking, at each
        stage, the edge of least bound."""
        state, ends = 0, []
        g = np.zeros(len(self.bounds.paths))
        for s, (_, b, child) in enumerate(self.tie.edges):
            begin, deg = self.tie.first[s]
            lo, hi = int(begin[state]), int(begin[state] + deg[state])
            gs = g[None, :] + self.W[s][lo:hi]
            total = gs + self.H[s + 1][child[lo:hi]]
            j = int(np.argmin(total.max(axis=1) if k is None else total[:, k]))
            g, state = gs[j], int(child[lo + j])
            ends.append(int(b[lo + j]))
        return np.array(ends[:-1], dtype=np.int64)

    def _below(self, t: float, room: int | None = None) -> np.ndarray:
        """``ndarray (L, S - 1)``: every tied split whose bound is at most ``t``, in
        lexicographic order (partial splits of larger bound dropped stage by stage); raises
        :class:`_TooMany` past ``room`` partial splits on a stage (default :data:`FRONTIER`)."""
        S = self.S
        room = FRONTIER if room is None else room
        state = np.zeros(1, dtype=np.int64)
        g = np.zeros((1, len(self.bounds.paths)))
        ends = np.zeros((1, 0), dtype=np.int64)
        for s, (_, b, child) in enumerate(self.tie.edges):
            if self.tie.first[s][1][state].sum() > room:  # the bounds leave too many partial splits to extend
                raise _TooMany
            row, e = self.tie.expand(s, state)
            g = g[row] + self.W[s][e]
            keep = (g + self.H[s + 1][child[e]]).max(axis=1) * (1 - BOUND_SLACK) <= t
            e, g = e[keep], g[keep]
            state = child[e]
            ends = ends[row[keep]]
            if s < S - 1:
                ends = np.hstack([ends, b[e][:, None]])
        return ends

    def _timed(self, ends: np.ndarray, refresh: bool = True) -> float:
        """Time one split alone (:meth:`_Paths.time`); with ``refresh``, the bounds raised by
        its longest path at once (else at the caller's next :meth:`_weights`)."""
        known = len(self.bounds.paths)
        time = self.bounds.time(ends)
        self.timed += 1
        if refresh and len(self.bounds.paths) > known:
            self._weights()
        return time

    # -- the order -----------------------------------------------------------------------------
    def __iter__(self):
        rows, times = self.first
        for r, time in zip(rows.tolist(), times.tolist()):
            self.given += 1
            yield r, time
        if self.tie.count > ENUM_SPLITS:  # past the candidates, too many to time them all
            raise _TooMany
        rows = self.tie.rows()  # past the candidates: every tied split timed
        if self.extra is not None:
            rows = np.vstack([rows, self.extra])
        times = run_times(self.problem, rows)
        self.timed += len(rows)
        for i in np.lexsort([*rows.T[::-1], times])[self.given:].tolist():
            yield rows[i].tolist(), float(times[i])


def least_run(problem: PartitionProblem, starts: list[int], period: float, rec: dict,
              deadline: Deadline | None = None) -> list[int] | None:
    """The exact second phase when the graph of the tied splits is small: the tied splits
    (:func:`_tie_states` at ``period (1 + CAP_REL)``, plus float slack, each kept only if its
    :meth:`PartitionProblem.period` is at most ``period (1 + CAP_REL)``, checked in the order
    below up to the one returned) in the order of their :func:`run_times` (:class:`_LeastFirst`,
    which times only those that could come first), and the first of least iteration time (ties:
    the first in lexicographic order) that :func:`pipeopt.evaluate` finds feasible. ``rec`` (the
    phase's record) gets ``bound`` (the least iteration time on the table's numbers), ``status``
    ``"optimal"``, ``method`` ``"enumeration"``, ``splits`` (how many tied), ``timed`` (how many
    timed) and ``proven``; ``settle`` is called when the split changes. ``None`` if the graph
    exceeds its work limits or the order would handle too many splits at once
    (:class:`_TooMany`; nothing recorded)."""
    T = period * (1 + CAP_REL)
    tie = _tie_states(problem, T * (1 + CAP_REL))
    if tie is None:
        return None
    if deadline is not None:
        deadline.check("the tie-break's enumeration")
    inst = problem.instance
    chosen = list(starts)
    first = None
    try:
        order = _LeastFirst(problem, tie, list(starts))  # the proven split ties with itself (float order aside)
        for cand, time in order:
            first = time if first is None else first
            if cand == list(starts):
                break  # nothing better than the proven split
            if problem.period(cand) > T:  # the float slack admitted it: not tied
                continue
            ev = evaluate(inst, problem.plan(cand))
            if ev.feasible:
                if ev.iteration_time < rec["value"]:
                    chosen = cand
                    secondary.settle(rec, float(ev.iteration_time), ev)
                break
    except _TooMany:  # nothing settled yet: the candidates were passed over
        return None
    splits = tie.count + (order.extra is not None)
    rec.update(bound=float(first), status="optimal", method="enumeration", splits=splits,
               timed=order.timed, proven=True, unique=splits == 1)
    return chosen


SEARCH_NODES = 1_000
"""Most partial splits :func:`search_least` extends before it gives up: a work limit on the
instance, so the same call ends the same way on every run (tens of milliseconds at most, so
that an instance it cannot prove pays little: PipeDream's profiles at S = 4..16 prove in
377-749 nodes or need tens of thousands)."""

SEARCH_LEAVES = 48
"""Most splits :func:`search_least` times (each a walk over the run graph) before it gives up."""

SEARCH_PATHS = 64
"""Most run-graph paths :func:`search_least` bounds with."""


class _RangeMin:
    """The least row of ``values[lo..hi]`` (both ends included) for many ranges at once: a
    sparse table of ``log2(len)`` levels, each the least of two overlapping halves below."""

    def __init__(self, values: np.ndarray) -> None:
        self.levels = [values]
        width = 1
        while 2 * width <= len(values):
            prev = self.levels[-1]
            self.levels.append(np.minimum(prev[:len(prev) - width], prev[width:]))
            width *= 2

    def query(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """``ndarray (len(lo), ...)``: the least row over ``lo[i]..hi[i]`` (``inf`` where
        ``lo[i] > hi[i]``)."""
        empty = hi < lo
        lo, hi = np.where(empty, 0, lo), np.where(empty, 0, hi)
        level = np.floor(np.log2(hi - lo + 1)).astype(np.int64)
        out = np.full((len(lo), *self.levels[0].shape[1:]), np.inf)
        for j in np.flatnonzero(np.bincount(level)).tolist():  # the levels used (not np.unique: numpy.ma)
            rows = np.flatnonzero(level == j)
            table = self.levels[j]
            out[rows] = np.minimum(table[lo[rows]], table[hi[rows] - (1 << j) + 1])
        out[empty] = np.inf
        return out


def search_least(problem: PartitionProblem, starts: list[int], period: float, rec: dict,
                 deadline: Deadline | None = None) -> list[int] | None:
    """The exact second phase past the enumeration's limits: :func:`least_run`'s answer (the
    split of least 1F1B-flush iteration time, ties: the first in lexicographic order, among
    the tied splits whose period and :func:`pipeopt.evaluate` pass; the proven split
    ``starts`` unless one comes before it) by a depth-first branch and bound over partial
    splits instead of a list.

    A partial split (stages ``0..s-1``) is extended by a stage ``s`` of units ``a..b-1`` as
    :func:`tied_splits` extends it (:class:`_Extension`: memory reach, cut bounds, the window rows of
    :func:`pipeopt.cost.rules.window_step` at ``period (1 + CAP_REL)``, plus float slack), so
    every tied split is a leaf. Bounds (:class:`_Paths`): a partial split's length along each
    path so far plus the least completion along it, a DP over (stage, start unit) with the
    window rows left out (a relaxation: below every completion that keeps them), each
    stage's least over its interval of ends read from a sparse table (:class:`_RangeMin`); the
    largest over the paths, lowered by :data:`BOUND_SLACK`. A partial split whose bound exceeds
    the incumbent's time is dropped; a leaf is timed exactly (its longest path joins the
    bounds, up to :data:`SEARCH_PATHS` paths) and replaces the incumbent if it comes before it
    in the order (time, then ends) and passes the period and :func:`pipeopt.evaluate`. The
    incumbent starts as ``starts``; children are taken least bound first.

    Returns ``None`` past :data:`SEARCH_NODES` partial splits or :data:`SEARCH_LEAVES` timed
    splits (nothing recorded; the caller goes on to the descent), else the split, with ``rec`` filled as :func:`least_run` fills it
    (``method`` ``"search"``, ``nodes`` the partial splits extended, ``timed``)."""
    T = period * (1 + CAP_REL)
    cap = T * (1 + CAP_REL)
    S, n, inst = problem.stages, problem.n, problem.instance
    paths = _Paths(problem)
    pre = paths.prefix
    ext = _Extension(problem, cap)
    units = np.arange(n + 1)

    def completions(C: np.ndarray):
        """Per stage s, each path k's length over units a..b-1 is ``ending[s][b, k] -
        beginning[s][a, k]``; ``H[s][a, k]``: the least length along path k of stages s..S-1
        from unit a."""
        ending, beginning = [], []
        for s in range(S):
            x = pre["xfer"][:, None] * C[2 * S + s] if s < S - 1 else 0.0
            ending.append(pre["f_end"][:, None] * C[s] + pre["b_end"][:, None] * C[S + s] + x)
            beginning.append(pre["f_begin"][:, None] * C[s] + pre["b_begin"][:, None] * C[S + s])
        H = [None] * (S + 1)
        H[S] = np.full((n + 1, C.shape[1]), np.inf)
        H[S][n] = 0.0
        for s in range(S - 1, -1, -1):
            later = ending[s] + H[s + 1]
            later[~ext.link_ok] = np.inf
            H[s] = _RangeMin(later).query(np.minimum(ext.first_end(s, units), n), ext.top[s]) - beginning[s]
        return ending, beginning, H

    best = [int(c) for c in starts]
    best_time = paths.time(best)
    least = best_time  # the least time of any tied split timed: the phase's bound at the end
    C = paths.coefficients()
    ending, beginning, H = completions(C)
    nodes = 0
    # depth first; each entry: (bound, stage, start unit, window state G, ends so far, lengths so far)
    stack = [(0.0, 0, 0, -math.inf, (), np.zeros(C.shape[1]))] if ext.link_ok[0] else []
    while stack:
        key, s, a, G, ends, g = stack.pop()
        if key > best_time:  # the incumbent improved since it was pushed
            continue
        nodes += 1
        if nodes > SEARCH_NODES:
            return None
        if deadline is not None and nodes % 256 == 0:
            deadline.check("the tie-break's search")
        if g.size < C.shape[1]:  # paths were added since: its lengths along them
            p = [0, *ends]
            g = sum((ending[t][p[t + 1]] - beginning[t][p[t]] for t in range(s)), np.zeros(C.shape[1]))
        cols, Gs, ok = ext.ends(s, np.array([a]), np.array([G]))
        b, Gb = cols[ok[0]], Gs[0][ok[0]]
        if not b.size:
            continue
        gb = g[None, :] + (ending[s][b] - beginning[s][a])
        keys = (gb + H[s + 1][b]).max(axis=1) * (1 - BOUND_SLACK)
        keep = keys <= best_time
        b, Gb, gb, keys = b[keep], Gb[keep], gb[keep], keys[keep]
        if not b.size:
            continue
        if s == S - 1:  # the last stage ends at n: a whole split
            cand = list(ends)
            if paths.timed >= SEARCH_LEAVES:
                return None
            known = len(paths.paths)
            time = paths.time(cand)
            least = min(least, time)
            if len(paths.paths) > known and known < SEARCH_PATHS:
                C = paths.coefficients()
                ending, beginning, H = completions(C)
            if (time, cand) < (best_time, best) and problem.period(cand) <= T and evaluate(inst, problem.plan(cand)).feasible:
                best, best_time = cand, time
            continue
        for i in np.lexsort((-b, -keys)).tolist():  # pushed so that the least bound, then the least end, pops first
            stack.append((float(keys[i]), s + 1, int(b[i]), float(Gb[i]), (*ends, int(b[i])), gb[i]))
    chosen = [int(c) for c in starts]
    if best != chosen:  # as least_run: the first in the order, if evaluate finds it faster than the proven split
        ev = evaluate(inst, problem.plan(best))
        if ev.iteration_time < rec["value"]:
            chosen = best
            secondary.settle(rec, float(ev.iteration_time), ev)
    rec.update(bound=float(min(least, best_time)), status="optimal", method="search", nodes=nodes,
               timed=paths.timed, proven=True)
    return chosen
