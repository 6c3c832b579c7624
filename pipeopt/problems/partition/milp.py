"""MILP (PuLP; CBC or HiGHS) for the partition problem in the one-order space.

Formulation (arrays from :mod:`pipeopt.problems.partition.model`, read off the cost table).
Binary *cumulative* start variables ``y[t, c] = 1`` iff stage t (t = 1..S-1) has started by
unit c, i.e. ``p_t <= c``, over its window ``c = t .. n-S+t-1`` (``y[t, c] = 1`` beyond it). A
prefix array F taken at the start of stage t is then linear:

    F[p_t] = F[n-S+t] - sum_c (F[c+1] - F[c]) * y[t, c]

and the model is

    minimise T  s.t.
      y[t, c] <= y[t, c+1]                      (monotone)
      y[t+1, c] <= y[t, c-1]                    (stage t non-empty: p_t < p_{t+1})
      end[p_{t+1}] - begin[p_t] <= T            (stage time, every stage t)
      cut[p_t] <= T                             (overlapped communication, t >= 1)
      end[p_{l+1}] - begin[p_i] + sum_{c=i+1..l} mid[p_c] <= (l - i + 1) T
                                                (window rows, 0 <= i < l <= S-1)
      y[t, a] <= y[t+1, R_t(a)]                 (reach: memory, and the incumbent's value)
      T >= simple_lower_bound

The **window rows** (1F1B's bounded window, :mod:`pipeopt.problems.partition.model`) make
the max of the rows the exact period of the split, :func:`pipeopt.evaluate`'s bottleneck.
The O(S^2) rows are stated in O(S) rows with continuous variables: the prefix sums
``M_l = sum_{c<=l} mid[p_c]`` (``window_sum_l``, equalities), so that row (i, l) reads
``A_l <= B_i`` with ``A_l = end[p_{l+1}] + M_l - (l+1) T`` and ``B_i = begin[p_i] + M_i - i T``,
and a running minimum ``window_min_l <= window_min_{l-1}``, ``window_min_l <= B_l``,
``A_l <= window_min_l``: every row holds iff these do (the same LP relaxation as the rows
written out).

The **reach rows** say that a stage t that starts by unit a ends by ``R_t(a)``: the last end
at which it fits in memory (:func:`~pipeopt.problems.partition.model.memory_reach`, decided
by the cost model's own ``fits``) and, when a split that fits is known, the last end at which
its time stays within that split's value U (they only remove splits worse than a known one
and tighten the LP relaxation). They are 0/1 rows: memory is exact in this model, with no
byte count scaled or compared with a solver tolerance.

Cumulative variables leave no symmetry between stages, and branching on ``y[t, c]`` splits
the position of one cut into "before c" / "after c", which is what proves bottleneck
optimality quickly. Times are expressed in units of 1/100 of the simple lower bound (so T is
about 100-1000 in the solver, away from its absolute tolerances).

**Recomputation** (the problem's ``recompute`` option ``"full"`` or ``"auto"``,
:func:`recompute_rows` over :class:`RecomputeChoice`, which the schedule MILP reuses per chunk):
a binary per layer and mode, its product with the layer's stage linearised, in each stage's time row, the window rows and a linear memory row per stage (its
kept bytes, parameters, tied parameters and the backward's excess of re-created activations);
the reach rows then say where *some* recompute choice fits
(:meth:`PartitionProblem.memory_reach`). The returned plan takes each stage's least-time choice
that fits (:meth:`PartitionProblem.plan`), which the model's optimum equals.

**Data parallelism and ZeRO** (``Settings.dp``, ``zero`` and the training-state ratios; bottleneck
objective): the stage's training state (:meth:`CostTable.sharded_state`) is in the memory reach
(:meth:`PartitionProblem.stage_memory`), and with recomputation in the memory rows as ``kappa P +
lam L`` (``L >=`` each of its units' largest layer, ZeRO-3's gathered layer); ZeRO's collectives
per microbatch (:meth:`PartitionProblem.zero_work`) are a continuous ``z_t = alpha P_t + beta
w_t`` per stage in its stage row and the window rows (:func:`zero_rows`); the coefficients are
read off the one rule (:func:`zero_linear`). Tied parameters with data parallelism are refused
(the DP models them), as are the event-time objectives.

Solving goes through the one PuLP door, :func:`pipeopt.backends.pulp.solve_pulp`: **CBC runs
in a child process that is ended at the deadline** (plus a short grace) if it has not stopped
itself, so a limit holds even inside CBC's preprocessing; HiGHS runs in a child process too.
"""

