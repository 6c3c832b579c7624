"""``pipeopt grade``: each input form (Megatron layout, torchtitan FQN lists, DeepSpeed parts, torch
split_spec) mapped onto a model-zoo transformer and onto the shipped ``gpt-tiny`` profiled by
``from_torch``; the round trip export -> grade gives gap 0 for the proven optimal plan; every
mismatch is refused naming the problem. The solves run with no time limit (``time_limit=None``):
the proofs do not depend on the machine's speed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pipeopt import evaluate, solve
from pipeopt.cli import main
from pipeopt.errors import InvalidPlanError, InvalidProblemError, ReadError
from pipeopt.export import export, write
from pipeopt.grade import (Grade, Layout, from_deepspeed, from_megatron, from_split_spec, from_torchtitan, grade,
                           read_deepspeed_parts, read_split_spec, read_torchtitan)
from pipeopt.io import load
from pipeopt.plan import Plan, Stage

from conftest import ROOT

ZOO = ROOT / "instances" / "homogeneous" / "bert-large-a100-40gb-x4.json"
"""A model-zoo transformer: input, embed, layer<i>_attn, layer<i>_mlp (24 blocks), head."""


@pytest.fixture(scope="module")
def zoo():
    return load(ZOO)


@pytest.fixture(scope="module")
def tiny():
    """The shipped gpt-tiny, profiled with estimated costs (no timing: deterministic)."""
    pytest.importorskip("torch.fx")
    from pipeopt import from_torch
    from pipeopt.torch import models

    return from_torch(*models.build("gpt-tiny"), costs="estimated", device="a100-40gb", devices=4)


GPT = ["tok_emb", "pos_emb", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "head"]


def zoo_blocks(lo: int, hi: int) -> list[str]:
    return [f"layer{i}_{p}" for i in range(lo, hi) for p in ("attn", "mlp")]


# ---- each input form, mapped ------------------------------------------------------------------

def test_megatron_layout_maps_letters_to_blocks(zoo):
    lay = from_megatron(zoo, "Et*6|t*6|(t*3|)*2t*6L")
    assert lay.num_stages == 5
    assert lay.stages[0] == ("input", "embed", *zoo_blocks(0, 6))
    assert lay.stages[2] == tuple(zoo_blocks(12, 15)) and lay.stages[3] == tuple(zoo_blocks(15, 18))
    assert lay.stages[4] == (*zoo_blocks(18, 24), "head")
    # commas are cosmetic, as in Megatron's parser
    assert from_megatron(zoo, "E,t*12|t*12,L").stages == from_megatron(zoo, "Et*12|t*12L").stages


def test_megatron_layout_on_the_torch_graph(tiny):
    lay = from_megatron(tiny, "Et|t*3L")
    assert [list(s) for s in lay.stages] == [GPT[:3], GPT[3:]]
    assert from_megatron(tiny, "E|t*4|L").stages == (tuple(GPT[:2]), tuple(GPT[2:6]), tuple(GPT[6:]))


def test_torchtitan_lists_map_fqns(tiny, zoo):
    lay = from_torchtitan(tiny, [GPT[:4], GPT[4:]])
    assert [list(s) for s in lay.stages] == [GPT[:4], GPT[4:]]
    # a zoo graph's input node (pinned to the first stage) may be left out
    parts = [["embed", *zoo_blocks(0, 12)], [*zoo_blocks(12, 24), "head"]]
    lay = from_torchtitan(zoo, parts)
    assert lay.stages[0][0] == "input" and any("input" in n for n in lay.notes)


def test_deepspeed_parts_slice_the_execution_order(tiny, zoo):
    assert [list(s) for s in from_deepspeed(tiny, [0, 3, 5, 8]).stages] == [GPT[:3], GPT[3:5], GPT[5:]]
    n = zoo.graph.number_of_nodes()
    assert from_deepspeed(zoo, [0, 26, n]).stages[1][0] == "layer12_attn"


def test_split_spec_cuts_as_pipeline_does(tiny):
    for spec in ({"layers.2": "SplitPoint.BEGINNING"}, {"layers.1": "end"}, {"layers.2": "Beginning"}):
        assert [list(s) for s in from_split_spec(tiny, spec).stages] == [GPT[:4], GPT[4:]]
    three = from_split_spec(tiny, {"layers.0": "beginning", "norm": "beginning"})
    assert [list(s) for s in three.stages] == [GPT[:2], GPT[2:6], GPT[6:]]


# ---- refusals ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, match", [
    ("Et*12|t*11L", "Number of decoder layers 23 must match num_layers 24"),
    ("t*12E|t*12L", "first layer must be embedding"),
    ("Et*12|t*12", "last layer must be loss"),
    ("Et*12|t*12mL", "multi-token-prediction"),
    ("Et*12||t*12L", "stage 1 is empty"),
    ("Et*12|x*12L", "Invalid layer character: x"),
])
def test_megatron_layouts_that_do_not_fit_are_refused(zoo, text, match):
    with pytest.raises(InvalidPlanError, match=match):
        from_megatron(zoo, text)


def test_torchtitan_mismatches_are_refused(tiny):
    with pytest.raises(InvalidPlanError, match="'layers.9' .* is no module"):
        from_torchtitan(tiny, [GPT[:4], [*GPT[4:], "layers.9"]])
    with pytest.raises(InvalidPlanError, match="inside its layer 'layers.1'"):
        from_torchtitan(tiny, [GPT[:4], [*GPT[4:], "layers.1.attn"]])
    with pytest.raises(InvalidPlanError, match="not contiguous"):
        from_torchtitan(tiny, [["tok_emb", "pos_emb", "layers.0", "layers.2"], ["layers.1", "layers.3", "norm", "head"]])
    with pytest.raises(InvalidPlanError, match="in no stage"):
        from_torchtitan(tiny, [GPT[:4], GPT[4:7]])
    with pytest.raises(InvalidPlanError, match="in part 0 and part 1"):
        from_torchtitan(tiny, [GPT[:4], GPT[3:]])
    with pytest.raises(InvalidPlanError, match="list of lists"):
        from_torchtitan(tiny, ["tok_emb"])


def test_deepspeed_and_split_spec_mismatches_are_refused(tiny):
    with pytest.raises(InvalidPlanError, match="from 0 to 8, the layers of .*wrong layer count"):
        from_deepspeed(tiny, [0, 4, 9])
    with pytest.raises(InvalidPlanError, match="stage 1 = layers\\[4:4\\] is empty"):
        from_deepspeed(tiny, [0, 4, 4, 8])
    with pytest.raises(InvalidPlanError, match="'blocks.2' is no module"):
        from_split_spec(tiny, {"blocks.2": "beginning"})
    with pytest.raises(InvalidPlanError, match="inside its layer 'layers.2'"):
        from_split_spec(tiny, {"layers.2.mlp": "beginning"})
    with pytest.raises(InvalidPlanError, match="not SplitPoint.BEGINNING or END"):
        from_split_spec(tiny, {"layers.2": "middle"})
    with pytest.raises(InvalidPlanError, match="two split points fall at one place"):
        from_split_spec(tiny, {"layers.2": "beginning", "layers.1": "end"})


def test_readers(tmp_path):
    assert read_deepspeed_parts("0,5,9,13") == [0, 5, 9, 13] == read_deepspeed_parts("[0, 5, 9, 13]")
    with pytest.raises(ReadError, match="integers"):
        read_deepspeed_parts("0,five")
    f = tmp_path / "titan.json"
    f.write_text(json.dumps([["a"], ["b"]]))
    assert read_torchtitan(f) == [["a"], ["b"]]
    f.write_text(json.dumps({"parallelism": {"module_fqns_per_model_part": [["a"]]}}))
    assert read_torchtitan(f) == [["a"]]
    toml = tmp_path / "job.toml"
    toml.write_text('[parallelism]\nmodule_fqns_per_model_part = [["a"], ["b"]]\n')
    assert read_torchtitan(toml) == [["a"], ["b"]]
    f.write_text(json.dumps({"other": 1}))
    with pytest.raises(ReadError, match="no module_fqns_per_model_part"):
        read_torchtitan(f)
    s = tmp_path / "spec.json"
    s.write_text(json.dumps({"layers.2": "beginning"}))
    assert read_split_spec(s) == {"layers.2": "beginning"}
    with pytest.raises(ReadError, match="cannot read"):
        read_split_spec(tmp_path / "missing.json")


# ---- the grade ------------------------------------------------------------------------------

def test_grade_scores_by_the_one_evaluation_and_certifies_the_gap(zoo):
    lay = from_megatron(zoo, "Et*6|t*6|t*6|t*6L")
    g = grade(zoo, lay, time_limit=None)
    assert g.time == pytest.approx(evaluate(zoo, g.plan).objective)
    assert g.objective.startswith("bottleneck: 1F1B steady-state time per microbatch")
    best = solve(zoo, stages=4, time_limit=None)
    assert g.proven and g.optimum.objective == pytest.approx(best.objective)
    assert g.gap == pytest.approx((g.time - best.lower_bound) / g.time) and g.gap > 0.05
    assert "to the proven optimum" in g.summary()
    assert json.loads(json.dumps(g.to_dict()))["stages"][0][:2] == ["input", "embed"]


def test_grade_under_a_schedule_uses_the_executor(tiny):
    from pipeopt.problems.schedule import ScheduleProblem

    lay = from_deepspeed(tiny, [0, 3, 8])
    g = grade(tiny, lay, schedule="1f1b", microbatches=4, method="exhaustive", time_limit=None)
    prob = ScheduleProblem(tiny, schedule="1F1B", stages=2, microbatches=4)
    assert g.time == pytest.approx(prob.execute([3]).time)
    assert g.proven and g.optimum.space == "schedule:1F1B" and g.gap >= 0
    four = grade(tiny, from_deepspeed(tiny, [0, 2, 4, 6, 8]), schedule="Interleaved1F1B", microbatches=4,
                 method="exhaustive", time_limit=None)
    assert "2 ranks x 2 stages" in four.objective
    with pytest.raises(InvalidProblemError, match="runs 2 stages per rank; the layout has 3"):
        grade(tiny, from_deepspeed(tiny, [0, 2, 4, 8]), schedule="ZBVZeroBubble", microbatches=4)


def test_a_gap_to_a_bound_says_it_is_not_proven():
    opt = SimpleNamespace(method="milp", status="time_limit", objective=1.2, lower_bound=0.9, space="one-order",
                          runtime=60.0, plan=None)
    g = Grade(Layout((("a",), ("b",)), "test"), None, 1.0, True, "bottleneck", opt, 0.1, False)
    text = g.summary()
    assert "stopped at its time limit with lower bound 900 ms" in text and "at most" in text
    assert "\nproven optimum:" not in text and "to the proven optimum" not in text


# ---- the round trip: export the optimal plan, grade it: gap 0 ---------------------------------

def _read_back(fmt: str, path, inst):
    if fmt == "megatron":
        return from_megatron(inst, json.loads(path.read_text())["pipeline_model_parallel_layout"])
    if fmt == "torchtitan":
        return from_torchtitan(inst, read_torchtitan(path))
    if fmt == "deepspeed":
        return from_deepspeed(inst, read_deepspeed_parts(path))
    return from_split_spec(inst, read_split_spec(path))


@pytest.mark.parametrize("fmt", ["torch", "torchtitan", "megatron", "deepspeed"])
def test_round_trip_of_the_optimal_plan_grades_gap_zero(tiny, fmt, tmp_path):
    best = solve(tiny, stages=2, time_limit=None)
    out = export(best.plan, fmt, graph=tiny.graph)
    path = write(out, tmp_path / f"{fmt}.json")[0]
    g = grade(tiny, _read_back(fmt, path, tiny), time_limit=None)
    assert [list(s) for s in g.layout.stages] == [list(s.layers) for s in best.plan.stages]
    assert g.proven and g.gap == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("fmt", ["torch", "torchtitan", "deepspeed"])
def test_round_trip_on_a_zoo_transformer(zoo, fmt, tmp_path):
    best = solve(zoo, stages=4, time_limit=None)
    out = export(best.plan, fmt, graph=zoo.graph)
    g = grade(zoo, _read_back(fmt, write(out, tmp_path / f"{fmt}.json")[0], zoo), time_limit=None)
    assert g.proven and g.gap == pytest.approx(0.0, abs=1e-12)


def test_round_trip_under_a_schedule(tiny, tmp_path):
    best = solve(tiny, problem="schedule", schedule="1F1B", stages=2, microbatches=4, method="exhaustive",
                 time_limit=None)
    plan = Plan(tuple(Stage(s.layers) for s in best.plan.stages))
    path = write(export(plan, "torch", graph=tiny.graph), tmp_path / "t.json")[0]
    g = grade(tiny, from_split_spec(tiny, read_split_spec(path)), schedule="1F1B", microbatches=4,
              method="exhaustive", time_limit=None)
    assert g.time == pytest.approx(best.objective) and g.gap == pytest.approx(0.0, abs=1e-12)


# ---- the command line -----------------------------------------------------------------------

def test_cli_grade_each_form(tmp_path, capsys):
    n = load(ZOO).graph.number_of_nodes()
    titan = tmp_path / "titan.json"
    titan.write_text(json.dumps([["input", "embed", *zoo_blocks(0, 12)], [*zoo_blocks(12, 24), "head"]]))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"layer12_attn": "beginning"}))
    forms = [["--megatron-layout", "Et*12|t*12L"], ["--torchtitan", str(titan)],
             ["--deepspeed-parts", f"0,26,{n}"], ["--split-spec", str(spec)]]
    times = []
    for form in forms:
        assert main(["grade", str(ZOO), *form, "--time-limit", "none", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["proven"] and out["stages"][1][0] == "layer12_attn"
        times.append(out["time"])
    assert len(set(times)) == 1  # one split, four spellings
    assert main(["grade", str(ZOO), "--megatron-layout", "Et*12|t*12L", "--time-limit", "none"]) == 0
    assert "gap:" in capsys.readouterr().out


def test_cli_grade_refuses_with_exit_code_2(capsys):
    assert main(["grade", str(ZOO), "--megatron-layout", "Et*12|t*13L"]) == 2
    assert "must match num_layers 24" in capsys.readouterr().err
    assert main(["grade", str(ZOO), "--deepspeed-parts", "0,5,9"]) == 2
    assert "wrong layer count" in capsys.readouterr().err
    assert main(["grade", str(ZOO), "--deepspeed-parts", "0,26,51", "--microbatches", "4"]) == 2
    assert "go with --schedule" in capsys.readouterr().err
    assert main(["grade", str(ZOO), "--megatron-layout", "E(t*3|)*7t*3L"]) == 2
    assert "8 stages; bert-large-a100-40gb-x4's cluster has 4 devices" in capsys.readouterr().err
    assert main(["grade", str(ZOO)]) == 2  # one of the four forms is required
    capsys.readouterr()
