"""Exact split search for a fixed order: branch and bound over the chunk boundaries, path bounds.

With the order of every action fixed (a torch schedule, the schedule's own W places) the split
alone decides the operations' durations, and the iteration time is the longest path through the
fixed graph of operations (:func:`pipeopt.schedules.schedule_graph`; what the executor measures).
A path's length is a sum over the chunks of the path's count of each operation kind times the
chunk's duration of that kind (:func:`stage_tables`: F, B, I, W of the units ``a..b-1``, the
transfers each op carries without overlap, the transfer over each cut between ranks with
overlap). For one path ``P`` (its counts ``N_P``, :func:`path_counts`) the split of least length
is a shortest path over the boundaries, an exact DP in ``O(S n^2)``, and for every split

    iteration time(split) >= length_P(split) >= min over splits of length_P,

so every path, and every convex combination of paths, gives a valid lower bound; and for a split
whose first k boundaries are fixed, ``length_P(prefix) + suffix_P(k, b_k)`` (the DP's least
completion) bounds every completion. :func:`search` is a depth-first branch and bound over the
boundaries ``b_1 < ... < b_{S-1}``: a node (the first k boundaries) is pruned when its bound, the
largest over the path set, reaches the incumbent; a complete split is run by the executor (the
single evaluation: memory checked) and the critical path of its run joins the path set (a cut
generated where the set was not tight). A chunk interval whose activations and parameters alone
break a memory row of its rank (the schedule MILP's rows, :func:`.model.memory_terms`, a
relaxation) is never branched on. Children are visited least bound first. When the tree is
exhausted the incumbent is optimal (up to :data:`TOLERANCE`); when it stops at its node limit or
its deadline, the least bound over the open nodes (and the incumbent) is a valid lower bound.

The LP relaxation of the event-time MILP gives a path set one more member: the duals of its
duration rows are a convex combination of paths' counts (:func:`lp_weights`), whose least length
over splits is at least the LP's value, so the search starts from the MILP's root bound.

Supported: a fixed order with the schedule's W places, no recomputation, no data parallelism
(:func:`supported`). ``tests/problems/schedule/test_split_search.py`` checks the search against
:func:`.exhaustive.exhaustive` and every bound below the exhaustive optimum.

What it does not do (measured, ``benchmarks/schedule_exact.py --fixed-orders``, notes in
``benchmarks/results/notes/schedule_exact.md``): prove torch's two-chunk orders at p = 8, m = 16.
A node's bound (the largest over the set of each path's own best completion) lets every path
dodge on its own; the open nodes' least bound stays at the root's (the LP value) for millions of
nodes, so the search is not called by :func:`.milp.solve_milp`; it is an exact method for small
chains and the measurement of where the MILP's gaps come from.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ...backends.deadline import Deadline
from ...cost import rules
from ...errors import InvalidProblemError
from ...result import Result
from ...schedules import schedule_graph
from .model import memory_scale
from .problem import ScheduleProblem

__all__ = ["KINDS", "TOLERANCE", "SplitTables", "lp_weights", "path_counts", "search", "solve_split_search",
           "stage_tables", "supported"]

KINDS = ("F", "B", "I", "W", "X")
"""The duration kinds of a path's counts: F, B, I, W per chunk; X the transfers (both
directions) over the cut after the chunk."""

TOLERANCE = 1e-9
"""Relative: a node is pruned when its bound is at least the incumbent times ``1 - TOLERANCE``
(an exhausted tree proves the incumbent within it)."""


DUAL_SHRINK = 1e-6
"""Relative amount the LP's dual weights are lowered by before they bound (:func:`lp_weights`)."""


def supported(problem: ScheduleProblem) -> bool:
    """True if :func:`search` models ``problem``: a fixed order (not the free one) with the
    schedule's W places, ``recompute="none"`` and no data parallelism (ZeRO's terms)."""
    return (not problem.is_free and problem.w_placement == "schedule" and problem.recompute == "none"
            and not problem.instance.settings.data_parallel)


