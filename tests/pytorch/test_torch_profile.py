"""pipeopt.torch.from_torch: the layer graph of an nn.Module, its bytes and its costs (issue 9.1).

Runs on the shipped tiny models (a few ms each); estimated costs run on the meta device and
compute nothing. Budget: a few seconds in all.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch.fx")

import itertools

import networkx as nx
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import pipeopt
from pipeopt.errors import InvalidClusterError, InvalidGraphError, InvalidProblemError
from pipeopt.io.native import read_instance, to_dict, write_instance
from pipeopt.torch import MODELS, from_torch
from pipeopt.units import DEFAULT_MICROBATCHES
from pipeopt.zoo.devices import KINDS, REFERENCE_FLOPS

EST = {"costs": "estimated", "device": "a100-40gb"}


def _leaves(module: nn.Module) -> list[str]:
    return [n for n, m in module.named_modules() if n and not any(True for _ in m.children())]


# ---- the graph matches the module tree --------------------------------------------------------
@pytest.mark.parametrize("costs", ["estimated", "measured"])
def test_gpt_container_graph_is_the_module_chain(costs):
    module, inputs = MODELS["gpt-tiny"]()
    kw = EST if costs == "estimated" else {"repeats": 2, "warmup": 1}
    inst = from_torch(module, inputs, **kw)
    g = inst.graph
    expected = ["tok_emb", "pos_emb", *(f"layers.{i}" for i in range(len(module.layers))), "norm", "head"]
    assert list(g.nodes) == expected
    assert list(g.edges) == list(itertools.pairwise(expected))  # the sum of the embeddings joins pos_emb
    assert all(d["fqn"] == n for n, d in g.nodes(data=True))
    assert {n: d["op"] for n, d in g.nodes(data=True)}["layers.0"] == "Block"
    t = g.graph["torch"]
    assert t["model"] == "GPT" and t["granularity"] == "container:layers" and t["container"] == "layers"
    assert t["costs"] == ("measured" if costs == "measured" else "estimated:a100-40gb")
    assert t["torch_version"] == torch.__version__
    assert t["graph_outputs"] == ["head"]
    assert t["input_readers"] == ["tok_emb"]  # pos_emb reads only the ids' shape
    assert not any("inputs are read by" in a for a in inst.assumptions)
    assert any("FLOP" in a or "measured" in a for a in inst.assumptions)


@pytest.mark.parametrize("name", ["gpt-tiny", "cnn-tiny"])
def test_children_and_leaves_granularities(name):
    module, inputs = MODELS[name]()
    children = from_torch(module, inputs, granularity="children", **EST).graph
    assert list(children.nodes) == [n for n, _ in module.named_children()]
    assert children.graph["torch"]["container"] is None
    leaves = from_torch(module, inputs, granularity="leaves", **EST).graph
    assert sorted(leaves.nodes) == sorted(_leaves(module))  # every leaf module is called once
    assert nx.is_directed_acyclic_graph(leaves)


def test_cnn_container_graph_and_nested_container():
    module, inputs = MODELS["cnn-tiny"]()
    g = from_torch(module, inputs, **EST).graph
    assert list(g.nodes) == ["stem", *(f"layers.{i}" for i in range(len(module.layers))), "pool", "head"]
    # a container below the root: the siblings on the path to it come along
    g = from_torch(module, inputs, granularity="container:layers.0", **EST).graph
    assert "layers.0.conv1" in g and "layers.0.shortcut" in g and "layers.1" in g and "stem" in g
    assert "layers.0" not in g and "layers" not in g


class HFStyle(nn.Module):
    """Hugging Face GPT-2's module tree: the blocks in ``transformer.h``, the head outside."""

    def __init__(self):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(16, 8)
        self.transformer.h = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.transformer.ln_f = nn.LayerNorm(8)
        self.lm_head = nn.Linear(8, 16)

    def forward(self, idx):
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            x = x + block(x)
        return self.lm_head(self.transformer.ln_f(x))


