"""Exports of plans of the shipped models, read back by the runtimes' own code where it is
installed: ``torch.distributed.pipelining.pipeline`` (torch 2.13) splits the model with the
exported ``split_spec`` and every stage holds exactly the plan's modules; torchtitan's
keep/drop logic (quoted from v0.2.2) applied to the real module keeps the plan's modules."""

from __future__ import annotations

import copy

import pytest

# the pipeline runtime, not just torch: the tests need torch.distributed.pipelining
pytest.importorskip("torch.distributed.pipelining")
import torch  # noqa: E402

from torch import nn  # noqa: E402

from pipeopt.errors import UnsupportedPlanError  # noqa: E402
from pipeopt.export import export, torchtitan  # noqa: E402
from pipeopt.plan import Plan, Stage  # noqa: E402
from pipeopt.torch import models  # noqa: E402
from pipeopt.torch.runtime import build_pipe, pipe_stages  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")  # torch 2.13's own export code


def run_order(module: nn.Module, inputs: tuple, names: list[str]) -> list[str]:
    """``names`` in the order ``module``'s forward first calls them (forward pre-hooks)."""
    seen: list[str] = []
    wanted = set(names)
    hooks = [m.register_forward_pre_hook(lambda _m, _a, n=n: seen.append(n) if n not in seen else None)
             for n, m in module.named_modules() if n in wanted]
    with torch.no_grad():
        module(*inputs)
    for h in hooks:
        h.remove()
    return seen


def split(names: list[str], cuts: list[int]) -> list[list[str]]:
    bounds = [0, *cuts, len(names)]
    return [names[a:b] for a, b in zip(bounds, bounds[1:])]


def plan_of(stages) -> Plan:
    return Plan(tuple(Stage(tuple(s)) for s in stages))


GPT_BLOCKS = ["tok_emb", "pos_emb", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "head"]


@pytest.mark.parametrize("cuts", [[4], [1], [3, 4, 7]])
def test_pipeline_builds_the_plans_stages_gpt(cuts):
    module, inputs = models.build("gpt-tiny")
    assert run_order(module, inputs, GPT_BLOCKS) == GPT_BLOCKS
    stages = split(GPT_BLOCKS, cuts)
    out = export(plan_of(stages), "torch")
    pipe = build_pipe(module, inputs, out)
    assert pipe.num_stages == len(stages)
    assert pipe_stages(pipe, GPT_BLOCKS) == stages


def test_pipeline_builds_a_cut_inside_a_block():
    """Leaf granularity: the plan cuts between layers.1's attention and its MLP."""
    module, inputs = models.build("gpt-tiny")
    leaves = [n for n, m in module.named_modules() if n and not any(True for _ in m.children())]
    order = run_order(module, inputs, leaves)
    k = order.index("layers.1.ln2")
    stages = split(order, [k])
    pipe = build_pipe(module, inputs, export(plan_of(stages), "torch"))
    assert pipe_stages(pipe, order) == stages


def test_pipeline_builds_the_plans_stages_cnn():
    module, inputs = models.build("cnn-tiny")
    names = ["stem", "layers.0", "layers.1", "pool", "head"]
    assert run_order(module, inputs, names) == names
    stages = split(names, [2])
    pipe = build_pipe(module, inputs, export(plan_of(stages), "torch"))
    assert pipe_stages(pipe, names) == stages
    # torchtitan cannot split the CNN's blocks: they sit in an nn.Sequential
    with pytest.raises(UnsupportedPlanError, match="nn.Sequential"):
        export(plan_of(stages), "torchtitan", module=module)


def test_pipeline_leaves_the_model_unchanged():
    module, inputs = models.build("gpt-tiny")
    before = copy.deepcopy(module.state_dict())
    build_pipe(module, inputs, export(plan_of(split(GPT_BLOCKS, [4])), "torch"))
    # pipeline() annotates the module it traces; build_pipe gives it a copy
    pipe = build_pipe(module, inputs, export(plan_of(split(GPT_BLOCKS, [2])), "torch"))
    assert pipe.num_stages == 2
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())


# torchtitan v0.2.2, torchtitan/distributed/pipeline_parallel.py, pipeline_module_split's
# _build_stage_from_modules without the PipelineStage (Copyright (c) Meta Platforms, Inc. and
# affiliates; BSD-3-Clause), quoted as the reference.
def torchtitan_model_part(whole_model, module_names):
    model = copy.deepcopy(whole_model)
    modules_to_keep = set(module_names)
    for module_name, module_value in model.named_children():
        if isinstance(module_value, (nn.ModuleDict, nn.ModuleList)):
            layers_to_keep = {name.split(".", 1)[1] for name in modules_to_keep if name.startswith(f"{module_name}.")}
            if layers_to_keep:
                if isinstance(module_value, nn.ModuleDict):
                    for layer_name in list(module_value.keys()):
                        if layer_name not in layers_to_keep:
                            del module_value[layer_name]
                elif isinstance(module_value, nn.ModuleList):
                    indices_to_keep = {int(idx) for idx in layers_to_keep if idx.isdigit()}
                    new_layers = nn.ModuleList([layer for i, layer in enumerate(module_value) if i in indices_to_keep])
                    setattr(model, module_name, new_layers)
            else:
                if isinstance(module_value, nn.ModuleDict):
                    setattr(model, module_name, nn.ModuleDict())
                elif isinstance(module_value, nn.ModuleList):
                    setattr(model, module_name, nn.ModuleList())
        elif module_name not in modules_to_keep:
            setattr(model, module_name, None)
    return model


@pytest.mark.parametrize("cuts", [[4], [3, 6]])
def test_torchtitan_split_keeps_the_plans_modules(cuts):
    module, _ = models.build("gpt-tiny")
    stages = split(GPT_BLOCKS, cuts)
    out = export(plan_of(stages), "torchtitan", module=module)
    children = {n: ([k for k, _ in m.named_children()] if isinstance(m, (nn.ModuleList, nn.ModuleDict)) else None)
                for n, m in module.named_children()}
    assert torchtitan.stage_modules(out["module_fqns_per_model_part"], children) == stages
    for part, stage in zip(out["module_fqns_per_model_part"], stages):
        chunk = torchtitan_model_part(module, part)
        kept_params = sum(p.numel() for p in chunk.parameters())
        want = sum(p.numel() for n in stage for p in module.get_submodule(n).parameters())
        assert kept_params == want
        top = {n for n, m in chunk.named_children() if m is not None and (len(m) if isinstance(m, nn.ModuleList) else 1)}
        assert top == {n.split(".")[0] for n in stage}
