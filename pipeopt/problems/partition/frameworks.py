"""The default splits of torchtitan, Megatron-LM and PiPPy: what their users get without a planner.

All three count the *blocks* of a model built as "modules before, a container of identical
blocks, modules after" (a GPT: embeddings, ``layers.0 .. layers.{L-1}``, final norm and LM
head) and ignore what the blocks and the modules around them cost. They apply to graphs of
:func:`pipeopt.torch.from_torch` profiled at a ``container:NAME`` granularity (graph attribute
``torch`` with a ``container``): the container's children are the blocks, the layers before
the first block (in execution order, the graph's node order) go with stage 0, the layers
after the last block with stage S - 1. Any other graph is refused with
:class:`~pipeopt.errors.InvalidProblemError`. Each split is scored by
:func:`pipeopt.evaluate` like every plan.

* :func:`torchtitan` -- ``generate_llm_fqn_per_model_part`` (torchtitan v0.2.2,
  ``torchtitan/distributed/pipeline_parallel.py``): the embedding counts as
  ``input_weight`` blocks and norm + head as ``output_weight`` blocks (the config's
  ``pipeline_parallel_first_stage_less_layers`` / ``..._last_stage_less_layers``, default
  1 each); ``L + input_weight + output_weight`` effective blocks are dealt evenly, the first
  ``(L + in + out) mod S`` stages one more; the first stage gives ``input_weight`` of its
  share to the embedding, the last ``output_weight`` to norm + head.
  (:func:`torchtitan_blocks`.)
* :func:`megatron` -- Megatron-Core's ``get_num_layers_to_build`` (core_v0.19.0,
  ``megatron/core/transformer/transformer_block.py``) without a custom layout: ``L / S``
  blocks per stage, which must divide (Megatron asserts), the embedding on the first stage
  and the output layer on the last; with ``account_for_embedding`` /
  ``account_for_loss`` (``--account-for-embedding-in-pipeline-split``, ...) the embedding
  or the loss counts as one block and ``L + 1`` (or ``L + 2``) must divide by S; or uneven
  ``first`` / ``last`` stage block counts (``--decoder-first-pipeline-num-layers``, ...), the
  rest dealt evenly. (:func:`megatron_blocks`.)
* :func:`pippy` -- the split of PiPPy's and torch.distributed.pipelining's examples
  (``examples/huggingface/pippy_bert.py``: ``layers_per_rank = num_layers // world_size``,
  a ``SplitPoint.BEGINNING`` at ``layers.{i * layers_per_rank}`` for i = 1 .. S - 1): equal
  block counts, the remainder on the last stage. (:func:`pippy_blocks`.)

References
----------
torchtitan, github.com/pytorch/torchtitan, v0.2.2 (2026-02-20) (BSD-3-Clause).
Megatron-LM, github.com/NVIDIA/Megatron-LM, core_v0.19.0 (2026-08-19); Shoeybi et al.,
Megatron-LM, arXiv:1909.08053; Narayanan et al., SC 2021, arXiv:2104.04473.
PiPPy, github.com/pytorch/PiPPy (commit 1bcb2bf, 2024-08-21) (BSD-3-Clause).
"""

from __future__ import annotations

import networkx as nx

from ...backends.deadline import Deadline
from ...errors import InvalidProblemError
from ...result import Result, Status
from .. import spaces
from .problem import PartitionProblem


# ---------------------------------------------------------------------------------------
# The model's three parts
# ---------------------------------------------------------------------------------------
def block_of(name: str, container: str | None) -> str | None:
    """The container child (``"layers.3"``) that ``name`` is or lies in, or ``None``."""
    if container is None or not name.startswith(container + "."):
        return None
    return f"{container}.{name[len(container) + 1:].split('.', 1)[0]}"


