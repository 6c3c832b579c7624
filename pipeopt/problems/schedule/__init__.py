"""The schedule problem: the split of the layers into the p·v chunks of one of the schedules
torch.distributed.pipelining ships (:mod:`pipeopt.schedules`), exactly (:mod:`.milp`, the
event-time MILP over the schedule's operations; :mod:`.w_placement`, the same with every W's
place on its rank chosen too, ``w_placement="free"``; :mod:`.exhaustive` on small chains), the
runtimes' default splits as baselines (:mod:`.baselines`), and the choice of the schedule
(:mod:`.choose`: every schedule's optimum side by side).
"""

from __future__ import annotations

from .exhaustive import exhaustive as exhaustive
from .milp import solve_milp as solve_milp
from .problem import ScheduleProblem as ScheduleProblem
from .problem import ScheduleResult as ScheduleResult
from .problem import uniform_starts as uniform_starts
