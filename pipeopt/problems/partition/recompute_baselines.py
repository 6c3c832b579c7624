"""What Megatron-LM and torchtitan users get when a model does not fit: their activation
recomputation settings on their default splits, and the exact optimum without recomputation.

Each method takes the problem's S and instance (and chooses its recomputation by its framework's
rule, whatever the problem's ``recompute`` option: :func:`pipeopt.solve` gives these methods
``recompute="none"`` only), builds a :class:`~pipeopt.plan.Plan` whose
stages carry ``Stage.recompute`` (every recomputed block's layers ``"full"``: the frameworks
checkpoint a whole transformer layer, :func:`pipeopt.cost.rules.recompute_terms` says what
that keeps and costs) and is scored by :func:`pipeopt.evaluate` like every plan: status
``FEASIBLE``, ``INFEASIBLE`` if the plan breaks memory; no lower bound; the result's space is
:data:`RECOMPUTE_SPACE` when the plan recomputes (a bound proven without recomputation does
not bound it), ``"one-order"`` otherwise.

The frameworks count **blocks** (transformer layers) of a model built as "modules before, a
sequence of blocks, modules after" (:func:`transformer_parts`): a graph of
:func:`pipeopt.torch.from_torch` at a container granularity (the container's children, each
one layer or several of its submodules), or a zoo transformer (:mod:`pipeopt.zoo`: block i is
the sub-blocks ``layer{i}_attn`` and ``layer{i}_mlp``). Other graphs are refused with
:class:`~pipeopt.errors.InvalidProblemError`. With the zoo's sub-block granularity a
recomputed block keeps the inputs of both its sub-blocks (``2 s b h`` elements), where
Megatron's checkpoint of the whole layer keeps one (``s b h``): the plan says per layer what
it recomputes, and the cost model prices exactly that.

* :func:`megatron_full_uniform` -- ``--recompute-granularity full --recompute-method uniform
  --recompute-num-layers 1`` on Megatron's default split (``L / S`` blocks per stage,
  :func:`~pipeopt.problems.partition.frameworks.megatron_blocks`): every block recomputed.
* :func:`megatron_block` -- ``--recompute-method block --recompute-num-layers N`` on the same
  split, N the smallest that makes every stage fit (the flag is one number for all stages:
  each stage recomputes its first ``min(N, blocks)`` blocks, :func:`megatron_block_rule`).
* :func:`torchtitan_every_k` -- torchtitan's default split
  (:func:`~pipeopt.problems.partition.frameworks.torchtitan_blocks`) with ``[activation_checkpoint]
  mode = "selective"``, ``selective_ac_option = "k"``: every k-th block of a rank is wrapped in
  a full checkpoint (:func:`torchtitan_layer_rule`); the largest k that fits (``mode = "none"``
  if the split fits without recomputation).
* :func:`no_recompute` -- the exact optimum without recomputation at the same S (the partition
  problem's exact method, :func:`~pipeopt.problems.partition.auto.solve_auto`); its result's
  ``info["note"]`` says when no split fits.
* :func:`no_recompute_more_stages` -- "no recompute, more stages": the exact no-recompute plan
  on the fewest stages ``S' >= S`` that fit, on ``S'`` devices (:func:`with_devices`), compared
  per device (``info["per_device"]``). Any graph.
* :func:`adapipe` -- AdaPipe (Sun et al., ASPLOS 2024): each stage's recompute knapsack at its
  in-flight count, then the split that balances computation. Any graph.

The rules (:func:`megatron_uniform_rule`, :func:`megatron_block_rule`,
:func:`torchtitan_layer_rule`) are pure functions of the blocks per stage, read also by the
exporters (:mod:`pipeopt.export.layout`) to say which framework setting a plan's recompute set
is.

References
----------
Megatron-LM, github.com/NVIDIA/Megatron-LM, core_v0.19.0 (2026-08-19):
``megatron/training/arguments.py`` (``--recompute-granularity {full,selective}``,
``--recompute-method {uniform,block}``, ``--recompute-num-layers``),
``megatron/core/transformer/transformer_config.py`` (``recompute_granularity``,
``recompute_method``, ``recompute_num_layers``: "block will recompute the input activations
for only a set number of transformer layers per pipeline stage") and
``megatron/core/recompute.py`` (the ``uniform`` chunks of ``recompute_num_layers`` layers, the
``block`` branch ``layer_idx < recompute_num_layers`` per pipeline rank); Korthikanti et al.,
Reducing Activation Recomputation in Large Transformer Models, MLSys 2023, arXiv:2205.05198.
torchtitan, github.com/pytorch/torchtitan, v0.2.2 (2026-02-20):
``torchtitan/config/job_config.py`` (``ActivationCheckpoint.mode``, ``selective_ac_option``:
"'int' (e.g., 2) for every nth layer, or 'op' for op level ac") and
``torchtitan/distributed/activation_checkpoint.py`` (``_apply_layer_sac``: a module-level
counter incremented per block, the block wrapped when ``count % ac_freq == 0``; ``apply_ac`` is
called per model part, so with one stage per rank the count restarts on each rank). The layer
option was removed after v0.2.2 (commit 114151ad, 2026-03-23: "per-op SAC is now the only
selective mode").
"""

