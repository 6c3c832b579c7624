"""Issue 24's measured terms on the torch side: the link's latency and bandwidth fitted on a
ping-pong (:mod:`pipeopt.torch.network`), the stage overhead of a profile, the prediction of a
run with both, and ``pipeopt run``'s free-core check. No timing is asserted (the machine is
shared): only the rules and the bookkeeping."""

from __future__ import annotations

import os
from types import SimpleNamespace

import networkx as nx
import pytest

pytest.importorskip("torch.distributed.pipelining")

from pipeopt.cluster import Cluster  # noqa: E402
from pipeopt.errors import InvalidProblemError  # noqa: E402
from pipeopt.instance import Instance  # noqa: E402
from pipeopt.plan import Plan, Stage  # noqa: E402
from pipeopt.torch import runtime  # noqa: E402
from pipeopt.torch.network import fit_line, measure_link  # noqa: E402
from pipeopt.torch.profile import stage_overhead  # noqa: E402

NAMES = ["a", "b", "c", "d"]


def _instance(latency=0.0, overhead=None) -> Instance:
    g = nx.DiGraph()
    for n in NAMES:
        g.add_node(n, fwd={"cpu": 1e-3}, bwd={"cpu": 2e-3}, out_bytes=1e6, act_bytes=1e4, param_bytes=1e4)
    nx.add_path(g, NAMES)
    if overhead:
        g.graph["stage_overhead"] = overhead
    return Instance(g, Cluster.homogeneous(2, kind="cpu", bandwidth=1e9, latency=latency, prefix="cpu"))


def test_fit_line_recovers_alpha_and_beta():
    sizes = [4, 1024, 65536, 1 << 20]
    alpha, beta = fit_line(sizes, [3e-4 + s / 2e9 for s in sizes])
    assert alpha == pytest.approx(3e-4, rel=1e-9) and beta == pytest.approx(2e9, rel=1e-9)
    # a negative intercept (noise) is clamped at 0 and the slope refitted through the origin
    alpha, beta = fit_line([1e6, 2e6], [0.4e-3, 1.0e-3])
    assert alpha == 0.0 and beta > 0
    with pytest.raises(InvalidProblemError, match="two or more distinct sizes"):
        fit_line([8, 8], [1e-4, 1e-4])
    with pytest.raises(InvalidProblemError, match="do not grow"):
        fit_line([8, 1 << 20], [1e-3, 1e-4])
    with pytest.raises(InvalidProblemError, match="two or more distinct sizes"):
        measure_link([64, 64])


def test_stage_overhead_is_the_whole_run_beyond_the_layers():
    probes = [SimpleNamespace(fwd_s=1e-3, bwd_s=2e-3), SimpleNamespace(fwd_s=2e-3, bwd_s=3e-3)]
    assert stage_overhead(0.010, 0.004, probes) == pytest.approx({"forward": 1e-3, "backward": 1e-3})
    # the forward part is clamped to [0, total], the total at 0
    assert stage_overhead(0.007, 0.001, probes) == {"forward": 0.0, "backward": 0.0}
    assert stage_overhead(0.009, 0.009, probes) == pytest.approx({"forward": 1e-3, "backward": 0.0})


def test_the_prediction_of_a_run_includes_the_latency_and_the_overhead():
    plan = Plan((Stage(("a", "b")), Stage(("c", "d"))))
    over = {"forward": 5e-4, "backward": 1e-3}
    base = runtime.prediction(_instance(), plan, "1f1b", 4)
    alpha = runtime.prediction(_instance(latency=2e-4), plan, "1f1b", 4)
    both = runtime.prediction(_instance(latency=2e-4, overhead=over), plan, "1f1b", 4)
    assert base < alpha < both
    # one stage, no cut: M microbatches each pay the overhead of both passes, nothing else
    one = Plan((Stage(tuple(NAMES)),))
    assert runtime.prediction(_instance(2e-4, over), one, "1f1b", 4) == pytest.approx(
        runtime.prediction(_instance(), one, "1f1b", 4) + 4 * 1.5e-3)


def test_free_cores_warns_when_stages_outnumber_them(monkeypatch):
    """Without a busy-time sample (no /proc/stat): the 1-minute load average."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(runtime, "_busy_now", lambda cores, window=0.5: None)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.3, 1.0, 1.0))
    got = runtime.free_cores(2)
    assert (got["cores"], got["free"], got["processes"]) == (2, 1, 2)
    assert got["warning"].startswith("WARNING: 2 stage processes but 1 free cores")
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.1, 0.1))
    assert runtime.free_cores(2)["warning"] == ""
    report = runtime.RunReport("1f1b", 4, 1, 0, [["a"]], [["a"]], [0.1], 0.0,
                               info={"cores": runtime.free_cores(3)})
    assert "WARNING: 3 stage processes but 2 free cores" in report.summary()


@pytest.mark.slow
def test_measure_link_fits_a_positive_bandwidth():
    link = measure_link(repeats=3, warmup=1)
    assert link.latency >= 0 and link.bandwidth > 0
    assert len(link.sizes) == len(link.seconds) >= 2 and max(link.sizes) >= 1 << 24
    assert len(link.collective_sizes) == len(link.collective_seconds) >= 2  # the all-reduce, >= 1 MiB
    assert min(link.collective_sizes) >= 1 << 20 and link.collective_bandwidth is None or link.collective_bandwidth > 0
    assert "latency" in link.describe()


def test_free_cores_counts_the_cores_busy_now_not_the_trailing_load(monkeypatch):
    """Right after a profile the load average still reads 1.3 on an idle machine: the sample
    (busy 0.1 of 2 cores) decides, and both figures are in the line."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.3, 1.0, 1.0))
    monkeypatch.setattr(runtime, "_busy_now", lambda cores, window=0.5: 0.1)
    got = runtime.free_cores(2)
    assert (got["free"], got["busy"], got["load"], got["warning"]) == (2, 0.1, 1.3, "")
    assert "0.10 busy over 0.5 s (1-minute load average 1.30)" in got["text"]
    monkeypatch.setattr(runtime, "_busy_now", lambda cores, window=0.5: 0.8)
    assert runtime.free_cores(2)["warning"].startswith("WARNING: 2 stage processes but 1 free cores")


def test_busy_now_reads_proc_stat_per_core(monkeypatch, tmp_path):
    """Two readings of /proc/stat: core 0 went from 100 to 200 jiffies with 50 idle (half busy),
    core 1 all idle, core 2 not asked for; steal counts as busy."""
    import builtins

    readings = iter([
        "cpu  0 0 0 0 0 0 0 0\ncpu0 10 0 10 60 10 0 0 10\ncpu1 0 0 0 100 0 0 0 0\ncpu2 0 0 0 0 0 0 0 0\n",
        "cpu  0 0 0 0 0 0 0 0\ncpu0 20 0 20 100 20 0 0 40\ncpu1 0 0 0 200 0 0 0 0\ncpu2 50 0 0 0 0 0 0 0\n",
    ])
    real_open = builtins.open

    def fake_open(path, *a, **k):
        if path == "/proc/stat":
            f = tmp_path / "stat"
            f.write_text(next(readings))
            return real_open(f, *a, **k)
        return real_open(path, *a, **k)

    monkeypatch.setattr(builtins, "open", fake_open)
    assert runtime._busy_now([0, 1], window=0.0) == pytest.approx(0.5)
    monkeypatch.setattr(builtins, "open", lambda *a, **k: (_ for _ in ()).throw(OSError("no /proc")))
    assert runtime._busy_now([0, 1], window=0.0) is None
