"""The graph of a run is built once (:func:`pipeopt.cost.schedule.lane_graph`); the numbers it
gives did not move when the two builders became one.

``run_graph_baseline.json`` holds, for a seeded set of runs, every iteration time and the hash
of every op's start time, recorded with the two builders the project had before (the flush
runs' ``run_graph`` and the schedules' ``schedule_graph``). This test recomputes them and
asserts they are bit-identical (floats compared by their hex spelling):

* ``run_graph`` + ``makespan``: GPipe and 1F1B with replicas per stage, windows, split
  execution and several links per cut, overlap on and off, random op and transfer times;
* the executor (``pipeopt.schedules.execute``): all seven torch schedules, p <= 4, v <= 3,
  m <= 9, random F / I / W / transfer times, overlap on and off;
* ``pipeopt.evaluate`` (``iteration_time``, ``gpipe_time``) and ``pipeopt.simulate`` (``1f1b``,
  ``gpipe``, ``split``) on random layer chains with straight, replicated and split-execution
  plans;
* the partition event-time model: ``run_time`` (the longest path the MILP states) on random
  splits, and the optimum and split of ``solve_events`` on small chains.

Regenerate (only when a change is meant to move the numbers, and say so in the commit)::

    .venv/bin/python tests/cost/test_run_graph_baseline.py --write
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
from pathlib import Path

import networkx as nx
import pytest

from pipeopt import Cluster, Device, Instance, Plan, Settings, Stage, evaluate
from pipeopt.cost import rules
from pipeopt.cost.passes import PassTimes
from pipeopt.cost.schedule import lane_graph, makespan, run_graph
from pipeopt.errors import InvalidPlanError, InvalidProblemError
from pipeopt.schedules import GENERATORS, execute, make_schedule, schedule_graph

BASELINE = Path(__file__).with_name("run_graph_baseline.json")


def _starts_hash(ops, starts) -> str:
    """A hash of ``{op: start}`` that does not depend on the order of the ops."""
    text = repr(sorted((tuple(op), float(t).hex()) for op, t in zip(ops, starts, strict=True)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def flush_runs(count: int = 120) -> dict:
    """``run_graph`` + ``makespan`` on random flush runs."""
    out = {}
    for seed in range(count):
        rng = random.Random(seed)
        S = rng.randint(1, 5)
        reps = [rng.randint(1, 3) for _ in range(S)]
        after = [sum(reps[s:]) for s in range(S)]
        window = [rules.in_flight(s, S, workers_after=after[s], replicas=reps[s]) for s in range(S)]
        split = [rng.random() < 0.3 for _ in range(S)]
        links = [rng.randint(1, min(reps[c], reps[c + 1])) for c in range(S - 1)]
        M = rng.randint(1, 9)
        f = [rng.uniform(0.0, 1.0) for _ in range(S)]
        b = [rng.uniform(0.0, 2.0) for _ in range(S)]
        x = [rng.uniform(0.0, 1.0) for _ in range(S - 1)]
        y = [rng.uniform(0.0, 1.0) for _ in range(S - 1)]
        for kind in ("1f1b", "gpipe"):
            for overlap in (True, False):
                g = run_graph(kind, reps, window, split, links, M, overlap)
                total, start = makespan(g, g.durations(f, b, x, y))
                out[f"{seed}/{kind}/{overlap}"] = [total.hex(), len(g.ops), _starts_hash(g.ops, start)]
    return out


def executions(count: int = 60) -> dict:
    """The executor on every torch schedule with random durations."""
    out = {}
    for name in sorted(GENERATORS):
        for seed in range(count):
            rng = random.Random(f"{name}/{seed}")
            p, m, v = rng.randint(1, 4), rng.randint(1, 9), rng.randint(1, 3)
            try:
                s = make_schedule(name, p, m, None if name in ("GPipe", "1F1B", "ZBVZeroBubble", "DualPipeV") else v)
            except InvalidProblemError:
                continue
            S = s.stages
            f = tuple(rng.uniform(0.0, 1.0) for _ in range(S))
            i = tuple(rng.uniform(0.0, 1.0) for _ in range(S))
            w = tuple(rng.uniform(0.0, 1.0) for _ in range(S))
            x = tuple(rng.uniform(0.0, 1.0) for _ in range(S - 1))
            y = tuple(rng.uniform(0.0, 1.0) for _ in range(S - 1))
            for overlap in (True, False):
                times = PassTimes(f, tuple(a + c for a, c in zip(i, w, strict=True)), i, w, x, y,
                                  (1.0,) * S, (1.0,) * S, (math.inf,) * S, overlap=overlap)
                ex = execute(s, times)
                out[f"{name}/{seed}/{overlap}"] = [ex.time.hex(), len(ex.ops), _starts_hash(ex.ops, ex.start)]
    return out


def _instance(rng: random.Random, two_kinds: bool) -> Instance:
    n = rng.randint(3, 8)
    g = nx.DiGraph()
    for q in range(n):
        f, b = rng.uniform(0.0, 0.05), rng.uniform(0.0, 0.1)
        fwd, bwd = {"gpu": f}, {"gpu": b}
        if two_kinds:
            fwd["cpu"], bwd["cpu"] = rng.uniform(0.0, 0.2), rng.uniform(0.0, 0.2)
        g.add_node(f"l{q}", fwd=fwd, bwd=bwd, out_bytes=rng.uniform(0.0, 0.08) * 1e9,
                   act_bytes=rng.uniform(0.0, 1e6), param_bytes=rng.uniform(0.0, 0.08) * 1e9)
    for q in range(n - 1):
        g.add_edge(f"l{q}", f"l{q + 1}")
    for _ in range(rng.randint(0, 2)):
        a, c = sorted(rng.sample(range(n), 2))
        if c > a + 1:
            g.add_edge(f"l{a}", f"l{c}", bytes=rng.uniform(0.0, 0.08) * 1e9)
    overlap = rng.random() < 0.6
    M = rng.randint(1, 10)
    if two_kinds:
        devices = tuple(Device(f"w{i}", {"gpu": 1.0, "cpu": 0.5}) for i in range(8))
        cluster = Cluster(devices, bandwidth=1e9)
    else:
        cluster = Cluster.homogeneous(8, bandwidth=1e9)
    return Instance(g, cluster, Settings(overlap=overlap, microbatches=M), name="random")


def _plan(rng: random.Random, inst: Instance, kind: str) -> Plan:
    n = inst.chain.n
    S = rng.randint(1, min(n, 4))
    starts = sorted(rng.sample(range(1, n), S - 1))
    names = [d.name for d in inst.cluster.devices]
    stages, used = [], 0
    for layers in inst.chain.stages_from_cuts(starts):
        m = rng.randint(1, 2) if kind != "straight" else 1
        beta = None
        if kind == "split":
            beta = {k: rng.uniform(0.05, 0.95) for k in sorted({k for d in inst.cluster.devices for k in d.resources})}
        stages.append(Stage(layers, tuple(names[used:used + m]), m, beta))
        used += m
    return Plan(tuple(stages))


def plans(count: int = 40) -> dict:
    """``evaluate`` and ``simulate`` on random chains and plans."""
    from pipeopt.simulate import simulate

    out = {}
    for kind in ("straight", "replicated", "split"):
        for seed in range(count):
            rng = random.Random(f"{kind}/{seed}")
            inst = _instance(rng, kind == "split" and rng.random() < 0.5)
            plan = _plan(rng, inst, kind)
            ev = evaluate(inst, plan)
            row = [ev.iteration_time.hex()]
            if kind == "split":
                row.append(simulate(inst, plan, schedule="split").iteration_time.hex())
            else:
                row += [ev.gpipe_time.hex(), simulate(inst, plan, schedule="1f1b").iteration_time.hex(),
                        simulate(inst, plan, schedule="gpipe").iteration_time.hex()]
            out[f"{kind}/{seed}"] = row
    return out


def event_runs(count: int = 12) -> dict:
    """The partition event-time model: ``run_time`` on random splits, ``solve_events`` on
    small chains (CBC, no time limit)."""
    from pipeopt.problems.partition.events import event_graph, run_time, solve_events
    from pipeopt.problems.partition.problem import PartitionProblem

    out = {}
    for seed in range(count):
        rng = random.Random(f"events/{seed}")
        inst = _instance(rng, False)
        n = inst.chain.n
        S = rng.randint(1, min(n, 4))
        problem = PartitionProblem(inst, S)
        starts = sorted(rng.sample(range(1, n), S - 1))
        for schedule in ("1f1b", "gpipe"):
            graph = event_graph(problem, schedule)
            total, start = run_time(problem, starts, schedule, graph)
            row = [total.hex(), _starts_hash(graph.ops, start)]
            if seed < count // 2:
                res = solve_events(problem, schedule, deadline=None)
                row += [res.status, float(res.value).hex(), float(res.bound).hex(), list(res.starts or [])]
            out[f"{seed}/{schedule}"] = row
    return out


def compute() -> dict:
    return {"flush": flush_runs(), "execute": executions(), "plans": plans(), "events": event_runs()}


def test_numbers_did_not_move():
    want = json.loads(BASELINE.read_text())
    got = json.loads(json.dumps(compute()))
    for part in want:
        assert set(got[part]) == set(want[part]), part
        moved = {k: (want[part][k], got[part][k]) for k in want[part] if want[part][k] != got[part][k]}
        assert not moved, f"{part}: {len(moved)} of {len(want[part])} moved, e.g. {list(moved.items())[:3]}"


def _edges(graph) -> set:
    return {(op, tuple(sorted(graph.ops[a] for a in after))) for op, after in zip(graph.ops, graph.after, strict=True)}


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("name", ["GPipe", "1F1B"])
def test_a_flush_schedule_is_the_flush_run(name, overlap):
    """One stage per rank: the schedule's graph and the flush run's are the same operations
    and waits (both from :func:`lane_graph`)."""
    for p in range(1, 5):
        for m in range(1, 8):
            sg = schedule_graph(make_schedule(name, p, m), overlap)
            run = run_graph(name.lower(), [1] * p, rules.windows(p), [False] * p, [1] * (p - 1), m, overlap)
            assert _edges(sg.graph) == _edges(run)
            assert sg.rank == tuple(op[1] if op[0] in "FB" else op[1] + (op[0] == "Y") for op in sg.graph.ops)


def test_lane_graph_refuses_a_transfer_on_no_channel():
    lanes = [[(("F", 0, 0),), (("B", 0, 0),)], [(("F", 1, 0),), (("B", 1, 0),)]]
    with pytest.raises(InvalidProblemError, match="X0@cut0 is on no channel"):
        lane_graph(lanes, 2, channels=[[("Y", 0, 0)]])
    graph, lane = lane_graph(lanes, 2, channels=[[("X", 0, 0)], [("Y", 0, 0)]])
    assert makespan(graph, graph.durations([1.0, 2.0], [3.0, 4.0], [0.5], [0.25]))[0] == 1 + 0.5 + 2 + 4 + 0.25 + 3
    assert dict(zip(graph.ops, lane, strict=True))[("Y", 0, 0)] == 1  # sent by lane 1


def test_lane_graph_names_a_deadlock():
    lanes = [[(("F", 0, 0),), (("B", 0, 0),)], [(("B", 1, 0),), (("F", 1, 0),)]]
    with pytest.raises(InvalidPlanError, match=r"two lanes: the order deadlocks \(a cycle of waits: .*1B0"):
        lane_graph(lanes, 2, overlap=False, name="two lanes")


if __name__ == "__main__":  # pragma: no cover - regenerates the baseline
    if "--write" in sys.argv:
        BASELINE.write_text(json.dumps(compute(), indent=0, sort_keys=True) + "\n")
    else:
        print(json.dumps(compute())[:2000])


def test_run_graph_is_cached_read_only_and_keyed_by_value():
    """``run_graph`` keeps its last graphs: equal arguments (lists or tuples, numpy ints) give the
    same graph object, whose ops and waits are tuples (callers share it); other arguments another."""
    import numpy as np

    a = run_graph("1f1b", [1, 1, 1], [3, 2, 1], [False] * 3, [1, 1], 4, True)
    b = run_graph("1f1b", (1, 1, 1), np.array([3, 2, 1]), (False, False, False), (np.int64(1), 1), 4, True)
    assert a is b and isinstance(a.ops, tuple) and isinstance(a.after, tuple)
    assert all(isinstance(w, tuple) for w in a.after)
    assert run_graph("1f1b", [1, 1, 1], [3, 2, 1], [False] * 3, [1, 1], 5, True) is not a
    assert run_graph("gpipe", [1, 1, 1], [3, 2, 1], [False] * 3, [1, 1], 4, True) is not a