from __future__ import annotations

import math

import numpy as np

from ...lazy import lazy_module
from ...backends.deadline import Deadline
from ...backends.pulp import SOLVERS, solve_pulp
from ...cost import rules
from ...errors import InfeasibleError, InvalidProblemError
from ...result import Result, Status
from .events import solve_events
from .model import (
    BOUND_SLACK,
    MILP_ABS_GAP,
    MILP_REL_GAP,
    MILP_TOLERANCE,
    Attempt,
    CumulativeSplit,
    StraightModel,
    check_options,
    infeasible_memory,
    solve_exact,
    starts_from_cumulative,
)
from .tiebreak import break_ties
from .problem import PartitionProblem

pulp = lazy_module("pulp")

__all__ = ["BOUND_SLACK", "MILP_REL_GAP", "MILP_TOLERANCE", "RecomputeChoice", "build_milp", "recompute_rows",
           "solve_iteration", "solve_milp"]




def build_milp(
    model: StraightModel, time_unit: float, upper: float | None = None, deadline: Deadline | None = None
) -> tuple[pulp.LpProblem, pulp.LpVariable, dict]:
    """Build the PuLP model of the straight partition problem.

    Parameters
    ----------
    model
        Arrays of the problem (:class:`~pipeopt.problems.partition.model.StraightModel`); its
        ``reach`` gives the memory rows.
    time_unit
        Seconds per unit of the solver's time values.
    upper
        Seconds: the bottleneck of a split known to fit, or ``None``. If given, the time reach
        (:meth:`StraightModel.time_reach`) joins the memory reach in the reach rows.
    deadline
        The method's clock: building stops with
        :class:`~pipeopt.backends.deadline.DeadlineReached` when it passes.

    Returns
    -------
    (lp, T, y)
        The PuLP problem (``None`` if a reach row is false on constants: a stage cannot reach
        the window of the next one at all, so no split fits; without ``upper`` that is a
        proof), the bottleneck variable (in ``time_unit``) and ``y[t][c]``, the cumulative
        start variables (dict of dicts; stages 1..S-1). The window rows' continuous
        variables are named ``window_sum_{t}`` and ``window_min_{l}``.
    """
    deadline = Deadline(None) if deadline is None else deadline
    S = model.S
    lp = pulp.LpProblem("partition_straight", pulp.LpMinimize)
    T = lp.add_variable("bottleneck", lowBound=model.lower_bound / time_unit)
    lp += T, "bottleneck_time"
    split = CumulativeSplit(lp, model)
    y, add, at_start = split.y, split.add, split.at
    for t in range(1, S):
        deadline.check("building the MILP")
        split.structure_rows(t)
    u = 1.0 / time_unit
    q = recompute_rows(lp, split, model, u, deadline)  # per stage: its recompute seconds (in time units)
    zq = zero_rows(lp, split, model, u, deadline)  # per stage: ZeRO's collectives per microbatch (time units)
    extra = [[v for v in (q[t] if q else None, zq[t] if zq else None) if v is not None] for t in range(S)]
    for t in range(S):
        deadline.check("building the MILP")
        e_terms, e_const = at_start(model.end, t + 1, u)
        b_terms, b_const = at_start(model.begin, t, u)
        add(e_terms + [(v, -c) for v, c in b_terms] + [(T, -1.0)] + [(v, 1.0) for v in extra[t]],
            e_const - b_const, f"stage_time_{t}")
    for t in range(1, S):
        if model.cut[model.window(t)].max(initial=0.0) > 0:
            terms, const = at_start(model.cut, t, u)
            add(terms + [(T, -1.0)], const, f"cut_time_{t}")
    if model.windowed:
        # window row (i, l): A_l <= B_i with A_l = end[p_{l+1}] + M_l - (l+1) T,
        # B_i = begin[p_i] + M_i - i T, M_l = sum_{c=1..l} mid[p_c]; a running minimum of the
        # B_i (window_min_l <= window_min_{l-1}, <= B_l) states every row in O(S) rows
        M: list = [None]
        for t in range(1, S):
            deadline.check("building the MILP")
            v = lp.add_variable(f"window_sum_{t}")
            terms, const = at_start(model.mid, t, u)
            prev = [] if M[-1] is None else [(M[-1], -1.0)]
            lp.addConstraint(pulp.LpConstraint(
                pulp.LpAffineExpression([(v, 1.0), *prev, *((x, -c) for x, c in terms)], -const),
                pulp.LpConstraintEQ), f"window_sum_{t}")
            M.append(v)
        low = None  # window_min_0 = B_0 = begin[0], a constant
        for l in range(1, S):
            deadline.check("building the MILP")
            v = lp.add_variable(f"window_min_{l}")
            if low is None:
                add([(v, 1.0)], -float(model.begin[0]) * u, f"window_min_{l}_first")
            else:
                add([(v, 1.0), (low, -1.0)], 0.0, f"window_min_{l}_running")
            b_terms, b_const = at_start(model.begin, l, u)
            # with recomputation (and ZeRO) B_l and A_l also carry the recompute (and ZeRO) seconds of
            # stages 0..l-1 and 0..l
            add([(v, 1.0), *((x, -c) for x, c in b_terms), (M[l], -1.0), (T, float(l)),
                 *((x, -1.0) for e in extra[:l] for x in e)], -b_const, f"window_min_{l}_stage")
            e_terms, e_const = at_start(model.end, l + 1, u)
            add([*e_terms, (M[l], 1.0), (T, -float(l + 1)), (v, -1.0), *((x, 1.0) for e in extra[:l + 1] for x in e)],
                e_const, f"window_{l}")
            low = v
    time_reach = model.time_reach(upper) if upper is not None else None
    for t in range(S):
        deadline.check("building the MILP")
        R = model.reach[t] if time_reach is None else np.minimum(model.reach[t], time_reach)
        if not split.reach_rows(t, R):
            return None, T, y
    return lp, T, y


