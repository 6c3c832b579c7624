"""The pieces every schedule MILP shares (:mod:`.milp`, the schedule's own W placement;
:mod:`.w_placement`, free W placement): the split's cumulative binaries and one duration per
chunk and action kind tied to the prefix sums, the memory rows, the MIP start of a split, and
with recomputation each chunk's least rerun seconds (:func:`recompute_rows`).
The formulations are described in :mod:`.milp`'s docstring."""

from __future__ import annotations

import math

import numpy as np

from ...backends.deadline import Deadline
from ...lazy import lazy_module
from ...cost import rules
from ..partition.model import CumulativeSplit
from .problem import ScheduleProblem

pulp = lazy_module("pulp")

__all__ = ["MEMORY_WIDEN", "chunk_durations", "chunk_extra", "memory_scale", "memory_terms", "merged",
           "per_layer_recompute", "recompute_memory_rows", "recompute_rows", "split_and_durations", "split_values"]


MEMORY_WIDEN = 1e-7
"""Relative widening of the memory rows' right-hand side: the rows are a relaxation (bytes
scaled by the capacity and summed by the solver); the executor decides."""


def chunk_durations(problem: ScheduleProblem, starts) -> dict:
    """Seconds of each operation kind of the split, as the model states them: ``{"F": [per
    chunk], "B", "I", "W", "X": [per boundary; 0.0 where both chunks share a rank or without
    overlap]}`` (``"Y"`` is ``"X"``: as many gradient bytes come back). The tests check them
    against :func:`pipeopt.cost.passes.pass_times` through the executor."""
    P, S = problem.prefixes, problem.S
    p = [0, *problem.check_starts(starts), problem.n]
    cross = cross_ranks(problem)
    overlap = problem.instance.settings.overlap
    out = {k: [float(P[k][p[s + 1]] - P[k][p[s]]) for s in range(S)] for k in ("F", "B", "I", "W")}
    send = [float(P["send"][p[c + 1]]) for c in range(S - 1)]
    crossing = [send[c] if cross[c] else 0.0 for c in range(S - 1)]
    for s in range(S):  # without overlap the sender carries its transfer (across ranks)
        out["F"][s], out["B"][s] = rules.carried(s, S, out["F"][s], out["B"][s], crossing, crossing, overlap)
        out["I"][s] = rules.carried(s, S, 0.0, out["I"][s], crossing, crossing, overlap)[1]
    out["X"] = [send[c] if overlap and cross[c] else 0.0 for c in range(S - 1)]
    out["Y"] = out["X"]
    return out


def merged(terms) -> list:
    """``terms`` with one entry per variable (coefficients summed): PuLP keeps only the last
    coefficient of a variable named twice in an expression's list."""
    out: dict = {}
    for var, coef in terms:
        out[var] = out.get(var, 0.0) + coef
    return list(out.items())


def cross_ranks(problem: ScheduleProblem) -> list[bool]:
    place = problem.schedule.placement
    return [place[c] != place[c + 1] for c in range(problem.S - 1)]


