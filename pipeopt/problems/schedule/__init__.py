"""The schedule problem: the split of the layers into the p·v chunks of one of the schedules
torch.distributed.pipelining ships (:mod:`pipeopt.schedules`), posed by
:class:`ScheduleProblem` (``pipeopt.solve(inst, problem="schedule", schedule="1F1B",
stages=4, microbatches=8)``: ``stages`` is p, the ranks).

:data:`METHODS` (each ``fn(problem, *, time_limit=60.0, solver=SOLVER, seed=0, threads=2) ->
Result``, :class:`pipeopt.problems.method.Method`); every result is a :class:`pipeopt.Result`
whose evaluation is the chunk plan's :class:`pipeopt.schedules.Execution` (the schedule
executor, the single evaluation) and whose space is ``"schedule:<name>"``
(``"schedule:<name>+free-w"`` with ``w_placement="free"``):

* ``auto`` -- the default: ``cpsat`` for the free order, ``milp`` for a fixed one (:mod:`.auto`);
* ``cpsat`` -- exact, the free order (``schedule="free"``): the split and every rank's order of
  F, I, W together (:mod:`.free_order`);
* ``milp`` -- exact: the event-time MILP (:mod:`.milp`); with the problem option
  ``w_placement="free"`` the split and every W's place together (:mod:`.w_placement`);
* ``exhaustive`` -- exact on small chains: every split scored by the executor (refuses more
  than :data:`.exhaustive.MAX_SPLITS`; :mod:`.exhaustive`); with the problem's ``recompute``
  option, each split's exact recompute sets (:mod:`.recompute`); with data parallelism and ZeRO
  (``Settings.dp``, ``zero``: the executor's memory, collectives and synchronisation; the recompute
  frontiers count each chunk's sharded state), as ``milp`` does with the schedule's W places
  (:func:`.model.zero_terms`); ``milp`` models the recompute option too
  with the schedule's W places: :func:`.model.recompute_rows` with one chunk per rank, a binary per
  layer with several, :func:`.model.recompute_memory_rows`);
* ``uniform``, ``torchtitan``, ``best_1f1b`` -- the splits users get without a planner, run
  under the schedule (:mod:`.baselines`; no bound, their gap is to the exact bound);
* ``zb_greedy`` -- the zero-bubble repository's greedy order on the uniform split (one chunk
  per rank; :func:`.baselines.zb_greedy`, the best of its 8 flag variants as its code
  chooses), its own order: space ``schedule:ZB-greedy``.

Also: :mod:`.choose` (every schedule's optimum side by side under one deadline,
``--schedule auto``).
"""

from __future__ import annotations

from ..method import LATENCY, RECOMPUTE, ZERO, Method
from .baselines import best_1f1b, torchtitan_split, uniform
from .baselines import zb_greedy as zb_greedy_baseline  # zb_greedy: the module
from .auto import solve_auto as solve_auto
from .exhaustive import exhaustive as exhaustive
from .free_order import solve_free_order as solve_free_order
from .milp import solve_milp as solve_milp
from .problem import SOLVER as SOLVER
from .problem import ScheduleProblem as ScheduleProblem
from .problem import ScheduleResult as ScheduleResult
from .problem import schedule_space as schedule_space
from .problem import uniform_starts as uniform_starts

PROBLEM = ScheduleProblem

METHODS = (
    Method("schedule", "auto", solve_auto, True, "auto", True,
           "the default exact method: cpsat for the free order, milp for a fixed order, exhaustive with recompute"
           " and free W places",
           terms=LATENCY | RECOMPUTE),
    Method("schedule", "cpsat", solve_free_order, True, "auto", False,
           "free order: CP-SAT over the split and every rank's order of F, I, W (schedule='free' only)", terms=LATENCY),
    Method("schedule", "milp", solve_milp, True, "auto", True,
           "event-time MILP over the schedule's operations (PuLP; CBC or HiGHS); w_placement='free' places every W;"
           " recompute and data parallelism / ZeRO with the schedule's W places", terms=LATENCY | RECOMPUTE | ZERO),
    Method("schedule", "exhaustive", exhaustive, True, "auto", False,
           "every split scored by the schedule executor (small chains only); recompute: each split's exact"
           " recompute sets (.recompute); data parallelism and ZeRO (the executor's)",
           terms=LATENCY | RECOMPUTE | ZERO),
    Method("schedule", "uniform", uniform, False, "auto", True,
           "equal layer counts per chunk (torch.distributed.pipelining's even split_spec)"),
    Method("schedule", "torchtitan", torchtitan_split, False, "auto", True,
           "torchtitan v0.2.2 generate_llm_fqn_per_model_part for p v parts"),
    Method("schedule", "best_1f1b", best_1f1b, False, "auto", True,
           "the partition DP's 1F1B split into p v stages, run under the schedule"),
    Method("schedule", "zb_greedy", zb_greedy_baseline, False, "auto", True,
           "sail-sg/zero-bubble-pipeline-parallelism zb.py: its greedy order (best of its 8 flag variants) on the"
           " uniform split, v = 1"),
)

__all__ = ["METHODS", "PROBLEM", "SOLVER", "ScheduleProblem", "ScheduleResult", "best_1f1b", "exhaustive",
           "schedule_space", "solve_auto", "solve_free_order", "solve_milp", "torchtitan_split", "uniform", "uniform_starts"]
