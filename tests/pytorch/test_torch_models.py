"""The shipped PyTorch models and ``pipeopt profile`` (issue 9.1)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch.fx")

import torch

from pipeopt.cli import main
from pipeopt.errors import InvalidProblemError
from pipeopt.io.native import read_instance
from pipeopt.torch.models import CNN, GPT, MODELS, build, load
from pipeopt.torch.network import measure_bandwidth


# ---- models ------------------------------------------------------------------------------------
def test_registry_and_shapes():
    assert {"gpt", "cnn", "gpt-tiny", "cnn-tiny"} <= set(MODELS)
    module, (idx,) = MODELS["gpt-tiny"]()
    assert isinstance(module, GPT) and module.training
    assert idx.dtype == torch.int64 and idx.shape == (2, 16)
    assert module(idx).shape == (2, 16, 256)
    assert isinstance(module.layers, torch.nn.ModuleList) and len(module.layers) == 4
    cnn, (x,) = MODELS["cnn-tiny"]()
    assert isinstance(cnn, CNN) and isinstance(cnn.layers, torch.nn.Sequential)
    assert cnn(x).shape == (2, 10)
    big, (idx,) = MODELS["gpt"]()
    assert [n for n, _ in big.named_children()] == ["tok_emb", "pos_emb", "layers", "norm", "head"]
    assert len(big.layers) == 8 and idx.shape == (2, 64)


def test_factories_are_seeded():
    a, (xa,) = build("cnn-tiny")
    b, (xb,) = build("cnn-tiny")
    assert torch.equal(xa, xb)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    c, _ = build("cnn-tiny", seed=1)
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True))


def test_sizes_are_overridable_and_checked():
    module, (idx,) = build("gpt", layers=2, d_model=64, heads=2, vocab=100, seq=8, batch=1)
    assert len(module.layers) == 2 and idx.shape == (1, 8)
    with pytest.raises(InvalidProblemError, match="multiple of heads"):
        build("gpt", d_model=30, heads=4)
    with pytest.raises(InvalidProblemError, match="layers must be a positive integer"):
        build("gpt", layers=0)
    with pytest.raises(InvalidProblemError, match="unknown shipped model 'bert'"):
        build("bert")
    with pytest.raises(InvalidProblemError, match="unexpected keyword"):
        build("cnn", depth=3)
    with pytest.raises(InvalidProblemError, match="smaller than the network's stride"):
        build("cnn", image=2, blocks=(1, 1, 1))


def test_load_by_import_path():
    module, inputs = load("pipeopt.torch.models:cnn", width=4, blocks=(1,), image=4, batch=1)
    assert isinstance(module, CNN) and inputs[0].shape == (1, 3, 4, 4)
    with pytest.raises(InvalidProblemError, match="cannot import 'no_such_pkg'"):
        load("no_such_pkg:f")
    with pytest.raises(InvalidProblemError, match="has no factory 'nope'"):
        load("pipeopt.torch.models:nope")
    with pytest.raises(InvalidProblemError, match=r"must return \(nn.Module, example_inputs\)"):
        load("os:getcwd")  # returns a string


# ---- the command -------------------------------------------------------------------------------
def test_profile_command_writes_an_instance(tmp_path, capsys):
    out = tmp_path / "cnn.json"
    code = main(["profile", "cnn-tiny", "--costs", "estimated", "--device", "v100-32gb", "--devices", "3",
                 "--model-arg", "blocks=(1, 1, 1)", "--model-arg", "image=8", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "assumed:" in text and f"wrote {out}" in text
    inst = read_instance(out)
    assert list(inst.graph) == ["stem", "layers.0", "layers.1", "layers.2", "pool", "head"]
    assert inst.graph.graph["torch"]["costs"] == "estimated:v100-32gb"
    assert len(inst.cluster.devices) == 3
    assert json.loads(out.read_text())["format"] == "pipeopt-instance"


def test_profile_command_measured_then_solve(tmp_path, capsys):
    out = tmp_path / "gpt.json"
    assert main(["profile", "gpt-tiny", "--repeats", "2", "--warmup", "1", "--granularity", "children",
                 "--out", str(out)]) == 0
    inst = read_instance(out)
    assert list(inst.graph) == ["tok_emb", "pos_emb", "layers", "norm", "head"]
    assert inst.graph.graph["torch"]["costs"] == "measured"
    capsys.readouterr()
    assert main(["solve", str(out), "--stages", "2"]) == 0
    assert "optimal" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["profile", "gpt-tiny", "--granularity", "container:blocks"], "container 'blocks' not found"),
        (["profile", "gpt-tiny", "--model-arg", "layers"], "KEY=VALUE"),
        (["profile", "gpt-tiny", "--costs", "estimated"], "catalogue device"),
        (["profile", "nosuchmodel"], "unknown shipped model 'nosuchmodel'"),
    ],
)
def test_profile_command_bad_input(argv, words, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path / "x.json")]) == 2
    assert words in capsys.readouterr().err


def test_measure_bandwidth_checks_its_arguments():
    with pytest.raises(InvalidProblemError, match="nbytes"):
        measure_bandwidth(0)
    with pytest.raises(InvalidProblemError, match="repeats"):
        measure_bandwidth(1024, repeats=0)


@pytest.mark.slow
def test_measure_bandwidth_between_two_processes():
    """Two spawned gloo processes exchange 64 KiB: a positive, finite rate (no value asserted)."""
    bw = measure_bandwidth(1 << 16, repeats=3, warmup=1)
    assert 0 < bw < float("inf")
