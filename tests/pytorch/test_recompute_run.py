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
from pipeopt.errors import InvalidPlanError  # noqa: E402
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
    # selective (torchtitan's per-operator policy) is applied too
    assert recompute_modes(_plan({"layers.0": "full", "layers.1": "selective"})) == {"layers.0": "full",
                                                                                     "layers.1": "selective"}
    with pytest.raises(InvalidPlanError, match=r"stage 0 recomputes layer 'head', which it does not run"):
        recompute_modes(_plan({"head": "full"}))
    with pytest.raises(InvalidPlanError, match="head"):  # timeout 1e-9: a spawn would time out at once
        run_plan(_plan({"head": "selective"}), "gpt-tiny", timeout=1e-9)


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


def test_selective_recomputation_keeps_what_its_policy_saves():
    """``"selective"`` (torchtitan's per-operator policy, pipeopt.torch.recompute): the block's
    forward reruns in the backward, autograd's own hooks see less than without recomputation,
    the gradients are the plain stage's; the policy saves the attention output and every other
    matrix product, so the bytes it keeps lie between full recomputation's (nothing of the
    block) and none."""
    from pipeopt.torch.recompute import selective_saved_bytes

    _, plain_saved, plain_grads = _stage0_pass({})
    modes = {"layers.0": "selective", "layers.1": "selective"}
    calls, saved, grads = _stage0_pass(modes)
    assert calls["layers.0"] == calls["layers.1"] == [1, 2]
    assert recompute_report(calls, modes, steps=1, microbatches=1)["recomputed"] == ["layers.0", "layers.1"]
    assert saved < plain_saved
    for n, g in grads.items():
        torch.testing.assert_close(g, plain_grads[n])
    module, _ = models.build("gpt-tiny")
    x = torch.randn(2, 16, 32, requires_grad=True)
    kept = selective_saved_bytes(module.layers[0], (x,))
    # gpt-tiny's block: attention output (2 x 2 x 16 x 16 floats) + its logsumexp (2 x 2 x 16)
    # + the 1st and 3rd of its four addmm outputs (qkv: 32 x 96, fc: 32 x 128), float32
    assert kept == 4 * (2 * 2 * 16 * 16 + 2 * 2 * 16 + 32 * 96 + 32 * 128)


def test_stage_modules_run_generated_code():
    """pipeline()'s stage modules run their generated code, not torch.fx.Interpreter (the
    rerun of a recomputed layer paid the interpreter: 2.2x the eager forward); the result is
    the eager model's."""
    module, example = models.build("gpt-tiny")
    pipe = build_pipe(module, tuple(example), export(_plan(None), "torch"))
    flags = [m._run_with_interpreter for s in range(pipe.num_stages) for m in pipe.get_stage_module(s).modules()
             if hasattr(m, "_run_with_interpreter")]
    assert flags and not any(flags)
    with torch.no_grad():
        out = pipe.get_stage_module(1)(pipe.get_stage_module(0)(*example))
        torch.testing.assert_close(out, module(*example))


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


def _split_backward(fn, block, x0):
    """One forward of ``fn`` and torch's split backward (I: stage_backward_input, W:
    stage_backward_weight, one autograd.grad per parameter group), as _PipelineScheduleRuntime
    runs them; returns (the input gradient, the weight gradients, the parameter groups)."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    for p in block.parameters():
        p.grad = None
    x = x0.clone().requires_grad_(True)
    out = fn(x)
    grads_in, groups = stage_backward_input([out], [torch.ones_like(out)], [x], block.parameters())
    n = len(groups)
    stage_backward_weight(block.parameters(), groups)
    return grads_in[0].clone(), {k: p.grad.clone() for k, p in block.named_parameters()}, n


def test_split_backward_reruns_a_recomputed_layer_once():
    """torch's checkpoint reruns a layer in I and again in every W parameter group that reaches
    it (1 + the groups per microbatch); rerun_once (what pipeopt run applies in an order whose
    backward is split) reruns it once, and the gradients are the plain layer's."""
    from pipeopt.torch.recompute import checkpointed

    module, _ = models.build("gpt-tiny")
    block = module.layers[0]
    runs = [0]

    def counted(x):
        runs[0] += 1
        return block(x)

    x0 = torch.randn(2, 16, 32)
    got = {}
    for key, fn in (("plain", counted), ("torch", checkpointed(counted, "full")),
                    ("once", checkpointed(counted, "full", once=True))):
        runs[0] = 0
        got[key] = (*_split_backward(fn, block, x0), runs[0])
    gi, gw, groups, plain_runs = got["plain"]
    assert plain_runs == 1 and groups > 1
    assert got["torch"][3] > 2  # torch reruns per W parameter group
    assert got["once"][3] == 2  # the forward and one rerun
    for key in ("torch", "once"):
        torch.testing.assert_close(got[key][0], gi)
        for k, g in gw.items():
            torch.testing.assert_close(got[key][1][k], g)


