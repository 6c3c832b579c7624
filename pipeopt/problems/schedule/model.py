"""The pieces every schedule MILP shares (:mod:`.milp`, the schedule's own W placement;
:mod:`.w_placement`, free W placement): the split's cumulative binaries and one duration per
chunk and action kind tied to the prefix sums, the memory rows, the MIP start of a split.
The formulations are described in :mod:`.milp`'s docstring."""

from __future__ import annotations

from ...lazy import lazy_module
from ...cost import rules
from ..partition.model import CumulativeSplit
from .problem import ScheduleProblem

pulp = lazy_module("pulp")

__all__ = ["MEMORY_WIDEN", "chunk_durations", "memory_scale", "memory_terms", "merged", "split_and_durations",
           "split_values"]


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
        and ``v = {"Z": ..., "y": ..., "d": kind -> list of variables or None}``.
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

    def between(arr, s, scale):
        """``(arr[p_{s+1}] - arr[p_s]) * scale`` as (terms, constant)."""
        e_terms, e_const = split.at(arr, s + 1, scale)
        b_terms, b_const = split.at(arr, s, scale)
        return e_terms + [(x, -c) for x, c in b_terms], e_const - b_const

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
    return lp, split, between, v


def memory_scale(problem: ScheduleProblem) -> tuple[float, float]:
    """``(scale, limit)``: bytes are multiplied by ``scale`` (1 / capacity) in the memory rows,
    whose right-hand side is :func:`pipeopt.cost.rules.memory_limit` widened by
    :data:`MEMORY_WIDEN`, scaled."""
    cap = problem.capacity
    scale = 1.0 / cap if cap > 0 else 1.0
    return scale, float(rules.memory_limit(cap)) * scale * (1 + MEMORY_WIDEN)


def memory_terms(problem: ScheduleProblem, split, between, rank: int, counts) -> tuple[list, float]:
    """The memory row of ``rank`` when its chunks hold ``counts`` microbatches in flight (one
    count per chunk of :meth:`~pipeopt.schedules.Schedule.stages_on`), as (terms, constant) of
    ``row <= 0``: :func:`pipeopt.cost.rules.stage_memory` summed over the rank's chunks (its
    activation and parameter bytes linear in the split), minus the limit (:func:`memory_scale`)."""
    P, sched = problem.prefixes, problem.schedule
    scale, limit = memory_scale(problem)
    terms, const = [], -limit
    for s, k in zip(sched.stages_on(rank), counts, strict=True):
        for arr, w in ((P["act"], k), (P["param"], sched.parameter_copies)):
            if w:
                t_, c_ = between(arr, s, scale * w)
                terms += t_
                const += c_
    return terms, const


def split_values(problem: ScheduleProblem, v: dict, starts, unit: float) -> tuple[dict, dict]:
    """MIP start values of the split's binaries and of the duration variables of
    :func:`split_and_durations` for ``starts``; returns ``(values, durations)``
    (:func:`chunk_durations`)."""
    vals = {}
    for t, row in v["y"].items():
        for c, var in row.items():
            vals[var.name] = float(c >= starts[t - 1])
    dur = chunk_durations(problem, starts)
    for k, row in v["d"].items():
        for i, var in enumerate(row):
            if var is not None:
                vals[var.name] = dur[k][i] / unit
    return vals, dur