class RecomputeChoice:
    """The per-layer part of the recompute rows, shared by the partition MILP (:func:`recompute_rows`)
    and the schedule MILP with several chunks per rank
    (:func:`pipeopt.problems.schedule.model.recompute_rows`).

    With ``x[t, c] = started(t, c) - started(t+1, c)`` (unit c in stage t, linear in the cumulative
    binaries of ``split``) and, per layer l and mode o, a binary ``r[l, o]`` (``auto``: at most one
    mode per layer; ``full``: ``r = 1``), the product ``z[t, l, o] = r[l, o] x[t, c(l)]`` is
    linearised (``z <= r``, ``z <= x``, ``z >= r + x - 1``; ``full``: ``z = x``). A layer sits in one
    stage, so one ``r`` per layer serves every stage. Per stage t (of units ``t .. n-S+t``, its reach):

    * :attr:`q` ``[t]``, its recompute seconds ``sum_{l,o} z[t,l,o] extra_{l,o}`` (a continuous
      variable, in the model's time unit: ``u`` per second);
    * :meth:`kept_terms`: the activation bytes it keeps per microbatch times ``k``, ``k (sum_c
      x[t,c] act_c - sum z[t,l,o] (act_l - kept_{l,o}))`` (:func:`pipeopt.cost.rules.recompute_terms`
      through ``rc.units``);
    * :meth:`excess`: a variable ``E_t >= 0`` with ``E_t >= sum_o z[t,L,o] (act_L - kept_{L,o}) -
      sum_{l after L} (act_l x[t,c(l)] - sum_o z[t,l,o] (act_l - kept_{l,o}))`` for every layer L
      some mode recomputes (the backward's excess over the kept bytes,
      :func:`pipeopt.cost.rules.backward_peak` less them: exact where L is recomputed; implied
      elsewhere, kept bytes being >= 0).

    The memory rows themselves are the caller's (a partition stage's with its ``k_t``; a schedule
    rank's per count vector of its chunks).

    Parameters
    ----------
    lp
        The PuLP problem.
    split
        :class:`~pipeopt.problems.partition.model.CumulativeSplit` (its ``model`` gives ``n``, ``S``).
    rc
        :class:`~pipeopt.problems.partition.recompute.RecomputeModel` (``mode``, ``units``: each
        unit's :class:`~pipeopt.problems.partition.recompute.LayerChoices`).
    act
        ``array (n,)``: activation bytes per unit (what a unit keeps per microbatch unrecomputed).
    u
        Model time units per second.
    deadline
        :class:`~pipeopt.backends.deadline.Deadline`, checked per stage.
    """

    def __init__(self, lp, split: CumulativeSplit, rc, act, u: float, deadline: Deadline) -> None:
        self.lp, self.split, self.rc = lp, split, rc
        self.n, self.S = split.model.n, split.model.S
        self.act = [float(a) for a in act]
        n, S = self.n, self.S
        self.layers = [(c, layer) for c in range(n) for layer in rc.units[c]]
        layers = self.layers
        r = {}
        if rc.mode == "auto":
            for i, (c, layer) in enumerate(layers):
                for o in range(1, len(layer.modes)):
                    r[i, o] = lp.add_variable(f"recompute_{i}_{o}", lowBound=0, upBound=1, cat=pulp.LpBinary)
                if len(layer.modes) > 2:
                    self.add([(r[i, o], 1.0) for o in range(1, len(layer.modes))], -1.0, f"one_mode_{i}")
        self.r = r
        first = 1 if rc.mode == "auto" else 0  # option 0 is "keep" under auto
        self.z: list = []  # per stage: (i, o) -> (terms, constant) of z[t, i, o]
        self.q: list = []
        self._excess: dict = {}
        for t in range(S):
            deadline.check("building the MILP's recompute rows")
            lo, hi = self.reach(t)
            z = {}
            for i, (c, layer) in enumerate(layers):
                if not lo <= c <= hi:
                    continue
                xt, xc = self.x(t, c)
                for o in range(first, len(layer.modes)):
                    if rc.mode == "full":
                        z[i, o] = (xt, xc)
                        continue
                    v = lp.add_variable(f"redo_{t}_{i}_{o}", lowBound=0, upBound=1)
                    self.add([(v, 1.0), (r[i, o], -1.0)], 0.0, f"redo_le_r_{t}_{i}_{o}")
                    self.add([(v, 1.0), *((w, -a) for w, a in xt)], -xc, f"redo_le_x_{t}_{i}_{o}")
                    self.add([(r[i, o], 1.0), *xt, (v, -1.0)], xc - 1.0, f"redo_ge_{t}_{i}_{o}")
                    z[i, o] = ([(v, 1.0)], 0.0)
            self.z.append(z)
            qt = lp.add_variable(f"recompute_time_{t}", lowBound=0)
            terms, const = [(qt, -1.0)], 0.0
            for (i, o), (zt, zc) in z.items():
                sec = layers[i][1].seconds[o] * u
                if sec:
                    terms += [(w, a * sec) for w, a in zt]
                    const += zc * sec
            self.add(terms, const, f"recompute_time_{t}", pulp.LpConstraintEQ)
            self.q.append(qt)

    def add(self, terms, constant: float, name: str, sense=None) -> None:
        """:meth:`CumulativeSplit.add` with one term per variable (PuLP keeps one: they are summed)."""
        merged: dict = {}
        for v, a in terms:
            merged[v] = merged.get(v, 0.0) + a
        self.split.add(list(merged.items()), constant, name, sense)

    def reach(self, t: int) -> tuple[int, int]:
        """``(lo, hi)``: the units stage t can hold, ``t .. n-S+t``."""
        return t, self.n - self.S + t

    def x(self, t: int, c: int) -> tuple[list, float]:
        """``1[unit c in stage t]`` as (terms, constant): ``started(t, c) - started(t+1, c)``."""
        terms, const = [], 0.0
        for s_, sign in ((t, 1.0), (t + 1, -1.0)):
            v = 1 if s_ == 0 else (0 if s_ == self.S else self.split.started(s_, c))
            if isinstance(v, int):
                const += sign * v
            else:
                terms.append((v, sign))
        return terms, const

    def saved(self, i: int, o: int) -> float:
        """Bytes per microbatch that layer ``i`` (of :attr:`layers`) in mode ``o`` does not keep."""
        layer = self.layers[i][1]
        return layer.act - layer.kept[o]

    def kept_terms(self, t: int, k: float, scale: float) -> tuple[list, float]:
        """``k`` times the activation bytes stage t keeps per microbatch, times ``scale``, as (terms,
        constant) (class docstring)."""
        lo, hi = self.reach(t)
        terms, const = [], 0.0
        if not k:
            return terms, const
        for c in range(lo, hi + 1):
            xt, xc = self.x(t, c)
            w = k * self.act[c] * scale
            terms += [(v, a * w) for v, a in xt]
            const += xc * w
        for (i, o), (zt, zc) in self.z[t].items():
            sv = k * self.saved(i, o) * scale
            terms += [(v, -a * sv) for v, a in zt]
            const -= zc * sv
        return terms, const

    def excess(self, t: int, scale: float):
        """The variable ``E_t`` (bytes times ``scale``) of stage t's backward excess with its rows
        (class docstring); built once per stage and scale."""
        key = (t, float(scale))
        if key in self._excess:
            return self._excess[key]
        E = self.lp.add_variable(f"backward_excess_{t}" + (f"_{len(self._excess)}" if self._excess else ""),
                                 lowBound=0)
        self._excess[key] = E
        z = self.z[t]
        lo, hi = self.reach(t)
        idx = [i for i, (c, _) in enumerate(self.layers) if lo <= c <= hi]
        by_layer: dict = {}
        for key_ in z:
            by_layer.setdefault(key_[0], []).append(key_)
        saved = {key_: self.saved(*key_) * scale for key_ in z}
        for pos, L in enumerate(idx):
            own = [key_ for key_ in by_layer.get(L, ()) if saved[key_] > 0]
            if not own:
                continue
            row, rconst = [(E, -1.0)], 0.0
            for key_ in own:
                zt, zc = z[key_]
                row += [(v, a * saved[key_]) for v, a in zt]
                rconst += zc * saved[key_]
            for i in idx[pos + 1:]:  # minus the kept bytes of the layers after L in stage t
                c = self.layers[i][0]
                xt, xc = self.x(t, c)
                act = self.layers[i][1].act * scale
                row += [(v, -a * act) for v, a in xt]
                rconst -= xc * act
                for key_ in by_layer.get(i, ()):
                    zt, zc = z[key_]
                    row += [(v, a * saved[key_]) for v, a in zt]
                    rconst += zc * saved[key_]
            self.add(row, rconst, f"{E.name}_{L}")
        return E


