"""The schedule problem: the split of the layers into the p·v chunks of one of the schedules
torch.distributed.pipelining ships (:mod:`pipeopt.schedules`), posed by
:class:`ScheduleProblem` (``pipeopt.solve(inst, problem="schedule", schedule="1F1B",
stages=4, microbatches=8)``: ``stages`` is p, the ranks).

:data:`METHODS` (each ``fn(problem, *, time_limit=60.0, solver="cbc", seed=0, threads=2) ->
Result``, :class:`pipeopt.problems.method.Method`); every result is a :class:`pipeopt.Result`
whose evaluation is the chunk plan's :class:`pipeopt.schedules.Execution` (the schedule
executor, the single evaluation) and whose space is ``"schedule:<name>"``
(``"schedule:<name>+free-w"`` with ``w_placement="free"``):

* ``milp`` -- exact: the event-time MILP (:mod:`.milp`); with the problem option
  ``w_placement="free"`` the split and every W's place together (:mod:`.w_placement`);
* ``exhaustive`` -- exact on small chains: every split scored by the executor (refuses more
  than :data:`.exhaustive.MAX_SPLITS`; :mod:`.exhaustive`);
* ``uniform``, ``torchtitan``, ``best_1f1b`` -- the splits users get without a planner, run
  under the schedule (:mod:`.baselines`; no bound, their gap is to the exact bound).

Also: :mod:`.choose` (every schedule's optimum side by side under one deadline,
``--schedule auto``) and the zero-bubble greedy (:func:`.baselines.zb_greedy`, its own order).
"""

from __future__ import annotations

from ..method import Method
from .baselines import best_1f1b, torchtitan_split, uniform
from .exhaustive import exhaustive as exhaustive
from .milp import solve_milp as solve_milp
from .problem import ScheduleProblem as ScheduleProblem
from .problem import ScheduleResult as ScheduleResult
from .problem import schedule_space as schedule_space
from .problem import uniform_starts as uniform_starts

PROBLEM = ScheduleProblem

METHODS = (
    Method("schedule", "milp", solve_milp, True, "auto", True,
           "event-time MILP over the schedule's operations (PuLP; CBC or HiGHS); w_placement='free' places every W"),
    Method("schedule", "exhaustive", exhaustive, True, "auto", False,
           "every split scored by the schedule executor (small chains only)"),
    Method("schedule", "uniform", uniform, False, "auto", True,
           "equal layer counts per chunk (torch.distributed.pipelining's even split_spec)"),
    Method("schedule", "torchtitan", torchtitan_split, False, "auto", True,
           "torchtitan v0.2.2 generate_llm_fqn_per_model_part for p v parts"),
    Method("schedule", "best_1f1b", best_1f1b, False, "auto", True,
           "the partition DP's 1F1B split into p v stages, run under the schedule"),
)

__all__ = ["METHODS", "PROBLEM", "ScheduleProblem", "ScheduleResult", "best_1f1b", "exhaustive", "schedule_space",
           "solve_milp", "torchtitan_split", "uniform", "uniform_starts"]
