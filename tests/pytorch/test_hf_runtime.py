"""Hugging Face GPT-2 on torch's pipeline runtime (issue 24): the stages ``pipeline()`` builds
are the plan's, a tied weight's copy held (not run) by a stage is no difference while any
other one is, and the profile's stage overhead is fitted from what the runtime's stages pay.

Tiny configs (2 blocks, width 32), random weights, nothing downloaded; no timing is asserted.
"""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch.distributed.pipelining")
pytest.importorskip("transformers")

import torch  # noqa: E402

from pipeopt import cli, evaluate  # noqa: E402
from pipeopt.export import export  # noqa: E402
from pipeopt.plan import Plan, Stage  # noqa: E402
from pipeopt.torch import from_torch  # noqa: E402
from pipeopt.torch.models import load  # noqa: E402
from pipeopt.torch.overhead import fit, split_passes, split_point  # noqa: E402
from pipeopt.torch.probe import accumulated_backward  # noqa: E402
from pipeopt.torch.runtime import (RunReport, build_pipe, called_modules, held_not_run, module_ties,  # noqa: E402
                                   pipe_stages, stage_membership, tie_holders)

pytestmark = [pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

SPEC = "hf:GPT2LMHeadModel"
CONFIG = {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 64, "vocab_size": 128, "seq": 16, "batch": 1}
NAMES = ["transformer.wte", "transformer.wpe", "transformer.drop", "transformer.h.0", "transformer.h.1",
         "transformer.ln_f", "lm_head"]


@pytest.fixture(scope="module")
def gpt2():
    module, inputs = load(SPEC, **CONFIG)
    inst = from_torch(module, inputs, costs="estimated", device="a100-40gb")
    assert list(inst.graph.nodes) == NAMES
    return module, inputs, inst


def _report(built, planned, held=None, tied=None):
    return RunReport(schedule="1F1B", microbatches=2, iterations=1, warmup=0, stages=built, planned=planned,
                     times=[0.01], barrier=0.0, held=held, tied=tied)


@pytest.mark.parametrize("k", [1, 4, 6])
def test_two_stage_plan_is_built_as_planned(gpt2, k):
    """pipeline() runs exactly the plan's layers on each stage; stage 0 also holds lm_head (the
    copy of the tied weight it uses as transformer.wte) without running it: the tie the export
    announces, so the run's membership matches."""
    module, inputs, inst = gpt2
    plan = Plan((Stage(tuple(NAMES[:k])), Stage(tuple(NAMES[k:]))))
    exported = export(plan, "torch", graph=inst.graph)
    pipe = build_pipe(module, inputs, exported)
    built = pipe_stages(pipe, NAMES)
    assert built == exported["stages"] == [NAMES[:k], NAMES[k:]]
    held = [held_not_run(pipe.get_stage_module(i), NAMES) for i in range(2)]
    assert held == [["lm_head"], []]
    assert "lm_head" in {n for n, _ in pipe.get_stage_module(0).named_modules()}  # held, as before
    assert "lm_head" not in called_modules(pipe.get_stage_module(0))
    tied = tie_holders(exported)
    assert tied == [["lm_head", "transformer.wte"]] * 2
    report = _report(built, exported["stages"], held, tied)
    assert report.membership_matches and "stage membership = plan" in report.summary()
    assert "also holds lm_head without running it" in report.summary()


def test_ties_read_off_the_module_without_a_profile(gpt2):
    module, _, _ = gpt2
    (tie,) = module_ties(module, [NAMES[:4], NAMES[4:]])
    assert sorted(tie["layers"]) == ["lm_head", "transformer.wte"] and tie["stages"] == [0, 1]
    assert tie["name"] == "transformer.wte.weight" and tie["aliases"] == ["lm_head.weight"]
    assert module_ties(module, [NAMES]) == [{**tie, "stages": [0]}]


def test_a_real_difference_is_reported(gpt2):
    """An export whose split point is not the plan's: the built stages differ, and so does a
    module held without being run that no tie explains."""
    module, inputs, inst = gpt2
    plan = Plan((Stage(tuple(NAMES[:4])), Stage(tuple(NAMES[4:]))))
    exported = export(plan, "torch", graph=inst.graph)
    moved = {**exported, "split_spec": {"transformer.h.0": "SplitPoint.BEGINNING"}}
    pipe = build_pipe(module, inputs, moved)
    built = pipe_stages(pipe, NAMES)
    assert built == [NAMES[:3], NAMES[3:]]
    report = _report(built, exported["stages"], [held_not_run(pipe.get_stage_module(i), NAMES) for i in range(2)],
                     tie_holders(exported))
    assert report.differing_stages == [0, 1]
    assert "stage 1 also built transformer.h.0" in report.membership_message()
    stray = _report(exported["stages"], exported["stages"], [["lm_head"], []], [[], []])
    assert stray.differing_stages == [0]
    assert stray.membership_message() == "stage 0 holds lm_head without running it (no tie of the plan)"


def test_membership_of_a_module_without_a_graph():
    """A stage module that is no fx graph: every module it holds counts as built."""
    seq = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    assert called_modules(seq) is None
    assert stage_membership(seq, ["0", "1", "2"]) == ["0", "1"] and held_not_run(seq, ["0"]) == []


@pytest.mark.slow
@pytest.mark.torchrun
def test_pipeopt_run_exit_code_follows_the_built_stages(gpt2, tmp_path, monkeypatch, capsys):
    """Two real processes: the plan as planned exits 0; the same plan with the split point moved
    in the export (what the processes build) exits RUN_DIFFERS naming the stages."""
    import pipeopt.torch.runtime as runtime

    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"stages": [{"layers": NAMES[:4]}, {"layers": NAMES[4:]}]}))
    args = ["run", str(path), "--model", SPEC, "--iterations", "1", "--warmup", "0", "--microbatches", "2"]
    args += [a for k, v in CONFIG.items() for a in ("--model-arg", f"{k}={v}")]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "stage membership = plan" in out
    assert "tied gradients all-reduced after each iteration's flush: stage 0: transformer.wte.weight; stage 1: " \
           "lm_head.weight" in out
    real = runtime.export

    def moved(*a, **k):
        out = real(*a, **k)
        return {**out, "split_spec": {"transformer.h.0": "SplitPoint.BEGINNING"}}

    monkeypatch.setattr(runtime, "export", moved)
    assert cli.main(args) == cli.RUN_DIFFERS
    err = capsys.readouterr().err
    assert "stages built differ from the plan" in err and "also built transformer.h.0" in err