def around_container(order, container: str | None) -> tuple[list, list, list]:
    """``(before, blocks, after)`` of a model whose layers run in ``order``: the names before
    the container's first block, the container's blocks (children, in order), the names after
    its last block.

    Parameters
    ----------
    order
        Layer names (module FQNs) in execution order.
    container
        The container's FQN (``"layers"``).

    Raises
    ------
    InvalidProblemError
        If there is no container, no layer in it, or a layer outside it runs between two of
        its blocks.
    """
    order = [str(n) for n in order]
    if container is None:
        raise InvalidProblemError("the model has no container of blocks (e.g. 'layers.0', 'layers.1', ...)")
    inside = [i for i, n in enumerate(order) if block_of(n, container) is not None]
    if not inside:
        raise InvalidProblemError(f"no layer of the model lies in its container {container!r}")
    lo, hi = inside[0], inside[-1]
    stray = [n for n in order[lo:hi + 1] if block_of(n, container) is None]
    if stray:
        raise InvalidProblemError(
            f"{stray[0]!r} runs between blocks of {container!r}: the model is not 'modules before, the "
            "container's blocks, modules after'"
        )
    blocks = list(dict.fromkeys(block_of(n, container) for n in order[lo:hi + 1]))
    return order[:lo], blocks, order[hi + 1:]


def torch_parts(graph: nx.DiGraph, rule: str) -> tuple[list, list, list]:
    """:func:`around_container` of a graph of :func:`pipeopt.torch.from_torch` at a
    ``container:NAME`` granularity, each block a single layer.

    Raises
    ------
    InvalidProblemError
        Naming ``rule``, if the graph has no ``torch`` attribute with a container, or a block
        is not one layer (a leaf-module profile).
    """
    meta = graph.graph.get("torch") or {}
    container = meta.get("container")
    if not container:
        raise InvalidProblemError(
            f"{rule}'s default split counts the blocks of a container: it applies to a model profiled with "
            "pipeopt.torch.from_torch(..., granularity='container:NAME') (graph attribute 'torch' with a "
            f"container); this graph has {'no torch provenance' if not meta else 'no container'}"
        )
    try:
        before, blocks, after = around_container(list(graph.nodes), container)
    except InvalidProblemError as exc:
        raise InvalidProblemError(f"{rule}: {exc}") from None
    missing = [b for b in blocks if b not in graph]
    if missing:
        raise InvalidProblemError(f"{rule}: block {missing[0]!r} is not one layer of the graph (profile at "
                                  f"granularity container:{container})")
    return before, blocks, after


# ---------------------------------------------------------------------------------------
# The frameworks' rules: blocks per stage
# ---------------------------------------------------------------------------------------
def torchtitan_blocks(num_stages: int, num_layers: int, input_weight: int = 1, output_weight: int = 1) -> list[int]:
    """Blocks per stage of torchtitan's ``generate_llm_fqn_per_model_part``.

    Examples
    --------
    >>> torchtitan_blocks(2, 8)        # 10 effective layers, 5 each; embedding and head count 1
    [4, 4]
    >>> torchtitan_blocks(4, 8)        # 10 = 3 + 3 + 2 + 2
    [2, 3, 2, 1]

    Raises
    ------
    InvalidProblemError
        Where torchtitan raises ``ValueError`` (the same messages): fewer effective layers
        than stages, an empty stage, a weight above the smallest stage's share.
    """
    if num_stages < 1:
        raise InvalidProblemError("Number of stages must be at least 1")
    if num_stages == 1:
        return [num_layers]
    effective = num_layers + input_weight + output_weight
    if num_stages > effective:
        raise InvalidProblemError(
            f"Number of stages ({num_stages}) cannot be greater than effective layers ({effective})")
    per, extra = divmod(effective, num_stages)
    if per == 0:
        raise InvalidProblemError(f"Configuration would result in empty stages ({num_stages} stages, "
                                  f"{effective} effective layers)")
    if input_weight > per:
        raise InvalidProblemError(f"input_weight ({input_weight}) exceeds minimum layers per stage ({per}).")
    if output_weight > per:
        raise InvalidProblemError(f"output_weight ({output_weight}) exceeds minimum layers per stage ({per}).")
    counts, current = [], 0
    for s in range(num_stages):
        share = per + (1 if s < extra else 0)
        if s == 0:
            share -= input_weight
        elif s == num_stages - 1:
            share -= output_weight
        take = max(0, min(share, num_layers - current))  # torchtitan's "if current_layer < num_layers"
        counts.append(take)
        current += take
    return counts


