"""The free-order schedule problem, exactly: the split and every rank's order of F, I, W together.

``ScheduleProblem(inst, "free", stages=p, microbatches=m[, stages_per_rank=v, placement=...])``
(:mod:`pipeopt.schedules.free`) fixes only the shape - p ranks, v stages per rank, the
placement, m microbatches - and asks for the split of the layer chain into the ``S = p v``
chunks *and* the order of the actions on every rank that end the iteration soonest, under the
executor's rules (:mod:`pipeopt.schedules.dag`, :mod:`pipeopt.schedules.execute`):

* one action at a time per rank; F(s, j) after the activations of F(s - 1, j); I(s, j) after
  F(s, j) and the input gradient of I(s + 1, j); W(s, j) after I(s, j);
* data between two ranks travels on the link: with ``settings.overlap`` each direction
  between two ranks is one channel carrying its transfers one at a time **in the order the
  sending rank produces them** (full duplex); without overlap the sending action carries its
  transfer (:func:`pipeopt.cost.rules.carried`);
* memory: a microbatch's activations stay on its stage from the start of its F to the end of
  its W; with the chunks' parameters (``parameter_copies`` each) a rank's peak stays within its
  device's memory (:func:`pipeopt.cost.rules.stage_memory`, :func:`~pipeopt.cost.rules.memory_limit`).

The model (CP-SAT, :func:`solve_free_order`, method ``cpsat``)
---------------------------------------------------------------
Times in integer *ticks* of ``unit`` seconds (``unit`` = the warm start's iteration time /
:data:`TICKS`), bytes in ticks of ``capacity /`` :data:`MEMORY_TICKS`.

* **Split**: integer boundaries ``b_0 = 0 < b_1 < ... < b_S = n`` (``b_t`` in chunk t's start
  window); for each prefix array X of :attr:`ScheduleProblem.prefixes` two element
  constraints give ``floor(X[b_t] / unit)`` and ``ceil(X[b_t] / unit)``, and chunk s of kind k
  lasts ``d_k,s = max(0, floor(X_k[b_s+1]) - ceil(X_k[b_s]))`` ticks - never more than its true
  duration, so **rounding relaxes the model**: every true schedule is a schedule of the model,
  and the model's proven bound (times ``unit``) is a valid lower bound. Without overlap F and I
  also carry their transfers (floored the same way).
* **Actions**: one interval per action (its chunk's duration), ``NoOverlap`` per rank
  (CP-SAT's disjunctive propagation and energy reasoning).
* **Transfers** (with overlap, across ranks): one interval per transfer after its producer and
  before its consumer; per channel the transfers keep the producer's order: within one
  (boundary, direction) the microbatch order (below), between two of them one order literal
  per pair that orders both the producers (on their rank) and the transfers.
* **Symmetry breaking**: on each stage the microbatches run each kind in their index order
  (``F(s, j)`` ends before ``F(s, j + 1)`` starts, the same for I and W). Microbatches are
  identical, so relabelling them in the order a stage starts them changes no time and no
  memory count; the brute force over every order on small instances
  (``tests/problems/schedule/test_free_order.py``) finds nothing better.
* **Memory** (finite capacity): per rank a ``Cumulative`` over the intervals F(s, j).start ..
  W(s, j).end with demand ``floor(act_s)`` ticks, capacity ``ceil(limit) - copies *
  floor(param)`` of the rank's chunks: a relaxation too. A plan the executor then finds over
  memory is not kept. Where a rank holds one stage the same rule is also stated as precedence
  (redundant, it propagates far better): with ``k`` the most microbatches that fit
  (``k act <= room``), F(s, j + k) starts after W(s, j) ends - microbatches run in index order
  on a stage, so k in flight at that F means W(s, j) has ended. (GPT-2 XL, p = 4, m = 8: proven
  in 5.5 s instead of 17-25 s.)
* **Bounds** (redundant rows that tighten the LP): ``Z >= `` each stage's last W; per rank
  ``Z >=`` the forwards before its first stage plus its whole work, and the start of its first
  F plus its whole work; per stage ``Z >=`` the start of its first I plus m (I + W) (every I
  and W of the stage runs after it, in microbatch order).
* **The split bound** (:mod:`.split_bound`): per stage s an element constraint on the pair
  ``(b_s, b_s+1)`` gives ``Z >= g_s(b_s, b_s+1)``, a one-machine bound of the stage's rank with
  its release times (the pipeline's fill), tails and the memory's in-flight limit, and ``Z >=``
  its least value over splits (a bottleneck DP) - each floored to ticks less
  :data:`BOUND_SLACK_TICKS`, so still a relaxation. A pair whose bound exceeds the incumbent
  leaves the boundaries' domains. GPT-2 XL p = 8, m = 16: 375.99 ms (the optimum), where
  CP-SAT's own bound stayed at 338-362 ms in 60 s; perturbed by seed 0: 395.83 ms against 354.22.
  A plan whose executor time meets it is ``optimal`` whatever the solver did (``info["proof"]``).
  With two chunks per rank (looped or V) the constant row is at least the rank bound of
  :mod:`.rank_bound`, which puts both chunks of a rank in one one-machine bound (a DP over the
  ranks' boundary pairs): GPT-2 XL p = 4, m = 8 V 342.92 ms, looped 343.67 ms, p = 8, m = 16 V
  349.29 ms, against 338.13 ms (the busiest rank's work) before.
* **Split first** (with a time limit, before the joint model; :func:`_split_first`): the splits
  whose split bound is below the warm start's time are few (GPT-2 XL p = 8, m = 16: 2-11 within
  1 % of the bound), so each is solved with its boundaries fixed - the model without element
  constraints, which CP-SAT searches far better (GPT-2 XL p = 8 seed 0: 405.24 -> 400.13 ms in 40
  s on one split, where the joint model from the same hint found nothing better) - least bound
  first, an equal share of the time each, pruned once its bound reaches the incumbent. The least
  of their proven bounds (and the split bound of the splits not listed) is a valid bound; it
  proves the incumbent when every split below it is solved or pruned. It takes at most
  :data:`SPLIT_FIRST_SHARE` of the time left; the joint model then gets the rest, hinted with the
  best plan.
* **Warm start** (hint and incumbent): torch's orders of the same placement
  (:func:`pipeopt.schedules.free.as_free` of each) and, with one chunk per rank, the
  zero-bubble greedy (:mod:`.zb_greedy`), each on the splits of the ``uniform`` and
  ``best_1f1b`` baselines and the split bound's least split; the best of these with its split improved by a steepest descent of
  one-layer boundary moves (:func:`descend_split`, every order rescored on every move, at most
  :data:`DESCENT_EVALS` executor runs and half the warm start's share; GPT-2 XL p = 8, m = 16
  perturbed by seed 1: 497.13 -> 391.32 ms); and (with a time limit) the zero-bubble schedule's
  own exact split (:mod:`.milp` on InterleavedZeroBubble or ZBVZeroBubble, within what is left
  of the share); the best by the executor. (Improving the best warm start's order on its own split first, by the same
  model with the split fixed, was tried and dropped: on GPT-2 XL p = 8 it proved the warm order
  already optimal for its split and only took time from the joint model.)

Every plan the solver returns is re-scored by the executor (:meth:`ScheduleProblem.execute`
with the order read from the start times); the result says ``optimal`` only if CP-SAT proved
its model optimal and the executor's time is within :data:`~pipeopt.cost.tolerance.SOLVER_CLAIM`
of the bound (the rounding costs at most a tick per operation on the longest path: about
``4 (S + m) / TICKS`` relative). At the time limit it says ``time_limit`` with the bound.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

import numpy as np

from ...backends.cpsat import solve_cpsat
from ...backends.scaling import model_unit
from ...backends.deadline import Deadline, DeadlineReached
from ...cost import rules
from ...cost.tolerance import FLOAT_NOISE, SOLVER_CLAIM
from ...errors import InfeasibleError, InvalidProblemError, PipeoptError
from ...lazy import lazy_module
from ...schedules import Action, Schedule, as_free, make_schedule
from ...schedules.free import FREE, placement_kind
from .problem import SOLVER, ScheduleProblem, uniform_starts

cp_model = lazy_module("ortools.sat.python.cp_model")

__all__ = ["BOUND_SLACK_TICKS", "DESCENT_EVALS", "MEMORY_TICKS", "TICKS", "FreeOrderModel", "descend_split", "order_from_times", "solve_free_order",
           "warm_starts"]

TICKS = 2**30
"""Ticks in the warm start's iteration time: the time resolution of the CP-SAT model."""

