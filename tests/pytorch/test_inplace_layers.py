"""A layer that starts in place (torchvision's ``ReLU(inplace=True)`` right after a cut, as in
ResNet's stem) goes through ``from_torch``: each layer alone gets a copy of a fresh leaf, so
the in-place op changes the copy and the leaf still gets the input gradient."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn

import pipeopt
from pipeopt.torch import from_torch


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU(inplace=True), nn.Linear(16, 16), nn.ReLU(inplace=True),
                         nn.Linear(16, 4))


@pytest.mark.parametrize("costs", [{"costs": "estimated", "device": "a100-40gb"},
                                   {"costs": "measured", "repeats": 2, "warmup": 0}])
def test_in_place_layer_after_a_cut(costs):
    inst = from_torch(_net(), (torch.randn(4, 16),), granularity="children", **costs)
    g = inst.graph
    assert list(g.nodes) == ["0", "1", "2", "3", "4"]
    relu = g.nodes["1"]
    assert relu["out_bytes"] == 4 * 16 * 4  # the in-place ReLU's output: one (4, 16) float32 tensor
    assert pipeopt.solve(inst, stages=2, time_limit=None).status.value == "optimal"


def test_the_input_gradient_reaches_the_leaf():
    from pipeopt.torch.probe import _grad_inputs, _prepare

    x = _prepare((torch.randn(3, 5),), ["previous layer"])
    (leaf,) = _grad_inputs(x)
    assert leaf.is_leaf and leaf.requires_grad and x[0] is not leaf
    y = nn.ReLU(inplace=True)(x[0])  # in place on the copy, not on the leaf
    assert leaf.grad is None
    y.sum().backward()
    assert torch.equal(leaf.grad, (leaf > 0).float())
