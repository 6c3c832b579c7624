"""Plans out to the pipeline runtimes: torch.distributed.pipelining, torchtitan, Megatron-LM,
DeepSpeed; and action orders out to torch's ``_PipelineScheduleRuntime`` (a CSV).

Pure Python: producing a format needs no torch (torch is needed only to run or round-trip it).
One module per runtime, each documenting the framework version it targets and rejecting, with
:class:`~pipeopt.errors.UnsupportedPlanError` naming the problem, a plan its runtime cannot
express:

========== ============================================ ==================================
``to``     module                                       output
========== ============================================ ==================================
torch      :mod:`pipeopt.export.torch_pipelining`       ``split_spec`` + per-stage FQNs +
                                                        a snippet binding ``split_spec``
torch-csv  :mod:`pipeopt.export.torch_csv`              the per-rank action order (CSV) +
                                                        the split
torchtitan :mod:`pipeopt.export.torchtitan`             ``module_fqns_per_model_part`` (+
                                                        ``pipeline_parallel_schedule_csv``)
megatron   :mod:`pipeopt.export.megatron`               ``pipeline_model_parallel_layout``
deepspeed  :mod:`pipeopt.export.deepspeed`              ``PipelineModule`` ``parts``, the
                                                        layer list and a snippet building it
========== ============================================ ==================================

Pasting in: the ``python`` field (torch, deepspeed) is source that runs as is, written as a
``.py`` file beside the JSON by :func:`write`; :func:`torch_split_spec` is the one loader call
for the JSON (``pipeline(model, args, split_spec=torch_split_spec("plan.json"))``). When the
graph records tied parameters (``from_torch``'s ``tied``), every split format lists in
``shared_parameters`` which stages hold a user of each, with a note on what the runtime needs.

A plan that carries its action order (``plan.schedule``: a free order, or any fixed one) goes
out with it: ``torch-csv`` writes it, ``torchtitan`` writes it as the CSV its
``pipeline_parallel_schedule_csv`` names; Megatron-LM and DeepSpeed run their own order and
one stage per rank, so they refuse a plan with several stages (chunks) per rank and say in
``notes`` that they run their own order on the split. :func:`write` saves an export: the JSON,
and the CSV and TOML files beside it.

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
from . import deepspeed, megatron, torch_csv, torch_pipelining, torchtitan
from .layout import ModelLayout, StageSplit, plan_ranks, split_stages
from .torch_pipelining import torch_split_spec

FORMATS = {
    "torch": torch_pipelining,
    "torch-csv": torch_csv,
    "torchtitan": torchtitan,
    "megatron": megatron,
    "deepspeed": deepspeed,
}
"""Export target -> module (each has ``RUNTIME``, ``TARGET`` and ``export(plan, layout)``)."""


def export(plan: Plan, to: str, *, graph: nx.DiGraph | None = None, module=None, schedule: str | None = None,
           microbatches: int | None = None, csv_path: str | None = None) -> dict:
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
        ranks, chunks on one rank listing the same devices). A plan that carries its order
        (``plan.schedule``) is exported with that order (naming another is refused); for
        ``torch-csv`` a plan without one needs ``schedule`` (the order is built for its ranks,
        :func:`pipeopt.export.torch_csv.order_for`).
    microbatches
        m of an order built from ``schedule`` (``torch-csv``; default
        :data:`pipeopt.units.DEFAULT_MICROBATCHES`).
    csv_path
        Where the CSV will be written, for torchtitan's ``pipeline_parallel_schedule_csv``
        (default ``schedule.csv``).

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
        If the runtime cannot express the plan (the message says why), or ``torch-csv`` is
        asked for a plan without an order and without ``schedule``.
    InvalidPlanError
        If the plan's order is broken (the first broken action named,
        :func:`pipeopt.export.torch_csv.check_order`).
    """
    if to not in FORMATS:
        raise InvalidProblemError(f"unknown export format {to!r}; choose from {sorted(FORMATS)}")
    from ..schedules.names import schedule_name

    layout = ModelLayout.of(plan, graph, module)
    order = None
    if plan.schedule is not None or to == "torch-csv":
        order = torch_csv.order_for(plan, schedule, microbatches)
    name = order.name if order is not None else schedule_name("1F1B" if schedule is None else schedule)
    if to == "torch-csv":
        out = torch_csv.export(plan, layout, order)
    elif to == "torchtitan":
        out = torchtitan.export(plan, layout, schedule=name, order=order, csv_path=csv_path)
    elif to == "torch":
        out = torch_pipelining.export(plan, layout)
    else:
        out = FORMATS[to].export(plan, layout, ranks=_ranks(plan, order, name), name=name)
        if order is not None and name not in ("1F1B", "GPipe"):
            out["notes"] = list(out["notes"]) + [
                f"{FORMATS[to].RUNTIME} runs its own 1F1B order on this split, not the plan's {name} order "
                "(export to torch-csv or torchtitan to run that order)"]
    return {**out, "schedule": name}


def _ranks(plan: Plan, order, name: str) -> int | None:
    """The plan's ranks: its order's, its device lists', or - without devices - S / 2 for a
    multi-stage schedule named at export (``None``: one stage per rank assumed)."""
    from ..schedules.torch_orders import STAGES_PER_RANK

    ranks = order.ranks if order is not None else plan_ranks(plan)
    if ranks is None and STAGES_PER_RANK.get(name, 2) > 1:
        ranks = plan.num_stages // 2
    return ranks


def write(out: dict, path) -> list:
    """Save an export: the JSON at ``path``; when it holds a CSV (``torch-csv``, or
    ``torchtitan`` with an order), the CSV at ``path`` with suffix ``.csv``; when it holds a
    TOML (``torchtitan``), the TOML with suffix ``.toml``; when it holds Python (``torch``,
    ``deepspeed``: the ``python`` field), the source with suffix ``.py``. A ``path`` ending in
    ``.csv``, ``.toml`` or ``.py`` names that file; the JSON then goes beside it with suffix
    ``.json``.

    Returns
    -------
    list[pathlib.Path]
        The files written, the JSON first.

    Raises
    ------
    OSError
        If a file cannot be written (the CLI turns it into a WriteError naming it).
    """
    import json
    from pathlib import Path

    path = Path(path)
    if path.suffix in (".csv", ".toml", ".py"):
        path = path.with_suffix(".json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    written = [path]
    if out.get("csv"):
        csv_file = path.with_suffix(".csv")
        csv_file.write_text(out["csv"])
        written.append(csv_file)
    if out.get("toml"):
        toml_file = path.with_suffix(".toml")
        toml_file.write_text(out["toml"])
        written.append(toml_file)
    if out.get("python"):
        py_file = path.with_suffix(".py")
        py_file.write_text(out["python"])
        written.append(py_file)
    return written


__all__ = ["FORMATS", "ModelLayout", "StageSplit", "export", "split_stages", "torch_split_spec", "write"]