MEMORY_TICKS = 2**20
"""Ticks in a device's memory capacity: the memory resolution of the CP-SAT model."""

BOUND_SLACK_TICKS = 8
"""Ticks taken off each split-bound row of the model (:meth:`FreeOrderModel._split_bound_rows`):
more than the rounding of a true schedule to ticks."""

HINT_SHARE = 0.25
"""Most of the time limit the warm start may take (the rest is the solver's)."""

SPLIT_FIRST_MOST = 48
"""Most splits the split-first decomposition (:func:`_split_first`) solves one by one (those
below the incumbent with the least split bounds; the bound of the rest stands for them)."""


SPLIT_FIRST_SHARE = 0.6
"""Most of what the warm start leaves that the split-first decomposition may take; the joint
model keeps the rest (BERT-large p = 8 perturbed by seed 0 at load 8: with all of it to split
first, 176.45 ms at a 1.1 % gap where the joint model alone had proven 174.95 ms)."""


class _Skipped:
    """Stands for a CP-SAT outcome when the joint model is not solved (the plan is already proven)."""

    status, has_solution, proven, bound, objective = "skipped", False, False, None, None

    def info(self) -> dict:
        """The solver fields of the result's ``info``."""
        return {"solver_status": "not run (proven before the joint model)"}


_KIND_RANK = {"F": 0, "I": 1, "W": 2}


def looped_torch_orders(placement: str, v: int) -> tuple:
    """torch's schedules that run this placement (:data:`pipeopt.problems.spaces.FREE_ORDER_SPACES`)."""
    if placement == "v":
        return ("ZBVZeroBubble", "DualPipeV")
    if v == 1:
        return ("GPipe", "1F1B", "InterleavedZeroBubble")
    return ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble")


DESCENT_EVALS = 600
"""Most executor runs of the warm start's split descent (a work limit: the same descent on every
run, whatever the load; about 10-40 ms each at p = 8, m = 16)."""


def _orders_on(problem: ScheduleProblem, orders: list, starts) -> list:
    """``orders`` plus, with one chunk per rank, the zero-bubble greedy's order of ``starts``."""
    if problem.schedule.stages_per_rank != 1:
        return orders
    from .zb_greedy import zb_greedy_schedule

    try:
        return [*orders, ("ZB-greedy", as_free(zb_greedy_schedule(problem, list(starts))))]
    except PipeoptError:
        return orders