def split_and_durations(problem: ScheduleProblem, unit: float, name: str):
    """The part of the event-time MILP every formulation shares: the objective ``Z``, the
    split's cumulative binaries and one duration variable per chunk and action kind (and per
    boundary between ranks for its transfers, with overlap), tied to the prefixes by equality
    rows (module docstring).

    Returns
    -------
    (lp, split, between, v)
        The PuLP problem, the :class:`~pipeopt.problems.partition.model.CumulativeSplit`,
        ``between(arr, s, scale)`` (``(arr[p_{s+1}] - arr[p_s]) * scale`` as (terms, constant))
        and ``v = {"Z": ..., "y": ..., "d": kind -> list of variables or None, "rc": per chunk its
    recompute seconds (:func:`recompute_rows`; ``None`` without recomputation)}``; with
    recomputation the B and I durations include ``rc``.
    """
    S, P = problem.S, problem.prefixes
    sched = problem.schedule
    overlap = problem.instance.settings.overlap
    lp = pulp.LpProblem(name, pulp.LpMinimize)
    Z = lp.add_variable("iteration", lowBound=0.0)
    lp += Z, "iteration_time"
    split = CumulativeSplit(lp, problem.space)
    add = split.add
    v = {"Z": Z, "y": split.y}
    for t in range(1, S):
        split.structure_rows(t)
    u = 1.0 / unit
    v["rc_choice"] = None
    if problem.recomputation is not None and per_layer_recompute(problem):
        # several chunks per rank share its memory: a binary per layer (the partition MILP's rows)
        from ..partition.milp import RecomputeChoice

        choice = RecomputeChoice(lp, split, problem.recomputation, np.diff(P["act"]), u, Deadline(None))
        v["rc"], v["rc_choice"] = choice.q, choice
    else:
        v["rc"] = recompute_rows(problem, lp, split, u)

    def between(arr, s, scale):
        """``(arr[p_{s+1}] - arr[p_s]) * scale`` as (terms, constant)."""
        e_terms, e_const = split.at(arr, s + 1, scale)
        b_terms, b_const = split.at(arr, s, scale)
        return e_terms + [(x, -c) for x, c in b_terms], e_const - b_const

    zero = v["zero"] = zero_terms(problem, lp, split, between) if problem.instance.settings.data_parallel else None
    cross = cross_ranks(problem)
    boundary = [[c + 1] if cross[c] else [] for c in range(S - 1)]  # the unit index p_{c+1} of cut c
    kinds = {a.kind for r in range(sched.ranks) for a in sched.actions(r)}
    d: dict = {k: [None] * S for k in ("F", "B", "I", "W")}
    for k in sorted(kinds):
        for s in range(S):
            terms, const = between(P[k], s, u)
            # without overlap the op carries the send at the boundary after it (F) or before it
            # (B, I), across ranks: rules.carried on the boundaries' indices
            f_send, b_send = rules.carried(s, S, [], [], boundary, boundary, overlap)
            sends = f_send if k == "F" else b_send if k in ("B", "I") else []
            for c in sends:
                x_terms, x_const = split.at(P["send"], c, u)
                terms, const = terms + x_terms, const + x_const
            if v["rc"] is not None and k in ("B", "I"):  # the rerun forward before the backward (I), never W
                terms = terms + [(v["rc"][s], 1.0)]
            if zero is not None:  # ZeRO's collectives of the chunk's op (pass_times' rule, zero_terms)
                z_terms, z_const = zero["op"](s, k, u)
                terms, const = terms + z_terms, const + z_const
            var = lp.add_variable(f"dur_{k}_{s}", lowBound=0.0)
            add(merged(terms + [(var, -1.0)]), const, f"dur_{k}_{s}_def", pulp.LpConstraintEQ)
            d[k][s] = var
    d["X"] = [None] * (S - 1)
    if overlap:
        for c in range(S - 1):
            if cross[c]:
                var = lp.add_variable(f"dur_X_{c}", lowBound=0.0)
                terms, const = split.at(P["send"], c + 1, u)
                add(terms + [(var, -1.0)], const, f"dur_X_{c}_def", pulp.LpConstraintEQ)
                d["X"][c] = var
    d["Y"] = d["X"]
    v["d"] = d
    if zero is not None:  # the synchronisation after the flush: each rank its chunks' in turn, the ranks in parallel
        sync = lp.add_variable("zero_sync", lowBound=0.0)
        for r in range(sched.ranks):
            terms, const = [], 0.0
            for s in sched.stages_on(r):
                t_, c_ = zero["sync"](s, u)
                terms, const = terms + t_, const + c_
            add(merged(terms + [(sync, -1.0)]), const, f"zero_sync_{r}")
        lp.setObjective(pulp.lpSum([Z, sync]))
        v["zero_sync"] = sync
    return lp, split, between, v


