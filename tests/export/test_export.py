"""Every exporter round-trips through a reader written from its runtime's code (torchtitan's
keep/drop logic, Megatron's layout parser and checks, DeepSpeed's slicing, the split-point
semantics of torch.distributed.pipelining), and refuses, naming the problem, what its runtime
cannot express. Pure Python: no torch (tests/export/test_torch_pipelining.py runs torch's own
``pipeline``)."""

from __future__ import annotations

import json

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeopt.cli import main
from pipeopt.errors import InvalidProblemError, UnsupportedPlanError
from pipeopt.export import FORMATS, ModelLayout, export
from pipeopt.export import deepspeed, megatron, torch_pipelining, torchtitan
from pipeopt.plan import Plan, Stage

FORMAT_NAMES = sorted(set(FORMATS) - {"torch-csv"})
"""The split formats (torch-csv writes an action order: tests/export/test_torch_csv.py)."""


def gpt_names(layers: int) -> list[str]:
    return ["tok_emb", "pos_emb", *[f"layers.{i}" for i in range(layers)], "norm", "head"]


def gpt_graph(layers: int = 4, container_type: str | None = None, leaves: bool = False) -> nx.DiGraph:
    """A from_torch-shaped GPT graph: nodes in execution order, ``op`` classes, torch metadata."""
    g = nx.DiGraph()
    ops = {"tok_emb": "Embedding", "pos_emb": "Embedding", "norm": "LayerNorm", "head": "Linear"}
    names = gpt_names(layers)
    if leaves:
        names = ["tok_emb", "pos_emb", *[f"layers.{i}.{p}" for i in range(layers) for p in ("attn", "mlp")],
                 "norm", "head"]
    for n in names:
        g.add_node(n, fwd={"cpu": 1e-3}, bwd={"cpu": 2e-3}, out_bytes=1e3, act_bytes=1e3, param_bytes=1e3,
                   op=ops.get(n, "Block"))
    g.add_edge("tok_emb", names[2])
    for u, v in zip(names[1:], names[2:]):
        g.add_edge(u, v)
    meta = {"model": "GPT", "granularity": "leaves" if leaves else "container:layers",
            "container": None if leaves else "layers"}
    if container_type:
        meta["container_type"] = container_type
    g.graph["torch"] = meta
    return g


def cnn_graph(blocks: int = 4) -> nx.DiGraph:
    g = nx.DiGraph()
    names = ["stem", *[f"layers.{i}" for i in range(blocks)], "pool", "head"]
    for n in names:
        g.add_node(n, fwd={"cpu": 1e-3}, bwd={"cpu": 2e-3}, out_bytes=1e3, act_bytes=1e3, param_bytes=1e3,
                   op={"stem": "Sequential", "pool": "AdaptiveAvgPool2d", "head": "Linear"}.get(n, "ResidualBlock"))
    nx.add_path(g, names)
    g.graph["torch"] = {"model": "CNN", "granularity": "container:layers", "container": "layers",
                        "container_type": "Sequential"}
    return g


def plan_of(stages, replicas: int = 1) -> Plan:
    return Plan(tuple(Stage(tuple(s), replicas=replicas) for s in stages))


def cuts_to_stages(names: list, cuts: list) -> list:
    bounds = [0, *cuts, len(names)]
    return [names[a:b] for a, b in zip(bounds, bounds[1:])]


@st.composite
def gpt_plans(draw):
    """A GPT of 1..10 blocks and a contiguous split whose embeddings share a stage and whose
    norm and head share one (what every format can express)."""
    layers = draw(st.integers(1, 10))
    names = gpt_names(layers)
    # cut positions: after pos_emb (index 2) .. before norm (index len - 2)
    positions = list(range(2, len(names) - 1))
    cuts = sorted(draw(st.sets(st.sampled_from(positions), max_size=min(7, len(positions)))))
    return layers, cuts_to_stages(names, cuts)