def _scored(problem: ScheduleProblem, orders: list, starts) -> list:
    """``[(time, name, order, starts)]`` of every order in :func:`_orders_on` that fits on ``starts``."""
    out = []
    for name, order in _orders_on(problem, orders, starts):
        ex = problem.execute(list(starts), order)
        if ex.feasible:
            out.append((ex.time, name, order, list(starts)))
    return out


def descend_split(problem: ScheduleProblem, orders: list, best: tuple, deadline: Deadline) -> tuple:
    """Steepest descent on the split of ``best`` = ``(time, name, order, starts)``: each round
    moves one boundary by one layer, scores every order of :func:`_orders_on` on it with the
    executor, and takes the best move if it is faster; stops at a local optimum, after
    :data:`DESCENT_EVALS` executor runs, or at ``deadline``. Returns the best ``(time, name,
    order, starts)`` found (``best`` if none is faster)."""
    n = problem.n
    evals = 0
    while evals < DESCENT_EVALS and not deadline.expired():
        starts = best[3]
        step = None
        for t in range(len(starts)):
            for d in (-1, 1):
                cand = list(starts)
                cand[t] += d
                low = cand[t - 1] if t > 0 else 0
                high = cand[t + 1] if t + 1 < len(cand) else n
                if not low < cand[t] < high:
                    continue
                for c in _scored(problem, orders, cand):
                    if c[0] < (best if step is None else step)[0] * (1 - FLOAT_NOISE):
                        step = c
                evals += len(orders) + 1
        if step is None:
            break
        best = step
    return best


def warm_starts(problem: ScheduleProblem, deadline: Deadline | None = None) -> list:
    """Candidate (order, starts) pairs for a free-order problem (module docstring: torch's
    orders of the placement, the zero-bubble greedy, on the baselines' splits, the best of them
    improved by :func:`descend_split`; then the zero-bubble order's exact split, and where still
    nothing fits the memory the exact split of the placement's other orders, one after the
    other until one fits), each scored by the executor; returns ``[(time, name, order, starts)]``
    best first, only those that fit."""
    from .baselines import best_1f1b

    deadline = Deadline(None) if deadline is None else deadline
    sched = problem.schedule
    p, m, v = sched.ranks, sched.microbatches, sched.stages_per_rank
    kind = placement_kind(sched) or "looped"
    orders = [(FREE, sched)]
    for name in looped_torch_orders(kind, v):
        try:
            orders.append((name, as_free(make_schedule(name, p, m, v if name not in ("GPipe", "1F1B") else None))))
        except PipeoptError:
            continue
    splits = [uniform_starts(problem.n, problem.S)]
    from .split_bound import split_lower_bound

    _, bound_split = split_lower_bound(problem)  # the split whose bound is least
    if bound_split:
        splits.append(bound_split)
    try:
        res = best_1f1b(problem, time_limit=deadline)
        splits.append(res.info["starts"])
    except (PipeoptError, DeadlineReached):
        pass
    out = [c for starts in {tuple(s) for s in splits} for c in _scored(problem, orders, starts)]
    if out:  # the best of them, its split improved move by move (cheap, before the MILP below)
        best = min(out, key=lambda c: c[0])
        out.append(descend_split(problem, orders, best, deadline.sub(fraction=0.5) if deadline.bounded else deadline))
    if deadline.bounded and not deadline.expired():  # the zero-bubble order's own exact split
        from .milp import solve_milp

        zb = "ZBVZeroBubble" if kind == "v" else "InterleavedZeroBubble"
        # where nothing fits yet, the placement's other orders too, until one does (an order that
        # keeps fewer microbatches in flight may fit where the zero-bubble one does not)
        others = [name for name in looped_torch_orders(kind, v) if name != zb]
        for name in [zb, *others]:
            if deadline.expired() or (out and name != zb):
                break
            try:
                res = solve_milp(ScheduleProblem(problem.instance, name, p, m, v), time_limit=deadline)
                if res.plan is not None:
                    out += _scored(problem, orders, res.info["starts"])
            except (PipeoptError, DeadlineReached):
                pass
    out.sort(key=lambda c: c[0])
    return out