from __future__ import annotations

import dataclasses
import re

import networkx as nx
import numpy as np

from ...backends.deadline import Deadline
from ...errors import InfeasibleError, InvalidProblemError
from ...plan import Plan
from ...result import Result, Status
from .. import spaces
from .frameworks import around_container, block_of, megatron_blocks, torchtitan_blocks
from .problem import PartitionProblem

_ZOO_BLOCK = re.compile(r"layer(\d+)_")


# ---------------------------------------------------------------------------------------
# The model's blocks
# ---------------------------------------------------------------------------------------
def transformer_parts(graph: nx.DiGraph) -> tuple[list, list, list]:
    """``(before, blocks, after)`` of a transformer's layer graph.

    Parameters
    ----------
    graph
        A graph of :func:`pipeopt.torch.from_torch` at a container granularity (graph
        attribute ``torch`` with a ``container``; a block is the container's child and all
        layers inside it), or a zoo transformer (nodes ``layer{i}_...``; block i is every node
        whose name starts with ``layer{i}_``).

    Returns
    -------
    tuple
        ``before``: layer names run before the first block; ``blocks``: ``list[tuple[str,
        ...]]``, each block's layers in the graph's order, blocks in model order; ``after``:
        the names after the last block.

    Raises
    ------
    InvalidProblemError
        If the graph has neither, or a layer outside the blocks runs between two blocks, or a
        block's layers are not contiguous.
    """
    nodes = list(graph.nodes)
    meta = graph.graph.get("torch") or {}
    container = meta.get("container")
    if container:
        before, names, after = around_container([str(n) for n in nodes], container)
        key = {n: block_of(str(n), container) for n in nodes}
    else:
        key = {}
        for n in nodes:
            m = _ZOO_BLOCK.match(str(n))
            if m:
                key[n] = int(m.group(1))
        if not key:
            raise InvalidProblemError(
                "the recomputation baselines count transformer blocks: give a graph of pipeopt.torch.from_torch at a "
                "container granularity or a zoo transformer (layers named layer{i}_...); this graph has neither"
            )
        inside = [i for i, n in enumerate(nodes) if n in key]
        lo, hi = inside[0], inside[-1]
        stray = [n for n in nodes[lo:hi + 1] if n not in key]
        if stray:
            raise InvalidProblemError(f"{stray[0]!r} runs between the transformer blocks: not 'modules before, "
                                      "blocks, modules after'")
        before, after = [str(n) for n in nodes[:lo]], [str(n) for n in nodes[hi + 1:]]
        names = list(dict.fromkeys(key[n] for n in nodes[lo:hi + 1]))
    blocks = [tuple(str(n) for n in nodes if key.get(n) == b) for b in names]
    order = [key[n] for n in nodes if key.get(n) is not None]
    if any(a != b and a in order[i + 1:] for i, (a, b) in enumerate(zip(order, order[1:]))):
        raise InvalidProblemError("a transformer block's layers are not contiguous in the graph's order")
    if any(not b for b in blocks):
        raise InvalidProblemError("a transformer block has no layer in the graph")
    return before, blocks, after


