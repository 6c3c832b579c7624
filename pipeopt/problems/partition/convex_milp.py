"""MILP (PuLP; CBC or HiGHS) of the partition problem over every convex ordered split.

The cross-check of the DP over ideals (:mod:`.convex`, method ``"convex"``) and the method for
a layer DAG with too many ideals to list (Inception-v3's PipeDream profile has 221,566). Same
problem, same cost model: S straight stages (one worker each), every convex ordered split
(:mod:`pipeopt.problems.ideals`), objective the 1F1B steady-state period of
:func:`pipeopt.evaluate` (``bottleneck``, the window rows included), memory of the
microbatches in flight.

Formulation, on the n units of the layer DAG (:class:`pipeopt.problems.ideals.UnitDag`: one
unit per layer, except that the ``pin_first`` layers and their ancestors form one unit, fixed to
stage 0), stages ``s = 0 .. S-1`` and boundaries ``c = 0 .. S-2`` (boundary c lies between
stages c and c + 1). The binaries are the **prefix indicators** ``p[u, c] = 1`` iff unit u is
in the first c + 1 stages (the ideal ``I_{c+1}``); ``p[u, S-1] = 1``, ``p[u, -1] = 0``, and
``x[u, s] = p[u, s] - p[u, s-1]`` is "u in stage s" (the brief's assignment binaries, a
unimodular change of variables). Times are in units of ``time_unit`` seconds (1/100 of the
warm start's period, or of the simple lower bound), memory rows are divided by the capacity.

    minimise T  s.t.
      p[u, c] <= p[u, c+1]                          (each unit in one stage)
      p[v, c] <= p[u, c]      every unit edge u -> v, every c
                                                    (stage(u) <= stage(v): convex ordered stages)
      sum_u x[u, s] >= 1                            (every stage non-empty)
      y[l, c] >= sec(l, v) (p[u, c] - p[v', c])     every layer edge l -> v across units
                                                    (u, v' the units of l and v; y >= 0)
      X_c = sum_l y[l, c],  W_c = sum_u work_u p[u, c]
      w_s = W_s - W_{s-1} (+ X_{s-1} + X_s without overlap) <= T        (stage rows)
      X_c <= T                                      (cut rows, with overlap)
      W_l - W_{i-1} + 2 sum_{c=i..l-1} X_c <= (l - i + 1) T, i < l      (window rows, with overlap)
      sum_u mem_s(u) x[u, s] <= memory_limit        (memory, finite capacity)
      T >= simple lower bound

* ``sec(l, v)``: the seconds one microbatch's tensor of layer l takes over one link on the edge
  to v (:func:`pipeopt.cost.rules.transfer_time` of its bytes). A tensor crosses boundary c
  once if its layer is in ``I_{c+1}`` and some reader is not, carrying the largest bytes of its
  edges to readers beyond c (:func:`pipeopt.cost.rules.crossing_bytes`): ``y[l, c]`` is at
  least that and enters every row with a positive coefficient, so a minimiser sets it to the
  maximum where it binds (and where it does not, the plan's true period is only smaller).
  ``X_c`` is boundary c's one-way transfer time.
* With overlap (``Settings.overlap``) the cut is busy ``X_c`` per microbatch in each direction
  (:func:`pipeopt.cost.rules.cut_time`) and a microbatch's round trip over it,
  ``2 X_c`` (:func:`pipeopt.cost.rules.round_trip`), enters the window rows; without overlap a
  stage's ops carry what it sends, activations over the cut after it and gradients over the cut
  before it (``X_{s-1} + X_s``), and the window rows are implied by the stage rows.
* The window rows are those of :func:`pipeopt.cost.rules.steady_period` without replication
  (``D_i - U_l = l - i + 1``): stages i..l hold l - i + 1 microbatches in flight. With the stage
  and cut rows, the max of the rows at a fixed split is exactly its period, so the model's
  optimum is the convex optimum of :func:`pipeopt.evaluate`'s bottleneck.
* ``mem_s(u) = k act_u + v param_u`` with ``k = S - s`` microbatches in flight
  (:func:`pipeopt.cost.rules.in_flight`) and ``v = k`` weight versions with weight stashing, else
  1 (:func:`pipeopt.cost.rules.stage_memory`, :func:`~pipeopt.cost.rules.weight_versions`); the
  right-hand side is :func:`pipeopt.cost.rules.memory_limit` of the capacity. A plan the solver
  accepts within its feasibility tolerance but that :func:`pipeopt.evaluate` finds over memory
  is cut off by a no-good row on that stage's set of units (valid for every superset and every
  earlier stage, which keeps more microbatches: memory only grows) and the model is solved
  again.
* Units that cannot be in ``I_{c+1}`` (too many ancestors to leave a unit to each later stage)
  or must be (too many descendants to leave one to each earlier stage) are fixed, as the
  one-order models restrict each start to its window.

Solving goes through the one PuLP door, :func:`pipeopt.backends.pulp.solve_pulp` (CBC or HiGHS
in a child process ended at the deadline). The warm start is the one-order heuristic split of
the one-order MILP (:func:`pipeopt.problems.partition.model.heuristic_split`, not a DP, so that
this model stays an independent check of the DP over ideals); its tolerances and gaps are the
one-order MILP's (:data:`~pipeopt.problems.partition.model.MILP_REL_GAP`,
:data:`~pipeopt.problems.partition.model.BOUND_SLACK`,
:data:`~pipeopt.problems.partition.model.MILP_TOLERANCE`).

References
----------
Tarnawski, Phanishayee, Devanur, Mahajan, Nina Paravecino, Efficient Algorithms for Device
Placement of DNN Graph Operators, NeurIPS 2020 (arXiv:2006.16423): the space of convex ordered
splits (their DP over ideals, ``throughput-dp/dp.cpp``) and their integer program
``throughput-ip/ip.py`` (per-device binaries, comm-in/comm-out variables bounded below by
differences of assignment binaries, as ``y`` above; a max-load objective). The linear form of
convex ordered stages used here is the standard one of precedence on stage indices, ``stage(u)
<= stage(v)`` on every edge, written per boundary on the prefix indicators (the same integer
points as ``sum_s s x[u, s] <= sum_s s x[v, s]``, a tighter relaxation). Narayanan et al.,
PipeDream, SOSP 2019 (1F1B memory, weight stashing).
"""

