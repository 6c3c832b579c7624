"""The last stage's memory includes torch's merge of the iteration's outputs (rules.merged_output):
at the end of ``step()`` the last stage concatenates the M outputs it kept, holding them twice,
after the microbatches' activations are freed. Checked against MemTracker on a gpt-tiny with a
large vocabulary (the logits dominate the last stage), M = 8, S = 2 (slow tier: spawned gloo
processes). No timing is asserted."""

from __future__ import annotations

import pytest

pytest.importorskip("torch.distributed.pipelining")

from pipeopt import evaluate  # noqa: E402
from pipeopt.cost import rules  # noqa: E402
from pipeopt.plan import Plan, Stage  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")

KW = {"vocab": 4096}


@pytest.mark.torchrun
def test_last_stage_memory_counts_the_merged_output():
    from pipeopt.torch import from_torch, models
    from pipeopt.torch.memory import measure_stages

    module, inputs = models.build("gpt-tiny", **KW)
    inst = from_torch(module, inputs, microbatches=8, repeats=1, warmup=0).with_settings(objective="iteration")
    names = list(inst.graph.nodes)
    plan = Plan((Stage(tuple(names[:4]), ("cpu0",)), Stage(tuple(names[4:]), ("cpu1",))))
    ev = evaluate(inst, plan)
    measured = measure_stages(plan, "gpt-tiny", model_kwargs=KW, instance=inst, microbatches=8)
    for i, m in enumerate(measured):
        assert abs(ev.memory[i] - m["peak"]) <= 0.10 * m["peak"], (i, ev.memory[i], m["peak"])
    # the merge is what the last stage peaks at: its term is a large part of the stage
    merge = float(rules.merged_output(inst.graph.nodes[names[-1]]["out_bytes"], True, 8))
    assert merge > 0.25 * measured[1]["peak"]