def zero_linear(problem) -> tuple[float, float, float, float]:
    """The ZeRO terms of a stage as linear functions, read off the one rule
    (:func:`pipeopt.cost.rules.sharded_state`, :func:`pipeopt.cost.rules.zero_op_times`, which are
    linear in their byte arguments): ``(kappa, lam, alpha, beta)`` such that a stage of weight bytes
    P whose largest layer has L bytes keeps ``kappa P + lam L`` bytes of training state and its
    collectives add ``alpha P + beta [P > 0]`` seconds per microbatch (forward and backward
    together; ``beta`` the messages' latency)."""
    s = problem.instance.settings
    tab = problem.table
    state = {"gradient_ratio": s.gradient_ratio, "optimizer_ratio": s.optimizer_ratio, "zero": s.zero, "dp": s.dp}
    kappa = float(rules.sharded_state(1.0, 0.0, **state))
    lam = float(rules.sharded_state(0.0, 1.0, **state))
    comm = {"zero": s.zero, "dp": s.dp, "bandwidth": tab.bus_bandwidth}
    alpha = float(sum(rules.zero_op_times(1.0, **comm, latency=0.0)))
    beta = float(sum(rules.zero_op_times(1.0, **comm, latency=tab.latency))) - alpha
    return kappa, lam, alpha, beta