# ---------------------------------------------------------------------------------------
# The frameworks' rules: which blocks of each stage are recomputed
# ---------------------------------------------------------------------------------------
def megatron_uniform_rule(counts: list[int], num_layers: int = 1) -> list[list[bool]]:
    """Megatron's ``--recompute-method uniform --recompute-num-layers num_layers`` per stage.

    ``uniform`` checkpoints chunks of ``num_layers`` consecutive layers, keeping only each
    chunk's input; with ``num_layers = 1`` that is every layer checkpointed on its own, which
    a per-layer recompute set expresses. A chunk of several layers keeps less than its layers
    recomputed one by one (its inner inputs are not kept): no per-layer set is that.

    Parameters
    ----------
    counts
        Blocks per stage.
    num_layers
        ``--recompute-num-layers`` (must be 1 here).

    Returns
    -------
    list[list[bool]]
        Per stage, per block in order: recomputed.

    Raises
    ------
    InvalidProblemError
        If ``num_layers != 1``.
    """
    if num_layers != 1:
        raise InvalidProblemError(
            f"--recompute-method uniform --recompute-num-layers {num_layers} checkpoints chunks of {num_layers} layers "
            "keeping only each chunk's input; a per-layer recompute set expresses only chunks of 1 layer"
        )
    return [[True] * c for c in counts]


def megatron_block_rule(counts: list[int], num_layers: int) -> list[list[bool]]:
    """Megatron's ``--recompute-method block --recompute-num-layers num_layers``: on every
    pipeline stage its first ``num_layers`` blocks (all of them if it has fewer) are
    checkpointed, the others keep their activations (``megatron/core/recompute.py``:
    ``use_checkpoint = layer_idx < recompute_num_layers`` per rank; no FP8 skip).

    >>> megatron_block_rule([3, 2], 2)
    [[True, True, False], [True, True]]
    """
    if num_layers < 0:
        raise InvalidProblemError(f"--recompute-num-layers must be >= 0, got {num_layers}")
    return [[j < num_layers for j in range(c)] for c in counts]


def torchtitan_layer_rule(counts: list[int], k: int) -> list[list[bool]]:
    """torchtitan v0.2.2's ``selective_ac_option = "k"`` with one stage per rank: the
    counter restarts on each rank, so block j (0-based) of a stage is checkpointed iff
    ``(j + 1) % k == 0``; ``k = 0`` (``not ac_freq``) checkpoints every block.

    >>> torchtitan_layer_rule([4, 3], 2)
    [[False, True, False, True], [False, True, False]]
    """
    if k < 0:
        raise InvalidProblemError(f"selective_ac_option must be a non-negative integer, got {k}")
    return [[k == 0 or (j + 1) % k == 0 for j in range(c)] for c in counts]


