"""Export to DeepSpeed's ``PipelineModule`` stage boundaries (``parts``).

DeepSpeed's ``PipelineModule(layers=[...], num_stages=S, partition_method=...)`` takes the
model as a flat list of layers, each fed the previous one's output (a tensor or a tuple of
tensors), and ``_partition_layers`` sets ``self.parts``: ``S + 1`` boundaries ``0 = p_0 <=
p_1 <= ... <= p_S = len(layers)``; stage s builds and runs ``layers[p_s:p_{s+1}]``
(``_set_bounds``, ``_build``). ``partition_method`` only chooses how ``parts`` is computed
(``"uniform"``, ``"parameters"``, ``"type:<regex>"``); there is no argument that takes
``parts`` itself, so the export also gives the few lines of a subclass that sets it.

What it can express: a stage is a contiguous run of the layer list. The layer list is the
plan's execution order; a tensor read by a later layer than the next one (``tok_emb``'s
output read by ``layers.0`` after ``pos_emb`` ran) must travel inside the intermediate layers'
tuple outputs; the export lists those ``carried`` tensors. Rejected: a name inside a block of
the model's container (``layers.3.mlp`` of a leaf-module plan: a residual block is not a
sequence of its leaves, DeepSpeed's flat list cannot hold its skip connection), several
stages (chunks) per rank (DeepSpeed's pipeline engine runs one stage per rank, in its own 1F1B
order: an interleaved plan's 4 chunks on 2 ranks are not 4 DeepSpeed stages), and the rules
every runtime shares (:mod:`pipeopt.export.layout`).

:func:`stages_from_parts` is DeepSpeed's slicing, used to read an export back.

Target: DeepSpeed v0.19.5 (2026-08), ``deepspeed/runtime/pipe/module.py``
(``PipelineModule._partition_layers``, ``_set_bounds``, ``_build``, ``stage_owner``) and
``deepspeed/runtime/utils.py`` (``partition_uniform``, ``partition_balanced``).
github.com/deepspeedai/DeepSpeed (Apache-2.0).
"""

from __future__ import annotations

from ..errors import UnsupportedPlanError
from ..plan import Plan
from ..problems.partition.simple import uniform_parts
from .layout import ModelLayout, one_stage_per_rank, split_stages

RUNTIME = "DeepSpeed PipelineModule"
TARGET = "DeepSpeed v0.19.5 (deepspeed/runtime/pipe/module.py: PipelineModule.parts)"

SUBCLASS = '''\
from deepspeed.pipe import PipelineModule

PARTS = {parts}

class PlannedPipelineModule(PipelineModule):
    """PipelineModule whose stage boundaries are pipeopt's plan."""

    def _partition_layers(self, method="uniform"):
        stage_id = self._topo.get_coord(self.global_rank).pipe
        self.parts = list(PARTS)
        self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])
'''

ONE_STAGE = ("DeepSpeed's PipelineModule runs exactly one stage per rank (stage_owner) in its own 1F1B order; it has "
          "no virtual stages")
"""Why a plan with several stages per rank is refused."""


def export(plan: Plan, layout: ModelLayout, ranks: int | None = None, name: str = "") -> dict:
    """The plan as DeepSpeed's ``parts`` over the layer list.

    Parameters
    ----------
    plan
        A plan whose layer names are module FQNs.
    layout
        The model's layout (:meth:`~pipeopt.export.layout.ModelLayout.of`).
    ranks, name
        The plan's ranks and schedule when the caller knows them (a schedule named at export);
        default: the plan's order, else its device lists
        (:func:`~pipeopt.export.layout.plan_ranks`).

    Returns
    -------
    dict
        ``{"format": "deepspeed", "target": ..., "num_stages": S, "data_parallel": m,
        "layers": [fqn, ...], "parts": [0, ..., n], "carried": [[u, v], ...],
        "python": "...", "stages": [[fqn, ...], ...], "notes": [...]}``.

    Raises
    ------
    UnsupportedPlanError
        See the module docstring.
    """
    one_stage_per_rank(plan, RUNTIME, ONE_STAGE, ranks, name)
    split = split_stages(plan, layout, RUNTIME)
    deep = [n for n in layout.order if layout.block_of(n) not in (None, n)]
    if deep:
        raise UnsupportedPlanError(
            f"{RUNTIME} cannot express this plan: {deep[0]!r} is a module inside the block "
            f"{layout.block_of(deep[0])!r}; PipelineModule takes a flat list of layers, each fed the "
            "previous one's output, which cannot hold a block's skip connection (profile at the "
            "granularity of the blocks)"
        )
    layers = [n for st in split.stages for n in st]
    parts = [0]
    for st in split.stages:
        parts.append(parts[-1] + len(st))
    position = {n: i for i, n in enumerate(layers)}
    carried = [[u, v] for u, v in layout.edges if position[v] - position[u] > 1]
    notes = split.notes()
    if parts == uniform_parts(len(layers), split.num_stages):
        notes.append("these are the parts of partition_method='uniform'")
    if carried:
        notes.append(f"{len(carried)} tensor(s) skip layers of the list and must be carried in the "
                     "intermediate layers' tuple outputs (see 'carried')")
    return {
        "format": "deepspeed",
        "target": TARGET,
        "num_stages": split.num_stages,
        "data_parallel": split.data_parallel,
        "layers": layers,
        "parts": parts,
        "carried": carried,
        "python": SUBCLASS.format(parts=parts),
        "stages": [list(s) for s in split.stages],
        "notes": notes,
    }


def stages_from_parts(parts: list, layers: list) -> list[list[str]]:
    """The layers each stage builds: DeepSpeed's ``layers[parts[s]:parts[s + 1]]``.

    Raises
    ------
    UnsupportedPlanError
        If ``parts`` does not run from 0 to ``len(layers)`` without decreasing (DeepSpeed's
        ``stage_owner`` would then find a layer no stage owns).
    """
    if not parts or parts[0] != 0 or parts[-1] != len(layers) or any(a > b for a, b in zip(parts, parts[1:])):
        raise UnsupportedPlanError(f"parts {parts} must rise from 0 to {len(layers)} (the number of layers)")
    return [list(layers[a:b]) for a, b in zip(parts, parts[1:])]
