"""Exports that paste in: the files ``pipeopt export`` writes are used as a user would use them.

* torch: the written ``.py`` snippet is executed and its ``split_spec`` goes to torch 2.13's own
  ``pipeline()`` unchanged; so does :func:`pipeopt.export.torch_split_spec` of the JSON. The
  stages torch builds hold exactly the plan's modules.
* DeepSpeed: the written ``.py`` parses; its ``LAYERS`` name modules of the model and its ``PARTS``
  slice them into the plan's stages. Where DeepSpeed imports (``deepspeed.pipe``; not a test
  dependency, the check was run with DeepSpeed's sources from a checkout), DeepSpeed's own
  ``PipelineModule._partition_layers`` / ``_set_bounds`` / ``stage_owner`` run on the
  snippet's subclass for every stage.
* tied parameters: every split format says which stages share which parameter.
"""

from __future__ import annotations

import ast
import copy
import json

import pytest

pytest.importorskip("torch.distributed.pipelining")

from pipeopt import from_torch, solve  # noqa: E402
from pipeopt.export import export, torch_split_spec, write  # noqa: E402
from pipeopt.export.deepspeed import stages_from_parts  # noqa: E402
from pipeopt.plan import Plan, Stage  # noqa: E402
from pipeopt.torch import models  # noqa: E402
from pipeopt.torch.runtime import pipe_stages  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")  # torch 2.13's own export code

EST = {"costs": "estimated", "device": "a100-40gb", "devices": 4}
GPT = ["tok_emb", "pos_emb", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "head"]


@pytest.fixture(scope="module")
def tiny():
    module, inputs = models.build("gpt-tiny")
    return module, inputs, from_torch(module, inputs, **EST)


def plan_of(stages) -> Plan:
    return Plan(tuple(Stage(tuple(s)) for s in stages))


def cut(names, cuts):
    bounds = [0, *cuts, len(names)]
    return [names[a:b] for a, b in zip(bounds, bounds[1:])]


def run_snippet(path) -> dict:
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 - the file a user pastes
    return namespace


# ---- torch -------------------------------------------------------------------------------------

@pytest.mark.parametrize("cuts", [None, [1], [3, 6]])
def test_torch_snippet_and_loader_build_the_plans_stages(tiny, tmp_path, cuts):
    from torch.distributed.pipelining import SplitPoint, pipeline

    module, inputs, inst = tiny
    plan = solve(inst, stages=2, time_limit=None).plan if cuts is None else plan_of(cut(GPT, cuts))
    stages = [list(s.layers) for s in plan.stages]
    written = write(export(plan, "torch", graph=inst.graph), tmp_path / "plan.json")
    assert [p.suffix for p in written] == [".json", ".py"]
    spec = run_snippet(written[1])["split_spec"]
    assert all(v is SplitPoint.BEGINNING for v in spec.values())
    pipe = pipeline(copy.deepcopy(module), inputs, split_spec=spec)  # as pasted, nothing converted
    assert pipe_stages(pipe, GPT) == stages
    pipe = pipeline(copy.deepcopy(module), inputs, split_spec=torch_split_spec(written[0]))  # the one loader call
    assert pipe_stages(pipe, GPT) == stages


def test_torch_loader_reads_a_users_spec_and_refuses_bad_points(tmp_path):
    from torch.distributed.pipelining import SplitPoint

    from pipeopt.errors import ReadError, UnsupportedPlanError

    f = tmp_path / "spec.json"
    f.write_text(json.dumps({"layers.2": "beginning", "layers.3": "SplitPoint.END"}))
    assert torch_split_spec(f) == {"layers.2": SplitPoint.BEGINNING, "layers.3": SplitPoint.END}
    f.write_text(json.dumps({"layers.2": "middle"}))
    with pytest.raises(UnsupportedPlanError, match="not SplitPoint.BEGINNING or END"):
        torch_split_spec(f)
    f.write_text("[1, 2]")
    with pytest.raises(ReadError, match="holds no split_spec"):
        torch_split_spec(f)


# ---- DeepSpeed ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cuts", [[4], [3], [2, 5, 7]])
def test_deepspeed_snippet_names_the_models_layers_and_the_plans_parts(tiny, tmp_path, cuts):
    module, _, inst = tiny
    stages = cut(GPT, cuts)
    out = export(plan_of(stages), "deepspeed", graph=inst.graph)
    py = write(out, tmp_path / "ds.json")[1]
    tree = ast.parse(py.read_text())
    values = {t.targets[0].id: ast.literal_eval(t.value) for t in tree.body
              if isinstance(t, ast.Assign) and isinstance(t.targets[0], ast.Name)}
    assert values["LAYERS"] == GPT and values["PARTS"] == out["parts"]
    assert stages_from_parts(values["PARTS"], values["LAYERS"]) == stages
    assert all(module.get_submodule(n) is not None for n in values["LAYERS"])
    uniform = cuts == [4]
    assert out["partition_method"] == ("uniform" if uniform else None)
    assert ("class PlannedPipelineModule" in py.read_text()) is not uniform


@pytest.mark.parametrize("cuts", [[4], [3], [2, 5, 7]])
def test_deepspeed_own_partition_code_sets_the_plans_bounds(tiny, tmp_path, cuts):
    """DeepSpeed's PipelineModule (imported unmodified) partitions the snippet's layers as planned."""
    pipe_mod = pytest.importorskip("deepspeed.runtime.pipe.module")
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology
    from torch import nn

    module, _, inst = tiny
    stages = cut(GPT, cuts)
    out = export(plan_of(stages), "deepspeed", graph=inst.graph)
    ns = run_snippet(write(out, tmp_path / "ds.json")[1])
    cls = ns.get("PlannedPipelineModule", pipe_mod.PipelineModule)
    S = len(stages)
    for rank in range(S):
        stub = cls.__new__(cls)  # DeepSpeed's methods on an object without the process groups of __init__
        nn.Module.__init__(stub)
        stub._topo = PipeDataParallelTopology(num_pp=S, num_dp=1)
        stub.global_rank, stub.loss_fn = rank, None
        stub._layer_specs = [module.get_submodule(n) for n in ns["LAYERS"]]
        stub._num_layers = len(stub._layer_specs)
        stub._partition_layers(method=out["partition_method"] or "parameters")
        assert list(stub.parts) == out["parts"]
        assert ns["LAYERS"][stub._local_start:stub._local_stop] == stages[rank]
        assert [stub.stage_owner(i) for i in range(len(GPT))] == [s for s, st in enumerate(stages) for _ in st]


# ---- tied parameters -------------------------------------------------------------------------

def test_exports_say_which_stages_share_a_tied_parameter():
    module, inputs = models.build("gpt-tiny", tie_weights=True)
    inst = from_torch(module, inputs, **EST)
    (tie,) = inst.graph.graph["tied"]
    plan = plan_of(cut(GPT, [4]))
    for fmt in ("torch", "torchtitan", "megatron", "deepspeed"):
        out = export(plan, fmt, graph=inst.graph)
        (shared,) = out["shared_parameters"]
        assert shared["stages"] == [0, 1] and sorted(shared["layers"]) == sorted(tie["layers"])
        assert any("on stages [0, 1]" in n for n in out["notes"]), fmt
    assert "TiedLayerSpec" in export(plan, "deepspeed", graph=inst.graph)["python"]
    one = plan_of([GPT])
    assert export(one, "torch", graph=inst.graph)["shared_parameters"][0]["stages"] == [0]
