"""Tied weights of a profiled torch model: the shipped GPT with ``tie_weights=True`` (GPT-2's
LM head tied to its token embedding) is profiled with the tie recorded once, and every plan
that puts the embedding and the head on different stages charges the weight's state on both."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import pipeopt  # noqa: E402
from pipeopt.torch import from_torch, models  # noqa: E402
from pipeopt.torch.state import state_bytes  # noqa: E402

EST = {"costs": "estimated", "device": "a100-40gb"}


@pytest.fixture(scope="module")
def tied():
    module, inputs = models.MODELS["gpt-tiny"](tie_weights=True)
    assert module.head.weight is module.tok_emb.weight
    return module, from_torch(module, inputs, **EST)


def test_the_tie_is_recorded_once(tied):
    module, inst = tied
    (tie,) = inst.graph.graph["tied"]
    w = module.tok_emb.weight
    assert tie["name"] == "tok_emb.weight" and tie["aliases"] == ["head.weight"]
    assert tie["layers"] == ["tok_emb", "head"]
    assert tie["bytes"] == w.numel() * w.element_size()
    assert tie["state_bytes"] == sum(state_bytes(tie["bytes"], w.numel(), "adam-fp32").values()) == 4 * tie["bytes"]
    g = inst.graph
    assert g.nodes["tok_emb"]["param_bytes"] == 0 and g.nodes["head"]["param_bytes"] == 0
    total = sum(p.numel() * p.element_size() for p in module.parameters())  # each tensor once
    assert sum(g.nodes[n]["weight_bytes"] for n in g) + tie["bytes"] == total
    assert any(a.startswith("tied parameter tok_emb.weight = head.weight") for a in inst.assumptions)
    untied = from_torch(*models.MODELS["gpt-tiny"](), **EST).graph
    assert "tied" not in untied.graph


@pytest.mark.parametrize("method", ["dp", "probe", "milp", "cpsat"])
def test_both_end_stages_hold_the_tie(tied, method):
    _, inst = tied
    tie = inst.graph.graph["tied"][0]
    res = pipeopt.solve(inst, method=method, stages=2)
    ev = pipeopt.evaluate(inst, res.plan)
    assert ev.tied[0]["stages"] == [0, 1]
    for i, st in enumerate(res.plan.stages):
        own = sum(inst.graph.nodes[n]["param_bytes"] for n in st.layers)
        act = sum(inst.graph.nodes[n]["act_bytes"] for n in st.layers)
        assert ev.memory[i] == pytest.approx(ev.in_flight[i] * act + own + tie["state_bytes"], rel=1e-12)
    assert ev.tie_sync == pytest.approx(2 * (2 - 1) / 2 * tie["bytes"] / inst.cluster.bandwidth)


def test_hf_gpt2_ties_wte_to_lm_head(monkeypatch):
    """Hugging Face GPT-2 (small config, random weights) ties lm_head.weight to
    transformer.wte.weight: the profile records the tie, and every plan's first and last stage
    both hold it."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from pipeopt.torch.models import load

    module, inputs = load("hf:GPT2LMHeadModel", n_layer=2, n_embd=32, n_head=2, vocab_size=512, bos_token_id=0, eos_token_id=0, seq=16)
    assert module.lm_head.weight is module.transformer.wte.weight
    inst = from_torch(module, inputs, granularity="auto", devices=3, **EST)
    (tie,) = inst.graph.graph["tied"]
    assert {tie["name"], *tie["aliases"]} == {"transformer.wte.weight", "lm_head.weight"}
    assert tie["bytes"] == 512 * 32 * 4
    for S in (2, 3):
        res = pipeopt.solve(inst, method="dp", stages=S)
        ev = pipeopt.evaluate(inst, res.plan)
        held = ev.tied[0]["stages"]
        assert held[0] == 0 and held[-1] == S - 1  # wte on the first stage, lm_head on the last
        for i in (0, S - 1):
            own = sum(inst.graph.nodes[n]["param_bytes"] for n in res.plan.stages[i].layers)
            act = sum(inst.graph.nodes[n]["act_bytes"] for n in res.plan.stages[i].layers)
            assert ev.memory[i] == pytest.approx(ev.in_flight[i] * act + own + tie["state_bytes"], rel=1e-12)