class FreeOrderModel:
    """The CP-SAT model of the free-order problem (module docstring).

    Parameters
    ----------
    problem
        A free-order :class:`ScheduleProblem` (``schedule="free"``).
    unit
        Seconds per time tick (> 0).

    Attributes
    ----------
    model
        The ``cp_model.CpModel``.
    b
        ``list`` of S + 1 boundary variables (``b[0] = 0``, ``b[S] = n``).
    start
        ``dict[(kind, stage, microbatch) | ("X"|"Y", boundary, microbatch), IntVar]``.
    Z
        The iteration time variable (ticks).
    """

    def __init__(self, problem: ScheduleProblem, unit: float, upper: float | None = None):
        if not problem.is_free:
            raise InvalidProblemError(f"the free-order model needs schedule='free', not {problem.schedule.name}")
        self.problem, self.unit = problem, float(unit)
        P, S, n = problem.prefixes, problem.S, problem.n
        sched = problem.schedule
        self.cross = [sched.placement[c] != sched.placement[c + 1] for c in range(S - 1)]
        self.overlap = problem.instance.settings.overlap
        m = problem.microbatches
        M = self.model = cp_model.CpModel()
        total = m * (sum(float(P[k][-1]) for k in ("F", "I", "W")) + 2 * float(np.sum(P["send"])))
        if upper is not None and math.isfinite(upper):
            total = min(total, upper)  # a known plan's time: the optimum (and its rounded model) is below
        self.horizon = H = int(math.ceil(total / unit)) + 1
        # split
        self.b = [M.new_constant(0)]
        for t in range(1, S):
            w = problem.space.window(t)
            self.b.append(M.new_int_var(w.start, w.stop - 1, f"b{t}"))
        self.b.append(M.new_constant(n))
        for t in range(S):
            M.add(self.b[t] + 1 <= self.b[t + 1])
        # prefix sums are non-decreasing up to float noise (I = B - W may dip a few ulps below 0)
        self.floor = floor = {k: [max(0, int(math.floor(x / unit))) for x in P[k]] for k in ("F", "I", "W", "send")}
        self.ceil = ceil = {k: [max(0, int(math.ceil(x / unit))) for x in P[k]] for k in ("F", "I", "W")}

        def at(arr, t, name):
            if t in (0, S):
                return M.new_constant(arr[0 if t == 0 else n])
            var = M.new_int_var(min(arr), max(arr), name)
            M.add_element(self.b[t], arr, var)
            return var

        self.d = {}
        for k in ("F", "I", "W"):
            hi = [at(floor[k], t, f"{k}floor{t}") for t in range(S + 1)]
            lo = [at(ceil[k], t, f"{k}ceil{t}") for t in range(S + 1)]
            for s in range(S):
                dv = M.new_int_var(0, H, f"d{k}{s}")
                M.add_max_equality(dv, [hi[s + 1] - lo[s], 0])
                self.d[(k, s)] = dv
        send = [at(floor["send"], c + 1, f"send{c}") if self.cross[c] else None for c in range(S - 1)]
        self.send = send
        self.dur = {}  # (kind, stage) -> duration expression of the action (with its carried send)
        for s in range(S):
            f, i = self.d[("F", s)], self.d[("I", s)]
            if not self.overlap:
                if s < S - 1 and self.cross[s]:
                    f = f + send[s]
                if s > 0 and self.cross[s - 1]:
                    i = i + send[s - 1]
            for k, e in (("F", f), ("I", i)):
                if e is not self.d[(k, s)]:  # an interval's size must be one variable
                    var = M.new_int_var(0, H, f"dur{k}{s}")
                    M.add(var == e)
                    e = var
                self.dur[(k, s)] = e
            self.dur[("W", s)] = self.d[("W", s)]
        # actions
        self.start, self.ends, self.interval = {}, {}, {}
        per_rank = {r: [] for r in range(sched.ranks)}
        for s in range(S):
            r = sched.placement[s]
            for k in ("F", "I", "W"):
                for j in range(m):
                    a = (k, s, j)
                    st = M.new_int_var(0, H, f"t{k}{s}_{j}")
                    en = M.new_int_var(0, H, f"e{k}{s}_{j}")
                    self.start[a], self.ends[a] = st, en
                    iv = M.new_interval_var(st, self.dur[(k, s)], en, f"iv{k}{s}_{j}")
                    self.interval[a] = iv
                    per_rank[r].append(iv)
        for ivs in per_rank.values():
            M.add_no_overlap(ivs)

        def end(a):
            return self.ends[a]

        self.end = end
        # symmetry: microbatches in index order per stage and kind
        for s in range(S):
            for k in ("F", "I", "W"):
                for j in range(m - 1):
                    M.add(end((k, s, j)) <= self.start[(k, s, j + 1)])
        # data dependencies (and transfers)
        channels: dict = {}  # (from rank, to rank) -> [(group, producer fn, transfer key)]
        for j in range(m):
            for s in range(S):
                M.add(self.start[("W", s, j)] >= end(("I", s, j)))
                M.add(self.start[("I", s, j)] >= end(("F", s, j)))
            for c in range(S - 1):
                fwd = [("F", c, j), ("F", c + 1, j), "X", sched.placement[c], sched.placement[c + 1]]
                bwd = [("I", c + 1, j), ("I", c, j), "Y", sched.placement[c + 1], sched.placement[c]]
                for prod, cons, tk, src, dst in (fwd, bwd):
                    if self.cross[c] and self.overlap:
                        key = (tk, c, j)
                        st = M.new_int_var(0, H, f"t{tk}{c}_{j}")
                        en = M.new_int_var(0, H, f"e{tk}{c}_{j}")
                        self.start[key], self.ends[key] = st, en
                        self.interval[key] = M.new_interval_var(st, send[c], en, f"iv{tk}{c}_{j}")
                        M.add(st >= end(prod))
                        M.add(self.start[cons] >= en)
                        channels.setdefault((src, dst), {}).setdefault((tk, c), []).append((key, prod))
                    else:
                        M.add(self.start[cons] >= end(prod))
        for groups in channels.values():
            keys = list(groups)
            M.add_no_overlap([self.interval[key] for g in keys for key, _ in groups[g]])
            for g in keys:  # within a group: microbatch order, as their producers
                seq = groups[g]
                for (k1, _), (k2, _) in zip(seq, seq[1:]):
                    M.add(self.ends[k1] <= self.start[k2])
            for x in range(len(keys)):  # between groups: the producers' order is the transfers'
                for y in range(x + 1, len(keys)):
                    for k1, p1 in groups[keys[x]]:
                        for k2, p2 in groups[keys[y]]:
                            lit = M.new_bool_var(f"o_{k1}_{k2}")
                            M.add(end(p1) <= self.start[p2]).only_enforce_if(lit)
                            M.add(self.ends[k1] <= self.start[k2]).only_enforce_if(lit)
                            M.add(end(p2) <= self.start[p1]).only_enforce_if(~lit)
                            M.add(self.ends[k2] <= self.start[k1]).only_enforce_if(~lit)
        # memory
        cap = problem.capacity
        if math.isfinite(cap):
            mu = cap / MEMORY_TICKS
            act_f = [int(math.floor(x / mu)) for x in P["act"]]
            act_c = [int(math.ceil(x / mu)) for x in P["act"]]
            par_f = [int(math.floor(x / mu)) for x in P["param"]]
            par_c = [int(math.ceil(x / mu)) for x in P["param"]]
            limit = int(math.ceil(rules.memory_limit(cap) / mu))
            ah = [at(act_f, t, f"actf{t}") for t in range(S + 1)]
            al = [at(act_c, t, f"actc{t}") for t in range(S + 1)]
            ph = [at(par_f, t, f"parf{t}") for t in range(S + 1)]
            pl = [at(par_c, t, f"parc{t}") for t in range(S + 1)]
            for r in range(sched.ranks):
                mine = sched.stages_on(r)
                ivs, demands = [], []
                params = []
                for s in mine:
                    act = M.new_int_var(0, max(act_f), f"act{s}")
                    M.add_max_equality(act, [ah[s + 1] - al[s], 0])
                    prm = M.new_int_var(0, max(par_f), f"par{s}")
                    M.add_max_equality(prm, [ph[s + 1] - pl[s], 0])
                    params.append(prm)
                    for j in range(m):
                        hold = M.new_int_var(0, H, f"hold{s}_{j}")
                        M.add(hold == end(("W", s, j)) - self.start[("F", s, j)])
                        ivs.append(M.new_interval_var(self.start[("F", s, j)], hold, end(("W", s, j)), f"mem{s}_{j}"))
                        demands.append(act)
                room = M.new_int_var(0, limit, f"room{r}")  # the bytes left for activations
                M.add(room == limit - sched.parameter_copies * sum(params))
                M.add_cumulative(ivs, demands, room)
                if len(mine) == 1 and m > 1:  # one stage: memory as precedence (redundant, propagates)
                    self._in_flight_rows(mine[0], act, room, max(act_f))
        # objective and bounds
        self.Z = Z = M.new_int_var(0, H, "iteration")
        for s in range(S):
            M.add(Z >= end(("W", s, m - 1)))
        for r in range(sched.ranks):
            mine = sched.stages_on(r)
            head = sum(self.dur[("F", s)] for s in range(min(mine)))
            work = sum(m * (self.dur[("F", s)] + self.dur[("I", s)] + self.dur[("W", s)]) for s in mine)
            M.add(Z >= head + work)
            M.add(Z >= self.start[("F", min(mine), 0)] + work)  # the rank's work all after its first F
        for s in range(S):  # a stage's I's and W's all run after its first I (microbatch order)
            M.add(Z >= self.start[("I", s, 0)] + m * self.dur[("I", s)] + m * self.dur[("W", s)])
        self._split_bound_rows(Z)
        M.minimize(Z)

    def _split_bound_rows(self, Z) -> None:
        """The per-stage split bound (:mod:`.split_bound`) in ticks: ``Z >= g_s(b_s, b_s+1)`` by
        one element constraint per stage on the pair of boundaries (pairs whose bound exceeds the
        horizon leave the boundaries' domains), and ``Z >=`` its least value over splits. Each
        value is floored to ticks less :data:`BOUND_SLACK_TICKS` (a true schedule floored to ticks
        ends at most 3 ticks early), so every true schedule stays a schedule of the model.
        With two chunks per rank the constant row is the larger of that least value and the
        rank bound of :mod:`.rank_bound` (both chunks of a rank in one one-machine bound).
        Sets :attr:`split_bound` (seconds)."""
        from .rank_bound import rank_lower_bound
        from .split_bound import pair_bounds, split_lower_bound

        problem, M, u, H = self.problem, self.model, self.unit, self.horizon
        n = problem.n
        pairs = pair_bounds(problem)
        self.split_bound, _ = split_lower_bound(problem, pairs)
        # with two chunks per rank the rank bound sees both (with one it returns lo)
        lo = max(self.split_bound, problem.memory_free_bound())
        if math.isfinite(lo):
            self.split_bound = max(self.split_bound, rank_lower_bound(problem, lo, H * u, pairs))

        def ticks(x):
            x = np.asarray(x, dtype=float)
            t = np.floor(np.where(np.isfinite(x), x, (H + 2) * u) / u) - BOUND_SLACK_TICKS
            return np.clip(t, 0, H + 1).astype(np.int64)

        if math.isfinite(self.split_bound):
            M.add(Z >= int(ticks(self.split_bound)))
        for s in range(problem.S):
            idx = M.new_int_var(0, (n + 1) ** 2 - 1, f"pair{s}")
            M.add(idx == self.b[s] * (n + 1) + self.b[s + 1])
            g = M.new_int_var(0, H + 1, f"pairbound{s}")
            M.add_element(idx, [int(x) for x in ticks(pairs[s]).ravel()], g)
            M.add(Z >= g)

    def _in_flight_rows(self, s: int, act, room, most: int) -> None:
        """Stage s alone on its rank: with k = the most microbatches whose activations fit
        (``k act <= room``, the solver takes the largest), F(s, j + k) starts after W(s, j) ends
        for every j - the memory rule restated for microbatches in index order (the F's and
        W's of a stage run in that order, so k in flight at F(s, j + k) means W(s, j) has
        ended). Redundant with the cumulative; it propagates along the precedence chains."""
        M, m = self.model, self.problem.microbatches
        k = M.new_int_var(1, m, f"inflight{s}")
        prod = M.new_int_var(0, m * max(1, int(most)), f"kact{s}")  # most: the largest act a chunk can have
        M.add_multiplication_equality(prod, [k, act])
        M.add(prod <= room)
        for kk in range(1, m):
            lit = M.new_bool_var(f"k{s}_{kk}")
            M.add(k == kk).only_enforce_if(lit)
            M.add(k != kk).only_enforce_if(~lit)
            for j in range(m - kk):
                M.add(self.start[("F", s, j + kk)] >= self.ends[("W", s, j)]).only_enforce_if(lit)

    def fix_split(self, starts) -> None:
        """Fix the boundaries to the split ``starts`` (stage starts after the first): the model
        then chooses the orders of that split only."""
        for t in range(1, self.problem.S):
            self.model.add(self.b[t] == int(starts[t - 1]))

    def hint(self, order: Schedule, starts) -> dict:
        """Hint values (ticks) of every variable for the split ``starts`` run in ``order``: the
        executor's start times, floored (a schedule of the relaxed model)."""
        ex = self.problem.execute(list(starts), order)
        u = self.unit
        out = {}
        bs = [0, *starts, self.problem.n]
        for t in range(1, self.problem.S):
            out[self.b[t]] = int(bs[t])
        for q, op in enumerate(ex.ops):
            key = tuple(op)
            if key in self.start:
                out[self.start[key]] = int(math.floor(float(ex.start[q]) / u))
        ticks = {}
        for s in range(self.problem.S):
            for k in ("F", "I", "W"):
                ticks[(k, s)] = max(0, self.floor[k][bs[s + 1]] - self.ceil[k][bs[s]])
            if not self.overlap:
                if s < self.problem.S - 1 and self.cross[s]:
                    ticks[("F", s)] += self.floor["send"][bs[s + 1]]
                if s > 0 and self.cross[s - 1]:
                    ticks[("I", s)] += self.floor["send"][bs[s]]
        m = self.problem.microbatches
        out[self.Z] = max(out[self.start[("W", s, m - 1)]] + ticks[("W", s)] for s in range(self.problem.S))
        return out

    def read(self, outcome) -> tuple[list, Schedule]:
        """``(starts, order)`` of a solution: the boundaries and each rank's actions sorted by
        start (:func:`order_from_times`)."""
        starts = [int(outcome.value(self.b[t])) for t in range(1, self.problem.S)]
        times = {a: (int(outcome.value(v)), int(outcome.value(self.ends[a]))) for a, v in self.start.items()
                 if a[0] in _KIND_RANK}
        return starts, order_from_times(self.problem.schedule, times)


