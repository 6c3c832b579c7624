"""Model zoo, device catalogue and shipped instances, checked from first principles and
against PipeDream's measured profiles."""

from __future__ import annotations

import math
from pathlib import Path

import networkx as nx
import pytest

from pipeopt import Cluster, Instance, PartitionProblem, zoo
from pipeopt.errors import InfeasibleError, InvalidClusterError, InvalidProblemError
from pipeopt.problems.partition.dp import solve_dp
from pipeopt.cost import CostTable
from pipeopt.graph import Chain, validate_graph
from pipeopt.io.native import read_instance
from pipeopt.io.pipedream import read_pipedream_graph
from pipeopt.zoo import models
from pipeopt.zoo.__main__ import SHIPPED, generate, main
from pipeopt.zoo.devices import DEVICES, KINDS, LINKS, REFERENCE_FLOPS

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = ROOT / "instances"
PROFILES = ROOT.parent / "shared" / "data" / "pipedream-profiles"


def _total(g: nx.DiGraph, key: str) -> float:
    return sum(d for _, d in g.nodes(data=key, default=0.0))


# ---- shipped instances ---------------------------------------------------------------------
def test_shipped_files_equal_what_the_zoo_generates(tmp_path):
    assert main([str(tmp_path)]) == 0
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.glob("**/*.json"))
    shipped = sorted(p.relative_to(INSTANCES) for p in INSTANCES.glob("**/*.json"))
    assert made == shipped, "instances/ differs from `python -m pipeopt.zoo`: regenerate it"
    for rel in made:
        assert (tmp_path / rel).read_bytes() == (INSTANCES / rel).read_bytes(), f"{rel} is stale"
    # deterministic: a second run writes the same bytes
    again = generate(tmp_path / "again")
    assert [p.read_bytes() for p in again] == [
        (tmp_path / p.relative_to(tmp_path / "again")).read_bytes() for p in again
    ]


def test_shipped_set_covers_the_brief():
    files = {p.stem: p for p in INSTANCES.glob("**/*.json")}
    for m in ("alexnet", "googlenet", "vgg16", "resnet50", "bert-large", "gpt2-xl"):
        for n in (4, 8, 16):
            assert f"{m}-a100-40gb-x{n}" in files
    hetero = [read_instance(p) for p in sorted((INSTANCES / "heterogeneous").glob("*.json"))]
    assert {i.graph.graph["name"] for i in hetero} == {"alexnet", "googlenet"}
    assert any(not i.cluster.is_homogeneous for i in hetero)
    assert all(len(i.cluster.kinds) >= 2 for i in hetero)
    for inst in hetero:  # every layer has a time on every kind of the cluster
        for _, fwd in inst.graph.nodes(data="fwd"):
            assert set(fwd) == set(inst.cluster.kinds)
    units = [len(read_instance(p).chain.units) for p in files.values()]
    assert max(units) <= 150


RECOMPUTE_ONLY = {"llama-7b-mb8-a100-40gb-x8", "gpt2-xl-mb16-a100-40gb-x8"}
"""Shipped memory instances on which no split fits without activation recomputation."""


@pytest.mark.parametrize("path", sorted((INSTANCES / "memory").glob("*.json")), ids=lambda p: p.stem)
def test_memory_instances_bind(path):
    """The memory limit changes the exact optimum (and the optimum fits), or - for the
    recomputation instances on 40 GB - no split fits without recomputation."""
    inst = read_instance(path)
    S = len(inst.cluster.devices)
    if path.stem in RECOMPUTE_ONLY:
        with pytest.raises(InfeasibleError, match="fit"):
            solve_dp(PartitionProblem(inst, S))
        # every layer recomputed on Megatron's even split fits
        from pipeopt.problems.partition.recompute_baselines import megatron_full_uniform

        assert megatron_full_uniform(PartitionProblem(inst, S)).evaluation.feasible
        return
    with_memory = solve_dp(PartitionProblem(inst, S))
    unlimited = inst.replace(
        cluster=zoo.cluster(
            {d.name.rsplit("-", 1)[0]: S for d in inst.cluster.devices[:1]},
            bandwidth=inst.cluster.bandwidth,
            memory=math.inf,
        )
    )
    free = solve_dp(PartitionProblem(unlimited, S))
    assert with_memory.evaluation.feasible
    assert with_memory.objective > free.objective * (1 + 1e-9)
    # the unconstrained optimum breaks the memory limit of the real cluster
    from pipeopt import evaluate

    assert not evaluate(inst, free.plan).feasible