def test_rerun_once_replays_the_random_state_and_frees_after_w():
    """A layer with dropout draws the same mask in its rerun (the gradients equal the plain
    layer's under the same seed), and the rerun's tensors are freed with the graph."""
    import gc
    import weakref

    from pipeopt.torch.recompute import rerun_once

    lin = torch.nn.Linear(8, 8)
    drop = torch.nn.Dropout(0.5)

    def fn(x):
        return drop(torch.tanh(lin(x)))

    x0 = torch.randn(4, 8)
    grads = []
    for wrap in (fn, lambda x: rerun_once(fn, x)):
        torch.manual_seed(3)
        lin.weight.grad = None
        x = x0.clone().requires_grad_(True)
        wrap(x).sum().backward()
        grads.append((x.grad.clone(), lin.weight.grad.clone()))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])
    seen = []

    def spy(x):
        y = torch.tanh(lin(x))
        seen.append(weakref.ref(y))
        return y

    x = x0.clone().requires_grad_(True)
    out = rerun_once(spy, x)
    out.sum().backward()
    del out
    gc.collect()
    assert len(seen) == 2 and all(r() is None for r in seen)


@pytest.mark.torchrun
def test_zero_bubble_order_reruns_each_recomputed_layer_once(tmp_path, capsys):
    """A ZBV order (backward split into I and W) on gpt-tiny with stage 0's blocks recomputed:
    each reruns exactly once per microbatch (torch's checkpoint: 7.17 measured), no other
    layer reruns."""
    from test_run_order import _plan_file

    from pipeopt.export.torch_csv import to_csv
    from pipeopt.schedules import make_schedule

    order = make_schedule("ZBVZeroBubble", ranks=2, microbatches=2)
    chunks = [tuple(NAMES[:3]), tuple(NAMES[3:4]), tuple(NAMES[4:6]), tuple(NAMES[6:])]
    rc = [{"layers.0": "full"}, {"layers.1": "full"}, {}, {}]
    plan_path, inst = _plan_file(tmp_path, Plan(tuple(Stage(c, recompute=r or None) for c, r in zip(chunks, rc))))
    csv_path = tmp_path / "zbv.csv"
    csv_path.write_text(to_csv(order))
    assert main(["run", str(plan_path), "--model", "gpt-tiny", "--instance", str(inst), "--order", str(csv_path),
                 "--iterations", "1", "--warmup", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["recomputed"] == [["layers.0"], ["layers.1"], [], []]
    assert out["info"]["recomputations"] == [{n: (1.0 if n in r else 0.0) for n in c} for c, r in zip(chunks, rc)]


def test_the_prediction_of_a_plan_without_devices_keeps_its_recompute_sets():
    """prediction / order_prediction place a plan without devices on the cluster's devices and
    keep each stage's recompute set (they dropped it: the prediction was the plan's without
    recomputation)."""
    from pipeopt.schedules import make_schedule
    from pipeopt.torch.runtime import order_prediction, prediction

    inst = tiny_instance()
    plain, redo = _plan(None), _plan()
    assert prediction(inst, redo, "1f1b", 4) > prediction(inst, plain, "1f1b", 4)
    order = make_schedule("1F1B", ranks=2, microbatches=4)
    assert order_prediction(inst, redo, order) > order_prediction(inst, plain, order)


def test_profile_measures_full_and_selective_recomputation():
    """from_torch (measured costs) records per layer what a full recomputation adds
    (recompute_fwd) and the selective one (selective = {act_bytes, fwd}), and the one rule
    (rules.recompute_terms) charges them: on gpt-tiny's blocks the selective policy keeps the
    block's input plus the attention output and every other matrix product's output - more
    than full recomputation keeps (the input), less than no recomputation (act_bytes)."""
    from pipeopt.cost.rules import recompute_terms
    from pipeopt.graph import edge_bytes
    from pipeopt.torch import from_torch

    module, example = models.build("gpt-tiny")
    inst = from_torch(module, example, repeats=1, warmup=0)
    g = inst.graph
    for n in g.nodes:
        a = g.nodes[n]
        assert a["recompute_fwd"]["cpu"] >= 0 and a["selective"]["fwd"]["cpu"] >= 0
        assert a["selective"]["act_bytes"] <= a["act_bytes"]
        kept, extra = recompute_terms(g, n, "full")
        assert extra == a["recompute_fwd"]
        assert kept == sum(edge_bytes(g, u, n) for u in g.predecessors(n))
        assert recompute_terms(g, n, "selective") == (a["selective"]["act_bytes"], a["selective"]["fwd"])
    block = g.nodes["layers.1"]
    inputs = sum(edge_bytes(g, u, "layers.1") for u in g.predecessors("layers.1"))
    saved = 4 * (2 * 2 * 16 * 16 + 2 * 2 * 16 + 32 * 96 + 32 * 128)  # see the policy test above
    assert block["selective"]["act_bytes"] == inputs + saved
    assert recompute_terms(g, "layers.1", "full")[0] < block["selective"]["act_bytes"] < block["act_bytes"]


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_hf_gpt2_blocks_recompute_on_the_stage_modules(mode):
    """Hugging Face GPT-2 (tiny config, random weights, dropout on): its blocks recomputed in
    the stage modules pipeline() builds rerun once in the backward, and the gradients are the
    plain stages' under the same seed (the checkpoint replays the dropout masks)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    pytest.importorskip("transformers")
    config = {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 64, "vocab_size": 128, "seq": 16, "batch": 1}
    names = ["transformer.wte", "transformer.wpe", "transformer.drop", "transformer.h.0", "transformer.h.1",
             "transformer.ln_f", "lm_head"]
    plan = Plan((Stage(tuple(names[:4])), Stage(tuple(names[4:]))))

    def run(modes):
        module, example = models.load("hf:GPT2LMHeadModel", **config)
        pipe = build_pipe(module, tuple(example), export(plan, "torch"))
        stages = [pipe.get_stage_module(s) for s in range(2)]
        calls = [apply_recompute(st, names, {n: m for n, m in modes.items() if n in plan.stages[s].layers})
                 for s, st in enumerate(stages)]
        torch.manual_seed(7)
        mid = stages[0](*example)
        out = stages[1](*(mid if isinstance(mid, tuple) else (mid,)))
        _sum = out.sum() if isinstance(out, torch.Tensor) else sum(o.sum() for o in out if o.is_floating_point())
        _sum.backward()
        return calls, {n: p.grad.clone() for st in stages for n, p in st.named_parameters() if p.grad is not None}

    plain_calls, plain = run({})
    modes = {"transformer.h.0": mode, "transformer.h.1": mode}
    calls, grads = run(modes)
    assert calls[0]["transformer.h.0"] == [1, 2] and calls[1]["transformer.h.1"] == [1, 2]
    assert plain_calls[0]["transformer.h.0"] == [1, 1]
    assert grads.keys() == plain.keys()
    for n, g in grads.items():
        torch.testing.assert_close(g, plain[n])