# ---------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------
def block_plan(problem: PartitionProblem, counts: list[int], recompute: list[list[bool]] | None,
               rule: str = "baseline") -> Plan:
    """The plan of ``counts`` blocks per stage (the modules before the blocks with stage 0,
    after them with stage S - 1), each flagged block's layers recomputed ``"full"``.

    Parameters
    ----------
    problem
        The partition problem (its chain gives the stages' layers and the devices).
    counts
        Blocks per stage, S entries summing to the blocks.
    recompute
        Per stage, per block: recomputed (``None``: nothing).
    rule
        The caller's name, for messages.

    Raises
    ------
    InvalidProblemError
        If the counts do not match the model, leave a stage empty, or the stages are not
        contiguous in the chain's order.
    """
    before, blocks, after = transformer_parts(problem.instance.graph)
    S = problem.stages
    if len(counts) != S or sum(counts) != len(blocks) or min(counts, default=0) < 0:
        raise InvalidProblemError(f"{rule}: {counts} blocks per stage for {len(blocks)} blocks, S = {S}")
    stage_of = {n: 0 for n in before}
    flagged: list[set] = [set() for _ in range(S)]
    k = 0
    for s, c in enumerate(counts):
        for j, b in enumerate(blocks[k:k + c]):
            stage_of.update({n: s for n in b})
            if recompute is not None and recompute[s][j]:
                flagged[s].update(b)
        k += c
    stage_of.update({n: S - 1 for n in after})
    empty = [s for s in range(S) if s not in set(stage_of.values())]
    if empty:
        raise InvalidProblemError(f"{rule} leaves stage(s) {empty} empty ({counts} blocks per stage)")
    units = problem.instance.chain.units
    seq = [stage_of[str(u[0])] for u in units]
    if any(b < a for a, b in zip(seq, seq[1:])) or any(len({stage_of[str(x)] for x in u}) > 1 for u in units):
        raise InvalidProblemError(f"{rule}: its stages are not contiguous in pipeopt's layer order")
    starts = [i for i in range(1, len(seq)) if seq[i] != seq[i - 1]]
    layer_sets = problem.instance.chain.stages_from_cuts(starts)
    return problem.plan(starts, recompute=[{n: "full" for n in layers if str(n) in flagged[s]}
                                           for s, layers in enumerate(layer_sets)])


def _fits(problem: PartitionProblem, plan: Plan) -> bool:
    from ...cost import evaluate

    return evaluate(problem.instance, plan).feasible


def _blocks(problem: PartitionProblem) -> int:
    return len(transformer_parts(problem.instance.graph)[1])


RECOMPUTE_SPACE = spaces.ONE_ORDER_RECOMPUTE
"""The search space a baseline's result states when its plan recomputes something: contiguous
splits of one layer order with any per-layer recompute set. It is not ``"one-order"``: a bound
an exact method proves without recomputation does not bound these plans (a recomputing plan
can be faster than the no-recompute optimum), so no gap is taken against one. A plan that
recomputes nothing states ``"one-order"``."""


def _result(problem, name, plan, started, info) -> Result:
    space = RECOMPUTE_SPACE if any(st.recompute for st in plan.stages) else spaces.ONE_ORDER
    return problem.result(name, plan, Status.FEASIBLE, started=started, space=space, info=info)


# ---------------------------------------------------------------------------------------
# Methods
# ---------------------------------------------------------------------------------------
def megatron_full_uniform(
    problem: PartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
    threads: int = 2,
) -> Result:
    """Megatron-LM's ``--recompute-granularity full --recompute-method uniform
    --recompute-num-layers 1`` on its default split (``get_num_layers_to_build``: ``L / S``
    blocks per stage, the embedding on the first stage, the output layer on the last): every
    block recomputed.

    Parameters
    ----------
    problem
        A partition problem on a transformer (:func:`transformer_parts`).
    time_limit, solver, seed, threads
        Unused (the common method signature; ``time_limit`` starts the clock).

    Returns
    -------
    Result
        ``FEASIBLE`` (``INFEASIBLE`` if the plan breaks memory), no bound, space
        :data:`RECOMPUTE_SPACE`; ``info``: ``blocks_per_stage``, ``megatron_args``.

    Raises
    ------
    InvalidProblemError
        On a graph that is not a transformer, or L not divisible by S (Megatron asserts).
    """
    started = Deadline.of(time_limit).started
    counts = megatron_blocks(problem.stages, _blocks(problem))
    plan = block_plan(problem, counts, megatron_uniform_rule(counts), "megatron-full-uniform")
    return _result(problem, "megatron-full-uniform", plan, started, {
        "blocks_per_stage": counts,
        "megatron_args": "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"})