# ---- architectures from first principles ---------------------------------------------------
PARAMS = {  # published parameter counts (distinct parameters)
    "alexnet": (60.9e6, 61.1e6),  # Krizhevsky et al. 2012: 60 M; two-tower network 60,965,224
    "googlenet": (6.6e6, 7.1e6),  # Szegedy et al. 2015 table 1: ~6.8 M without auxiliary heads
    "vgg16": (138.3e6, 138.4e6),  # Simonyan & Zisserman 2015 table 2: 138 M
    "resnet50": (25.5e6, 25.6e6),  # torchvision resnet50: 25,557,032
    "bert-large": (334e6, 341e6),  # Devlin et al. 2019: 340 M
    "gpt2-xl": (1.55e9, 1.56e9),  # Radford et al. 2019: 1542 M (table 2), 1.558 G counted
    "gpt3-6.7b": (6.6e9, 6.8e9),  # Brown et al. 2020 table 2.1: 6.7 B
    "llama-7b": (6.7e9, 6.75e9),  # Touvron et al. 2023 table 2: 6.7 B (6,738,415,616 released)
}
MACS = {  # multiply-accumulates per sample
    "alexnet": (0.70e9, 0.74e9),  # ~0.72 G (two-tower, 227x227)
    "googlenet": (1.5e9, 1.6e9),  # Szegedy et al. 2015: "1.5 billion multiply-adds"
    "vgg16": (15.3e9, 15.6e9),  # 15.5 G
    "resnet50": (4.0e9, 4.2e9),  # 4.1 G (v1.5; He et al. 2016 report 3.8 G for v1)
}


@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_parameter_counts(name):
    g = zoo.model(name, microbatch=1, precision="fp32")
    params = (_total(g, "param_bytes") - _total(g, "shared_param_bytes")) / 4
    lo, hi = PARAMS[name]
    assert lo <= params <= hi


@pytest.mark.parametrize("name", list(MACS))
def test_cnn_macs_and_flop_convention(name):
    g = zoo.model(name, microbatch=1)
    macs, flop = _total(g, "macs"), _total(g, "flop")
    lo, hi = MACS[name]
    assert lo <= macs <= hi
    # FLOP = 2 x MAC + elementwise work (a few percent at most)
    assert 2 * macs <= flop <= 2.1 * macs


def test_resnet50_forward_flop_is_about_8_gflop():
    """4.1 G multiply-adds per 224x224 image = 8.2 GFLOP with 2 FLOP per multiply-add."""
    g = zoo.model("resnet50", microbatch=1)
    assert 8.0e9 <= _total(g, "flop") <= 8.4e9


def test_transformer_layer_matches_closed_forms():
    """Per layer: MACs 12 s h^2 + 2 s^2 h (Narayanan et al. 2021: FLOP 24 b s h^2 + 4 b s^2 h);
    activation memory s b h (34 + 5 a s / h) bytes at 16 bits (Korthikanti et al. 2022)."""
    for name, (s, h, a, L) in {"bert-large": (512, 1024, 16, 24), "gpt2-xl": (1024, 1600, 25, 48)}.items():
        b = 2
        g = zoo.model(name, microbatch=b, precision="fp16")
        for i in (0, L - 1):
            att, mlp = g.nodes[f"layer{i}_attn"], g.nodes[f"layer{i}_mlp"]
            assert att["macs"] + mlp["macs"] == b * (12 * s * h * h + 2 * s * s * h)
            assert att["act_bytes"] + mlp["act_bytes"] == s * b * h * (34 + 5 * a * s / h)
            assert att["out_bytes"] == mlp["out_bytes"] == 2 * s * b * h
        assert sum(1 for n in g if n.endswith("_attn")) == L


def test_llama_layer_matches_closed_forms():
    """LLaMA-7B per layer: MACs 4 s h^2 + 2 s^2 h (attention) + 3 s h ffn (SwiGLU); activation
    bytes at 16 bits: attention 12 s b h + 2 a s^2 b, SwiGLU 4 s b h + 8 s b ffn (no dropout
    masks); untied output layer; 32 x (attention, MLP) between embedding and head."""
    s, h, a, L, ffn, vocab, b = 2048, 4096, 32, 32, 11008, 32000, 2
    g = zoo.model("llama-7b", microbatch=b)
    assert g.graph["seq_len"] == s
    assert list(g)[:2] == ["input", "embed"] and list(g)[-1] == "head"
    assert sum(1 for n in g if n.endswith("_attn")) == sum(1 for n in g if n.endswith("_mlp")) == L
    for i in (0, L - 1):
        att, mlp = g.nodes[f"layer{i}_attn"], g.nodes[f"layer{i}_mlp"]
        assert att["macs"] == b * (4 * s * h * h + 2 * s * s * h)
        assert mlp["macs"] == b * 3 * s * h * ffn
        assert att["act_bytes"] == s * b * (12 * h) + 2 * a * s * s * b
        assert mlp["act_bytes"] == s * b * (4 * h + 8 * ffn)
        assert att["out_bytes"] == mlp["out_bytes"] == 2 * s * b * h
        assert att["param_bytes"] == 2 * (4 * h * h + h) and mlp["param_bytes"] == 2 * (3 * h * ffn + h)
    assert g.nodes["head"]["param_bytes"] == 2 * (vocab * h + h)
    assert "shared_param_bytes" not in g.nodes["head"]
    assert g.nodes["embed"]["param_bytes"] == 2 * vocab * h