def test_container_below_the_root_brings_the_modules_around_it():
    g = from_torch(HFStyle(), (torch.tensor([[1, 2, 3]]),), granularity="container:transformer.h", **EST).graph
    assert list(g.nodes) == ["transformer.wte", "transformer.h.0", "transformer.h.1", "transformer.ln_f", "lm_head"]
    assert g.graph["torch"]["container"] == "transformer.h"


# ---- bytes --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt-tiny", "cnn-tiny"])
@pytest.mark.parametrize("granularity", ["container:layers", "children", "leaves"])
def test_parameter_bytes_equal_the_modules(name, granularity):
    module, inputs = MODELS[name]()
    g = from_torch(module, inputs, granularity=granularity, **EST).graph
    total = sum(p.numel() * p.element_size() for p in module.parameters())
    buffers = sum(b.numel() * b.element_size() for b in module.buffers())
    assert sum(w for _, w in g.nodes(data="weight_bytes")) == total
    for node, d in g.nodes(data=True):
        own = sum(p.numel() * p.element_size() for p in module.get_submodule(node).parameters())
        assert d["weight_bytes"] == own
        # adam-fp32: weights + gradients + two states, all in fp32, plus buffers once
        assert d["param_bytes"] == 4 * own + d["buffer_bytes"]
        assert d["weight_bytes"] + d["grad_bytes"] + d["optimizer_bytes"] + d["buffer_bytes"] == d["param_bytes"]
    assert sum(b for _, b in g.nodes(data="buffer_bytes")) == buffers


@pytest.mark.parametrize("optimizer, per_param", [("adam-mixed", 16), ("sgd", 8), ("weights", 4)])
def test_optimizer_state_per_parameter(optimizer, per_param):
    module, inputs = MODELS["gpt-tiny"]()
    g = from_torch(module, inputs, optimizer=optimizer, **EST).graph
    n = sum(p.numel() for p in module.parameters())
    assert sum(p for _, p in g.nodes(data="param_bytes")) == per_param * n  # gpt has no buffers


def test_tied_weights_are_recorded_as_a_tie():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.mid = nn.Linear(4, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, i):
            return self.head(self.mid(self.emb(i)))

    module = Tied()
    g = from_torch(module, (torch.tensor([[1, 2, 3]]),), granularity="children", **EST).graph
    assert g.graph["tied"] == [{"name": "emb.weight", "aliases": ["head.weight"], "bytes": 160.0,
                                "state_bytes": 640.0, "layers": ["emb", "head"]}]  # adam-fp32: 4 x 160
    # the tied 10 x 4 matrix is in no layer: the layers hold mid's 80 bytes only
    assert sum(w for _, w in g.nodes(data="weight_bytes")) + 160 == sum(
        p.numel() * p.element_size() for p in module.parameters())
    assert g.nodes["emb"]["weight_bytes"] == 0 and g.nodes["head"]["weight_bytes"] == 0


@pytest.mark.parametrize("name", ["gpt-tiny", "cnn-tiny"])
def test_edge_bytes_are_the_real_tensor_sizes(name):
    """Every edge into a layer that reads one tensor carries that tensor's numel x element size,
    as a forward pre-hook on the real module sees it (the GPT's pos_emb, which reads the
    positions but absorbs the sum with tok_emb's output, is the exception)."""
    module, inputs = MODELS[name]()
    g = from_torch(module, inputs, **EST).graph
    seen = {}
    handles = [
        module.get_submodule(n).register_forward_pre_hook(
            lambda m, args, n=n: seen.__setitem__(n, sum(a.numel() * a.element_size() for a in args))
        )
        for n in g
    ]
    with torch.no_grad():
        out = module(*inputs)
    for h in handles:
        h.remove()
    checked = 0
    for u, v, b in g.edges(data="bytes"):
        if v != "pos_emb":
            assert b == seen[v], (u, v)
            checked += 1
    assert checked == g.number_of_edges() - (name == "gpt-tiny")
    assert g.nodes["head"]["out_bytes"] == out.numel() * out.element_size()
    if name == "gpt-tiny":  # batch 2 x seq 16 x d 32 x 4 bytes between blocks
        assert g.edges["layers.0", "layers.1"]["bytes"] == 2 * 16 * 32 * 4