def megatron_block(
    problem: PartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
    threads: int = 2,
) -> Result:
    """Megatron-LM's ``--recompute-granularity full --recompute-method block
    --recompute-num-layers N`` on its default split, with the smallest N (0 = no
    recomputation) for which every stage fits (:func:`megatron_block_rule`; one N for all
    stages, as Megatron's flag is global). If none fits, the plan of the largest N (every
    block recomputed), ``INFEASIBLE``.

    Parameters, Raises
        As :func:`megatron_full_uniform`.

    Returns
    -------
    Result
        As :func:`megatron_full_uniform`; ``info["recompute_num_layers"]`` = N (``None`` if
        no N fits) and ``info["megatron_args"]``.
    """
    started = Deadline.of(time_limit).started
    counts = megatron_blocks(problem.stages, _blocks(problem))
    top = max(counts)
    chosen, plan = None, None
    for n in range(top + 1):
        plan = block_plan(problem, counts, megatron_block_rule(counts, n), "megatron-block")
        if _fits(problem, plan):
            chosen = n
            break
    n = top if chosen is None else chosen
    args = ("" if n == 0 else
            f"--recompute-granularity full --recompute-method block --recompute-num-layers {n}")
    info = {"blocks_per_stage": counts, "recompute_num_layers": chosen, "megatron_args": args}
    if chosen is None:
        info["note"] = "no --recompute-num-layers makes every stage fit: even every block recomputed breaks memory"
    return _result(problem, "megatron-block", plan, started, info)


def torchtitan_every_k(
    problem: PartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
    threads: int = 2, input_weight: int = 1, output_weight: int = 1,
) -> Result:
    """torchtitan v0.2.2's ``[activation_checkpoint] mode = "selective"``,
    ``selective_ac_option = "k"`` on its default split (``generate_llm_fqn_per_model_part``),
    the largest spacing k that fits (every k-th block of each stage checkpointed,
    :func:`torchtitan_layer_rule`); ``mode = "none"`` if the split fits without
    recomputation. k runs from the largest stage's block count down to 1 (every block); if
    none fits, the plan of k = 1, ``INFEASIBLE``.

    Parameters
    ----------
    problem, time_limit, solver, seed, threads
        As :func:`megatron_full_uniform`.
    input_weight, output_weight
        torchtitan's ``pipeline_parallel_first_stage_less_layers`` /
        ``..._last_stage_less_layers`` (default 1).

    Returns
    -------
    Result
        As :func:`megatron_full_uniform`; ``info``: ``selective_ac_option`` (k as a string,
        ``None`` for mode none or when nothing fits), ``activation_checkpoint`` (the TOML
        table's settings).

    Raises
    ------
    InvalidProblemError
        On a graph that is not a transformer, or where torchtitan's split raises.
    """
    started = Deadline.of(time_limit).started
    counts = torchtitan_blocks(problem.stages, _blocks(problem), input_weight, output_weight)
    plan = block_plan(problem, counts, None, "torchtitan-every-k")
    info: dict = {"blocks_per_stage": counts, "input_weight": input_weight, "output_weight": output_weight}
    if _fits(problem, plan):
        info.update(selective_ac_option=None, activation_checkpoint={"mode": "none"})
        return _result(problem, "torchtitan-every-k", plan, started, info)
    chosen = None
    for k in range(max(counts), 0, -1):
        plan = block_plan(problem, counts, torchtitan_layer_rule(counts, k), "torchtitan-every-k")
        if _fits(problem, plan):
            chosen = k
            break
    k = 1 if chosen is None else chosen
    info.update(selective_ac_option=None if chosen is None else str(k),
                activation_checkpoint={"mode": "selective", "selective_ac_option": str(k)})
    if chosen is None:
        info["note"] = "no spacing k fits: even every block checkpointed (k = 1) breaks memory"
    return _result(problem, "torchtitan-every-k", plan, started, info)