def test_cross_check_with_pipedream_profiles():
    """Output and parameter bytes of VGG16's 16 convolution and linear layers equal the ones
    PipeDream measured (fp32, minibatch 128); total parameters of VGG16 and ResNet50 equal
    the profiles'; AlexNet's differ by torchvision's single-tower variant only (0.2 %)."""
    prof = read_pipedream_graph(PROFILES / "vgg16.txt")
    ours = zoo.model("vgg16", microbatch=128, precision="fp32")

    def layers(g):
        return sorted(
            (d["out_bytes"], d["param_bytes"])
            for _, d in g.nodes(data=True)
            if d["op"].startswith(("Conv2d", "Linear"))
        )

    assert layers(prof) == layers(ours)
    for name, tol in (("vgg16", 0.0), ("resnet50", 0.0), ("alexnet", 0.003)):
        measured = _total(read_pipedream_graph(PROFILES / f"{name}.txt"), "param_bytes")
        assert _total(zoo.model(name, precision="fp32"), "param_bytes") == pytest.approx(
            measured, rel=tol, abs=0
        )


@pytest.mark.parametrize("name", list(zoo.MODELS))
@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_every_zoo_graph_validates(name, precision):
    g = zoo.model(name, precision=precision, kinds=("cpu", "gpu", "npu"))
    validate_graph(g)
    chain = Chain.from_graph(g)
    assert 20 <= chain.n <= 150
    assert [n for n, p in g.nodes(data="pin_first") if p] == ["input"]
    assert nx.is_weakly_connected(g)


def test_googlenet_is_a_dag_of_inception_branches():
    g = zoo.model("googlenet")
    assert max(d for _, d in g.out_degree()) == 4 and max(d for _, d in g.in_degree()) == 4
    table = CostTable(Instance(g, Cluster.homogeneous(2)), 2)
    # cutting inside an inception module sends several branch tensors
    x = g.nodes["inc3a_concat"]["out_bytes"]
    assert table.boundary_bytes.max() > x


def test_scaling_with_microbatch_precision_and_backward_rule():
    g1 = zoo.model("resnet50", microbatch=8, precision="fp16")
    g2 = zoo.model("resnet50", microbatch=16, precision="fp16")
    g3 = zoo.model("resnet50", microbatch=8, precision="fp32")
    for n in g1:
        a, b, c = g1.nodes[n], g2.nodes[n], g3.nodes[n]
        assert b["fwd"]["gpu"] == pytest.approx(2 * a["fwd"]["gpu"])
        assert b["out_bytes"] == 2 * a["out_bytes"] and b["act_bytes"] == 2 * a["act_bytes"]
        assert b["param_bytes"] == a["param_bytes"]
        assert c["param_bytes"] == 2 * a["param_bytes"]
        if n != "input":
            assert c["out_bytes"] == 2 * a["out_bytes"]
        # backward FLOP = 2 x forward; on a gpu the efficiencies are equal
        k = KINDS["gpu"]
        assert a["bwd"]["gpu"] == pytest.approx(
            a["fwd"]["gpu"] * 2 * k.forward_efficiency / k.backward_efficiency
        )


def test_layer_time_is_flop_over_effective_rate():
    inst = zoo.instance("alexnet", "jetson-agx-orin", 2, bandwidth="10gbe")
    dev = DEVICES["jetson-agx-orin"]
    conv1 = inst.graph.nodes["conv1"]
    for kind in ("cpu", "gpu", "npu"):
        units = inst.cluster.devices[0].resources[kind]
        assert units == dev.peak[kind]["fp16"]
        on_device_fwd = conv1["fwd"][kind] / units
        assert on_device_fwd == pytest.approx(conv1["flop"] / dev.rate(kind, "fp16", "fwd"))
        assert conv1["bwd"][kind] / units == pytest.approx(2 * conv1["flop"] / dev.rate(kind, "fp16", "bwd"))