def test_bytes_and_flop_by_hand():
    """Linear(8, 16) -> ReLU -> Linear(16, 4) on a batch of 2 (float32):
    edges carry 2 x 16 x 4 = 128 bytes; the first Linear keeps its input (2 x 8 x 4 = 64 B) for
    its weight gradient, ReLU its output (128 B), the second Linear its input (128 B); forward
    FLOP 2 x 2 x 8 x 16 = 512 and 2 x 2 x 16 x 4 = 256; backward of the first layer only the
    weight gradient (its input needs none) = 512, of the last both = 512."""
    module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    g = from_torch(module, (torch.randn(2, 8),), granularity="leaves", **EST).graph
    assert [g.edges[e]["bytes"] for e in g.edges] == [128.0, 128.0]
    assert [d["act_bytes"] for _, d in g.nodes(data=True)] == [64.0, 128.0, 128.0]
    assert [d["flop"] for _, d in g.nodes(data=True)] == [512.0, 0.0, 256.0]
    assert [d["bwd_flop"] for _, d in g.nodes(data=True)] == [512.0, 0.0, 512.0]
    assert g.nodes["2"]["out_bytes"] == 32.0


@settings(max_examples=8, deadline=None)
@given(widths=st.lists(st.integers(1, 24), min_size=2, max_size=5), batch=st.integers(1, 5))
def test_random_mlps_bytes_and_flop(widths, batch):
    """Linear(w0, w1) -> Tanh -> Linear(w1, w2) -> ...: edge i carries batch x width x 4 bytes,
    a Linear's forward is 2 x batch x in x out FLOP, weights (w_in + 1) x w_out x 4 bytes."""
    mods = []
    for a, b in itertools.pairwise(widths):
        mods += [nn.Linear(a, b), nn.Tanh()]
    module = nn.Sequential(*mods)
    g = from_torch(module, (torch.randn(batch, widths[0]),), granularity="children", **EST).graph
    assert list(g.nodes) == [str(i) for i in range(len(mods))]
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        lin, act = str(2 * i), str(2 * i + 1)
        assert g.nodes[lin]["flop"] == 2 * batch * a * b
        assert g.nodes[lin]["weight_bytes"] == (a + 1) * b * 4
        assert g.edges[lin, act]["bytes"] == batch * b * 4
        if i:
            assert g.edges[str(2 * i - 1), lin]["bytes"] == batch * a * 4


# ---- costs -------------------------------------------------------------------------------------
def test_measured_times_positive_and_repeatable():
    """Two profiles of the same model: every time positive, and the medians' totals within a
    factor 3 of each other (a loose bound: CI machines are shared; no timing is asserted
    against a constant)."""
    module, inputs = MODELS["gpt-tiny"]()
    runs = [from_torch(module, inputs, repeats=5, warmup=2).graph for _ in range(2)]
    for g in runs:
        assert all(d["cpu"] > 0 for _, d in g.nodes(data="fwd"))
        assert all(d["cpu"] > 0 for _, d in g.nodes(data="bwd"))
        t = g.graph["torch"]
        assert t["repeats"] == 5 and t["whole_model_s"] > 0 and t["sum_of_layers_s"] > 0
    totals = [sum(d["fwd"]["cpu"] + d["bwd"]["cpu"] for _, d in g.nodes(data=True)) for g in runs]
    assert 1 / 3 <= totals[0] / totals[1] <= 3


def test_measuring_leaves_the_model_as_it_was():
    module, inputs = MODELS["cnn-tiny"]()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    threads = torch.get_num_threads()
    from_torch(module, inputs, repeats=2, warmup=1, threads=1)
    after = module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # batch-norm statistics restored
    assert all(p.grad is None for p in module.parameters())
    assert torch.get_num_threads() == threads