from __future__ import annotations

import math

import numpy as np

from ...lazy import lazy_module
from ...backends.scaling import model_unit
from ...backends.deadline import Deadline, DeadlineReached
from ...backends.pulp import SOLVERS, solve_pulp
from ...cost import evaluate, rules
from ...cost.arrays import layer_arrays
from ...cost.ties import refuse_ties
from ...cost.transient import refuse_transient
from ...errors import InvalidProblemError
from ...graph import layer_order
from ...plan import Plan, Stage
from ...result import Result, Status
from ..ideals import UnitDag
from .model import (
    BOUND_SLACK,
    HEURISTIC_SHARE,
    MILP_ABS_GAP,
    MILP_REL_GAP,
    MILP_TOLERANCE,
    StraightModel,
    check_options,
    heuristic_split,
    infeasible_memory,
)
from .problem import PartitionProblem

pulp = lazy_module("pulp")

__all__ = ["MAX_CUTS", "ConvexMilp", "solve_convex_milp"]

METHOD = "convex_milp"

MAX_CUTS = 50
"""At most this many rounds of memory no-good rows (each cuts off a stage the solver's
tolerance let past the cost model's memory rule) before the method gives up on a proof."""


class ConvexMilp:
    """The numbers of the model (module docstring) of one straight partition problem, and the
    PuLP model built from them.

    Parameters
    ----------
    problem
        The partition problem (``replication=False``, objective ``"bottleneck"``).

    Attributes
    ----------
    dag
        The unit DAG (:meth:`pipeopt.problems.ideals.UnitDag.build`, pinned layers and their
        ancestors in one unit).
    n, S
        Units and stages.
    work
        ``ndarray (n,)``: forward + backward seconds of each unit on one worker.
    memory
        ``ndarray (S, n)``: bytes unit u adds to stage s (its activations times the
        microbatches stage s keeps, its parameters times the weight versions), or ``None`` with
        an unlimited capacity.
    limit
        Bytes: :func:`pipeopt.cost.rules.memory_limit` of a worker's capacity.
    tensors
        ``list[(tail layer, tail unit, {head unit: seconds})]``: each layer's out-edges to
        other units, the largest transfer time (one link) per head unit; zero-byte edges left out.
    fixed
        ``ndarray (n, S) of int8``: 1 or 0 where ``p[u, c]`` is forced (pinned unit, too many
        ancestors or descendants; column S-1 is 1), -1 where it is a variable.
    lower_bound
        Seconds: a bound on the convex optimum without a solver, the largest of the total
        work over S and the largest unit's work.
    overlap
        Whether transfers overlap compute (:class:`pipeopt.Settings`).
    """

    def __init__(self, problem: PartitionProblem) -> None:
        inst = problem.instance
        self.problem = problem
        self.dag = dag = UnitDag.build(inst.graph)
        self.n, self.S = n, S = dag.n, problem.stages
        arr = layer_arrays(inst)
        kind = problem.kind
        units_of_kind = inst.cluster.devices[0].resources[kind]
        unit = arr.unit_positions(dag.units)  # unit of each layer, in the arrays' order
        self.work = np.bincount(unit, weights=(arr.fwd[kind] + arr.bwd[kind]) / units_of_kind, minlength=n)
        self.limit = rules.memory_limit(problem.memory)
        self.memory = None
        if math.isfinite(problem.memory):
            act = np.bincount(unit, weights=arr.act, minlength=n)
            par = np.bincount(unit, weights=arr.param, minlength=n)
            stash = inst.settings.weight_stashing
            rows = []
            for s in range(S):
                k = rules.in_flight(s, S)
                rows.append(rules.stage_memory(act, par, k, rules.weight_versions(k, stash)))
            self.memory = np.array(rows)
        bw = inst.cluster.bandwidth
        heads: dict[int, dict[int, float]] = {}
        for t, h, b in zip(arr.tail.tolist(), arr.head.tolist(), arr.edge_bytes.tolist(), strict=True):
            a, v = int(unit[t]), int(unit[h])
            if a == v or not b > 0:
                continue  # inside a unit (never crosses) or nothing to send
            sec = float(rules.transfer_time(b, bw))
            per = heads.setdefault(t, {})
            per[v] = max(per.get(v, 0.0), sec)
        self.tensors = [(arr.nodes[t], int(unit[t]), per) for t, per in sorted(heads.items())]
        self.overlap = bool(inst.settings.overlap)
        # per second of one-way transfer: what the cut's busy time and a round trip count (ratios of
        # rules linear in 1 / bandwidth, taken at 1 B/s: an infinite bandwidth gives 0 / 0 otherwise)
        one = float(rules.transfer_time(1.0, 1.0))
        self.cut_coef = float(rules.cut_time(1.0, 1.0, 1.0)) / one
        self.trip_coef = float(rules.round_trip(1.0, 1.0, 1.0)) / one
        self.fixed = self._fixings()
        self.lower_bound = float(max(self.work.sum() / S, self.work.max(initial=0.0)))

    def _fixings(self) -> np.ndarray:
        """``fixed[u, c]`` (see the class docstring): the pinned unit is in every ideal; a unit
        with ``a`` ancestors is outside ``I_{c+1}`` when ``a + 1 > n - (S - 1 - c)``; one with
        ``d`` descendants is inside it when ``n - 1 - d < c + 1``."""
        n, S, dag = self.n, self.S, self.dag
        anc = [0] * n
        for u in range(n):  # units in topological order
            for p in dag.preds[u]:
                anc[u] |= anc[p] | (1 << p)
        desc = [0] * n
        for u in range(n - 1, -1, -1):
            for p in dag.preds[u]:
                desc[p] |= desc[u] | (1 << u)
        fixed = np.full((n, S), -1, dtype=np.int8)
        fixed[:, S - 1] = 1
        pinned = {dag.unit_of[x] for x, p in self.problem.instance.graph.nodes(data="pin_first") if p}
        for u in range(n):
            a, d = anc[u].bit_count(), desc[u].bit_count()
            for c in range(S - 1):
                if u in pinned or n - 1 - d < c + 1:
                    fixed[u, c] = 1
                elif a + 1 > n - (S - 1 - c):
                    fixed[u, c] = 0
        return fixed

    # ---- the PuLP model -------------------------------------------------------------------
    def build(self, time_unit: float, deadline: Deadline | None = None) -> None:
        """Build the PuLP model (module docstring) in units of ``time_unit`` seconds.

        Sets :attr:`lp`, :attr:`T` (the bottleneck variable), :attr:`p` (``dict[(u, c),
        LpVariable]`` of the free prefix indicators).

        Raises
        ------
        DeadlineReached
            If ``deadline`` passes while the rows are written.
        """
        deadline = Deadline(None) if deadline is None else deadline
        n, S, fixed = self.n, self.S, self.fixed
        u_ = 1.0 / time_unit
        self.time_unit = time_unit
        lp = pulp.LpProblem("partition_convex", pulp.LpMinimize)
        T = lp.add_variable("bottleneck", lowBound=self.lower_bound * u_)
        lp += T, "bottleneck_time"
        p = {(u, c): lp.add_variable(f"in_{u}_by_{c}", cat=pulp.LpBinary)
             for u in range(n) for c in range(S - 1) if fixed[u, c] < 0}
        self.lp, self.T, self.p = lp, T, p

        def add(terms, constant, name, sense=pulp.LpConstraintLE):
            lp.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms, constant), sense), name)

        def prefix(u, c):
            """``p[u, c]`` as (variable or None, constant)."""
            if c < 0:
                return None, 0.0
            f = fixed[u, c]
            return (p[u, c], 0.0) if f < 0 else (None, float(f))

        def lin(pairs):
            """``sum coef * p[u, c]`` over ``pairs`` of ``(coef, u, c)`` as (terms, constant)."""
            terms, const = {}, 0.0
            for coef, u, c in pairs:
                v, k = prefix(u, c)
                if v is None:
                    const += coef * k
                elif coef:
                    terms[v] = terms.get(v, 0.0) + coef
            return list(terms.items()), const

        # structure: monotone in c, precedence per boundary, non-empty stages
        for c in range(S - 2):
            deadline.check("building the convex MILP")
            for u in range(n):
                a, b = p.get((u, c)), p.get((u, c + 1))
                if a is not None and b is not None:  # the fixings are monotone in c
                    add([(a, 1.0), (b, -1.0)], 0.0, f"one_stage_{u}_{c}")
        for v in range(n):
            for u in self.dag.preds[v]:
                for c in range(S - 1):
                    terms, const = lin([(1.0, v, c), (-1.0, u, c)])
                    if terms:
                        add(terms, const, f"precedence_{u}_{v}_{c}")
        for s in range(S):
            deadline.check("building the convex MILP")
            terms, const = lin([(-1.0, u, s) for u in range(n)] + [(1.0, u, s - 1) for u in range(n)])
            add(terms, const + 1.0, f"nonempty_{s}")
        # prefix work W_c and crossing time X_c as continuous variables
        W: list = []
        for c in range(S - 1):
            w = lp.add_variable(f"work_{c}")
            terms, const = lin([(float(self.work[u]) * u_, u, c) for u in range(n)])
            add([(w, 1.0), *((v, -k) for v, k in terms)], -const, f"work_{c}", pulp.LpConstraintEQ)
            W.append(w)
        X: list = [None] * (S - 1)
        for c in range(S - 1):
            deadline.check("building the convex MILP")
            ys = []
            for layer_index, (_, a, per) in enumerate(self.tensors):
                rows = []
                for b, sec in per.items():
                    terms, const = lin([(sec * u_, a, c), (-sec * u_, b, c)])
                    if terms or const > 0:
                        rows.append((terms, const))
                if not rows:
                    continue
                y = lp.add_variable(f"sent_{layer_index}_at_{c}", lowBound=0.0)
                for j, (terms, const) in enumerate(rows):
                    add([*terms, (y, -1.0)], const, f"crossing_{layer_index}_{c}_{j}")
                ys.append(y)
            if ys:
                x = lp.add_variable(f"crossing_{c}", lowBound=0.0)
                add([(x, 1.0), *((y, -1.0) for y in ys)], 0.0, f"crossing_{c}", pulp.LpConstraintEQ)
                X[c] = x
        total = float(self.work.sum()) * u_

        def work_between(i, l):
            """``W_l - W_{i-1}`` (stages i..l) as (terms, constant)."""
            terms, const = [], 0.0
            if l == S - 1:
                const += total
            else:
                terms.append((W[l], 1.0))
            if i > 0:
                terms.append((W[i - 1], -1.0))
            return terms, const

        sends = [[(X[c], 1.0)] if X[c] is not None else [] for c in range(S - 1)]
        for s in range(S):
            terms, const = work_between(s, s)
            # without overlap the stage's ops carry what it sends: X_s forward, X_{s-1} back
            f_send, b_send = rules.carried(s, S, [], [], sends, sends, self.overlap)
            terms += b_send + f_send
            add([*terms, (T, -1.0)], const, f"stage_time_{s}")
        if self.overlap:
            for c in range(S - 1):
                if X[c] is not None:
                    add([(X[c], self.cut_coef), (T, -1.0)], 0.0, f"cut_time_{c}")
            for l in range(1, S):
                for i in range(l):
                    trips = [(X[c], self.trip_coef) for c in range(i, l) if X[c] is not None]
                    if not trips:
                        continue  # a sum of stage rows
                    terms, const = work_between(i, l)
                    add([*terms, *trips, (T, -float(l - i + 1))], const, f"window_{i}_{l}")
        if self.memory is not None:
            for s in range(S):
                coef = self.memory[s] / self.limit
                terms, const = lin([(float(coef[u]), u, s) for u in range(n)]
                                   + [(-float(coef[u]), u, s - 1) for u in range(n)])
                add(terms, const - 1.0, f"memory_{s}")
        self.cuts = 0

    def exclude(self, stage: int, units: list[int]) -> bool:
        """No-good row: no stage ``s <= stage`` holds every unit of ``units`` (the stage broke
        memory by :func:`pipeopt.evaluate`; memory grows with the units and with the
        microbatches an earlier stage keeps).

        Returns
        -------
        bool
            ``False`` if every unit of ``units`` is fixed to stage ``stage`` (:attr:`fixed`):
            every convex split holds that stage, so none fits (a proof).
        """
        possible = True
        for s in range(stage + 1):
            terms, const = {}, 0.0
            for u in units:  # x[u, s] = p[u, s] - p[u, s-1]
                for c, sign in ((s, 1.0), (s - 1, -1.0)):
                    if c < 0:
                        continue
                    f = self.fixed[u, c]
                    if f < 0:
                        terms[self.p[u, c]] = terms.get(self.p[u, c], 0.0) + sign
                    else:
                        const += sign * float(f)
            terms = [(v, k) for v, k in terms.items() if k]
            if not terms:  # constants: x[u, s] = 1 for every unit (s = stage), or a slack row
                possible = possible and (s != stage or const < len(units))
                continue
            self.lp.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms, const - (len(units) - 1)),
                                                    pulp.LpConstraintLE), f"memory_cut_{self.cuts}_{s}")
        self.cuts += 1
        return possible

    # ---- solutions and plans --------------------------------------------------------------
    def stages_of(self, values: dict) -> list[int]:
        """The stage of each unit from prefix-indicator values (``name -> value``, 0.5
        threshold): the boundaries it is beyond.

        Raises
        ------
        RuntimeError
            If the values do not describe S non-empty convex ordered stages (a modelling bug).
        """
        n, S = self.n, self.S
        inside = np.array(self.fixed, dtype=float)
        for (u, c), var in self.p.items():
            v = values.get(var.name)
            inside[u, c] = 1.0 if v is not None and v > 0.5 else 0.0
        inside = inside > 0.5
        stage = (S - inside.sum(axis=1)).astype(int)
        ok = bool(np.all(inside[:, :-1] <= inside[:, 1:])) if S > 1 else True
        ok = ok and all(stage[a] <= stage[b] for b in range(n) for a in self.dag.preds[b])
        ok = ok and np.bincount(stage, minlength=S).min() >= 1
        if not ok:
            raise RuntimeError(f"solver values do not give {S} non-empty convex ordered stages: "
                               f"{stage.tolist()}")
        return stage.tolist()

    def plan(self, stage: list[int]) -> Plan:
        """The plan that puts unit u in stage ``stage[u]``: stages in order, layers in the
        graph's layer order (:func:`pipeopt.graph.layer_order`), one device each, dealt in
        cluster order."""
        graph = self.problem.instance.graph
        where = {x: stage[u] for u, layers in enumerate(self.dag.units) for x in layers}
        sets: list[list] = [[] for _ in range(self.S)]
        for x in layer_order(graph):
            sets[where[x]].append(x)
        names = [d.name for d in self.problem.instance.cluster.devices]
        return Plan(tuple(Stage(tuple(layers), (names[s],), 1) for s, layers in enumerate(sets)))

    def stages_of_plan(self, plan: Plan) -> list[int] | None:
        """The stage of each unit in ``plan``, or ``None`` if a unit is split between stages."""
        where = {x: s for s, st in enumerate(plan.stages) for x in st.layers}
        out = []
        for layers in self.dag.units:
            s = {where[x] for x in layers}
            if len(s) != 1:
                return None
            out.append(s.pop())
        return out

    def start_values(self, stage: list[int]) -> dict:
        """MIP start of the prefix indicators of a split (unit u in stage ``stage[u]``)."""
        return {var.name: float(stage[u] <= c) for (u, c), var in self.p.items()}