# ---- the stage overhead ---------------------------------------------------------------------
def test_split_passes_times_the_two_stages_pipeline_builds(gpt2):
    module, inputs, _ = gpt2
    assert split_point(NAMES) == "transformer.h.0" and split_point(NAMES[:1]) is None
    out = split_passes(module, inputs, NAMES, repeats=2, warmup=0, microbatches=2)
    assert out["split"] == "transformer.h.0" and out["stages"] == [NAMES[:3], NAMES[3:]]
    assert all(t >= f > 0 for t, f in zip(out["total"], out["forward"]))
    assert "whole_total" not in out
    assert split_passes(module, inputs, NAMES[:1], repeats=1, warmup=0) is None
    paired = split_passes(module, inputs, NAMES, repeats=1, warmup=0, whole=module)  # the whole model, same rounds
    assert paired["whole_total"] >= paired["whole_forward"] > 0


def _split(total, forward):
    return {"split": "b", "stages": [["a"], ["b"]], "total": total, "forward": forward}


LAYERS_T, LAYERS_F = {"a": 3.0, "b": 5.0}, {"a": 1.0, "b": 2.0}  # L = 8 s (3 forward, 5 backward)


def _predicted(out, stages):
    """Per stage, the layers' scaled times plus the constant: what the cost model charges."""
    sf, sb = out["scale"]["forward"], out["scale"]["backward"]
    over = out["stage_overhead"]
    return [sum(LAYERS_F[x] * sf + (LAYERS_T[x] - LAYERS_F[x]) * sb for x in st) + over["forward"] + over["backward"]
            for st in stages]


def test_fit_reproduces_the_whole_model_and_the_split():
    """E1 = whole - L = 2 s (1 forward), E2 = split - L = 3 s (1.5 forward): a constant of
    1 s per stage (0.5 forward) and a share of 1 s on the layers."""
    out = fit(10.0, 4.0, _split([4.5, 6.5], [1.75, 2.75]), LAYERS_T, LAYERS_F)
    assert out["whole_excess"] == pytest.approx({"forward": 1.0, "backward": 1.0})
    assert out["split_excess"] == pytest.approx({"forward": 1.5, "backward": 1.5})
    assert out["stage_overhead"] == pytest.approx({"forward": 0.5, "backward": 0.5})
    assert out["scale"] == pytest.approx({"forward": 1 + 0.5 / 3, "backward": 1 + 0.5 / 5})
    assert sum(_predicted(out, [["a", "b"]])) == pytest.approx(10.0)  # one stage: the whole model
    assert sum(_predicted(out, [["a"], ["b"]])) == pytest.approx(11.0)  # two stages: their sum


def test_fit_when_the_whole_model_pays_what_no_stage_does():
    """E1 > E2 (a tied weight's gradients summed in one module): no constant, the split's excess
    on the layers; the one-stage prediction falls E1 - E2 short, never below the layers."""
    out = fit(14.0, 5.0, _split([4.0, 6.0], [1.5, 2.5]), LAYERS_T, LAYERS_F)
    assert out["stage_overhead"] == {"forward": 0.0, "backward": 0.0}
    assert sum(_predicted(out, [["a"], ["b"]])) == pytest.approx(10.0)
    assert sum(_predicted(out, [["a", "b"]])) == pytest.approx(10.0)


