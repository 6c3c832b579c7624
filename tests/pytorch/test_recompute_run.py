"""``pipeopt run`` applies a plan's recompute set (``Stage.recompute``): each recomputed layer of
a stage torch's ``pipeline()`` builds runs its forward under ``torch.utils.checkpoint``
(``use_reentrant=False``), so autograd keeps its input only and the backward reruns it.

Checked by counting the layers' forward runs (never by a timing: the machine is shared) and by
the bytes MemTracker counts: in one process on a stage module (fast), and in a real 2-rank run of
the shipped ``gpt-tiny`` plus the per-stage memory measurement with and without recomputation
(slow tier: spawned gloo processes)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.pipelining")

from test_run import NAMES, tiny_instance  # noqa: E402

from pipeopt.cli import main  # noqa: E402
from pipeopt.errors import InvalidPlanError, UnsupportedPlanError  # noqa: E402
from pipeopt.export import export  # noqa: E402
from pipeopt.io import write  # noqa: E402
from pipeopt.plan import Plan, Stage  # noqa: E402
from pipeopt.torch import models  # noqa: E402
from pipeopt.torch.runtime import (  # noqa: E402
    apply_recompute,
    build_pipe,
    recompute_modes,
    recompute_report,
    run_plan,
    stage_modes,
)

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")

SPLIT = (tuple(NAMES[:4]), tuple(NAMES[4:]))
RECOMPUTE = {"layers.0": "full", "layers.1": "full"}
"""Stage 0's two transformer blocks: under 1F1B with S = 2 stage 0 holds two microbatches."""


def _plan(recompute=RECOMPUTE) -> Plan:
    return Plan((Stage(SPLIT[0], recompute=recompute), Stage(SPLIT[1])))


def test_recompute_modes_are_read_and_refused_before_any_process():
    assert recompute_modes(_plan()) == RECOMPUTE
    assert recompute_modes(_plan(None)) == {}
    # each stage process applies its own layers' modes (by the plan's stages, not by the modules
    # the stage holds: a tied head's module is built into the first stage too, never called there)
    assert stage_modes(RECOMPUTE | {"head": "full"}, [list(st) for st in SPLIT]) == [RECOMPUTE, {"head": "full"}]
    with pytest.raises(UnsupportedPlanError, match=r"layers\.1.*'selective'.*per-operator"):
        recompute_modes(_plan({"layers.0": "full", "layers.1": "selective"}))
    with pytest.raises(InvalidPlanError, match=r"stage 0 recomputes layer 'head', which it does not run"):
        recompute_modes(_plan({"head": "full"}))
    with pytest.raises(UnsupportedPlanError, match="selective"):  # timeout 1e-9: a spawn would time out at once
        run_plan(_plan({"layers.0": "selective"}), "gpt-tiny", timeout=1e-9)


def _stage0_pass(modes: dict):
    """Stage 0 of the split as pipeline() builds it, in this process: one forward and backward
    of a microbatch with ``modes`` applied; returns (counts, saved bytes, parameter grads)."""
    module, example = models.build("gpt-tiny")
    pipe = build_pipe(module, tuple(example), export(_plan(None), "torch"))
    stage = pipe.get_stage_module(0)
    calls = apply_recompute(stage, NAMES, modes)
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = stage(*example)
    out.sum().backward()
    grads = {n: p.grad.clone() for n, p in stage.named_parameters()}
    return calls, sum(saved), grads


def test_a_recomputed_layer_runs_its_forward_twice_and_keeps_less():
    """In one process: the checkpointed blocks' forwards run twice (forward, then again in the
    backward), the others once; autograd saves fewer bytes in the forward (the saved-tensor
    hooks see only what the forward keeps: a checkpointed region's saves go to checkpoint's
    own hooks); the gradients are those of the plain stage."""
    plain_calls, plain_saved, plain_grads = _stage0_pass({})
    calls, saved, grads = _stage0_pass(RECOMPUTE)
    assert plain_calls == {n: [1, 1] for n in SPLIT[0]}  # counted, nothing checkpointed
    assert calls == {"tok_emb": [1, 1], "pos_emb": [1, 1], "layers.0": [1, 2], "layers.1": [1, 2]}
    rep = recompute_report(calls, RECOMPUTE, steps=1, microbatches=1)
    assert rep["recomputed"] == ["layers.0", "layers.1"]
    assert rep["recomputations"] == {"tok_emb": 0, "pos_emb": 0, "layers.0": 1, "layers.1": 1}
    assert saved < plain_saved
    assert grads.keys() == plain_grads.keys()
    for n, g in grads.items():
        torch.testing.assert_close(g, plain_grads[n])


@pytest.mark.torchrun
def test_two_rank_run_recomputes_and_measures_less_activation_memory(tmp_path, capsys):
    """gpt-tiny at S = 2 under torch's Schedule1F1B: ``pipeopt run`` of a plan recomputing
    stage 0's two blocks reruns each block's forward exactly once per microbatch and no other
    layer's; MemTracker's peak and its activation bytes at the peak on stage 0 are lower than
    without recomputation, and stage 1 (nothing recomputed) holds the same bytes."""
    from pipeopt.torch.memory import measure_stages

    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(_plan().to_dict()))
    inst_path = tmp_path / "inst.json"
    write(tiny_instance(), inst_path)
    assert main(["run", str(plan_path), "--model", "gpt-tiny", "--instance", str(inst_path), "--microbatches", "4",
                 "--iterations", "1", "--warmup", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["membership_matches"] and out["recomputed"] == [["layers.0", "layers.1"], []]
    assert out["info"]["recomputations"] == [{n: (1.0 if n in RECOMPUTE else 0.0) for n in st} for st in SPLIT]
    assert out["info"]["forward_runs"] == [{n: (2.0 if n in RECOMPUTE else 1.0) for n in st} for st in SPLIT]

    def act(parts: dict) -> int:
        return next(v for k, v in parts.items() if getattr(k, "value", k) == "Activation")

    plain = measure_stages(_plan(None), "gpt-tiny", microbatches=4, timeout=240)
    recomputed = measure_stages(_plan(), "gpt-tiny", microbatches=4, timeout=240)
    assert recomputed[0]["recomputed"] == ["layers.0", "layers.1"] and recomputed[1]["recomputed"] == []
    assert recomputed[0]["recomputations"]["layers.0"] == recomputed[0]["recomputations"]["layers.1"] == 1.0
    assert plain[0]["forward_runs"] == {}  # nothing applied without a recompute set
    assert act(recomputed[0]["parts"]) < act(plain[0]["parts"])
    assert recomputed[0]["peak"] < plain[0]["peak"]
    assert recomputed[1]["peak"] == plain[1]["peak"]
