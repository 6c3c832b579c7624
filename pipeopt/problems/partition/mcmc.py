"""FlexFlow-style Markov chain Monte Carlo search over pipeline plans (a baseline).

FlexFlow (Jia, Zaharia & Aiken, *Beyond Data and Model Parallelism for Deep Neural
Networks*, SysML 2019, section 5) searches parallelisation strategies with the
Metropolis-Hastings algorithm: propose a random change of the current strategy, score it
with an execution simulator, accept it if it is faster, and otherwise with probability
``exp(-beta * (cost(new) - cost(current)))``; keep the best strategy seen. Here a strategy is
a contiguous split of the partition problem's layer chain:

* each chain starts from the **uniform split** (DeepSpeed's ``partition_uniform``,
  :func:`pipeopt.problems.partition.simple.uniform_parts`; one worker per stage);
* a proposal **moves one cut by one unit** (left or right), or with probability ``jump``
  redraws it anywhere between its neighbouring cuts (FlexFlow's proposal: a random new
  configuration of one operator; both proposals are symmetric); with
  ``PartitionProblem(replication=True)`` it may instead **move a replica** from one stage to
  another, **merge** two neighbouring stages (their workers become replicas of one stage), or
  **split** a replicated stage in two (the proposal kinds are drawn uniformly among those
  possible);
* the cost is the plan's objective, multiplied by ``1 + sum_i max(0, memory_i / capacity_i -
  1)`` so that plans breaking memory are penalised, not forbidden (the chain can cross them);
  a move that costs ``d`` more than the current plan (relative) is accepted with probability
  ``exp(-d / temperature)``.

Budget and seeds (a fair baseline). The search gets the **same wall-clock budget as the
exact methods**: the ``time_limit`` (or the solve's
:class:`~pipeopt.backends.deadline.Deadline`) it is given, not a fixed number of proposals.
It runs ``chains`` = 5 independent chains with seeds ``seed, seed + 1, ..., seed + 4``, one
after the other; the budget is split evenly between them (chain j gets an equal share of
what is left when it starts, so each gets a fifth and no chain's overrun eats another's
share), each with its own score cache. The returned plan is the **median chain's** best plan
(the chains ranked by their plan's objective, plans that break memory last, ties by seed);
``info`` holds every chain's objective, the median, min and max (their range) and the
proposals each chain made. A single chain's result depends on luck (one seed of 20,000
proposals found a plan 62.5 % from optimal that other seeds did not); the median and range
of five say how much. ``iterations`` optionally caps the proposals *per chain*: with a cap
that binds before the deadline a fixed seed gives the same plan on every run (the tests use
it); without a cap the chains run until their share of the deadline (which must then be
finite).

Scoring. ``score="model"`` (default) scores with the cost model every exact method
optimises, :func:`pipeopt.evaluate`'s objective: for the ``bottleneck`` objective in the
one-order space through the problem's exact steady period on its cost table
(:meth:`PartitionProblem.period`, window rows included, and
:meth:`pipeopt.cost.CostTable.stage_memory` for the penalty; equal to ``evaluate`` up to float
rounding, several times faster), otherwise by calling :func:`pipeopt.evaluate`.
``score="evaluate"`` always calls :func:`pipeopt.evaluate`. ``score="simulate"`` scores with
the discrete-event simulator (:func:`pipeopt.simulate.simulate`, steady state of
``schedule``), as FlexFlow does; it is slower, and under ``"1f1b"`` its steady state is the
``bottleneck`` objective (the cost model is the schedule). Every plan is scored once per chain (cached). Whatever the score,
every chain's plan is scored by :func:`pipeopt.evaluate` (``.objective``), and the returned
plan through :meth:`PartitionProblem.result`, like every method.
"""

from __future__ import annotations

import math
import random

from ...backends.deadline import Deadline
from ...cost import evaluate, rules
from ...cost.tolerance import FLOAT_NOISE
from ...errors import InvalidProblemError
from ...result import Result, Status
from .problem import PartitionProblem
from .simple import uniform_parts

