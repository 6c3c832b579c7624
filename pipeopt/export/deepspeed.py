"""Export to DeepSpeed's ``PipelineModule`` stage boundaries (``parts``).

DeepSpeed's ``PipelineModule(layers=[...], num_stages=S, partition_method=...)`` takes the
model as a flat list of layers, each fed the previous one's output (a tensor or a tuple of
tensors), and ``_partition_layers`` sets ``self.parts``: ``S + 1`` boundaries ``0 = p_0 <=
p_1 <= ... <= p_S = len(layers)``; stage s builds and runs ``layers[p_s:p_{s+1}]``
(``_set_bounds``, ``_build``). ``partition_method`` only chooses how ``parts`` is computed:
``"uniform"`` (``partition_uniform``: equal layer counts), ``"parameters"`` and
``"type:<regex>"`` (``partition_balanced``, the linear-partition DP that minimises the spread of
the stages' trainable-parameter counts, or of their counts of layers whose class name matches
the regex); ``"profile"`` and anything else raise ``NotImplementedError``. No value takes
``parts`` itself, and none of the three can name an arbitrary set of boundaries (a ``type:``
regex only says which layers weigh 1; where the weight-0 layers go is the DP's tie-breaking).
So the export writes, in its ``python`` field (a ``.py`` file beside the JSON,
:func:`pipeopt.export.write`):

* ``LAYERS`` (the module FQNs in order) and ``PARTS``;
* when the plan's parts are ``partition_uniform``'s, the call with ``partition_method="uniform"``;
  otherwise the one override a user needs, a subclass whose ``_partition_layers`` sets
  ``self.parts = PARTS`` and calls DeepSpeed's own ``_set_bounds`` (what the original ends with);
* ``planned_pipeline_module(model, **kwargs)``: ``PipelineModule(layers=[model.get_submodule(fqn)
  for fqn in LAYERS], num_stages=S, ...)``. ``PipelineModule`` takes built modules as well as
  ``LayerSpec``s (``_build``); a user who builds lazily puts a ``LayerSpec`` at the same place.

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

Target: DeepSpeed v0.19.5 (2026-08; the partition methods re-read at commit edaa722, 2026-08-22,
version 0.19.6), ``deepspeed/runtime/pipe/module.py``
(``PipelineModule._partition_layers``, ``_set_bounds``, ``_build``, ``stage_owner``) and
``deepspeed/runtime/utils.py`` (``partition_uniform``, ``partition_balanced``).
github.com/deepspeedai/DeepSpeed (Apache-2.0).
"""

from __future__ import annotations

from ..errors import UnsupportedPlanError
from ..plan import Plan
from ..problems.partition.simple import uniform_parts
from .layout import ModelLayout, one_stage_per_rank, shared_notes, shared_parameters, split_stages

RUNTIME = "DeepSpeed PipelineModule"
TARGET = "DeepSpeed v0.19.5 (deepspeed/runtime/pipe/module.py: PipelineModule.parts)"

SUBCLASS = '''\
class PlannedPipelineModule(PipelineModule):
    """PipelineModule whose stage boundaries are pipeopt's plan (partition_method cannot take them)."""

    def _partition_layers(self, method="uniform"):
        stage_id = self._topo.get_coord(self.global_rank).pipe
        self.parts = list(PARTS)
        self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])
'''

BUILD = '''\
def planned_pipeline_module(model, **kwargs):
    """The planned {cls} over model's modules LAYERS (kwargs: loss_fn, topology, ...).

    Each layer is fed the previous one's output (DeepSpeed's rule); put a LayerSpec at the
    same place in the list to build a layer lazily."""
    layers = [model.get_submodule(fqn) for fqn in LAYERS]
    return {cls}(layers=layers, num_stages={stages}{method}, **kwargs)
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
        "partition_method": "uniform" or None, "python": "...", "stages": [[fqn, ...], ...],
        "shared_parameters": [...], "notes": [...]}``.

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
    shared = shared_parameters(split)
    carried = [[u, v] for u, v in layout.edges if position[v] - position[u] > 1]
    notes = split.notes()
    uniform = parts == uniform_parts(len(layers), split.num_stages)
    if uniform:
        notes.append("these are the parts of partition_method='uniform'")
    else:
        notes.append("partition_method cannot express these parts ('uniform', 'parameters' and 'type:<regex>' "
                     "compute them; none takes boundaries): the python field overrides _partition_layers to set them")
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
        "partition_method": "uniform" if uniform else None,
        "python": snippet(layers, parts, uniform, split.stages, shared),
        "stages": [list(s) for s in split.stages],
        "shared_parameters": shared,
        "notes": notes + shared_notes(shared, RUNTIME),
    }


def snippet(layers: list, parts: list, uniform: bool, stages=(), shared=()) -> str:
    """Python source for a ``PipelineModule`` split at ``parts`` (module docstring): ``LAYERS``,
    ``PARTS``, the subclass unless ``uniform``, and ``planned_pipeline_module(model, **kwargs)``.

    Parameters
    ----------
    layers
        Module FQNs in order.
    parts
        ``S + 1`` boundaries.
    uniform
        True if ``parts`` are ``partition_method="uniform"``'s (no subclass is written).
    stages, shared
        Written as comments: the stages' FQNs and the parameters stages share.
    """
    s = len(parts) - 1
    head = [f"# pipeopt plan for {TARGET}: {s} stages over {len(layers)} layers"]
    head += [f"#   stage {i}: layers[{a}:{b}]" + (f" = {st[0]} .. {st[-1]}" if st else "")
             for i, (a, b, st) in enumerate(zip(parts, parts[1:], list(stages) or [()] * s))]
    head += [f"#   shared parameter {t['name']} on stages {t['stages']}: use TiedLayerSpec for its layers"
             for t in shared if len(t["stages"]) > 1]
    if not uniform:
        head.append("# partition_method cannot take these boundaries; PlannedPipelineModule sets them")
    body = ["from deepspeed.pipe import PipelineModule", "", "LAYERS = ["]
    body += [f"    {name!r}," for name in layers]
    body += ["]", f"PARTS = {list(parts)}", "", ""]
    if not uniform:
        body += [SUBCLASS, ""]
    cls = "PipelineModule" if uniform else "PlannedPipelineModule"
    body.append(BUILD.format(cls=cls, stages=s, method=', partition_method="uniform"' if uniform else ""))
    return "\n".join(head + body)


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