def order_from_times(template: Schedule, times: dict, name: str = FREE) -> Schedule:
    """The order of each rank: its actions sorted by start time, ties broken so that every
    dependency between two actions of one rank holds (a zero-length action first; F by stage
    up, I by stage down, then W).

    Parameters
    ----------
    template
        A schedule of the shape (p, v, m, placement).
    times
        ``dict[(kind, stage, microbatch), (start, end)]`` of every F, I, W action.
    """
    rows = []
    for r in range(template.ranks):
        mine = [a for a in times if template.placement[a[1]] == r]
        mine.sort(key=lambda a: (times[a][0], times[a][1], _KIND_RANK[a[0]],
                                 a[1] if a[0] == "F" else -a[1], a[2]))
        rows.append(tuple((Action(*a),) for a in mine))
    return Schedule(name, template.ranks, template.stages_per_rank, template.microbatches, template.placement,
                    tuple(rows), template.parameter_copies, template.source)


def _given_warm_starts(problem: ScheduleProblem, warm: Sequence) -> list:
    """The ``warm`` pairs of :func:`solve_free_order` as ``[(time, name, order, starts)]`` (those
    that fit), each order through :func:`~pipeopt.schedules.as_free`."""
    sched = problem.schedule
    out = []
    for k, pair in enumerate(warm):
        try:
            starts, order = pair
        except (TypeError, ValueError):
            raise InvalidProblemError(f"warm start {k}: expected a (starts, order) pair, got {pair!r}") from None
        if not isinstance(order, Schedule):
            raise InvalidProblemError(f"warm start {k}: the order must be a pipeopt.schedules.Schedule, "
                                      f"got {type(order).__name__}")
        shape = (order.ranks, order.microbatches, order.stages_per_rank, placement_kind(order))
        want = (sched.ranks, sched.microbatches, sched.stages_per_rank, placement_kind(sched))
        if shape != want:
            raise InvalidProblemError(f"warm start {k}: {order.name} has (ranks, microbatches, chunks per rank, "
                                      f"placement) {shape}, the problem {want}")
        starts = [int(x) for x in starts]
        if len(starts) != problem.S - 1 or not all(a < b for a, b in zip([0, *starts], [*starts, problem.n])):
            raise InvalidProblemError(f"warm start {k}: {starts} is not a split of {problem.n} layers into "
                                      f"{problem.S} chunks")
        ex = problem.execute(starts, as_free(order))
        if ex.feasible:
            out.append((ex.time, f"{order.name} (given)", as_free(order), starts))
    return out