def zero_rows(lp, split: CumulativeSplit, model: StraightModel, u: float, deadline: Deadline) -> list:
    """ZeRO's collectives per microbatch of every stage as MILP variables (nothing without data
    parallelism): per stage t a continuous ``z_t = alpha P_t + beta w_t`` (:func:`zero_linear`; in
    the model's time unit), ``P_t`` its weight bytes (a difference of the parameter prefix sums at
    its boundaries) and ``w_t >= x[t, c]`` for every unit c with weights it may hold (``w_t`` is
    pushed down to ``[P_t > 0]``: it only lengthens the rows it is in). Added to the stage rows and
    the window rows as :meth:`PartitionProblem.stage_work` adds :meth:`PartitionProblem.zero_work`.

    Raises
    ------
    InvalidProblemError
        With tied parameters (their weights join a stage's collectives by where the tie's layers
        sit, not linearly): the DP models them.
    """
    problem = model.problem
    if not problem.data_parallel:
        return []
    if problem.table.ties:
        raise InvalidProblemError(f"milp: data parallelism (ZeRO-{problem.instance.settings.zero}) with tied "
                                  "parameters is not modelled by the MILP; use method 'dp' (or 'auto')")
    _, _, alpha, beta = zero_linear(problem)
    S, n = model.S, model.n
    param = problem.param_prefix
    out = []
    for t in range(S):
        deadline.check("building the MILP's ZeRO rows")
        z = lp.add_variable(f"zero_time_{t}", lowBound=0)
        e_terms, e_const = split.at(param, t + 1, alpha * u)
        b_terms, b_const = split.at(param, t, alpha * u)
        terms = e_terms + [(v, -c) for v, c in b_terms] + [(z, -1.0)]
        if beta:
            w = lp.add_variable(f"zero_messages_{t}", lowBound=0, upBound=1)
            terms.append((w, beta * u))
            for c in range(t, n - S + t + 1):
                if problem.instance.chain.param[c] > 0:  # the table's rule: a unit with weights
                    xt, xc = split.member(t, c)
                    split.add([*xt, (w, -1.0)], xc, f"zero_messages_{t}_{c}")
        merged: dict = {}
        for v, a in terms:
            merged[v] = merged.get(v, 0.0) + a
        split.add(list(merged.items()), e_const - b_const, f"zero_time_{t}", pulp.LpConstraintEQ)
        out.append(z)
    return out


