"""The partition problem: its problem class, exact methods (DP, MILP, CP-SAT) and baselines.

:class:`PartitionProblem` poses the problem; :data:`METHODS` lists its methods, exact ones first
(each ``fn(problem, *, time_limit=60.0, solver="cbc", seed=0, threads=2) -> Result``, see
:class:`pipeopt.problems.method.Method`). Every plan is scored by :func:`pipeopt.evaluate`; a
baseline's status is ``FEASIBLE`` (``INFEASIBLE`` if its plan breaks memory) and it proves no
lower bound.

* :func:`solve_auto` -- the default (``method=None``): the exact method that proves fastest at
  the instance's size, by the rule of :mod:`.auto` (bottleneck objective: ``dp`` when the dense
  DP's work ``(n+1)^2 S`` -- replicated ``(n+1)^2 S^2`` -- is at most 10^5, else ``probe``;
  the ``iteration`` and ``gpipe`` objectives: ``milp``); the result names the method that ran
  (``result.method``, ``info["chosen"]``). Not in the bench's default set (it would repeat a
  row of ``dp`` or ``probe``).
* :func:`solve_dp`, :func:`solve_probe`, :func:`solve_milp`, :func:`solve_cpsat` -- exact
  (:func:`solve_probe`: a K-way search on the period over exact frontier probes,
  :mod:`.chains`, for long chains and many stages; the dense DP stays the cross-check and
  refuses instances whose matrices exceed 2 GiB, :data:`.dp.DENSE_LIMIT`).

* :func:`binary_search` -- Duan & Wu, ICPADS 2022 (one-order space); its greedy check,
  bisection and completion to S stages are the generic core :mod:`pipeopt.backends.bisection`
  (:func:`greedy_starts`, :func:`bisect_limit`, :func:`complete_stages`), which the resource
  problems' :func:`pipeopt.problems.resource.duan_wu.bisection_partition` shares.
* :func:`pipedream` -- PipeDream's planner in its own cost model (Narayanan et al., SOSP 2019;
  replicated-one-order space), with :func:`pipedream_partition` giving PipeDream's own prediction.
* :func:`uniform`, :func:`param_balanced` -- DeepSpeed's ``uniform`` and ``parameters``
  partition methods (one-order space).
* :func:`time_balanced` -- torchgpipe's ``balance_by_time`` (one-order space).
* :func:`torchtitan`, :func:`megatron`, :func:`pippy` -- the default splits of torchtitan,
  Megatron-LM and PiPPy's examples, counting the blocks of a model profiled by
  :func:`pipeopt.torch.from_torch` (:mod:`.frameworks`; other graphs are refused).
* :func:`megatron_full_uniform`, :func:`megatron_block`, :func:`torchtitan_every_k`,
  :func:`no_recompute` -- what Megatron-LM and torchtitan users set when a model does not fit
  (activation recomputation on the frameworks' default splits) and the exact optimum without
  recomputation (:mod:`.recompute_baselines`; transformer graphs only, ``requires="transformer"``).
* :func:`no_recompute_more_stages` -- no recomputation on the fewest stages that fit (more
  devices, compared per device), and :func:`adapipe` -- AdaPipe's per-stage recompute knapsack
  and computation-balancing split (Sun et al., ASPLOS 2024); any graph (:mod:`.recompute_baselines`).
* :func:`mcmc` -- FlexFlow's Metropolis-Hastings search (Jia, Zaharia & Aiken, SysML 2019):
  five chains (seeds ``seed .. seed + 4``) share the time limit; the median chain's plan.
"""

from ...lazy import lazy_attributes, lazy_function
from ..method import ALPHA_OVERHEAD, RECOMPUTE, ZERO, Method
from .auto import solve_auto
from .dp import solve_dp
from .problem import PartitionProblem