def _split_first(problem: ScheduleProblem, best: tuple, unit: float, deadline: Deadline, threads: int, seed: int,
                 info: dict) -> tuple[tuple, float]:
    """The split-first decomposition: the incumbent's own split, then every split whose bound
    (:mod:`.split_bound`) is below the incumbent's time, least bound first (at most
    :data:`SPLIT_FIRST_MOST`), gets the model with
    its boundaries fixed (no element constraints to branch on; the split's durations are
    constants), warm-started from the best starting order on it, for an equal share of the time
    left among the splits still below the incumbent. A split whose bound has reached the
    incumbent is pruned; a split CP-SAT proves infeasible below the horizon has no plan faster
    than the incumbent.

    Returns ``(incumbent, bound)``: the best ``(time, name, order, starts)`` by the executor and a
    valid lower bound on every split's optimum - the least over the listed splits of CP-SAT's
    bound on its split (at least its split bound, and with two chunks per rank its rank bounds,
    :func:`.rank_bound.rank_bounds`; the incumbent where pruned or infeasible) and the split bound
    of those not listed. ``bound >= incumbent time`` proves the incumbent
    optimal. Records ``info["split_first"]``."""
    from .rank_bound import rank_bounds
    from .split_bound import pair_bounds, splits_below

    pairs = pair_bounds(problem)
    listed, rest = splits_below(problem, best[0], SPLIT_FIRST_MOST, pairs)
    two = problem.stages_per_rank == 2 and placement_kind(problem.schedule) is not None  # a rank's two chunks

    def bound_of(starts) -> float:
        b = [0, *starts, problem.n]
        g = max(float(pairs[s][b[s], b[s + 1]]) for s in range(problem.S))
        return max(g, *rank_bounds(problem, starts)) if two else g

    # the warm start's own split first (its order improved with the split fixed), then the others
    mine = list(best[3])
    listed = [(bound_of(mine), mine)] + sorted(((bound_of(st), st) for _, st in listed if list(st) != mine),
                                               key=lambda x: x[0])
    orders = [(FREE, problem.schedule)] + _torch_orders(problem)
    incumbent = best
    lbs, solved, proven, trail = [], 0, 0, []
    for i, (gb, starts) in enumerate(listed):
        if gb >= incumbent[0]:
            lbs.append(incumbent[0])  # pruned: no plan of this split beats the incumbent
            continue
        if deadline.expired():
            lbs.append(gb)
            continue
        left = sum(1 for g2, _ in listed[i:] if g2 < incumbent[0])
        cands = _scored(problem, orders, starts)
        if incumbent[3] == list(starts):
            cands.append(incumbent)
        start = min(cands, key=lambda c: c[0]) if cands else None
        if start is not None and start[0] < incumbent[0]:
            incumbent = start
        fm = FreeOrderModel(problem, unit, incumbent[0])
        fm.fix_split(starts)
        hint = fm.hint(start[2], start[3]) if start is not None else None
        out = solve_cpsat(fm.model, deadline=deadline.sub(fraction=1.0 / left) if deadline.bounded else deadline,
                          threads=threads, seed=seed, hint=hint)
        solved += 1
        if out.status == "infeasible":  # every plan of this split ends after the horizon (the incumbent)
            lbs.append(incumbent[0])
            proven += 1
            trail.append((list(starts), gb, out.status, lbs[-1]))
            continue
        if out.has_solution:
            s2, order = fm.read(out)
            ex = problem.execute(s2, order)
            if ex.feasible and ex.time < incumbent[0]:
                incumbent = (ex.time, "cpsat (split first)", order, s2)
        lbs.append(max(gb, out.bound * unit) if out.bound is not None else gb)
        proven += bool(out.proven)
        trail.append((list(starts), gb, out.status, lbs[-1]))
    bound = min([rest, *lbs, incumbent[0]])
    info["split_first"] = {"splits": len(listed), "below": rest, "solved": solved, "proven": proven,
                           "bound": bound, "time": incumbent[0], "solves": trail}
    return incumbent, bound


