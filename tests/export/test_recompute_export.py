"""A plan's recompute set out to Megatron-LM's flags (or Primus's recompute_layer_ids) and to
torchtitan's [activation_checkpoint] settings, refused with the reason where a runtime cannot
express it; the recomputation baselines' plans export to the settings they were built from."""

from __future__ import annotations

import tomllib

import networkx as nx
import pytest

from pipeopt import PartitionProblem
from pipeopt.cluster import Cluster
from pipeopt.errors import UnsupportedPlanError
from pipeopt.export import export
from pipeopt.instance import Instance
from pipeopt.plan import Plan, Stage
from pipeopt.problems.partition import recompute_baselines as rb


def gpt_graph(layers: int = 8) -> nx.DiGraph:
    """tok_emb, pos_emb, layers.0..L-1, norm, head (from_torch-shaped, container 'layers')."""
    g = nx.DiGraph()
    names = ["tok_emb", "pos_emb", *[f"layers.{i}" for i in range(layers)], "norm", "head"]
    for n in names:
        t = 1e-3 if n.startswith("layers.") else 2e-4
        g.add_node(n, fwd={"gpu": t}, bwd={"gpu": 2 * t}, out_bytes=1e3,
                   act_bytes=5e4 if n.startswith("layers.") else 1e3, param_bytes=1e4,
                   op="Embedding" if n.endswith("_emb") else "Block" if n.startswith("layers.") else "Linear")
    g.add_edge("tok_emb", "layers.0")
    nx.add_path(g, names[1:])
    g.graph["torch"] = {"model": "GPT", "granularity": "container:layers", "container": "layers",
                        "container_type": "ModuleList"}
    return g


def plan_of(counts: list[int], recompute: list[list[str | None]] | None = None, devices=None) -> Plan:
    """Stages of ``counts`` blocks (embeddings first, norm + head last), block j of stage s
    recomputed with mode ``recompute[s][j]``."""
    stages, k = [], 0
    S = len(counts)
    for s, c in enumerate(counts):
        blocks = [f"layers.{i}" for i in range(k, k + c)]
        names = (["tok_emb", "pos_emb"] if s == 0 else []) + blocks + (["norm", "head"] if s == S - 1 else [])
        rc = {b: m for b, m in zip(blocks, recompute[s]) if m} if recompute else None
        stages.append(Stage(tuple(names), devices=(devices[s],) if devices else (), recompute=rc or None))
        k += c
    return Plan(tuple(stages))


F = "full"


def both(plan, graph, **kw):
    return export(plan, "megatron", graph=graph, **kw), export(plan, "torchtitan", graph=graph, **kw)


def ac_table(out) -> dict:
    return tomllib.loads(out["toml"])["activation_checkpoint"]


def test_nothing_recomputed():
    g = gpt_graph(8)
    mg, tt = both(plan_of([4, 4]), g)
    assert mg["recompute"]["method"] == "none" and "--recompute" not in mg["args"]
    assert tt["activation_checkpoint"] == {"mode": "none"} and ac_table(tt) == {"mode": "none"}
    assert any("default" in n for n in tt["notes"])  # torchtitan v0.2.2 defaults to selective "2"


def test_every_block_full():
    g = gpt_graph(8)
    mg, tt = both(plan_of([3, 5], [[F] * 3, [F] * 5]), g)
    assert mg["recompute"]["method"] == "uniform"
    assert mg["args"].endswith("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1")
    assert mg["recompute"]["recompute_layer_ids"] == list(range(8))
    assert ac_table(tt) == {"mode": "full"}


@pytest.mark.parametrize("counts,n", [([4, 4], 1), ([4, 4], 3), ([2, 3, 3], 2), ([2, 3, 3], 3), ([1, 4, 3], 2)])
def test_first_n_of_every_stage_is_megatron_block(counts, n):
    g = gpt_graph(sum(counts))
    flags = rb.megatron_block_rule(counts, n)
    plan = plan_of(counts, [[F if f else None for f in st] for st in flags])
    mg = export(plan, "megatron", graph=g)
    if all(all(st) for st in flags):
        assert mg["recompute"]["method"] == "uniform"
        return
    assert mg["recompute"]["method"] == "block" and mg["recompute"]["recompute_num_layers"] == n
    assert f"--recompute-granularity full --recompute-method block --recompute-num-layers {n}" in mg["args"]
    assert mg["recompute"]["primus_args"] is None