def test_estimated_costs_scale_with_flops():
    small = from_torch(*MODELS["gpt-tiny"](batch=2), **EST).graph
    large = from_torch(*MODELS["gpt-tiny"](batch=4), **EST).graph
    gpu = KINDS["gpu"]
    for n, d in small.nodes(data=True):
        assert d["fwd"]["gpu"] == pytest.approx(d["flop"] / (REFERENCE_FLOPS * gpu.forward_efficiency))
        assert d["bwd"]["gpu"] == pytest.approx(d["bwd_flop"] / (REFERENCE_FLOPS * gpu.backward_efficiency))
        if d["flop"]:
            # twice the batch: twice the FLOP, twice the time
            assert large.nodes[n]["fwd"]["gpu"] == pytest.approx(2 * d["fwd"]["gpu"])
            assert large.nodes[n]["bwd"]["gpu"] == pytest.approx(2 * d["bwd"]["gpu"])
    blocks = [small.nodes[f"layers.{i}"]["flop"] for i in range(4)]
    assert len(set(blocks)) == 1 and blocks[0] > 0
    # a multi-kind catalogue device gets times for every kind it has
    both = from_torch(*MODELS["gpt-tiny"](), costs="estimated", device="server-a100-epyc").graph
    assert set(both.nodes["head"]["fwd"]) == {"cpu", "gpu"}


def test_cluster_and_settings():
    module, inputs = MODELS["gpt-tiny"]()
    inst = from_torch(module, inputs, devices=3, bandwidth="10Gbps", memory="1GiB", repeats=1, warmup=0)
    assert [d.name for d in inst.cluster.devices] == ["cpu0", "cpu1", "cpu2"]
    assert inst.cluster.bandwidth == 1.25e9 and inst.cluster.devices[0].memory == 2**30
    assert inst.settings.microbatches == DEFAULT_MICROBATCHES  # the one default M (not 4 x devices)
    est = from_torch(module, inputs, devices=4, microbatches=8, **EST)
    assert len(est.cluster.devices) == 4 and est.cluster.devices[0].memory == 40e9
    assert est.settings.microbatches == 8


# ---- into the rest of pipeopt ------------------------------------------------------------------
def test_instance_solves_and_round_trips(tmp_path):
    module, inputs = MODELS["gpt-tiny"]()
    inst = pipeopt.from_torch(module, inputs, repeats=2, warmup=1)
    result = pipeopt.solve(inst, stages=2, time_limit=None)
    assert result.status.value == "optimal"
    layers = [n for st in result.plan.stages for n in st.layers]
    assert sorted(layers) == sorted(inst.graph.nodes)
    assert result.objective == pytest.approx(pipeopt.evaluate(inst, result.plan).objective)
    back = read_instance(write_instance(inst, tmp_path / "gpt.json"))
    assert to_dict(back) == to_dict(inst)
    assert back.graph.graph["torch"]["granularity"] == "container:layers"


# ---- bad input ---------------------------------------------------------------------------------
class DataDependent(nn.Module):
    """torch.fx cannot trace ``if x.sum() > 0`` (control flow on a tensor's value)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(self, x):
        if x.sum() > 0:
            x = -x
        for layer in self.layers:
            x = layer(x)
        return x


class BranchyBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) if x.sum() > 0 else self.fc(-x)


class BranchyInside(nn.Module):
    """Traceable at the container granularity (its blocks are leaves), not at leaf granularity."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(BranchyBlock(), BranchyBlock())

    def forward(self, x):
        return self.layers(x)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"granularity": "blocks"}, InvalidProblemError, ["granularity 'blocks'", "container:NAME"]),
        ({"granularity": "container:"}, InvalidProblemError, ["granularity"]),
        ({"granularity": "container:blocks"}, InvalidProblemError, ["container 'blocks' not found", "['layers']"]),
        ({"granularity": "container:norm"}, InvalidProblemError, ["'norm'", "no children"]),
        ({"costs": "guessed"}, InvalidProblemError, ["costs 'guessed'"]),
        ({"costs": "estimated"}, InvalidProblemError, ["device"]),
        ({"costs": "estimated", "device": "tpu9"}, InvalidClusterError, ["tpu9"]),
        ({"device": "a100-40gb"}, InvalidProblemError, ["estimated"]),
        ({"optimizer": "lion"}, InvalidProblemError, ["optimizer 'lion'"]),
        ({"repeats": 0}, InvalidProblemError, ["repeats"]),
        ({"devices": 0}, InvalidProblemError, ["devices"]),
        ({"precision": "fp8", **EST}, InvalidProblemError, ["precision 'fp8'"]),
    ],
)
def test_bad_options_name_the_problem(kwargs, error, words):
    module, inputs = MODELS["gpt-tiny"]()
    with pytest.raises(error) as exc:
        from_torch(module, inputs, **kwargs)
    for w in words:
        assert w in str(exc.value)