def zero_terms(problem: ScheduleProblem, lp, split, between) -> dict:
    """ZeRO in the schedule MILP, per chunk, as linear terms over the split (data parallelism only),
    read off the one rule through :func:`pipeopt.problems.partition.milp.zero_linear` and
    :func:`pipeopt.cost.rules.zero_op_times` / :func:`~pipeopt.cost.rules.zero_backward_scatter` /
    :func:`~pipeopt.cost.rules.zero_sync_time` (each linear in the chunk's weight bytes ``P_s`` plus a
    latency term when ``P_s > 0``: a variable ``w_s >= x[s, c]`` for each unit with weights):

    * ``op(s, kind, u)``: seconds added to the chunk's F (the all-gather, ZeRO-3), B (all-gathers and
      the reduce-scatter), W (the reduce-scatter, which follows the weight gradient) and I (B's
      rest), as :func:`pipeopt.cost.passes.pass_times` adds them;
    * ``state(s, scale)``: the chunk's training state ``kappa P_s + lam L_s`` (``L_s >=`` each of
      its units' largest layer: ZeRO-3's gathered layer) in bytes times ``scale``;
    * ``sync(s, u)``: its synchronisation after the flush.
    """
    from ..partition.milp import zero_linear

    st, tab = problem.instance.settings, problem.table
    S, n = problem.S, problem.n
    kappa, lam, _, _ = zero_linear(problem)
    comm = {"zero": st.zero, "dp": st.dp, "bandwidth": tab.bus_bandwidth}

    def lin(fn):  # (slope per byte, latency part) of a rule linear in the bytes for bytes > 0
        slope = float(fn(1.0, **comm, latency=0.0))
        return slope, float(fn(1.0, **comm, latency=tab.latency)) - slope

    fwd = lin(lambda b, **kw: rules.zero_op_times(b, **kw)[0])
    bwd = lin(lambda b, **kw: rules.zero_op_times(b, **kw)[1])
    scatter = lin(rules.zero_backward_scatter)
    sync = lin(rules.zero_sync_time)
    coef = {"F": fwd, "B": bwd, "W": scatter, "I": (bwd[0] - scatter[0], bwd[1] - scatter[1])}
    P = problem.prefixes["param"]

    reach = [range(s, n - S + s + 1) for s in range(S)]
    weighted = [float(a) > 0 for a in problem.instance.chain.param]
    w = [None] * S
    if any(c[1] for c in (*coef.values(), sync)):
        for s in range(S):
            w[s] = lp.add_variable(f"zero_messages_{s}", lowBound=0, upBound=1)
            for c in reach[s]:
                if weighted[c]:
                    xt, xc = split.member(s, c)
                    split.add(merged([*xt, (w[s], -1.0)]), xc, f"zero_messages_{s}_{c}")
    largest: dict = {}

    def affine(s, pair, u):
        t_, c_ = between(P, s, pair[0] * u)
        if pair[1] and w[s] is not None:
            t_ = t_ + [(w[s], pair[1] * u)]
        return t_, c_

    def state(s, scale):
        t_, c_ = between(P, s, kappa * scale)
        if lam:
            if s not in largest:
                L = largest[s] = lp.add_variable(f"largest_layer_{s}", lowBound=0)  # bytes times scale
                for c in reach[s]:
                    big = float(tab.largest_layer(c, c + 1)) * scale
                    if big > 0:
                        xt, xc = split.member(s, c)
                        split.add(merged([*((v_, a * big) for v_, a in xt), (L, -1.0)]), xc * big,
                                  f"largest_{s}_{c}")
            t_ = t_ + [(largest[s], lam)]
        return t_, c_

    return {"op": lambda s, kind, u: affine(s, coef[kind], u), "state": state,
            "sync": lambda s, u: affine(s, sync, u)}


def memory_scale(problem: ScheduleProblem) -> tuple[float, float]:
    """``(scale, limit)``: bytes are multiplied by ``scale`` (1 / capacity) in the memory rows,
    whose right-hand side is :func:`pipeopt.cost.rules.memory_limit` widened by
    :data:`MEMORY_WIDEN`, scaled."""
    cap = problem.capacity
    scale = 1.0 / cap if cap > 0 else 1.0
    return scale, float(rules.memory_limit(cap)) * scale * (1 + MEMORY_WIDEN)


