"""Models people train, without a wrapper (issue 24, 1 and 6): Hugging Face transformers models
built from their config classes (random weights, nothing downloaded) go through from_torch
and ``pipeopt profile``; where torch.fx cannot trace them, module hooks give the layer graph.

Every model is small (2 blocks, width 32) and timed with one repeat: seconds in all.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap

import networkx as nx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch.fx")
transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import pipeopt  # noqa: E402
from pipeopt.cli import SHIPPED_MODELS, _factory_kwargs, main  # noqa: E402
from pipeopt.errors import InvalidPlanError, InvalidProblemError  # noqa: E402
from pipeopt.io.native import read_instance  # noqa: E402
from pipeopt.plan import Plan, Stage  # noqa: E402
from pipeopt.torch import MODELS, from_torch  # noqa: E402
from pipeopt.torch.hooks import hook_trace, layer_graph  # noqa: E402
from pipeopt.torch.models import load  # noqa: E402
from pipeopt.torch.trace import find_containers, parse_granularity  # noqa: E402

EST = {"costs": "estimated", "device": "a100-40gb"}
FAST = {"repeats": 1, "warmup": 0}
TEXT = {"vocab_size": 128, "seq": 16}

# class -> (small config and input sizes, the blocks in run order, modules before, after)
SMALL = {
    "GPT2LMHeadModel": (
        {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 64, **TEXT},
        ["transformer.h.0", "transformer.h.1"],
        ["transformer.wte", "transformer.wpe", "transformer.drop"], ["transformer.ln_f", "lm_head"]),
    "BertForMaskedLM": (
        {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
         "max_position_embeddings": 64, **TEXT},
        ["bert.encoder.layer.0", "bert.encoder.layer.1"], ["bert.embeddings"], ["cls"]),
    "LlamaForCausalLM": (
        {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1,
         "intermediate_size": 64, "max_position_embeddings": 64, **TEXT},
        ["model.layers.0", "model.layers.1"], ["model.embed_tokens", "model.rotary_emb"], ["model.norm", "lm_head"]),
    "T5ForConditionalGeneration": (
        {"num_layers": 2, "d_model": 32, "num_heads": 2, "d_kv": 16, "d_ff": 64, **TEXT},
        ["encoder.block.0", "encoder.block.1", "encoder.final_layer_norm", "decoder.embed_tokens",
         "decoder.dropout", "decoder.block.0", "decoder.block.1"],
        ["encoder.embed_tokens", "encoder.dropout"], ["decoder.final_layer_norm", "lm_head"]),
    "ResNetForImageClassification": (
        {"hidden_sizes": [16, 32], "depths": [3, 3], "embedding_size": 8, "num_labels": 10, "image": 32},
        [f"resnet.encoder.stages.{s}.layers.{b}" for s in (0, 1) for b in (0, 1, 2)],
        ["resnet.embedder"], ["resnet.pooler", "classifier"]),
    "ViTForImageClassification": (
        {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
         "image_size": 32, "patch_size": 8, "num_labels": 10},
        ["vit.layers.0", "vit.layers.1"], ["vit.embeddings"], ["vit.layernorm", "classifier"]),
}


@pytest.mark.parametrize("name", list(SMALL))
def test_hf_model_profiles_into_a_dag_of_its_blocks_and_solves(name):
    config, blocks, before, after = SMALL[name]
    module, inputs = load(f"hf:{name}", **config)
    inst = from_torch(module, inputs, **FAST)
    g = inst.graph
    meta = g.graph["torch"]
    assert meta["tracing"] == "module hooks"  # torch.fx cannot trace these forwards
    assert any(a.startswith("layer graph by module hooks") for a in inst.assumptions)
    assert list(g.nodes) == before + blocks + after  # run order: embeddings, blocks, head
    assert nx.is_directed_acyclic_graph(g)
    assert all(b > 0 for _, _, b in g.edges(data="bytes"))
    if not name.startswith("T5"):  # one chain through every layer (T5's decoder embedding does not read the encoder)
        assert all(nx.has_path(g, u, v) for u, v in itertools.pairwise(g.nodes))
    assert all(d["fwd"]["cpu"] > 0 and d["bwd"]["cpu"] > 0 for n, d in g.nodes(data=True) if n in blocks)
    result = pipeopt.solve(inst, stages=2)
    assert result.status.value == "optimal" and len(result.plan.stages) == 2


def test_edges_carry_the_tensors_between_blocks():
    """GPT-2 (batch 2, seq 16, width 32, fp32): a chain with 4096 bytes of hidden state on every
    edge; the embeddings' sum joins wpe (the rule of the fx path); the LM head is tied to wte."""
    config = SMALL["GPT2LMHeadModel"][0]
    g = from_torch(*load("hf:GPT2LMHeadModel", **config), **EST).graph
    assert list(g.edges) == list(itertools.pairwise(g.nodes))  # positions from arange make no edge
    assert g.edges["transformer.wte", "transformer.wpe"]["bytes"] == 2 * 16 * 32 * 4
    assert g.edges["transformer.h.0", "transformer.h.1"]["bytes"] == 2 * 16 * 32 * 4
    assert g.edges["transformer.ln_f", "lm_head"]["bytes"] == 2 * 16 * 32 * 4
    assert g.graph["torch"]["input_readers"] == ["transformer.wte"]
    assert g.graph["torch"]["graph_outputs"] == ["lm_head"]
    assert [t["layers"] for t in g.graph["tied"]] == [["transformer.wte", "lm_head"]]