def stage_tables(problem: ScheduleProblem) -> np.ndarray:
    """``ndarray (S, 5, n+1, n+1)`` of seconds: ``T[s, k, a, b]`` is the duration of one op of
    kind ``KINDS[k]`` of chunk s when it covers units ``a..b-1`` - F, B, I, W from
    :attr:`ScheduleProblem.prefixes`, with the transfer each carries without overlap
    (:func:`pipeopt.cost.rules.carried`: F the send over the cut after it, B and I the one
    before it, across ranks) - and for ``X`` the transfer of one microbatch over the cut at b
    (with overlap, across ranks; 0 otherwise): what :func:`.model.chunk_durations` gives a whole
    split, per chunk and interval. Entries with ``b <= a`` are ``inf``."""
    P, S, n = problem.prefixes, problem.S, problem.n
    sched = problem.schedule
    overlap = problem.instance.settings.overlap
    cross = [sched.placement[c] != sched.placement[c + 1] for c in range(S - 1)]
    send = P["send"]
    # per cut c: the transfer over it when it sits at unit b (x: indexed by the chunk's end, y: by its start)
    x = [send[None, :] if cross[c] else np.zeros((1, n + 1)) for c in range(S - 1)]
    y = [send[:, None] if cross[c] else np.zeros((n + 1, 1)) for c in range(S - 1)]
    diff = {k: P[k][None, :] - P[k][:, None] for k in ("F", "B", "I", "W")}
    bad = ~np.triu(np.ones((n + 1, n + 1), dtype=bool), 1)
    out = np.zeros((S, len(KINDS), n + 1, n + 1))
    for s in range(S):
        f, b = rules.carried(s, S, diff["F"], diff["B"], x, y, overlap)
        i = rules.carried(s, S, 0.0, diff["I"], x, y, overlap)[1]
        out[s, 0], out[s, 1], out[s, 2], out[s, 3] = f, b, i, diff["W"]
        if s < S - 1 and overlap and cross[s]:
            out[s, 4] = send[None, :]
    out[:, :, bad] = np.inf
    return out


def path_counts(problem: ScheduleProblem, graph, durations: np.ndarray) -> tuple[float, np.ndarray]:
    """The longest path through ``graph`` (:class:`pipeopt.cost.schedule.RunGraph`, ops in a
    topological order) when its ops last ``durations`` seconds, and its counts: ``ndarray
    (S, 5)``, per chunk how many ops of each kind of :data:`KINDS` it holds (X and Y over cut c
    counted at chunk c). Returns ``(length, counts)``."""
    ops, after = graph.ops, graph.after
    end = np.zeros(len(ops))
    pred = np.full(len(ops), -1)
    for q, deps in enumerate(after):
        best, arg = 0.0, -1
        for a in deps:
            if end[a] > best:
                best, arg = end[a], a
        end[q] = best + durations[q]
        pred[q] = arg
    q = int(np.argmax(end))
    length = float(end[q])
    counts = np.zeros((problem.S, len(KINDS)))
    col = {k: j for j, k in enumerate(KINDS)}
    col["Y"] = col["X"]
    while q >= 0:
        k, i, _ = ops[q]
        counts[i, col[k]] += 1
        q = int(pred[q])
    return length, counts