def recompute_rows(lp, split: CumulativeSplit, model: StraightModel, u: float, deadline: Deadline) -> list:
    """The recompute choice of every layer as MILP rows (nothing with ``recompute="none"``):
    :class:`RecomputeChoice`'s binaries and per-stage seconds, and per stage t, keeping ``k_t``
    microbatches with ``v_t`` weight versions, its memory row in units of the worker's memory:
    ``kept_terms(t, k_t) + sum_c x[t,c] v_t param_c + v_t sum_ties state h[t, tie] + E_t <=
    memory_limit`` with ``h >= x`` on the tie's units and ``E_t`` :meth:`RecomputeChoice.excess`.

    Returns
    -------
    list
        ``q_t`` per stage (PuLP variables; empty without recomputation).
    """
    problem = model.problem
    rc = problem.recomputation
    if rc is None:
        return []
    S = model.S
    choice = RecomputeChoice(lp, split, rc, problem.instance.chain.act, u, deadline)
    cap = problem.memory
    if not math.isfinite(cap):
        return choice.q
    ties = problem.table.ties
    scale = 1.0 / cap
    kappa = lam = 0.0
    if problem.data_parallel:  # the training state the ZeRO stage leaves a stage (CostTable.sharded_state)
        if ties:
            raise InvalidProblemError(f"milp: data parallelism (ZeRO-{problem.instance.settings.zero}) with tied "
                                      "parameters is not modelled by the MILP; use method 'dp' (or 'auto')")
        kappa, lam, _, _ = zero_linear(problem)
    for t in range(S):
        deadline.check("building the MILP's recompute rows")
        lo, hi = choice.reach(t)
        k = problem.in_flight(t)
        ver = rules.weight_versions(k, problem.instance.settings.weight_stashing)
        mem, mconst = choice.kept_terms(t, k, scale)
        mem = mem + [(choice.excess(t, scale), 1.0)]
        if lam:  # ZeRO-3 gathers its largest layer: largest >= each unit's largest layer in the stage
            largest = lp.add_variable(f"largest_layer_{t}", lowBound=0)  # bytes times scale
            mem.append((largest, lam))
        for c in range(lo, hi + 1):
            xt, xc = choice.x(t, c)
            w = (ver + kappa) * float(problem.instance.chain.param[c]) * scale
            mem += [(v, a * w) for v, a in xt]
            mconst += xc * w
            if lam:
                big = float(problem.table.largest_layer(c, c + 1)) * scale
                if big > 0:
                    choice.add([*((v, a * big) for v, a in xt), (largest, -1.0)], xc * big, f"largest_{t}_{c}")
        if ties:
            for j, (units, state) in enumerate(zip(ties.units, ties.state, strict=True)):
                inside = [int(c) for c in units if lo <= c <= hi]
                if not inside:
                    continue
                h = lp.add_variable(f"tie_{t}_{j}", lowBound=0, upBound=1)
                for c in inside:
                    xt, xc = choice.x(t, c)
                    choice.add([*((v, a) for v, a in xt), (h, -1.0)], xc, f"tie_{t}_{j}_{c}")
                mem.append((h, ver * state * scale))
        choice.add(mem, mconst - rules.memory_limit(cap) * scale, f"memory_{t}")
    return choice.q