def test_efficiency_override_scales_times():
    base = zoo.instance("alexnet", "apple-m2", 2, bandwidth="1gbe")
    slow = zoo.instance("alexnet", "apple-m2", 2, bandwidth="1gbe", efficiency={"npu": (0.2, 0.04)})
    for n in base.graph:
        a, b = base.graph.nodes[n], slow.graph.nodes[n]
        assert b["fwd"]["npu"] == pytest.approx(2 * a["fwd"]["npu"])
        assert b["bwd"]["npu"] == pytest.approx(2 * a["bwd"]["npu"])
        assert b["fwd"]["gpu"] == a["fwd"]["gpu"]
    assert "npu 0.2/0.04" in slow.assumptions[0]


# ---- device catalogue ----------------------------------------------------------------------
def test_catalogue_rates_positive_and_cited():
    assert REFERENCE_FLOPS == 1e12
    for d in DEVICES.values():
        assert d.source and d.memory > 0
        assert set(d.peak) <= set(KINDS)
        for kind, rates in d.peak.items():
            assert rates and all(r > 0 for r in rates.values())
            for prec in rates:
                assert d.rate(kind, prec, "fwd") > 0 and d.rate(kind, prec, "bwd") > 0
    assert all(link.bandwidth > 0 and link.source for link in LINKS.values())


def test_multi_resource_devices_have_different_fb_ratios():
    """Duan & Wu's split pays off only when kinds differ in forward/backward ratio."""
    socs = [d for d in DEVICES.values() if len(d.peak) >= 3]
    assert {"jetson-agx-orin", "apple-m2", "apple-m1", "snapdragon-x-elite"} <= {d.name for d in socs}
    assert any(len(d.peak) == 2 and "cpu" in d.peak and "gpu" in d.peak for d in DEVICES.values())
    g = zoo.model("alexnet", kinds=("cpu", "gpu", "npu"))
    for d in socs:
        ratios = {k: g.nodes["conv2"]["fwd"][k] / g.nodes["conv2"]["bwd"][k] for k in d.peak}
        assert len({round(r, 9) for r in ratios.values()}) == len(ratios), d.name
        assert ratios["npu"] < ratios["gpu"]  # an NPU is relatively worse at backward


def test_server_cluster_at_fp32_keeps_cpu_and_fp16_drops_nothing():
    cl = zoo.cluster({"server-a100-epyc": 1, "server-t4-xeon": 2}, bandwidth="ib-edr", precision="fp32")
    assert [d.name for d in cl.devices] == ["server-a100-epyc-0", "server-t4-xeon-0", "server-t4-xeon-1"]
    assert cl.kinds == ("cpu", "gpu") and cl.bandwidth == 12.5e9
    # an NPU has no fp32 rate: at fp32 the SoC offers only its CPU and GPU
    assert set(zoo.cluster("apple-m2", 1, precision="fp32").devices[0].resources) == {"cpu", "gpu"}


# ---- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: zoo.model("lenet"), InvalidProblemError, "unknown zoo model 'lenet'"),
        (lambda: zoo.model("vgg16", microbatch=0), InvalidProblemError, "microbatch"),
        (lambda: zoo.model("vgg16", seq_len=128), InvalidProblemError, "takes no seq_len"),
        (lambda: zoo.model("bert-large", seq_len=1024), InvalidProblemError, "exceeds"),
        (lambda: zoo.model("vgg16", precision="int8"), InvalidProblemError, "precision"),
        (lambda: zoo.model("vgg16", kinds=("tpu",)), InvalidProblemError, "kind 'tpu'"),
        (lambda: zoo.model("vgg16", efficiency={"gpu": (0.5, 1.5)}), InvalidProblemError, "efficiency"),
        (lambda: zoo.cluster("a200", 4), InvalidClusterError, "unknown device 'a200'"),
        (lambda: zoo.cluster("a100-40gb", 0), InvalidClusterError, "positive integer"),
        (
            lambda: zoo.cluster("a100-40gb", 2, bandwidth="carrier-pigeon"),
            InvalidClusterError,
            "unknown link",
        ),
        (lambda: zoo.cluster("a100-40gb", 2, bandwidth=-1.0), InvalidClusterError, "bandwidth"),
        (lambda: zoo.cluster("a100-40gb"), InvalidClusterError, "number of devices"),
    ],
)
def test_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_models_module_layer_lists_start_with_the_input():
    for build in (models.alexnet, models.vgg16, models.googlenet, models.resnet50):
        specs = build()
        assert specs[0].is_input and all(not s.is_input for s in specs[1:])
    assert len(SHIPPED) == len(list(INSTANCES.glob("**/*.json")))
