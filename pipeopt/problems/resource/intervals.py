"""The CP-SAT models of the joint and group problems at a fixed limit T on the period.

Each model holds every stage's own rows (both passes within T, memory with split execution's
``2 (S - s)`` microbatches in flight, cut transfers within T) exactly or relaxed, and the
window rows (:func:`pipeopt.cost.rules.steady_period`) as a relaxation:

* Fixed workers (joint): the stage time of units ``a..b-1`` on its worker only grows with b
  (:meth:`~pipeopt.problems.resource.ResourceProblem.fit_time`), so stage s may start at
  ``c_s`` and end at ``c_{s+1}`` iff ``c_{s+1} <= reach_s(c_s)``, the farthest end that passes
  T, tabulated exactly beforehand: integer stage starts ``c_s`` whose domains are the cuts
  whose transfer passes T, one element constraint per stage (:meth:`IntervalProbe.build_fixed`).
* Grouping, stage intervals (:meth:`IntervalProbe.build`): Booleans ``y[a, b, s]`` (stage s
  covers units ``a..b-1``) form a path from unit 0 to n through S stages; an interval is
  offered only if its cut transfers pass T, it passes T on the strongest conceivable worker
  (:func:`pipeopt.problems.resource.bounds.strongest_worker`) and it lies on such a path.
  ``n[c, s]`` integer is the number of devices of class c (identical devices,
  :attr:`~pipeopt.problems.resource.GroupProblem.device_classes`) in worker s - identical
  devices are interchangeable, so counting them removes their symmetry and shrinks every row
  to one term per class. By LP duality the split feasibility of an interval on a worker is
  *linear in the worker's devices* (:func:`interval_cover_coefficients`); ``y`` enforces
  those rows and the interval's memory on the worker's devices.
* Window rows (both models; split execution: ``D_i = 2 (S - i)``, ``U = 0``): integer busy
  times ``t[s]`` in units of ``T / WINDOW_SCALE`` (at most ``2 T``) and, for every i,
  ``sum_{s>=i} t[s] + sum_{s>i} (round trip of stage s's first cut) <= 2 (S - i) T``. The busy
  time ``f + b`` of a stage is not linear in its units or worker, so ``t`` gets cuts where a
  plan breaks a row (:meth:`IntervalProbe.window`): the exact busy time when the stage
  contains the same units (fixed workers), or a supporting plane linear in the worker's
  devices (:func:`~pipeopt.problems.resource.split.busy_cut`, grouping), plus a no-good.

Coefficients are scaled to integers and rounded in the relaxing direction
(:data:`COVER_SCALE`, :data:`MEMORY_SCALE`, :data:`WINDOW_SCALE`), so an infeasible answer is
a proof; plans are checked exactly afterwards (:func:`pipeopt.problems.resource.search.certify`).

Solved through :func:`pipeopt.backends.cpsat.solve_cpsat`.
"""

from __future__ import annotations

import math

from ...lazy import lazy_module
from ...backends.bisection import FEASIBLE, INFEASIBLE, UNKNOWN, Probe
from ...backends.cpsat import solve_cpsat
from ...backends.deadline import Deadline, DeadlineReached
from ...cost import rules
from .bounds import strongest_worker
from .problem import GroupProblem, ResourceProblem
from .search import certify
from .split import busy_cut

cp_model = lazy_module("ortools.sat.python.cp_model")

COVER_SCALE = 10**6
"""Right-hand side of the integer split-feasibility rows (coefficients rounded up, in the
relaxing direction). With 1e9 CP-SAT 9.15's presolve wrongly reported a feasible model
infeasible; 1e6 passes the cross-checks."""

MEMORY_SCALE = 10**6
"""The largest device capacity in integer memory units (capacities rounded up, needs down)."""

WINDOW_SCALE = 10**6
"""Integer time units per T in the window rows (busy times and round trips rounded down, the
rows' right-hand sides exact: a relaxation)."""

WINDOW_CAP = 2**40
"""Largest integer round trip (a cut that long is no cut at T anyway)."""


