"""Activation recomputation in the schedule problem: the exact recompute set of every chunk of a
split run in a fixed order.

A chunk's recomputed layers keep fewer bytes per microbatch in flight and its backward (B; I in
the split-backward schedules, never W) reruns their forward
(:func:`pipeopt.cost.rules.recompute_terms`, the one rule; :func:`pipeopt.cost.passes.pass_times`
and the executor price it). Each chunk's choices are the partition problem's Pareto frontier over
its layers (:mod:`pipeopt.problems.partition.recompute`: points ``(K, X, seconds)``, the bytes
kept per microbatch, the backward's excess over them and the seconds added), with the chunk's
fixed bytes the schedule's ``parameter_copies`` copies of its parameters (:class:`ChunkRecompute`).

**Why this is exact.** The iteration time of a fixed action order is the longest path through
its operations (:func:`pipeopt.schedules.execute`), so it never decreases when one chunk's I or B
grows. With one chunk per rank (v = 1) the chunks' memories are independent (rank r's peak is
its chunk's ``k K + copies * params + max(X, 0)`` with ``k`` the most microbatches the order keeps
in flight on it, :meth:`pipeopt.schedules.Schedule.in_flight`), so per chunk the least added
seconds whose memory fits (:meth:`~pipeopt.problems.partition.recompute.RecomputeModel.choose`) is
optimal for every chunk at once. With v > 1 a rank's chunks share its memory (the schedule's
count vectors, :meth:`~pipeopt.schedules.Schedule.activation_profile`): every combination of its
chunks' frontier points is checked against the rank's memory
(:func:`pipeopt.schedules.execute.rank_memory`, the executor's rule), the combinations whose
vector of added seconds another fitting one does not beat are kept (a dominated vector is never
faster), and every product of the ranks' kept combinations is run by the executor
(at most :data:`MAX_COMBINATIONS`, else :class:`~pipeopt.errors.InvalidProblemError`). A frontier
point dominated in (K, peak, seconds) is never needed either: replacing it by the dominating point
lowers ``c K`` by at least what it may raise the rank's largest excess (``c >= 1`` microbatches in
flight while its excess counts).

:func:`.exhaustive.exhaustive` runs :func:`best_recompute` on every split; the MILP
(:func:`.model.recompute_rows`, v = 1) reads the same frontiers through
:meth:`ChunkRecompute.extra`; with v > 1 it takes a binary per layer instead
(:func:`.model.recompute_memory_rows`) and :func:`budget_recompute` (a heuristic: each chunk a share
of its rank's memory) gives its warm start's sets.

**Split backward (ZB schedules).** The cost model charges a recomputed layer's forward once, on
I. torch's split backward (``stage_backward_weight``) was measured rerunning a checkpointed
layer's forward once for I and again per parameter group in W; that second rerun is not in the
cost model, hence not here either.
"""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

from ...cost import rules
from ...errors import InvalidProblemError
from ...schedules import run_schedule
from ...schedules.execute import rank_memory
from ..partition.recompute import Frontier, RecomputeModel, backtrack, extend

__all__ = ["BUDGET_STEPS", "MAX_COMBINATIONS", "ChunkRecompute", "best_recompute", "budget_recompute"]

MAX_COMBINATIONS = 20_000
"""The most recompute combinations (kept per rank, then their product over the ranks)
:func:`best_recompute` agrees to check for one split with v > 1."""


BUDGET_STEPS = 20
""":func:`budget_recompute` tries the shares ``0, 1/BUDGET_STEPS, ..., 1`` of a rank's memory for the
first of its chunks (two chunks per rank; with more, the equal share only)."""


