"""Plans out to the pipeline runtimes: torch.distributed.pipelining, torchtitan, Megatron-LM,
DeepSpeed.

Pure Python: producing a format needs no torch (torch is needed only to run or round-trip it).
One module per runtime, each documenting the framework version it targets and rejecting, with
:class:`~pipeopt.errors.UnsupportedPlanError` naming the problem, a plan its runtime cannot
express:

========== ============================================ ==================================
``to``     module                                       output
========== ============================================ ==================================
torch      :mod:`pipeopt.export.torch_pipelining`       ``split_spec`` + per-stage FQNs
torchtitan :mod:`pipeopt.export.torchtitan`             ``module_fqns_per_model_part``
megatron   :mod:`pipeopt.export.megatron`               ``pipeline_model_parallel_layout``
deepspeed  :mod:`pipeopt.export.deepspeed`              ``PipelineModule`` ``parts``
========== ============================================ ==================================

>>> from pipeopt import Plan, Stage
>>> plan = Plan((Stage(("tok_emb", "pos_emb", "layers.0")), Stage(("layers.1", "norm", "head"))))
>>> export(plan, "megatron")["pipeline_model_parallel_layout"]
'E,t|t,L'
>>> export(plan, "torch")["split_spec"]
{'layers.1': 'SplitPoint.BEGINNING'}
"""

from __future__ import annotations

import networkx as nx

from ..errors import InvalidProblemError
from ..plan import Plan
from . import deepspeed, megatron, torch_pipelining, torchtitan
from .layout import ModelLayout, StageSplit, split_stages

FORMATS = {
    "torch": torch_pipelining,
    "torchtitan": torchtitan,
    "megatron": megatron,
    "deepspeed": deepspeed,
}
"""Export target -> module (each has ``RUNTIME``, ``TARGET`` and ``export(plan, layout)``)."""


def export(plan: Plan, to: str, *, graph: nx.DiGraph | None = None, module=None, schedule: str | None = None) -> dict:
    """Export ``plan`` to a runtime's format.

    Parameters
    ----------
    plan
        A plan whose layer names are module FQNs (made on a graph of
        :func:`pipeopt.torch.from_torch`).
    to
        ``"torch"``, ``"torchtitan"``, ``"megatron"`` or ``"deepspeed"``.
    graph
        The instance's layer graph (recommended): its ``torch`` attribute gives the execution
        order and the container of blocks. Without it the plan's own order is used.
    module
        The ``nn.Module``, optional: read only for the container's class (torchtitan).
    schedule
        The torch schedule the plan's chunks run, in any spelling of
        :func:`pipeopt.schedules.schedule_name` (default ``"1F1B"``; a plan of the schedule
        problem names its own in ``info["schedule"]``): written into the output
        (``"schedule"``; torchtitan: ``pipeline_parallel_schedule`` and the degree = the
        ranks, chunks on one rank listing the same devices).

    Returns
    -------
    dict
        JSON-ready: ``format``, ``target`` (the framework version), ``num_stages``,
        ``data_parallel``, the format's fields, ``notes`` (what the export assumed).

    Raises
    ------
    InvalidProblemError
        If ``to`` is not a known format or ``schedule`` names no torch schedule.
    UnsupportedPlanError
        If the runtime cannot express the plan (the message says why).
    """
    if to not in FORMATS:
        raise InvalidProblemError(f"unknown export format {to!r}; choose from {sorted(FORMATS)}")
    from ..schedules.names import schedule_name

    name = schedule_name("1F1B" if schedule is None else schedule)
    layout = ModelLayout.of(plan, graph, module)
    out = FORMATS[to].export(plan, layout, schedule=name) if to == "torchtitan" else FORMATS[to].export(plan, layout)
    return {**out, "schedule": name}


__all__ = ["FORMATS", "ModelLayout", "StageSplit", "export", "split_stages"]
