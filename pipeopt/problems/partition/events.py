"""Exact event-time MILP of a finite run: the straight split that minimises the iteration time.

Synchronous training runs M microbatches and flushes the pipeline. With the order of the
operations on every worker and link fixed by the schedule (:mod:`pipeopt.cost.schedule`:
``"1f1b"`` is 1F1B with a flush, ``"gpipe"`` is fill-drain), the run is a max-plus system
over a fixed directed acyclic graph of operations, and its iteration time is the longest path
through that graph (:func:`pipeopt.cost.schedule.makespan`, = ``evaluate(...).iteration_time``
/ ``.gpipe_time`` = what :func:`pipeopt.simulate` measures). Only the op *durations* depend on
the split, and in the one-order space (one worker per stage, sequential execution, window
``k_s = S - s``, one link per cut) they are linear in the stage starts
``0 = p_0 < p_1 < ... < p_S = n``, all in seconds:

* forward op of stage s: ``Fpre[p_{s+1}] - Fpre[p_s]`` (plus ``send[p_{s+1}]`` without overlap),
* backward op of stage s: ``Bpre[p_{s+1}] - Bpre[p_s]`` (plus ``send[p_s]`` without overlap),
  each op plus its pass's stage overhead (:attr:`CostTable.overhead`, half at each boundary),
* transfer X / Y of one microbatch over cut c (stages c, c+1): ``send[p_{c+1}]`` (with overlap
  only; without it there are no X / Y ops),

with ``Fpre``, ``Bpre`` the pass prefixes of the cost table on one worker
(:meth:`pipeopt.cost.CostTable.pass_prefix`; ``Fpre + Bpre`` is
:attr:`PartitionProblem.work_prefix`) and ``send`` :attr:`CostTable.send_time` (bytes /
bandwidth). :func:`op_times` gives them for a split; the tests check them against
:func:`pipeopt.evaluate`'s ``forward_op`` / ``backward_op``.

Formulation (:func:`build_events`)
----------------------------------
The split is decided by the cumulative binaries of the partition MILP
(:mod:`pipeopt.problems.partition.milp`): ``y[t, c] = 1`` iff stage t has started by unit c,
over the windows of :meth:`StraightModel.window`, so a prefix array taken at a stage start is
linear in them. Then, with one continuous start time ``t_q >= 0`` per op q of
:func:`pipeopt.cost.schedule.run_graph` and one continuous duration per stage and pass
(``d^F_s``, ``d^B_s``) and per cut (``d^X_c``, the same for Y: as many gradient bytes come back),
each equal to its linear expression::

    minimise Z  s.t.
      t_q >= t_a + d_a          for every dependency a -> q of the run graph
      Z   >= t_q + d_q          for every op q that nothing depends on
      monotone / non-empty rows of y, memory reach rows (StraightModel.reach)

(the event rows are :func:`pipeopt.problems.run_rows.add_run_rows`, shared with Bi-Partition's
tie-break). No big-M is needed: the order of the ops is the schedule's, only their durations vary. For
integral y the least Z over the start times is the longest path, i.e. the exact iteration
time, so the MILP optimum is the least iteration time over the splits that fit.

**Memory** is exact, as in the partition MILP: stage t of units ``a..b-1`` fits iff
``b <= reach_t[a]`` (:meth:`PartitionProblem.memory_reach` with the schedule's in-flight
count: ``S - t`` under 1F1B, M under GPipe), stated as 0/1 rows
``y[t, a] <= y[t+1, reach_t[a]]``. A plan the table admits but :func:`pipeopt.evaluate` does
not (float summation order) has its stage removed (:meth:`StraightModel.forbid`) and the model
is solved again.

**Period cap** (``period_cap``, for tie-breaking: the least iteration time among the plans of
optimal steady period): the window rows of :attr:`PartitionProblem.trip` --
``sum_{s=i..l} w_s + sum_{c=i+1..l} trip[p_c] <= (l - i + 1) cap`` for every ``i <= l``, with
``w_s`` :meth:`PartitionProblem.stage_work` -- and ``bound[p_c] <= cap``
(:attr:`PartitionProblem.cut_terms`), each against ``cap (1 + CAP_REL)``; so the admitted splits
are those whose :meth:`PartitionProblem.period` is at most the cap. A solver plan whose period
exceeds ``cap (1 + CAP_REL)`` (solver tolerances) is cut off by a no-good row and the model
solved again.

Size: ``(S - 1)(n - S + 1)`` binaries; ``2 S M`` ops with overlap plus ``2 (S - 1) M``
transfers (``2 S M`` without overlap), so about ``4 S M`` continuous start times and about
``3`` rows of 3 nonzeros per op; ``S (n - S + 1)`` memory rows; ``S (S + 1) / 2`` window rows
of ``O(n + S)`` nonzeros with a cap. The LP relaxation is weak in the binaries (fractional
starts give fractional durations), so branch and bound grows with n - S and S. Measured
(1F1B, one thread): the tests' chains (n <= 8, M <= 6) in about 0.05 s each; PipeDream
profiles of 22-70 units with S <= 4, M <= 16 in 0.1-5 s (CBC), S = 8 (434 binaries, 480 ops
at M = 16) in 1-15 s with CBC and 3-30 s with HiGHS; with the period cap (tie-break) it is
usually faster, the cap rows prune most splits.

Every plan is re-scored by :func:`pipeopt.evaluate` with objective ``"iteration"`` (1F1B) or
``"gpipe"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...lazy import lazy_module
from ...backends.scaling import model_unit
from ...backends.deadline import Deadline, DeadlineReached
from ...backends.lazy import Verdict, resolve
from ...backends.pulp import SOLVERS
from ...cost import evaluate, rules
from ...cost.schedule import FLUSH_SCHEDULES
from ...errors import InvalidProblemError
from .. import secondary
from ..run_rows import add_run_rows, run_start_values
from .model import (
    BOUND_SLACK,
    HEURISTIC_SHARE,
    MILP_ABS_GAP,
    MILP_REL_GAP,
    MILP_TOLERANCE,
    CumulativeSplit,
    StraightModel,
    balanced_split,
    check_options,
    heuristic_split,
    starts_from_cumulative,
)
from .ops import event_graph, op_prefixes, op_times, run_time, schedule_reach
from .problem import PartitionProblem

pulp = lazy_module("pulp")

__all__ = [
    "CAP_REL",
    "OBJECTIVE_OF",
    "EventOutcome",
    "build_events",
    "event_graph",
    "op_prefixes",
    "op_times",
    "run_time",
    "schedule_reach",
    "solve_events",
]

OBJECTIVE_OF = {"1f1b": "iteration", "gpipe": "gpipe"}
"""The :class:`pipeopt.Settings` objective that scores each flush schedule."""

CAP_REL = secondary.CAP_REL
"""Relative slack of ``period_cap``: a split is admitted if its steady period is at most
``cap * (1 + CAP_REL)`` (plans tied on the period differ by float summation order only; the
tie-breaks' common slack, :data:`pipeopt.problems.secondary.CAP_REL`)."""

_TIME_SCALE = 1000.0
"""The solver's time unit is a reference iteration time / this (so Z is about 10..1000)."""


@dataclass
class EventOutcome:
    """What :func:`solve_events` found.

    Attributes
    ----------
    starts
        ``list[int]``: starts of stages 1..S-1 of the best split found that fits in memory
        (and has period at most the cap), or ``None`` if none was found.
    value
        Seconds: that split's iteration time under the schedule, by :func:`pipeopt.evaluate`
        (objective ``"iteration"`` or ``"gpipe"``); ``inf`` without a split.
    bound
        Seconds: a valid lower bound on the least iteration time of the admitted splits
        (``inf`` if proven infeasible, ``0.0`` if nothing better is known).
    status
        ``"optimal"`` (proven: value within :data:`~pipeopt.problems.partition.model.MILP_TOLERANCE`
        relative of bound), ``"feasible"`` (a split, no proof), ``"time_limit"`` (stopped at the
        deadline, with the best split seen if any), ``"node_limit"`` (stopped at the solver's node
        limit, :func:`solve_events`'s ``node_limit``) or ``"infeasible"`` (proven: no split
        fits, or none fits with period at most the cap). The loop that gets there is
        :func:`pipeopt.backends.lazy.resolve`.
    info
        Solver and model details (for ``Result.info``).
    """

    starts: list[int] | None
    value: float
    bound: float
    status: str
    info: dict = field(default_factory=dict)


# ---- the model -----------------------------------------------------------------------------
def _tie_sync(problem: PartitionProblem, split: CumulativeSplit, scale: float):
    """The tied parameters' all-reduce after the flush (:func:`pipeopt.cost.rules.tie_sync_time`
    between the k stages holding each tie), as a linear expression of new binaries: per tie with
    user units ``u_0 < ... < u_{r-1}``, ``z_i >= started(t, u_{i+1}) - started(t, u_i)`` for
    every stage t (``z_i = 1`` iff some stage starts in ``(u_i, u_{i+1}]``, which minimisation
    makes exact: the time grows with k), ``k = 1 + sum z_i`` chosen by one-hot binaries
    ``h_k`` (``sum h_k = 1``, ``sum k h_k = k``), the time ``sum_k h_k sync(k)``. ``0`` without
    ties."""
    ties = problem.table.ties
    expr = pulp.LpAffineExpression()
    S, bw = split.model.S, problem.bus_bandwidth
    for j, (tie, units) in enumerate(zip(ties.ties, ties.units, strict=True)):
        top = min(len(units), S)
        if top < 2 or tie.bytes <= 0:
            continue
        z = []
        for i in range(len(units) - 1):
            zi = split.lp.add_variable(f"tie_{j}_apart_{i}", cat=pulp.LpBinary)
            for t in range(1, S):
                hi, lo = split.started(t, int(units[i + 1])), split.started(t, int(units[i]))
                terms = [(zi, -1.0)] + [(x, c) for x, c in ((hi, 1.0), (lo, -1.0)) if not isinstance(x, int)]
                const = float(sum(c * x for x, c in ((hi, 1.0), (lo, -1.0)) if isinstance(x, int)))
                split.add(terms, const, f"tie_{j}_apart_{i}_{t}")
            z.append(zi)
        h = {k: split.lp.add_variable(f"tie_{j}_holders_{k}", cat=pulp.LpBinary) for k in range(1, top + 1)}
        split.add([(x, 1.0) for x in h.values()], -1.0, f"tie_{j}_one", pulp.LpConstraintEQ)
        split.add([(x, float(k)) for k, x in h.items()] + [(x, -1.0) for x in z], -1.0, f"tie_{j}_count",
                  pulp.LpConstraintEQ)
        expr += pulp.LpAffineExpression([(x, float(rules.tie_sync_time(tie.bytes, k, bw, problem.table.latency)) * scale)
                                         for k, x in h.items()])
    return expr


def _tie_sums(problem: PartitionProblem, split: CumulativeSplit, scale: float, v: dict) -> list[list]:
    """The tied parameters' gradient sums on each stage's backward
    (:func:`pipeopt.cost.rules.tie_sum_time`, :meth:`PartitionProblem.tie_sum`) as linear terms
    per stage: for each tie with a measured sum and two layers one stage can hold, a continuous
    ``q_s >= sum_u member(s, u) - 1`` (u over its layers' units, repeats counted), ``q_s >= 0``,
    times the seconds of one sum. Minimisation makes ``q_s`` exact where the stage's backward
    matters; elsewhere a larger ``q_s`` only lengthens an op off the longest path, and the split
    is re-scored by :func:`pipeopt.evaluate`. Empty lists without such ties; ``v["tie_sums"]``
    maps each ``q_s``'s name to ``(tie, stage)`` for the MIP start."""
    S = split.model.S
    out: list[list] = [[] for _ in range(S)]
    ties = problem.table.ties
    if not ties:
        return out
    kind, units = problem.kind, problem.instance.cluster.devices[0].resources[problem.kind]
    v["tie_sums"] = {}
    for j, (tie, where, bind) in enumerate(zip(ties.ties, ties.layer_units, ties.binding(problem.n, S), strict=True)):
        sec = tie.sum_on(kind) / units
        if not bind or sec <= 0:
            continue
        for s in range(S):
            q = split.lp.add_variable(f"tie_{j}_sums_{s}", lowBound=0.0)
            v["tie_sums"][q.name] = (j, s)
            coef: dict = {q: -1.0}
            const = -1.0
            for c in where.tolist():  # a unit holding two of its layers counts twice
                t_, c_ = split.member(s, int(c))
                for x, a in t_:
                    coef[x] = coef.get(x, 0.0) + a
                const += c_
            split.add(list(coef.items()), const, f"tie_{j}_sums_{s}_def")
            out[s].append((q, sec * scale))
    return out


def build_events(
    model: StraightModel,
    schedule: str,
    unit: float,
    *,
    period_cap: float | None = None,
    exclude: list | None = None,
    deadline: Deadline | None = None,
) -> tuple[pulp.LpProblem | None, dict]:
    """Build the event-time MILP (module docstring) on ``model`` (its ``reach`` is the memory).

    Parameters
    ----------
    model
        :class:`StraightModel` of the problem, with ``reach`` set to the schedule's memory
        (:func:`schedule_reach`).
    schedule
        ``"1f1b"`` or ``"gpipe"``.
    unit
        Seconds per unit of the solver's time values.
    period_cap
        Seconds, or ``None``: admit only splits of steady period at most the cap.
    exclude
        Splits (lists of starts) to cut off by no-good rows.
    deadline
        Building stops with :class:`~pipeopt.backends.deadline.DeadlineReached` when it passes.

    Returns
    -------
    (lp, v)
        The PuLP problem (``None`` if a memory or cap row is false on constants: no split is
        admitted) and its variables: ``v["Z"]``, ``v["y"][t][c]``, ``v["t"]`` (list per op of
        :func:`event_graph`), ``v["dF"]``, ``v["dB"]``, ``v["dX"]``, ``v["graph"]``.
    """
    deadline = Deadline(None) if deadline is None else deadline
    problem = model.problem
    S = model.S
    graph = event_graph(problem, schedule)
    lp = pulp.LpProblem("partition_events", pulp.LpMinimize)
    Z = lp.add_variable("iteration", lowBound=0.0)
    split = CumulativeSplit(lp, model)
    y, add = split.y, split.add
    v = {"Z": Z, "y": y, "graph": graph}
    lp += Z + _tie_sync(problem, split, 1.0 / unit), "iteration_time"

    # structure of the split
    for t in range(1, S):
        split.structure_rows(t)
    # memory: p_t <= a implies p_{t+1} <= reach_t[a]
    for t in range(S):
        deadline.check("building the event MILP")
        if not split.reach_rows(t, model.reach[t]):
            return None, v
    u = 1.0 / unit
    # durations
    arr = op_prefixes(problem)
    dF = [lp.add_variable(f"dur_F_{s}", lowBound=0.0) for s in range(S)]
    dB = [lp.add_variable(f"dur_B_{s}", lowBound=0.0) for s in range(S)]
    sums = _tie_sums(problem, split, u, v)
    for s in range(S):
        for d, end, begin in ((dF[s], arr["f_end"], arr["f_begin"]), (dB[s], arr["b_end"], arr["b_begin"])):
            e_terms, e_const = split.at(end, s + 1, u)
            b_terms, b_const = split.at(begin, s, u)
            extra = sums[s] if d is dB[s] else []
            add(e_terms + [(x, -c) for x, c in b_terms] + extra + [(d, -1.0)], e_const - b_const, f"{d.name}_def",
                pulp.LpConstraintEQ)
    dX = []
    if problem.instance.settings.overlap:
        for c in range(S - 1):
            d = lp.add_variable(f"dur_X_{c}", lowBound=0.0)
            terms, const = split.at(arr["xfer"], c + 1, u)
            add(terms + [(d, -1.0)], const, f"dur_X_{c}_def", pulp.LpConstraintEQ)
            dX.append(d)
    v.update(dF=dF, dB=dB, dX=dX)
    # events: one start time per op (the rows shared with Bi-Partition's tie-break)
    v["t"] = add_run_rows(lp, graph, {"F": dF, "B": dB, "X": dX, "Y": dX}, Z, deadline)
    # the period cap: window rows and cut rows against cap (1 + CAP_REL)
    if period_cap is not None:
        deadline.check("building the event MILP")
        cap = float(period_cap) * (1 + CAP_REL) * u
        added, bound = problem.cut_terms
        mid = 2 * np.asarray(added, dtype=float) + np.asarray(problem.trip, dtype=float)
        mvars = {}
        for c in range(1, S):
            if np.any(mid[list(model.window(c))] != 0):
                mv = lp.add_variable(f"cut_trip_{c}", lowBound=0.0)
                terms, const = split.at(mid, c, u)
                add(terms + [(mv, -1.0)], const, f"cut_trip_{c}_def", pulp.LpConstraintEQ)
                mvars[c] = mv
            if np.max(np.asarray(bound)[list(model.window(c))], initial=0.0) > 0:
                terms, const = split.at(bound, c, u)
                if not terms and const > cap:
                    return None, v
                add(terms, const - cap, f"cut_cap_{c}")
        for i in range(S):
            b_terms, b_const = split.at(model.begin, i, u)
            for l in range(i, S):
                e_terms, e_const = split.at(model.end, l + 1, u)
                terms = e_terms + [(x, -c) for x, c in b_terms]
                terms += [(mvars[c], 1.0) for c in range(i + 1, l + 1) if c in mvars]
                const = e_const - b_const - (l - i + 1) * cap
                if not terms:
                    if const > 0:
                        return None, v
                    continue
                add(terms, const, f"window_{i}_{l}")
    # no-goods: sum over binaries of |y - y_hat| >= 1
    for r, starts in enumerate(exclude or []):
        terms, const = [], 1.0
        for t in range(1, S):
            for c, var in y[t].items():
                if c >= starts[t - 1]:
                    terms.append((var, 1.0))  # y_hat = 1: contributes 1 - y
                    const -= 1.0
                else:
                    terms.append((var, -1.0))
        # sum_{hat 1} (1 - y) + sum_{hat 0} y >= 1  <=>  sum_{hat 1} y - sum_{hat 0} y + 1 - #hat1 <= 0
        add(terms, const, f"nogood_{r}")
    return lp, v


def _start_values(problem: PartitionProblem, v: dict, schedule: str, starts: list[int], unit: float) -> dict:
    """A full MIP start: the binaries of ``starts``, its durations and earliest event times."""
    vals = {}
    for t, row in v["y"].items():
        for c, var in row.items():
            vals[var.name] = float(c >= starts[t - 1])
    f, b, x = op_times(problem, starts)
    for s in range(problem.stages):
        vals[v["dF"][s].name] = f[s] / unit
        vals[v["dB"][s].name] = b[s] / unit
    for c, d in enumerate(v["dX"]):
        vals[d.name] = x[c] / unit
    if v.get("tie_sums"):  # q_s = (users on stage s) - 1, at least 0
        p = np.array([0, *starts, problem.n])
        users = problem.table.ties.users(p[:-1], p[1:])  # per tie, per stage
        for name, (j, s) in v["tie_sums"].items():
            vals[name] = float(max(int(users[j][s]) - 1, 0))
    graph = v["graph"]
    vals.update(run_start_values(graph, v["t"], v["Z"], graph.durations(f, b, x, x), unit)[1])
    return vals


# ---- the solve -----------------------------------------------------------------------------
def solve_events(
    problem: PartitionProblem,
    schedule: str = "1f1b",
    *,
    period_cap: float | None = None,
    deadline: Deadline | float | None,
    solver: str = "cbc",
    threads: int = 1,
    seed: int = 0,
    hint: list[int] | None = None,
    node_limit: int | None = None,
) -> EventOutcome:
    """The straight split of least iteration time of M microbatches, exactly (module docstring).

    Parameters
    ----------
    problem
        A straight :class:`PartitionProblem` (``replication=False``); M is its instance's
        ``settings.microbatches``, overlap its ``settings.overlap``.
    schedule
        ``"1f1b"`` (1F1B with a flush; memory: ``S - s`` microbatches in flight on stage s)
        or ``"gpipe"`` (fill-drain; M in flight).
    period_cap
        Seconds: admit only splits whose steady period (:meth:`PartitionProblem.period`, the
        ``bottleneck`` objective) is at most ``period_cap * (1 + CAP_REL)``; ``None`` for no cap.
        With the optimal bottleneck as cap, the result is the least iteration time among the
        bottleneck-optimal splits (the exact methods' tie-break).
    deadline
        Seconds or a :class:`~pipeopt.backends.deadline.Deadline` (``None``: no limit): one
        clock for the warm start (at most a quarter of it when no ``hint``), model building and
        the solver (:func:`pipeopt.backends.pulp.solve_pulp` ends it at the deadline).
    solver
        ``"cbc"`` or ``"highs"``.
    threads, seed
        Solver threads (>= 1) and random seed (>= 0).
    hint
        Starts of stages 1..S-1 of a split to warm-start from (used if it fits and meets the
        cap); ``None``: the best of two quick splits (:func:`balanced_split`,
        :func:`heuristic_split`).
    node_limit
        Branch-and-bound nodes per solver run (``None``: no limit): a limit on work, not on
        time, so a solve stopped by it returns the same split on every run (status
        ``"node_limit"``).

    Returns
    -------
    EventOutcome
        ``value`` is ``evaluate(instance.with_settings(objective=OBJECTIVE_OF[schedule]),
        plan).objective`` (seconds), ``bound`` a valid lower bound (seconds) on the least
        iteration time of the admitted splits (the solver's dual bound less
        :data:`~pipeopt.problems.partition.model.BOUND_SLACK` relative). S = 1 and S = n have
        one split: it is scored directly.

    Raises
    ------
    InvalidProblemError
        If ``problem.replication`` is set, the schedule or solver is unknown, ``threads`` < 1,
        ``seed`` < 0, ``period_cap`` is not a number >= 0, the hint is not a split into S
        stages, or the deadline is not a valid time limit.
    """
    deadline = Deadline.of(deadline)
    if schedule not in FLUSH_SCHEDULES:
        raise InvalidProblemError(f"unknown schedule {schedule!r}; choose from {list(FLUSH_SCHEDULES)}")
    if solver not in SOLVERS:
        raise InvalidProblemError(f"unknown MILP solver {solver!r}; choose from {list(SOLVERS)}")
    check_options("events", threads, seed)
    if period_cap is not None:
        if isinstance(period_cap, bool) or not isinstance(period_cap, (int, float, np.floating, np.integer)) \
                or not period_cap >= 0 or math.isnan(period_cap):
            raise InvalidProblemError(f"period_cap must be a number >= 0 (seconds), got {period_cap!r}")
        period_cap = float(period_cap)
    model = StraightModel.of(problem, "events")
    n, S = model.n, model.S
    if hint is not None:
        hint = [int(c) for c in hint]
        if len(hint) != S - 1 or any(a >= b for a, b in zip([0, *hint], [*hint, n])):
            raise InvalidProblemError(f"hint {hint} is not the starts of {S} non-empty stages over {n} units")
    model.reach = schedule_reach(problem, schedule)
    inst = problem.instance.with_settings(objective=OBJECTIVE_OF[schedule])
    info: dict = {"schedule": schedule, "objective": OBJECTIVE_OF[schedule], "solver": solver,
                  "microbatches": inst.settings.microbatches, "period_cap": period_cap}

    def score(starts) -> tuple[float, bool, list]:
        ev = evaluate(inst, problem.plan(starts))
        if ev.feasible:
            return ev.objective, True, []
        p = [0, *starts, n]
        return ev.objective, False, [(t, p[t], p[t + 1]) for t in range(S) if not problem.fits(ev.memory[t])]

    def capped(starts) -> bool:
        return period_cap is None or problem.period(starts) <= period_cap * (1 + CAP_REL)

    only = model.single_split
    if only is not None:
        value, fits, _ = score(only)
        info["solver"] = "none (S = 1 or S = n: one split only, scored by evaluate)"
        if fits and capped(only):
            return EventOutcome(only, value, value, "optimal", info)
        info["why"] = ("the only split breaks memory" if not fits
                       else "the only split's period exceeds the cap")
        return EventOutcome(None, math.inf, math.inf, "infeasible", info)

    # the incumbent: the hint, or the best quick split
    incumbent, inc_value = None, math.inf
    candidates = [hint] if hint is not None else [balanced_split(model)]
    if hint is None:
        try:
            candidates.append(heuristic_split(model, deadline.sub(fraction=HEURISTIC_SHARE)))
        except DeadlineReached:  # pragma: no cover - the heuristic stops itself
            pass
    for cand in candidates:
        value, fits, _ = score(cand)
        if fits and capped(cand) and value < inc_value:
            incumbent, inc_value = list(cand), value
    info.update(warm_start=incumbent, warm_start_value=inc_value if incumbent is not None else None)
    ref = inc_value if incumbent is not None else run_time(problem, candidates[0], schedule)[0]
    unit = model_unit(ref, _TIME_SCALE) if ref > 0 and math.isfinite(ref) else model.time_unit
    info["time_unit"] = unit

    info["bound_source"] = "none (0)"

    def build(exclude, clock):
        return build_events(model, schedule, unit, period_cap=period_cap, exclude=exclude, deadline=clock)

    def first(lp, v):
        info.update(binaries=sum(len(r) for r in v["y"].values()), ops=len(v["t"]),
                    constraints=lp.numConstraints())

    def read(v, out):
        y = v["y"]
        return starts_from_cumulative({t: {c: out.value(y[t][c]) for c in y[t]} for t in y}, model)

    def verdict(starts) -> Verdict:
        value, fits, over = score(starts)
        ok = capped(starts)
        if fits and ok:
            return Verdict(value, True)
        if not fits and over:
            def forbid() -> str:
                for t, a, b_ in over:
                    model.forbid(t, a, b_)
                return f"stages {over} removed"
            return Verdict(value, False, "breaks memory by evaluate", cut=forbid)
        return Verdict(value, False, f"not admitted (fits: {fits}, within cap: {ok})")

    lazy = resolve(build, lambda v, starts: _start_values(problem, v, schedule, starts, unit), read, verdict,
                   deadline=deadline, unit=unit, incumbent=incumbent, value=inc_value, solver=solver,
                   rel_gap=MILP_REL_GAP, abs_gap=MILP_ABS_GAP, tolerance=MILP_TOLERANCE, bound_slack=BOUND_SLACK,
                   threads=threads, seed=seed, node_limit=node_limit, info=info, on_first=first,
                   empty_note="memory or cap rows false on constants")
    if lazy.notes:
        info["notes"] = lazy.notes
    return EventOutcome(lazy.plan, lazy.value, lazy.bound, lazy.status, info)