class ChunkRecompute(RecomputeModel):
    """:class:`~pipeopt.problems.partition.recompute.RecomputeModel` for the chunks of a
    :class:`~pipeopt.problems.schedule.problem.ScheduleProblem` (``recompute="auto"``): a chunk of
    units ``a..b-1`` holds ``parameter_copies`` copies of its parameters besides its activations.
    """

    def fixed(self, a: int, b: int, k: float) -> float:
        """Bytes of a chunk of units ``a..b-1`` no recompute choice changes: the schedule's
        ``parameter_copies`` copies of its parameters (:func:`pipeopt.cost.rules.stage_memory`) and
        its training state (:meth:`state`)."""
        p = self.problem
        return float(rules.stage_memory(0.0, p.param_prefix[b] - p.param_prefix[a], k, p.schedule.parameter_copies)) \
            + self.state(a, b)

    def state(self, a: int, b: int) -> float:
        """Bytes of training state beyond the weights a chunk of units ``a..b-1`` keeps under the
        settings' data parallelism and ZeRO stage (:meth:`pipeopt.cost.CostTable.sharded_state`, what
        the executor's :func:`pipeopt.schedules.execute.rank_memory` adds per chunk); 0 without."""
        p = self.problem
        if not p.instance.settings.data_parallel:
            return 0.0
        return float(p.table.sharded_state(a, b))

    def frontier(self, a: int, b: int) -> tuple[list, list]:
        """``(fronts, layers)``: the frontiers after each layer of the chunk of units ``a..b-1``
        walked from its last layer to its first (``fronts[-1]`` the chunk's), and those layers
        in that order (:meth:`choice` reads them back); cached per chunk."""
        cache = self.__dict__.setdefault("_fronts", {})
        if (a, b) not in cache:
            fronts = [Frontier.empty()]
            layers = [layer for u in range(a, b) for layer in self.units[u]][::-1]
            for layer in layers:
                front, thinned = extend(fronts[-1], layer, self.tol, pairwise=self.pairwise)
                self.exact &= not thinned
                fronts.append(front)
            self.largest = max(self.largest, len(fronts[-1]))
            cache[(a, b)] = (fronts, layers)
        return cache[(a, b)]

    def choice(self, a: int, b: int, i: int) -> dict:
        """``dict[layer, mode]``: the layers point ``i`` of the chunk's frontier recomputes."""
        fronts, layers = self.frontier(a, b)
        return backtrack(fronts, layers, i)


def budget_recompute(problem, starts, order=None) -> list | None:
    """Recompute sets per chunk of the split ``starts`` run in ``order`` (default: the schedule's)
    that fit every rank's memory, for v > 1 where :func:`best_recompute` would check too many
    combinations: a heuristic (the MILP's warm start and its fallback), never claimed optimal.

    Each chunk s of a rank gets a share ``beta_s`` of the rank's memory and takes its least-time
    frontier point whose own memory at its largest in-flight count (:meth:`ChunkRecompute.least`
    with the memory ``beta_s``) fits the share; the chunks' own memories, each at its largest count
    and with its own excess, add up to at least the rank's peak at every count vector, so a rank
    whose shares fit fits (checked again by :func:`pipeopt.schedules.execute.rank_memory`, the
    executor's rule). Shares tried: with two chunks ``f, 1 - f`` for ``f`` on a grid of
    :data:`BUDGET_STEPS` steps, with more the equal share; per rank the fitting shares of least summed
    rerun seconds are kept.

    Returns
    -------
    list or None
        Per chunk ``dict[layer, mode]`` or ``None``; ``None`` if some rank fits no tried shares.
    """
    model = problem.recomputation
    order = problem.schedule if order is None else order
    bounds = [0, *problem.check_starts(starts), problem.n]
    flight = order.in_flight()
    S, cap = problem.S, problem.capacity
    params = [float(problem.param_prefix[bounds[s + 1]] - problem.param_prefix[bounds[s]]) for s in range(S)]
    state = [model.state(bounds[s], bounds[s + 1]) for s in range(S)]
    picks: list = [None] * S
    for r in range(order.ranks):
        mine = order.stages_on(r)
        fronts = {s: model.frontier(bounds[s], bounds[s + 1])[0][-1] for s in mine}
        if len(mine) == 2:
            shares = [(i / BUDGET_STEPS, 1 - i / BUDGET_STEPS) for i in range(BUDGET_STEPS + 1)]
        else:
            shares = [tuple(1.0 / len(mine) for _ in mine)]
        best = None
        for share in shares:
            point = {}
            for s, f in zip(mine, share, strict=True):
                i = model.least(fronts[s], bounds[s], bounds[s + 1], max(flight[s], 1), memory=f * cap)
                if i is None:
                    break
                point[s] = i
            else:
                act, excess = [0.0] * S, [0.0] * S
                for s, i in point.items():
                    act[s] = float(fronts[s].held[i])
                    excess[s] = max(float(fronts[s].excess[i]), 0.0)
                times = SimpleNamespace(act_bytes=act, param_bytes=params, act_excess=excess, state_bytes=state,
                                        chunks=S)
                if not problem.fits(rank_memory(order, times)[r]):
                    continue
                cost = sum(float(fronts[s].time[i]) for s, i in point.items())
                if best is None or cost < best[0]:
                    best = (cost, point)
        if best is None:
            return None
        for s, i in best[1].items():
            picks[s] = model.choice(bounds[s], bounds[s + 1], i) or None
    return picks


