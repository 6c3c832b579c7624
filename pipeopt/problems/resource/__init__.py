"""Duan & Wu's resource problems: allocate, joint and group (DESIGN.md problems 2-4).

* :class:`AllocateProblem` - the optimal forward/backward split of a fixed plan.
* :class:`JointProblem` - partition and split at once on identical multi-resource workers.
* :class:`GroupProblem` - heterogeneous devices grouped into workers, with partition and split.
* :func:`optimal_split` - a plan with the optimal forward share of every stage.
"""

from __future__ import annotations

from .problem import AllocateProblem as AllocateProblem
from .problem import GroupProblem as GroupProblem
from .problem import JointProblem as JointProblem
from .problem import ResourceProblem as ResourceProblem
from .problem import brute_force as brute_force
from .problem import optimal_split as optimal_split
from .split import best_split as best_split
from .split import sequential_time as sequential_time
from .split import theorem_split as theorem_split