def test_encoder_decoder_runs_both_stacks_and_its_shared_embedding_is_tied():
    config = SMALL["T5ForConditionalGeneration"][0]
    inst = from_torch(*load("hf:T5ForConditionalGeneration", **config), **EST)
    g, meta = inst.graph, inst.graph.graph["torch"]
    assert meta["containers"] == ["encoder.block", "decoder.block"] and meta["container"] is None
    assert meta["unused_modules"] == ["shared"]  # called as encoder.embed_tokens and decoder.embed_tokens
    assert g.has_edge("encoder.final_layer_norm", "decoder.block.1")  # cross-attention reads the encoder
    tie = g.graph["tied"][0]
    assert set(tie["layers"]) == {"encoder.embed_tokens", "decoder.embed_tokens", "lm_head"}


def test_t5_measured_prices_its_shared_embeddings_sum_where_a_stage_holds_two_users():
    """Measured: the shared embedding's gradient sum is timed; two stages can hold the decoder's
    embedding and the head together, so the DP (auto) prices it and probe refuses, naming dp."""
    config = SMALL["T5ForConditionalGeneration"][0]
    inst = from_torch(*load("hf:T5ForConditionalGeneration", **config), repeats=1, warmup=0, microbatches=2)
    tie = inst.graph.graph["tied"][0]
    assert tie["sum_s"]["cpu"] > 0
    res = pipeopt.solve(inst, stages=2)
    assert res.method == "dp" and res.objective == pytest.approx(pipeopt.evaluate(inst, res.plan).objective, rel=1e-9)
    with pytest.raises(InvalidProblemError, match="'dp'"):
        pipeopt.solve(inst, method="probe", stages=2)


@pytest.mark.parametrize("name", ["gpt-tiny", "cnn-tiny"])
def test_hooks_give_the_graph_fx_gives(name):
    """On the shipped models both ways agree: layers, edges, bytes, FLOP, parameters (not the
    GPT's pos_emb output: under fx the sum with tok_emb's output is part of it)."""
    module, inputs = MODELS[name]()
    fx = from_torch(module, inputs, tracing="fx", **EST).graph
    hooks = from_torch(module, inputs, tracing="hooks", **EST).graph
    assert fx.graph["torch"]["tracing"] == "torch.fx" and hooks.graph["torch"]["tracing"] == "module hooks"
    assert list(fx.nodes) == list(hooks.nodes)
    assert dict(fx.edges) == dict(hooks.edges)
    for n in fx:
        for key in ("flop", "bwd_flop", "param_bytes", "act_bytes"):
            assert fx.nodes[n][key] == hooks.nodes[n][key], (n, key)
    assert fx.graph["torch"]["input_readers"] == hooks.graph["torch"]["input_readers"]


