"""Tied gradients in an action order's run (issue 24): gpt-tiny with its LM head tied to its
token embedding, run on torch's ``_PipelineScheduleRuntime`` over a free order (split backward,
two gloo processes) and over ZBVZeroBubble's V placement (stages 0 and 3 on rank 0: the two
copies are summed on the rank, no all-reduce); and the summing itself in one process
(:func:`pipeopt.torch.runtime.sync_ties` over :func:`order_tie_syncs` for copies on one rank)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.pipelining")

from test_run import NAMES, tiny_instance  # noqa: E402

from pipeopt.cli import main  # noqa: E402
from pipeopt.export.torch_csv import to_csv  # noqa: E402
from pipeopt.plan import Plan, Stage  # noqa: E402
from pipeopt.schedules import make_schedule  # noqa: E402
from pipeopt.torch.runtime import order_tie_syncs, run_plan, sync_ties, tie_syncs  # noqa: E402
from strategies import hand_free_order  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")

TIE = {"name": "tok_emb.weight", "aliases": ["head.weight"], "layers": ["tok_emb", "head"], "stages": [0, 3]}


class _Emb(torch.nn.Module):
    def __init__(self, weight=None):
        super().__init__()
        self.tok_emb = torch.nn.Embedding(4, 2)
        if weight is not None:
            self.tok_emb.weight = weight

    def forward(self, x):
        return self.tok_emb(x)


def test_copies_on_one_rank_are_summed_without_a_group():
    a, b = _Emb(), _Emb()
    a.tok_emb.weight.grad = torch.ones(4, 2)
    b.tok_emb.weight.grad = torch.full((4, 2), 2.0)
    syncs = order_tie_syncs({0: a, 3: b}, {0: 0, 1: 1, 2: 1, 3: 0}, 0, [TIE])
    assert [(n, g) for n, g, _ in syncs] == [("tok_emb.weight", None)] and len(syncs[0][2]) == 2
    sync_ties(syncs)
    assert torch.equal(a.tok_emb.weight.grad, torch.full((4, 2), 3.0))
    assert torch.equal(b.tok_emb.weight.grad, torch.full((4, 2), 3.0))
    assert order_tie_syncs({1: a, 2: b}, {0: 0, 1: 1, 2: 1, 3: 0}, 1, [TIE]) == []  # rank 1 holds none


def test_a_tie_on_one_stage_needs_no_sync():
    one = {**TIE, "stages": [0]}
    assert tie_syncs(_Emb(), 0, [one]) == [] and order_tie_syncs({0: _Emb()}, {0: 0}, 0, [one]) == []


def _checked_order_run(rank, world, job):
    """``_order_run`` recording each tied copy's gradient before and after :func:`sync_ties`
    (module-level: the spawned process imports this test module by name)."""
    from pipeopt.torch import runtime

    seen = []
    real = runtime.sync_ties

    def recording(syncs):
        before = [[p.grad.clone() for p in ps if p.grad is not None] for _, _, ps in syncs]
        real(syncs)
        after = [[p.grad.clone() for p in ps if p.grad is not None] for _, _, ps in syncs]
        seen.append((before, after))

    runtime.sync_ties = recording
    out = runtime._order_run(rank, world, job)
    out["grads"] = [[t.tolist() for t in a] for a in seen[-1][1]]
    out["before"] = [[t.tolist() for t in b] for b in seen[-1][0]]
    return out


@pytest.mark.torchrun
def test_the_tied_copies_hold_the_sum_after_a_free_order_run(monkeypatch):
    import pipeopt.torch.runtime as runtime

    order = hand_free_order()
    names = [d.name for d in tiny_instance().cluster.devices]
    plan = Plan(tuple(Stage(c, devices=(names[r],)) for c, r in zip((tuple(NAMES[:3]), tuple(NAMES[3:])),
                                                                      order.placement, strict=True)),
                schedule=order.to_dict())
    captured = {}
    real_spawn = runtime._spawn

    def spawn(world, job, timeout):
        captured["results"] = real_spawn(world, {**job, "run": _checked_order_run}, timeout)
        return captured["results"]

    monkeypatch.setattr(runtime, "_spawn", spawn)
    run_plan(plan, "gpt-tiny", model_kwargs={"tie_weights": True}, iterations=1, warmup=0, timeout=240)
    r0, r1 = captured["results"]
    g0, g1 = torch.tensor(r0["grads"][0][0]), torch.tensor(r1["grads"][0][0])
    b0, b1 = torch.tensor(r0["before"][0][0]), torch.tensor(r1["before"][0][0])
    assert not torch.equal(b0, b1)  # the embedding's and the head's contributions differ
    assert torch.allclose(g0, b0 + b1) and torch.equal(g0, g1)


@pytest.mark.torchrun
def test_a_free_order_run_sums_the_tied_gradient_across_ranks():
    order = hand_free_order()
    names = [d.name for d in tiny_instance().cluster.devices]
    plan = Plan(tuple(Stage(c, devices=(names[r],)) for c, r in zip((tuple(NAMES[:3]), tuple(NAMES[3:])),
                                                                      order.placement, strict=True)),
                schedule=order.to_dict())
    report = run_plan(plan, "gpt-tiny", model_kwargs={"tie_weights": True}, iterations=1, warmup=1, timeout=240)
    assert report.membership_matches and report.ranks == 2
    assert report.info["tie_sync"] == [["tok_emb.weight"], ["head.weight"]]
    assert len(report.info["per_rank_cpu"][0]) == 1
    assert "tied gradients all-reduced after each iteration's flush: rank 0: tok_emb.weight; rank 1: head.weight" \
        in report.summary()


@pytest.mark.torchrun
def test_a_v_placed_order_sums_the_tied_copies_on_rank_0(tmp_path, capsys):
    from pipeopt.io import write

    order = make_schedule("ZBVZeroBubble", ranks=2, microbatches=2)
    chunks = [tuple(NAMES[:3]), tuple(NAMES[3:4]), tuple(NAMES[4:6]), tuple(NAMES[6:])]
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(Plan(tuple(Stage(c) for c in chunks)).to_dict()))
    inst = tmp_path / "inst.json"
    write(tiny_instance(), inst)
    csv_path = tmp_path / "zbv.csv"
    csv_path.write_text(to_csv(order))
    assert main(["run", str(plan_path), "--model", "gpt-tiny", "--model-arg", "tie_weights=true",
                 "--order", str(csv_path), "--iterations", "1", "--warmup", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["membership_matches"] and out["info"]["placement"] == [0, 1, 1, 0]
    assert out["info"]["tie_sync"] == [["tok_emb.weight"], []]


def test_stage_processes_are_pinned_when_they_fit_the_cores(monkeypatch):
    import os

    from pipeopt.torch.runtime import PIN_ENV, pin_rank, pins

    if not hasattr(os, "sched_setaffinity"):
        assert pin_rank(0, 1) is None
        return
    before = os.sched_getaffinity(0)
    monkeypatch.setenv(PIN_ENV, "0")
    assert not pins(1) and pin_rank(0, 1) is None
    monkeypatch.delenv(PIN_ENV, raising=False)  # auto: pinned while the processes fit the cores
    assert pins(len(before)) and not pins(len(before) + 1)
    assert pin_rank(0, len(before) + 1) is None and os.sched_getaffinity(0) == before
    monkeypatch.setenv(PIN_ENV, "1")
    try:
        core = pin_rank(len(before) + 1, len(before) + 2)
        assert core == sorted(before)[(len(before) + 1) % len(before)] and os.sched_getaffinity(0) == {core}
    finally:
        os.sched_setaffinity(0, before)
