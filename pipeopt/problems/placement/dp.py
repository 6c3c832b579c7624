"""Exact DP over the ideals of the layer DAG for the placement problem (max-load).

Tarnawski et al.'s DP (NeurIPS 2020, section 4; ``throughput-dp/dp.cpp``): with ``best[s][I]``
the least max-load of ideal I on a device multiset s (how many devices of each class it uses),

    best[s + e_c][J] = min over ideals I < J of max(best[s][I], load_c(J - I)),

``load_c`` the stage's compute on a device of class c plus the transfers it sends and reads
(none on a host device), ``inf`` if it breaks the device's memory. The answer is the least
``best[s][all]`` over every s within the cluster's counts (devices may stay unused).

What makes it fast where ``dp.exe`` runs out of memory (Inception-v3: 36,596 ideals, about
4 x 10^8 nested pairs):

* the stage's compute and memory are differences of per-ideal sums, and its transfers are
  updated as units join a depth-first walk over the supersets of I
  (:func:`pipeopt.problems.ideals.walk_supersets`), so a pair costs O(degree), not O(n);
* an **upper bound** U (the best plan of the one-order space, the same DP over the prefixes of
  one layer order) prunes the walk: compute and memory only grow as units join, so once a set's
  compute exceeds U on every class (or its memory every capacity) none of its supersets is
  visited; and an ideal whose best value already exceeds U is not expanded. Both prunings
  keep every pair that could make a plan of max-load at most U, so the DP's value is the
  optimum (the one-order plan is the answer when nothing beats it).

Layers that cost nothing and touch one neighbour only are merged into it first (a dominance:
:meth:`pipeopt.problems.ideals.UnitDag.build`; ``dp.cpp`` merges the same layers).
"""

from __future__ import annotations

import math

import numpy as np

from ...jit import njit
from ...backends.deadline import Deadline, DeadlineReached
from ...cost import evaluate, rules
from ...errors import InfeasibleError
from ...result import Result, Status
from ..ideals import LatticeTooLarge, Walker, ideal_count_text, walk_supersets
from .problem import PlacementProblem


BLOCK = 64
"""Ideals per compiled block; the deadline is checked between blocks."""


@njit(cache=True, nogil=True)
def _relax(a, js, cost, best, back_a, back_c, step, room):  # pragma: no cover - compiled
    """``best[s + e_c, J] = min(., max(best[s, a], cost[c, J]))`` for every state s that has room
    for a device of class c (``room[s, c]``), every class c and every J in ``js``."""
    S = best.shape[0]
    for s in range(S):
        v = best[s, a]
        if v == np.inf:
            continue
        for c in range(cost.shape[0]):
            if not room[s, c]:
                continue
            t = s + step[c]
            for x in range(js.size):
                cand = cost[c, x]
                if cand < v:
                    cand = v
                j = js[x]
                if cand < best[t, j]:
                    best[t, j] = cand
                    back_a[t, j] = a
                    back_c[t, j] = c


@njit(cache=True, nogil=True)
def _block(lo, hi, ptr, unit, to, stamp, qty, lim, cbad, out_j, out_comm, inc_cost, ndst, src_ptr, src_t, dst_ptr,
           dst_t, insrc, cnt, stack_i, stack_e, stack_v, times, bad, mem, kind, rate, host, memlim, cut, best, back_a,
           back_c, step, room):  # pragma: no cover - compiled
    """Ideals ``lo .. hi-1`` in order, each walked, priced and relaxed (:func:`_relax`);
    single-kind classes: ``kind[c]`` the kind, ``rate[c]`` its units, a stage's compute its
    seconds on one unit over the units (:func:`pipeopt.cost.rules.load_time` for one kind).
    Returns the pairs priced."""
    pairs = 0
    C = kind.size
    S = best.shape[0]
    cost = np.empty((C, out_j.size))
    for a in range(lo, hi):
        ok = False
        for s in range(S):
            if best[s, a] <= cut:
                ok = True
                break
        if not ok:
            continue
        k = walk_supersets(a, ptr, unit, to, stamp, a, qty, lim, cbad, out_j, out_comm, inc_cost, ndst, src_ptr,
                           src_t, dst_ptr, dst_t, insrc, cnt, stack_i, stack_e, stack_v)
        pairs += k
        for x in range(k):
            j = out_j[x]
            m = mem[j] - mem[a]
            for c in range(C):
                q = kind[c]
                if bad[q, j] != bad[q, a] or m > memlim[c]:
                    cost[c, x] = np.inf
                    continue
                t = times[q, j] - times[q, a]
                load = 0.0 if t == 0 else 1.0 / (rate[c] / t)
                if not host[c]:
                    load += out_comm[x]
                cost[c, x] = load
        _relax(a, out_j[:k], cost[:, :k], best, back_a, back_c, step, room)
    return pairs