def test_hooks_record_keyword_arguments_and_replay_them():
    """A block called with a keyword tensor (an HF mask) is replayed with it."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, *, mask=None, scale=1.0):
            return self.fc(x) * mask * scale

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block(), Block(), Block()])

        def forward(self, x):
            mask = (x > -10).float()  # from the input: no producer layer
            for b in self.blocks:
                x = b(x, mask=mask, scale=0.5)
            return x

    net, x = Net(), torch.randn(2, 4)
    traced = hook_trace(net, parse_granularity("auto"), (x,))
    assert traced.names == ["blocks.0", "blocks.1", "blocks.2"]
    assert traced.sources == [[None, None], [0, 0], [1, 0]]  # the mask joins its first reader
    assert traced.edges == {(0, 1): 32 + 32, (1, 2): 32, (0, 2): 32}  # the mask from its first reader
    with torch.no_grad():
        assert torch.equal(traced.submods[1](*traced.captured[1]), net.blocks[1](*traced.captured[1][:1],
                                                                                  mask=traced.captured[1][1],
                                                                                  scale=0.5))


def test_parameters_outside_every_layer_are_counted():
    """A root-level parameter and buffer read by operations outside the layers (a class token)
    count in the layer those operations join; the totals are the model's."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.cls = nn.Parameter(torch.zeros(1, 1, 4))
            self.register_buffer("scale", torch.ones(4))
            self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

        def forward(self, x):
            if x.sum() > -1e9:  # fx cannot trace this
                x = torch.cat([self.cls.expand(x.shape[0], 1, 4), x], 1) * self.scale
            for layer in self.layers:
                x = layer(x)
            return x

    net = Net()
    g = from_torch(net, (torch.randn(2, 3, 4),), **EST).graph
    assert g.graph["torch"]["tracing"] == "module hooks"
    assert g.nodes["layers.0"]["weight_bytes"] == 80 + 16 and g.nodes["layers.0"]["buffer_bytes"] == 16
    assert sum(w for _, w in g.nodes(data="weight_bytes")) == sum(p.numel() * 4 for p in net.parameters())


def test_a_layer_with_parameters_run_twice_is_refused():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

        def forward(self, x):
            return self.layers[0](self.layers[1](self.layers[0](x)))

    with pytest.raises(pipeopt.errors.InvalidGraphError, match="layers.0.*more than once"):
        layer_graph(Twice(), parse_granularity("container:layers"), (torch.randn(1, 4),), "hooks")


def test_containers_found_in_resnet50_and_t5():
    res = transformers.ResNetModel(transformers.ResNetConfig())  # ResNet-50: stages of 3, 4, 6, 3
    found = find_containers(res)
    assert found == [f"encoder.stages.{i}.layers" for i in range(4)]
    assert sum(len(res.get_submodule(c)) for c in found) == 16
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(num_layers=2, d_model=32, d_ff=64,
                                                                      num_heads=2, d_kv=16, vocab_size=64))
    assert find_containers(t5) == ["encoder.block", "decoder.block"]
    gpt, _ = MODELS["gpt-tiny"]()
    assert find_containers(gpt) == ["layers"]
    swin = transformers.SwinModel(transformers.SwinConfig(depths=[2, 2, 6, 2], embed_dim=16, num_heads=[1, 1, 1, 1],
                                                          window_size=2, image_size=32, patch_size=2))
    assert find_containers(swin) == [f"encoder.layers.{i}.blocks" for i in range(4)]  # not the 4 stages


def test_experts_below_a_block_are_not_the_blocks():
    class Expert(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(4, 8), nn.Linear(8, 4)

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(4, 8)
            self.experts = nn.ModuleList(Expert() for _ in range(8))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.mlp = nn.Linear(4, 4), MoE()

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(2))

    assert find_containers(Model()) == ["layers"]


def test_a_named_container_wins_over_auto():
    config = SMALL["LlamaForCausalLM"][0]
    g = from_torch(*load("hf:LlamaForCausalLM", **config), granularity="children", **FAST).graph
    assert list(g.nodes) == ["model", "lm_head"]
    with pytest.raises(InvalidProblemError, match="container 'model.blocks' not found"):
        from_torch(*load("hf:LlamaForCausalLM", **config), granularity="container:model.blocks", **EST)


def test_hf_loader_errors_and_inputs():
    with pytest.raises(InvalidProblemError, match="no model class 'GPT2LMHeadModle'.*GPT2LMHeadModel"):
        load("hf:GPT2LMHeadModle")
    with pytest.raises(InvalidProblemError, match="GPT2Config has no field 'n_layers'"):
        load("hf:GPT2LMHeadModel", n_layers=2)
    with pytest.raises(InvalidProblemError, match="seq 99 exceeds"):
        load("hf:GPT2LMHeadModel", n_layer=1, n_embd=32, n_head=2, n_positions=64, vocab_size=128, seq=99)
    a, (ids,) = load("hf:GPT2LMHeadModel", n_layer=1, n_embd=32, n_head=2, vocab_size=128, seq=8, batch=3)
    b, _ = load("hf:GPT2LMHeadModel", n_layer=1, n_embd=32, n_head=2, vocab_size=128, seq=8, batch=3)
    assert ids.shape == (3, 8) and a.training and a.config.use_cache is False
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))  # seeded
    t5, inputs = load("hf:T5ForConditionalGeneration", **SMALL["T5ForConditionalGeneration"][0])
    assert len(inputs) == 3 and inputs[1] is None and inputs[2].shape == (2, 16)  # decoder_input_ids
    vit, (pixels,) = load("hf:ViTModel", num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                          intermediate_size=64, image_size=32, patch_size=8)
    assert pixels.shape == (2, 3, 32, 32)


