"""Export to Megatron-LM's ``pipeline_model_parallel_layout``.

Megatron-Core describes a custom pipeline split of a GPT model as a string over four layer
kinds: ``E`` the embedding (word and position embeddings, one module), ``t`` a transformer
decoder layer, ``m`` a multi-token-prediction layer, ``L`` the loss (the final layer norm,
the output layer and the loss). Stages are separated by ``|``; ``x*n`` repeats a character,
``(...)*n`` a group; commas are cosmetic. ``"E,t*4|t*3,L"`` is two stages: the embedding
and four layers, then three layers and the loss. With pipeline size P (no virtual stages) the
string has exactly P stages; Megatron checks that the flattened layout starts with ``E``, ends
with ``L``, holds each once and holds ``num_layers`` ``t``'s.

So a pipeopt plan of a decoder profiled at the granularity of its blocks maps to a layout when
the modules before the blocks (the embeddings) sit in one stage, the modules after them (final
norm, head) in one stage, and every name is a whole block. Rejected, naming the problem:

* a model without a container of blocks, or with nothing before or after it, or (when the
  graph records the module classes) without an ``nn.Embedding`` before its blocks or with
  blocks of several classes: the layout describes a GPT, not a CNN;
* a cut between the embeddings (``tok_emb`` in one stage, ``pos_emb`` in the next: Megatron's
  embedding is one module) or between the final norm and the head (without MTP layers the
  final layer norm is built on the stage that holds ``L``);
* a name inside a block (``layers.3.mlp``): ``t`` is a whole transformer layer;
* several stages (chunks) per rank (an interleaved or V plan of the schedule problem): the
  layout would need Megatron's virtual pipeline stages, which place chunks in a loop and run
  Megatron's own interleaved order, so the export would not say what the plan runs; a plan
  with one stage per rank and its own order (a free order) is exported with a note that
  Megatron runs its 1F1B order on that split;
* the rules every runtime shares (:mod:`pipeopt.export.layout`).

:func:`parse_layout` is a transcription of Megatron's parser and checks
(``PipelineParallelLayerLayout.parse_str_to_list``, ``__init__``, ``validate_layer_layout``)
and :func:`stages_from_layout` maps a parsed layout back to module names.

**Activation recomputation** (a plan's ``Stage.recompute``, :func:`recompute_settings`): Megatron
checkpoints whole transformer layers (``--recompute-granularity full``); which ones it
checkpoints is one global setting:

* every layer of every stage: ``--recompute-granularity full --recompute-method uniform
  --recompute-num-layers 1`` (each chunk of one layer checkpointed on its own);
* the first N layers of every stage (all of a stage's layers where it has at most N):
  ``--recompute-method block --recompute-num-layers N`` (Megatron's ``block`` branch:
  ``layer_idx < recompute_num_layers`` on each pipeline rank);
* any other per-layer set has no upstream flag: Megatron-LM (up to core_v0.19.0 and its main
  branch of 2026-08-22) has no per-layer list. AMD's Primus, a launcher that patches
  Megatron, documents ``recompute_layer_ids`` (Primus v26.3 and later: global decoder-layer
  ids 0 .. num_layers - 1, with ``recompute_granularity: full`` and ``recompute_method:
  null``; ``primus/configs/modules/megatron/primus_megatron_module.yaml``,
  ``primus/backends/megatron/patches/recompute_layer_patches.py``, github.com/AMD-AGI/Primus);
  the export gives that list (``recompute_layer_ids``, ``primus_args``) and ``args`` then
  carries no recomputation, said in ``notes``.

Refused: a recomputed module that is not a transformer layer (the embedding, the head) and
``selective`` recomputation (Megatron's ``--recompute-granularity selective`` recomputes the
``--recompute-modules`` of *every* layer, ``core_attn`` by default, not the tensors the
profile's per-op policy drops). The flags ``--recompute-granularity {full,selective}``,
``--recompute-method {uniform,block}`` and ``--recompute-num-layers`` are ``add_argument`` calls
of ``megatron/training/arguments.py`` in core_r0.8.0 (2024; the oldest release checked) and, in core_v0.19.0, arguments
generated from ``TransformerConfig``'s fields of the same names
(``megatron/training/argument_utils.py``); the per-rank loops are ``megatron/core/recompute.py``
(core_v0.19.0; ``transformer_block.py`` before).

Target: Megatron-LM core_v0.19.0 (Megatron-Core 0.19, 2026-08-19),
``megatron/core/transformer/pipeline_parallel_layer_layout.py`` and
``megatron/core/transformer/transformer_config.py`` (``pipeline_model_parallel_layout``);
command-line flag ``--pipeline-model-parallel-layout`` (``megatron/training/arguments.py``).
github.com/NVIDIA/Megatron-LM (Apache-2.0 / BSD-3-Clause).
"""