SCORES = ("model", "evaluate", "simulate")

CHAINS = 5
"""Independent chains (seeds ``seed .. seed + 4``) sharing the budget."""

TIE = FLOAT_NOISE
"""Costs within this relative difference are tied (the cost table and :func:`pipeopt.evaluate`
agree to float rounding, so every score follows the same chain)."""


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
        self.fast = (score == "model" and not problem.replication
                     and problem.instance.settings.objective == "bottleneck")

    def _model(self, starts: tuple) -> tuple[float, float]:
        """The exact steady period (:meth:`PartitionProblem.period`) and the memory penalty."""
        p = self.problem
        t = p.period(list(starts))
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


def _chain(problem: PartitionProblem, cost: _Scorer, seed: int, deadline: Deadline, iterations: int | None,
           temperature: float, jump: float) -> dict:
    """One Metropolis-Hastings chain from the uniform split until ``deadline`` or ``iterations``
    proposals; its best state (least penalised, then cheapest) and counters."""
    rng = random.Random(seed)
    n, S = problem.n, problem.stages
    current = (tuple(uniform_parts(n, S)[1:-1]), (1,) * S)
    e_cur, pen_cur = cost(current)
    best, best_key, best_at = current, (pen_cur > 0, e_cur), 0
    accepted = done = 0
    while iterations is None or done < iterations:
        if deadline.expired():
            break
        done += 1
        cand = _neighbour(rng, n, current[0], current[1], problem.replication, jump)
        if cand is None:
            continue
        e_new, pen_new = cost(cand)
        if e_new <= e_cur * (1 + TIE) or (
            math.isfinite(e_new) and rng.random() < math.exp(-(e_new - e_cur) / (temperature * e_cur))
        ):
            current, e_cur = cand, e_new
            accepted += 1
            if (pen_new > 0, e_new * (1 + TIE)) < best_key:
                best, best_key, best_at = cand, (pen_new > 0, e_new), done
    return {"state": best, "proposals": done, "accepted": accepted, "plans_scored": len(cost.cache),
            "best_at_iteration": best_at}