def _torch_orders(problem: ScheduleProblem) -> list:
    """``[(name, order)]``: torch's orders of the problem's placement as free orders (those that build)."""
    sched = problem.schedule
    p, m, v = sched.ranks, sched.microbatches, sched.stages_per_rank
    out = []
    for name in looped_torch_orders(placement_kind(sched) or "looped", v):
        try:
            out.append((name, as_free(make_schedule(name, p, m, v if name not in ("GPipe", "1F1B") else None))))
        except PipeoptError:
            continue
    return out


def solve_free_order(problem: ScheduleProblem, *, time_limit: float | Deadline | None = 60.0, solver: str = SOLVER,
                     seed: int = 0, threads: int = 2, log: bool = False, warm: Sequence = (),
                     decompose: bool | None = None, **_) -> "Result":  # noqa: F821
    """Solve the free-order problem exactly with CP-SAT (module docstring).

    Parameters
    ----------
    problem
        A :class:`ScheduleProblem` with ``schedule="free"``.
    time_limit
        Seconds (or a :class:`Deadline`, or ``None``: no limit) for the whole call.
    solver
        Ignored name of the MILP solver (the model is CP-SAT's); accepted for the common
        method signature.
    seed, threads
        CP-SAT's random seed and search workers.
    warm
        More warm starts: ``(starts, order)`` pairs, ``starts`` a split into the problem's
        ``p v`` chunks (stage starts after the first) and ``order`` a
        :class:`~pipeopt.schedules.Schedule` of the same ranks, microbatches, chunks per rank and
        placement (e.g. a fixed order's exact optimum, so that the free result is never slower
        than it); each is scored by the executor, one that does not fit is skipped.
    decompose
        Run the split-first decomposition (:func:`_split_first`) before the joint model;
        ``None``: when the time limit is bounded. Without a limit each listed split is solved to
        its optimum (exact on its own when every split below the incumbent is listed).

    Returns
    -------
    Result
        Status ``optimal`` (proven), ``time_limit`` (with the bound) or ``infeasible``
        (proven: no split and order fits the memory). The plan carries its order
        (``plan.schedule``), ``info["order"]`` too; ``info["warm_start"]`` names the best
        starting order and its time.

    Raises
    ------
    InvalidProblemError
        If the problem is not a free-order one, or a ``warm`` pair does not match it.
    InfeasibleError
        If CP-SAT proves that nothing fits (and no candidate fits).
    """
    started = time.perf_counter()
    deadline = Deadline.of(time_limit)
    if not problem.is_free:
        raise InvalidProblemError(
            f"method 'cpsat' solves the free order (schedule='free'); {problem.schedule.name} has a fixed order:"
            " use 'milp'")
    info: dict = {"model": "CP-SAT: boundaries by element constraints, intervals with no-overlap per rank and"
                           " channel, cumulative memory; times in ticks (relaxed by rounding)"}
    share = deadline.sub(fraction=HINT_SHARE) if deadline.bounded else deadline
    given = _given_warm_starts(problem, warm)
    cands = sorted(warm_starts(problem, share) + given, key=lambda c: c[0])
    best = cands[0] if cands else None  # (time, name, order, starts)
    if best is not None:
        info["warm_start"] = {"order": best[1], "time": best[0]}
    ref = best[0] if best is not None else problem.memory_free_bound() * 4
    unit = model_unit(ref, TICKS)
    info["time_unit"] = unit
    first_bound = -math.inf  # the split-first decomposition's bound (valid for every split)
    if decompose is None:
        decompose = deadline.bounded
    if best is not None and decompose and not deadline.expired():
        share = deadline.sub(fraction=SPLIT_FIRST_SHARE) if deadline.bounded else deadline
        best, first_bound = _split_first(problem, best, unit, share, threads, seed, info)
    fm = FreeOrderModel(problem, unit, best[0] if best is not None else None)
    hint = fm.hint(best[2], best[3]) if best is not None else None
    if best is not None and best[0] <= max(first_bound, fm.split_bound) * (1 + SOLVER_CLAIM):
        out = _Skipped()  # proven by the decomposition or the split bound: the joint model is not needed
    else:
        out = solve_cpsat(fm.model, deadline=deadline, threads=threads, seed=seed, hint=hint, log=log)
    info.update(out.info())
    bound = out.bound * unit if out.bound is not None else None
    incumbent = best
    if out.has_solution:
        starts, order = fm.read(out)
        ex = problem.execute(starts, order)
        info["model_time"] = out.objective * unit
        if ex.feasible and (incumbent is None or ex.time < incumbent[0]):
            incumbent = (ex.time, "cpsat", order, starts)
    if out.status == "infeasible":
        if incumbent is not None:
            info["note"] = "CP-SAT said infeasible although a plan that fits is known"
            status = "feasible"
        else:
            from .shortfall import shortfall_note

            note = shortfall_note(problem)
            raise InfeasibleError(f"{problem.instance.name}: no split and order of the free schedule fits the memory"
                                  " (proven by CP-SAT)" + (f"; {note}" if note else ""))
    elif incumbent is None:
        status = "time_limit"
    elif out.proven and bound is not None and incumbent[0] <= bound * (1 + SOLVER_CLAIM) + 1e-300:
        status = "optimal"
    elif out.proven:
        info["note"] = ("CP-SAT proved its rounded model optimal; the executor's time is above the bound by more"
                        " than the claim tolerance")
        status = "feasible"
    else:
        status = "time_limit"
    info["split_bound"] = fm.split_bound  # seconds, valid for every order (.split_bound)
    if status != "optimal" and incumbent is not None and incumbent[0] <= fm.split_bound * (1 + SOLVER_CLAIM):
        status = "optimal"  # the plan meets a valid bound: proven, whatever CP-SAT's own search did
        info["proof"] = "the plan's time equals the split bound (pipeopt.problems.schedule.split_bound)"
    elif status != "optimal" and incumbent is not None and incumbent[0] <= first_bound * (1 + SOLVER_CLAIM):
        status = "optimal"
        info["proof"] = ("split first: every split below the plan's time solved to optimality or pruned by its"
                         " split bound")
    simple = problem.memory_free_bound()  # the busiest rank's work: valid for every order
    lb = simple if bound is None else max(bound, simple)
    for extra in (fm.split_bound, first_bound):
        if math.isfinite(extra):
            lb = max(lb, extra)
    if incumbent is None:
        return problem.result("cpsat", None, status, lower_bound=lb, started=started, info=info)
    info["source_order"] = incumbent[1]  # "cpsat", or the warm start the solver did not improve on
    order = incumbent[2]
    if order.name != FREE:
        order = dataclasses.replace(order, name=FREE)
    lb = min(lb, incumbent[0])
    return problem.result("cpsat", incumbent[3], status, lower_bound=lb, started=started, info=info,
                          order=order)