def test_model_args_parse_as_python_values():
    assert _factory_kwargs(["n_layer=12", "eps=1e-5", "tie=false", "act=gelu_new", "d=(2, 2)"]) == {
        "n_layer": 12, "eps": 1e-5, "tie": False, "act": "gelu_new", "d": (2, 2)}


def test_cli_profiles_an_hf_model(tmp_path, capsys):
    out = tmp_path / "gpt2.json"
    rc = main(["profile", "hf:GPT2LMHeadModel", "--model-arg", "n_layer=2", "--model-arg", "n_embd=32",
               "--model-arg", "n_head=2", "--model-arg", "vocab_size=128", "--model-arg", "seq=16",
               "--costs", "estimated", "--device", "a100-40gb", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "container:transformer.h, by module hooks" in text
    inst = read_instance(out)
    assert inst.graph.graph["torch"]["tracing"] == "module hooks"
    assert [n for n in inst.graph if ".h." in n] == ["transformer.h.0", "transformer.h.1"]


def test_factory_in_the_current_folder_needs_no_pythonpath(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_factories_24.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def make(width=4):
            return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2)), (torch.randn(2, width),)
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert str(tmp_path) not in sys.path
    try:
        rc = main(["profile", "my_factories_24:make", "--model-arg", "width=8", "--costs", "estimated",
                   "--device", "a100-40gb", "--out", str(tmp_path / "x.json")])
    finally:
        sys.modules.pop("my_factories_24", None)
    assert rc == 0, capsys.readouterr().err
    assert str(tmp_path) not in sys.path  # restored
    assert list(read_instance(tmp_path / "x.json").graph) == ["0", "1", "2"]


def test_unknown_shipped_model_is_reported_without_importing_torch(tmp_path):
    """In a fresh interpreter: the typed error (exit 2) names the known models, torch stays out."""
    code = textwrap.dedent("""
        import sys
        from pipeopt.cli import main
        codes = [main(["profile", "gpx"]), main(["run", "plan.json", "--model", "gpx"]),
                 main(["export", "plan.json", "--to", "torch", "--model", "gpx"])]
        print(codes, "torch" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.stdout.split() == ["[2,", "2,", "2]", "False"], done.stderr
    assert "unknown shipped model 'gpx'" in done.stderr and "'gpt-tiny'" in done.stderr


def test_shipped_names_known_to_the_cli_are_the_models():
    assert list(SHIPPED_MODELS) == sorted(MODELS)


def test_run_refuses_a_plan_of_another_model_before_any_process():
    from pipeopt.torch.runtime import run_plan

    plan = Plan((Stage(("transformer.wte", "transformer.h.0")), Stage(("transformer.h.1", "lm_head"))))
    with pytest.raises(InvalidPlanError, match="layer 'transformer.wte' of the plan's stage 0 is not a module of GPT"):
        run_plan(plan, "gpt-tiny")
    with pytest.raises(InvalidPlanError, match="'head' of the plan's stage 1 is not a module of GPT2LMHeadModel"):
        run_plan(Plan((Stage(("transformer.wte",)), Stage(("head",)))), "hf:GPT2LMHeadModel",
                 model_kwargs={"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 128, "seq": 8})


@pytest.mark.parametrize("factory, size", [("resnet50", 64), ("vit_b_16", 224)])
def test_torchvision_models(factory, size):
    tv = pytest.importorskip("torchvision")
    module = getattr(tv.models, factory)(weights=None)
    inst = from_torch(module, (torch.randn(1, 3, size, size),), **EST)
    g = inst.graph
    assert nx.is_directed_acyclic_graph(g) and g.number_of_nodes() >= 12
    assert pipeopt.solve(inst, stages=2).status.value == "optimal"


def test_profile_json_records_the_method(tmp_path):
    config = SMALL["BertForMaskedLM"][0]
    inst = from_torch(*load("hf:BertForMaskedLM", **config), **EST)
    path = tmp_path / "bert.json"
    pipeopt.io.native.write_instance(inst, path)
    assert json.loads(path.read_text())  # written
    assert read_instance(path).graph.graph["torch"]["tracing"] == "module hooks"