def memory_terms(problem: ScheduleProblem, split, between, rank: int, counts, zero=None) -> tuple[list, float]:
    """The memory row of ``rank`` when its chunks hold ``counts`` microbatches in flight (one
    count per chunk of :meth:`~pipeopt.schedules.Schedule.stages_on`), as (terms, constant) of
    ``row <= 0``: :func:`pipeopt.cost.rules.stage_memory` summed over the rank's chunks (its
    activation and parameter bytes linear in the split), minus the limit (:func:`memory_scale`);
    with ``zero`` (:func:`zero_terms`) each chunk's training state too."""
    P, sched = problem.prefixes, problem.schedule
    scale, limit = memory_scale(problem)
    terms, const = [], -limit
    for s, k in zip(sched.stages_on(rank), counts, strict=True):
        if zero is not None:
            t_, c_ = zero["state"](s, scale)
            terms += t_
            const += c_
        for arr, w in ((P["act"], k), (P["param"], sched.parameter_copies)):
            if w:
                t_, c_ = between(arr, s, scale * w)
                terms += t_
                const += c_
    return terms, const


def per_layer_recompute(problem: ScheduleProblem) -> bool:
    """True if the MILP states recomputation with a binary per layer (:class:`~pipeopt.problems.
    partition.milp.RecomputeChoice`, :func:`recompute_memory_rows`): some rank holds several chunks,
    whose recompute sets share its memory; with one chunk per rank :func:`recompute_rows`' frontier
    rows hold it without binaries."""
    sched = problem.schedule
    return any(len(sched.stages_on(r)) > 1 for r in range(sched.ranks))


def recompute_memory_rows(problem: ScheduleProblem, split, between, choice, zero=None) -> bool:
    """The memory rows of every rank with recomputation chosen per layer (``choice``, a
    :class:`~pipeopt.problems.partition.milp.RecomputeChoice`): per rank r, count vector ``c`` of
    :meth:`~pipeopt.schedules.Schedule.activation_profile` and chunk s of the rank with ``c_s > 0``
    (or none, if every count is 0),

    ``sum_{s' on r} (kept_terms(s', c_{s'}) + parameter_copies * param_{s'}) + E_s <= limit``

    (:func:`memory_scale`), ``E_s`` the chunk's backward excess (:meth:`RecomputeChoice.excess`): the
    executor's rule (:func:`pipeopt.schedules.execute.rank_memory`: the largest excess of the chunks
    holding a microbatch) as one row per chunk that may hold the largest.

    Returns
    -------
    bool
        False if a row is false on constants (no split fits).
    """
    P, sched = problem.prefixes, problem.schedule
    scale, limit = memory_scale(problem)
    for r in range(sched.ranks):
        mine = sched.stages_on(r)
        for q, counts in enumerate(sched.activation_profile(r) or ((0,) * len(mine),)):
            terms, const = [], -limit
            for s, k in zip(mine, counts, strict=True):
                t_, c_ = choice.kept_terms(s, k, scale)
                terms += t_
                const += c_
                if zero is not None:  # the chunk's training state (zero_terms)
                    t_, c_ = zero["state"](s, scale)
                    terms += t_
                    const += c_
                if sched.parameter_copies:
                    t_, c_ = between(P["param"], s, scale * sched.parameter_copies)
                    terms += t_
                    const += c_
            holding = [s for s, k in zip(mine, counts, strict=True) if k > 0] or [None]
            for s in holding:
                row = terms if s is None else terms + [(choice.excess(s, scale), 1.0)]
                if not row:
                    if const > 0:
                        return False
                    continue
                split.add(merged(row), const, f"memory_{r}_{q}" + ("" if s is None else f"_{s}"))
    return True


