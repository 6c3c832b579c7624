"""The recomputation baselines (Megatron-LM's uniform and block recomputation, torchtitan's
every-k-th layer, the exact optimum without recomputation): each plan is what its rule says,
its claimed objective is evaluate's, and the search for N / k picks what the rule's brute force
picks, on small transformer chains (zoo-style sub-blocks and from_torch-style blocks)."""

from __future__ import annotations

import networkx as nx
import pytest

from pipeopt import PartitionProblem, solve, zoo
from pipeopt.cluster import Cluster
from pipeopt.cost import evaluate
from pipeopt.errors import InfeasibleError, InvalidProblemError
from pipeopt.instance import Instance
from pipeopt.problems.partition import METHODS, solve_dp
from pipeopt.problems.partition import recompute_baselines as rb
from pipeopt.problems.partition.frameworks import megatron_blocks, torchtitan_blocks
from pipeopt.result import Status


def zoo_style(layers: int = 8) -> nx.DiGraph:
    """input, embed, layer{i}_attn, layer{i}_mlp, head: a chain shaped like the zoo's GPT."""
    g = nx.DiGraph()
    names = ["input", "embed"] + [f"layer{i}_{p}" for i in range(layers) for p in ("attn", "mlp")] + ["head"]
    for n in names:
        t = 1e-3 if n.startswith("layer") else 4e-4
        act = 3e4 if n.endswith("_attn") else 2e4 if n.endswith("_mlp") else 1e3
        g.add_node(n, fwd={"gpu": t}, bwd={"gpu": 2 * t}, out_bytes=1e3, act_bytes=act, param_bytes=1e4,
                   **({"pin_first": True} if n == "input" else {}))
    nx.add_path(g, names)
    return g


def torch_style(layers: int = 8) -> nx.DiGraph:
    """tok_emb, layers.0..L-1, norm, head with a from_torch container attribute."""
    g = nx.DiGraph()
    names = ["tok_emb", *[f"layers.{i}" for i in range(layers)], "norm", "head"]
    for n in names:
        t = 1e-3 if n.startswith("layers.") else 3e-4
        g.add_node(n, fwd={"gpu": t}, bwd={"gpu": 2 * t}, out_bytes=1e3,
                   act_bytes=5e4 if n.startswith("layers.") else 1e3, param_bytes=1e4)
    nx.add_path(g, names)
    g.graph["torch"] = {"model": "GPT", "granularity": "container:layers", "container": "layers"}
    return g


def problem(graph, S: int = 4, memory: float = float("inf")) -> PartitionProblem:
    return PartitionProblem(Instance(graph, Cluster.homogeneous(S, memory=memory, bandwidth=1e9)), S)


def blocks_of_stages(result, graph) -> list[list[str]]:
    """Per stage, its blocks' keys in order (the zoo's i or the container child)."""
    before, blocks, after = rb.transformer_parts(graph)
    key = {n: b[0] for b in blocks for n in b}
    return [list(dict.fromkeys(key[n] for n in st.layers if n in key)) for st in result.plan.stages]


def recomputed_blocks(result, graph) -> list[list[bool]]:
    """Per stage, per block: every layer of the block recomputed "full" (and no other layer)."""
    before, blocks, after = rb.transformer_parts(graph)
    of = {b[0]: b for b in blocks}
    out = []
    for st, keys in zip(result.plan.stages, blocks_of_stages(result, graph)):
        rc = st.recompute or {}
        assert set(rc.values()) <= {"full"}
        assert not set(rc) & set(before + after), "only transformer blocks are recomputed"
        flags = [all(n in rc for n in of[k]) for k in keys]
        assert all(all(n in rc for n in of[k]) or not any(n in rc for n in of[k]) for k in keys), "whole blocks"
        out.append(flags)
    return out


def assert_scored(result, prob):
    ev = evaluate(prob.instance, result.plan)
    assert result.objective == ev.objective
    assert result.status == (Status.FEASIBLE if ev.feasible else Status.INFEASIBLE)
    assert result.lower_bound is None
    # a recomputing plan is not in the one-order (no-recompute) space a DP's bound covers
    recomputes = any(st.recompute for st in result.plan.stages)
    assert result.space == (rb.RECOMPUTE_SPACE if recomputes else "one-order")