@pytest.mark.parametrize("counts,k", [([4, 4], 2), ([6, 6], 3), ([5, 3], 2), ([3, 4, 5], 4)])
def test_every_kth_block_of_each_rank_is_torchtitan_selective_k(counts, k):
    g = gpt_graph(sum(counts))
    flags = rb.torchtitan_layer_rule(counts, k)
    plan = plan_of(counts, [[F if f else None for f in st] for st in flags])
    tt = export(plan, "torchtitan", graph=g)
    assert ac_table(tt) == {"mode": "selective", "selective_ac_option": str(k)}
    assert any("v0.2.2" in n for n in tt["notes"])
    # Megatron has no such flag: Primus's global layer ids, args without recomputation
    mg = export(plan, "megatron", graph=g)
    ids = [i for i, f in enumerate(f for st in flags for f in st) if f]
    if mg["recompute"]["method"] == "block":  # a stage pattern that happens to be 'first N'
        return
    assert mg["recompute"]["method"] == "layer_ids" and mg["recompute"]["recompute_layer_ids"] == ids
    assert "--recompute" not in mg["args"]
    assert mg["recompute"]["primus_args"] == f"--recompute_granularity full --recompute_layer_ids {','.join(map(str, ids))}"
    assert any("Primus" in n for n in mg["notes"])


def test_every_k_counts_over_a_ranks_stages_in_order():
    """Interleaved (2 stages per rank, looped): rank 0 wraps stages 0 and 2, its counter runs on
    from stage 0 into stage 2 (torchtitan's counter is per process)."""
    g = gpt_graph(8)
    # rank 0: stage 0 (blocks 0,1) + stage 2 (blocks 4,5); rank 1: stage 1 (2,3) + stage 3 (6,7)
    # k = 3 over a rank's 4 blocks: its 3rd block, i.e. the first block of its second stage
    rc = [[None, None], [None, None], [F, None], [F, None]]
    plan = plan_of([2, 2, 2, 2], rc, devices=["d0", "d1", "d0", "d1"])
    tt = export(plan, "torchtitan", graph=g, schedule="Interleaved1F1B")
    assert tt["pipeline_parallel_degree"] == 2
    assert ac_table(tt) == {"mode": "selective", "selective_ac_option": "3"}
    # the same set on one stage per rank is no every-k pattern
    with pytest.raises(UnsupportedPlanError, match="every k-th block"):
        export(plan_of([2, 2, 2, 2], rc), "torchtitan", graph=g)


def test_other_sets_megatron_via_primus_torchtitan_refuses():
    g = gpt_graph(8)
    rc = [[None, F, None, None], [F, None, F, None]]
    plan = plan_of([4, 4], rc)
    mg = export(plan, "megatron", graph=g)
    assert mg["recompute"]["method"] == "layer_ids" and mg["recompute"]["recompute_layer_ids"] == [1, 4, 6]
    assert "--recompute" not in mg["args"]
    with pytest.raises(UnsupportedPlanError, match="not a per-layer list"):
        export(plan, "torchtitan", graph=g)


def test_selective():
    g = gpt_graph(4)
    plan = plan_of([2, 2], [["selective"] * 2] * 2)
    tt = export(plan, "torchtitan", graph=g)
    assert ac_table(tt) == {"mode": "selective", "selective_ac_option": "op"}
    with pytest.raises(UnsupportedPlanError, match="selective"):
        export(plan, "megatron", graph=g)
    with pytest.raises(UnsupportedPlanError, match="one mode for every block"):
        export(plan_of([2, 2], [["selective", F], ["selective"] * 2]), "torchtitan", graph=g)
    with pytest.raises(UnsupportedPlanError, match="one mode for every block"):
        export(plan_of([2, 2], [["selective", None], ["selective"] * 2]), "torchtitan", graph=g)


def test_recomputing_a_module_that_is_not_a_block_is_refused():
    g = gpt_graph(4)
    base = plan_of([2, 2])
    plan = Plan((Stage(base.stages[0].layers, recompute={"tok_emb": "full"}), base.stages[1]))
    for to in ("megatron", "torchtitan"):
        with pytest.raises(UnsupportedPlanError, match="'tok_emb', which is not a transformer block"):
            export(plan, to, graph=g)


def test_the_baselines_export_to_their_own_settings():
    """Each baseline's plan, exported, gives back the framework setting it was built with."""
    g = gpt_graph(12)
    for memory in (2.6e5, 4e5, 6e5, 8e5):  # block N = 3, 2, 1, 0; every-k k = 1, 1, 3, none
        inst = Instance(g, Cluster.homogeneous(4, memory=memory, bandwidth=1e9))
        p = PartitionProblem(inst, 4)
        full = rb.megatron_full_uniform(p)
        assert export(full.plan, "megatron", graph=g)["recompute"]["args"] == full.info["megatron_args"]
        block = rb.megatron_block(p)
        if block.info["recompute_num_layers"] not in (None, max(block.info["blocks_per_stage"])):
            assert export(block.plan, "megatron", graph=g)["recompute"]["args"] == block.info["megatron_args"]
        titan = rb.torchtitan_every_k(p)
        if titan.info["selective_ac_option"] not in (None, "1"):
            assert ac_table(export(titan.plan, "torchtitan", graph=g)) == titan.info["activation_checkpoint"]
        elif titan.info["activation_checkpoint"] == {"mode": "none"}:
            assert ac_table(export(titan.plan, "torchtitan", graph=g)) == {"mode": "none"}
