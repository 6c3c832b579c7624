"""Free W placement: the split and the place of every weight gradient W, exactly, in one MILP.

With ``ScheduleProblem(..., w_placement="free")`` every rank keeps the schedule's order of its
non-W steps (F, I, B and fused steps) and each W(s, j) goes into one *gap* of its rank at or
after the step of its I (:mod:`pipeopt.schedules.w_gaps`: the gap is the whole decision, the
W's of one chunk keep the order of their I's without loss). The model is the event-time MILP
of :mod:`.milp` (the same split binaries and duration variables,
:func:`~.model.split_and_durations`, and the same longest-path rows,
:func:`pipeopt.problems.run_rows.add_run_rows`, on the schedule's operations without its W's)
plus, per rank r with non-W steps ``0..K-1`` and per W w of chunk s:

* cumulative gap binaries ``z[w, g] = 1[gap(w) <= g]`` for ``g = lo_w .. K-2`` (``lo_w``: the
  step of its I; ``z[w, K-1] = 1``), monotone in g; per chunk, a W is placed no earlier than
  the W of the previous I: ``z[w', g] <= z[w, g]``;
* the time W w adds to gap g, ``b[w, g] >= dW_s - M_s (1 - x[w, g])``, ``b >= 0``, with
  ``x[w, g] = z[w, g] - z[w, g - 1]`` and ``M_s`` the longest W a chunk can have (big-M: the
  W's duration depends on the split); ``sum_g b[w, g] >= dW_s`` (valid, tightens the LP);
* the rank's order: the first action of step g + 1 starts after the last action of step g
  ends plus the W's of gap g, ``t_{g+1} >= t_g + d_g + sum_w b[w, g]``, and
  ``Z >= t_{K-1} + d_{K-1} + sum_w b[w, K-1]``; also ``Z >=`` the rank's total work;
* **memory** (when the device has a finite capacity): the schedule's rule
  (:mod:`pipeopt.schedules.actions`: a microbatch's activations stay from its F to its W, or
  its B), at every F of the rank: ``sum_s (c_s act_s - sum_{w of s} act_s z[w, g - 1]) +
  copies param <= limit`` with ``c_s`` the F's minus the B's of chunk s so far (constants: the
  order of the non-W steps is fixed) and the products ``act_s z`` linearised by
  ``q <= act_s``, ``q <= A_s z`` (``A_s``: the most activation bytes a chunk can have); the
  rows are :func:`~.model.memory_terms` less the q's. A deferred W thus keeps its microbatch's
  activations - the existing rule, no new term.

For a fixed split and placement the least Z is the executor's iteration time of the order
:func:`~pipeopt.schedules.w_gaps.place_w` builds (the tests check the claimed objective equals
:func:`pipeopt.schedules.run_schedule` of that order, and equals the brute force of
:func:`.exhaustive.exhaustive` over every split and every placement on small instances).
Size: per rank about ``(v m) (2 v m)`` gap binaries and as many b's (and q's with memory):
the big-M rows are weak, so proofs stop at small p, v, m (docs/results/w_placement.md).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ...backends.deadline import Deadline
from ...cost.schedule import RunGraph
from ...schedules import Schedule, schedule_graph
from ...schedules.w_gaps import place_w, rank_gaps, schedule_gaps
from ..run_rows import add_run_rows
from .model import memory_scale, memory_terms, merged, split_and_durations, split_values
from .problem import SOLVER, ScheduleProblem

__all__ = ["build_free_milp", "free_start_values", "read_order"]


def _widest(arr: np.ndarray, n: int, S: int) -> float:
    """The largest ``arr[b] - arr[a]`` over chunks of at most ``n - S + 1`` units (a
    non-decreasing prefix array): the most a chunk can hold."""
    w = n - S + 1
    return float(np.max(arr[w:] - arr[:-w])) if n >= w else 0.0


def _base_graph(schedule: Schedule, gaps: tuple, overlap: bool) -> tuple[RunGraph, dict]:
    """The schedule's operations without its W's and without the rank-order edge between two
    consecutive non-W steps (the model writes that edge with the gap's W's): built from the
    schedule with every W moved to the end of its rank (whatever the W's place, the other
    operations and their data and link dependencies are the same). Returns the graph and
    ``{op: position}``."""
    base = place_w(schedule, [[rg.gaps - 1] * len(rg.ws) for rg in gaps], gaps)
    sg = schedule_graph(base, overlap=overlap)
    ops = sg.graph.ops
    index = {op: q for q, op in enumerate(ops)}
    drop = {}
    for rg in gaps:
        for g in range(rg.gaps - 1):
            drop[index[rg.steps[g + 1][0]]] = index[rg.steps[g][-1]]
    keep = [q for q, op in enumerate(ops) if op[0] != "W"]
    new = {q: i for i, q in enumerate(keep)}
    after = [tuple(new[a] for a in sg.graph.after[q] if a != drop.get(q)) for q in keep]
    graph = RunGraph([ops[q] for q in keep], after)
    return graph, {op: i for i, op in enumerate(graph.ops)}


def build_free_milp(problem: ScheduleProblem, unit: float, *, exclude=(), deadline: Deadline | None = None):
    """Build the free-W-placement MILP (module docstring).

    Parameters
    ----------
    problem
        :class:`ScheduleProblem` with ``w_placement="free"``.
    unit
        Seconds per unit of the solver's time values.
    exclude
        Splits cut off by no-good rows (every placement of them).
    deadline
        Building stops with :class:`~pipeopt.backends.deadline.DeadlineReached` when it passes.

    Returns
    -------
    (lp, v)
        The PuLP problem (``None`` if a memory row is false on constants) and its variables:
        those of :func:`~.model.split_and_durations`, ``"t"`` per op of ``v["graph"]``,
        ``"z"`` (per rank, per W, ``{gap: variable}``), ``"b"`` (``{(rank, w, gap): var}``),
        ``"q"``, ``"gaps"`` (:func:`~pipeopt.schedules.w_gaps.rank_gaps`).
    """
    deadline = Deadline(None) if deadline is None else deadline
    sched = problem.schedule
    gaps = rank_gaps(sched)
    graph, index = _base_graph(sched, gaps, problem.instance.settings.overlap)
    lp, split, between, v = split_and_durations(problem, unit, "schedule_split_free_w")
    Z, d = v["Z"], v["d"]
    add = split.add
    v.update(graph=graph, gaps=gaps)
    deadline.check("building the free-W MILP")
    t = add_run_rows(lp, graph, d, Z, deadline)
    v["t"] = t
    P, n, S = problem.prefixes, problem.n, problem.S
    big = {s: _widest(P["W"], n, S) / unit * (1 + 1e-9) + 1e-9 for s in range(S)}
    zs, bs, qs = [], {}, {}
    for r, rg in enumerate(gaps):
        K = rg.gaps
        z = []
        for w, (a, lo) in enumerate(zip(rg.ws, rg.earliest, strict=True)):
            row = {g: lp.add_variable(f"z_{r}_{a.stage}_{a.microbatch}_{g}", cat="Binary") for g in range(lo, K - 1)}
            for g in range(lo, K - 2):
                add([(row[g], 1.0), (row[g + 1], -1.0)], 0.0, f"zmono_{r}_{w}_{g}")
            z.append(row)
        zs.append(z)

        def zval(w: int, g: int, z=z, rg=rg, K=K):
            """``z[w, g]`` as a variable or the constant 0 / 1."""
            if g >= K - 1:
                return 1
            if g < rg.earliest[w]:
                return 0
            return z[w][g]

        for chain in rg.chains:  # W's of one chunk in the order of their I's
            for w, w2 in itertools.pairwise(chain):
                for g, var in z[w2].items():
                    other = zval(w, g)
                    if isinstance(other, int):  # 1: no row; 0 cannot happen (I's in order), kept exact
                        add([(var, float(other == 0))], 0.0, f"zchain_{r}_{w2}_{g}")
                    else:
                        add([(var, 1.0), (other, -1.0)], 0.0, f"zchain_{r}_{w2}_{g}")
        block: list = [[] for _ in range(K)]
        for w, (a, lo) in enumerate(zip(rg.ws, rg.earliest, strict=True)):
            dw, M = d["W"][a.stage], big[a.stage]
            if lo == K - 1:  # one gap only: the W lasts dW there
                block[K - 1].append((dw, 1.0))
                continue
            own = []
            for g in range(lo, K):
                b = lp.add_variable(f"b_{r}_{w}_{g}", lowBound=0.0)
                bs[(r, w, g)] = b
                own.append((b, -1.0))
                # dW - b - M (1 - x) <= 0,  x = z[g] - z[g-1]
                terms, const = [(dw, 1.0), (b, -1.0)], -M
                for zz, sign in ((zval(w, g), 1.0), (zval(w, g - 1), -1.0)):
                    if isinstance(zz, int):
                        const += sign * M * zz
                    else:
                        terms.append((zz, sign * M))
                add(merged(terms), const, f"wblock_{r}_{w}_{g}")
                block[g].append((b, 1.0))
            add(merged([(dw, 1.0), *own]), 0.0, f"wsum_{r}_{w}")
        for g in range(K):
            last = rg.steps[g][-1]
            ka, ia, _ = last
            terms = [(t[index[last]], 1.0), (d[ka][ia], 1.0), *block[g]]
            if g < K - 1:
                first = rg.steps[g + 1][0]
                terms.append((t[index[first]], -1.0))
            else:
                terms.append((Z, -1.0))
            add(merged(terms), 0.0, f"wseq_{r}_{g}")
        work = [(d[a.kind][a.stage], 1.0) for step in rg.steps for a in step]
        work += [(d["W"][a.stage], 1.0) for a in rg.ws]
        add(merged([*work, (Z, -1.0)]), 0.0, f"busy_{r}")
        if math.isfinite(problem.capacity) and _memory_rows(problem, split, between, r, rg, zval, qs) is None:
            return None, v
    v.update(z=zs, b=bs, q=qs)
    for q, starts in enumerate(exclude):
        split.exclude(starts, f"nogood_{q}")
    return lp, v


def _memory_rows(problem, split, between, r: int, rg, zval, qs: dict):
    """The memory rows of rank r at each of its F's (module docstring); ``None`` if one is
    false on constants."""
    sched, P = problem.schedule, problem.prefixes
    scale, _ = memory_scale(problem)
    mine = sched.stages_on(r)
    local = {s: i for i, s in enumerate(mine)}
    amax = _widest(P["act"], problem.n, problem.S) * scale * (1 + 1e-9)
    counts = [0] * len(mine)
    seen = set()
    for g, step in enumerate(rg.steps):
        for a in step:
            if a.kind == "B":
                counts[local[a.stage]] -= 1
            if a.kind != "F":
                continue
            counts[local[a.stage]] += 1
            key = (g, tuple(counts))
            if key in seen:
                continue
            seen.add(key)
            terms, const = memory_terms(problem, split, between, r, counts)
            for w, wa in enumerate(rg.ws):
                zz = zval(w, g - 1)
                if isinstance(zz, int):  # W done for sure (or not yet possible)
                    if zz:
                        t_, c_ = between(P["act"], wa.stage, scale)
                        terms += [(x, -c) for x, c in t_]
                        const -= c_
                    continue
                qv = qs.get((r, w, g - 1))
                if qv is None:
                    qv = qs[(r, w, g - 1)] = split.lp.add_variable(f"q_{r}_{w}_{g - 1}", lowBound=0.0)
                    t_, c_ = between(P["act"], wa.stage, scale)
                    split.add(merged([(qv, 1.0), *[(x, -c) for x, c in t_]]), -c_, f"qact_{r}_{w}_{g - 1}")
                    split.add([(qv, 1.0), (zz, -amax)], 0.0, f"qz_{r}_{w}_{g - 1}")
                terms.append((qv, -1.0))
            if not terms:
                if const > 0:
                    return None
                continue
            split.add(merged(terms), const, f"wmem_{r}_{g}_{local[a.stage]}")
    return True


def read_order(problem: ScheduleProblem, v: dict, out) -> Schedule:
    """The action order of the solver's gap binaries (each W in its first gap with
    ``z > 1/2``): :func:`~pipeopt.schedules.w_gaps.place_w`."""
    assignment = []
    for rg, z in zip(v["gaps"], v["z"], strict=True):
        where = []
        for w in range(len(rg.ws)):
            g = next((g for g in sorted(z[w]) if out.value(z[w][g]) > 0.5), rg.gaps - 1)
            where.append(g)
        assignment.append(where)
    return place_w(problem.schedule, assignment, v["gaps"])


def free_start_values(problem: ScheduleProblem, v: dict, starts, order, unit: float) -> dict:
    """A full MIP start for the split ``starts`` run in ``order`` (``None``: the schedule's own
    W placement): binaries, durations, gap binaries, W blocks, memory products and the start
    times of the executor's run of that order."""
    vals, dur = split_values(problem, v, starts, unit)
    gaps = v["gaps"]
    assignment = schedule_gaps(problem.schedule if order is None else order, gaps)
    P, S = problem.prefixes, problem.S
    scale = memory_scale(problem)[0] if math.isfinite(problem.capacity) else 1.0
    p = [0, *problem.check_starts(starts), problem.n]
    act = [float(P["act"][p[s + 1]] - P["act"][p[s]]) * scale for s in range(S)]
    for r, (rg, where) in enumerate(zip(gaps, assignment, strict=True)):
        for w, g0 in enumerate(where):
            for g, var in v["z"][r][w].items():
                vals[var.name] = float(g >= g0)
            for g in range(rg.earliest[w], rg.gaps):
                b = v["b"].get((r, w, g))
                if b is not None:
                    vals[b.name] = dur["W"][rg.ws[w].stage] / unit if g == g0 else 0.0
        for (rq, w, g), var in v["q"].items():
            if rq == r:
                vals[var.name] = act[rg.ws[w].stage] if where[w] <= g else 0.0
    ex = problem.execute(starts, order)
    begin = {op: float(ex.start[q]) for q, op in enumerate(ex.ops)}
    for op, var in zip(v["graph"].ops, v["t"], strict=True):
        vals[var.name] = begin[op] / unit
    vals[v["Z"].name] = ex.time / unit
    return vals


