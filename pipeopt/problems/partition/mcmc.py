"""FlexFlow-style Markov chain Monte Carlo search over pipeline plans (a baseline).

FlexFlow (Jia, Zaharia & Aiken, SysML 2019) searches parallelisation strategies with the
Metropolis-Hastings algorithm: propose a random change of the current strategy, score it
with an execution simulator, accept it if it is faster, and otherwise with probability
``exp(-beta * (cost(new) - cost(current)))``; keep the best strategy seen. Here a strategy is
a contiguous split of the partition problem's layer chain:

* the chain starts from the **uniform split** (DeepSpeed's ``partition_uniform``,
  :func:`pipeopt.problems.partition.simple.uniform_parts`; one worker per stage);
* a proposal **moves one cut by one unit** (left or right), or with probability ``jump``
  redraws it anywhere between its neighbouring cuts (FlexFlow's proposal: a random new
  configuration of one operator; both proposals are symmetric); with
  ``PartitionProblem(replication=True)`` it may instead **move a replica** from one stage to
  another, **merge** two neighbouring stages (their workers become replicas of one stage), or
  **split** a replicated stage in two (the proposal kinds are drawn uniformly among those
  possible);
* the cost is the plan's time per microbatch, multiplied by ``1 + sum_i max(0, memory_i /
  capacity_i - 1)`` so that plans breaking memory are penalised, not forbidden (the chain can
  cross them); a move that costs ``d`` more than the current plan (relative) is accepted with
  probability ``exp(-d / temperature)``.

Scoring. ``score="model"`` (default) scores with the cost model every exact method
optimises, :func:`pipeopt.evaluate`'s bottleneck: in the straight space through the problem's
stage time on its cost table (:func:`pipeopt.problems.partition.binary_search.plan_time` and
:meth:`pipeopt.cost.CostTable.stage_memory`, tens of microseconds per plan, equal to
``evaluate`` up to float rounding), in the replicated space by calling
:func:`pipeopt.evaluate` (milliseconds per plan). ``score="evaluate"`` always calls
:func:`pipeopt.evaluate`. ``score="simulate"`` scores with the discrete-event simulator
(:func:`pipeopt.simulate.simulate`, steady state of ``schedule``), as FlexFlow does; it is
slower still and optimises what the simulator measures, which can differ from the analytic
bottleneck (see :mod:`pipeopt.simulate`). Every plan is scored once (cached). Whatever the
score, the returned plan is scored by :func:`pipeopt.evaluate` through
:meth:`PartitionProblem.result`, like every method.

The search stops after ``iterations`` proposals or ``time_limit`` seconds, whichever comes
first; with the iteration limit binding, a fixed seed gives the same plan on every run.
"""

from __future__ import annotations

import math
import random

from ...backends.deadline import Deadline
from ...cost import evaluate, rules
from ...errors import InvalidProblemError
from ...result import Result, Status
from .binary_search import plan_time
from .problem import PartitionProblem
from .simple import uniform_parts

SCORES = ("model", "evaluate", "simulate")


def _excess(memory: float, capacity: float) -> float:
    """Relative excess of one stage's memory over its capacity, 0 if it fits
    (:func:`pipeopt.cost.rules.fits`)."""
    return 0.0 if rules.fits(memory, capacity) else memory / capacity - 1.0


def _penalty(ev) -> float:
    """Relative memory excess summed over stages (0 for a plan that fits)."""
    return sum(_excess(mem, cap) for mem, cap in zip(ev.memory, ev.memory_capacity, strict=True))


class _Scorer:
    """Cached cost of a state ``(starts, replicas)``; counts distinct plans scored."""

    def __init__(self, problem: PartitionProblem, score: str, schedule: str):
        self.problem, self.score, self.schedule = problem, score, schedule
        self.cache: dict = {}
        self.fast = score == "model" and not problem.replication

    def _model(self, starts: tuple) -> tuple[float, float]:
        p = self.problem
        t = plan_time(p, list(starts), memory=False)
        pen = 0.0
        if math.isfinite(p.memory):
            b = [0, *starts, p.n]
            pen = sum(_excess(p.table.stage_memory(b[s], b[s + 1], s), p.memory) for s in range(p.stages))
        return t, pen

    def __call__(self, state: tuple) -> tuple[float, float]:
        """(energy, penalty) of a state."""
        if state not in self.cache:
            starts, reps = state
            if self.fast:
                t, pen = self._model(starts)
            else:
                plan = self.problem.plan(list(starts), list(reps))
                ev = evaluate(self.problem.instance, plan)
                pen = _penalty(ev)
                if self.score == "simulate":
                    from ...simulate import simulate

                    t = simulate(self.problem.instance, plan, schedule=self.schedule).time_per_microbatch
                else:
                    t = ev.objective
            self.cache[state] = (t * (1.0 + pen) if math.isfinite(t) else math.inf, pen)
        return self.cache[state]