def test_fit_takes_the_tie_sums_out_first():
    """A tie on a and b with 4 s per sum: the whole model (both) pays one sum, neither stage of
    the split does; with the sum taken out, the fit is the one of whole = 10 s (the first test),
    and the cost model's one-stage prediction (the layers, the constant and the sum) is the 14 s
    measured."""
    out = fit(14.0, 4.0, _split([4.5, 6.5], [1.75, 2.75]), LAYERS_T, LAYERS_F, [({"a", "b"}, 4.0)])
    ref = fit(10.0, 4.0, _split([4.5, 6.5], [1.75, 2.75]), LAYERS_T, LAYERS_F)
    assert all(out[k] == pytest.approx(ref[k]) for k in ref)
    assert sum(_predicted(out, [["a", "b"]])) + 4.0 == pytest.approx(14.0)
    # a stage of the split holding both (a tie on b and a third layer c of stage 1) pays it too
    split = {"split": "b", "stages": [["a"], ["b", "c"]], "total": [4.5, 6.5 + 4.0], "forward": [1.75, 2.75]}
    both = fit(14.0, 4.0, split, {**LAYERS_T, "c": 0.0}, {**LAYERS_F, "c": 0.0}, [({"b", "c"}, 4.0)])
    assert all(both[k] == pytest.approx(ref[k]) for k in ref)


def test_fit_clamps_to_the_split_and_at_zero():
    """E2 much above E1: the constant is at most E2 / 2 (no negative share); excesses below 0
    count 0."""
    out = fit(8.0, 3.0, _split([6.0, 8.0], [2.0, 3.0]), LAYERS_T, LAYERS_F)
    assert out["stage_overhead"] == pytest.approx({"forward": 1.0, "backward": 2.0})
    assert out["scale"] == pytest.approx({"forward": 1.0, "backward": 1.0})
    assert sum(_predicted(out, [["a"], ["b"]])) == pytest.approx(14.0)
    low = fit(6.0, 2.0, _split([2.0, 3.0], [0.5, 1.0]), LAYERS_T, LAYERS_F)
    assert low["stage_overhead"] == {"forward": 0.0, "backward": 0.0} and low["scale"] == {"forward": 1.0,
                                                                                            "backward": 1.0}


def test_accumulated_backward_weighs_the_first_microbatch():
    assert accumulated_backward([1.0, 3.0], [4.0, 4.0, 6.0], 4) == pytest.approx((2.0 + 3 * 4.0) / 4)
    assert accumulated_backward([2.0], [], 4) == 2.0 and accumulated_backward([], [5.0], 1) == 5.0
    with pytest.raises(ValueError):
        accumulated_backward([], [], 2)


def test_measured_profile_records_the_fit(gpt2):
    """from_torch (measured) on tiny GPT-2: the split's times and the scale in the provenance,
    the layers' times scaled, the constant at least 0, and the assumption line says how."""
    module, inputs, _ = gpt2
    inst = from_torch(module, inputs, repeats=1, warmup=0, microbatches=2)
    g = inst.graph
    meta = g.graph["torch"]
    assert meta["split_stages_s"]["split"] == "transformer.h.0" and meta["split_stages_s"]["whole_total"] > 0
    scale = meta["runtime_scale"]
    assert scale["forward"] >= 1.0 and scale["backward"] >= 1.0
    over = g.graph["stage_overhead"]
    assert over["forward"] >= 0 and over["backward"] >= 0
    assert sum(d["fwd"]["cpu"] + d["bwd"]["cpu"] for _, d in g.nodes(data=True)) >= meta["sum_of_layers_s"] * (1 - 1e-9)
    assert all(d["bwd_w"]["cpu"] <= d["bwd"]["cpu"] * (1 + 1e-12) for _, d in g.nodes(data=True))
    assert any("pipeline() split at transformer.h.0" in a for a in inst.assumptions)
    tie = g.graph["tied"][0]  # wte = lm_head: one out-of-place sum of its gradients, timed
    assert tie["sum_s"]["cpu"] > 0 and any("sums their gradients" in a for a in inst.assumptions)
    one = inst.with_settings(objective="bottleneck")
    from pipeopt.problems.partition import PartitionProblem

    plan = PartitionProblem(one, 1).plan([])
    base = g.copy()
    base.graph["tied"] = [{k: v for k, v in tie.items() if k != "sum_s"}]
    unsummed = evaluate(one.__class__(base, one.cluster, one.settings), plan)
    assert evaluate(one, plan).bottleneck == pytest.approx(unsummed.bottleneck + tie["sum_s"]["cpu"])
