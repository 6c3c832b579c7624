"""The profiler's split of the backward into the input gradient I and the weight gradient W
(``bwd_w``, issue 10.1): measured as full backward - input-gradient-only backward, estimated
in the ratio of the two backwards' counted FLOPs, W = 0 without parameters, W = B when no
input needs grad; and :func:`pipeopt.cost.passes.pass_times` takes it instead of W = B/2.

Runs the shipped tiny models and a hand-checked toy (a few ms per layer, two timed repeats).
Budget: a few seconds.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch.fx")

import torch
from torch import nn

from pipeopt import Plan, Stage
from pipeopt.cost.passes import layers_without_split, pass_times
from pipeopt.io.native import from_dict, to_dict
from pipeopt.torch import MODELS, from_torch
from pipeopt.zoo.devices import KINDS, REFERENCE_FLOPS

EST = {"costs": "estimated", "device": "a100-40gb"}
FAST = {"repeats": 2, "warmup": 1}
FIRST = {"gpt-tiny": "tok_emb", "cnn-tiny": "stem"}  # fed by the model's inputs (ids, images)


class Mix(nn.Module):
    """A linear map followed by a parameter-free product ``y @ y^T``: its input gradient
    carries both (the two bmm gradients and ``dY A``), its weight gradient only ``X^T dY``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 4)

    def forward(self, x):
        y = self.lin(x)
        return y @ y.transpose(-1, -2)


class Gram(nn.Module):
    """Parameter-free: ``z @ z^T``."""

    def forward(self, z):
        return z @ z.transpose(-1, -2)


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(5, 5), Mix(), Gram(), nn.Linear(3, 2))

    def forward(self, x):
        return self.layers(x)


def toy():
    torch.manual_seed(0)
    return Toy(), (torch.randn(2, 3, 5),)


# Hand-counted FLOP (2 * m * n * k per matrix product; the bias gradient, a sum, counts 0) of
# each toy layer on x of shape (2, 3, 5): forward, full backward, weight gradient W.
TOY_FLOP = {
    # Linear(5, 5) on the model's input: no input gradient; W = X^T dY, 2 * 5 * 6 * 5
    "layers.0": (300, 300, 300),
    # Linear(5, 4) (2 * 6 * 5 * 4 = 240) then bmm (2 * 2 * 3 * 4 * 3 = 144); backward: two bmm
    # gradients (288), dY A (240) and X^T dY (240 = W)
    "layers.1": (384, 768, 240),
    # bmm (2 * 2 * 3 * 3 * 3 = 108), its two gradients; no parameters
    "layers.2": (108, 216, 0),
    # Linear(3, 2) on (2, 3, 3): dY A and X^T dY take 2 * 6 * 3 * 2 each
    "layers.3": (72, 144, 72),
}


@pytest.fixture(scope="module")
def instances():
    """Instances by (model, costs), profiled once."""
    out = {}
    for name in ("gpt-tiny", "cnn-tiny"):
        out[name, "estimated"] = (from_torch(*MODELS[name](), **EST), MODELS[name]()[0])
        out[name, "measured"] = (from_torch(*MODELS[name](), **FAST), MODELS[name]()[0])
    return out


def _trainable(module: nn.Module, fqn: str) -> bool:
    return any(p.requires_grad for p in module.get_submodule(fqn).parameters())


@pytest.mark.parametrize("costs", ["estimated", "measured"])
@pytest.mark.parametrize("name", ["gpt-tiny", "cnn-tiny"])
def test_every_layer_of_the_shipped_models_has_its_bwd_w(instances, name, costs):
    inst, module = instances[name, costs]
    g = inst.graph
    free = [n for n in g if not _trainable(module, n)]
    for n, d in g.nodes(data=True):
        assert set(d["bwd_w"]) == set(d["bwd"])
        for k, b in d["bwd"].items():
            assert 0.0 <= d["bwd_w"][k] <= b
        if n in free:  # parameter-free layers: W = 0
            assert all(w == 0.0 for w in d["bwd_w"].values()) and d["bwd_w_flop"] == 0.0
    assert g.nodes[FIRST[name]]["bwd_w"] == g.nodes[FIRST[name]]["bwd"]  # its input needs no grad: I = 0
    split = g.graph["torch"]["weight_split"]
    assert split["no-parameters"] == free
    assert split["no-input-grad"] == [FIRST[name]]
    assert sorted(split["difference"]) == sorted(set(g) - set(free) - {FIRST[name]})
    assert name != "cnn-tiny" or free == ["pool"]
    assert layers_without_split(g) == []
    back = from_dict(to_dict(inst))  # bwd_w passes the graph's validation and round-trips
    assert {n: d["bwd_w"] for n, d in back.graph.nodes(data=True)} == {n: d["bwd_w"] for n, d in g.nodes(data=True)}