def split_values(problem: ScheduleProblem, v: dict, starts, unit: float, recompute=None) -> tuple[dict, dict]:
    """MIP start values of the split's binaries and of the duration variables of
    :func:`split_and_durations` for ``starts`` (with a binary per layer, ``v["rc_choice"]``: the
    recompute sets ``recompute``, per chunk ``dict[layer, mode]`` or ``None``, give the layers'
    binaries and each chunk's rerun seconds; the continuous products are left to the solver);
    returns ``(values, durations)`` (:func:`chunk_durations`)."""
    vals = {}
    for t, row in v["y"].items():
        for c, var in row.items():
            vals[var.name] = float(c >= starts[t - 1])
    dur = chunk_durations(problem, starts)
    choice = v.get("rc_choice")
    if choice is not None and recompute is not None:
        chunk_of = {}
        for s, layers in enumerate(problem.chunks(starts)):
            chunk_of.update(dict.fromkeys(layers, s))
        extra = [0.0] * problem.S
        for i, (_c, layer) in enumerate(choice.layers):
            s = chunk_of[layer.name]
            mode = (recompute[s] or {}).get(layer.name)
            for o in range(1, len(layer.modes)):
                if (i, o) in choice.r:
                    vals[choice.r[i, o].name] = float(layer.modes[o] == mode)
            if mode is not None:
                extra[s] += layer.seconds[layer.modes.index(mode)]
        for s, var in enumerate(v["rc"]):
            vals[var.name] = extra[s] / unit
            for k in ("B", "I"):
                dur[k][s] += extra[s]
    elif v.get("rc") is not None and choice is None:  # each chunk's least rerun seconds, in its B and I
        extra = chunk_extra(problem, starts)
        for s, var in enumerate(v["rc"]):
            if math.isfinite(extra[s]):
                vals[var.name] = extra[s] / unit
                for k in ("B", "I"):
                    dur[k][s] += extra[s]
    if v.get("zero") is not None:  # ZeRO's op times and synchronisation: the executor's own (pass_times)
        from ...cost.passes import pass_times

        pt = pass_times(problem.instance, problem.plan(starts, recompute))
        for k, got in (("F", pt.forward), ("B", pt.backward), ("I", pt.input_grad), ("W", pt.weight_grad)):
            dur[k] = [float(x) for x in got]
        sched = problem.schedule
        vals[v["zero_sync"].name] = max(sum(pt.sync[s] for s in sched.stages_on(r)) for r in range(sched.ranks)) / unit
    for k, row in v["d"].items():
        for i, var in enumerate(row):
            if var is not None:
                vals[var.name] = dur[k][i] / unit
    return vals, dur


def chunk_extra(problem: ScheduleProblem, starts) -> list[float]:
    """Seconds per chunk of the split that its recompute set adds to its B (or I) - the least
    that fits its memory with the schedule's in-flight count (``problem.recomputation.extra``;
    ``inf`` where none fits) - as :func:`recompute_rows` states them; zeros without recomputation."""
    bounds = [0, *problem.check_starts(starts), problem.n]
    rc = problem.recomputation
    if rc is None:
        return [0.0] * problem.S
    flight = problem.schedule.in_flight()
    return [float(rc.extra(flight[s])[bounds[s + 1], bounds[s]]) for s in range(problem.S)]


