"""The secondary objective of the joint and group problems: among plans of optimal period, the
least latency of one microbatch.

Many plans of the joint and group problems share the optimal steady period T* (the slowest
stage or window decides it; the other cuts, the other workers and every stage's shares are
free within it). Every exact method of the two problems (joint: DP, MILP, CP-SAT; group: MILP,
CP-SAT) breaks these ties the same way, once its primary optimum is proven
(:func:`pipeopt.problems.resource.search.exact_search` calls :func:`break_ties`):

1. **the latency of one microbatch**, minimised over the plans whose period is at most T*:
   ``L = sum_s (f_s + b_s) + sum_c (x_c + y_c)`` - one microbatch's forward and backward ops on
   every stage and its activations and gradients over every cut, the fill and drain of the
   pipeline, i.e. the 1F1B-flush iteration time of M = 1
   (``evaluate(instance.with_settings(microbatches=1), plan).iteration_time``, which is what
   the record reports). A stage's shares are a choice: each stage gets the shares of least
   ``f + b`` with both passes within T* (:func:`~pipeopt.problems.resource.split.least_busy`);
   these are the best shares for every window row at once, so a plan ties with the optimum
   iff it passes :meth:`ResourceProblem.check` at T* with them, and the plan returned carries
   them (its period is at most T*);
2. then **peak memory**: not optimised (one of the plans of least latency is returned), and
   said so in ``info["secondary"]``.

**Why not the finite-M iteration time** (the partition and Bi-Partition problems' secondary
objective, :mod:`pipeopt.problems.partition.tiebreak`): under split execution a stage's op
times are ``1 / sum_k beta_k R_k / F_k`` - not linear in the shares, and the grouping makes R a
variable too - so an event-time model of M microbatches over the partition, the grouping and
the shares is a non-convex MINLP, far beyond what a tie-break should cost. The latency
is the fill-and-drain part of that iteration time and the left side of the widest window row
(stages 0..S-1); with the shares fixed at T* it is
additive over the stages, so it is optimised exactly by one DP (:class:`LatencyDP`) for both
problems, run from the last stage back at T*:

* under split execution (``D_i = 2 (S - i)``, ``U = 0``, :func:`pipeopt.cost.rules.window_tokens`)
  the window rows ending before the last stage are implied by those ending at it, so a plan's
  period is at most T iff every stage and cut passes T on its own and every suffix
  ``K_i = sum_{s>=i} w_s + sum_{c>=i} C_c`` (``w_s = f_s + b_s`` at T, C the round trips of
  the cuts after stage i) is at most ``D_i T``; the latency is ``K_0``;
* so the least ``K_s`` per state is kept, a state being (stage s, its first unit a, the devices
  that stages s..S-1 hold): a smaller suffix is better for every earlier row and for the
  latency. Workers are fixed for the joint problem (one device set per state); for grouping
  the devices are counted per class of identical devices (:attr:`GroupProblem.device_classes`,
  as the models count them), so a state holds a count vector and stage s may take any
  non-empty sub-vector of what is left. O(S n^2) for the joint problem; for grouping O(S n^2)
  times the pairs (count vector, sub-vector), ``prod_c (m_c + 1)(m_c + 2) / 2`` for classes of
  m_c devices (36 to 1,296 on the shipped 4- and 8-device mixes, 50,625 on the 16-device one).
  The DP's size is counted before it runs (:meth:`LatencyDP.work`); above
  :data:`~pipeopt.problems.secondary.SECONDARY_WORK` it does not run, and the proven plan is
  kept with ``proven`` False - a rule on the instance's size, not on the clock, so the same call
  returns the same plan on every run.

The budget, the record and the guard are the shared ones (:mod:`pipeopt.problems.secondary`).
Every method gets the same answer whatever its primary search, so DP, MILP and CP-SAT return
plans of equal latency whenever they prove the same primary optimum.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ...backends.deadline import Deadline
from ...cost import evaluate, rules
from ...cost.tolerance import FLOAT_NOISE
from ...plan import Plan
from .. import secondary
from ..secondary import CAP_REL
from .problem import GroupProblem, ResourceProblem

SECONDARY = ("latency of one microbatch (f + b of every stage, with its shares of least f + b within the "
             "optimal period, plus the cuts' round trips: the 1F1B-flush iteration time of M = 1), then "
             "peak memory (not optimised)")


FLOAT_SLACK = FLOAT_NOISE
"""Relative slack of the DP's row test ``K_s <= D_s T`` and of the claim a returned plan must
meet: the DP sums a window row from the last stage back, :meth:`ResourceProblem.check` from
the first stage on, and the two roundings of a row that binds at T differ by a few ulps."""


def latency(problem: ResourceProblem, plan: Plan) -> float:
    """The secondary value of a plan (seconds): the 1F1B-flush iteration time of one microbatch,
    ``evaluate(instance.with_settings(microbatches=1), plan).iteration_time``."""
    return float(evaluate(problem.instance.with_settings(microbatches=1), plan).iteration_time)


class LatencyDP:
    """The least latency over the plans of period at most T (module docstring), exactly.

    Parameters
    ----------
    problem
        A joint or group problem (split execution, the exact methods' space).
    T
        The period cap, seconds.

    Attributes
    ----------
    sizes
        Devices per class: the classes of identical devices (group), or one class per fixed
        worker's device set with one member (joint).
    options
        Per stage, the count vectors (tuples over the classes) its worker may hold.
    """

    def __init__(self, problem: ResourceProblem, T: float):
        self.problem, self.T = problem, float(T)
        S = problem.num_stages
        if isinstance(problem, GroupProblem):
            self.sizes = tuple(len(c) for c in problem.device_classes)
            vectors = [v for v in itertools.product(*(range(m + 1) for m in self.sizes)) if any(v)]
            self.options = [vectors] * S
        else:  # fixed workers: "class" s is worker s
            self.sizes = (1,) * S
            self.options = [[tuple(int(c == s) for c in range(S))] for s in range(S)]
        self.D, _ = rules.window_tokens(rules.windows(S), np.ones(S), [True] * S)
        n = problem.n
        pairs = math.prod((m + 1) * (m + 2) // 2 for m in self.sizes) if isinstance(problem, GroupProblem) else 1
        self.work = S * pairs * (n + 1) ** 2
        """Table entries the DP may touch, at most: S x (devices held after, worker) pairs x
        (n + 1)^2 (the pairs: ``prod_c (m_c + 1)(m_c + 2) / 2`` over the classes when grouping)."""
        self._busy: dict = {}
        self._stage: dict = {}

    def worker(self, s: int, counts: tuple) -> tuple:
        """Device names of a worker holding ``counts`` (the first devices of each class), or the
        fixed worker of stage s."""
        p = self.problem
        if not isinstance(p, GroupProblem):
            return tuple(p.groups[s])
        names = p.device_names
        return tuple(sorted((names[d] for c, k in zip(p.device_classes, counts, strict=True) for d in c[:k]),
                            key=p.device_names.index))

    def stage_times(self, s: int, counts: tuple) -> np.ndarray | None:
        """``ndarray (n+1, n+1)``: entry ``[a, b]`` is the least busy time at T of units ``a..b-1``
        as stage s on the worker ``counts``, ``inf`` where ``b <= a``, the stage breaks memory, a
        pass cannot stay within T, its cuts take longer than T, or it leaves another stage empty;
        ``None`` if that is every range."""
        key = (s, counts)
        if key not in self._stage:
            p, n, S, T = self.problem, self.problem.n, self.problem.num_stages, self.T
            ii, jj, _, _ = p.ranges
            group = self.worker(s, counts)
            res = tuple(sorted(p.pooled(group).items()))
            if res not in self._busy:
                self._busy[res] = p.range_busy(dict(res), T)
            cut_ok = p.cut_time <= T
            ok = (rules.fits(p.range_memory(s), p.capacity(group)) & (ii >= s) & (jj <= n - (S - 1 - s))
                  & (cut_ok[ii] if s else ii == 0) & (cut_ok[jj] if s < S - 1 else jj == n))
            times = np.where(ok, self._busy[res], np.inf)
            dense = None
            if np.isfinite(times).any():
                dense = np.full((n + 1, n + 1), np.inf)
                dense[ii, jj] = times
            self._stage[key] = dense
        return self._stage[key]

    def solve(self, deadline: Deadline | None = None) -> tuple[list[int], list[tuple], float] | None:
        """A plan of least latency among those of period at most T.

        Returns
        -------
        (starts, groups, latency) or None
            Stage starts after the first, each stage's devices, the latency (seconds) by the
            DP's sums; ``None`` if no plan has period at most T.

        Raises
        ------
        DeadlineReached
            If ``deadline`` passes (checked per state).
        """
        p, n, S, T = self.problem, self.problem.n, self.problem.num_stages, self.T
        total = self.sizes
        follow = {(0,) * len(total): np.where(np.arange(n + 1) == n, 0.0, np.inf)}
        choice: list[dict] = [{} for _ in range(S)]
        rows = np.arange(n + 1)
        for s in range(S - 1, -1, -1):
            best: dict = {}  # devices held by stages s..S-1 -> (least K per first unit, its end, its worker)
            for after, tail in follow.items():
                for index, w in enumerate(self.options[s]):
                    used = tuple(a + b for a, b in zip(after, w, strict=True))
                    left = sum(total) - sum(used)  # devices for stages 0..s-1, one at least each
                    if any(u > m for u, m in zip(used, total, strict=True)) or left < s or (s == 0 and left):
                        continue
                    if deadline is not None:
                        deadline.check(f"the latency DP (stage {s})")
                    times = self.stage_times(s, w)
                    if times is None:  # no range passes T on this worker
                        continue
                    if s == 0:  # only the chain's start is a state of stage 0
                        K, end = np.full(n + 1, np.inf), np.zeros(n + 1, dtype=int)
                        end[0] = np.argmin(times[0] + tail)
                        K[0] = times[0, end[0]] + tail[end[0]]
                    else:
                        table = times + tail[None, :]
                        end = np.argmin(table, axis=1)
                        K = table[rows, end]
                    K = np.where(K <= self.D[s] * T * (1 + FLOAT_SLACK), K, np.inf)  # the rows from stage s on
                    if not np.isfinite(K).any():
                        continue
                    if used not in best:
                        best[used] = (K, end, np.full(n + 1, index))
                        continue
                    old_K, old_end, old_w = best[used]
                    better = K < old_K
                    best[used] = (np.where(better, K, old_K), np.where(better, end, old_end),
                                  np.where(better, index, old_w))
            choice[s] = {used: (end, widx) for used, (_, end, widx) in best.items()}
            follow = {used: K + p.round_trip for used, (K, _, _) in best.items()}
        if total not in best or not np.isfinite(best[total][0][0]):
            return None
        value = float(best[total][0][0])
        starts, counts, used, a = [], [], total, 0
        for s in range(S):
            end, widx = choice[s][used]
            w = self.options[s][int(widx[a])]
            counts.append(w)
            a = int(end[a])
            if s < S - 1:
                starts.append(a)
            used = tuple(x - y for x, y in zip(used, w, strict=True))
        if isinstance(p, GroupProblem):
            workers = p.groups_from_counts([[counts[s][c] for s in range(S)] for c in range(len(total))])
        else:
            workers = [tuple(g) for g in p.groups]
        return starts, workers, value


def _limit(problem: ResourceProblem, starts: list[int], groups: list, cap: float) -> float | None:
    """The least T >= ``cap`` (to adjacent floats) at which the proven plan passes
    :meth:`ResourceProblem.check`: ``cap`` itself unless float rounding puts the plan's rows a few
    ulps above its period (then bisected up to ``cap (1 + CAP_REL)``); ``None`` if even that fails."""
    if problem.check(starts, groups, cap).ok:
        return cap
    lo, hi = cap, cap * (1 + CAP_REL)
    if not problem.check(starts, groups, hi).ok:
        return None
    while lo < (mid := 0.5 * (lo + hi)) < hi:
        lo, hi = (lo, mid) if problem.check(starts, groups, mid).ok else (mid, hi)
    return hi


def break_ties(problem: ResourceProblem, starts: list[int], groups: list, deadline: Deadline, info: dict, *,
               within: float) -> Plan:
    """The plan of least latency among those of period at most the period of the proven plan
    ``(starts, groups)`` (module docstring).

    Parameters
    ----------
    problem
        A joint or group problem.
    starts, groups
        The proven optimal plan: stage starts after the first, and each stage's devices.
    deadline
        The method's clock; the phase runs on what is left of it (:func:`pipeopt.problems.secondary.budget`),
        if the DP's size is within :data:`~pipeopt.problems.secondary.SECONDARY_WORK`.
    info
        The result's info dict: ``info["secondary"]`` (:func:`pipeopt.problems.secondary.open_record`):
        the objective, the returned plan's latency (``value``), the cap T*, whether it was
        proven, the least latency over the admitted plans by the DP's sums (``bound``, when the
        DP ended), ``limit`` (the T at which the shares are taken), the plan's true iteration time of M microbatches and peak memory.
    within
        Seconds: a plan is returned only if it fits memory and its evaluated period is at most
        this (the method's optimality claim), up to ``2 FLOAT_SLACK`` relative.

    Returns
    -------
    Plan
        The plan to report: the tie-break's, or the proven plan with its shares of least
        period (:meth:`ResourceProblem.plan`) if nothing tied is better or time ran out.
    """
    inst = problem.instance
    primary = problem.plan(starts, groups, "split")
    cap = problem.plan_value(starts, groups)
    record = secondary.open_record(info, SECONDARY, latency(problem, primary), cap=cap,
                                   evaluation=evaluate(inst, primary))
    T = _limit(problem, starts, groups, cap)
    if T is None:  # pragma: no cover - the plan passes its own period up to float rounding
        record["note"] = "the proven plan does not pass its own period (float rounding): no second phase"
        return primary
    record["limit"] = T

    def phase(clock: Deadline, rec: dict) -> Plan:
        dp = LatencyDP(problem, T)
        if dp.work > secondary.SECONDARY_WORK:
            rec["note"] = (f"the latency DP would touch {dp.work:.3g} table entries, above the second phase's "
                           f"work limit ({secondary.SECONDARY_WORK:.3g}): the proven plan is kept")
            return primary
        found = dp.solve(clock)
        if found is None:  # pragma: no cover - the proven plan itself passes T
            rec["note"] = "the DP found no plan within the cap (float rounding): the proven plan is kept"
            return primary
        limit = _limit(problem, found[0], found[1], T)  # T, or a few ulps above (float rounding)
        if limit is None:  # pragma: no cover - the DP's rows pass T up to FLOAT_SLACK
            rec["note"] = "the DP's plan does not pass the cap (float rounding): the proven plan is kept"
            return primary
        plan = problem.plan(found[0], found[1], "split", limit=limit)
        ev = evaluate(inst, plan)
        if not (ev.feasible and ev.objective <= within * (1 + 2 * FLOAT_SLACK)):
            rec["note"] = (f"the DP's plan evaluates to {ev.objective!r} s, above the claim's tolerance "
                           f"({within!r} s): the proven plan is kept")
            return primary
        rec["bound"] = found[2]
        value = latency(problem, plan)
        rec["proven"] = True
        if value < rec["value"] * (1 - FLOAT_NOISE):  # not float noise
            secondary.settle(rec, value, ev)
            return plan
        return primary

    return secondary.run(phase, primary, deadline, record)
