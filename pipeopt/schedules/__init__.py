"""Schedules as data: the per-rank order of actions (F, B, I, W) of p ranks holding v stages
each over m microbatches, their placement of stages on ranks and their memory rule
(:mod:`.actions`); the seven schedules torch.distributed.pipelining ships
(:mod:`.torch_orders`); the iteration as a graph of operations (:mod:`.dag`) and its
execution with a plan's per-chunk durations (:mod:`.execute`); where a zero-bubble schedule's
W actions may go (:mod:`.w_gaps`); one vocabulary of schedule names,
:func:`schedule_name` (:mod:`.names`: torch's names and class names in any case, and short
aliases such as ``zbv`` or ``interleaved``), which every entry point reads.

>>> from pipeopt.schedules import make_schedule
>>> print(make_schedule("1F1B", ranks=2, microbatches=3))
1F1B: 2 ranks x 1 stages, 3 microbatches
  rank 0: 0F0 0F1 0B0 0F2 0B1 0B2
  rank 1: 1F0 1B0 1F1 1B1 1F2 1B2
"""

from __future__ import annotations

from .actions import Action as Action
from .actions import Schedule as Schedule
from .actions import parse_action as parse_action
from .actions import looped_placement as looped_placement
from .actions import v_placement as v_placement
from .dag import ScheduleGraph as ScheduleGraph
from .dag import check_schedule as check_schedule
from .dag import schedule_graph as schedule_graph
from .execute import Execution as Execution
from .free import FREE as FREE
from .free import FREE_PLACEMENTS as FREE_PLACEMENTS
from .free import as_free as as_free
from .free import free_template as free_template
from .execute import chunk_plan as chunk_plan
from .execute import execute as execute
from .execute import run_schedule as run_schedule
from .names import ALIASES as ALIASES
from .names import SIMULATED as SIMULATED
from .names import TORCH_SCHEDULES as TORCH_SCHEDULES
from .names import schedule_key as schedule_key
from .names import schedule_name as schedule_name
from .torch_orders import GENERATORS as GENERATORS
from .torch_orders import MAX_OPERATIONS as MAX_OPERATIONS
from .torch_orders import make_schedule as make_schedule
from .torch_orders import operation_count as operation_count