def place_for_split(problem: ScheduleProblem, starts, order, unit: float, deadline: Deadline, *,
                    solver: str = SOLVER, threads: int = 1, seed: int = 0):
    """The best W placement for the fixed split ``starts`` within ``deadline``: the model of
    :func:`build_free_milp` with the split's binaries fixed (only the gap binaries left),
    warm-started from ``order`` (``None``: the schedule's own places). A heuristic for the
    whole problem's incumbent (:func:`~.milp.solve_milp`), not a proof.

    Returns
    -------
    (order, value)
        The best order found and its executor time (``inf`` over memory), or ``(None, inf)``
        when the solver found nothing within the deadline.
    """
    from ...backends.deadline import DeadlineReached
    from ...backends.pulp import solve_pulp

    try:
        lp, v = build_free_milp(problem, unit, deadline=deadline)
    except DeadlineReached:
        return None, math.inf
    if lp is None:
        return None, math.inf
    for t, row in v["y"].items():
        for c, var in row.items():
            var.lowBound = var.upBound = float(c >= starts[t - 1])
    warm = free_start_values(problem, v, starts, order, unit)
    out = solve_pulp(lp, solver=solver, deadline=deadline, rel_gap=1e-6, threads=threads, seed=seed, warm_start=warm)
    if not out.has_solution:
        return None, math.inf
    found = read_order(problem, v, out)
    return found, problem.value(starts, found)