class SplitTables:
    """The search's data for one problem: the stage tables (:func:`stage_tables`), each chunk's
    memory-admissible intervals, the run graph, and the path set with its DP suffix tables.

    Parameters
    ----------
    problem
        A :class:`ScheduleProblem` that :func:`supported` accepts.
    """

    def __init__(self, problem: ScheduleProblem):
        self.problem = problem
        S, n = problem.S, problem.n
        self.T = stage_tables(problem)
        self.graph = schedule_graph(problem.schedule, overlap=problem.instance.settings.overlap).graph
        col = {k: j for j, k in enumerate(KINDS)}
        col["Y"] = col["X"]
        self._op_index = np.array([[i, col[k]] for k, i, _ in self.graph.ops], dtype=int)
        self.ok = self._memory_intervals()
        self._rank_rows()
        self.T[~np.broadcast_to(self.ok[:, None], self.T.shape)] = np.inf
        self.counts = np.zeros((0, S, len(KINDS)))
        self.suffix = np.zeros((0, S + 1, n + 1))
        self._keys: set = set()

    def _memory_intervals(self) -> np.ndarray:
        """``ndarray (S, n+1, n+1)`` of bool: chunk s may cover ``a..b-1`` - its own activations
        times its largest count in flight and its parameter copies fit its rank's memory row
        (:func:`.model.memory_terms` with the other chunks' terms, >= 0, left out), and the
        interval leaves room for the other chunks (at least one unit each)."""
        pr = self.problem
        S, n, sched, P = pr.S, pr.n, pr.schedule, pr.prefixes
        a_idx, b_idx = np.arange(n + 1)[:, None], np.arange(n + 1)[None, :]
        ok = np.zeros((S, n + 1, n + 1), dtype=bool)
        most = [0] * S
        for r in range(sched.ranks):
            for counts in sched.activation_profile(r) or ():
                for s, c in zip(sched.stages_on(r), counts, strict=True):
                    most[s] = max(most[s], c)
        scale, limit = memory_scale(pr)
        act = (P["act"][None, :] - P["act"][:, None]) * scale
        par = (P["param"][None, :] - P["param"][:, None]) * scale
        for s in range(S):
            room = (a_idx >= s) & (b_idx <= n - (S - 1 - s)) & (b_idx > a_idx)
            if s == 0:
                room &= a_idx == 0
            if s == S - 1:
                room &= b_idx == n
            if math.isfinite(pr.capacity):
                room &= most[s] * act + sched.parameter_copies * par <= limit
            ok[s] = room
        return ok

    def _rank_rows(self) -> None:
        """The memory rows of each rank (:func:`.model.memory_terms`): per stage s, its rank's count
        vectors' column of s (``self.rows[s]``, ``ndarray (q,)``) and the rank's other stages with
        their columns, to check a rank's fixed chunks together."""
        pr = self.problem
        sched, P = pr.schedule, pr.prefixes
        scale, self.limit = memory_scale(pr)
        self.act = (P["act"][None, :] - P["act"][:, None]) * scale
        self.par = (P["param"][None, :] - P["param"][:, None]) * scale * sched.parameter_copies
        self.col: dict = {}
        self.mates: dict = {}
        for r in range(sched.ranks):
            mine = list(sched.stages_on(r))
            Q = np.array(sched.activation_profile(r) or [(0,) * len(mine)], dtype=float)
            for j, s in enumerate(mine):
                self.col[s] = Q[:, j]
                self.mates[s] = [(t, Q[:, i]) for i, t in enumerate(mine) if t < s]
        self.finite = math.isfinite(pr.capacity)

    def rank_fits(self, k: int, bs, a: int) -> np.ndarray:
        """``ndarray (n+1,)`` of bool: chunk k covering ``a..b-1`` (per b), with its rank's earlier
        chunks at their boundaries ``bs``, keeps every memory row of the rank (the later chunks'
        terms, >= 0, left out): a relaxation of the rows, which relax the executor's rule."""
        if not self.finite or not self.mates[k]:
            return np.ones(self.problem.n + 1, dtype=bool)
        used = sum(col * self.act[bs[t], bs[t + 1]] + self.par[bs[t], bs[t + 1]] for t, col in self.mates[k])
        need = used[:, None] + self.col[k][:, None] * self.act[a][None, :] + self.par[a][None, :]
        return (need <= self.limit).all(axis=0)

    def durations(self, starts) -> np.ndarray:
        """Seconds of every op of the run graph for the split ``starts``."""
        b = np.array([0, *starts, self.problem.n])
        s, k = self._op_index[:, 0], self._op_index[:, 1]
        return self.T[s, k, b[s], b[s + 1]]

    def add_path(self, counts: np.ndarray) -> bool:
        """Add a path (its counts, :func:`path_counts`) and its suffix table; False if known."""
        key = counts.tobytes()
        if key in self._keys:
            return False
        self._keys.add(key)
        S, n = self.problem.S, self.problem.n
        suf = np.full((S + 1, n + 1), np.inf)
        suf[S, n] = 0.0
        for s in range(S - 1, -1, -1):
            with np.errstate(invalid="ignore"):
                cost = np.where(self.ok[s], np.tensordot(counts[s], self.T[s], axes=(0, 0)), np.inf)
            suf[s] = np.min(cost + suf[s + 1][None, :], axis=1)
        self.counts = np.concatenate([self.counts, counts[None]])
        self.suffix = np.concatenate([self.suffix, suf[None]])
        return True

    def root_bound(self) -> float:
        """The largest over the path set of its least length over splits (seconds)."""
        return float(self.suffix[:, 0, 0].max(initial=0.0))

    def best_split(self, j: int) -> list[int] | None:
        """The split of least length of path ``j`` (the DP's argmin; ``None`` if none)."""
        S, n = self.problem.S, self.problem.n
        if not math.isfinite(self.suffix[j, 0, 0]):
            return None
        out, a = [], 0
        for s in range(S - 1):
            with np.errstate(invalid="ignore"):
                step = np.where(self.ok[s, a], self.counts[j, s] @ self.T[s, :, a, :], np.inf)
            cost = step + self.suffix[j, s + 1]
            a = int(np.argmin(cost))
            out.append(a)
        return out


