"""The profile's recompute terms (:mod:`pipeopt.torch.probe`): what recomputing a layer adds is
timed in three parts - the checkpointed forward's excess over the plain forward, the rerun (the
layer's call the backward makes, timed around it), and the checkpointed backward's excess
beyond the rerun - and ``recompute_fwd`` / ``selective["fwd"]`` are their sum, scaled as the
forward (:func:`pipeopt.torch.profile.scale_layers`). Checked structurally, never by a timing
bound (the machine is shared)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipeopt.cost.rules import recompute_terms  # noqa: E402
from pipeopt.torch import from_torch, models  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")

PARTS = {"forward", "rerun", "backward"}


def test_recompute_terms_are_the_sum_of_three_timed_parts():
    module, example = models.build("gpt-tiny")
    inst = from_torch(module, example, repeats=2, warmup=0)
    g = inst.graph
    scale = (g.graph.get("torch") or {}).get("runtime_scale", {}).get("forward", 1.0)
    for n in g.nodes:
        a = g.nodes[n]
        parts = a["recompute_parts"]
        assert set(parts) == {"full", "selective"}
        for mode, part in parts.items():
            assert set(part) == PARTS, (n, mode)
            assert all(v >= 0 for v in part.values()), (n, mode, part)
        assert a["recompute_fwd"]["cpu"] == pytest.approx(sum(parts["full"].values()) * scale, rel=1e-12, abs=0)
        assert a["selective"]["fwd"]["cpu"] == pytest.approx(sum(parts["selective"].values()) * scale, rel=1e-12,
                                                             abs=0)
        # the one rule charges exactly that to the backward
        assert recompute_terms(g, n, "full")[1] == a["recompute_fwd"]
    for n in ("layers.0", "layers.1", "layers.2", "layers.3"):  # a block saves tensors: its backward reruns it
        assert g.nodes[n]["recompute_parts"]["full"]["rerun"] > 0
        assert g.nodes[n]["recompute_parts"]["selective"]["rerun"] > 0
