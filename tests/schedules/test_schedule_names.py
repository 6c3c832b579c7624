"""One vocabulary of schedule names (:func:`pipeopt.schedules.schedule_name`): torch's names
and class names in any case and the documented short aliases give the canonical name, every
entry point reads it, and an unknown name is a typed error listing the choices."""

from __future__ import annotations

import networkx as nx
import pytest

from pipeopt import Cluster, Instance, Plan, Settings, Stage
from pipeopt.errors import InvalidProblemError
from pipeopt.schedules import (
    ALIASES,
    GENERATORS,
    MAX_OPERATIONS,
    SIMULATED,
    TORCH_SCHEDULES,
    make_schedule,
    operation_count,
    schedule_key,
    schedule_name,
)
from pipeopt.simulate import simulate


@pytest.mark.parametrize("text, name", [
    ("GPipe", "GPipe"), ("ScheduleGPipe", "GPipe"), ("gpipe", "GPipe"), ("GPIPE", "GPipe"),
    ("1F1B", "1F1B"), ("Schedule1F1B", "1F1B"), ("1f1b", "1F1B"), ("schedule1f1b", "1F1B"),
    ("Interleaved1F1B", "Interleaved1F1B"), ("ScheduleInterleaved1F1B", "Interleaved1F1B"),
    ("interleaved", "Interleaved1F1B"), ("interleaved_1f1b", "Interleaved1F1B"),
    ("LoopedBFS", "LoopedBFS"), ("looped-bfs", "LoopedBFS"), ("bfs", "LoopedBFS"),
    ("InterleavedZeroBubble", "InterleavedZeroBubble"), ("zb", "InterleavedZeroBubble"),
    ("ZB1P", "InterleavedZeroBubble"),
    ("ZBVZeroBubble", "ZBVZeroBubble"), ("ScheduleZBVZeroBubble", "ZBVZeroBubble"), ("zbv", "ZBVZeroBubble"),
    ("ZB-V", "ZBVZeroBubble"),
    ("DualPipeV", "DualPipeV"), ("ScheduleDualPipeV", "DualPipeV"), ("dualpipev", "DualPipeV"),
    ("dualpipe-v", "DualPipeV"),
])
def test_every_spelling_gives_the_canonical_name(text, name):
    assert schedule_name(text) == name
    assert make_schedule(text, 2, 4).name == name


def test_the_table_is_torch_s_names_and_every_alias_is_unique():
    assert set(TORCH_SCHEDULES) == set(GENERATORS)
    assert set(ALIASES) == set(TORCH_SCHEDULES) | set(SIMULATED) | {"free"}
    owner: dict = {}
    for name, aliases in ALIASES.items():  # no spelling names two schedules
        for a in (name, *aliases):
            assert owner.setdefault(a.lower().replace("-", "").replace("_", ""), name) == name, a
    for name in ALIASES:
        assert schedule_name(name, among=ALIASES) == name


@pytest.mark.parametrize("bad", ["nope", "1F2B", "", None, 3, "auto"])
def test_unknown_names_are_refused_with_the_choices(bad):
    with pytest.raises(InvalidProblemError, match="choose from GPipe .*DualPipeV"):
        schedule_name(bad)


def test_a_known_name_an_entry_point_does_not_run_is_refused():
    with pytest.raises(InvalidProblemError, match="'ZBVZeroBubble' is not run here; choose from GPipe"):
        schedule_key("zbv")
    with pytest.raises(InvalidProblemError, match="'async' is not run here"):
        schedule_name("async")  # the simulator's, not a torch schedule
    assert [schedule_key(x) for x in ("ScheduleGPipe", "1F1B", "PipeDream-Async", "split")] == ["gpipe", "1f1b", "async",
                                                                                          "split"]


def test_the_simulator_reads_the_vocabulary():
    g = nx.DiGraph()
    for i in range(4):
        g.add_node(f"l{i}", fwd={"gpu": 0.01}, bwd={"gpu": 0.02}, out_bytes=1e6, act_bytes=1e6, param_bytes=1e6)
    nx.add_path(g, [f"l{i}" for i in range(4)])
    inst = Instance(g, Cluster.homogeneous(2, bandwidth=1e9), Settings(microbatches=4))
    d0, d1 = (d.name for d in inst.cluster.devices)
    plan = Plan((Stage(("l0", "l1"), (d0,)), Stage(("l2", "l3"), (d1,))))
    a = simulate(inst, plan, schedule="Schedule1F1B")
    b = simulate(inst, plan, schedule="1f1b")
    assert a.schedule == b.schedule == "1f1b" and a.iteration_time == b.iteration_time
    assert simulate(inst, plan, schedule="GPipe").schedule == "gpipe"
    with pytest.raises(InvalidProblemError, match="'Interleaved1F1B' is not run by the simulator; choose from GPipe"):
        simulate(inst, plan, schedule="Interleaved1F1B")


def test_too_large_a_schedule_is_refused_before_it_is_built():
    with pytest.raises(InvalidProblemError, match="microbatches must be at most 100000"):
        make_schedule("1F1B", 4, 10**9)
    p, m = 8, 40_000
    assert operation_count(p, 2, m) > MAX_OPERATIONS
    with pytest.raises(InvalidProblemError, match="operations, more than"):
        make_schedule("Interleaved1F1B", p, m)
    with pytest.raises(InvalidProblemError, match="stages_per_rank must be an integer"):
        make_schedule("LoopedBFS", 2, 4, 0)