def _start_values(model: StraightModel, starts: list[int], value: float, time_unit: float) -> dict:
    vals = {
        f"started_{t}_by_{c}": float(c >= starts[t - 1])
        for t in range(1, model.S)
        for c in model.window(t)[:-1]
    }
    vals["bottleneck"] = max(value, model.lower_bound) / time_unit
    return vals  # the continuous window variables are completed by the solver


def solve_milp(
    problem: PartitionProblem,
    *,
    time_limit: float | Deadline = 60.0,
    solver: str = "cbc",
    seed: int = 0,
    threads: int = 1,
    warm_start: bool = True,
) -> Result:
    """Solve the straight partition problem as a MILP (PuLP, CBC or HiGHS).

    Parameters
    ----------
    problem
        The partition problem (``replication=False``).
    time_limit
        Seconds, or the solve's :class:`~pipeopt.backends.deadline.Deadline`: one clock for
        the warm start heuristic (at most a quarter of it), model building and the solver,
        which gets what is left through :func:`pipeopt.backends.pulp.solve_pulp`. CBC runs in
        a child process that the door ends at the deadline (plus
        :func:`~pipeopt.backends.pulp.kill_grace`, 0.3 s + 2 % of the limit) if it has not
        stopped itself, so the method returns within about that.
    solver
        ``"cbc"`` (PuLP's bundled CBC) or ``"highs"`` (HiGHS through highspy).
    seed
        Solver random seed.
    threads
        Solver threads (default 1: CBC and HiGHS are then deterministic).
    warm_start
        Give the solver a heuristic split as MIP start and add the time reach rows of its value
        (see the module docstring); ``False`` solves the bare formulation.

    Returns
    -------
    Result
        Method ``"milp"``.

        * ``OPTIMAL``: the solver proved optimality (gap :data:`MILP_REL_GAP`) and the plan's
          objective by :func:`pipeopt.evaluate` is within :data:`MILP_TOLERANCE` (relative,
          ``info["rel_gap_target"]``) of the lower bound. S = 1 and S = n have one split only:
          it is scored directly.
        * ``TIME_LIMIT``: the solver stopped at its time limit (what was left of the
          deadline) or the deadline passed during the warm start or model building; the
          plan is the best one found that fits (the solver's incumbent or the warm start), or
          ``None`` if none fits.
        * ``FEASIBLE``: the solver's answer could not be taken as a proof (it said infeasible
          although a split that fits is known, or its optimum is not confirmed by the valid
          bound); the best plan that fits and the bound.

        ``info["solver_objective"]`` and ``info["solver_bound"]`` are the solver's objective
        and (slackened) bound in seconds; ``info["bound_source"]`` says where the bound
        comes from.

        With objective ``"iteration"`` or ``"gpipe"`` (M microbatches under 1F1B with a
        flush, or GPipe) the event-time model of :func:`solve_iteration` runs instead.

        ``lower_bound`` (seconds) is valid for the true one-order optimum: the largest of
        :meth:`PartitionProblem.simple_lower_bound` (total work / S, largest unit) and the
        solver's dual bound less :data:`BOUND_SLACK` (relative). Memory is exact (0/1 reach
        rows), so every plan that fits is in the model and a plan the solver returns fits
        (checked by :func:`pipeopt.evaluate`; one that does not is removed and the model
        solved again).

    Raises
    ------
    InvalidProblemError
        If ``problem.replication`` is set (replication is solved by the DP only), the solver
        is unknown, ``threads`` < 1 or ``seed`` < 0, or the time limit is not a positive
        number.
    InfeasibleError
        Only when proven: the only split (S = 1 or S = n) breaks memory, the reach rows
        contradict each other on constants, or the solver proves that no split fits.

    References
    ----------
    Pinar & Aykanat, JPDC 2004 (1D chains-on-chains partitioning); Narayanan et al.,
    PipeDream, SOSP 2019 (1F1B memory, weight stashing).
    """
    deadline = Deadline.of(time_limit)
    if problem.instance.settings.objective != "bottleneck":
        return solve_iteration(problem, deadline, solver=solver, threads=threads, seed=seed)
    check_options("milp", threads, seed)
    if solver not in SOLVERS:
        raise InvalidProblemError(f"unknown MILP solver {solver!r}; choose from {SOLVERS}")
    problem.refuse_tie_sums("milp")  # its stage rows read the work as prefix sums (the event-time model has them)

    def run(model: StraightModel, hint: list[int], upper: float | None, dl: Deadline) -> Attempt:
        unit = model.time_unit
        lp, T, y = build_milp(model, unit, upper if warm_start else None, dl)
        info = {"solver": solver, "time_unit": unit, "rel_gap": MILP_REL_GAP,
                "binaries": sum(len(v) for v in y.values())}
        if lp is None:
            return Attempt("infeasible", info={**info, "solver": "reach rows (memory) on constants"})
        info["constraints"] = lp.numConstraints()
        start = _start_values(model, hint, upper or model.bottleneck(hint), unit) if hint else None
        out = solve_pulp(lp, solver=solver, deadline=dl, rel_gap=MILP_REL_GAP, abs_gap=MILP_ABS_GAP,
                         threads=int(threads), seed=int(seed), warm_start=start)
        info.update(out.info())
        starts = None
        # the door's bound (the solver's dual bound, or its objective less the gap when it
        # proved optimality), less the tolerances the solver works with
        bound = out.bound * unit * (1 - BOUND_SLACK) if out.bound is not None else None
        info["solver_bound"] = bound
        info["solver_objective"] = None
        if out.has_solution:
            values = {t: {c: out.value(y[t][c]) for c in y[t]} for t in y}
            starts = starts_from_cumulative(values, model)
            info["solver_objective"] = out.objective * unit
        status = out.status
        if status == "unbounded" or any("unbounded or infeasible" in note for note in out.notes):
            status = "infeasible"  # T >= simple_lower_bound: the model cannot be unbounded
        return Attempt(status, starts, bound, info)

    # the tie-break's event-time model does not model recomputation nor ZeRO: not run with them
    phase2 = None if problem.recompute != "none" or problem.data_parallel else \
        {"run": break_ties, "solver": solver, "threads": int(threads), "seed": int(seed)}
    try:
        return solve_exact(problem, "milp", deadline, run, rel_tol=MILP_TOLERANCE, abs_tol=0.0,
                           warm_start=warm_start, info={"solver": solver, "recompute": problem.recompute},
                           phase2=phase2)
    except InfeasibleError as err:  # say by how much the best split misses the limit
        from .dp import overshoot_note

        raise InfeasibleError(f"{err}{overshoot_note(problem)}") from None


