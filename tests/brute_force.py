"""Brute-force reference optima for the random cross-check (tests/test_crosscheck.py).

Every candidate plan of a tiny instance is built here from the problem's *definition* and
scored with :func:`pipeopt.evaluate`, the one cost model; nothing below reads a solver, a
problem class or a cost table, so a wrong rule copied into a solver cannot hide here.

The search spaces (docs/problems.md, "Search spaces"):

* **partition, straight** -- every contiguous split of the layer order into exactly S
  non-empty stages, stage s on device s (the devices are identical);
* **partition with recomputation** -- every plan (straight or replicated) times every choice per layer:
  keep its activations or recompute it in one of the modes (``recompute="full"``: every layer
  recomputed);
* **partition, replicated** -- every contiguous split into k <= S stages with replica counts
  m_1 + ... + m_k = S, devices dealt in order (stage s gets the next m_s devices);
* **joint** -- every contiguous split into S stages, stage s on device s, each stage with its
  optimal forward share per resource kind (:func:`optimal_beta`);
* **group** -- every assignment of all devices to q ordered non-empty workers (worker s runs
  stage s) times every contiguous split into q stages, with the optimal shares;
* **bipartition** -- every pair of contiguous splits (forward cuts a, backward cuts b) into S
  non-empty stages each, ``|a_c - b_c| <= max_shift`` if given, stage i on device i;
* **allocate** -- the given plan's layers and devices with the optimal shares;
* **placement** -- every convex ordered split into at most D stages times every choice of a
  device class per stage (:func:`placement_optimum`).

The layer order is a topological order of the graph with pinned (``pin_first``) layers glued
to the first other layer, ties broken by the natural order of the names (``l2`` before
``l10``) -- the order over which pipeopt defines contiguous splits (docs/problems.md, "Search spaces").
Sizes: everything here is exponential; keep n <= 7 units, <= 5 devices.

:func:`tied_plans` lists the plans tied with the optimum, over which the tests take the
secondary objectives' minima (tests/problems/*/test_tiebreak.py).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field

import networkx as nx

from pipeopt import Plan, Stage, evaluate
from pipeopt.cost.rules import fits as _fits  # evaluate's own memory test, per stage (placement)

EPS = 1e-12
"""Share given to a kind whose load in one pass is zero (the supremum is not attained there)."""


# ---- the layer order and contiguous splits --------------------------------------------------

def _natural(name) -> tuple:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", str(name)))


def units(instance) -> list[tuple]:
    """The units of the layer order: ``list[tuple[layer, ...]]``, pinned inputs glued to the
    first other layer (a graph of pinned layers only is one unit)."""
    g = instance.graph
    pinned = sorted((v for v, p in g.nodes(data="pin_first") if p), key=_natural)
    rest = g.subgraph(v for v in g.nodes if not g.nodes[v].get("pin_first"))
    order = list(nx.lexicographical_topological_sort(rest, key=_natural))
    if not order:
        return [tuple(pinned)]
    return [tuple(pinned) + (order[0],)] + [(v,) for v in order[1:]]


def splits(n: int, k: int):
    """Every split of n units into k non-empty contiguous parts, as ``[0, c_1, ..., n]`` bounds."""
    for cuts in itertools.combinations(range(1, n), k - 1):
        yield [0, *cuts, n]


def stage_layers(us: list[tuple], bounds: list[int]) -> list[tuple]:
    """Layer tuples of the stages between consecutive ``bounds``."""
    return [tuple(v for u in us[a:b] for v in u) for a, b in zip(bounds[:-1], bounds[1:])]


def compositions(total: int, k: int):
    """Every tuple of k positive integers adding up to ``total``."""
    for cuts in itertools.combinations(range(1, total), k - 1):
        b = [0, *cuts, total]
        yield tuple(b[i + 1] - b[i] for i in range(k))


# ---- the optimal forward share of one worker (Duan & Wu's allocation LP) ---------------------

def _rates(res: dict, F: dict, B: dict, beta: dict) -> tuple[float, float]:
    fr = br = 0.0
    for k, r in res.items():
        if r <= 0:
            continue
        f, b, x = F.get(k, math.inf), B.get(k, math.inf), beta[k]
        if math.isinf(f) or math.isinf(b):
            continue
        if x > 0:
            fr += math.inf if f == 0 else x * r / f
        if x < 1:
            br += math.inf if b == 0 else (1 - x) * r / b
    return fr, br


def stage_tau(res: dict, F: dict, B: dict, beta: dict) -> float:
    """``1 / min(forward rate, backward rate)`` of a worker with shares ``beta``."""
    fr, br = _rates(res, F, B, beta)
    rate = min(fr, br)
    return math.inf if rate <= 0 else (0.0 if math.isinf(rate) else 1.0 / rate)


def optimal_beta(res: dict, F: dict, B: dict) -> dict:
    """The best forward share per kind by enumerating the vertices of the allocation LP.

    ``max r s.t. sum_k beta_k R_k/F_k >= r, sum_k (1 - beta_k) R_k/B_k >= r, 0 <= beta <= 1``
    has a vertex optimum with at most one fractional share (two rows): every kind at 0 or 1
    (or ``EPS`` / ``1 - EPS`` where a zero load makes the supremum unattained), with at most one
    kind set so that both rates are equal. Written independently of pipeopt's closed form.

    Parameters
    ----------
    res
        ``dict[kind, units]`` of the worker.
    F, B
        ``dict[kind, seconds]`` forward / backward load on one unit (missing or inf: cannot run).
    """
    kinds = [k for k, r in res.items() if r > 0 and math.isfinite(F.get(k, math.inf))
             and math.isfinite(B.get(k, math.inf))]
    base = {k: 0.0 for k in res}
    if not kinds:
        return base
    levels = (0.0, EPS, 1.0 - EPS, 1.0)
    best, best_tau = dict(base), math.inf

    def consider(beta):
        nonlocal best, best_tau
        t = stage_tau(res, F, B, beta)
        if t < best_tau:
            best, best_tau = dict(beta), t

    for combo in itertools.product(levels, repeat=len(kinds)):
        consider({**base, **dict(zip(kinds, combo))})
    for j in kinds:
        others = [k for k in kinds if k != j]
        a = res[j] / F[j] if F[j] > 0 else math.inf
        b = res[j] / B[j] if B[j] > 0 else math.inf
        if math.isinf(a) or math.isinf(b):
            continue
        for combo in itertools.product(levels, repeat=len(others)):
            beta = {**base, **dict(zip(others, combo)), j: 0.0}
            fr, br = _rates(res, F, B, beta)  # j contributes x a to forward, (1 - x) b to backward
            br -= b  # _rates counted j fully on the backward side
            if math.isinf(fr) or math.isinf(br):
                continue
            x = (br + b - fr) / (a + b)
            if 0.0 <= x <= 1.0:
                beta[j] = x
                consider(beta)
    return best


def loads(instance, fwd_layers, bwd_layers) -> tuple[dict, dict]:
    """F_k and B_k of a stage: sums of ``fwd[k]`` / ``bwd[k]`` (missing kind: inf)."""
    g = instance.graph
    kinds = set(instance.cluster.kinds)
    F = {k: sum(g.nodes[v]["fwd"].get(k, math.inf) for v in fwd_layers) for k in kinds}
    B = {k: sum(g.nodes[v]["bwd"].get(k, math.inf) for v in bwd_layers) for k in kinds}
    return F, B


def pooled(instance, devices) -> dict:
    """Resources pooled over device names."""
    out: dict = {}
    for d in devices:
        for k, r in instance.cluster.device(d).resources.items():
            out[k] = out.get(k, 0.0) + r
    return out


def with_stage_shares(instance, plan: Plan, _cache: dict | None = None) -> Plan:
    """``plan`` with every stage's ``beta`` replaced by :func:`optimal_beta`: each stage's own
    least-time share (no replication). Its period is an upper bound on the plan's best, and
    its own terms (stage and cut times) a lower bound: :func:`optimum` prices plans with it
    and refines only those that could win."""
    stages = []
    for st in plan.stages:
        key = (st.layers, st.backward_layers, st.devices)
        beta = None if _cache is None else _cache.get(key)
        if beta is None:
            F, B = loads(instance, st.layers, st.backward_layers)
            beta = optimal_beta(pooled(instance, st.devices), F, B)
            if _cache is not None:
                _cache[key] = beta
        stages.append(Stage(st.layers, st.devices, st.replicas, beta, st.bwd_layers))
    return Plan(tuple(stages))


def with_optimal_shares(instance, plan: Plan) -> Plan:
    """``plan`` with the shares of least steady period (no replication).

    With the window rows a stage's best share depends on the other stages (the least ``f + b``
    within the period, not its own least time, :func:`optimal_beta`), so the shares are the
    plan-level optimum of the allocate problem (:func:`pipeopt.problems.resource.allocate.solve_lp`,
    itself checked against fine share grids scored by evaluate in
    ``tests/problems/resource/test_windows.py``); this module still enumerates every split and
    grouping independently. A plan over memory keeps its stage shares (its value is inf-like
    either way: it does not fit).
    """
    from pipeopt.errors import InfeasibleError
    from pipeopt.problems.resource.allocate import solve_lp
    from pipeopt.problems.resource.problem import AllocateProblem

    try:
        out = solve_lp(AllocateProblem(instance, plan_given=plan), time_limit=math.inf).plan
    except InfeasibleError:
        out = None
    return out if out is not None else with_stage_shares(instance, plan)


# ---- candidate plans of each problem ----------------------------------------------------------

def partition_plans(instance, stages: int, replication: bool = False):
    """Every plan of the partition problem (straight or replicated space)."""
    us, names = units(instance), [d.name for d in instance.cluster.devices]
    n = len(us)
    if not replication:
        for b in splits(n, stages):
            yield Plan(tuple(Stage(L, (names[i],)) for i, L in enumerate(stage_layers(us, b))))
        return
    for k in range(1, min(n, stages) + 1):
        for b in splits(n, k):
            layers = stage_layers(us, b)
            for reps in compositions(stages, k):
                used, st = 0, []
                for L, m in zip(layers, reps):
                    st.append(Stage(L, tuple(names[used:used + m]), m))
                    used += m
                yield Plan(tuple(st))


def recompute_plans(instance, stages: int, modes=("full",), forced: bool = False, replication: bool = False):
    """Every plan of the partition problem (straight, or replicated) times every recompute
    choice: each layer of each stage keeps its activations or takes one of ``modes``
    (``forced``: every layer takes ``modes[0]``, Megatron's uniform full recomputation)."""
    options = [modes[0]] if forced else [None, *modes]
    for plan in partition_plans(instance, stages, replication):
        layers = [x for st in plan.stages for x in st.layers]
        for pick in itertools.product(options, repeat=len(layers)):
            chosen = dict(zip(layers, pick))
            yield Plan(tuple(Stage(st.layers, st.devices, st.replicas,
                                   recompute={x: chosen[x] for x in st.layers if chosen[x] is not None} or None)
                             for st in plan.stages))


def joint_plans(instance, stages: int):
    """Every plan of the joint problem: stage s on device s, optimal shares."""
    cache: dict = {}
    for plan in partition_plans(instance, stages):
        yield with_stage_shares(instance, plan, cache)


def groupings(names: list, q: int):
    """Every assignment of all devices to q ordered non-empty workers (``list[tuple]``)."""
    for assign in itertools.product(range(q), repeat=len(names)):
        gs = [tuple(d for d, s in zip(names, assign) if s == w) for w in range(q)]
        if all(gs):
            yield gs


def group_plans(instance, workers: int):
    """Every plan of the group problem: all groupings times all splits, optimal shares."""
    us, names = units(instance), [d.name for d in instance.cluster.devices]
    cache: dict = {}
    for gs in groupings(names, workers):
        for b in splits(len(us), workers):
            plan = Plan(tuple(Stage(L, g) for L, g in zip(stage_layers(us, b), gs)))
            yield with_stage_shares(instance, plan, cache)


def bipartition_plans(instance, stages: int, max_shift: int | None = None):
    """Every plan of the Bi-Partition problem (separate forward and backward splits)."""
    us, names = units(instance), [d.name for d in instance.cluster.devices]
    all_splits = list(splits(len(us), stages))
    for a in all_splits:
        for b in all_splits:
            if max_shift is not None and any(abs(x - y) > max_shift for x, y in zip(a, b)):
                continue
            fl, bl = stage_layers(us, a), stage_layers(us, b)
            yield Plan(tuple(Stage(f, (names[i],), bwd_layers=g) for i, (f, g) in enumerate(zip(fl, bl))))


# ---- the optimum ---------------------------------------------------------------------------

@dataclass
class Optimum:
    """The brute-force answer.

    Attributes
    ----------
    value
        Best objective of a memory-feasible plan (seconds), ``inf`` if none fits.
    plan
        A best feasible plan (``None`` if none fits).
    plans, feasible
        Numbers of candidates scored and of those that fit.
    least_infeasible
        Smallest objective over all candidates, ignoring memory (seconds).
    """

    value: float = math.inf
    plan: Plan | None = None
    plans: int = 0
    feasible: int = 0
    least_infeasible: float = math.inf
    values: list = field(default_factory=list, repr=False)

    @property
    def exists(self) -> bool:
        """True if some plan fits."""
        return self.plan is not None


def optimum(instance, plans) -> Optimum:
    """Score every plan with :func:`pipeopt.evaluate`; the best one that fits memory.

    Plans with a forward share on every stage (joint, group, allocate) are priced first with
    their stages' own least-time shares (:func:`with_stage_shares`): the largest stage or cut
    time is then a lower bound on the plan's best period over all shares. In increasing order
    of that bound, each plan that could still win gets its plan-level optimal shares
    (:func:`with_optimal_shares`) and is scored again; the rest cannot beat the best found.
    """
    out = Optimum()
    refine = []
    for plan in plans:
        ev = evaluate(instance, plan)
        out.plans += 1
        out.least_infeasible = min(out.least_infeasible, ev.objective)
        if not ev.feasible:
            continue
        out.feasible += 1
        if all(st.beta is not None for st in plan.stages):
            refine.append((max(ev.stage_time + ev.comm_time), ev.objective, plan))
            continue
        out.values.append(ev.objective)
        if ev.objective < out.value:
            out.value, out.plan = ev.objective, plan
    for lower, _, plan in sorted(refine, key=lambda x: (x[0], x[1])):
        if lower > out.value * (1 + 1e-12):
            break
        best = with_optimal_shares(instance, plan)
        ev = evaluate(instance, best)
        out.values.append(ev.objective)
        if ev.feasible and ev.objective < out.value:
            out.value, out.plan = ev.objective, best
    return out


def tied_plans(instance, plans, rel: float = 1e-9) -> tuple[float, list[Plan]]:
    """The plans tied with the optimum: the secondary objectives' candidates.

    Every plan of ``plans`` that fits memory and whose objective - with its plan-level optimal
    shares (:func:`with_optimal_shares`) when it has shares - is at most ``optimum * (1 + rel)``,
    ``optimum`` being :func:`optimum` of the same plans. A plan with shares is refined only if
    its stage and cut times with its stages' own shares (a lower bound on its period over all
    shares) could tie.

    Returns
    -------
    (optimum, plans)
        Seconds, and the tied plans (with their optimal shares); ``(inf, [])`` if none fits.
    """
    plans = list(plans)
    best = optimum(instance, plans).value
    if not math.isfinite(best):
        return best, []
    top = best * (1 + rel)
    out = []
    for plan in plans:
        ev = evaluate(instance, plan)
        if not ev.feasible:
            continue
        if all(st.beta is not None for st in plan.stages):
            if max(ev.stage_time + ev.comm_time) > top:
                continue
            plan = with_optimal_shares(instance, plan)
            ev = evaluate(instance, plan)
        if ev.feasible and ev.objective <= top:
            out.append(plan)
    return best, out


def partition_optimum(instance, stages: int, replication: bool = False) -> Optimum:
    """Brute-force optimum of the partition problem."""
    return optimum(instance, partition_plans(instance, stages, replication))


def recompute_optimum(instance, stages: int, modes=("full",), forced: bool = False,
                      replication: bool = False) -> Optimum:
    """Brute-force optimum of the partition problem with activation recomputation: every
    plan times every per-layer choice (:func:`recompute_plans`)."""
    return optimum(instance, recompute_plans(instance, stages, modes, forced, replication))


def joint_optimum(instance, stages: int) -> Optimum:
    """Brute-force optimum of the joint problem."""
    return optimum(instance, joint_plans(instance, stages))


def group_optimum(instance, workers: int) -> Optimum:
    """Brute-force optimum of the group problem."""
    return optimum(instance, group_plans(instance, workers))


def bipartition_optimum(instance, stages: int, max_shift: int | None = None) -> Optimum:
    """Brute-force optimum of the Bi-Partition problem."""
    return optimum(instance, bipartition_plans(instance, stages, max_shift))


def allocate_optimum(instance, plan: Plan) -> Optimum:
    """The given plan with the optimal shares (one candidate)."""
    return optimum(instance, [with_stage_shares(instance, plan)])


def placement_optimum(inst) -> tuple[float, Plan | None]:
    """Brute-force optimum of the placement problem (tests/problems/placement): the least
    max-load over every convex ordered split into at most D stages and every choice of device
    class per stage, scored by pipeopt.evaluate; ``(inf, None)`` if no plan fits.

    A split is a partition of the layers into at most D blocks whose quotient graph is acyclic
    (then its blocks in a topological order have every edge going to the same or a later block:
    the convex ordered splits, each set partition once). A stage's load and memory depend only
    on its own layers and its device (its compute, the tensors it touches, its bytes), so
    evaluate's per-stage numbers are cached by (layers, device class) and a plan's value is the
    max of its stages' cached loads (inf if a stage breaks memory or cannot run)."""
    g = inst.graph
    order = list(nx.topological_sort(g))
    index = {x: i for i, x in enumerate(order)}
    classes: dict = {}
    for d in inst.cluster.devices:
        classes.setdefault((tuple(sorted(d.resources.items())), d.memory, d.host), []).append(d.name)
    names = list(classes.values())
    C, D, n = len(names), len(inst.cluster.devices), len(order)
    edges = [(index[u], index[v]) for u, v in g.edges]
    cache: dict = {}
    best = (math.inf, None)

    def plan_of(sets, cls):
        taken = [0] * C
        stages = []
        for s, c in zip(sets, cls, strict=True):
            stages.append(Stage(tuple(x for x in order if x in s), (names[c][taken[c]],)))
            taken[c] += 1
        return Plan(tuple(stages))

    def price(sets):
        nonlocal best
        for cls in itertools.product(range(C), repeat=len(sets)):
            if any(cls.count(c) > len(names[c]) for c in range(C)):
                continue
            if any((s, c) not in cache for s, c in zip(sets, cls, strict=True)):
                ev = evaluate(inst, plan_of(sets, cls))
                for i, (s, c) in enumerate(zip(sets, cls, strict=True)):
                    ok = math.isfinite(ev.load[i]) and _fits(ev.memory[i], ev.memory_capacity[i])
                    cache[(s, c)] = ev.load[i] if ok else math.inf
            value = max(cache[(s, c)] for s, c in zip(sets, cls, strict=True))
            if value < best[0]:
                best = (value, plan_of(sets, cls))

    labels: list = []

    def walk(i, blocks):  # restricted growth strings: every set partition into <= D blocks once
        if i == n:
            q = nx.DiGraph()
            q.add_nodes_from(range(blocks))
            q.add_edges_from((labels[a], labels[b]) for a, b in edges if labels[a] != labels[b])
            if nx.is_directed_acyclic_graph(q):
                blocks_in_order = nx.topological_sort(q)
                price([frozenset(order[j] for j in range(n) if labels[j] == t) for t in blocks_in_order])
            return
        for t in range(min(blocks + 1, D)):
            labels.append(t)
            walk(i + 1, max(blocks, t + 1))
            labels.pop()

    walk(0, 0)
    return best


# ---- the free-order schedule problem ----------------------------------------------------------

def free_order_optimum(instance, placement: tuple, microbatches: int, copies: int = 1):
    """The least iteration time over every split of the layer order into ``len(placement)``
    chunks (chunk s on rank ``placement[s]``, rank r on the r-th device) and **every** order
    of every rank's F, I, W actions (no symmetry assumed): a depth-first search that appends
    one ready action to its rank at a time, each set of per-rank prefixes visited once, pruned
    by ``max over ranks (free time + work left)`` against the best found.

    The rules, written here from the definition (docs/schedules.md): one action at a time per
    rank; F(s, j) after F(s - 1, j)'s activations; I(s, j) after F(s, j) and I(s + 1, j)'s
    gradient; W(s, j) after I(s, j); across ranks with overlap a transfer after its producer on
    a channel (sender, receiver) free in the order the sender produces, else the producer carries
    it; memory: count of F's minus W's per chunk times its activations plus ``copies`` times its
    parameters, within the device's memory (:func:`pipeopt.cost.rules.fits`). Durations and bytes
    of a split: :func:`pipeopt.cost.passes.pass_times` of its chunk plan.

    Returns ``(value, bounds, orders)``: ``orders`` per rank a list of ``(kind, stage,
    microbatch)``; ``(inf, None, None)`` if nothing fits. Exponential: p = 2, m <= 3, n <= 6.
    """
    from pipeopt.cost.passes import pass_times

    S, m = len(placement), microbatches
    p = max(placement) + 1
    us = units(instance)
    devices = [d.name for d in instance.cluster.devices]
    overlap = instance.settings.overlap
    cross = [placement[c] != placement[c + 1] for c in range(S - 1)]
    best = [math.inf, None, None]
    for bounds in splits(len(us), S):
        plan = Plan(tuple(Stage(layers, (devices[placement[s]],))
                          for s, layers in enumerate(stage_layers(us, bounds))))
        pt = pass_times(instance, plan)
        dur = {}
        for s in range(S):
            f, i = float(pt.forward[s]), float(pt.input_grad[s])
            if not overlap:
                f += float(pt.send_forward[s]) if s < S - 1 and cross[s] else 0.0
                i += float(pt.send_backward[s - 1]) if s > 0 and cross[s - 1] else 0.0
            dur["F", s], dur["I", s], dur["W", s] = f, i, float(pt.weight_grad[s])
        act = [float(a) for a in pt.act_bytes]
        static = [copies * sum(float(pt.param_bytes[s]) for s in range(S) if placement[s] == r) for r in range(p)]
        caps = [float(pt.memory_capacity[placement.index(r)]) for r in range(p)]
        if not all(_fits(static[r], caps[r]) for r in range(p)):
            continue
        actions = [(k, s, j) for s in range(S) for k in "FIW" for j in range(m)]
        work = [sum(dur[k, s] for k, s, _ in actions if placement[s] == r) for r in range(p)]
        seen: set = set()

        def ready(a, end):
            k, s, j = a
            if k == "F":
                return s == 0 or ("F", s - 1, j) in end
            if k == "I":
                return ("F", s, j) in end and (s == S - 1 or ("I", s + 1, j) in end)
            return ("I", s, j) in end

        def arrival(a, end, sent):
            k, s, j = a
            if k == "F":
                deps = [sent.get(("X", s - 1, j), end.get(("F", s - 1, j), 0.0))] if s > 0 else []
            elif k == "I":
                deps = [end[("F", s, j)]]
                if s < S - 1:
                    deps.append(sent.get(("Y", s, j), end[("I", s + 1, j)]))
            else:
                deps = [end[("I", s, j)]]
            return max(deps, default=0.0)

        def dfs(seqs, free, left, end, sent, chan, count):
            if max(f + w for f, w in zip(free, left)) >= best[0] * (1 - 1e-12):
                return
            if len(end) == len(actions):
                best[:] = [max(end.values()), list(bounds), [list(q) for q in seqs]]
                return
            for a in actions:
                if a in end or not ready(a, end):
                    continue
                k, s, j = a
                r = placement[s]
                cnt = list(count)
                if k == "F":
                    cnt[s] += 1
                    mem = static[r] + sum(cnt[t] * act[t] for t in range(S) if placement[t] == r)
                    if not _fits(mem, caps[r]):
                        continue
                elif k == "W":
                    cnt[s] -= 1
                key = tuple(tuple(q) + ((a,) if placement[s] == q_r else ()) for q_r, q in enumerate(seqs))
                if key in seen:
                    continue
                seen.add(key)
                t0 = max(free[r], arrival(a, end, sent))
                e = t0 + dur[k, s]
                end2, sent2, chan2 = dict(end), dict(sent), dict(chan)
                end2[a] = e
                if overlap and k == "F" and s < S - 1 and cross[s]:
                    c = (r, placement[s + 1])
                    sent2[("X", s, j)] = chan2[c] = max(e, chan.get(c, 0.0)) + float(pt.send_forward[s])
                if overlap and k == "I" and s > 0 and cross[s - 1]:
                    c = (r, placement[s - 1])
                    sent2[("Y", s - 1, j)] = chan2[c] = max(e, chan.get(c, 0.0)) + float(pt.send_backward[s - 1])
                free2, left2 = list(free), list(left)
                free2[r], left2[r] = e, left[r] - dur[k, s]
                seqs[r].append(a)
                dfs(seqs, free2, left2, end2, sent2, chan2, cnt)
                seqs[r].pop()

        dfs([[] for _ in range(p)], [0.0] * p, work, {}, {}, {}, [0] * S)
    return tuple(best)


def schedule_recompute_plans(instance, schedule, modes=("full",), forced: bool = False):
    """Every chunk plan of ``schedule`` (a :class:`pipeopt.schedules.Schedule`: its ``p v``
    contiguous chunks of the chain's units, chunk s on rank ``placement[s]``) times every
    recompute choice: each layer keeps its activations or takes one of ``modes`` (``forced``:
    every layer takes ``modes[0]``)."""
    from pipeopt.schedules import chunk_plan

    options = [modes[0]] if forced else [None, *modes]
    us = units(instance)
    for b in splits(len(us), schedule.stages):
        chunks = stage_layers(us, b)
        plan = chunk_plan(instance, schedule, chunks)
        layers = [x for c in chunks for x in c]
        for pick in itertools.product(options, repeat=len(layers)):
            chosen = dict(zip(layers, pick))
            yield Plan(tuple(Stage(st.layers, st.devices, st.replicas,
                                   recompute={x: chosen[x] for x in st.layers if chosen[x] is not None} or None)
                             for st in plan.stages))


def schedule_recompute_optimum(instance, schedule, modes=("full",), forced: bool = False) -> tuple:
    """``(seconds, plan)``: the least iteration time of the executor
    (:func:`pipeopt.schedules.run_schedule`) over the plans of :func:`schedule_recompute_plans`
    that fit in memory (``(inf, None)`` if none fits)."""
    from pipeopt.schedules import run_schedule

    best, arg = math.inf, None
    for plan in schedule_recompute_plans(instance, schedule, modes, forced):
        ex = run_schedule(instance, schedule, plan)
        if ex.feasible and ex.time < best:
            best, arg = ex.time, plan
    return best, arg