def recompute_rows(problem: ScheduleProblem, lp, split, u: float) -> list | None:
    """Each chunk's recompute seconds ``q_s`` (in the model's time unit, ``u`` per second) as rows
    over the split's cumulative binaries; ``None`` with ``recompute="none"``.

    With one chunk per rank and the schedule's W places (what :func:`.milp.solve_milp` accepts with
    recomputation), chunk s keeps ``k_s`` microbatches in flight
    (:meth:`pipeopt.schedules.Schedule.in_flight`) and its own memory is its rank's, so the least
    seconds its recompute set adds with its memory fitting is ``e_s(a, b)`` = ``problem.recomputation
    .extra(k_s)[b, a]`` for units ``a..b-1`` (the partition problem's per-stage Pareto frontiers,
    :class:`.recompute.ChunkRecompute`; ``inf`` where no choice fits). ``e_s`` grows with the chunk
    (a choice for a chunk, cut to a smaller one inside it, adds no more seconds and keeps no more
    bytes: the bytes kept after a layer that the smaller chunk drops were paid ``k_s >= 1`` times).
    The chunk covers ``[a, b)`` exactly when ``started(s, a) - started(s + 1, b - 1) = 1`` (else the
    difference is <= 0), so

    ``q_s >= e_s(a, b) (started(s, a) - started(s + 1, b - 1))`` for every ``[a, b)`` inside its
    reach (from its earliest start to its latest end; constants where the binaries are),
    and ``started(s, a) - started(s + 1, b - 1) <= 0`` where ``e_s(a, b) = inf``,

    make ``q_s >= e_s`` of the chunk (by monotonicity the largest row is the chunk's own), and the
    memory rows are these ``inf`` rows (the per-rank rows of :func:`memory_terms` are not used). Only
    the rows a smaller interval does not imply are added (``e_s(a, b)`` above both ``e_s(a + 1, b)``
    and ``e_s(a, b - 1)``; an ``inf`` row only where both are finite). No binary per layer: the
    chosen sets are read back per chunk (:meth:`ScheduleProblem.chunk_recompute`). With
    ``recompute="full"`` the seconds are linear in the split (``q_s`` = the chunk's difference of
    the prefix sums of every layer's rerun seconds) and only the ``inf`` rows are added."""
    rc = problem.recomputation
    if rc is None:
        return None
    S, n = problem.S, problem.n
    flight = problem.schedule.in_flight()
    rc.prepare(sorted(set(flight)))

    def started(t: int, c: int):
        if t == 0:
            return 1 if c >= 0 else 0
        if t == S:
            return 1 if c >= n else 0
        return split.started(t, c)

    def term(val, sign):
        return ([], float(val) * sign) if isinstance(val, int) else ([(val, sign)], 0.0)

    full = rc.mode == "full"
    if full:  # every layer recomputed: the seconds are a prefix sum (one option per layer, the forced one)
        per_unit = [sum(layer.seconds[0] for layer in rc.units[c]) for c in range(n)]
        prefix = [0.0]
        for x in per_unit:
            prefix.append(prefix[-1] + x)
    q = []
    for s in range(S):
        e = rc.extra(flight[s])
        qs = lp.add_variable(f"recompute_time_{s}", lowBound=0)
        q.append(qs)
        if full:
            e_terms, e_const = split.at(prefix, s + 1, u)
            b_terms, b_const = split.at(prefix, s, u)
            split.add(merged(e_terms + [(x, -a_) for x, a_ in b_terms] + [(qs, -1.0)]), e_const - b_const,
                      f"recompute_full_{s}", pulp.LpConstraintEQ)
        # every interval inside the chunk's reach (its earliest start .. its latest end): the rows of
        # the smaller intervals are what lets a row implied by them be left out
        a_lo = 0 if s == 0 else split.model.window(s)[0]
        b_hi = n if s == S - 1 else split.model.window(s + 1)[-1]
        for a in range(a_lo, b_hi):
            for b in range(a + 1, b_hi + 1):
                val = float(e[b, a])
                inner = max(float(e[b, a + 1]) if b > a + 1 else 0.0, float(e[b - 1, a]) if b - 1 > a else 0.0)
                if val <= inner or val <= 0 or (full and not math.isinf(val)):
                    continue
                t1, c1 = term(started(s, a), 1.0)
                t2, c2 = term(started(s + 1, b - 1), -1.0)
                if math.isinf(val):
                    if math.isinf(inner):
                        continue
                    split.add(merged(t1 + t2), c1 + c2, f"recompute_fits_{s}_{a}_{b}")
                else:
                    sec = val * u
                    split.add(merged([(x, a_ * sec) for x, a_ in t1 + t2] + [(qs, -1.0)]), (c1 + c2) * sec,
                              f"recompute_{s}_{a}_{b}")
    return q