def _neighbour(rng: random.Random, n: int, starts: list, reps: list, replication: bool, jump: float):
    """A random neighbouring state, or None if the drawn move is impossible here."""
    starts, reps = list(starts), list(reps)
    k = len(reps)
    moves = ["cut"] if k > 1 else []
    if replication:
        if any(m > 1 for m in reps) and k > 1:
            moves.append("replica")
        if k > 1:
            moves.append("merge")
        if any(m > 1 for m in reps):
            moves.append("split")
    if not moves:
        return None
    move = rng.choice(moves)
    bounds = [0, *starts, n]
    if move == "cut":
        c = rng.randrange(k - 1)
        if rng.random() < jump:  # FlexFlow's random reconfiguration: anywhere between the neighbours
            new = rng.randrange(bounds[c] + 1, bounds[c + 2])
        else:
            new = starts[c] + rng.choice((-1, 1))
        if not bounds[c] < new < bounds[c + 2]:
            return None  # a stage would become empty: rejected, keeps the proposal symmetric
        starts[c] = new
    elif move == "replica":
        a, b = rng.sample(range(k), 2)
        if reps[a] < 2:
            return None
        reps[a] -= 1
        reps[b] += 1
    elif move == "merge":
        c = rng.randrange(k - 1)
        del starts[c]
        reps[c : c + 2] = [reps[c] + reps[c + 1]]
    else:  # split a replicated stage at a random unit
        a = rng.randrange(k)
        if reps[a] < 2 or bounds[a + 1] - bounds[a] < 2:
            return None
        cut = rng.randrange(bounds[a] + 1, bounds[a + 1])
        left = rng.randrange(1, reps[a])
        starts.insert(a, cut)
        reps[a : a + 1] = [left, reps[a] - left]
    return tuple(starts), tuple(reps)


def mcmc(
    problem: PartitionProblem,
    *,
    time_limit: float | Deadline = 60.0,
    solver: str = "cbc",
    seed: int = 0,
    iterations: int = 20000,
    temperature: float = 0.02,
    jump: float = 0.1,
    score: str = "model",
    schedule: str = "1f1b",
    threads: int = 2,
) -> Result:
    """Metropolis-Hastings search over contiguous splits, from the uniform split (FlexFlow).

    Parameters
    ----------
    problem
        The partition problem (S workers; ``problem.replication`` enables the replica moves).
    time_limit
        Seconds, or the solve's :class:`~pipeopt.backends.deadline.Deadline`; the search
        returns its best plan when it passes.
    solver
        Ignored (no MILP inside); accepted for the common method signature.
    seed
        Seed of the proposal and acceptance draws.
    iterations
        Proposals to make (>= 0).
    temperature
        Relative cost increase accepted with probability 1/e (> 0): 0.02 accepts a 2 % worse
        plan about one time in three.
    jump
        Probability (0..1) that a cut move redraws the cut uniformly between its neighbours
        instead of moving it by one unit.
    score
        ``"model"`` (the analytic cost model on prefix arrays; default), ``"evaluate"`` (the
        same through :func:`pipeopt.evaluate`) or ``"simulate"`` (the simulator's steady state
        under ``schedule``); see the module docstring.
    schedule
        Schedule for ``score="simulate"``: ``"1f1b"``, ``"async"``, ``"gpipe"``.
    threads
        Unused (the common method signature).

    Returns
    -------
    Result
        The best plan found (lowest cost among plans that fit in memory, or the least
        penalised plan if none fits), scored by :func:`pipeopt.evaluate`; status
        ``FEASIBLE`` (``INFEASIBLE`` if it breaks memory); no lower bound. ``info`` holds the
        iterations made, acceptance rate, distinct plans scored and the iteration of the best.

    Raises
    ------
    InvalidProblemError
        If ``iterations`` < 0, ``temperature`` <= 0 or ``score`` is unknown.

    References
    ----------
    Jia, Zaharia & Aiken, Beyond Data and Model Parallelism for Deep Neural Networks
    (FlexFlow), SysML 2019, section 5 (execution optimizer: MCMC with a simulator).
    """
    deadline = Deadline.of(time_limit)
    if not isinstance(iterations, int) or iterations < 0:
        raise InvalidProblemError(f"mcmc needs iterations >= 0, got {iterations!r}")
    if not temperature > 0:
        raise InvalidProblemError(f"mcmc needs a temperature > 0, got {temperature!r}")
    if not 0.0 <= jump <= 1.0:
        raise InvalidProblemError(f"mcmc needs a jump probability in [0, 1], got {jump!r}")
    if score not in SCORES:
        raise InvalidProblemError(f"unknown mcmc score {score!r}; choose from {SCORES}")
    rng = random.Random(seed)
    n, S = problem.n, problem.stages
    cost = _Scorer(problem, score, schedule)
    current = (tuple(uniform_parts(n, S)[1:-1]), (1,) * S)
    e_cur, pen_cur = cost(current)
    best, best_key, best_at = current, (pen_cur > 0, e_cur), 0
    accepted = done = 0
    for it in range(1, iterations + 1):
        if deadline.expired():
            break
        done = it
        cand = _neighbour(rng, n, current[0], current[1], problem.replication, jump)
        if cand is None:
            continue
        e_new, pen_new = cost(cand)
        if e_new <= e_cur or (
            math.isfinite(e_new) and rng.random() < math.exp(-(e_new - e_cur) / (temperature * e_cur))
        ):
            current, e_cur = cand, e_new
            accepted += 1
            key = (pen_new > 0, e_new)
            if key < best_key:
                best, best_key, best_at = cand, key, it
    plan = problem.plan(list(best[0]), list(best[1]))
    info = {
        "iterations": done,
        "accepted": accepted,
        "acceptance_rate": accepted / done if done else 0.0,
        "plans_scored": len(cost.cache),
        "best_at_iteration": best_at,
        "score": score,
        "temperature": temperature,
        "jump": jump,
        "seed": seed,
        "start": "uniform split (DeepSpeed partition_uniform)",
    }
    if score == "simulate":
        info["schedule"] = schedule
    return problem.result("mcmc", plan, Status.FEASIBLE, started=deadline.started, info=info)