# ---- the rules ---------------------------------------------------------------------------------
def test_rules():
    assert rb.megatron_uniform_rule([2, 3]) == [[True, True], [True, True, True]]
    with pytest.raises(InvalidProblemError, match="chunks of 2"):
        rb.megatron_uniform_rule([2, 2], 2)
    assert rb.megatron_block_rule([3, 2], 2) == [[True, True, False], [True, True]]
    assert rb.megatron_block_rule([3, 2], 0) == [[False] * 3, [False] * 2]
    assert rb.megatron_block_rule([3, 2], 5) == [[True] * 3, [True] * 2]
    # torchtitan v0.2.2 _apply_layer_sac: count += 1 per block, wrap iff count % k == 0 (restarts per rank)
    assert rb.torchtitan_layer_rule([4, 3], 2) == [[False, True, False, True], [False, True, False]]
    assert rb.torchtitan_layer_rule([5], 3) == [[False, False, True, False, False]]
    assert rb.torchtitan_layer_rule([2], 1) == rb.torchtitan_layer_rule([2], 0) == [[True, True]]
    with pytest.raises(InvalidProblemError):
        rb.torchtitan_layer_rule([2], -1)


def test_transformer_parts():
    before, blocks, after = rb.transformer_parts(zoo_style(3))
    assert before == ["input", "embed"] and after == ["head"]
    assert blocks == [("layer0_attn", "layer0_mlp"), ("layer1_attn", "layer1_mlp"), ("layer2_attn", "layer2_mlp")]
    before, blocks, after = rb.transformer_parts(torch_style(3))
    assert before == ["tok_emb"] and after == ["norm", "head"] and blocks == [("layers.0",), ("layers.1",), ("layers.2",)]
    g = zoo.model("llama-7b", microbatch=1)
    before, blocks, after = rb.transformer_parts(g)
    assert len(blocks) == 32 and before == ["input", "embed"] and after == ["head"]
    with pytest.raises(InvalidProblemError, match="transformer blocks"):
        rb.transformer_parts(zoo.model("alexnet", microbatch=1))


# ---- the methods on small chains ---------------------------------------------------------------
@pytest.mark.parametrize("make", [zoo_style, torch_style])
@pytest.mark.parametrize("memory", [float("inf"), 4.5e5, 3e5, 2e5, 1.2e5, 1e4])
def test_megatron_full_uniform(make, memory):
    g = make(8)
    p = problem(g, 4, memory)
    r = rb.megatron_full_uniform(p)
    assert_scored(r, p)
    assert [len(b) for b in blocks_of_stages(r, g)] == megatron_blocks(4, 8) == [2, 2, 2, 2]
    assert recomputed_blocks(r, g) == [[True, True]] * 4
    assert "--recompute-method uniform --recompute-num-layers 1" in r.info["megatron_args"]


@pytest.mark.parametrize("make", [zoo_style, torch_style])
@pytest.mark.parametrize("memory", [float("inf"), 4.5e5, 3e5, 2e5, 1.2e5, 1e4])
def test_megatron_block_takes_the_fewest_layers_that_fit(make, memory):
    g = make(12)
    p = problem(g, 4, memory)
    r = rb.megatron_block(p)
    assert_scored(r, p)
    counts = megatron_blocks(4, 12)
    fits = [evaluate(p.instance, rb.block_plan(p, counts, rb.megatron_block_rule(counts, n))).feasible
            for n in range(max(counts) + 1)]
    if any(fits):
        n = fits.index(True)
        assert r.info["recompute_num_layers"] == n and r.status == Status.FEASIBLE
        assert recomputed_blocks(r, g) == rb.megatron_block_rule(counts, n)
        assert (r.info["megatron_args"] == "") == (n == 0)
    else:
        assert r.info["recompute_num_layers"] is None and r.status == Status.INFEASIBLE and "note" in r.info
        assert recomputed_blocks(r, g) == rb.megatron_block_rule(counts, max(counts))