def mcmc(
    problem: PartitionProblem,
    *,
    time_limit: float | Deadline = 60.0,
    solver: str = "cbc",
    seed: int = 0,
    iterations: int | None = None,
    chains: int = CHAINS,
    temperature: float = 0.02,
    jump: float = 0.1,
    score: str = "model",
    schedule: str = "1f1b",
    threads: int = 2,
) -> Result:
    """Metropolis-Hastings search over contiguous splits, from the uniform split (FlexFlow):
    5 chains (seeds ``seed .. seed + 4``) share the wall-clock budget; the median chain's plan.

    Parameters
    ----------
    problem
        The partition problem (S workers; ``problem.replication`` enables the replica moves).
    time_limit
        Seconds, or the solve's :class:`~pipeopt.backends.deadline.Deadline`: the whole
        budget, the same the exact methods get, split evenly between the chains (each chain
        returns its best plan when its share passes).
    solver
        Ignored (no MILP inside); accepted for the common method signature.
    seed
        Seed of the first chain; chain j draws its proposals and acceptances from seed
        ``seed + j``.
    iterations
        Optional cap on the proposals of each chain (>= 0); ``None`` (default): the chains
        run until their share of the time limit, which must then be finite.
    chains
        Number of independent chains (>= 1; default 5).
    temperature
        Relative cost increase accepted with probability 1/e (> 0): 0.02 accepts a 2 % worse
        plan about one time in three.
    jump
        Probability (0..1) that a cut move redraws the cut uniformly between its neighbours
        instead of moving it by one unit.
    score
        ``"model"`` (the cost model on the cost table where it is exact and faster; default),
        ``"evaluate"`` (:func:`pipeopt.evaluate`'s objective) or ``"simulate"`` (the
        simulator's steady state under ``schedule``); see the module docstring.
    schedule
        Schedule for ``score="simulate"``: ``"1f1b"``, ``"async"``, ``"gpipe"``.
    threads
        Unused (the common method signature).

    Returns
    -------
    Result
        The median chain's best plan (each chain's best: lowest cost among plans that fit in
        memory, or the least penalised plan if none fits), scored by :func:`pipeopt.evaluate`;
        status ``FEASIBLE`` (``INFEASIBLE`` if it breaks memory); no lower bound. ``info``:
        ``seeds``, ``objectives`` (each chain's plan, by ``evaluate``), ``feasible``,
        ``median``, ``min``, ``max``, ``range`` (max - min, seconds), ``median_seed``,
        ``proposals``, ``accepted``, ``plans_scored``, ``best_at_iteration`` (per chain), and
        ``budget_per_chain`` (seconds, ``None`` without a limit).

    Raises
    ------
    InvalidProblemError
        If ``iterations`` < 0, ``chains`` < 1, ``temperature`` <= 0, ``jump`` outside [0, 1],
        ``score`` is unknown, or neither a finite time limit nor ``iterations`` bounds the search.

    References
    ----------
    Jia, Zaharia & Aiken, Beyond Data and Model Parallelism for Deep Neural Networks
    (FlexFlow), SysML 2019, section 5 (execution optimizer: MCMC with a simulator).
    """
    deadline = Deadline.of(time_limit)
    if iterations is not None and (isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 0):
        raise InvalidProblemError(f"mcmc needs iterations >= 0 (or None), got {iterations!r}")
    if isinstance(chains, bool) or not isinstance(chains, int) or chains < 1:
        raise InvalidProblemError(f"mcmc needs chains >= 1, got {chains!r}")
    if not temperature > 0:
        raise InvalidProblemError(f"mcmc needs a temperature > 0, got {temperature!r}")
    if not 0.0 <= jump <= 1.0:
        raise InvalidProblemError(f"mcmc needs a jump probability in [0, 1], got {jump!r}")
    if score not in SCORES:
        raise InvalidProblemError(f"unknown mcmc score {score!r}; choose from {SCORES}")
    if iterations is None and not deadline.bounded:
        raise InvalidProblemError("mcmc needs a finite time limit or a proposal cap (iterations=...)")
    runs = []
    for j in range(chains):
        share = deadline.sub(fraction=1.0 / (chains - j)) if deadline.bounded else deadline
        budget = share.remaining() if share.bounded else None
        run = _chain(problem, _Scorer(problem, score, schedule), seed + j, share, iterations, temperature, jump)
        starts, reps = run["state"]
        run["plan"] = problem.plan(list(starts), list(reps))
        ev = evaluate(problem.instance, run["plan"])
        run.update(seed=seed + j, objective=ev.objective, feasible=ev.feasible, budget=budget)
        runs.append(run)
    ranked = sorted(runs, key=lambda r: (not r["feasible"], r["objective"], r["seed"]))
    median = ranked[(len(ranked) - 1) // 2]
    objectives = [r["objective"] for r in runs]
    info = {
        "seeds": [r["seed"] for r in runs],
        "objectives": objectives,
        "feasible": [r["feasible"] for r in runs],
        "median": median["objective"],
        "min": min(objectives),
        "max": max(objectives),
        "range": max(objectives) - min(objectives),
        "median_seed": median["seed"],
        "proposals": [r["proposals"] for r in runs],
        "accepted": [r["accepted"] for r in runs],
        "plans_scored": [r["plans_scored"] for r in runs],
        "best_at_iteration": [r["best_at_iteration"] for r in runs],
        "budget_per_chain": [r["budget"] for r in runs],
        "iterations_cap": iterations,
        "score": score,
        "temperature": temperature,
        "jump": jump,
        "start": "uniform split (DeepSpeed partition_uniform)",
    }
    if score == "simulate":
        info["schedule"] = schedule
    return problem.result("mcmc", median["plan"], Status.FEASIBLE, started=deadline.started, info=info)
