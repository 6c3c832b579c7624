"""What every exporter needs from a plan: its stages as module FQNs in the order the model runs
them, checked once against what *every* runtime requires.

A plan names layers; for a graph made by :func:`pipeopt.torch.from_torch` the layer names are
module FQNs (``tok_emb``, ``layers.0``, ..., ``head``; or leaf modules such as
``layers.0.attn.qkv``) and the graph attribute ``torch`` records the provenance (model class,
granularity, the container whose children are the repeated blocks). :class:`ModelLayout` is
that knowledge in one place: the layers in execution order and the container. Without a
graph it is read off the plan itself (its stages in order, each stage's layers as listed; the
container is the prefix ``P`` of the most ``P.<index>`` names).

:func:`split_stages` applies the rules no runtime of pipeopt's four targets can relax (each
violation raises :class:`~pipeopt.errors.UnsupportedPlanError` naming the runtime and the
problem):

* every stage non-empty, every layer in exactly one stage, every layer known to the graph;
* no Bi-Partition (a layer's backward runs where its forward ran, in all four runtimes);
* no split execution (a forward share ``beta`` of a worker: the runtimes run a stage's
  forward and backward passes one after the other on the whole device);
* replication: either none or the same count m on every stage, exported as a data-parallel
  degree m (each runtime has one data-parallel degree for all pipeline stages; PipeDream's
  per-stage replication cannot be expressed);
* each stage a contiguous run of the execution order, stages in pipeline order (a runtime
  passes one stage's outputs to the next; none can run stage 1's layers between two of stage
  0's);
* names are module FQNs and no name is inside another (``layers.0`` and ``layers.0.mlp`` in
  one plan is not one granularity).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import networkx as nx

from ..errors import InvalidProblemError, UnsupportedPlanError
from ..graph import layer_order
from ..plan import Plan
from ..problems.partition.frameworks import around_container, block_of

FQN = re.compile(r"[^.\s]+(?:\.[^.\s]+)*\Z")
"""A module's fully qualified name as ``nn.Module.named_modules`` writes it: dot-separated
non-empty names without spaces (a ``ModuleDict`` key may hold ``-`` or other characters)."""


@dataclass(frozen=True)
class ModelLayout:
    """The model as the exporters see it.

    Attributes
    ----------
    order
        ``tuple[str, ...]``: layer names (module FQNs) in the order the model's ``forward``
        runs them.
    container
        Name of the container whose children are the repeated blocks (``"layers"``), or
        ``None`` if there is none.
    container_type
        Class name of the container (``"ModuleList"``, ``"Sequential"``), ``None`` if unknown.
    granularity
        The profile's granularity as recorded by ``from_torch`` (``None`` if unknown).
    source
        How ``order`` was obtained (one line, copied into every export's ``notes``).
    edges
        ``tuple[(str, str), ...]``: the layer graph's edges, empty without a graph.
    ops
        ``dict[str, str]``: each layer's module class (node attribute ``op`` of
        ``from_torch``), empty if unknown.
    tied
        ``tuple[dict, ...]``: the parameters several layers use (graph attribute ``tied`` of
        ``from_torch``: ``name``, ``aliases``, ``bytes``, ``layers``), empty if none.
    """

    order: tuple
    container: str | None = None
    container_type: str | None = None
    granularity: str | None = None
    source: str = ""
    edges: tuple = field(default=(), repr=False)
    ops: dict = field(default_factory=dict, repr=False)
    tied: tuple = field(default=(), repr=False)

    @classmethod
    def of(cls, plan: Plan, graph: nx.DiGraph | None = None, module=None) -> ModelLayout:
        """The layout of the model a plan was made for.

        Parameters
        ----------
        plan
            The plan (used alone when ``graph`` is ``None``).
        graph
            The instance's layer graph, or ``None``. With a ``torch`` graph attribute (a graph
            of :func:`pipeopt.torch.from_torch`) its node order is the execution order (the
            profiler adds the modules in the order they run); otherwise pipeopt's
            deterministic :func:`~pipeopt.graph.layer_order`.
        module
            The ``nn.Module`` itself, or ``None``: only read for the container's class.

        Returns
        -------
        ModelLayout
        """
        if graph is None:
            order = tuple(str(x) for st in plan.stages for x in st.layers)
            container = _guess_container(order)
            ctype = _container_type(module, container)
            return cls(order, container, ctype, None,
                       "no instance given: the plan's own layer order is taken as the model's execution order")
        meta = graph.graph.get("torch") or {}
        nodes = list(graph.nodes)
        if meta and _is_topological(graph, nodes):
            order, source = nodes, "execution order of the profiled model (the graph's node order)"
        else:
            order, source = layer_order(graph), "pipeopt's layer order of the graph (no torch provenance)"
        order = tuple(str(x) for x in order)
        container = meta.get("container") or _guess_container(order)
        ctype = meta.get("container_type") or _container_type(module, container)
        ops = {str(n): str(op) for n, op in graph.nodes(data="op") if op is not None}
        tied = tuple(dict(t) for t in graph.graph.get("tied") or () if isinstance(t, dict))
        return cls(order, container, ctype, meta.get("granularity"), source,
                   tuple((str(u), str(v)) for u, v in graph.edges), ops, tied)

    # ---- the three parts of a model built around a container of blocks ------------------------
    def block_of(self, name: str) -> str | None:
        """The container child (``"layers.3"``) that ``name`` is or lies in, or ``None``."""
        return block_of(name, self.container)

    def parts(self) -> tuple[list, list, list]:
        """``(before, blocks, after)``: names run before the container's first child, the
        container's children (blocks) in order, names run after its last one
        (:func:`pipeopt.problems.partition.frameworks.around_container`).

        Raises
        ------
        UnsupportedPlanError
            If there is no container, or a name outside the container runs between two of
            its children.
        """
        try:
            return around_container(self.order, self.container)
        except InvalidProblemError as exc:
            raise UnsupportedPlanError(str(exc)) from None


def _is_topological(graph: nx.DiGraph, nodes: list) -> bool:
    pos = {n: i for i, n in enumerate(nodes)}
    return all(pos[u] < pos[v] for u, v in graph.edges)


def _guess_container(order) -> str | None:
    """The prefix P of the most names of the form ``P.<index>[...]``, or ``None``."""
    counts: Counter = Counter()
    for name in order:
        parts = name.split(".")
        for i in range(len(parts) - 1):
            if parts[i + 1].isdigit():
                counts[".".join(parts[: i + 1])] += 1
                break
    if not counts:
        return None
    return counts.most_common(1)[0][0]


def _container_type(module, container: str | None) -> str | None:
    if module is None or container is None:
        return None
    try:
        return type(module.get_submodule(container)).__name__
    except AttributeError:
        return None


@dataclass(frozen=True)
class StageSplit:
    """A plan checked for the runtimes: stages in pipeline order, names in execution order.

    Attributes
    ----------
    stages
        ``tuple[tuple[str, ...], ...]``.
    data_parallel
        Replicas of every stage (the runtimes' data-parallel degree), 1 without replication.
    layout
        The :class:`ModelLayout` the stages were checked against.
    """

    stages: tuple
    data_parallel: int
    layout: ModelLayout

    @property
    def num_stages(self) -> int:
        """S."""
        return len(self.stages)

    def notes(self) -> list[str]:
        """What the export assumed, one line each."""
        out = [self.layout.source]
        if self.data_parallel > 1:
            out.append(f"every stage is replicated {self.data_parallel} times: data-parallel degree "
                       f"{self.data_parallel} beside pipeline degree {self.num_stages}")
        return out


def split_stages(plan: Plan, layout: ModelLayout, runtime: str) -> StageSplit:
    """Check ``plan`` against the rules every runtime shares (module docstring) and order it.

    Parameters
    ----------
    plan
        The plan.
    layout
        The model's layout (:meth:`ModelLayout.of`).
    runtime
        The runtime's name, for the messages (``"torch.distributed.pipelining"``, ...).

    Returns
    -------
    StageSplit

    Raises
    ------
    UnsupportedPlanError
        Naming the runtime, the stage and the layer, for each rule of the module docstring.
    """
    if not isinstance(plan, Plan) or plan.num_stages == 0:
        raise UnsupportedPlanError(f"{runtime}: the plan has no stages")
    where = f"{runtime} cannot run this plan"
    for i, st in enumerate(plan.stages):
        if not st.layers:
            raise UnsupportedPlanError(f"{where}: stage {i} is empty")
        if st.bwd_layers is not None and set(st.bwd_layers) != set(st.layers):
            raise UnsupportedPlanError(
                f"{where}: stage {i} runs the backward pass of other layers than its forward pass "
                f"(Bi-Partition); {runtime} runs a layer's backward on the stage that ran its forward"
            )
        if st.beta is not None:
            raise UnsupportedPlanError(
                f"{where}: stage {i} splits its worker between the forward and the backward pass "
                f"(split execution, beta={st.beta}); {runtime} runs them one after the other on the "
                "whole device. Export a plan of the partition problem."
            )
    replicas = {st.replicas for st in plan.stages}
    if len(replicas) > 1:
        counts = [st.replicas for st in plan.stages]
        raise UnsupportedPlanError(
            f"{where}: its stages have different replica counts {counts} (PipeDream's replication); "
            f"{runtime} has one data-parallel degree for all pipeline stages"
        )
    position = {name: i for i, name in enumerate(layout.order)}
    owner: dict = {}
    for i, st in enumerate(plan.stages):
        for name in st.layers:
            name = str(name)
            if name in owner:
                raise UnsupportedPlanError(f"{where}: layer {name!r} is in stage {owner[name]} and stage {i}")
            if name not in position:
                raise UnsupportedPlanError(f"{where}: layer {name!r} of stage {i} is not a layer of the model")
            if not FQN.match(name):
                raise UnsupportedPlanError(
                    f"{where}: layer {name!r} is not a module FQN (the runtimes address modules by "
                    "their dotted names, e.g. 'layers.0'); profile the model with pipeopt.torch.from_torch"
                )
            owner[name] = i
    missing = [n for n in layout.order if n not in owner]
    if missing:
        raise UnsupportedPlanError(
            f"{where}: layer(s) {missing[:3]} of the model are in no stage ({len(missing)} missing)"
        )
    names = sorted(owner)
    for a, b in zip(names, names[1:]):
        if b.startswith(a + "."):
            raise UnsupportedPlanError(
                f"{where}: the plan names both {a!r} and {b!r}, a module and one of its own submodules"
            )
    stage_of = [owner[n] for n in layout.order]
    for k in range(1, len(stage_of)):
        if stage_of[k] < stage_of[k - 1]:
            later, earlier = layout.order[k], layout.order[k - 1]
            raise UnsupportedPlanError(
                f"{where}: stage {stage_of[k]} is not a contiguous run of the model's execution order: "
                f"{later!r} (stage {stage_of[k]}) runs after {earlier!r} (stage {stage_of[k - 1]})"
            )
    stages = tuple(tuple(n for n in layout.order if owner[n] == i) for i in range(plan.num_stages))
    return StageSplit(stages, replicas.pop(), layout)


def shared_parameters(split: StageSplit) -> list[dict]:
    """Which stages share which parameter: each tied parameter of the layout with the stages
    that hold one of its layers.

    Returns
    -------
    list[dict]
        ``[{"name", "aliases", "bytes", "layers", "stages"}]`` (``stages``: sorted stage
        indices; two or more when the plan puts the tie's users on several stages), empty
        when the graph records no ties.
    """
    owner = {n: i for i, st in enumerate(split.stages) for n in st}
    out = []
    for tie in split.layout.tied:
        layers = [str(n) for n in tie.get("layers", ())]
        out.append({"name": str(tie.get("name", "")), "aliases": [str(a) for a in tie.get("aliases", ())],
                    "bytes": float(tie.get("bytes", 0.0)), "layers": layers,
                    "stages": sorted({owner[n] for n in layers if n in owner})})
    return out


SHARED_HOW = {
    "torch.distributed.pipelining": "pipeline() replicates it into every stage that uses it "
                                    "(MultiUseParameterConfig.REPLICATE in _IR.py: the module holding it is then "
                                    "listed in each of those stages) and does not synchronise the copies: sum "
                                    "their gradients (an all-reduce between those stages) before every optimizer "
                                    "step",
    "torchtitan": "pipeline_module_split deep-copies the model for each part, so each part keeps its own "
                  "copy; sum the copies' gradients between those stages before every optimizer step",
    "Megatron-LM": "Megatron ties the word embedding and the output layer itself unless "
                   "--untie-embeddings-and-output-weights is set (LanguageModule."
                   "setup_embeddings_and_output_layer: a copy on the last stage, gradients all-reduced over "
                   "the embedding group)",
    "DeepSpeed PipelineModule": "declare the layers that use it as TiedLayerSpec(key, ..., tied_weight_attr=...) "
                                "with one key: PipelineModule then all-reduces the tied gradient between the "
                                "stages (allreduce_tied_weight_gradients)",
}
"""How each runtime keeps a parameter shared by two stages in step (one sentence each)."""


def shared_notes(shared: list[dict], runtime: str) -> list[str]:
    """One note per parameter that the plan's stages share: which stages, and what the runtime
    needs (:data:`SHARED_HOW`)."""
    out = []
    for t in shared:
        if len(t["stages"]) > 1:
            names = " = ".join([t["name"], *t["aliases"]])
            out.append(f"parameter {names} ({t['bytes'] / 2**20:.3g} MiB) is used by layers {', '.join(t['layers'])} "
                       f"on stages {t['stages']}: {SHARED_HOW.get(runtime, 'keep the copies in step')}")
    return out


def plan_ranks(plan: Plan) -> int | None:
    """The pipeline ranks a plan's stages run on: its order's (``plan.schedule["ranks"]``), else
    its distinct device lists (chunks of one rank list the same devices, as
    :func:`pipeopt.schedules.chunk_plan` makes them), or ``None`` if some stage lists none."""
    if isinstance(plan.schedule, dict) and isinstance(plan.schedule.get("ranks"), int):
        return plan.schedule["ranks"]
    if not plan.stages or not all(st.devices for st in plan.stages):
        return None
    return len({tuple(st.devices) for st in plan.stages})


def one_stage_per_rank(plan: Plan, runtime: str, why: str, ranks: int | None = None, name: str = "") -> None:
    """Refuse, for a runtime that runs one stage per rank, a plan with several stages (chunks)
    on a rank.

    Parameters
    ----------
    plan
        The plan.
    runtime, why
        The runtime's name and why it cannot (one sentence), for the message.
    ranks
        The plan's ranks if known otherwise (a schedule named at export); default
        :func:`plan_ranks`.
    name
        The plan's schedule, for the message.

    Raises
    ------
    UnsupportedPlanError
        If the plan has fewer ranks than stages.
    """
    ranks = plan_ranks(plan) if ranks is None else ranks
    if ranks is not None and ranks < plan.num_stages:
        raise UnsupportedPlanError(
            f"{why}. This plan puts {plan.num_stages} stages (chunks) on {ranks} ranks"
            f"{f' ({name}, ' if name else ' ('}{plan.num_stages // max(ranks, 1)} per rank): export it to torch-csv or "
            "torchtitan, which run it, or solve with a one-stage-per-rank schedule"
        )



# ---- activation recomputation: what the runtimes checkpoint -----------------------------------
def recomputed_blocks(plan: Plan, split: StageSplit, runtime: str) -> list[list[str | None]] | None:
    """The plan's recompute set (``Stage.recompute``) as the runtimes see it: per stage, per
    block (a container child, ``layers.3``) of the stage in execution order, its recompute mode
    (``"full"``, ``"selective"``) or ``None`` (its activations kept).

    Megatron-LM and torchtitan checkpoint whole transformer layers only (Megatron's
    ``_checkpointed_forward`` and torchtitan's ``apply_ac`` walk the layers of the decoder /
    the ``layers`` container), so a recomputed name that is not a block is refused.

    Parameters
    ----------
    plan
        The plan (its stages in pipeline order, as ``split``'s).
    split
        :func:`split_stages` of the plan.
    runtime
        The runtime's name, for the messages.

    Returns
    -------
    list[list[str | None]] or None
        ``None`` when no stage recomputes anything.

    Raises
    ------
    UnsupportedPlanError
        If a recomputed layer is not one of the container's blocks (an embedding, the head, a
        module inside a block), or the model has no container of blocks.
    """
    if not any(st.recompute for st in plan.stages):
        return None
    where = f"{runtime} cannot express this plan's recomputation"
    if split.layout.container is None:
        raise UnsupportedPlanError(f"{where}: the model has no container of transformer blocks; {runtime} "
                                   "checkpoints whole transformer layers")
    out = []
    for i, (st, names) in enumerate(zip(plan.stages, split.stages)):
        rc = {str(k): v for k, v in (st.recompute or {}).items()}
        for name in rc:
            if split.layout.block_of(name) != name:
                raise UnsupportedPlanError(
                    f"{where}: stage {i} recomputes {name!r}, which is not a transformer block of "
                    f"{split.layout.container!r}; {runtime} checkpoints whole transformer layers only")
        out.append([rc.get(n) for n in names if split.layout.block_of(n) == n])
    return out


def block_ids(split: StageSplit, flags: list[list[bool]]) -> list[int]:
    """The 0-based indices, in model order, of the flagged blocks (per stage, per block of the
    stage: :func:`recomputed_blocks` turned to booleans)."""
    out, k = [], 0
    for st in flags:
        out += [k + j for j, f in enumerate(st) if f]
        k += len(st)
    return out