def megatron_blocks(
    num_stages: int,
    num_layers: int,
    *,
    account_for_embedding: bool = False,
    account_for_loss: bool = False,
    first: int | None = None,
    last: int | None = None,
) -> list[int]:
    """Blocks per stage of Megatron-Core's ``get_num_layers_to_build`` (no virtual stages).

    Examples
    --------
    >>> megatron_blocks(2, 8)
    [4, 4]
    >>> megatron_blocks(3, 8, account_for_embedding=True)   # 9 / 3, the first stage gives one to E
    [2, 3, 3]

    Raises
    ------
    InvalidProblemError
        Where Megatron asserts: the (augmented) block count does not divide by S, uneven
        first/last counts combined with ``account_for_*``, the remaining blocks not divisible
        by the middle stages, or a stage left with a negative count.
    """
    if first is not None or last is not None:
        if account_for_embedding or account_for_loss:
            raise InvalidProblemError(
                "Does not support standalone embedding stage and standalone loss stage with uneven pp")
        rest, left = num_layers, num_stages
        if first is not None:
            rest, left = rest - first, left - 1
        if last is not None:
            rest, left = rest - last, left - 1
        if left > 0 and rest % left:
            raise InvalidProblemError("With uneven pipelineing the left over layers must be divisible by left over stages")
        per = rest // left if left > 0 else 0
        counts = [per] * num_stages
        if first is not None:
            counts[0] = first
        if last is not None:
            counts[-1] = last
    else:
        total = num_layers + int(account_for_embedding) + int(account_for_loss)
        if total % num_stages:
            raise InvalidProblemError(f"num_layers={total} should be divisible by "
                                      f"pipeline_model_parallel_size={num_stages} (Megatron-Core asserts)")
        counts = [total // num_stages] * num_stages
        if account_for_embedding:
            counts[0] -= 1
        if account_for_loss:
            counts[-1] -= 1
    if min(counts) < 0 or sum(counts) != num_layers:
        raise InvalidProblemError(f"Megatron's split {counts} does not build the {num_layers} layers")
    return counts


def pippy_blocks(num_stages: int, num_layers: int) -> list[int]:
    """Blocks per stage of the PiPPy examples' split: ``num_layers // S`` each, the rest on the
    last stage.

    >>> pippy_blocks(3, 8)
    [2, 2, 4]

    Raises
    ------
    InvalidProblemError
        If there are fewer blocks than stages (a split point would repeat).
    """
    per = num_layers // num_stages
    if per == 0:
        raise InvalidProblemError(f"{num_layers} blocks cannot be split over {num_stages} stages")
    return [per] * (num_stages - 1) + [num_layers - per * (num_stages - 1)]


# ---------------------------------------------------------------------------------------
# Methods
# ---------------------------------------------------------------------------------------
def _framework_result(problem: PartitionProblem, name: str, counts: list[int], started: float, info: dict) -> Result:
    """Blocks per stage -> a plan over the chain: before with stage 0, after with stage S - 1.

    Raises
    ------
    InvalidProblemError
        If the counts leave a stage empty (no embedding or head to fill it), or the stages are
        not contiguous in pipeopt's chain order.
    """
    graph = problem.instance.graph
    before, blocks, after = torch_parts(graph, name)
    if len(counts) != problem.stages or sum(counts) != len(blocks):
        raise InvalidProblemError(f"{name}: {counts} blocks per stage for {len(blocks)} blocks, S = {problem.stages}")
    stage_of = {n: 0 for n in before}
    k = 0
    for s, c in enumerate(counts):
        for b in blocks[k:k + c]:
            stage_of[b] = s
        k += c
    stage_of.update({n: problem.stages - 1 for n in after})
    used = set(stage_of.values())
    empty = [s for s in range(problem.stages) if s not in used]
    if empty:
        raise InvalidProblemError(f"{name} leaves stage(s) {empty} empty ({counts} blocks per stage)")
    units = problem.instance.chain.units
    seq = [stage_of[str(u[0])] for u in units]
    if any(b < a for a, b in zip(seq, seq[1:])):
        raise InvalidProblemError(f"{name}: its stages are not contiguous in pipeopt's layer order")
    starts = [i for i in range(1, len(seq)) if seq[i] != seq[i - 1]]
    plan = problem.plan(starts)
    info = {**info, "blocks_per_stage": list(counts), "before": before, "after": after}
    return problem.result(name, plan, Status.FEASIBLE, started=started, space=spaces.ONE_ORDER, info=info)


def torchtitan(
    problem: PartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
    threads: int = 2, input_weight: int = 1, output_weight: int = 1,
) -> Result:
    """torchtitan's default split (``generate_llm_fqn_per_model_part``, :func:`torchtitan_blocks`).

    Parameters
    ----------
    problem
        A partition problem on a graph of :func:`pipeopt.torch.from_torch` at a container
        granularity.
    time_limit, solver, seed, threads
        Unused (the common method signature; ``time_limit`` starts the runtime clock).
    input_weight, output_weight
        torchtitan's ``pipeline_parallel_first_stage_less_layers`` and
        ``pipeline_parallel_last_stage_less_layers`` (default 1).

    Returns
    -------
    Result
        Status ``FEASIBLE`` (``INFEASIBLE`` if it breaks memory), no bound, space
        ``"one-order"``; ``info["blocks_per_stage"]``.

    Raises
    ------
    InvalidProblemError
        On a graph without torch provenance and container, or where torchtitan raises.
    """
    started = Deadline.of(time_limit).started
    _, blocks, _ = torch_parts(problem.instance.graph, "torchtitan")
    counts = torchtitan_blocks(problem.stages, len(blocks), input_weight, output_weight)
    return _framework_result(problem, "torchtitan", counts, started,
                             {"input_weight": input_weight, "output_weight": output_weight})


def megatron(
    problem: PartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
    threads: int = 2, account_for_embedding: bool = False, account_for_loss: bool = False,
    first: int | None = None, last: int | None = None,
) -> Result:
    """Megatron-LM's default split (``get_num_layers_to_build``, :func:`megatron_blocks`).

    Parameters
    ----------
    problem
        A partition problem on a graph of :func:`pipeopt.torch.from_torch` at a container
        granularity.
    time_limit, solver, seed, threads
        Unused (the common method signature).
    account_for_embedding, account_for_loss, first, last
        Megatron's ``--account-for-embedding-in-pipeline-split``,
        ``--account-for-loss-in-pipeline-split``, ``--decoder-first-pipeline-num-layers``,
        ``--decoder-last-pipeline-num-layers``.

    Returns
    -------
    Result
        As :func:`torchtitan`.

    Raises
    ------
    InvalidProblemError
        On a graph without torch provenance and container, or where Megatron asserts (L not
        divisible by S).
    """
    started = Deadline.of(time_limit).started
    _, blocks, _ = torch_parts(problem.instance.graph, "megatron")
    counts = megatron_blocks(problem.stages, len(blocks), account_for_embedding=account_for_embedding,
                             account_for_loss=account_for_loss, first=first, last=last)
    return _framework_result(problem, "megatron", counts, started,
                             {"account_for_embedding": account_for_embedding, "account_for_loss": account_for_loss,
                              "first": first, "last": last})


def pippy(
    problem: PartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc", seed: int = 0,
    threads: int = 2,
) -> Result:
    """The PiPPy / torch.distributed.pipelining examples' equal split (:func:`pippy_blocks`).

    Parameters and Returns as :func:`torchtitan`.

    Raises
    ------
    InvalidProblemError
        On a graph without torch provenance and container, or fewer blocks than stages.
    """
    started = Deadline.of(time_limit).started
    _, blocks, _ = torch_parts(problem.instance.graph, "pippy")
    return _framework_result(problem, "pippy", pippy_blocks(problem.stages, len(blocks)), started, {})
