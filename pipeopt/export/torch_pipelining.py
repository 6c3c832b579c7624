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

The values of ``split_spec`` in the JSON are strings (JSON has no enum); ``pipeline`` refuses
strings (``ValueError: Unknown split point type.``). Two ways in that need no editing:

* the ``python`` field (written as a ``.py`` file beside the JSON by
  :func:`pipeopt.export.write`): a snippet that imports ``SplitPoint`` and defines
  ``split_spec`` with ``SplitPoint`` members, to paste into a training script or ``exec``;
* :func:`torch_split_spec` (also :func:`pipeopt.export.torch_split_spec`): the one loader call,
  ``pipeline(model, example_args, split_spec=pipeopt.export.torch_split_spec("plan.json"))``.

:func:`pipeopt.torch.runtime.stage_membership` reads back the stages ``pipeline`` actually
built (the round-trip the tests run, from the written files).

What ``pipeline`` can split: at the beginning of any module call, at any depth (a leaf-module
plan such as ``layers.0.mlp.fc`` works), as long as each stage is a contiguous run of the
execution order; a module called more than once is beyond this exporter (the tracer would not
cut it as planned). A parameter two stages use (tied embeddings: GPT-2's ``lm_head.weight`` =
``transformer.wte.weight``) is replicated by ``pipeline()`` into both stages; the stage that
uses it under one name also holds, without running it, the module of the other name
(:func:`pipeopt.torch.runtime.held_not_run`); the export's ``shared_parameters`` says so, and
the stages run exactly the plan's layers (``tests/pytorch/test_hf_runtime.py``).

Target: PyTorch 2.13.0 (``torch/distributed/pipelining/_IR.py``: ``pipeline``,
``SplitPoint``, ``Pipe.get_stage_module``; ``torch/distributed/pipelining/stage.py``:
``build_stage``, ``PipelineStage``), checked by ``tests/export/test_torch_pipelining.py``
against the installed torch.
"""

from __future__ import annotations

from ..errors import UnsupportedPlanError
from ..plan import Plan
from .layout import ModelLayout, shared_notes, shared_parameters, split_stages

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
    shared = shared_parameters(split)
    return {
        "format": "torch",
        "target": TARGET,
        "num_stages": split.num_stages,
        "data_parallel": split.data_parallel,
        "split_spec": spec,
        "stages": [list(s) for s in split.stages],
        "python": snippet(spec, split.stages, shared),
        "shared_parameters": shared,
        "notes": split.notes() + shared_notes(shared, RUNTIME),
    }


def snippet(spec: dict, stages, shared=()) -> str:
    """Python source defining ``split_spec`` (``{fqn: SplitPoint.BEGINNING}``) for ``pipeline``.

    Parameters
    ----------
    spec
        ``{fqn: "SplitPoint.BEGINNING"}`` as exported.
    stages
        The stages' FQNs (written as comments).
    shared
        :func:`~pipeopt.export.layout.shared_parameters` entries (written as comments).

    Returns
    -------
    str
        Source that imports only ``torch.distributed.pipelining.SplitPoint`` and binds
        ``split_spec``; the ``pipeline``/``build_stage`` calls are comments.
    """
    lines = [f"# pipeopt plan for {TARGET}: {len(stages)} stages",
             *(f"#   stage {i}: {_span(st)}" for i, st in enumerate(stages)),
             *(f"#   shared parameter {t['name']} on stages {t['stages']}" for t in shared if len(t["stages"]) > 1),
             "from torch.distributed.pipelining import SplitPoint", "", "split_spec = {"]
    lines += [f"    {fqn!r}: SplitPoint.{str(point).removeprefix('SplitPoint.')}," for fqn, point in spec.items()]
    lines += ["}", "",
              "# pipe = torch.distributed.pipelining.pipeline(model, example_args, split_spec=split_spec)",
              "# stage = pipe.build_stage(rank, device)  # rank i runs stage i", ""]
    return "\n".join(lines)


def _span(names) -> str:
    names = list(names)
    return ", ".join(names) if len(names) <= 4 else f"{names[0]} .. {names[-1]} ({len(names)} modules)"


def torch_split_spec(source) -> dict:
    """The ``split_spec`` of a torch export, ready for ``pipeline`` (needs torch): the one loader
    call of the export format.

    >>> pipe = pipeline(model, example_args, split_spec=torch_split_spec("plan.json"))  # doctest: +SKIP

    Parameters
    ----------
    source
        The export: its dict (:func:`export`), or the path of its JSON (``pipeopt export
        --to torch --out plan.json``), or of a JSON object ``{fqn: "beginning" | "end"}``
        (values in any case, with or without the ``SplitPoint.`` prefix).

    Returns
    -------
    dict
        ``{fqn: torch.distributed.pipelining.SplitPoint}``.

    Raises
    ------
    ReadError
        If the file cannot be read or is not such JSON.
    UnsupportedPlanError
        If a value is not ``BEGINNING`` or ``END``.
    """
    return split_spec_for_torch(read_split_spec(source))


def read_split_spec(source) -> dict:
    """``{"split_spec": {fqn: point}}`` of an export dict or of a JSON file (pure Python): the
    file may hold a torch export or the mapping ``{fqn: point}`` itself.

    Raises
    ------
    ReadError
        If the file cannot be read, is not JSON, or holds no mapping of FQNs to strings.
    """
    import json
    from pathlib import Path

    from ..errors import ReadError

    data = source
    if not isinstance(source, dict):
        try:
            data = json.loads(Path(source).read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise ReadError(f"cannot read the split spec {source}: {getattr(exc, 'strerror', None) or exc}") from None
        except json.JSONDecodeError as exc:
            raise ReadError(f"{source} is not JSON: {exc}") from None
    spec = data.get("split_spec", data) if isinstance(data, dict) else data
    if not isinstance(spec, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in spec.items()):
        raise ReadError(f"{source if not isinstance(source, dict) else 'the split spec'} holds no split_spec "
                        '{fqn: "beginning" | "end"}')
    return {"split_spec": spec}


def split_spec_for_torch(exported: dict) -> dict:
    """``exported["split_spec"]`` with ``SplitPoint`` members as values (needs torch).

    Raises
    ------
    UnsupportedPlanError
        If a value is not ``"SplitPoint.BEGINNING"`` or ``"SplitPoint.END"``.
    """
    from torch.distributed.pipelining import SplitPoint

    return {fqn: SplitPoint[point_name(point, fqn)] for fqn, point in exported["split_spec"].items()}


def point_name(point, fqn: str = "") -> str:
    """``"BEGINNING"`` or ``"END"`` for a split point written ``"SplitPoint.BEGINNING"``,
    ``"beginning"``, ``"END"``, ... (pure Python).

    Raises
    ------
    UnsupportedPlanError
        For any other value.
    """
    member = str(point).strip().removeprefix("SplitPoint.").upper()
    if member not in ("BEGINNING", "END"):
        raise UnsupportedPlanError(f"split point {point!r} of {fqn!r} is not SplitPoint.BEGINNING or END")
    return member


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
        point = point_name(split_spec[name], name) if name in split_spec else ""
        if point == "BEGINNING" and stages[-1]:
            stages.append([])
        stages[-1].append(name)
        if point == "END":
            stages.append([])
    return [s for s in stages if s]