from __future__ import annotations

import re

from ..errors import UnsupportedPlanError
from ..plan import Plan
from .layout import (
    ModelLayout,
    StageSplit,
    block_ids,
    one_stage_per_rank,
    recomputed_blocks,
    shared_notes,
    shared_parameters,
    split_stages,
)

RUNTIME = "Megatron-LM"
TARGET = "Megatron-Core 0.19 (megatron/core/transformer/pipeline_parallel_layer_layout.py)"
CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}
"""Megatron's layer characters (``char2layer_type``)."""

VIRTUAL = ("Megatron-LM holds several stages on a rank only as virtual pipeline stages, placed in a loop and run in "
          "its own interleaved order; this export writes one stage per rank (--pipeline-model-parallel-size = the "
          "stages)")
"""Why a plan with several stages per rank is refused."""


def export(plan: Plan, layout: ModelLayout, ranks: int | None = None, name: str = "") -> dict:
    """The plan as a ``pipeline_model_parallel_layout`` string.

    Parameters
    ----------
    plan
        A plan of a decoder model whose layer names are module FQNs at block granularity.
    layout
        The model's layout (:meth:`~pipeopt.export.layout.ModelLayout.of`).
    ranks, name
        The plan's ranks and schedule when the caller knows them (a schedule named at export);
        default: the plan's order, else its device lists
        (:func:`~pipeopt.export.layout.plan_ranks`).

    Returns
    -------
    dict
        ``{"format": "megatron", "target": ..., "num_stages": S, "data_parallel": m,
        "pipeline_model_parallel_layout": "E,t*4|t*3,L", "num_layers": n, "args": "...",
        "stages": [[fqn, ...], ...], "notes": [...]}``.

    Raises
    ------
    UnsupportedPlanError
        See the module docstring.
    """
    one_stage_per_rank(plan, RUNTIME, VIRTUAL, ranks, name)
    split = split_stages(plan, layout, RUNTIME)
    where = f"{RUNTIME}'s pipeline_model_parallel_layout cannot express this plan"
    try:
        before, blocks, after = layout.parts()
    except UnsupportedPlanError as exc:
        raise UnsupportedPlanError(f"{where}: {exc}") from None
    if not before or not after:
        missing = "an embedding before" if not before else "an output layer after"
        raise UnsupportedPlanError(
            f"{where}: the model has no {missing} its blocks {layout.container!r}; the layout "
            "describes a GPT (E = embedding, t = decoder layer, L = final norm + output layer + loss)"
        )
    if layout.ops:
        kinds = {layout.ops.get(b) for b in blocks}
        if not any(layout.ops.get(n) == "Embedding" for n in before):
            raise UnsupportedPlanError(
                f"{where}: the modules before the blocks ({', '.join(f'{n} ({layout.ops.get(n)})' for n in before)}) "
                "hold no nn.Embedding; the layout's E is a GPT's token and position embedding"
            )
        if len(kinds) > 1:
            raise UnsupportedPlanError(
                f"{where}: the blocks of {layout.container!r} are of several classes {sorted(map(str, kinds))}; "
                "Megatron builds every decoder layer (t) from one layer spec"
            )
    owner = {n: i for i, st in enumerate(split.stages) for n in st}
    deep = [n for n in layout.order if layout.block_of(n) not in (None, n)]
    if deep:
        raise UnsupportedPlanError(
            f"{where}: {deep[0]!r} is a module inside {layout.block_of(deep[0])!r}; a layout stage holds "
            "whole transformer layers (t), so profile at the granularity of the blocks"
        )
    for group, what in ((before, "embedding (E)"), (after, "final norm and output layer (L)")):
        stages = sorted({owner[n] for n in group})
        if len(stages) > 1:
            raise UnsupportedPlanError(
                f"{where}: the {what} modules {group} are split over stages {stages}; Megatron builds "
                f"them as one unit on one stage"
            )
    rows = []
    for st in split.stages:
        row = ""
        if st[0] in before:
            row += "E"
        count = sum(1 for n in st if n in blocks)
        if count:
            row += ("," if row else "") + ("t" if count == 1 else f"t*{count}")
        if st[-1] in after:
            row += ("," if row else "") + "L"
        rows.append(row)
    text = "|".join(rows)
    s = split.num_stages
    rec = recompute_settings(plan, split)
    return {
        "format": "megatron",
        "target": TARGET,
        "num_stages": s,
        "data_parallel": split.data_parallel,
        "pipeline_model_parallel_layout": text,
        "num_layers": len(blocks),
        "args": f"--num-layers {len(blocks)} --pipeline-model-parallel-size {s} "
                f"--pipeline-model-parallel-layout '{text}'" + (f" {rec['args']}" if rec["args"] else ""),
        "stages": [list(x) for x in split.stages],
        "recompute": rec,
        "shared_parameters": (shared := shared_parameters(split)),
        "notes": split.notes() + [
            f"E = {before}, t = the {len(blocks)} entries of {layout.container!r}, L = {after}"
        ] + rec["notes"] + shared_notes(shared, RUNTIME),
    }


