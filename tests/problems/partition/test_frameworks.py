"""The frameworks' default splits (torchtitan, Megatron-LM, PiPPy) on a graph shaped like one of
``pipeopt.torch.from_torch`` (built by hand: no torch needed), cross-checked against
torchtitan's own function (quoted below) and against Megatron's documented behaviour."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeopt import solve
from pipeopt.cluster import Cluster
from pipeopt.cost import evaluate
from pipeopt.errors import InvalidProblemError
from pipeopt.instance import Instance
from pipeopt.problems.partition.frameworks import (
    around_container,
    megatron_blocks,
    pippy_blocks,
    torchtitan_blocks,
)


def gpt_graph(layers: int = 8, head: float = 1.3, torch_meta: bool = True) -> nx.DiGraph:
    """tok_emb, pos_emb, layers.0..L-1, norm, head in execution order; a block costs 1 ms,
    the head ``head`` ms, the embeddings and the norm 0.05 ms (forward; backward twice)."""
    g = nx.DiGraph()
    names = ["tok_emb", "pos_emb", *[f"layers.{i}" for i in range(layers)], "norm", "head"]
    cost = {"head": head * 1e-3}
    for n in names:
        t = cost.get(n, 1e-3 if n.startswith("layers.") else 5e-5)
        g.add_node(n, fwd={"cpu": t}, bwd={"cpu": 2 * t}, out_bytes=1e4, act_bytes=1e4, param_bytes=1e5)
    chain = names[1:]
    g.add_edge("tok_emb", "layers.0")
    for u, v in zip(chain, chain[1:]):
        g.add_edge(u, v)
    if torch_meta:
        g.graph["torch"] = {"model": "GPT", "granularity": "container:layers", "container": "layers"}
    return g


def instance(graph: nx.DiGraph, devices: int = 4) -> Instance:
    return Instance(graph, Cluster.homogeneous(devices, kind="cpu", bandwidth=1e9))


# torchtitan v0.2.2, torchtitan/distributed/pipeline_parallel.py, generate_llm_fqn_per_model_part
# (Copyright (c) Meta Platforms, Inc. and affiliates; BSD-3-Clause), quoted verbatim but for the
# docstring, as the reference the transcription in pipeopt is checked against.
def generate_llm_fqn_per_model_part(num_stages, num_layers, input_weight=1, output_weight=1):
    if num_stages < 1:
        raise ValueError("Number of stages must be at least 1")
    if num_stages == 1:
        layer_names = [f"layers.{i}" for i in range(num_layers)]
        return [["tok_embeddings"] + layer_names + ["norm", "output"]]
    num_effective_layers = num_layers + input_weight + output_weight
    if num_stages > num_effective_layers:
        raise ValueError("...")
    layers_per_stage = num_effective_layers // num_stages
    extra_layers = num_effective_layers % num_stages
    if layers_per_stage == 0:
        raise ValueError("...")
    if input_weight > layers_per_stage:
        raise ValueError("...")
    if output_weight > layers_per_stage:
        raise ValueError("...")
    module_names_per_stage = []
    current_layer = 0
    for stage_idx in range(num_stages):
        stage_modules = []
        effective_layers_for_stage = layers_per_stage
        if stage_idx < extra_layers:
            effective_layers_for_stage += 1
        if stage_idx == 0:
            stage_modules.append("tok_embeddings")
            remaining_layers_for_stage = effective_layers_for_stage - input_weight
            for _ in range(remaining_layers_for_stage):
                if current_layer < num_layers:
                    stage_modules.append(f"layers.{current_layer}")
                    current_layer += 1
        elif stage_idx == num_stages - 1:
            remaining_layers_for_stage = effective_layers_for_stage - output_weight
            for _ in range(remaining_layers_for_stage):
                if current_layer < num_layers:
                    stage_modules.append(f"layers.{current_layer}")
                    current_layer += 1
            stage_modules.extend(["norm", "output"])
        else:
            for _ in range(effective_layers_for_stage):
                if current_layer < num_layers:
                    stage_modules.append(f"layers.{current_layer}")
                    current_layer += 1
        module_names_per_stage.append(stage_modules)
    return module_names_per_stage


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 10), st.integers(1, 24), st.integers(0, 3), st.integers(0, 3))
def test_torchtitan_blocks_equal_torchtitans_function(stages, layers, iw, ow):
    try:
        ref = [sum(1 for m in part if m.startswith("layers.")) for part in
               generate_llm_fqn_per_model_part(stages, layers, iw, ow)]
    except ValueError:
        with pytest.raises(InvalidProblemError):
            torchtitan_blocks(stages, layers, iw, ow)
        return
    assert torchtitan_blocks(stages, layers, iw, ow) == ref


def test_megatron_blocks_follow_get_num_layers_to_build():
    assert megatron_blocks(4, 8) == [2, 2, 2, 2]
    assert megatron_blocks(3, 8, account_for_embedding=True) == [2, 3, 3]  # (8 + 1) / 3, E takes one
    assert megatron_blocks(2, 8, account_for_embedding=True, account_for_loss=True) == [4, 4]  # 10 / 2 - 1
    assert megatron_blocks(4, 8, first=1, last=1) == [1, 3, 3, 1]
    with pytest.raises(InvalidProblemError, match="divisible"):
        megatron_blocks(3, 8)  # Megatron asserts num_layers % pipeline size == 0
    with pytest.raises(InvalidProblemError, match="uneven"):
        megatron_blocks(4, 8, first=1, account_for_loss=True)


def test_pippy_blocks_put_the_remainder_last():
    assert pippy_blocks(3, 8) == [2, 2, 4]
    assert pippy_blocks(2, 8) == [4, 4]
    with pytest.raises(InvalidProblemError):
        pippy_blocks(4, 3)


def test_around_container_splits_the_model_in_three():
    order = ["tok_emb", "pos_emb", "layers.0", "layers.1.attn", "layers.1.mlp", "norm", "head"]
    before, blocks, after = around_container(order, "layers")
    assert (before, blocks, after) == (["tok_emb", "pos_emb"], ["layers.0", "layers.1"], ["norm", "head"])
    with pytest.raises(InvalidProblemError, match="runs between blocks"):
        around_container(["layers.0", "norm", "layers.1"], "layers")


@pytest.mark.parametrize("method,stages,expected", [
    # 8 blocks, S = 2: torchtitan 10 effective / 2 = 5 - 1 each; Megatron and PiPPy 4 + 4
    ("torchtitan", 2, [4, 4]),
    ("megatron", 2, [4, 4]),
    ("pippy", 2, [4, 4]),
    ("torchtitan", 4, [2, 3, 2, 1]),
    ("megatron", 4, [2, 2, 2, 2]),
    ("pippy", 3, [2, 2, 4]),
])
def test_framework_plans_on_a_torch_graph(method, stages, expected):
    inst = instance(gpt_graph())
    res = solve(inst, method=method, stages=stages)
    blocks = [sum(1 for n in st.layers if n.startswith("layers.")) for st in res.plan.stages]
    assert blocks == expected
    assert res.plan.stages[0].layers[:2] in (("tok_emb", "pos_emb"), ("pos_emb", "tok_emb"))
    assert res.plan.stages[-1].layers[-2:] == ("norm", "head")
    assert res.objective == evaluate(inst, res.plan).objective
    assert str(res.status) == "feasible" and res.lower_bound is None
    assert res.info["blocks_per_stage"] == expected


def test_exact_plan_beats_the_defaults_when_the_head_is_heavy():
    """Head = 3.5 blocks (issue 9's GPT with a 50k vocabulary): torchtitan's S = 4 split gives
    the last stage 1 block + head = 4.5 ms forward; the DP balances better."""
    inst = instance(gpt_graph(head=3.5))
    best = solve(inst, method="dp", stages=4)
    tt = solve(inst, method="torchtitan", stages=4)
    assert best.objective < tt.objective


@pytest.mark.parametrize("method", ["torchtitan", "megatron", "pippy"])
def test_frameworks_refuse_a_graph_without_torch_provenance(method):
    inst = instance(gpt_graph(torch_meta=False))
    with pytest.raises(InvalidProblemError, match="from_torch"):
        solve(inst, method=method, stages=2)


def test_megatron_refuses_what_megatron_refuses():
    with pytest.raises(InvalidProblemError, match="divisible"):
        solve(instance(gpt_graph()), method="megatron", stages=3)
