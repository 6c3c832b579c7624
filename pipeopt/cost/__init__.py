"""The one cost model (docs/cost-model.md).

* :mod:`.rules` -- every rule, written once: a stage's compute time, a transfer, the
  all-reduce of a replicated stage, the microbatches in flight, the weight versions, a stage's
  memory and whether it fits.
* :func:`evaluate` -- scores a plan with those rules (every method's plan is scored by it).
* :class:`CostTable` -- the rules tabulated over the chain once per (instance, stage count),
  read by every DP, MILP, CP-SAT model and baseline.
"""

from __future__ import annotations

from . import rules as rules
from .evaluate import Evaluation as Evaluation
from .evaluate import check_plan as check_plan
from .evaluate import evaluate as evaluate
from .rules import MEMORY_SLACK as MEMORY_SLACK
from .rules import stage_compute as stage_compute
from .table import CostTable as CostTable