def solve_iteration(problem: PartitionProblem, deadline: Deadline, *, solver: str = "cbc", threads: int = 1,
                    seed: int = 0) -> Result:
    """The exact straight split for the finite-M objectives (``"iteration"``: 1F1B with a
    flush; ``"gpipe"``: fill-drain): the event-time MILP of
    :func:`pipeopt.problems.partition.events.solve_events`, one start time per operation of
    the run (no closed form exists for 1F1B's; GPipe's is a sum of two flow shops), turned
    into a :class:`Result` scored by :func:`pipeopt.evaluate`.

    Raises
    ------
    InvalidProblemError
        If the problem is replicated (the event-time model has one worker per stage).
    InfeasibleError
        If no split fits the memory (proven by the model).
    """
    schedule = "gpipe" if problem.instance.settings.objective == "gpipe" else "1f1b"
    if problem.recompute != "none":
        raise InvalidProblemError(
            f"milp: the event-time model of objective {problem.instance.settings.objective!r} does not model "
            f"recomputation yet (recompute={problem.recompute!r}); use the bottleneck objective or recompute='none'"
        )
    if problem.data_parallel:
        raise InvalidProblemError(
            f"milp: the event-time model of objective {problem.instance.settings.objective!r} does not model data "
            "parallelism or ZeRO (Settings.dp, zero, ratios); use the bottleneck objective"
        )
    out = solve_events(problem, schedule, deadline=deadline, solver=solver, threads=int(threads), seed=int(seed))
    if out.status == "infeasible":
        raise infeasible_memory(problem, "milp", "proven infeasible by the event-time model")
    status = {"optimal": Status.OPTIMAL, "feasible": Status.FEASIBLE}.get(out.status, Status.TIME_LIMIT)
    plan = problem.plan(out.starts) if out.starts is not None else None
    if plan is None and status != Status.TIME_LIMIT:
        status = Status.TIME_LIMIT
    bound = min(out.bound, out.value) if plan is not None else out.bound
    return problem.result("milp", plan, status, lower_bound=bound if math.isfinite(bound) else None,
                          started=deadline.started, info={**out.info, "model": f"event-time ({schedule})"})