def no_recompute(
    problem: PartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
    threads: int = 2,
) -> Result:
    """The exact optimum without recomputation at the same S: the partition problem's exact
    method (:func:`~pipeopt.problems.partition.auto.solve_auto`: the DP on these chains) on
    the instance as it is, no layer recomputed ("more memory per stage is not an option: no
    recompute"). Applies to any instance; registered beside the recomputation baselines.

    Parameters
    ----------
    problem, time_limit, solver, seed, threads
        As for the exact methods.

    Returns
    -------
    Result
        ``FEASIBLE`` with the exact method's plan (its proof is in ``info["exact"]``, not a
        bound: plans that recompute may be faster), or ``INFEASIBLE`` without a plan and
        ``info["note"]`` saying that no split fits without recomputation (the exact method's
        message).
    """
    from .auto import solve_auto

    deadline = Deadline.of(time_limit)
    plain = PartitionProblem(problem.instance, problem.stages, problem.replication)
    try:
        res = solve_auto(plain, time_limit=deadline, solver=solver, seed=seed, threads=threads)
    except InfeasibleError as exc:
        return Result.scored(problem.instance, "no-recompute", None, Status.INFEASIBLE, started=deadline.started,
                             space=problem.space, info={"note": f"infeasible without recomputation: {exc}"})
    info = {"exact": {"method": res.method, "status": str(res.status), "lower_bound": res.lower_bound},
            "note": "the exact optimum without recomputation"
                    + ("" if res.status == Status.OPTIMAL else f" (not proven: {res.status})")}
    if res.plan is None:
        info["note"] = f"no plan without recomputation: the exact method ended {res.status}"
        return Result.scored(problem.instance, "no-recompute", None, Status.INFEASIBLE, started=deadline.started,
                             space=res.space, info=info)
    return Result.scored(problem.instance, "no-recompute", res.plan, Status.FEASIBLE, started=deadline.started,
                         space=res.space, info=info)


def with_devices(instance, count: int):
    """``instance`` with at least ``count`` devices: the cluster's own first, then copies of its
    first device named ``<name>+<i>`` (same resources, memory, bandwidth and latency): the
    instance :func:`no_recompute_more_stages` scores its plan on.

    Parameters
    ----------
    instance
        :class:`pipeopt.Instance`.
    count
        Devices wanted.

    Returns
    -------
    Instance
        ``instance`` itself if it has ``count`` devices or more."""
    from ...cluster import Device

    devices = tuple(instance.cluster.devices)
    if len(devices) >= count:
        return instance
    dev = devices[0]
    extra = tuple(Device(f"{dev.name}+{i}", dict(dev.resources), dev.memory) for i in range(len(devices), count))
    return instance.replace(cluster=dataclasses.replace(instance.cluster, devices=devices + extra))


