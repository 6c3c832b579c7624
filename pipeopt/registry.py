"""Every problem and every method pipeopt offers, in one table that feeds the CLI, the bench
and the tests.

A *problem builder* turns an :class:`~pipeopt.Instance` plus options into a problem object
(e.g. :class:`~pipeopt.problems.partition.problem.PartitionProblem`). A *method* is a plain function
``fn(problem, *, time_limit=60.0, solver="cbc", seed=0, **kw) -> Result`` whose plan is
scored by :func:`~pipeopt.evaluate`. Targets are ``"module:attribute"`` strings, imported
lazily so that an optional backend costs nothing until used.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from .errors import InvalidProblemError


@dataclass(frozen=True)
class MethodSpec:
    """One method of one problem.

    Attributes
    ----------
    problem
        Problem name (``"partition"``, ...).
    name
        Method name as typed on the command line.
    target
        ``"module:function"``.
    exact
        True if the method proves optimality or a bound.
    space
        Search space it covers (gaps compare within one space): ``"straight"`` or
        ``"replicated"`` for partition; ``"auto"`` = follows the problem's option.
    default
        Part of the default ``pipeopt bench`` run.
    source
        Paper or framework it implements.
    """

    problem: str
    name: str
    target: str
    exact: bool
    space: str = "auto"
    default: bool = True
    source: str = ""

    def load(self):
        """The method function."""
        return _load(self.target)


PROBLEMS: dict[str, str] = {
    "partition": "pipeopt.problems.partition.problem:PartitionProblem",
    # resource problems (allocate, joint, group) register here
    "allocate": "pipeopt.problems.resource:AllocateProblem",
    "joint": "pipeopt.problems.resource:JointProblem",
    "group": "pipeopt.problems.resource:GroupProblem",
    # bipartition registers here
    "bipartition": "pipeopt.problems.bipartition.problem:BipartitionProblem",
}

METHODS: list[MethodSpec] = [
    # ---- partition: exact ----
    MethodSpec("partition", "dp", "pipeopt.problems.partition.dp:solve_dp", True, "auto", True,
               "dynamic program; replicated space after Narayanan et al., PipeDream, SOSP 2019"),
    MethodSpec("partition", "milp", "pipeopt.problems.partition.milp:solve_milp", True, "straight", True, "MILP (PuLP; CBC or HiGHS)"),
    MethodSpec("partition", "cpsat", "pipeopt.problems.partition.cpsat:solve_cpsat", True, "straight", True, "CP-SAT (OR-Tools)"),
    # ---- partition: baselines ----
    MethodSpec("partition", "binary_search", "pipeopt.problems.partition.binary_search:binary_search", False, "straight", True,
               "Duan & Wu, ICPADS 2022"),
    MethodSpec("partition", "pipedream", "pipeopt.problems.partition.pipedream:pipedream", False, "replicated", True,
               "Narayanan et al., PipeDream, SOSP 2019 (its own cost model)"),
    MethodSpec("partition", "uniform", "pipeopt.problems.partition.simple:uniform", False, "straight", True,
               "equal layer counts (GPipe/DeepSpeed 'uniform')"),
    MethodSpec("partition", "param_balanced", "pipeopt.problems.partition.simple:param_balanced", False, "straight", True,
               "DeepSpeed partition_method='parameters'"),
    MethodSpec("partition", "time_balanced", "pipeopt.problems.partition.simple:time_balanced", False, "straight", True,
               "torchgpipe balance_by_time (Kim et al. 2020)"),
    # ---- partition: simulator-driven search (mcmc) registers here ----
    MethodSpec("partition", "mcmc", "pipeopt.problems.partition.mcmc:mcmc", False, "straight", True,
               "FlexFlow-style MCMC (Jia, Zaharia, Aiken, SysML 2019)"),
    # ---- allocate / joint / group methods register here ----
    MethodSpec("allocate", "lp", "pipeopt.problems.resource.allocate:solve_lp", True, "split", True,
               "allocation LP per stage (Duan & Wu, ICPADS 2022), closed form"),
    MethodSpec("allocate", "theorem", "pipeopt.problems.resource.allocate:theorem", False, "split", True,
               "beta = c/(c+1), Duan & Wu's theorem"),
    MethodSpec("allocate", "sequential", "pipeopt.problems.resource.allocate:sequential", False, "sequential", True,
               "no split: forward then backward on all resources"),
    MethodSpec("joint", "dp", "pipeopt.problems.resource.joint:solve_dp", True, "split", True, "min-max DP with the LP split per stage"),
    MethodSpec("joint", "milp", "pipeopt.problems.resource.joint:solve_milp", True, "split", True, "MILP (PuLP) bisected on T"),
    MethodSpec("joint", "cpsat", "pipeopt.problems.resource.joint:solve_cpsat", True, "split", False, "CP-SAT on an integer relaxation"),
    MethodSpec("joint", "two_step", "pipeopt.problems.resource.duan_wu:two_step", False, "split", True,
               "Duan & Wu, ICPADS 2022: binary-search partition, then the LP split"),
    MethodSpec("group", "milp", "pipeopt.problems.resource.group:solve_milp", True, "split", True, "MILP (PuLP) bisected on T"),
    MethodSpec("group", "cpsat", "pipeopt.problems.resource.group:solve_cpsat", True, "split", True, "CP-SAT on an integer relaxation"),
    MethodSpec("group", "algorithm2", "pipeopt.problems.resource.duan_wu:algorithm2", False, "split", True,
               "Duan & Wu, ICPADS 2022, Algorithm 2, then binary search and the LP split"),
    MethodSpec("group", "round_robin", "pipeopt.problems.resource.duan_wu:round_robin", False, "split", True,
               "devices by speed dealt round robin, then binary search and the LP split"),
    # ---- bipartition methods register here ----
    MethodSpec("bipartition", "milp", "pipeopt.problems.bipartition.milp:solve_milp", True, "bipartition", True,
               "MILP with separate forward and backward cuts (PuLP; CBC or HiGHS); Cui et al., Bi-Partition"),
    MethodSpec("bipartition", "greedy", "pipeopt.problems.bipartition.greedy:greedy", False, "bipartition", True,
               "backward-cut mover from the best same-cut plan, after Cui et al., Bi-Partition"),
    MethodSpec("bipartition", "same_cut", "pipeopt.problems.bipartition.greedy:same_cut", False, "bipartition", True,
               "best plan with equal forward and backward cuts (exact partition DP)"),
    MethodSpec("bipartition", "bisection", "pipeopt.problems.bipartition.milp:solve_bisection", True, "bipartition", True,
               "exact memory relaxation by bisection on T (a bound; optimal when its plan fits)"),
]


def _load(target: str):
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def methods(problem: str = "partition") -> list[MethodSpec]:
    """Methods of a problem, exact ones first, in table order."""
    if problem not in PROBLEMS:
        raise InvalidProblemError(f"unknown problem {problem!r}; choose from {sorted(PROBLEMS)}")
    return [m for m in METHODS if m.problem == problem]


def method(problem: str, name: str) -> MethodSpec:
    """The spec of one method; raises :class:`InvalidProblemError` naming the choices."""
    for m in methods(problem):
        if m.name == name:
            return m
    raise InvalidProblemError(
        f"unknown method {name!r} for problem {problem!r}; choose from {[m.name for m in methods(problem)]}"
    )


def problem_class(problem: str):
    """The problem class of ``problem`` (it must accept ``(instance, **options)``)."""
    if problem not in PROBLEMS:
        raise InvalidProblemError(f"unknown problem {problem!r}; choose from {sorted(PROBLEMS)}")
    return _load(PROBLEMS[problem])