def search(problem: ScheduleProblem, *, deadline: Deadline | None = None, node_limit: int | None = None,
           incumbent=None, value: float = math.inf, rounds: int = 3, tables: SplitTables | None = None,
           paths=()) -> dict:
    """Depth-first branch and bound over the boundaries (module docstring).

    Parameters
    ----------
    problem
        A :class:`ScheduleProblem` that :func:`supported` accepts.
    deadline
        Stops (with a valid bound) when it passes; default none.
    node_limit
        Stops after this many nodes (each node: one boundary fixed); default none.
    incumbent, value
        A split (starts) and its executor's time (``inf`` if none) to start from.
    rounds
        Rounds of the path generation at the root: each path's least split is run and its
        critical path added.
    tables
        A :class:`SplitTables` of ``problem`` to use (and extend); default a new one.
    paths
        Counts (``ndarray (S, 5)``, >= 0) of paths or of convex combinations of paths (e.g. the
        weights of the LP relaxation's dual, :func:`lp_weights`) to add to the set first.

    Returns
    -------
    dict
        ``starts`` (the best split found, or ``None``), ``value`` (its executor time, seconds;
        ``inf`` if none fits), ``bound`` (a valid lower bound on every split's time, seconds;
        ``value`` when ``complete``), ``complete`` (the tree was exhausted), ``nodes``,
        ``leaves`` (splits run by the executor), ``paths``, ``root_bound`` (the path set's bound
        before the tree, seconds).

    Raises
    ------
    InvalidProblemError
        If :func:`supported` is False.
    """
    if not supported(problem):
        raise InvalidProblemError("split search needs a fixed order with its own W places,"
                                  " recompute='none' and no data parallelism")
    deadline = Deadline(None) if deadline is None else deadline
    tab = SplitTables(problem) if tables is None else tables
    S, n = problem.S, problem.n
    best = None if incumbent is None else list(incumbent)
    best_value = float(value)
    leaves = 0
    for counts in paths:
        tab.add_path(np.asarray(counts, dtype=float))

    def run(starts) -> float:
        """The executor's time of ``starts`` (``inf`` over memory); its critical path joins the set."""
        nonlocal best, best_value, leaves
        leaves += 1
        ex = problem.execute(starts)
        length, counts = path_counts(problem, tab.graph, tab.durations(starts))
        tab.add_path(counts)
        t = ex.time if ex.feasible else math.inf
        if t < best_value:
            best, best_value = list(starts), t
        return t

    if best is not None:
        run(best)
    else:  # one path to start from: the uniform split's critical path (valid whether or not it fits)
        from .problem import uniform_starts

        run(uniform_starts(n, S))
    for _ in range(rounds):  # path generation at the root: each path's own best split
        fresh = 0
        for j in range(len(tab.counts)):
            cand = tab.best_split(j)
            if cand is not None and not deadline.expired():
                before = len(tab.counts)
                run(cand)
                fresh += len(tab.counts) > before
        if not fresh:
            break
    root = tab.root_bound()
    # stack entries: (bound, k, boundaries b_0..b_k, prefix lengths per path (may lag the set))
    stack = [(root, 0, (0,), np.zeros(len(tab.counts)))]
    nodes = 0
    stopped = False
    while stack:
        if (node_limit is not None and nodes >= node_limit) or (nodes % 64 == 0 and deadline.expired()):
            stopped = True
            break
        bound, k, bs, pre = stack.pop()
        if bound >= best_value * (1 - TOLERANCE):
            continue
        nodes += 1
        npaths = len(tab.counts)
        if len(pre) < npaths:  # paths added since the node was pushed: their prefix lengths
            extra = np.zeros(npaths - len(pre))
            for s in range(k):
                extra += tab.counts[len(pre):, s] @ tab.T[s, :, bs[s], bs[s + 1]]
            pre = np.concatenate([pre, extra])
        a = bs[-1]
        if k == S - 1:  # the last chunk ends at n: a complete split
            run(list(bs[1:]))
            continue
        with np.errstate(invalid="ignore"):
            admit = tab.ok[k, a] & tab.rank_fits(k, bs, a)
            step = np.where(admit[None, :], tab.counts[:, k] @ tab.T[k, :, a, :], np.inf)  # (paths, n+1)
        child_pre = pre[:, None] + step
        bounds = np.max(child_pre + tab.suffix[:, k + 1, :], axis=0)
        cand = np.flatnonzero(bounds < best_value * (1 - TOLERANCE))
        for b in cand[np.argsort(-bounds[cand], kind="stable")]:  # least bound popped first
            stack.append((float(bounds[b]), k + 1, (*bs, int(b)), child_pre[:, b]))
    complete = not stopped
    if complete:
        bound = best_value
    else:
        bound = min([best_value, *(e[0] for e in stack)])
        bound = max(bound, root) if root <= best_value else bound
    return {"starts": best, "value": best_value, "bound": float(bound), "complete": complete, "nodes": nodes,
            "leaves": leaves, "paths": len(tab.counts), "root_bound": root}