def _rank_options(problem, model: ChunkRecompute, order, rank: int, bounds, limit: int = MAX_COMBINATIONS) -> list:
    """The combinations of frontier points of ``rank``'s chunks that fit its memory and whose
    added seconds no other fitting combination beats in every chunk: ``list[dict[chunk, point]]``."""
    mine = order.stages_on(rank)
    fronts = {s: model.frontier(bounds[s], bounds[s + 1])[0][-1] for s in mine}
    S = problem.S
    params, state = [0.0] * S, [0.0] * S
    for s in mine:
        params[s] = float(problem.param_prefix[bounds[s + 1]] - problem.param_prefix[bounds[s]])
        state[s] = model.state(bounds[s], bounds[s + 1])
    count = math.prod(len(fronts[s]) for s in mine)
    if count > limit:
        raise InvalidProblemError(f"recompute='auto' with {order.stages_per_rank} chunks per rank: rank {rank}'s chunks"
                                  f" have {count} combinations of recompute choices (at most {limit});"
                                  " use a smaller chain or v = 1")
    options = []
    for pick in itertools.product(*(range(len(fronts[s])) for s in mine)):
        act, excess = [0.0] * S, [0.0] * S
        for s, i in zip(mine, pick, strict=True):
            act[s] = float(fronts[s].held[i])
            excess[s] = max(float(fronts[s].excess[i]), 0.0)
        times = SimpleNamespace(act_bytes=act, param_bytes=params, act_excess=excess, state_bytes=state, chunks=S)
        if not problem.fits(rank_memory(order, times)[rank]):
            continue
        options.append((tuple(float(fronts[s].time[i]) for s, i in zip(mine, pick, strict=True)), pick))
    options.sort()
    kept: list = []
    for vec, pick in options:
        if any(all(x <= y for x, y in zip(other, vec, strict=True)) for other, _ in kept):
            continue
        kept.append((vec, pick))
    return [dict(zip(mine, pick, strict=True)) for _, pick in kept]


def best_recompute(problem, starts, order, limit: int = MAX_COMBINATIONS) -> tuple[float, list, object]:
    """The recompute sets of least iteration time for the split ``starts`` of ``problem``
    (:class:`~pipeopt.problems.schedule.problem.ScheduleProblem` with ``recompute="auto"``) run
    in ``order`` (the schedule, or it with its W's placed elsewhere), exactly (module docstring).

    Returns
    -------
    (seconds, recompute, execution)
        The executor's iteration time (``inf`` if no choice fits), per chunk ``dict[layer, mode]``
        or ``None`` (if none fits: per chunk the choice of least memory), and the
        :class:`~pipeopt.schedules.Execution` of that plan.

    Raises
    ------
    InvalidProblemError
        With v > 1, more than ``limit`` (default :data:`MAX_COMBINATIONS`) combinations to check.
    """
    model = problem.recomputation
    S = problem.S
    bounds = [0, *problem.check_starts(starts), problem.n]
    flight = order.in_flight()
    if order.stages_per_rank == 1 or all(len(order.stages_on(r)) == 1 for r in range(order.ranks)):
        picks = []
        for s in range(S):  # the least added seconds that fit (RecomputeModel.choose on the cached frontier)
            a, b = bounds[s], bounds[s + 1]
            i = model.least(model.frontier(a, b)[0][-1], a, b, flight[s])
            picks.append(None if i is None else model.choice(a, b, i) or None)
        ex = run_schedule(problem.instance, order, problem.plan(starts, picks))
        return (ex.time if ex.feasible else math.inf), picks, ex
    per_rank = [_rank_options(problem, model, order, r, bounds, limit) for r in range(order.ranks)]
    if not all(per_rank):  # some rank fits no choice: the split is infeasible
        picks = [None] * S
        ex = run_schedule(problem.instance, order, problem.plan(starts, picks))
        return math.inf, picks, ex
    total = math.prod(len(o) for o in per_rank)
    if total > limit:
        raise InvalidProblemError(f"recompute='auto' with {order.stages_per_rank} chunks per rank: {total} combinations"
                                  f" of the ranks' recompute choices (at most {limit}); use a smaller chain"
                                  " or v = 1")
    best = (math.inf, None, None)
    for combo in itertools.product(*per_rank):
        point = {s: i for part in combo for s, i in part.items()}
        picks = [model.choice(bounds[s], bounds[s + 1], point[s]) or None for s in range(S)]
        ex = run_schedule(problem.instance, order, problem.plan(starts, picks))
        value = ex.time if ex.feasible else math.inf
        if best[2] is None or value < best[0]:
            best = (value, picks, ex)
    return best