class _States:
    """Device multisets as mixed-radix integers: ``counts[s, c]`` devices of class c."""

    def __init__(self, caps):
        self.caps = np.asarray(caps, dtype=np.int64)
        self.step = np.concatenate([[1], np.cumprod(self.caps + 1)[:-1]]).astype(np.int64)
        size = int(np.prod(self.caps + 1))
        s = np.arange(size)
        self.counts = (s[:, None] // self.step[None, :]) % (self.caps + 1)[None, :]
        self.room = self.counts < self.caps[None, :]
        self.size = size


def _costs(p: PlacementProblem, times, bad, mem, a, js, comm) -> np.ndarray:
    """``ndarray (C, len(js))``: the load of ``J - a`` on a device of each class (the cost
    model's rules: :func:`pipeopt.cost.rules.load_time` per kind, the transfers unless host,
    :func:`pipeopt.cost.rules.fits`)."""
    out = np.empty((len(p.classes), js.size))
    diff = times[:, js] - times[:, a][:, None]  # (K, L)
    nbad = bad[:, js] - bad[:, a][:, None]
    t_k = np.where(nbad > 0, np.inf, diff)
    m = mem[js] - mem[a]
    for c, cl in enumerate(p.classes):
        rate = np.zeros(js.size)
        zero = np.zeros(js.size, dtype=bool)
        for k, kind in enumerate(p.kinds):
            r = cl.resources.get(kind, 0.0)
            if r <= 0:
                continue
            zero |= t_k[k] == 0
            fin = np.isfinite(t_k[k]) & (t_k[k] > 0)
            rate = rate + np.where(fin, r / np.where(fin, t_k[k], 1.0), 0.0)
        with np.errstate(divide="ignore"):
            time = np.where(rate > 0, 1.0 / np.where(rate > 0, rate, 1.0), np.inf)
        time = np.where(zero, 0.0, time)
        load = time + (0.0 if cl.host else comm)
        out[c] = np.where(rules.fits(m, cl.memory), load, np.inf)
    return out


def lattice_dp(p: PlacementProblem, lattice, *, bound: float = math.inf, deadline: Deadline | None = None):
    """The DP over ``lattice`` (module docstring), pruned by ``bound``.

    Returns
    -------
    (value, stages, pairs)
        The least max-load (``inf`` if no plan of max-load at most ``bound`` exists), the
        stages ``[(unit indices, class)]`` of a plan that attains it (``None`` if inf), and
        the number of (ideal, superset) pairs priced.

    Raises
    ------
    DeadlineReached
        If the deadline passes (checked every :data:`BLOCK` ideals).
    """
    N = lattice.size
    K = len(p.kinds)
    times, bad = lattice.finite_sums(p.unit_times.T) if K else (np.zeros((N, 0)), np.zeros((N, 0)))
    times, bad = np.asarray(times).reshape(N, K).T.copy(), np.asarray(bad).reshape(N, K).T.copy()
    mem = lattice.sums(p.unit_memory)
    C = len(p.classes)
    # the walk's monotone test: per class, the compute of a single-kind class within the bound,
    # the memory within the capacity, no unit the class cannot run
    qty = np.vstack([times, mem[None, :]])
    lim = np.full((C, K + 1), np.inf)
    cbad = np.zeros((C, N), dtype=np.int64)
    slack = 1 + 1e-9
    single = [[k for k, kind in enumerate(p.kinds) if cl.resources.get(kind, 0.0) > 0] for cl in p.classes]
    for c, (cl, usable) in enumerate(zip(p.classes, single, strict=True)):
        if len(usable) == 1:
            k = usable[0]
            lim[c, k] = bound * cl.resources[p.kinds[k]] * slack if math.isfinite(bound) else np.inf
            cbad[c] = bad[k]
        lim[c, K] = rules.memory_limit(cl.memory)
    walk = Walker(lattice, qty, cbad, p.incidence)
    states = _States([len(cl.names) for cl in p.classes])
    # column-major: the states of one ideal side by side (the relaxation's inner loop)
    best = np.full((states.size, N), np.inf, order="F")
    best[0, 0] = 0.0
    back_a = np.full((states.size, N), -1, dtype=np.int64, order="F")
    back_c = np.full((states.size, N), -1, dtype=np.int64, order="F")
    cut = bound * slack if math.isfinite(bound) else np.inf
    pairs = 0
    if all(len(u) == 1 for u in single):  # every class has one kind: the compiled loop
        inc = walk.inc
        kind = np.array([u[0] for u in single], dtype=np.int64)
        rate = np.array([cl.resources[p.kinds[u[0]]] for cl, u in zip(p.classes, single, strict=True)])
        host = np.array([cl.host for cl in p.classes])
        memlim = np.array([rules.memory_limit(cl.memory) for cl in p.classes])
        lim2 = np.ascontiguousarray(lim)
        for lo in range(0, N - 1, BLOCK):
            if deadline is not None:
                deadline.check(f"placement DP at ideal {lo} of {N}")
            pairs += _block(lo, min(lo + BLOCK, N - 1), lattice.ptr, lattice.unit, lattice.to, walk.stamp, walk.qty,
                            lim2, walk.bad, walk.out_j, walk.out_comm, inc.cost, inc.ndst, inc.src_ptr, inc.src_t,
                            inc.dst_ptr, inc.dst_t, walk.insrc, walk.cnt, walk.stack_i, walk.stack_e, walk.stack_v,
                            times, bad, mem, kind, rate, host, memlim, cut, best, back_a, back_c, states.step,
                            states.room)
    else:  # a class pools several kinds: the walk one ideal at a time, the loads in numpy
        for a in range(N - 1):
            if deadline is not None and a % BLOCK == 0:
                deadline.check(f"placement DP at ideal {a} of {N}")
            if not best[:, a].min() <= cut:
                continue
            js, comm = walk(a, lim)
            if not js.size:
                continue
            pairs += js.size
            _relax(a, js, _costs(p, times, bad, mem, a, js, comm), best, back_a, back_c, states.step, states.room)
    full = lattice.full
    s = int(np.argmin(best[:, full]))
    value = float(best[s, full])
    if not math.isfinite(value) or value > cut:
        return math.inf, None, pairs
    stages, j = [], full
    while j != 0:
        a, c = int(back_a[s, j]), int(back_c[s, j])
        stages.append((lattice.difference(a, j), c))
        s -= int(states.step[c])
        j = a
    return value, stages[::-1], pairs


def _solve(problem: PlacementProblem, space: str, method: str, time_limit) -> Result:
    deadline = Deadline.of(time_limit)
    first = _run(problem, space, deadline)
    if first[0] is None or first[0].feasible or problem.strict or not first[1].get("merged_free_layers"):
        return _finish(problem, space, method, deadline, *first)
    # a merged free layer's bytes broke a device's memory: the relaxation's plan does not fit,
    # so solve again merging only the layers without bytes (exact for memory too)
    second = _run(problem.strictly(), space, deadline)
    second[1]["relaxed_first"] = first[1]
    return _finish(problem.strictly(), space, method, deadline, *second)


def _finish(problem, space, method, deadline, ev, info, stages, lower):
    if ev is None and "stopped" in info:
        return problem.result(method, None, Status.TIME_LIMIT, lower_bound=0.0, started=deadline.started,
                              space=space, info=info)
    if stages is None:
        raise InfeasibleError(
            f"no placement of {problem.instance.name} on its devices fits their memory (every {space} split priced)"
        )
    plan = problem.plan(stages)
    return problem.result(method, plan, Status.OPTIMAL, lower_bound=min(lower, ev.objective),
                          started=deadline.started, space=space, info=info)


def _run(problem: PlacementProblem, space: str, deadline):
    """One DP (one-order first, then convex pruned by it): ``(evaluation, info, stages, value)``."""
    info: dict = {"units": problem.dag.n, "merged_free_layers": len(problem.dag.merged)}
    value = math.inf
    try:
        chain = problem.lattice("one-order")
        upper, stages, pairs = lattice_dp(problem, chain, deadline=deadline)
        info["one_order"] = {"value": upper, "pairs": pairs}
        if space == "convex":
            try:
                lat = problem.lattice("convex", deadline=deadline)
            except LatticeTooLarge as exc:
                raise LatticeTooLarge(f"{problem.instance.name}: {exc}; method 'milp' solves the convex space "
                                      "without enumerating ideals") from None
            info["lattice"] = ideal_count_text(lat)
            value, better, pairs = lattice_dp(problem, lat, bound=upper, deadline=deadline)
            info["pairs"] = pairs
            if better is not None and value <= upper:
                stages = better
            value = min(value, upper)
        else:
            value = upper
    except DeadlineReached as stop:
        info["stopped"] = str(stop)
        return None, info, None, 0.0
    ev = evaluate(problem.instance, problem.plan(stages)) if stages is not None else None
    return ev, info, stages, value


def solve_dp(problem: PlacementProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
             threads: int = 2) -> Result:
    """Place the DAG optimally over every convex ordered split (the DP over ideals).

    Parameters
    ----------
    problem
        The placement problem.
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline`, checked every
        :data:`BLOCK` ideals; if it passes, status ``TIME_LIMIT`` without a plan.
    solver, seed, threads
        Unused (the DP needs no solver).

    Returns
    -------
    Result
        Status ``OPTIMAL``, space ``"convex"``; ``info``: the ideal count, the pairs priced,
        the one-order bound it started from, the free layers merged.

    Raises
    ------
    LatticeTooLarge
        If the DAG has more than :data:`pipeopt.problems.ideals.IDEAL_LIMIT` ideals.
    InfeasibleError
        If no placement fits the devices' memory.
    """
    return _solve(problem, "convex", "dp", time_limit)


def solve_one_order(problem: PlacementProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc",
                    seed: int = 0, threads: int = 2) -> Result:
    """The same DP restricted to the contiguous splits of one layer order (pipeopt's
    deterministic topological order, :func:`pipeopt.graph.layer_order`): optimal in the
    ``"one-order"`` space only, which its result says; a fast upper bound for the convex space.

    Returns and raises as :func:`solve_dp` (space ``"one-order"``).
    """
    return _solve(problem, "one-order", "one_order", time_limit)
