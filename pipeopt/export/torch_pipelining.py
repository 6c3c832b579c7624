"""Export to ``torch.distributed.pipelining`` (PyTorch 2.13).

Two equivalent forms of one split:

* ``split_spec`` for ``torch.distributed.pipelining.pipeline(module, mb_args,
  split_spec=...)``: ``{fqn: "SplitPoint.BEGINNING"}``, one entry per stage after the first,
  naming the first module (in execution order) of that stage. ``pipeline`` traces the model
  (``torch.export``) and cuts the traced graph where each named module's call begins, so
  stage i holds every module that runs between the i-th and the (i+1)-th split point;
  ``build_stage(pipe.get_stage_module(i), i, pipe.info(), device)`` then makes rank i's
  stage.
* ``stages``: the module FQNs of each stage, for building ``PipelineStage(submodule, i, S,
  device)`` by hand from a copy of the model that keeps only those modules (torchtitan's way,
  :mod:`pipeopt.export.torchtitan`; the model's ``forward`` must then skip the missing ones).

The values of ``split_spec`` are strings (JSON); :func:`split_spec_for_torch` turns them into
``SplitPoint`` members. :func:`pipeopt.torch.runtime.stage_membership` reads back the stages
``pipeline`` actually built (the round-trip the tests run).

What ``pipeline`` can split: at the beginning of any module call, at any depth (a leaf-module
plan such as ``layers.0.mlp.fc`` works), as long as each stage is a contiguous run of the
execution order; a module called more than once, or whose parameters another stage also uses
(tied embeddings), is beyond this exporter (the tracer would not cut it as planned).

Target: PyTorch 2.13.0 (``torch/distributed/pipelining/_IR.py``: ``pipeline``,
``SplitPoint``, ``Pipe.get_stage_module``; ``torch/distributed/pipelining/stage.py``:
``build_stage``, ``PipelineStage``), checked by ``tests/export/test_torch_pipelining.py``
against the installed torch.
"""

from __future__ import annotations

from ..errors import UnsupportedPlanError
from ..plan import Plan
from .layout import ModelLayout, split_stages

RUNTIME = "torch.distributed.pipelining"
TARGET = "PyTorch 2.13 torch.distributed.pipelining (pipeline(split_spec=...), build_stage, PipelineStage)"
BEGINNING = "SplitPoint.BEGINNING"


def export(plan: Plan, layout: ModelLayout) -> dict:
    """The plan as a ``split_spec`` and per-stage FQN lists.

    Parameters
    ----------
    plan
        A plan whose layer names are module FQNs.
    layout
        The model's layout (:meth:`~pipeopt.export.layout.ModelLayout.of`).

    Returns
    -------
    dict
        ``{"format": "torch", "target": ..., "num_stages": S, "data_parallel": m,
        "split_spec": {fqn: "SplitPoint.BEGINNING", ...}, "stages": [[fqn, ...], ...],
        "notes": [...]}``.

    Raises
    ------
    UnsupportedPlanError
        For the rules every runtime shares (:func:`~pipeopt.export.layout.split_stages`).
    """
    split = split_stages(plan, layout, RUNTIME)
    spec = {stage[0]: BEGINNING for stage in split.stages[1:]}
    return {
        "format": "torch",
        "target": TARGET,
        "num_stages": split.num_stages,
        "data_parallel": split.data_parallel,
        "split_spec": spec,
        "stages": [list(s) for s in split.stages],
        "notes": split.notes(),
    }


def split_spec_for_torch(exported: dict) -> dict:
    """``exported["split_spec"]`` with ``SplitPoint`` members as values (needs torch).

    Raises
    ------
    UnsupportedPlanError
        If a value is not ``"SplitPoint.BEGINNING"`` or ``"SplitPoint.END"``.
    """
    from torch.distributed.pipelining import SplitPoint

    out = {}
    for fqn, point in exported["split_spec"].items():
        member = str(point).removeprefix("SplitPoint.")
        if member not in ("BEGINNING", "END"):
            raise UnsupportedPlanError(f"split point {point!r} of {fqn!r} is not SplitPoint.BEGINNING or END")
        out[fqn] = SplitPoint[member]
    return out


def stages_from_split_spec(split_spec: dict, order) -> list[list[str]]:
    """The stages ``pipeline`` makes of ``split_spec`` on a model whose modules run in
    ``order`` (pure Python; the semantics of ``SplitPoint.BEGINNING``/``END``).

    A ``BEGINNING`` point at module m starts a new stage with m; an ``END`` point ends the
    stage after m. Used to read an export back without torch.

    Raises
    ------
    UnsupportedPlanError
        If a split point names no module of ``order``.
    """
    order = list(order)
    unknown = [f for f in split_spec if f not in order]
    if unknown:
        raise UnsupportedPlanError(f"split point(s) {unknown} name no module of the model")
    stages: list[list[str]] = [[]]
    for name in order:
        point = str(split_spec.get(name, "")).removeprefix("SplitPoint.")
        if point == "BEGINNING" and stages[-1]:
            stages.append([])
        stages[-1].append(name)
        if point == "END":
            stages.append([])
    return [s for s in stages if s]
