"""Every export on Hugging Face GPT-2 (transformers' ``GPT2LMHeadModel`` from its config: random
weights, nothing downloaded), profiled by ``from_torch`` as a user would, without a wrapper.

GPT-2 ties ``lm_head.weight`` to ``transformer.wte.weight``: the exports say so, and torch's
``pipeline()`` replicates the tied weight into both stages (the module holding it is listed in
each) - exactly the extra membership the export's ``shared_parameters`` announces. torchtitan's
``pipeline_module_split`` cannot split GPT-2's blocks (they sit in ``transformer.h``, below a
top-level module): refused, naming why. The way back: the optimal plan exported and graded gives
gap 0."""

from __future__ import annotations

import ast
import copy

import pytest

pytest.importorskip("torch.distributed.pipelining")
pytest.importorskip("transformers")

from pipeopt import from_torch, solve  # noqa: E402
from pipeopt.errors import UnsupportedPlanError  # noqa: E402
from pipeopt.export import export, torch_split_spec, write  # noqa: E402
from pipeopt.export.deepspeed import stages_from_parts  # noqa: E402
from pipeopt.grade import from_deepspeed, from_megatron, from_split_spec, grade, read_split_spec  # noqa: E402
from pipeopt.torch.runtime import pipe_stages  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

CONFIG = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 256, "n_positions": 64, "seq": 16}


@pytest.fixture(scope="module")
def gpt2():
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"
    from pipeopt.torch.models import load

    module, inputs = load("hf:GPT2LMHeadModel", **CONFIG)
    inst = from_torch(module, inputs, costs="estimated", device="a100-40gb", devices=4)
    best = solve(inst, stages=2, time_limit=None)
    return module, inputs, inst, best.plan


def test_the_tie_is_recorded_and_every_export_says_which_stages_share_it(gpt2):
    _, _, inst, plan = gpt2
    (tie,) = inst.graph.graph["tied"]
    assert sorted(tie["layers"]) == ["lm_head", "transformer.wte"]
    for fmt in ("torch", "megatron", "deepspeed"):
        out = export(plan, fmt, graph=inst.graph)
        (shared,) = out["shared_parameters"]
        assert shared["stages"] == [0, 1] and any("on stages [0, 1]" in n for n in out["notes"])


def test_torch_snippet_builds_the_plans_stages_plus_the_announced_tied_holder(gpt2, tmp_path):
    from torch.distributed.pipelining import pipeline

    module, inputs, inst, plan = gpt2
    names = list(inst.graph.nodes)
    out = export(plan, "torch", graph=inst.graph)
    json_path, py_path = write(out, tmp_path / "gpt2.json")
    namespace: dict = {}
    exec(compile(py_path.read_text(), str(py_path), "exec"), namespace)  # noqa: S102 - as a user pastes it
    holders = {n: set(t["stages"]) for t in out["shared_parameters"] for n in t["layers"]}
    for spec in (namespace["split_spec"], torch_split_spec(json_path)):
        built = pipe_stages(pipeline(copy.deepcopy(module), inputs, split_spec=spec), names)
        assert len(built) == plan.num_stages
        for i, (got, want) in enumerate(zip(built, plan.stages)):
            assert set(want.layers) <= set(got)
            extra = set(got) - set(want.layers)
            assert all(i in holders.get(n, ()) for n in extra), (i, extra)  # only the tied weight's holder


def test_deepspeed_snippet_slices_gpt2s_modules(gpt2, tmp_path):
    module, _, inst, plan = gpt2
    out = export(plan, "deepspeed", graph=inst.graph)
    py = write(out, tmp_path / "ds.json")[1]
    values = {t.targets[0].id: ast.literal_eval(t.value) for t in ast.parse(py.read_text()).body
              if isinstance(t, ast.Assign) and isinstance(t.targets[0], ast.Name)}
    assert stages_from_parts(values["PARTS"], values["LAYERS"]) == [list(s.layers) for s in plan.stages]
    assert all(module.get_submodule(n) is not None for n in values["LAYERS"])
    assert "TiedLayerSpec" in py.read_text()


def test_megatron_layout_and_torchtitans_refusal(gpt2):
    _, _, inst, plan = gpt2
    layout = export(plan, "megatron", graph=inst.graph)["pipeline_model_parallel_layout"]
    assert [list(s) for s in from_megatron(inst, layout).stages] == [list(s.layers) for s in plan.stages]
    with pytest.raises(UnsupportedPlanError, match="'transformer.wte' is a module inside 'transformer'"):
        export(plan, "torchtitan", graph=inst.graph)


def test_round_trip_grades_gap_zero(gpt2, tmp_path):
    _, _, inst, plan = gpt2
    layouts = [
        from_split_spec(inst, read_split_spec(write(export(plan, "torch", graph=inst.graph), tmp_path / "t.json")[0])),
        from_deepspeed(inst, export(plan, "deepspeed", graph=inst.graph)["parts"]),
        from_megatron(inst, export(plan, "megatron", graph=inst.graph)["pipeline_model_parallel_layout"]),
    ]
    for layout in layouts:
        g = grade(inst, layout, time_limit=None)
        assert g.proven and g.gap == pytest.approx(0.0, abs=1e-12)
    worst = grade(inst, from_megatron(inst, "E|t*2L"), time_limit=None)
    assert worst.gap > 0 and worst.proven


def test_deepspeed_own_partition_code_on_gpt2(gpt2, tmp_path):
    """DeepSpeed's PipelineModule (imported unmodified, where it imports) partitions GPT-2's layers
    as planned (see tests/export/test_paste_in.py for the method)."""
    pipe_mod = pytest.importorskip("deepspeed.runtime.pipe.module")
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology
    from torch import nn

    module, _, inst, plan = gpt2
    out = export(plan, "deepspeed", graph=inst.graph)
    namespace: dict = {}
    py = write(out, tmp_path / "ds.json")[1]
    exec(compile(py.read_text(), str(py), "exec"), namespace)  # noqa: S102
    cls = namespace.get("PlannedPipelineModule", pipe_mod.PipelineModule)
    for rank, stage in enumerate(plan.stages):
        stub = cls.__new__(cls)
        nn.Module.__init__(stub)
        stub._topo = PipeDataParallelTopology(num_pp=plan.num_stages, num_dp=1)
        stub.global_rank, stub.loss_fn = rank, None
        stub._layer_specs = [module.get_submodule(n) for n in namespace["LAYERS"]]
        stub._num_layers = len(stub._layer_specs)
        stub._partition_layers(method=out["partition_method"] or "parameters")
        assert list(stub.parts) == out["parts"]
        assert namespace["LAYERS"][stub._local_start:stub._local_stop] == list(stage.layers)