def recompute_settings(plan: Plan, split: StageSplit) -> dict:
    """The plan's recompute set as Megatron's flags, or as Primus's ``recompute_layer_ids``
    where no flag expresses it (module docstring).

    Parameters
    ----------
    plan
        The plan (``Stage.recompute``).
    split
        Its :func:`~pipeopt.export.layout.split_stages` (one stage per rank).

    Returns
    -------
    dict
        ``{"method": "none" | "uniform" | "block" | "layer_ids", "args": str (the Megatron
        flags, "" if none apply), "recompute_num_layers": N or None, "recompute_layer_ids":
        [global block ids] (empty without recomputation), "primus_args": str or None,
        "notes": [...]}``.

    Raises
    ------
    UnsupportedPlanError
        A recomputed module that is not a transformer layer, or ``selective`` recomputation.
    """
    from ..problems.partition.recompute_baselines import megatron_block_rule, megatron_uniform_rule

    modes = recomputed_blocks(plan, split, RUNTIME)
    out = {"method": "none", "args": "", "recompute_num_layers": None, "recompute_layer_ids": [],
           "primus_args": None, "notes": []}
    if modes is None or not any(m for st in modes for m in st):
        return out
    if any(m == "selective" for st in modes for m in st):
        raise UnsupportedPlanError(
            f"{RUNTIME} cannot express this plan's recomputation: it recomputes some layers 'selective' (the "
            "profile's per-op policy); Megatron's --recompute-granularity selective recomputes the "
            "--recompute-modules (default core_attn) of every layer, other tensors, and --recompute-layer-ids "
            "exists in no Megatron-LM release")
    flags = [[m is not None for m in st] for st in modes]
    counts = [len(st) for st in flags]
    ids = block_ids(split, flags)
    out["recompute_layer_ids"] = ids
    if flags == megatron_uniform_rule(counts):
        out.update(method="uniform", recompute_num_layers=1,
                   args="--recompute-granularity full --recompute-method uniform --recompute-num-layers 1")
        return out
    for n in range(1, max(counts) + 1):
        if flags == megatron_block_rule(counts, n):
            out.update(method="block", recompute_num_layers=n,
                       args=f"--recompute-granularity full --recompute-method block --recompute-num-layers {n}")
            return out
    listed = ",".join(map(str, ids))
    out.update(method="layer_ids", primus_args=f"--recompute_granularity full --recompute_layer_ids {listed}")
    out["notes"].append(
        f"the plan recomputes layers {ids} (per stage {[[j for j, f in enumerate(st) if f] for st in flags]}), which "
        "no Megatron-LM flag expresses (--recompute-method block takes the first N layers of every stage, uniform "
        "1 every layer): 'args' carries no recomputation; AMD Primus v26.3+ takes recompute_layer_ids: "
        f"[{listed}] with recompute_granularity: full and recompute_method: null ('primus_args')")
    return out