def solve_split_search(problem: ScheduleProblem, *, time_limit: float | None = 60.0,
                       node_limit: int | None = None, hint=None, weights: bool = True, **_) -> Result:
    """:func:`search` as a method: the split of least iteration time of ``problem``'s fixed order.

    Parameters
    ----------
    problem
        :class:`ScheduleProblem` (:func:`supported`).
    time_limit, node_limit
        Seconds (``None``: none) and nodes; the search stops at either with a valid bound.
    hint
        Starts of a split to start from (else the uniform and work-balanced splits).
    weights
        Add the LP relaxation's path weights (:func:`lp_weights`) to the path set first.

    Returns
    -------
    Result
        Method ``"split_search"``; status ``"optimal"`` when the tree was exhausted (bound = the
        executor's time), ``"time_limit"`` (at the deadline or the node limit) with the least open
        bound, or ``"infeasible"`` when no split fits. ``info``: ``nodes``, ``leaves``, ``paths``,
        ``root_bound``, ``lp_bound`` (seconds), ``complete``.
    """
    from .milp import work_balanced_starts
    from .problem import uniform_starts

    started = time.perf_counter()
    deadline = Deadline.of(time_limit)
    cands = [problem.check_starts(hint)] if hint is not None else []
    cands += [uniform_starts(problem.n, problem.S), work_balanced_starts(problem)]
    scored = min(((problem.value(c), c) for c in cands), key=lambda t: t[0])
    lp = lp_weights(problem, deadline=deadline) if weights else None
    out = search(problem, deadline=deadline, node_limit=node_limit, incumbent=scored[1], value=scored[0],
                 paths=() if lp is None else (lp[1],))
    info = {k: out[k] for k in ("nodes", "leaves", "paths", "root_bound", "complete")}
    info["lp_bound"] = None if lp is None else lp[0]
    if out["starts"] is None or not math.isfinite(out["value"]):
        if out["complete"]:
            return problem.result("split_search", None, "infeasible", lower_bound=math.inf, started=started,
                                  info=info)
        return problem.result("split_search", None, "time_limit", lower_bound=out["bound"], started=started,
                              info=info)
    status = "optimal" if out["complete"] else "time_limit"  # at the node limit too (info["nodes"])
    return problem.result("split_search", out["starts"], status, lower_bound=min(out["bound"], out["value"]),
                          started=started, info=info)