def test_estimated_blocks_split_in_their_flop_ratio(instances):
    g = instances["gpt-tiny", "estimated"][0].graph
    for n in ("layers.0", "head"):
        d = g.nodes[n]
        assert 0 < d["bwd_w_flop"] < d["bwd_flop"]
        for k, b in d["bwd"].items():
            assert d["bwd_w"][k] == b * (d["bwd_w_flop"] / d["bwd_flop"])
    # the head (Linear, input 2-D after the norm): W = X^T dY, the same FLOP as dY A
    assert g.nodes["head"]["bwd_w_flop"] * 2 == g.nodes["head"]["bwd_flop"]


def test_estimated_split_is_the_hand_counted_flop_ratio():
    inst = from_torch(*toy(), **EST)
    g = inst.graph
    assert list(g) == list(TOY_FLOP)
    for n, (fwd, bwd, w) in TOY_FLOP.items():
        d = g.nodes[n]
        assert (d["flop"], d["bwd_flop"], d["bwd_w_flop"]) == (fwd, bwd, w), n
        for k in inst.cluster.kinds:
            b = bwd / (REFERENCE_FLOPS * KINDS[k].backward_efficiency)
            assert d["bwd"][k] == b
            assert d["bwd_w"][k] == b * (w / bwd)
    assert g.nodes["layers.1"]["bwd_w"]["gpu"] == pytest.approx(0.3125 * g.nodes["layers.1"]["bwd"]["gpu"], rel=1e-15)
    assert g.nodes["layers.3"]["bwd_w"]["gpu"] * 2 == g.nodes["layers.3"]["bwd"]["gpu"]
    line = next(a for a in inst.assumptions if a.startswith("weight gradient W"))
    assert "2 layer(s) (layers.1, layers.3)" in line
    assert "need no gradient (layers.0)" in line and "without trainable parameters (layers.2)" in line


def test_measured_split_follows_the_rules_on_the_toy():
    inst = from_torch(*toy(), **FAST)
    g = inst.graph
    assert g.nodes["layers.0"]["bwd_w"] == g.nodes["layers.0"]["bwd"]
    assert g.nodes["layers.2"]["bwd_w"] == {"cpu": 0.0}
    for n in ("layers.1", "layers.3"):
        assert 0.0 <= g.nodes[n]["bwd_w"]["cpu"] <= g.nodes[n]["bwd"]["cpu"]
    line = next(a for a in inst.assumptions if a.startswith("weight gradient W"))
    assert line.startswith("weight gradient W of the backward measured for 2 layer(s) (layers.1, layers.3)")


def test_probe_times_the_input_gradient_backward_in_the_same_rounds():
    from pipeopt.torch.probe import capture, probe
    from pipeopt.torch.trace import parse_granularity, trace

    module, inputs = toy()
    traced = trace(module, parse_granularity("container:layers"))
    recs = probe(traced, capture(traced, inputs, "cpu"), "cpu", timing=True, repeats=3, warmup=1)
    assert [r.w_rule for r in recs] == ["no-input-grad", "difference", "no-parameters", "difference"]
    for r in recs:
        assert len(r.bwd_samples) == 3
        assert len(r.bwd_i_samples) == (3 if r.w_rule == "difference" else 0)
        if r.w_rule == "difference":
            assert r.bwd_w_s == min(max(r.bwd_s - r.bwd_i_s, 0.0), r.bwd_s)
    assert [r.bwd_i_flop for r in recs] == [0.0, 528.0, 216.0, 72.0]  # the input-gradient-only backward
    assert all(p.grad is not None for p in module.parameters())  # the full backward still fills .grad


def test_pass_times_use_the_measured_split(instances):
    inst = instances["gpt-tiny", "measured"][0]
    g = inst.graph
    names = list(g)
    plan = Plan((Stage(tuple(names[:4]), ("cpu0",)), Stage(tuple(names[4:]), ("cpu1",))))
    t = pass_times(inst, plan)
    assert not any("W = B/2" in a for a in t.assumptions)
    assert any(a.startswith("weight gradient W of the backward measured for 7 layer(s)") for a in t.assumptions)
    # a stage's runtime overhead (once per stage and microbatch; the profile measures it, and
    # whether it is nonzero depends on the machine's load) is shared between I and W in
    # proportion to their loads; without it W is the sum of the layers' measured W
    for ob in (0.0, 0.002):
        h = g.copy()
        h.graph["stage_overhead"] = {"forward": 0.001, "backward": ob}
        t = pass_times(inst.replace(graph=h), plan)
        for c, st in enumerate(plan.stages):
            w = sum(g.nodes[n]["bwd_w"]["cpu"] for n in st.layers)
            b = sum(g.nodes[n]["bwd"]["cpu"] for n in st.layers)
            assert t.backward[c] == pytest.approx(b + ob, rel=1e-9)
            assert t.weight_grad[c] == pytest.approx(w * (b + ob) / b, rel=1e-9)
            assert t.input_grad[c] + t.weight_grad[c] == pytest.approx(t.backward[c], rel=1e-12)