def interval_cover_coefficients(F: dict, B: dict, kinds: tuple) -> list[dict]:
    """Rows ``c(lambda)`` of the split-feasibility test of one stage load.

    By LP duality the best split's rate is ``min over lambda in [0, 1] of
    sum_k R_k max(lambda / F_k, (1 - lambda) / B_k)``, a convex piecewise-linear function
    whose kinks ``F_k / (F_k + B_k)`` do not depend on R. So a stage with loads F, B runs
    within T on resources R iff ``sum_k R_k c_k(lambda) >= 1 / T`` for every lambda in
    {0, 1, F_k / (F_k + B_k)}: constraints *linear in R*, hence in the device assignment.
    A kind counts for a pass if it runs that pass of the whole load (finite F_k, resp. B_k;
    ``1 / inf = 0``), as in :func:`pipeopt.problems.resource.best_split`.

    Returns
    -------
    list[dict[kind, float]]
        One row per lambda (``inf`` where a pass has no work on a kind).
    """
    usable = [k for k in kinds if math.isfinite(F[k]) or math.isfinite(B[k])]
    lams = {0.0, 1.0}
    for k in usable:
        if math.isfinite(F[k] + B[k]) and F[k] + B[k] > 0:
            lams.add(F[k] / (F[k] + B[k]))

    def ratio(x, y):
        return 0.0 if x == 0 or math.isinf(y) else (math.inf if y == 0 else x / y)

    return [{k: max(ratio(lam, F[k]), ratio(1 - lam, B[k])) for k in usable} for lam in sorted(lams)]