def no_recompute_more_stages(
    problem: PartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
    threads: int = 2, max_stages: int | None = None,
) -> Result:
    """"No recompute, more stages": the exact plan without recomputation on the fewest stages
    ``S' >= S`` (one more device per added stage, the same device) for which some split fits.

    **The comparison.** The user who will not recompute buys devices: the plan runs on ``S'``
    devices, ``S' - S`` more than the problem's. Its objective is :func:`pipeopt.evaluate`'s on
    the grown cluster (the 1F1B bottleneck, seconds per microbatch, stage i keeping ``S' - i``
    microbatches in flight); a faster pipeline bought with more devices is not a fair win, so
    the comparison with a plan on ``S`` devices is **per device**: ``info["per_device"] = T' S'
    / S``, the seconds per microbatch the ``S'`` devices deliver, scaled to ``S`` devices'
    worth (equal throughput per device gives equal values; this assumes the extra devices
    could otherwise run a proportional share of the work, e.g. as data-parallel replicas). At
    ``S' = S`` it is the plan of :func:`no_recompute`.

    More stages need not help: under 1F1B the first stage keeps ``S'`` microbatches of its
    layers in flight, so with ``S'`` stages of ``~L / S'`` layers it holds about one microbatch's
    activations of the whole model whatever ``S'`` is; only the parameters per stage shrink.
    Where the activations alone break memory no ``S'`` fits (the result says so).

    Parameters
    ----------
    problem
        The partition problem (its instance, S, replication; its ``recompute`` is ignored).
    time_limit, solver, seed, threads
        As for the exact methods; one clock for every ``S'`` tried.
    max_stages
        The largest ``S'`` tried (default: the chain's units).

    Returns
    -------
    Result
        ``FEASIBLE`` with the exact plan at ``S'`` (scored on the grown instance,
        :func:`with_devices` of (instance, S'): ``result.evaluation`` is its), ``info``: ``stages`` (S'), ``devices`` (the devices it uses),
        ``added_devices``, ``per_device`` (s per microbatch, as above), ``exact`` (the exact
        method's status and bound at S'), ``tried`` (the S' values proven to have no fitting
        split); ``INFEASIBLE`` without a plan if no ``S'`` up to ``max_stages`` fits or the clock
        ran out first (``info["note"]`` says which; ``info["misses"]``: per S' tried, the bytes
        by which its best split misses the limit, :func:`~pipeopt.problems.partition.dp.least_overshoot`,
        where the dense DP's matrices fit and the stages are not replicated).
    """
    from ...backends.deadline import DeadlineReached
    from .auto import solve_auto
    from .dp import DENSE_LIMIT, dense_bytes, least_overshoot

    deadline = Deadline.of(time_limit)
    S, top = problem.stages, problem.n if max_stages is None else min(int(max_stages), problem.n)
    tried: list[int] = []
    misses: dict = {}
    first = ""
    for count in range(S, top + 1):
        inst = with_devices(problem.instance, count)
        try:
            deadline.check("no recompute, more stages")
            res = solve_auto(PartitionProblem(inst, count, problem.replication), time_limit=deadline, solver=solver,
                             seed=seed, threads=threads)
        except InfeasibleError as exc:
            tried.append(count)
            first = first or f"S' = {count}: {str(exc).splitlines()[0]}"
            grown = PartitionProblem(inst, count, problem.replication)
            if not grown.replication and dense_bytes(grown) <= DENSE_LIMIT:
                misses[count] = least_overshoot(grown)[0]
            continue
        except DeadlineReached as stop:
            return Result.scored(problem.instance, "no-recompute-more-stages", None, Status.INFEASIBLE,
                                 started=deadline.started, space=problem.space,
                                 info={"tried": tried, "note": f"stopped before a fitting S' was found: {stop}"})
        if res.plan is None:
            return Result.scored(problem.instance, "no-recompute-more-stages", None, Status.INFEASIBLE,
                                 started=deadline.started, space=problem.space,
                                 info={"tried": tried, "note": f"the exact method at S' = {count} ended {res.status}"})
        used = sum(len(st.devices) for st in res.plan.stages)
        info = {"stages": count, "devices": used, "added_devices": used - S,
                "per_device": res.objective * used / S, "tried": tried,
                "exact": {"method": res.method, "status": str(res.status), "lower_bound": res.lower_bound},
                "note": f"the exact plan without recomputation on {count} stages ({used} devices, {used - S} added); "
                        "compare per device: info['per_device']"}
        return Result.scored(inst, "no-recompute-more-stages", res.plan, Status.FEASIBLE, started=deadline.started,
                             space=res.space, info=info)
    return Result.scored(problem.instance, "no-recompute-more-stages", None, Status.INFEASIBLE,
                         started=deadline.started, space=problem.space,
                         info={"tried": tried, "misses": misses,
                               "note": f"no split fits without recomputation on {S}..{top} stages ({first})"})