def read_back(fmt: str, out: dict, layers: int) -> list[list[str]]:
    """The stages the runtime builds from the export, by a reader written from its code."""
    names = gpt_names(layers)
    if fmt == "torch":
        return torch_pipelining.stages_from_split_spec(out["split_spec"], names)
    if fmt == "torchtitan":
        children = {"tok_emb": None, "pos_emb": None, "layers": [str(i) for i in range(layers)],
                    "norm": None, "head": None}
        return torchtitan.stage_modules(out["module_fqns_per_model_part"], children)
    if fmt == "megatron":
        return megatron.stages_from_layout(out["pipeline_model_parallel_layout"], ["tok_emb", "pos_emb"],
                                           [f"layers.{i}" for i in range(layers)], ["norm", "head"])
    return deepspeed.stages_from_parts(out["parts"], out["layers"])


# ---- round trips -------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@settings(max_examples=40, deadline=None)
@given(case=gpt_plans(), with_graph=st.booleans())
def test_every_export_reads_back_as_the_plan(fmt, case, with_graph):
    layers, stages = case
    plan = plan_of(stages)
    out = export(plan, fmt, graph=gpt_graph(layers) if with_graph else None)
    assert json.loads(json.dumps(out)) == out  # JSON-ready
    assert out["num_stages"] == len(stages) and out["data_parallel"] == 1
    assert out["target"] and out["format"] == fmt
    assert read_back(fmt, out, layers) == stages


def test_megatron_layout_by_hand():
    stages = [["tok_emb", "pos_emb"], ["layers.0", "layers.1", "layers.2"], ["layers.3", "norm", "head"]]
    out = export(plan_of(stages), "megatron", graph=gpt_graph(4))
    assert out["pipeline_model_parallel_layout"] == "E|t*3|t,L"  # a standalone embedding stage
    assert megatron.parse_str_to_list("E|t*3|t,L") == [["E"], ["t", "t", "t"], ["t", "L"]]
    assert "--pipeline-model-parallel-layout 'E|t*3|t,L'" in out["args"] and "--num-layers 4" in out["args"]
    # Megatron's own examples parse as its docstring says
    assert megatron.parse_str_to_list("Et*3|(tt|)*2,m|L") == [
        ["E", "t", "t", "t"], ["t", "t"], ["t", "t"], ["m"], ["L"]]


def test_megatron_parser_refuses_what_megatron_asserts():
    with pytest.raises(UnsupportedPlanError, match="first layer must be embedding"):
        megatron.parse_layout("t|E,t,L", 2, 2)
    with pytest.raises(UnsupportedPlanError, match="must match num_layers"):
        megatron.parse_layout("E,t|t,L", 2, 3)
    with pytest.raises(UnsupportedPlanError, match="divisible"):
        megatron.parse_layout("E,t|t|t,L", 2, 3)
    with pytest.raises(UnsupportedPlanError, match="Invalid layer character"):
        megatron.parse_str_to_list("E,x|L")


def test_torch_split_spec_and_stages_by_hand():
    stages = [["tok_emb", "pos_emb", "layers.0"], ["layers.1", "layers.2"], ["layers.3", "norm", "head"]]
    out = export(plan_of(stages), "torch", graph=gpt_graph(4))
    assert out["split_spec"] == {"layers.1": "SplitPoint.BEGINNING", "layers.3": "SplitPoint.BEGINNING"}
    assert out["stages"] == stages


def test_torch_export_splits_inside_blocks_at_leaf_granularity():
    g = gpt_graph(2, leaves=True)
    names = list(g.nodes)
    stages = cuts_to_stages(names, [3])  # a cut between layers.0.attn and layers.0.mlp
    out = export(plan_of(stages), "torch", graph=g)
    assert out["split_spec"] == {"layers.0.mlp": "SplitPoint.BEGINNING"}
    assert torch_pipelining.stages_from_split_spec(out["split_spec"], names) == stages


