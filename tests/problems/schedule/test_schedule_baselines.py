"""Baselines of the schedule problem: uniform, torchtitan's split, the best 1F1B plan, and the
zero-bubble repository's greedy (its orders = the repository's own on 30 random cases, frozen in
zb_greedy_reference.json by make_zb_reference.py); every baseline is scored by the executor and
is never better than the exact optimum of its schedule."""

from __future__ import annotations

import json
import math
from pathlib import Path

import networkx as nx
import pytest

from pipeopt import Cluster, Instance, Settings
from pipeopt.errors import InvalidProblemError
from pipeopt.problems.schedule import ScheduleProblem, exhaustive, solve_milp, uniform_starts
from pipeopt.problems.schedule.baselines import best_1f1b, run_baselines, torchtitan_split, uniform, zb_greedy
from pipeopt.problems.schedule.zb_greedy import greedy_orders
from pipeopt.schedules import GENERATORS

HERE = Path(__file__).parent


def gpt_like(blocks=5, out=1e7, memory=math.inf, overlap=True):
    """input, emb, layer{i}_attn, layer{i}_mlp, ..., head: uneven costs."""
    g = nx.DiGraph()
    names = ["input", "emb"] + [f"layer{i}_{k}" for i in range(blocks) for k in ("attn", "mlp")] + ["head"]
    for q, n in enumerate(names):
        t = 0.001 if n == "input" else 0.02 if n in ("emb", "head") else 0.01 + 0.002 * (q % 3)
        g.add_node(n, fwd={"gpu": t}, bwd={"gpu": 2 * t}, out_bytes=out, act_bytes=2e8, param_bytes=1e8)
    nx.add_path(g, names)
    return Instance(g, Cluster.homogeneous(4, memory=memory, bandwidth=1e9), Settings(overlap=overlap))


def test_baselines_are_scored_by_the_executor_and_never_beat_the_optimum():
    inst = gpt_like()
    for name in GENERATORS:
        pr = ScheduleProblem(inst, name, 2, 4)
        opt = solve_milp(pr, time_limit=None)
        assert opt.status == "optimal"
        for res in run_baselines(pr):
            assert not isinstance(res, tuple), res
            assert res.objective == pr.execute(res.info["starts"]).time
            assert res.objective >= opt.objective * (1 - 1e-9), (name, res.method)
            assert res.lower_bound is None


def test_uniform_and_torchtitan_splits():
    inst = gpt_like(blocks=5)
    pr = ScheduleProblem(inst, "Interleaved1F1B", 2, 4, 2)
    assert uniform(pr).info["starts"] == uniform_starts(pr.n, 4) == [4, 7, 10]  # 13 units: 4 3 3 3
    assert uniform_starts(10, 4) == [3, 6, 8]
    # torchtitan: 5 blocks + embedding 1 + head 1 = 7 over 4 parts: 2 2 2 1 less the weights
    res = torchtitan_split(pr)
    assert res.info["blocks_per_part"] == [1, 2, 2, 0]
    chunks = pr.chunks(res.info["starts"])
    assert chunks[0] == ("input", "emb", "layer0_attn", "layer0_mlp") and chunks[-1] == ("head",)
    plain = nx.relabel_nodes(inst.graph, {n: f"x{n}" for n in inst.graph})
    with pytest.raises(InvalidProblemError, match="transformer blocks"):
        torchtitan_split(ScheduleProblem(inst.replace(graph=plain), "1F1B", 2, 4))


def test_best_1f1b_is_the_1f1b_optimum_on_one_chunk_per_rank():
    inst = gpt_like(blocks=3, out=5e7)
    pr = ScheduleProblem(inst, "1F1B", 3, 6)
    res = best_1f1b(pr)
    best = exhaustive(pr)
    # the DP minimises the steady period and breaks ties by the 1F1B iteration time: no
    # better than the exact iteration optimum, and within the period's reach of it
    assert res.objective >= best.objective * (1 - 1e-9)
    # its split has the least steady period of all splits (evaluate's bottleneck)
    import itertools

    from pipeopt import evaluate

    period = {s: evaluate(inst.with_settings(objective="bottleneck"), pr.plan(list(s))).objective
              for s in itertools.combinations(range(1, pr.n), 2)}
    assert math.isclose(period[tuple(res.info["starts"])], min(period.values()), rel_tol=1e-9)


def test_zb_greedy_orders_are_the_repositorys():
    cases = json.loads((HERE / "zb_greedy_reference.json").read_text())
    assert len(cases) == 30
    for c in cases:
        p = c["p"]
        orders, _, _ = greedy_orders(c["f"], c["b"], c["w"], c["comm"], c["act"], [0.0] * p, [-a for a in c["act"]],
                                     c["max_mem"], c["m"])
        assert [[f"{k}{mb}" for k, mb in st] for st in orders] == c["orders"]


def test_zb_greedy_runs_under_the_executor():
    inst = gpt_like(blocks=5, out=0.0)
    pr = ScheduleProblem(inst, "1F1B", 4, 8)
    res = zb_greedy(pr)
    sched = res.evaluation.schedule
    assert sched.name == "ZB-greedy" and sched.splits_backward and res.info["starts"] == uniform_starts(pr.n, 4)
    # free transfers: the greedy's own completion times are the executor's (its order run ASAP)
    from pipeopt.cost.passes import pass_times

    pt = pass_times(inst, pr.plan(res.info["starts"]))
    _, _, finish = greedy_orders(list(pt.forward), list(pt.input_grad), list(pt.weight_grad), 0.0,
                                 list(pt.act_bytes), [0.0] * 4, [-a for a in pt.act_bytes], None, 8)
    assert math.isclose(res.objective, finish, rel_tol=1e-9)
    # zero bubble beats 1F1B on the same split (W fills the bubbles)
    assert res.objective < pr.execute(res.info["starts"]).time
    with pytest.raises(InvalidProblemError):
        zb_greedy(ScheduleProblem(inst, "ZBVZeroBubble", 4, 8))