def adapipe(
    problem: PartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
    threads: int = 2,
) -> Result:
    """AdaPipe's two steps (Sun et al., ASPLOS 2024): each stage's recomputation chosen to fit its
    memory ("adaptive recomputation"), then the split that balances the stages' computation
    ("flexible stage partitioning"), by a dynamic program over stages.

    1. **Per stage, a knapsack.** For a stage of units ``a..b-1`` at position s, keeping
       ``S - s`` microbatches in flight under 1F1B, the recomputed layers that add the fewest
       seconds with its memory fitting the device: the exact per-stage choice of
       :class:`~pipeopt.problems.partition.recompute.RecomputeModel` (``extra``; none, full and,
       where profiled, selective per layer).
    2. **Partition DP.** The split minimising the largest stage **computation**: forward +
       backward seconds on one device plus the recomputation of step 1 (a min-max DP over
       stages, :func:`~pipeopt.problems.partition.recompute.min_max_overshoot`), each stage's
       recompute set then read back (:meth:`PartitionProblem.stage_recompute`).

    Relative to pipeopt's exact DP (``dp`` with ``recompute="auto"``) this restricts one thing:
    the partition step balances computation only, as AdaPipe's stated goal is ("balance the
    computation between different stages"); the transfers between stages, the 1F1B window
    rows, the message latency and stage overhead and ZeRO's collectives, which the exact DP
    puts in each stage's time, are not in its objective (the plan is scored with all of them by
    :func:`pipeopt.evaluate`). Where those terms are zero the two are the same DP and reach the
    same optimum (the tests check it): pipeopt's exact method *is* AdaPipe's decomposition, with
    the per-stage knapsack solved exactly on Pareto frontiers instead of a knapsack over a
    discretised memory budget. Replication is not modelled (one device per stage).

    Parameters
    ----------
    problem
        The partition problem (its ``recompute`` is ignored: the method chooses).
    time_limit
        Seconds or a :class:`~pipeopt.backends.deadline.Deadline` (the frontiers check it).
    solver, seed, threads
        Unused (the common method signature).

    Returns
    -------
    Result
        ``FEASIBLE`` (space :data:`RECOMPUTE_SPACE` if the plan recomputes), no bound; ``info``:
        ``computation`` (the largest stage's seconds in its own objective); ``INFEASIBLE``
        without a plan and ``info["note"]`` if no split fits with any recomputation.

    Raises
    ------
    InvalidProblemError
        With ``replication``.

    References
    ----------
    Z. Sun, H. Cao, Y. Wang, G. Feng, S. Chen, H. Wang, W. Chen, "AdaPipe: Optimizing Pipeline
    Parallelism with Adaptive Recomputation and Partitioning", ASPLOS 2024,
    doi:10.1145/3620666.3651359 (its abstract: adaptive recomputation to maximise memory
    utilisation and reduce each stage's computation cost; a flexible stage partitioning to
    balance the computation between stages).
    """
    from .recompute import min_max_overshoot

    deadline = Deadline.of(time_limit)
    if problem.replication:
        raise InvalidProblemError("adapipe: one device per stage (AdaPipe does not replicate stages)")
    S = problem.stages
    auto = PartitionProblem(problem.instance, S, recompute="auto")
    rc = auto.recomputation
    flight = [auto.in_flight(s) for s in range(S)]
    rc.prepare(sorted(set(flight)), deadline)
    wp = np.asarray(auto.work_prefix, dtype=float)
    n = auto.n
    j, i = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    work = np.where(j > i, wp[j] - wp[np.minimum(i, j)], np.inf)  # end-major: work[j, i] of units i..j-1
    value, starts = min_max_overshoot([work + rc.extra(k) for k in flight], S)
    if not np.isfinite(value):
        return Result.scored(problem.instance, "adapipe", None, Status.INFEASIBLE, started=deadline.started,
                             space=RECOMPUTE_SPACE, info={"note": "no split fits with any recomputation"})
    plan = auto.plan(starts)
    info = {"computation": float(value), "starts": [int(c) for c in starts],
            "source": "Sun et al., AdaPipe, ASPLOS 2024: per-stage recompute knapsack, min-max computation DP"}
    return _result(problem, "adapipe", plan, deadline.started, info)


RECOMPUTE_BASELINES = ("megatron-full-uniform", "megatron-block", "torchtitan-every-k", "no-recompute",
                       "no-recompute-more-stages", "adapipe")
"""The method names this module registers for the partition problem."""
