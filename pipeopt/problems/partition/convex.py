"""Exact DP over the ideals of the layer DAG: the partition problem in the convex space.

The one-order methods (:mod:`.dp`, :mod:`.probe`, :mod:`.milp`, :mod:`.cpsat`) split one
topological order of the layers into runs. On a DAG with branches (ResNet, Inception, BERT,
GNMT) the splits a user can run are larger: every **convex** ordered split, a chain of ideals
``{} = I_0 < I_1 < ... < I_S = all`` (:mod:`pipeopt.problems.ideals`). This module solves the
same problem as :mod:`.dp` - the 1F1B steady-state period with the window rows, the per-tensor
full-duplex transfers, the memory of the microbatches in flight, straight or replicated stages -
over that space, with the same two passes:

1. **the min-max DP** over ``best[state][I]`` (state: stages so far, or workers used with
   replication): ``best[to][J] = min over I < J of max(best[from][I], own terms of stage J - I)``;
   its value is a lower bound;
2. **bisection on the period T** with the exact window-slack probe
   (:func:`pipeopt.cost.rules.window_step`), keeping the least G per (state, ideal); the one bisection
   (:func:`pipeopt.backends.bisection.bisect`), whose first probes sit just below the incumbent
   (``probe_top``), which proves the incumbent in one probe when no convex split beats it, and
   again just below each plan a probe finds (``top_after_plan``). A deadline during a probe keeps
   the best plan found and the lower end proven so far.

Everything a stage costs is a function of its two ideals: its compute and bytes are differences
of per-ideal sums, and the bytes crossing the cut after ideal I are a function of I alone (a
tensor crosses once, from its layer in I to its readers outside, :func:`pipeopt.cost.rules.crossing_bytes`).
The pairs are walked from each ideal (:func:`pipeopt.problems.ideals.walk_supersets`), pruned
by an upper bound U (the same algorithm on the prefixes of one layer order, the one-order
optimum): a stage whose compute exceeds U (U times its replicas) or whose memory exceeds a
worker's cannot be in a plan of period at most U, nor can any larger stage.

Where the ideals are too many (more than :data:`pipeopt.problems.ideals.IDEAL_LIMIT`) the
method says so (:class:`~pipeopt.problems.ideals.LatticeTooLarge`).

References
----------
Tarnawski et al., Efficient Algorithms for Device Placement of DNN Graph Operators, NeurIPS 2020
(the DP over ideals); Narayanan et al., PipeDream, SOSP 2019 (replication, 1F1B).
"""

from __future__ import annotations

import math

import numpy as np

from ...jit import njit
from ...backends.bisection import FEASIBLE, INFEASIBLE, UNKNOWN, Probe, bisect
from ...backends.deadline import Deadline, DeadlineReached
from ...cost import evaluate, rules
from ...cost.ties import refuse_ties
from ...cost.transient import refuse_transient
from ...errors import InfeasibleError, InvalidProblemError
from ...plan import Plan, Stage
from ...result import Result, Status
from ..ideals import Lattice, LatticeTooLarge, UnitDag, Walker, ideal_count_text, walk_supersets
from .dp import REL_TOL
from .problem import PartitionProblem


BLOCK = 64
"""Ideals per compiled block; the deadline is checked between blocks."""


@njit(cache=True, nogil=True)
def _relax(a, js, T, probe, W, A, P, added, bound, trip, frm, to, mm, D, U, mem_act, mem_par, ar_coef, cap,
           best, back, back_m):  # pragma: no cover - compiled
    """One ideal ``a`` times its supersets ``js`` times the DP's transitions (module docstring).

    ``probe`` False: the min-max pass (value = bottleneck of the own terms); True: the
    window-slack probe at T (value = least G). Per transition e: from state ``frm[e]`` to
    ``to[e]`` with ``mm[e]`` replicas, window tokens ``D[e]``, ``U[e]``, memory
    ``act * mem_act[e] + par * mem_par[e] <= cap`` and all-reduce ``par * ar_coef[e]``."""
    for x in range(js.size):
        j = js[x]
        comp = W[j] - W[a]
        act = A[j] - A[a]
        par = P[j] - P[a]
        for e in range(frm.size):
            v = best[frm[e], a]
            if v == np.inf:
                continue
            if act * mem_act[e] + par * mem_par[e] > cap:
                continue
            m = mm[e]
            work = comp + par * ar_coef[e] + added[a] + added[j]
            la = bound[a] / m
            lj = bound[j] / m
            if not probe:
                cand = max(max(v, work / m), max(la, lj))
            else:
                if la > T or lj > T:
                    continue
                carry = v + trip[a]
                if carry < -D[e] * T:
                    carry = -D[e] * T
                cand = work + carry
                if cand > -U[e] * T:
                    continue
            t = to[e]
            if cand < best[t, j]:
                best[t, j] = cand
                back[t, j] = a
                back_m[t, j] = m