def test_untraceable_model_is_a_typed_error():
    with pytest.raises(InvalidGraphError, match=r"torch.fx cannot trace DataDependent"):
        from_torch(DataDependent(), (torch.randn(2, 4),), tracing="fx", **EST)
    # tracing "auto" (the default): module hooks where fx cannot trace
    g = from_torch(DataDependent(), (torch.randn(2, 4),), **EST).graph
    assert list(g.nodes) == ["layers.0", "layers.1"] and g.graph["torch"]["tracing"] == "module hooks"
    model = BranchyInside()
    g = from_torch(model, (torch.randn(2, 4),), repeats=1, warmup=0).graph  # the branches hide in the layers
    assert list(g.nodes) == ["layers.0", "layers.1"] and g.graph["torch"]["tracing"] == "torch.fx"
    with pytest.raises(InvalidGraphError, match=r"granularity 'leaves'"):
        from_torch(model, (torch.randn(2, 4),), granularity="leaves", tracing="fx", repeats=1, warmup=0)
    with pytest.raises(InvalidProblemError, match=r"BranchyInside on the meta device failed.*costs='measured'"):
        from_torch(model, (torch.randn(2, 4),), **EST)  # nothing to branch on without values


def test_inputs_that_do_not_fit_are_a_typed_error():
    module, _ = MODELS["cnn-tiny"]()
    with pytest.raises(InvalidProblemError, match=r"CNN on the cpu device failed.*example inputs"):
        from_torch(module, (torch.randn(2, 5, 8, 8),), repeats=1, warmup=0)  # 5 channels, not 3


def test_not_a_module_or_bad_inputs():
    with pytest.raises(InvalidProblemError, match="nn.Module"):
        from_torch(lambda x: x, (torch.randn(2),), **EST)
    with pytest.raises(InvalidProblemError, match="example_inputs"):
        from_torch(nn.Linear(2, 2), {"x": torch.randn(2)}, **EST)
    g = from_torch(nn.Sequential(nn.Linear(2, 2)), torch.randn(3, 2), granularity="children", **EST).graph
    assert list(g.nodes) == ["0"]  # one tensor is taken as the one positional input


def test_shared_weights_called_apart_are_refused():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)

        def forward(self, x):
            return self.a(self.b(self.a(x)))

    with pytest.raises(InvalidGraphError, match=r"cycle.*'?a'? -> b|cycle"):
        from_torch(Shared(), (torch.randn(1, 4),), granularity="children", **EST)


def test_an_input_read_by_later_layers_is_an_assumption():
    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

        def forward(self, x, mask):
            for layer in self.layers:
                x = layer(x) * mask
            return x

    inst = from_torch(Masked(), (torch.randn(2, 4), torch.ones(2, 4)), **EST)
    assert inst.graph.graph["torch"]["input_readers"] == ["layers.0", "layers.1"]
    assert any("inputs are read by ['layers.0', 'layers.1']" in a for a in inst.assumptions)


def test_no_memory_limit_is_an_assumption():
    inst = from_torch(*MODELS["gpt-tiny"](), repeats=1, warmup=0)
    assert any("no memory limit" in a for a in inst.assumptions)
    assert math.isinf(inst.cluster.devices[0].memory)
