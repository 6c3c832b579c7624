"""Duan & Wu's resource problems: allocate, joint and group (docs/problems.md).

* :class:`AllocateProblem` - the optimal forward/backward split of a fixed plan.
* :class:`JointProblem` - partition and split at once on identical multi-resource workers.
* :class:`GroupProblem` - heterogeneous devices grouped into workers, with partition and split.
* :func:`optimal_split` - a plan with the optimal forward share of every stage.

Modules, one job each:

========================  ===================================================================
``problem``               the problem classes: the stage time, memory and cuts of a contiguous
                          stage read from the cost table; plans; brute force for tiny cases
``split``                 the best forward share of one worker (the allocation LP, closed form)
``allocate``              the allocate methods (LP split, the paper's theorem, no split)
``joint``, ``group``      the exact methods (DP; MILP and CP-SAT bisected on T)
``group_dp``              the exact DP over device types (grouping at scale), bisected on T
``tiebreak``              their secondary objective: among plans of optimal period, the least
                          latency of a microbatch (an exact DP over the chain and the workers)
``duan_wu``               the paper's heuristics (binary-search partition, two steps,
                          Algorithm 2 in two readings of p_i) and round-robin
``local``                 a local search over groupings (move or swap a device; each neighbour's
                          split by the chain DP): the group methods' start
``search``                the exact methods' common search: bounds, start, the bisection on T
                          (:func:`pipeopt.backends.bisection.bisect`), certified plans
``bounds``                lower bounds and the limit every plan that fits passes
``formulation``           the MILP at a fixed limit T (PuLP door)
``intervals``             the CP-SAT stage-interval model at a fixed limit T (CP-SAT door)
``examples``              small synthetic multi-resource instances
========================  ===================================================================

:data:`METHODS` lists the methods of the three problems (exact ones first per problem, see
:class:`pipeopt.problems.method.Method`). The MILP and CP-SAT methods report ``optimal``
*within a relative gap of 1e-4* (:data:`MIN_REL_GAP`). Every exact joint and group method then
breaks ties the same way (:mod:`pipeopt.problems.resource.tiebreak`, ``info["secondary"]``).
"""

from __future__ import annotations

from ..method import LATENCY, Method
from . import allocate, duan_wu, group, group_dp, joint
from .problem import AllocateProblem as AllocateProblem
from .problem import GroupProblem as GroupProblem
from .problem import JointProblem as JointProblem
from .problem import ResourceProblem as ResourceProblem
from .problem import brute_force as brute_force
from .problem import optimal_split as optimal_split
from .search import MIN_REL_GAP as MIN_REL_GAP
from .split import best_split as best_split
from .split import sequential_time as sequential_time
from .split import theorem_split as theorem_split

PROBLEMS = {"allocate": AllocateProblem, "joint": JointProblem, "group": GroupProblem}

METHODS = (
    Method("allocate", "lp", allocate.solve_lp, True, "split", True,
           "the shares of least steady period (window rows included): each stage's least busy share at a "
           "trial T (closed form), bisected on T; per stage Duan & Wu's allocation LP when no window row binds", terms=LATENCY),
    Method("allocate", "theorem", allocate.theorem, False, "split", True, "beta = c/(c+1), Duan & Wu's theorem"),
    Method("allocate", "sequential", allocate.sequential, False, "sequential", True,
           "no split: forward then backward on all resources"),
    Method("joint", "dp", joint.solve_dp, True, "split", True,
           "window DP at a trial T (each range's least busy time, the least window slack per stage and end "
           "unit), bisected on T; ties: least latency of a microbatch (the latency DP)", terms=LATENCY),
    Method("joint", "milp", joint.solve_milp, True, "split", True,
           "MILP (PuLP) at a trial T (work fractions per kind; window rows over busy-time variables with "
           "lazy cuts, plans certified exactly), bisected on T; ties: least latency of a microbatch", terms=LATENCY),
    Method("joint", "cpsat", joint.solve_cpsat, True, "split", False,
           "CP-SAT at a trial T over stage starts (exactly tabulated reach per stage; window rows with lazy "
           "cuts, plans certified exactly), bisected on T; ties: least latency of a microbatch", terms=LATENCY),
    Method("joint", "two_step", duan_wu.two_step, False, "split", True,
           "Duan & Wu, ICPADS 2022: binary-search partition on the sequential stage time, then the shares "
           "of least period"),
    Method("group", "types", group_dp.solve_dp, True, "split", True,
           "DP at a trial T over (stage, end unit, devices used of each type: identical devices counted), "
           "keeping the least window state, with priced-power and window-row pruning; bisected on T; ties: "
           "least latency of a microbatch", terms=LATENCY),
    Method("group", "milp", group.solve_milp, True, "split", True,
           "MILP (PuLP) at a trial T over device-class counts and unit-to-stage binaries (window rows with "
           "lazy supporting-plane cuts, plans certified exactly), bisected on T; ties: least latency of a "
           "microbatch", terms=LATENCY),
    Method("group", "cpsat", group.solve_cpsat, True, "split", True,
           "CP-SAT at a trial T over stage intervals (split feasibility linear in the worker's devices, window "
           "rows with lazy cuts, plans certified exactly), bisected on T; ties: least latency of a microbatch", terms=LATENCY),
    Method("group", "algorithm2", duan_wu.algorithm2, False, "split", True,
           "Duan & Wu, ICPADS 2022, Algorithm 2 (each worker costed on an average stage), then the "
           "binary-search partition and the shares of least period"),
    Method("group", "algorithm2_staged", duan_wu.algorithm2_staged, False, "split", True,
           "Duan & Wu's Algorithm 2 with each worker costed on its own stage, grouping and partition "
           "iterated to a fixed point"),
    Method("group", "round_robin", duan_wu.round_robin, False, "split", True,
           "devices by speed dealt round robin, then the binary-search partition and the shares of least period"),
)