@njit(cache=True, nogil=True)
def _block(lo, hi, T, probe, ptr, unit, to, stamp, qty, lim, cbad, out_j, out_comm, inc_cost, ndst, src_ptr, src_t,
           dst_ptr, dst_t, insrc, cnt, stack_i, stack_e, stack_v, W, A, P, added, bound, trip, frm, tos, mm, D, U,
           mem_act, mem_par, ar_coef, cap, best, back, back_m):  # pragma: no cover - compiled
    """Ideals ``lo .. hi-1`` in order: each one reached by the DP is walked
    (:func:`pipeopt.problems.ideals.walk_supersets`) and relaxed (:func:`_relax`). Returns the
    pairs priced."""
    pairs = 0
    for a in range(lo, hi):
        reached = False
        for s in range(best.shape[0]):
            if best[s, a] < np.inf:
                reached = True
                break
        if not reached:
            continue
        k = walk_supersets(a, ptr, unit, to, stamp, a, qty, lim, cbad, out_j, out_comm, inc_cost, ndst, src_ptr,
                           src_t, dst_ptr, dst_t, insrc, cnt, stack_i, stack_e, stack_v)
        pairs += k
        _relax(a, out_j[:k], T, probe, W, A, P, added, bound, trip, frm, tos, mm, D, U, mem_act, mem_par, ar_coef,
               cap, best, back, back_m)
    return pairs


class ConvexTables:
    """The per-ideal numbers of one partition problem over one lattice (the cost table of
    :class:`pipeopt.cost.CostTable`, by ideal instead of by chain boundary).

    Attributes (``ndarray (N,)`` each, N ideals)
    ----------
    W, A, P
        Compute seconds of the ideal's units on one worker (forward + backward), activation
        bytes, parameter bytes.
    X
        Bytes crossing the cut after the ideal (each tensor once, its largest edge to a reader
        outside).
    added, bound, trip
        What the cut after the ideal adds to the stages beside it without overlap (the
        transfer each sends), bounds them by with overlap (its busy time) and adds to the
        window rows (the round trip), as :attr:`PartitionProblem.cut_terms` and
        :attr:`PartitionProblem.trip` read them.

    ``deadline`` (optional) is checked between the sums and between blocks of the crossing bytes
    (a lattice of 10^5 ideals takes seconds here); it raises
    :class:`~pipeopt.backends.deadline.DeadlineReached`.
    """

    def __init__(self, p: PartitionProblem, dag: UnitDag, lattice: Lattice, deadline: Deadline | None = None):
        check = (lambda what: None) if deadline is None else deadline.check
        g = p.instance.graph
        inst = p.instance
        kind = p.kind
        r = inst.cluster.devices[0].resources[kind]
        self.p, self.dag, self.lat = p, dag, lattice
        work = np.array([sum(g.nodes[x]["fwd"].get(kind, math.inf) + g.nodes[x]["bwd"].get(kind, math.inf)
                             for x in u) for u in dag.units]) / r
        self.W = lattice.sums(work)
        check("the convex tables (compute)")
        self.A = lattice.sums(dag.sums({x: g.nodes[x]["act_bytes"] for x in g.nodes}))
        check("the convex tables (activations)")
        self.P = lattice.sums(dag.sums({x: g.nodes[x]["param_bytes"] for x in g.nodes}))
        check("the convex tables (parameters)")
        self.X = self._crossing(g, dag, lattice, check=check)
        bw, alpha = inst.cluster.bandwidth, inst.cluster.latency
        self.added, self.bound, self.trip = rules.boundary_terms(
            rules.transfer_time(self.X, bw, 1, alpha), rules.cut_time(self.X, self.X, bw, 1, alpha),
            rules.round_trip(self.X, self.X, bw, alpha), inst.settings.overlap)
        half = sum(p.table.overhead) / 2  # the stage overhead, half at each boundary (PartitionProblem.cut_terms)
        if half:
            self.added = self.added + half

    @staticmethod
    def _crossing(g, dag: UnitDag, lattice: Lattice, chunk: int = 4096, check=lambda what: None) -> np.ndarray:
        """Bytes crossing the cut after each ideal (:func:`pipeopt.cost.rules.crossing_bytes`'s
        rule: layer u's tensor crosses if a reader is outside, with its largest such edge)."""
        uo = dag.unit_of
        edges = sorted(((uo[u], uo[v], float(b if b is not None else g.nodes[u]["out_bytes"]), u)
                        for u, v, b in g.edges(data="bytes")), key=lambda e: (str(e[3]), e[0]))
        N = lattice.size
        out = np.zeros(N)
        if not edges:
            return out
        tails = [e[3] for e in edges]
        starts = [0] + [i for i in range(1, len(edges)) if tails[i] != tails[i - 1]]
        tu = np.array([e[0] for e in edges])
        hu = np.array([e[1] for e in edges])
        b = np.array([e[2] for e in edges])
        for lo in range(0, N, chunk):
            check(f"the convex tables (crossing bytes, ideal {lo} of {N})")
            m = lattice.member[lo:lo + chunk]
            cross = m[:, tu] & ~m[:, hu]
            val = np.where(cross, b[None, :], 0.0)
            out[lo:lo + chunk] = np.maximum.reduceat(val, starts, axis=1).sum(axis=1)
        return out