def test_deepspeed_parts_and_subclass():
    stages = [["tok_emb", "pos_emb", "layers.0"], ["layers.1", "layers.2", "layers.3", "norm", "head"]]
    out = export(plan_of(stages), "deepspeed", graph=gpt_graph(4))
    assert out["parts"] == [0, 3, 8]
    assert out["carried"] == [["tok_emb", "layers.0"]]  # tok_emb's output skips pos_emb
    assert "PARTS = [0, 3, 8]" in out["python"] and "_partition_layers" in out["python"]
    compile(out["python"], "deepspeed-subclass", "exec")
    uniform = export(plan_of(cuts_to_stages(gpt_names(4), [4])), "deepspeed", graph=gpt_graph(4))
    assert any("partition_method='uniform'" in n for n in uniform["notes"])


def test_torchtitan_toml_is_the_plan():
    import tomllib

    stages = [["tok_emb", "pos_emb", "layers.0", "layers.1"], ["layers.2", "layers.3", "norm", "head"]]
    out = export(plan_of(stages), "torchtitan", graph=gpt_graph(4, container_type="ModuleList"))
    cfg = tomllib.loads(out["toml"])["parallelism"]
    assert cfg["module_fqns_per_model_part"] == stages and cfg["pipeline_parallel_degree"] == 2


def test_uniform_replication_is_a_data_parallel_degree():
    stages = cuts_to_stages(gpt_names(4), [4])
    for fmt in FORMAT_NAMES:
        assert export(plan_of(stages, replicas=2), fmt, graph=gpt_graph(4))["data_parallel"] == 2


# ---- rejections --------------------------------------------------------------------------------

def _rejects(fmt, plan, graph, match):
    with pytest.raises(UnsupportedPlanError, match=match):
        export(plan, fmt, graph=graph)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_rules_every_runtime_shares(fmt):
    g = gpt_graph(4)
    names = gpt_names(4)
    good = cuts_to_stages(names, [4])
    noncontiguous = [["tok_emb", "pos_emb", "layers.0", "layers.2"], ["layers.1", "layers.3", "norm", "head"]]
    _rejects(fmt, plan_of(noncontiguous), g, "not a contiguous run")
    _rejects(fmt, Plan((Stage(tuple(good[0]), replicas=2), Stage(tuple(good[1])))), g, "different replica counts")
    _rejects(fmt, Plan((Stage(tuple(good[0]), bwd_layers=tuple(good[0][:-1])),
                        Stage(tuple(good[1]), bwd_layers=(good[0][-1], *good[1])))), g, "Bi-Partition")
    _rejects(fmt, Plan(tuple(Stage(tuple(s), beta={"cpu": 0.5}) for s in good)), g, "split execution")
    _rejects(fmt, plan_of([good[0], good[1][:-1]]), g, "in no stage")
    _rejects(fmt, plan_of([good[0] + ["extra"], good[1]]), g, "not a layer of the model")
    _rejects(fmt, plan_of([good[0], good[1] + ["layers.0"]]), None, "stage 0 and stage 1")
    _rejects(fmt, plan_of([good[1], good[0]]), g, "not a contiguous run")
    _rejects(fmt, plan_of([["layers.0", "layers.0.mlp"], ["head"]]), None, "one of its own submodules")
    _rejects(fmt, plan_of([["input 0", "layers.0"], ["head"]]), None, "not a module FQN")


def test_torchtitan_refuses_cuts_it_cannot_make():
    g = gpt_graph(2, leaves=True)
    stages = cuts_to_stages(list(g.nodes), [3])
    _rejects("torchtitan", plan_of(stages), g, "inside 'layers.0'.*pipeline_module_split")
    cnn = cnn_graph(4)
    _rejects("torchtitan", plan_of(cuts_to_stages(list(cnn.nodes), [3])), cnn, "nn.Sequential")
    # a CNN split between whole top-level modules is fine: layers (a Sequential) stays whole
    ok = export(plan_of(cuts_to_stages(list(cnn.nodes), [5])), "torchtitan", graph=cnn)
    assert ok["module_fqns_per_model_part"][1] == ["pool", "head"]


