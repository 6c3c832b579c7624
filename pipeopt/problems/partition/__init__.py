"""The partition problem: its problem class, exact methods (DP, MILP, CP-SAT) and baselines.

Every baseline is ``fn(problem, *, time_limit=60.0, solver="cbc", seed=0, **kw) -> Result``
(see :mod:`pipeopt.registry`); its plan is scored by :func:`pipeopt.evaluate`, its status is
``FEASIBLE`` (``INFEASIBLE`` if the plan breaks memory) and it proves no lower bound.

* :func:`binary_search` -- Duan & Wu, ICPADS 2022 (straight space); its greedy check,
  bisection and completion to S stages are the generic core :mod:`.bisection`
  (:func:`greedy_starts`, :func:`bisect_limit`, :func:`complete_stages`), which the resource
  problems' :func:`pipeopt.problems.resource.duan_wu.bisection_partition` shares.
* :func:`pipedream` -- PipeDream's planner in its own cost model (Narayanan et al., SOSP 2019;
  replicated space), with :func:`pipedream_partition` giving PipeDream's own prediction.
* :func:`uniform`, :func:`param_balanced` -- DeepSpeed's ``uniform`` and ``parameters``
  partition methods (straight space).
* :func:`time_balanced` -- torchgpipe's ``balance_by_time`` (straight space).
"""

from .binary_search import binary_search, greedy_check, split_to_stages, straight_stage_time
from ...backends.bisection import bisect_limit, complete_stages, greedy_starts
from .pipedream import PipeDreamPlan, pipedream, pipedream_partition
from .simple import (
    block_partition,
    block_parts,
    param_balanced,
    spread_balanced_parts,
    time_balanced,
    uniform,
    uniform_parts,
)

__all__ = [
    "PipeDreamPlan",
    "binary_search",
    "bisect_limit",
    "block_partition",
    "block_parts",
    "complete_stages",
    "greedy_check",
    "greedy_starts",
    "param_balanced",
    "pipedream",
    "pipedream_partition",
    "split_to_stages",
    "spread_balanced_parts",
    "straight_stage_time",
    "time_balanced",
    "uniform",
    "uniform_parts",
]