# The other methods' modules are imported when a method runs or its name is read (``from
# pipeopt.problems.partition import solve_milp``): the default solve imports auto, dp and probe
# only (start-up, tests/test_startup.py).
_WHERE = {
    **dict.fromkeys(("binary_search", "greedy_check", "split_to_stages", "straight_stage_time"), ".binary_search"),
    "solve_convex": ".convex",
    "solve_convex_milp": ".convex_milp",
    "solve_cpsat": ".cpsat",
    **dict.fromkeys(("megatron", "pippy", "torchtitan"), ".frameworks"),
    "mcmc": ".mcmc",
    "solve_milp": ".milp",
    "solve_probe": ".probe",
    **dict.fromkeys(("PipeDreamPlan", "pipedream", "pipedream_partition"), ".pipedream"),
    **dict.fromkeys(("adapipe", "megatron_block", "megatron_full_uniform", "no_recompute", "no_recompute_more_stages",
                     "torchtitan_every_k"), ".recompute_baselines"),
    **dict.fromkeys(("block_partition", "block_parts", "param_balanced", "spread_balanced_parts", "time_balanced",
                     "uniform", "uniform_parts"), ".simple"),
}
__getattr__, __dir__ = lazy_attributes(__name__, _WHERE)


def _lazy(name: str):
    """The method function ``name``, imported from its module when it is first called."""
    return lazy_function(_WHERE[name], name, __name__)


solve_probe, solve_convex, solve_convex_milp, solve_cpsat, solve_milp = map(
    _lazy, ("solve_probe", "solve_convex", "solve_convex_milp", "solve_cpsat", "solve_milp"))
binary_search, pipedream, uniform, param_balanced, time_balanced, torchtitan, megatron, pippy, mcmc = map(
    _lazy, ("binary_search", "pipedream", "uniform", "param_balanced", "time_balanced", "torchtitan", "megatron",
            "pippy", "mcmc"))
megatron_full_uniform, megatron_block, torchtitan_every_k, no_recompute, no_recompute_more_stages, adapipe = map(
    _lazy, ("megatron_full_uniform", "megatron_block", "torchtitan_every_k", "no_recompute", "no_recompute_more_stages",
            "adapipe"))

PROBLEM = PartitionProblem

