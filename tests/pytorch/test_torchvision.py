"""``tv:name``: torchvision models by their builder name, random weights, no wrapper.

torchvision does not install beside the CPU torch 2.13 CI uses (PyPI's torchvision needs the
torch it was built for), so CI checks the refusal and a machine with a matching pair (torch
2.14.1 + torchvision 0.29.1) runs the rest."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("torch")

import pipeopt
from pipeopt.cli import main
from pipeopt.errors import InvalidProblemError, MissingExtraError
from pipeopt.torch import from_torch
from pipeopt.torch.models import load

HAVE_TV = importlib.util.find_spec("torchvision") is not None


@pytest.mark.skipif(HAVE_TV, reason="torchvision is installed here")
def test_without_torchvision_the_error_names_the_install(capsys):
    with pytest.raises(MissingExtraError, match=r"torchvision==0\.29\.1"):
        load("tv:resnet50")
    assert main(["profile", "tv:resnet50", "--costs", "estimated", "--device", "a100-40gb"]) == 2
    assert "torchvision" in capsys.readouterr().err


def test_unknown_shipped_name_lists_tv():
    with pytest.raises(InvalidProblemError, match="tv:name"):
        from pipeopt.cli import _check_model

        _check_model("resnet50")


@pytest.mark.skipif(not HAVE_TV, reason="needs torchvision (a matching torch/torchvision pair)")
def test_tv_models_load_profile_and_solve(tmp_path):
    with pytest.raises(InvalidProblemError, match="did you mean"):
        load("tv:resnet5")
    with pytest.raises(InvalidProblemError, match="image must be a positive integer"):
        load("tv:resnet50", image=0)
    module, inputs = load("tv:resnet50", image=64, batch=1)
    assert tuple(inputs[0].shape) == (1, 3, 64, 64)
    inst = from_torch(module, inputs, costs="estimated", device="a100-40gb")
    assert pipeopt.solve(inst, stages=2, time_limit=None).status.value == "optimal"
    out = tmp_path / "vit.json"
    assert main(["profile", "tv:vit_b_16", "--model-arg", "batch=1", "--costs", "estimated", "--device",
                 "a100-40gb", "--out", str(out)]) == 0
    assert out.exists()
