"""One real pipeline run: two spawned CPU processes (gloo), torch's own Schedule1F1B on the tiny
GPT; the run completes and each rank's stage holds exactly the plan's modules. Deselect with
``-m 'not torchrun'``. No timing is asserted (the machine is shared)."""

from __future__ import annotations

import math

import networkx as nx
import pytest

# the pipeline runtime, not just torch: the tests need torch.distributed.pipelining
pytest.importorskip("torch.distributed.pipelining")

from pipeopt.cluster import Cluster  # noqa: E402
from pipeopt.errors import InvalidProblemError, UnsupportedPlanError  # noqa: E402
from pipeopt.instance import Instance  # noqa: E402
from pipeopt.plan import Plan, Stage  # noqa: E402
from pipeopt.torch.runtime import RunReport, prediction, run_plan  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")

NAMES = ["tok_emb", "pos_emb", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "head"]


def tiny_instance() -> Instance:
    """gpt-tiny's layers with made-up costs (1 ms forward, 2 ms backward each)."""
    g = nx.DiGraph()
    for n in NAMES:
        g.add_node(n, fwd={"cpu": 1e-3}, bwd={"cpu": 2e-3}, out_bytes=4096.0, act_bytes=1e4, param_bytes=1e4)
    g.add_edge("tok_emb", "layers.0")
    nx.add_path(g, NAMES[1:])
    g.graph["torch"] = {"model": "GPT", "granularity": "container:layers", "container": "layers"}
    return Instance(g, Cluster.homogeneous(2, kind="cpu", bandwidth=1e9))


@pytest.mark.torchrun
def test_two_process_1f1b_run_builds_the_plan():
    plan = Plan((Stage(tuple(NAMES[:3])), Stage(tuple(NAMES[3:]))))
    inst = tiny_instance()
    report = run_plan(plan, "gpt-tiny", instance=inst, schedule="1f1b", microbatches=2, iterations=2, warmup=1,
                      timeout=240)
    assert isinstance(report, RunReport)
    assert report.stages == [NAMES[:3], NAMES[3:]]
    assert report.membership_matches
    assert len(report.times) == 2 and all(t > 0 and math.isfinite(t) for t in report.times)
    assert report.predicted == prediction(inst, plan, "1f1b", 2)
    assert report.info["split_spec"] == {"layers.1": "SplitPoint.BEGINNING"}
    assert "stage membership = plan" in report.summary()


def test_run_refuses_before_spawning():
    plan = Plan((Stage(tuple(NAMES[:3]), replicas=2), Stage(tuple(NAMES[3:]), replicas=2)))
    with pytest.raises(UnsupportedPlanError, match="data-parallel"):
        run_plan(plan, "gpt-tiny")
    with pytest.raises(InvalidProblemError, match="schedule"):
        run_plan(Plan((Stage(tuple(NAMES)),)), "gpt-tiny", schedule="zb")
    with pytest.raises(InvalidProblemError, match="unknown shipped model"):
        run_plan(Plan((Stage(tuple(NAMES)),)), "gpt-huge")