def _transitions(p: PartitionProblem):
    """``(frm, to, m, D, U, mem_act, mem_par, ar_coef)`` arrays: the DP's steps (straight: one
    per stage; replicated: per (workers, replicas), as :func:`.dp._transitions`), with the cost
    model's coefficients (:mod:`pipeopt.cost.rules`) for each."""
    S, inst = p.stages, p.instance
    steps = []
    if not p.replication:
        steps = [(s, s + 1, 1, S - s) for s in range(S)]
    else:
        for w in range(1, S + 1):
            for m in range(1, w + 1):
                W = S - (w - m)
                steps.append((w - m, w, m, rules.in_flight(0, 0, workers_after=W, replicas=m)))
    frm, to, mm, k = (np.array(x, dtype=np.int64) for x in zip(*steps, strict=True))
    D, U = rules.window_tokens(k, mm, np.zeros(k.size, dtype=bool))
    stash = inst.settings.weight_stashing
    mem_act = np.array([rules.stage_memory(1.0, 0.0, int(x), rules.weight_versions(int(x), stash)) for x in k])
    mem_par = np.array([rules.stage_memory(0.0, 1.0, int(x), rules.weight_versions(int(x), stash)) for x in k])
    ar = np.array([rules.allreduce_time(1.0, int(m), inst.cluster.bus_bandwidth) if m > 1 else 0.0 for m in mm])
    return frm, to, mm, np.asarray(D, float), np.asarray(U, float), mem_act, mem_par, ar