@pytest.mark.parametrize("make", [zoo_style, torch_style])
@pytest.mark.parametrize("memory", [float("inf"), 5e5, 4e5, 3.5e5, 3e5, 1.2e5, 1e4])
def test_torchtitan_every_k_takes_the_largest_spacing_that_fits(make, memory):
    g = make(10)
    p = problem(g, 3, memory)
    r = rb.torchtitan_every_k(p)
    assert_scored(r, p)
    counts = torchtitan_blocks(3, 10)
    assert [len(b) for b in blocks_of_stages(r, g)] == counts
    plain = evaluate(p.instance, rb.block_plan(p, counts, None)).feasible
    if plain:
        assert r.info["activation_checkpoint"] == {"mode": "none"} and not any(st.recompute for st in r.plan.stages)
        return
    ok = [k for k in range(1, max(counts) + 1)
          if evaluate(p.instance, rb.block_plan(p, counts, rb.torchtitan_layer_rule(counts, k))).feasible]
    if ok:
        k = max(ok)
        assert r.info["selective_ac_option"] == str(k) and r.status == Status.FEASIBLE
        assert r.info["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": str(k)}
        assert recomputed_blocks(r, g) == rb.torchtitan_layer_rule(counts, k)
    else:
        assert r.status == Status.INFEASIBLE and r.info["selective_ac_option"] is None
        assert recomputed_blocks(r, g) == rb.torchtitan_layer_rule(counts, 1)


@pytest.mark.parametrize("memory", [float("inf"), 4.5e5, 3e5, 1e4])
def test_no_recompute_is_the_exact_optimum_without_recomputation(memory):
    g = zoo_style(8)
    p = problem(g, 4, memory)
    r = rb.no_recompute(p)
    try:
        dp = solve_dp(p)
    except InfeasibleError:
        assert r.status == Status.INFEASIBLE and r.plan is None and "infeasible without recomputation" in r.info["note"]
        return
    assert_scored(r, p)
    assert r.status == Status.FEASIBLE and r.objective == dp.objective
    assert not any(st.recompute for st in r.plan.stages)


def test_recomputation_saves_memory_where_it_binds():
    """With memory that only recomputation meets: the exact no-recompute optimum is
    infeasible, Megatron's full recomputation fits."""
    g = zoo_style(8)
    p = problem(g, 4, 1.2e5)
    assert rb.no_recompute(p).status == Status.INFEASIBLE
    assert rb.megatron_full_uniform(p).status == Status.FEASIBLE


def test_registered_and_solvable_by_name():
    names = {m.name: m for m in METHODS}
    anygraph = {"no-recompute-more-stages", "adapipe"}
    for name in rb.RECOMPUTE_BASELINES:
        assert names[name].requires == ("" if name in anygraph else "transformer") and not names[name].exact
    inst = Instance(zoo_style(8), Cluster.homogeneous(4, memory=3e5, bandwidth=1e9))
    for name in rb.RECOMPUTE_BASELINES:
        r = solve(inst, stages=4, method=name)
        assert r.method == name and r.objective == evaluate(inst, r.plan).objective


def test_refusals():
    with pytest.raises(InvalidProblemError, match="divisible"):
        rb.megatron_full_uniform(problem(zoo_style(6), 4))
    cnn = zoo.instance("alexnet", "a100-40gb", 2)
    with pytest.raises(InvalidProblemError, match="transformer blocks"):
        rb.megatron_block(PartitionProblem(cnn, 2))


def test_shipped_llama_on_40gb_needs_recomputation():
    """On the shipped LLaMA-7B (microbatch 8, 8 A100 40GB) no split fits without recomputation;
    Megatron's full recomputation and its block method fit."""
    from pathlib import Path

    from pipeopt.io.native import read_instance

    inst = read_instance(Path(__file__).resolve().parents[3] / "instances" / "memory" / "llama-7b-mb8-a100-40gb-x8.json")
    p = PartitionProblem(inst, 8)
    assert rb.no_recompute(p).status == Status.INFEASIBLE
    full, block = rb.megatron_full_uniform(p), rb.megatron_block(p)
    assert full.status == block.status == Status.FEASIBLE
    assert block.objective <= full.objective
