"""torch's own loader reads pipeopt's CSV back into the same actions: the installed torch's
``_PipelineScheduleRuntime._load_csv`` (compute-only; it also lowers the order to sends and
receives with ``_add_send_recv``, which fails on an order it cannot schedule) on torch's seven
schedules at p = 2 (v = 2 where multi-chunk) and on a hand-made order that is none of them.
No process group: the runtime object is made without ``__init__`` and given the four fields
the loader reads."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

pytest.importorskip("torch.distributed.pipelining")

from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime  # noqa: E402

from pipeopt.export import export, torch_csv  # noqa: E402
from pipeopt.schedules import TORCH_SCHEDULES, Schedule  # noqa: E402

from test_torch_csv import NAMES, free_order, plan_with, shuffled_orders, torch_order  # noqa: E402


def torch_load(path, order: Schedule) -> _PipelineScheduleRuntime:
    """``_PipelineScheduleRuntime._load_csv(path)`` on a runtime of ``order``'s size."""
    rt = _PipelineScheduleRuntime.__new__(_PipelineScheduleRuntime)
    rt.pipeline_order = {}
    rt.pp_group_size = order.ranks
    rt._num_stages = order.stages
    rt._n_microbatches = order.microbatches
    rt._stages = []
    rt._defer_pp_recv = False
    rt._load_csv(str(path))
    return rt


def torch_actions(rt) -> list:
    """Per rank, torch's actions as (kind, stage, microbatch) steps (a fused step's sub-actions)."""
    out = []
    for r in sorted(rt.pipeline_order):
        row = []
        for a in rt.pipeline_order[r]:
            subs = a.sub_actions if a.sub_actions is not None else (a,)
            row.append(tuple((s.computation_type.value, s.stage_index, s.microbatch_index) for s in subs))
        out.append(row)
    return out


def ours(order: Schedule) -> list:
    return [[tuple(tuple(a) for a in step) for step in order.steps[r]] for r in range(order.ranks)]


@pytest.mark.parametrize("order", [torch_order(n) for n in TORCH_SCHEDULES] + [free_order()],
                         ids=[*TORCH_SCHEDULES, "free"])
def test_torchs_load_csv_reads_back_the_same_actions(order, tmp_path):
    path = tmp_path / "order.csv"
    path.write_text(torch_csv.to_csv(order))
    rt = torch_load(path, order)
    assert torch_actions(rt) == ours(order)
    assert rt.stage_index_to_group_rank == dict(enumerate(order.placement))
    # the lowering to communication ran: every rank has its compute actions and some sends/receives
    comms = [a for r in rt.pipeline_order_with_comms for a in rt.pipeline_order_with_comms[r]
             if a.computation_type.value.startswith(("SEND", "RECV"))]
    assert comms


def test_the_export_file_is_what_torch_loads(tmp_path):
    out = export(plan_with(free_order(), [NAMES[:3], NAMES[3:]]), "torch-csv")
    path = tmp_path / "free.csv"
    path.write_text(out["csv"])
    assert torch_actions(torch_load(path, free_order())) == ours(free_order())


@settings(max_examples=100, deadline=None)
@given(shuffled_orders())
def test_torchs_lowering_fails_exactly_on_the_orders_pipeopt_refuses(order):
    """torch's ``_add_send_recv`` (run by ``_load_csv``) schedules the sends and receives of an
    order iff pipeopt finds no blocked step: on an order pipeopt refuses (naming its first
    blocked step) torch's loader raises "Malformed compute schedule" (or, at run time, would
    hang)."""
    import os
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".csv")
    with os.fdopen(fd, "w") as fh:
        fh.write(torch_csv.to_csv(order))
    try:
        if torch_csv.first_blocked(order) is None:
            torch_load(path, order)
        else:
            with pytest.raises(AssertionError, match="Malformed compute schedule"):
                torch_load(path, order)
    finally:
        os.unlink(path)