class _Search:
    """The two passes over one lattice, pruned by an upper bound."""

    def __init__(self, p: PartitionProblem, dag: UnitDag, lattice: Lattice, deadline: Deadline):
        self.p, self.lat, self.deadline = p, lattice, deadline
        self.tab = ConvexTables(p, dag, lattice, deadline)
        self.steps = _transitions(p)
        self.cap = rules.memory_limit(p.memory)
        t = self.tab
        # the walk's monotone test: compute within (bound x most replicas), memory of one microbatch
        self.walk = Walker(lattice, np.vstack([t.W, t.A + t.P]), np.zeros((1, lattice.size), dtype=np.int64))
        self.pairs = 0

    def run(self, T: float | None, bound: float):
        """One pass: ``T is None`` the min-max DP, else the probe at T; stages of compute above
        ``bound`` (per replica) are left out. Returns ``(value, ideals, replicas)`` or ``None``."""
        p, lat, tab = self.p, self.lat, self.tab
        S, N = p.stages, lat.size
        most = p.stages if p.replication else 1
        limit = bound * most * (1 + 1e-9) if math.isfinite(bound) else np.inf
        lim = np.array([[limit, self.cap]])
        best = np.full((S + 1, N), np.inf, order="F")
        best[0, 0] = 0.0 if T is None else -np.inf
        back = np.full((S + 1, N), -1, dtype=np.int64, order="F")
        back_m = np.ones((S + 1, N), dtype=np.int64, order="F")
        frm, to, mm, D, U, mem_act, mem_par, ar = self.steps
        w, inc = self.walk, self.walk.inc
        for lo in range(0, N - 1, BLOCK):
            self.deadline.check(f"convex DP at ideal {lo} of {N}")
            self.pairs += _block(lo, min(lo + BLOCK, N - 1), 0.0 if T is None else T, T is not None, lat.ptr, lat.unit,
                                 lat.to, w.stamp, w.qty, lim, w.bad, w.out_j, w.out_comm, inc.cost, inc.ndst,
                                 inc.src_ptr, inc.src_t, inc.dst_ptr, inc.dst_t, w.insrc, w.cnt, w.stack_i, w.stack_e,
                                 w.stack_v, tab.W, tab.A, tab.P, tab.added, tab.bound, tab.trip, frm, to, mm, D, U,
                                 mem_act, mem_par, ar, self.cap, best, back, back_m)
        full = lat.full
        if not best[S, full] < np.inf:
            return None
        ideals, reps, state, j = [full], [], S, full
        while j != 0:
            a, m = int(back[state, j]), int(back_m[state, j])
            reps.append(m)
            ideals.append(a)
            state -= m if p.replication else 1
            j = a
        return float(best[S, full]), ideals[::-1], reps[::-1]

    def plan(self, ideals, reps) -> Plan:
        """The plan of a chain of ideals; devices dealt in cluster order."""
        names = [d.name for d in self.p.instance.cluster.devices]
        stages, used = [], 0
        for units, m in zip(self.lat.chain_of(ideals), reps, strict=True):
            layers = tuple(x for u in units for x in self.tab.dag.units[int(u)])
            stages.append(Stage(layers, tuple(names[used:used + m]), m))
            used += m
        return Plan(tuple(stages))

    def period(self, ideals, reps) -> float:
        """The steady-state period of a chain of ideals on the tables' numbers
        (:func:`pipeopt.cost.rules.steady_period`, as :meth:`PartitionProblem.period`)."""
        t, p = self.tab, self.p
        a, b = np.array(ideals[:-1]), np.array(ideals[1:])
        reps = np.asarray(reps, dtype=int)
        S = reps.size
        ar = np.array([rules.allreduce_time(x, int(m), p.instance.cluster.bus_bandwidth) if m > 1 else 0.0
                       for x, m in zip(t.P[b] - t.P[a], reps, strict=True)])
        work = t.W[b] - t.W[a] + ar + t.added[a] + t.added[b]
        after = np.cumsum(reps[::-1])[::-1]
        window = rules.in_flight(np.arange(S), S, workers_after=after, replicas=reps)
        cuts = np.array(ideals[1:-1], dtype=int)
        half = t.trip[cuts] / 2
        links = np.minimum(reps[:-1], reps[1:])
        # the cut rows (each cut's one-way time over its links) are steady_period's x / L terms
        return rules.steady_period(work, np.zeros(S), reps, window, np.zeros(S, dtype=bool), half, half, links)

    def solve(self, upper: float = math.inf):
        """Min-max pass, then the bisection (:func:`pipeopt.backends.bisection.bisect`, its first
        probes just below the incumbent and again after each plan found); returns ``(best, upper,
        lower, probes, stopped)``: ``best`` the chain ``(ideals, replicas)`` of period ``upper``
        found in this lattice, ``None`` if none beats the given ``upper`` (a plan the caller has);
        ``lower`` the proven lower end; ``stopped`` ``None`` if the bracket closed, else why not
        (the deadline passed during a probe: ``best`` and ``lower`` are what was found and proven
        before it)."""
        first = self.run(None, upper)
        if first is None:
            return None, upper, upper, 0, None
        lower, ideals, reps = first
        period = self.period(ideals, reps)
        held = period >= upper  # the caller's plan stays the incumbent
        start = _HELD if held else (ideals, reps)
        stopped: list[str] = []

        def probe(T: float, _clock) -> Probe:
            try:
                found = self.run(T, T)
            except DeadlineReached as stop:
                stopped.append(str(stop))
                return Probe(UNKNOWN)
            if found is None:
                return Probe(INFEASIBLE)
            return Probe(FEASIBLE, (found[1], found[2]), min(self.period(found[1], found[2]), T))

        search = bisect(probe, lower, min(upper, period), start=start, rel_tol=REL_TOL, deadline=self.deadline,
                        probe_top=True, top_after_plan=True)
        best = None if search.plan is _HELD else search.plan
        stop = None if search.closed else (stopped[-1] if stopped else f"bisection: {search.stop}")
        return best, search.upper, search.lower, search.iterations, stop


_HELD = object()
"""The start of :meth:`_Search.solve`'s bisection when the caller's plan is the incumbent."""