def test_megatron_refuses_what_its_layout_cannot_say():
    g = gpt_graph(4)
    names = gpt_names(4)
    _rejects("megatron", plan_of(cuts_to_stages(names, [1])), g, r"embedding \(E\) modules .* split")
    _rejects("megatron", plan_of(cuts_to_stages(names, [7])), g, "final norm and output layer")
    cnn = cnn_graph(4)
    _rejects("megatron", plan_of(cuts_to_stages(list(cnn.nodes), [3])), cnn, "no nn.Embedding")
    leaves = gpt_graph(2, leaves=True)
    # a leaf profile records no container: it is guessed from the names, and leaf names are refused
    for graph in (leaves, None):
        _rejects("megatron", plan_of(cuts_to_stages(list(leaves.nodes), [4])), graph, "inside 'layers.0'")


def test_deepspeed_refuses_a_cut_inside_a_block():
    g = gpt_graph(2, leaves=True)
    g.graph["torch"]["container"] = "layers"
    _rejects("deepspeed", plan_of(cuts_to_stages(list(g.nodes), [3])), g, "inside the block 'layers.0'")


def test_unknown_format():
    with pytest.raises(InvalidProblemError, match="unknown export format"):
        export(plan_of([["a"]]), "pippy")


def test_layout_uses_the_graph_order_and_guesses_the_container():
    g = gpt_graph(3)
    lay = ModelLayout.of(plan_of([list(g.nodes)]), g)
    assert lay.order == tuple(g.nodes) and lay.container == "layers"
    plan = plan_of([["pos_emb", "tok_emb", "layers.0"], ["layers.1", "layers.2", "norm", "head"]])
    alone = ModelLayout.of(plan)
    assert alone.container == "layers" and alone.order[0] == "pos_emb" and "no instance" in alone.source


# ---- the command line --------------------------------------------------------------------------

def test_cli_export_writes_each_format(tmp_path, capsys):
    from pipeopt.cluster import Cluster
    from pipeopt.instance import Instance
    from pipeopt.io import write

    inst_path = tmp_path / "gpt.json"
    write(Instance(gpt_graph(4), Cluster.homogeneous(2, kind="cpu", bandwidth=1e9)), inst_path)
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan_of(cuts_to_stages(gpt_names(4), [4])).to_dict()))
    for fmt in FORMAT_NAMES:
        out = tmp_path / f"{fmt}.json"
        assert main(["export", str(plan_path), "--to", fmt, "--instance", str(inst_path), "--out", str(out)]) == 0
        assert json.loads(out.read_text())["format"] == fmt
    capsys.readouterr()
    assert main(["export", str(plan_path), "--to", "megatron"]) == 0  # no instance: the plan's own order
    assert json.loads(capsys.readouterr().out)["pipeline_model_parallel_layout"] == "E,t*2|t*2,L"
    result_path = tmp_path / "result.json"  # a solve --json result holds the plan under "plan"
    result_path.write_text(json.dumps({"method": "dp", "plan": json.loads(plan_path.read_text())}))
    assert main(["export", str(result_path), "--to", "deepspeed"]) == 0
    assert json.loads(capsys.readouterr().out)["parts"] == [0, 4, 8]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(plan_of(cuts_to_stages(gpt_names(4), [1])).to_dict()))
    assert main(["export", str(bad), "--to", "megatron", "--instance", str(inst_path)]) == 2
    assert "embedding (E) modules" in capsys.readouterr().err


def test_export_needs_no_torch_and_run_names_the_install(tmp_path):
    """Producing a format is pure Python; ``pipeopt run`` without torch says how to install it."""
    import subprocess
    import sys
    import textwrap

    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan_of(cuts_to_stages(gpt_names(2), [3])).to_dict()))
    code = textwrap.dedent(f"""
        import sys
        sys.modules['torch'] = None
        from pipeopt.cli import main
        print('export', main(['export', {str(plan_path)!r}, '--to', 'torch']))
        print('run', main(['run', {str(plan_path)!r}, '--model', 'gpt-tiny']))
        assert sys.modules['torch'] is None
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "export 0" in proc.stdout and '"layers.1": "SplitPoint.BEGINNING"' in proc.stdout
    assert "run 2" in proc.stdout and "pip install torch==2.13.0" in proc.stderr