METHODS = (
    Method("partition", "auto", solve_auto, True, "auto", False,
           "the exact method that proves fastest at the instance's size: dp on short chains, probe beyond, "
           "milp for the iteration and gpipe objectives (pipeopt.problems.partition.auto)",
           terms=ALPHA_OVERHEAD | RECOMPUTE | ZERO),
    Method("partition", "dp", solve_dp, True, "auto", True,
           "dynamic program; replicated-one-order space after Narayanan et al., PipeDream, SOSP 2019; with recompute, "
           "each stage's recomputed layers chosen exactly (Pareto frontier, .recompute); ZeRO's sharded state and "
           "collectives as stage terms", terms=ALPHA_OVERHEAD | RECOMPUTE | ZERO),
    Method("partition", "probe", solve_probe, True, "auto", True,
           "search on the period over exact frontier probes (chains-on-chains: Nicol 1994; Pinar & Aykanat 2004)", terms=ALPHA_OVERHEAD),
    Method("partition", "convex", solve_convex, True, "convex", True,
           "DP over the ideals of the layer DAG: every convex ordered split (Tarnawski et al., NeurIPS 2020)", terms=ALPHA_OVERHEAD),
    Method("partition", "convex_milp", solve_convex_milp, True, "convex", False,
           "MILP over every convex ordered split (PuLP; CBC or HiGHS; cf. Tarnawski et al., throughput-ip)"),
    Method("partition", "milp", solve_milp, True, "one-order", True,
           "MILP (PuLP; CBC or HiGHS); with recompute, a binary per layer and mode, linearised with the stages;"
           " ZeRO's state and collectives as linear terms (bottleneck objective)",
           terms=ALPHA_OVERHEAD | RECOMPUTE | ZERO),
    Method("partition", "cpsat", solve_cpsat, True, "one-order", True, "CP-SAT (OR-Tools)", terms=ALPHA_OVERHEAD),
    Method("partition", "binary_search", binary_search, False, "one-order", True, "Duan & Wu, ICPADS 2022"),
    Method("partition", "pipedream", pipedream, False, "replicated-one-order", True,
           "Narayanan et al., PipeDream, SOSP 2019 (its own cost model)"),
    Method("partition", "uniform", uniform, False, "one-order", True, "equal layer counts (GPipe/DeepSpeed 'uniform')"),
    Method("partition", "param_balanced", param_balanced, False, "one-order", True,
           "DeepSpeed partition_method='parameters'"),
    Method("partition", "time_balanced", time_balanced, False, "one-order", True,
           "torchgpipe balance_by_time (Kim et al. 2020)"),
    Method("partition", "torchtitan", torchtitan, False, "one-order", False,
           "torchtitan v0.2.2 generate_llm_fqn_per_model_part (first/last stage less layers = 1)", "torch"),
    Method("partition", "megatron", megatron, False, "one-order", False,
           "Megatron-Core 0.19 get_num_layers_to_build (L / S blocks, embedding first, head last)", "torch"),
    Method("partition", "pippy", pippy, False, "one-order", False,
           "PiPPy examples: layers_per_rank = L // S, the rest on the last stage", "torch"),
    Method("partition", "mcmc", mcmc, False, "one-order", True,
           "FlexFlow-style MCMC (Jia, Zaharia, Aiken, SysML 2019); 5 seeds share the time limit, median plan"),
    # recomputation baselines (issue 25, .recompute_baselines): requires "transformer" = a graph of blocks
    # (from_torch at a container granularity, or a zoo transformer's layer{i}_ sub-blocks)
    Method("partition", "megatron-full-uniform", megatron_full_uniform, False, "one-order", False,
           "Megatron-LM core_v0.19 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
           "on its L / S split", "transformer"),
    Method("partition", "megatron-block", megatron_block, False, "one-order", False,
           "Megatron-LM core_v0.19 --recompute-method block, the fewest --recompute-num-layers that fit, L / S split",
           "transformer"),
    Method("partition", "torchtitan-every-k", torchtitan_every_k, False, "one-order", False,
           "torchtitan v0.2.2 activation_checkpoint selective_ac_option = k (every k-th block), the largest k that "
           "fits, on its default split", "transformer"),
    Method("partition", "no-recompute", no_recompute, False, "auto", False,
           "the exact optimum without recomputation at the same S (solve_auto)", "transformer"),
    Method("partition", "no-recompute-more-stages", no_recompute_more_stages, False, "auto", False,
           "the exact plan without recomputation on the fewest stages S' >= S that fit (more devices; compare per "
           "device)"),
    Method("partition", "adapipe", adapipe, False, "one-order", False,
           "Sun et al., AdaPipe, ASPLOS 2024: each stage's recompute knapsack at its in-flight count, then the split "
           "balancing computation (min-max DP)"),
)

# the names above were the table's stand-ins: read from the package, a name gives the real function
del (solve_probe, solve_convex, solve_convex_milp, solve_cpsat, solve_milp, binary_search, pipedream, uniform, param_balanced,
     time_balanced, torchtitan, megatron, pippy, mcmc, megatron_full_uniform, megatron_block, torchtitan_every_k,
     no_recompute, no_recompute_more_stages, adapipe)

__all__ = [
    "METHODS",
    "PROBLEM",
    "PartitionProblem",
    "PipeDreamPlan",
    "mcmc",
    "megatron",
    "megatron_block",
    "megatron_full_uniform",
    "no_recompute",
    "no_recompute_more_stages",
    "adapipe",
    "pippy",
    "solve_auto",
    "solve_convex",
    "solve_cpsat",
    "solve_dp",
    "solve_milp",
    "solve_probe",
    "binary_search",
    "block_partition",
    "block_parts",
    "greedy_check",
    "param_balanced",
    "pipedream",
    "pipedream_partition",
    "split_to_stages",
    "spread_balanced_parts",
    "straight_stage_time",
    "time_balanced",
    "torchtitan",
    "torchtitan_every_k",
    "uniform",
    "uniform_parts",
]