def solve_convex(problem: PartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc",
                 seed: int = 0, threads: int = 2) -> Result:
    """Solve the partition problem exactly over every convex ordered split of the layer DAG.

    First the same algorithm over the prefixes of one layer order (the one-order optimum, an
    upper bound); then the min-max DP and the bisection over every ideal, pruned by it (module
    docstring).

    Parameters
    ----------
    problem
        The partition problem (straight or replicated); objective ``"bottleneck"``.
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline`, checked every
        :data:`BLOCK` ideals. If it passes: status ``TIME_LIMIT`` with the best plan found (the
        one-order optimum at least, if that pass ended) and the best proven bound (the
        bisection's lower end, at least :meth:`PartitionProblem.simple_lower_bound`).
    solver, seed, threads
        Used only by the fallback where the ideals are too many (the convex MILP).

    Returns
    -------
    Result
        Space ``"convex"`` (``"replicated-convex"`` with replication); status ``OPTIMAL`` with
        the proven lower end of the bisection (within :data:`.dp.REL_TOL`). ``info``: the ideal
        count, the pairs priced, the one-order optimum it started from, the probes.

    Raises
    ------
    InvalidProblemError
        If the objective is not ``"bottleneck"``.
    LatticeTooLarge
        If the DAG has more than :data:`pipeopt.problems.ideals.IDEAL_LIMIT` ideals and the
        stages are replicated. With straight stages the convex MILP
        (:func:`.convex_milp.solve_convex_milp`, with ``solver``) solves the problem instead, on
        the same clock; ``info["fallback"]`` says so.
    InfeasibleError
        If no split fits the workers' memory.
    """
    problem.refuse_recompute("method 'convex'")
    deadline = Deadline.of(time_limit)
    refuse_ties(problem.instance, "method 'convex'")
    refuse_transient(problem.instance, "method 'convex'")
    problem.refuse_replicated_latency("convex")
    objective = problem.instance.settings.objective
    if objective != "bottleneck":
        raise InvalidProblemError(
            f"convex minimises the steady-state bottleneck; objective {objective!r} is not supported in the convex space"
        )
    space = "replicated-convex" if problem.replication else "convex"
    dag = UnitDag.build(problem.instance.graph)
    if dag.n < problem.stages:
        raise InvalidProblemError(f"more stages ({problem.stages}) than units ({dag.n}) in {problem.instance.name}")
    info: dict = {"units": dag.n}
    plan, status, lower = None, Status.OPTIMAL, _simple_bound(problem, dag)
    try:
        chain = _Search(problem, dag, Lattice.chain(dag.n), deadline)
        c_best, c_upper, _, _, stop = chain.solve()
        info["one_order"] = c_upper
        if c_best is not None:
            plan = chain.plan(*c_best)
        if stop is None:
            try:
                lat = Lattice.of(dag, deadline=deadline)
            except LatticeTooLarge as exc:
                if problem.replication:
                    raise LatticeTooLarge(f"{problem.instance.name}: {exc}; the one-order methods ('dp', 'probe') "
                                          "solve the smaller replicated-one-order space") from None
                return _fallback(problem, deadline, solver, seed, threads, f"{exc}; solved by convex_milp")
            info["lattice"] = ideal_count_text(lat)
            search = _Search(problem, dag, lat, deadline)
            best, upper, proven, probes, stop = search.solve(c_upper)
            lower = max(lower, proven)  # proven before a deadline too
            info.update({"pairs": search.pairs, "probes": probes})
            if best is not None:
                plan = search.plan(*best)
        if stop is not None:  # the plan found and the lower end proven before the deadline are kept
            info["stopped"], status = stop, Status.TIME_LIMIT
        elif plan is None:
            raise InfeasibleError(
                f"no convex split of {problem.instance.name} into {problem.stages} stages fits in "
                f"{problem.memory / 2**30:.3f} GiB per worker"
            )
    except DeadlineReached as stop:
        info["stopped"] = str(stop)
        status = Status.TIME_LIMIT
    final = evaluate(problem.instance, plan).objective if plan is not None else math.inf
    return problem.result("convex", plan, status, lower_bound=min(lower, final), started=deadline.started,
                          space=space, info=info)


def _simple_bound(problem: PartitionProblem, dag: UnitDag) -> float:
    """A bound valid in the convex space: the total work over S, and (straight stages) the
    largest unit, which no convex split divides (pinned layers and their ancestors share
    stage 0)."""
    g, kind = problem.instance.graph, problem.kind
    r = problem.instance.cluster.devices[0].resources[kind]
    work = [sum(g.nodes[x]["fwd"].get(kind, math.inf) + g.nodes[x]["bwd"].get(kind, math.inf) for x in u) / r
            for u in dag.units]
    total = sum(work)
    if not math.isfinite(total):
        return 0.0
    return max(total / problem.stages, 0.0 if problem.replication else max(work))


def _fallback(problem: PartitionProblem, deadline: Deadline, solver, seed, threads, why: str) -> Result:
    """The convex MILP in place of the DP (too many ideals), its result named ``convex``."""
    from .convex_milp import solve_convex_milp

    res = solve_convex_milp(problem, time_limit=deadline, solver=solver, seed=seed, threads=threads)
    return res.as_fallback("convex", why)