def _score(problem: PartitionProblem, plan: Plan) -> tuple[float, bool, list[int]]:
    """``evaluate``'s objective of the plan, whether it fits, and the stages over memory."""
    ev = evaluate(problem.instance, plan)
    if ev.feasible:
        return ev.objective, True, []
    return ev.objective, False, [s for s in range(plan.num_stages) if not problem.fits(ev.memory[s])]


def solve_convex_milp(
    problem: PartitionProblem,
    *,
    time_limit: float | Deadline = 60.0,
    solver: str = "cbc",
    seed: int = 0,
    threads: int = 1,
    warm_start: bool = True,
) -> Result:
    """Solve the straight partition problem over every convex ordered split as a MILP.

    Parameters
    ----------
    problem
        The partition problem (``replication=False``, objective ``"bottleneck"``).
    time_limit
        Seconds, or the solve's :class:`~pipeopt.backends.deadline.Deadline`: one clock for the
        warm start (at most :data:`~pipeopt.problems.partition.model.HEURISTIC_SHARE` of it),
        model building and every solver run, each of which the door ends at the deadline
        (plus :func:`~pipeopt.backends.pulp.kill_grace`).
    solver
        ``"cbc"`` or ``"highs"``.
    seed
        Solver random seed (integer >= 0).
    threads
        Solver threads (integer >= 1; HiGHS only, CBC runs serially).
    warm_start
        Give the solver the one-order heuristic split as MIP start (and keep it as the
        incumbent if it fits); ``False`` solves the bare model.

    Returns
    -------
    Result
        Method ``"convex_milp"``, space ``"convex"``; the plan's objective is
        :func:`pipeopt.evaluate`'s (seconds).

        * ``OPTIMAL``: the solver proved its model optimal, the plan fits by
          :func:`pipeopt.evaluate` and its objective is within
          :data:`~pipeopt.problems.partition.model.MILP_TOLERANCE` (relative) of the lower
          bound. S = 1 (one plan) is scored directly.
        * ``TIME_LIMIT``: the deadline passed (in the warm start, the model building or a solver
          run): the best plan that fits (the solver's incumbent or the warm start), or ``None``,
          and the bound.
        * ``FEASIBLE``: the solver's answer is no proof (it said infeasible although a plan
          that fits is known, its optimum is not confirmed by the bound, or the memory no-good
          rounds ran out).

        ``lower_bound`` (seconds) is valid for the convex optimum: the largest of the total work
        over S, the largest unit's work and the solvers' dual bounds less
        :data:`~pipeopt.problems.partition.model.BOUND_SLACK` (relative). ``info``: the solver,
        binaries and rows, the warm start, ``solver_bound`` and ``solver_objective`` (seconds),
        ``memory_cuts``, ``bound_source``.

    Raises
    ------
    InvalidProblemError
        If ``problem.replication`` is set (replicated convex splits are solved by the DP over
        ideals, method ``"convex"``), the objective is not ``"bottleneck"``, the DAG has fewer
        units than stages, the solver is unknown, or ``threads``/``seed`` are out of range.
    InfeasibleError
        Only when proven: the only plan (S = 1) breaks memory, or the solver proves that no
        split fits and none is known.

    References
    ----------
    Tarnawski et al., NeurIPS 2020 (the convex space; ``throughput-ip/ip.py``); Narayanan et
    al., PipeDream, SOSP 2019 (1F1B memory, weight stashing).
    """
    problem.refuse_recompute("method 'convex_milp'")
    refuse_ties(problem.instance, f"method {METHOD!r}")
    refuse_transient(problem.instance, f"method {METHOD!r}")
    deadline = Deadline.of(time_limit)
    if problem.replication:
        raise InvalidProblemError(
            f"method {METHOD!r} covers the convex space with one worker per stage; replicated "
            "convex splits are solved by the DP over ideals (method 'convex')")
    objective = problem.instance.settings.objective
    if objective != "bottleneck":
        raise InvalidProblemError(
            f"{METHOD} minimises the steady-state bottleneck; objective {objective!r} is not supported "
            "in the convex space")
    check_options(METHOD, threads, seed)
    if solver not in SOLVERS:
        raise InvalidProblemError(f"unknown MILP solver {solver!r}; choose from {SOLVERS}")
    model = ConvexMilp(problem)
    S = problem.stages
    if model.n < S:
        raise InvalidProblemError(f"more stages ({S}) than units ({model.n}) in {problem.instance.name}")
    info: dict = {"solver": solver, "units": model.n, "rel_gap_target": MILP_TOLERANCE}
    space = "convex"
    if S == 1:
        plan = model.plan([0] * model.n)
        value, fits, _ = _score(problem, plan)
        if not fits:
            raise infeasible_memory(problem, METHOD, "the only plan there is breaks memory")
        info["solver"] = "none (S = 1: one plan only, scored by evaluate)"
        return problem.result(METHOD, plan, Status.OPTIMAL, lower_bound=value, started=deadline.started,
                              space=space, info=info)
    incumbent, inc_value = None, math.inf
    bound = model.lower_bound
    info["bound_source"] = "total work / S, largest unit"
    notes: list[str] = []
    proven, stopped = False, False
    try:
        start, scale = None, model.lower_bound
        if warm_start:
            hint = heuristic_split(StraightModel.of(problem, METHOD), deadline.sub(fraction=HEURISTIC_SHARE))
            plan = problem.plan(hint)
            value, fits, _ = _score(problem, plan)
            info.update(warm_start=hint, warm_start_value=value, warm_start_fits=fits)
            if fits:
                incumbent, inc_value = plan, value
                start = model.stages_of_plan(plan)  # None only if it splits a unit
            if math.isfinite(value) and value > 0:
                scale = value
        unit = model_unit(scale, 100.0)
        model.build(unit, deadline)
        info.update(time_unit=unit, binaries=len(model.p), constraints=model.lp.numConstraints())
        rounds = 0
        while True:
            rounds += 1
            ws = model.start_values(start) if start is not None else None
            out = solve_pulp(model.lp, solver=solver, deadline=deadline, rel_gap=MILP_REL_GAP,
                             abs_gap=MILP_ABS_GAP, threads=int(threads), seed=int(seed), warm_start=ws)
            info.update(out.info())
            run_bound = out.bound * unit * (1 - BOUND_SLACK) if out.bound is not None else None
            info["solver_bound"] = run_bound
            info["solver_objective"] = out.objective * unit if out.objective is not None else None
            if run_bound is not None and run_bound > bound:
                bound = run_bound
                info["bound_source"] = f"{solver} (run {rounds})"
            status = out.status
            if status == "unbounded" or any("unbounded or infeasible" in note for note in out.notes):
                status = "infeasible"  # T >= the simple bound: the model cannot be unbounded
            if status == "infeasible":
                if incumbent is None:
                    raise infeasible_memory(problem, METHOD, f"proven infeasible by {solver}")
                notes.append("the solver said infeasible although a plan that fits is known: no proof")
                break
            if status in ("feasible", "no_solution"):
                stopped = True  # the solver's one limit is the deadline
            if not out.has_solution:
                break
            stages = model.stages_of(out.values)
            plan = model.plan(stages)
            value, fits, over = _score(problem, plan)
            if fits:
                if value < inc_value:
                    incumbent, inc_value = plan, value
                    info["incumbent"] = f"{solver} (run {rounds})"
                proven = status == "optimal"
                break
            if rounds > MAX_CUTS or deadline.expired():
                notes.append(f"solver plan breaks memory by evaluate (stages {over}); not returned")
                break
            if not all([model.exclude(s, [u for u in range(model.n) if stages[u] == s]) for s in over]):
                # a stage over memory that every convex split holds: none fits
                if incumbent is None:
                    raise infeasible_memory(problem, METHOD, f"every convex split holds a stage of {over} "
                                            "that breaks memory")
                notes.append("a stage every split holds breaks memory although a plan that fits is known: "
                             "no proof")
                break
            notes.append(f"solver plan breaks memory by evaluate in stages {over}: cut off, solved again")
            start = model.stages_of_plan(incumbent) if incumbent is not None else None
        info["solver_runs"] = rounds
        info["memory_cuts"] = model.cuts
    except DeadlineReached as stop:
        info["stopped"] = str(stop)
        stopped = True
    if proven and inc_value - bound <= MILP_TOLERANCE * inc_value:
        status = Status.OPTIMAL
    elif stopped or deadline.expired() or incumbent is None:
        status = Status.TIME_LIMIT
        if incumbent is None and not (stopped or deadline.expired()):
            notes.append("no plan that fits and no proof")
    else:
        status = Status.FEASIBLE
        if proven:
            notes.append("the solver's optimum is not confirmed by the valid bound within the tolerance")
    if incumbent is not None and bound > inc_value:
        notes.append(f"bound {bound!r} above the plan's objective {inc_value!r} (solver tolerances): "
                     "the plan's objective is quoted")
        bound = inc_value
    if notes:
        info["notes"] = notes
    return problem.result(METHOD, incumbent, status, lower_bound=bound, started=deadline.started, space=space,
                          info=info)
