"""pipeopt's zero-bubble greedy reproduces the zero-bubble repository's own scheduler exactly.

tests/data/zb_reference.json holds the outputs of sail-sg/zero-bubble-pipeline-parallelism's
``zb.py`` run unmodified (``benchmarks/zb_reference.py --fixture``): on its example inputs and
seeded random ones, every flag variant's per-stage order, estimate (``best_time``) and latest
completion time, or its error, and ``create_schedule``'s choice. The reference is not needed here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pipeopt.errors import InfeasibleError, InvalidProblemError
from pipeopt.problems.schedule import METHODS, ScheduleProblem, uniform_starts
from pipeopt.problems.schedule.baselines import zb_greedy
from pipeopt.problems.schedule.zb_greedy import (FLAGS, VARIANTS, execute_orders, greedy_orders, greedy_variants,
                                                 variant_flags)

FIXTURE = Path(__file__).resolve().parents[2] / "data" / "zb_reference.json"
CASES = json.loads(FIXTURE.read_text())["cases"]
ARGS = ("cost_f", "cost_b", "cost_w", "cost_comm", "mem_f", "mem_b", "mem_w", "max_mem", "n_micro")


def text(orders) -> list[str]:
    return [" ".join(f"{k}{mb}" for k, mb in st) for st in orders]


def test_the_fixture_covers_their_examples_and_random_inputs():
    names = [c["input"]["name"] for c in CASES]
    assert sum(n.startswith("dummy-config") for n in names) == 8  # test_pass.py's TEST_SETTINGS
    assert sum(n.startswith("runtime-initial") for n in names) == sum(n.startswith("pending-2p") for n in names) == 9
    ps = {c["input"]["n_stages"] for c in CASES}
    assert ps == set(range(2, 9))
    rnd = [c["input"] for c in CASES if c["input"]["name"].startswith("random")]
    assert len(rnd) == 40 and all(c["n_stages"] <= c["n_micro"] <= 3 * c["n_stages"] for c in rnd)
    assert any(any(x != int(x) for x in c["input"]["cost_f"]) for c in CASES)  # non-integer costs
    assert any(c["input"]["max_mem"] is not None for c in CASES)
    # their outcomes of every kind: orders, memory that does not fit, a failed closing check
    best = [c["best"] for c in CASES]
    assert "Cannot fit memory" in best and any(str(b).startswith("AssertionError") for b in best)
    assert max(len(c["orders"]) for c in CASES) == 8  # the 8 variants can all differ
    assert all([tuple(v["flags"]) for v in c["variants"]] == list(VARIANTS) for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["input"]["name"] for c in CASES])
def test_every_variant_is_the_repositorys(case):
    args = [case["input"][k] for k in ARGS]
    for ref, ours in zip(case["variants"], greedy_variants(*args), strict=True):
        assert list(ours["flags"]) == ref["flags"]
        if "error" in ref:
            assert ours.get("error") == ref["error"]
            continue
        assert text(ours["orders"]) == case["orders"][ref["orders"]]
        assert ours["estimate"] == ref["estimate"] and ours["finish"] == ref["finish"]  # exactly, same arithmetic
    # its create_schedule: the first of least estimate, or the first failing run's error
    if isinstance(case["best"], str):
        exc = AssertionError if case["best"].startswith("AssertionError") else ValueError
        with pytest.raises(exc):
            greedy_orders(*args)
    else:
        orders, estimate, _ = greedy_orders(*args)
        assert text(orders) == case["orders"][case["best"]]
        assert estimate == min(v["estimate"] for v in case["variants"])
    # each variant callable alone, by number, flags or names
    k = 5
    ref = case["variants"][k]
    for variant in (k, VARIANTS[k], dict(zip(FLAGS, VARIANTS[k], strict=True))):
        if "error" in ref:
            with pytest.raises((ValueError, AssertionError)):
                greedy_orders(*args, variant=variant)
        else:
            assert text(greedy_orders(*args, variant=variant)[0]) == case["orders"][ref["orders"]]


def test_the_executor_runs_their_orders():
    """With free transfers the executor's time of an order is the greedy's latest completion."""
    seen = 0
    for case in CASES:
        if case["input"]["cost_comm"] != 0.0 or isinstance(case["best"], str):
            continue
        inp = case["input"]
        for ref in case["variants"]:
            orders = [[(a[0], int(a[1:])) for a in st.split()] for st in case["orders"][ref["orders"]]]
            ex = execute_orders(orders, inp["cost_f"], inp["cost_b"], inp["cost_w"], inp["cost_comm"])
            assert math.isclose(ex.time, ref["finish"], rel_tol=1e-12)
            seen += 1
    assert seen >= 40


def test_variant_flags_are_checked():
    assert variant_flags(0) == (True, True, True) and variant_flags(7) == (False, False, False)
    assert variant_flags({}) == (False, False, True)  # manual_order's defaults
    assert variant_flags({"prioritize_b": True}) == (False, True, True)
    for bad in (8, -1, True, "best", (True, False), {"nope": True}, 1.0):
        with pytest.raises(InvalidProblemError):
            variant_flags(bad)


def gpt_like(p=4, memory=math.inf):
    import networkx as nx

    from pipeopt import Cluster, Instance, Settings

    g = nx.DiGraph()
    names = ["emb"] + [f"layer{i}" for i in range(7)] + ["head"]
    for q, n in enumerate(names):
        t = 0.02 if n in ("emb", "head") else 0.01 + 0.002 * (q % 3)
        g.add_node(n, fwd={"gpu": t}, bwd={"gpu": 2 * t}, out_bytes=1e6, act_bytes=2e8, param_bytes=1e8)
    nx.add_path(g, names)
    return Instance(g, Cluster.homogeneous(p, memory=memory, bandwidth=1e9), Settings())


def test_the_baseline_is_a_method_with_every_variant():
    spec = next(m for m in METHODS if m.name == "zb_greedy")
    assert not spec.exact and spec.function is zb_greedy
    pr = ScheduleProblem(gpt_like(), "1F1B", 4, 8)
    res = spec(pr, time_limit=10.0)
    assert res.space == "schedule:ZB-greedy" and res.lower_bound is None
    assert res.info["starts"] == uniform_starts(pr.n, 4)
    rows = res.info["variants"]
    assert [tuple(r[f] for f in FLAGS) for r in rows] == list(VARIANTS)
    k = res.info["variant_index"]
    # its choice: the first of least estimate; the objective is the executor's time of that order
    assert k == min(range(8), key=lambda i: rows[i]["estimate"])
    assert res.objective == rows[k]["time"] == res.evaluation.time
    assert res.evaluation.schedule.name == "ZB-greedy"
    for i in range(8):
        one = zb_greedy(pr, variant=i)
        assert one.info["variant_index"] == i and one.objective == rows[i]["time"]
    with pytest.raises(InvalidProblemError, match="variant"):
        zb_greedy(pr, variant=9)
    with pytest.raises(InvalidProblemError, match="one chunk per rank"):
        zb_greedy(ScheduleProblem(gpt_like(), "ZBVZeroBubble", 4, 8))


def test_the_baseline_says_when_memory_does_not_fit():
    pr = ScheduleProblem(gpt_like(memory=2.5e8), "1F1B", 4, 8)  # parameters fit, one activation does not
    with pytest.raises(InfeasibleError, match="Cannot fit memory"):
        zb_greedy(pr)