class IntervalProbe:
    """``probe(T, deadline)`` for :func:`pipeopt.backends.bisection.bisect`: the interval model at T.

    Parameters
    ----------
    problem
        A joint or group problem.
    threads
        CP-SAT search threads.
    seed
        CP-SAT's random seed.
    """

    def __init__(self, problem: ResourceProblem, *, threads: int = 2, seed: int = 0):
        self.problem, self.threads, self.seed = problem, int(threads), int(seed)
        self.group = isinstance(problem, GroupProblem)
        self.strong_res, self.strong_mem = strongest_worker(problem)
        self._strong_time: dict = {}
        self._cover: dict = {}
        if self.group:
            devices = problem.instance.cluster.devices
            self.classes = problem.device_classes
            self.rep = [devices[cls[0]] for cls in self.classes]  # one device of each class
            demand = max(problem.stage_memory(0, problem.n, s) for s in range(problem.num_stages)) + 1.0
            limits = [min(float(rules.memory_limit(d.memory)), demand) for d in self.rep]
            self.memory_limited = any(math.isfinite(d.memory) for d in devices)
            self.mem_scale = MEMORY_SCALE / max(max(limits), 1e-300)
            self.mem_coef = [math.ceil(c * self.mem_scale) for c in limits]

    def __call__(self, T: float, deadline: Deadline | None) -> Probe:
        """Is there a plan with period <= T seconds? (:class:`~pipeopt.backends.bisection.Probe`)."""
        try:
            model = self.build(T, deadline) if self.group else self.build_fixed(T, deadline)
        except DeadlineReached:
            return Probe(UNKNOWN)
        if model is None:
            return Probe(INFEASIBLE)
        return certify(self.problem, T, lambda: self.solve(model, deadline), lambda *st: self.forbid(model, *st),
                       lambda *w: self.window(model, *w))

    # ---- cached, T-independent pieces -------------------------------------------------------------
    def _strong(self, a: int, b: int) -> float:
        v = self._strong_time.get((a, b))
        if v is None:
            v = self._strong_time[a, b] = self.problem.compute_time(a, b, self.strong_res)
        return v

    def _cover_rows(self, a: int, b: int) -> list[list[float]]:
        """Per lambda row, each device class's ``sum_k r_dk c_k(lambda)`` (T-independent)."""
        rows = self._cover.get((a, b))
        if rows is None:
            F, B = self.problem.load(a, b)
            rows = []
            for row in interval_cover_coefficients(F, B, self.problem.kinds):
                rows.append([sum(dv.resources.get(k, 0.0) * c for k, c in row.items() if dv.resources.get(k, 0.0) > 0)
                             for dv in self.rep])
            self._cover[a, b] = rows
        return rows

    def _offered(self, a: int, b: int, s: int, T: float) -> bool | None:
        """Does interval ``a..b-1`` at stage s pass T on the strongest conceivable worker (and its
        end cut)? ``None``: no, and no longer interval starting at a does either (compute and
        memory grow with b)."""
        p = self.problem
        if self._strong(a, b) > T or not rules.fits(p.stage_memory(a, b, s), self.strong_mem):
            return None
        return p.cut_time[b] <= T

    # ---- the models at T --------------------------------------------------------------------------
    def build_fixed(self, T: float, deadline: Deadline | None = None) -> dict | None:
        """Fixed workers: ``{"model", "c"}`` with ``c[s]`` the first unit of stage s (``c[0] = 0``,
        ``c[S] = n``), or ``None`` if no stage can start the chain.

        Raises
        ------
        DeadlineReached
            If ``deadline`` passes while the reach tables are computed.
        """
        p = self.problem
        n, S = p.n, p.num_stages
        reach = []  # reach[s][a]: the farthest end of stage s starting at a that passes T (a if none)
        for s in range(S):
            row = []
            for a in range(n):
                if deadline is not None and a % 16 == 0:
                    deadline.check(f"building the CP-SAT stage model (stage {s}, unit {a})")
                lo, hi = a, n  # fit_time(a, lo) passes (lo = a: the empty stage), hi + 1 does not
                while lo < hi:  # the stage time only grows with b: bisect the farthest end
                    mid = (lo + hi + 1) // 2
                    if p.fit_time(a, mid, p.groups[s], s) <= T:
                        lo = mid
                    else:
                        hi = mid - 1
                row.append(lo)
            reach.append(row + [n])
        if reach[0][0] == 0:
            return None
        model = cp_model.CpModel()
        cuts = [c for c in range(1, n) if p.cut_time[c] <= T]
        c = [model.new_constant(0)]
        for s in range(1, S):
            allowed = [x for x in cuts if s <= x <= n - (S - s)]
            if not allowed:
                return None
            c.append(model.new_int_var_from_domain(cp_model.Domain.from_values(allowed), f"c_{s}"))
        c.append(model.new_constant(n))
        for s in range(S):
            end = model.new_int_var(0, n, f"reach_{s}")
            model.add_element(c[s], reach[s], end)
            model.add(c[s + 1] >= c[s] + 1)
            model.add(c[s + 1] <= end)
        trips = [self._trip(x, T) for x in range(n + 1)]
        enter = [0]
        for s in range(1, S):
            v = model.new_int_var(0, max(trips), f"trip_{s}")
            model.add_element(c[s], trips, v)
            enter.append(v)
        return {"model": model, "c": c, "t": self._windows(model, enter), "T": T}

    def build(self, T: float, deadline: Deadline | None = None) -> dict | None:
        """Grouping: ``{"model", "y", "g"}`` (``y[a, b, s]``: stage s is units ``a..b-1``;
        ``g[c, s]``: devices of class c in worker s), or ``None`` if no interval can start the
        chain.

        Raises
        ------
        DeadlineReached
            If ``deadline`` passes while the model is written.
        """
        p = self.problem
        n, S = p.n, p.num_stages
        model = cp_model.CpModel()
        y, out_of, into = {}, {}, {}
        C = len(self.classes)
        g = {(c, s): model.new_int_var(0, len(self.classes[c]), f"n_{c}_{s}") for c in range(C) for s in range(S)}
        for c in range(C):
            model.add(sum(g[c, s] for s in range(S)) == len(self.classes[c]))
        for s in range(S):
            model.add(sum(g[c, s] for c in range(C)) >= 1)
        # the intervals each stage may take, kept only if they lie on a path from unit 0 to n
        reach = {0}  # units where stage s may start
        offered: list[list[tuple[int, int]]] = []
        for s in range(S):
            here, ends = [], set()
            for a in sorted(reach):
                if p.cut_time[a] > T:
                    continue
                if deadline is not None:
                    deadline.check(f"building the CP-SAT interval model (stage {s}, unit {a})")
                for b in range(a + 1, n - (S - 1 - s) + 1):
                    if s == S - 1 and b != n:
                        continue
                    ok = self._offered(a, b, s, T)
                    if ok is None:
                        if s < S - 1:
                            break
                        continue
                    if ok:
                        here.append((a, b))
                        ends.add(b)
            offered.append(here)
            reach = ends
        useful = {n}  # units where stage s + 1 may start and still reach n
        for s in range(S - 1, -1, -1):
            offered[s] = [(a, b) for a, b in offered[s] if b in useful]
            useful = {a for a, _ in offered[s]}
        for s in range(S):
            for count, (a, b) in enumerate(offered[s]):
                if deadline is not None and count % 64 == 0:
                    deadline.check(f"building the CP-SAT interval model (stage {s}, unit {a})")
                v = model.new_bool_var(f"y_{a}_{b}_{s}")
                y[a, b, s] = v
                out_of.setdefault((a, s), []).append(v)
                into.setdefault((b, s), []).append(v)
                self._enforce(model, g, v, a, b, s, T)
        if not out_of.get((0, 0)):
            return None
        model.add_exactly_one(out_of[(0, 0)])
        for s in range(S - 1):
            for c in range(1, n):
                ins, outs = into.get((c, s), []), out_of.get((c, s + 1), [])
                if ins or outs:
                    model.add(sum(ins) == sum(outs))
        model.add_exactly_one(into.get((n, S - 1), []) or [model.new_constant(0)])
        enter = [0] + [sum(self._trip(a, T) * v for (a, _, s2), v in y.items() if s2 == s) for s in range(1, S)]
        return {"model": model, "y": y, "g": g, "t": self._windows(model, enter), "T": T}

    # ---- the window rows ------------------------------------------------------------------------------
    def _trip(self, c: int, T: float) -> int:
        """The round trip over a cut at unit c in units of ``T / WINDOW_SCALE``, rounded down."""
        trip = float(self.problem.round_trip[c]) if T > 0 else 0.0
        return 0 if trip <= 0 else min(WINDOW_CAP, math.floor(trip / T * WINDOW_SCALE))

    def _windows(self, model, enter: list) -> list:
        """Busy-time variables ``t[s]`` (units of ``T / WINDOW_SCALE``, at most 2 T: both passes
        pass T) and the window rows ``sum_{s>=i} t[s] + sum_{s>i} enter[s] <= 2 (S - i)``
        (``enter[s]``: the round trip of stage s's first cut, rounded down)."""
        S = self.problem.num_stages
        t = [model.new_int_var(0, 2 * WINDOW_SCALE, f"t_{s}") for s in range(S)]
        D = rules.windows(S, split=True)  # D_i = 2 (S - i): split execution, one replica
        for i in range(S - 1):
            model.add(sum(t[i:]) + sum(enter[i + 1:]) <= D[i] * WINDOW_SCALE)
        return t

    def _enforce(self, model, g, v, a: int, b: int, s: int, T: float) -> None:
        """Interval ``a..b-1`` at stage s (literal ``v``) on the devices of worker s: the cover rows
        at T and the memory, in integers rounded in the relaxing direction (a row that every
        single device meets alone is left out)."""
        gs = [g[c, s] for c in range(len(self.mem_coef))]
        scale = COVER_SCALE * T
        for row in self._cover_rows(a, b):
            # an infinite rate (a pass with no work on a kind the device has) meets the row alone,
            # as does one device of a class whose coefficient reaches the right-hand side
            coef = [COVER_SCALE if e * scale >= COVER_SCALE else math.ceil(e * scale) for e in row]
            if min(coef) >= COVER_SCALE:
                continue
            nz = [d for d, c in enumerate(coef) if c]
            model.add(cp_model.LinearExpr.weighted_sum([gs[d] for d in nz], [coef[d] for d in nz])
                      >= COVER_SCALE).only_enforce_if(v)
        need = math.floor(float(self.problem.stage_memory(a, b, s)) * self.mem_scale)
        if self.memory_limited and need > min(self.mem_coef):
            model.add(cp_model.LinearExpr.weighted_sum(gs, self.mem_coef) >= need).only_enforce_if(v)

    def solve(self, model: dict, deadline: Deadline | None) -> Probe:
        """One solve through :func:`pipeopt.backends.cpsat.solve_cpsat`: a plan ``(starts, groups)``,
        infeasible (proven) or unknown."""
        # the element constraints of the stage-start model make CP-SAT's presolve probing slow (2 s
        # instead of 0.3 s on DenseNet-121 with S = 16) and gain nothing there
        params = {"cp_model_probing_level": 0} if "c" in model else None
        out = solve_cpsat(model["model"], deadline=deadline, threads=self.threads, seed=self.seed, parameters=params)
        if out.status == "infeasible":
            return Probe(INFEASIBLE)
        if not out.has_solution:
            return Probe(UNKNOWN)
        p = self.problem
        if "c" in model:
            return Probe(FEASIBLE, ([out.value(c) for c in model["c"][1:-1]], [tuple(grp) for grp in p.groups]))
        chosen = sorted((s, a) for (a, b, s), v in model["y"].items() if out.boolean_value(v))
        starts = [a for _, a in chosen[1:]]
        groups = p.groups_from_counts([[out.value(model["g"][c, s]) for s in range(p.num_stages)]
                                       for c in range(len(self.classes))])
        return Probe(FEASIBLE, (starts, groups))

    def _more(self, model: dict, s: int, group: tuple) -> list:
        """Literals ``n[c, s] >= k_c + 1``: worker s has more devices of class c than ``group``."""
        m, out = model["model"], []
        for c, k in enumerate(self.problem.class_counts(group)):
            if k < len(self.classes[c]):
                more = m.new_bool_var(f"more_{c}_{s}")
                m.add(model["g"][c, s] >= k + 1).only_enforce_if(more)
                out.append(more)
        return out

    def _holds(self, model: dict, s: int, a: int, b: int) -> list:
        """Stage-start model: literals "stage s starts at or before a" and "ends at or after b"."""
        m, c = model["model"], model["c"]
        early, late = m.new_bool_var(f"early_{s}"), m.new_bool_var(f"late_{s}")
        m.add(c[s] <= a).only_enforce_if(early)
        m.add(c[s] >= a + 1).only_enforce_if(early.Not())
        m.add(c[s + 1] >= b).only_enforce_if(late)
        m.add(c[s + 1] <= b - 1).only_enforce_if(late.Not())
        return [early, late]

    def forbid(self, model: dict, s: int, a: int, b: int, group: tuple) -> None:
        """Cut off interval ``a..b-1`` at stage s on a worker with at most ``group``'s devices of
        every class (it exceeds T there: fewer devices only make it slower)."""
        m = model["model"]
        if "c" in model:  # no stage s that starts at or before a and ends at or after b
            m.add_bool_or([v.Not() for v in self._holds(model, s, a, b)])
            return
        m.add_bool_or([model["y"][a, b, s].Not(), *self._more(model, s, group)])

    def window(self, model: dict, row: tuple, starts: list, groups: list, check) -> None:
        """A plan breaks window row ``row = (i, l)``: for each of its stages i..l a cut on ``t[s]``
        - the exact busy time when stage s holds its units (fixed workers; valid for any stage
        containing them, the busy time grows with the units), or :func:`~.split.busy_cut` at the
        plan's worker when stage s is exactly its interval (grouping: valid for every worker,
        tight at this one) - rounded in the relaxing direction, and a no-good: not all of stages
        i..l holding their units on at most their devices (their busy times only grow then, the
        row's round trips stay the same)."""
        p, m, t, T = self.problem, model["model"], model["t"], model["T"]
        bounds = [0, *starts, p.n]
        unit = T / WINDOW_SCALE
        i, l = row
        nogood = []
        for s in range(i, l + 1):
            a, b = bounds[s], bounds[s + 1]
            if "c" in model:
                lits = self._holds(model, s, a, b)
                need = math.floor((check.ops[s][1] + check.ops[s][2]) / unit)
                m.add(t[s] >= min(need, 2 * WINDOW_SCALE)).only_enforce_if(lits)
                nogood += [v.Not() for v in lits]
                continue
            F, B = p.load(a, b)
            coef, const = busy_cut(p.pooled(groups[s]), F, B, T)
            per = [min(const, sum(dv.resources.get(k, 0.0) * coef.get(k, 0.0) for k in p.kinds
                                  if dv.resources.get(k, 0.0) > 0)) for dv in self.rep]
            base = math.floor(const / unit)
            if base > 0:
                terms = [(model["g"][c, s], math.ceil(v / unit)) for c, v in enumerate(per) if v > 0]
                m.add(t[s] + sum(w * g for g, w in terms) >= base).only_enforce_if(model["y"][a, b, s])
            nogood += [model["y"][a, b, s].Not(), *self._more(model, s, groups[s])]
        m.add_bool_or(nogood)