# ---- Megatron's reader, transcribed ------------------------------------------------------------
def parse_str_to_list(layout: str) -> list[list[str]]:
    """Megatron's ``PipelineParallelLayerLayout.parse_str_to_list``: the stages of a layout
    string, each a list of characters (``"E"``, ``"t"``, ``"m"``, ``"L"``).

    Raises
    ------
    UnsupportedPlanError
        On a character Megatron does not know (Megatron asserts).
    """
    text = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), text)
    out = []
    for stage in text.split("|"):
        out.append([])
        for ch in stage:
            if ch not in CHARS:
                raise UnsupportedPlanError(
                    f"Invalid layer character: {ch} (stage={stage!r}), known layer characters: {list(CHARS)}"
                )
            out[-1].append(ch)
    return out


def parse_layout(layout: str, pipeline_model_parallel_size: int, num_layers: int) -> list[list[str]]:
    """A layout string parsed and validated as Megatron does for ``pipeline_model_parallel_size``
    ranks without virtual stages (``PipelineParallelLayerLayout.__init__`` and
    ``validate_layer_layout``).

    Returns
    -------
    list[list[str]]
        Per pipeline rank, its layer characters.

    Raises
    ------
    UnsupportedPlanError
        Where Megatron's asserts would fail: the stage count is not a multiple of the pipeline
        size (or needs virtual stages), the first layer is not ``E`` or the last not ``L``,
        ``E`` or ``L`` not exactly once, or the count of ``t`` differs from ``num_layers``.
    """
    stages = parse_str_to_list(layout)
    if len(stages) % pipeline_model_parallel_size:
        raise UnsupportedPlanError(
            f"pipeline_model_parallel_layout must be divisible by pipeline_model_parallel_size "
            f"({len(stages)=}, {pipeline_model_parallel_size=})"
        )
    if len(stages) != pipeline_model_parallel_size:
        raise UnsupportedPlanError(
            f"the layout has {len(stages)} stages for {pipeline_model_parallel_size} ranks: virtual "
            "pipeline stages, which pipeopt's plans do not use"
        )
    flat = [c for st in stages for c in st]
    checks = (
        (flat[:1] == ["E"], f"The first layer must be embedding, but got {flat[:1]}"),
        (flat[-1:] == ["L"], f"The last layer must be loss, but got {flat[-1:]}"),
        (flat.count("E") == 1, "Embedding must be specified exactly once"),
        (flat.count("L") == 1, "Loss must be specified exactly once"),
        (flat.count("t") == num_layers,
         f"Number of decoder layers {flat.count('t')} must match num_layers {num_layers}"),
    )
    for ok, message in checks:
        if not ok:
            raise UnsupportedPlanError(message)
    return stages


def stages_from_layout(layout: str, before: list, blocks: list, after: list) -> list[list[str]]:
    """The module names each rank builds from a layout (Megatron's
    ``get_num_layers_to_build`` / ``get_layer_offset`` for decoder layers; the embedding on the
    rank holding ``E``, final norm and output layer on the rank holding ``L``).

    Parameters
    ----------
    layout
        The string.
    before, blocks, after
        The model's embedding modules, its blocks in order, its final modules.

    Raises
    ------
    UnsupportedPlanError
        If Megatron would reject the layout (:func:`parse_layout`).
    """
    stages = parse_str_to_list(layout)
    parse_layout(layout, len(stages), len(blocks))
    out, offset = [], 0
    for st in stages:
        names = list(before) if "E" in st else []
        count = st.count("t")
        names += blocks[offset:offset + count]
        offset += count
        if "L" in st:
            names += list(after)
        out.append(names)
    return out