def lp_weights(problem: ScheduleProblem, *,
               deadline: Deadline | None = None) -> tuple[float, np.ndarray] | None:
    """The LP relaxation of the event-time MILP (:func:`.milp.build_milp`, every variable
    continuous, solved by HiGHS) and the path weights its dual gives: the duals of the rows that
    tie each chunk's F, B, I, W duration (and each cut's transfer) to the split are a convex
    combination of paths' counts (the longest-path rows' dual is a unit flow through the graph),
    so ``min over splits`` of that combination's length (a path of :class:`SplitTables`,
    :func:`search`'s ``paths``) is at least the LP's value.

    Returns
    -------
    (value, counts) or None
        The LP optimum (seconds) and ``ndarray (S, 5)`` (>= 0), or ``None`` if the LP did not
        solve (or no memory row leaves a split).
    """
    import pulp

    from ...backends.scaling import model_unit
    from .milp import _TIME_SCALE, build_milp, work_balanced_starts

    deadline = Deadline(None) if deadline is None else deadline
    ex = problem.execute(work_balanced_starts(problem))
    unit = model_unit(ex.time, _TIME_SCALE)
    lp, _ = build_milp(problem, unit, deadline=deadline)
    if lp is None:
        return None
    for var in lp.variables():
        var.cat = pulp.LpContinuous
    # in-process (the door, backends/pulp.py, reads no duals): an LP of a few thousand rows, HiGHS's own limit
    left = deadline.remaining()
    lp.solve(pulp.HiGHS(msg=False, **({} if math.isinf(left) else {"timeLimit": max(left, 0.1)})))
    if pulp.LpStatus[lp.status] != "Optimal":
        return None
    counts = np.zeros((problem.S, len(KINDS)))
    for j, kind in enumerate(("F", "B", "I", "W")):
        for s in range(problem.S):
            row = lp.constraints.get(f"dur_{kind}_{s}_def")
            if row is not None and row.pi is not None:
                counts[s, j] = abs(row.pi)
    for c in range(problem.S - 1):
        row = lp.constraints.get(f"dur_X_{c}_def")
        if row is not None and row.pi is not None:
            counts[c, 4] = abs(row.pi)
    # the duals hold to HiGHS's tolerances: the weights are taken DUAL_SHRINK lower (smaller only weakens)
    return float(pulp.value(lp.objective)) * unit, counts * (1 - DUAL_SHRINK)
