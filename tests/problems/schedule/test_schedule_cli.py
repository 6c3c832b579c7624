"""``pipeopt solve --schedule NAME|auto``: one schedule's exact split, or every schedule's in a
table with the least iteration time; the choice agrees with the per-schedule solves."""

from __future__ import annotations

import json
import math

import networkx as nx

from pipeopt import Cluster, Instance, Settings
from pipeopt.cli import main
from pipeopt.io import write
from pipeopt.problems.schedule import ScheduleProblem, exhaustive
from pipeopt.problems.schedule.choose import best_schedule, solve_schedules
from pipeopt.schedules import GENERATORS


def instance(memory=math.inf):
    g = nx.DiGraph()
    for i in range(6):
        g.add_node(f"l{i}", fwd={"gpu": 0.01 + 0.004 * i}, bwd={"gpu": 0.02 + 0.01 * (i % 3)}, out_bytes=2e6,
                   act_bytes=1e8, param_bytes=2e8)
    nx.add_path(g, [f"l{i}" for i in range(6)])
    return Instance(g, Cluster.homogeneous(2, memory=memory, bandwidth=1e9), Settings(microbatches=4), name="six")


def test_auto_picks_the_least_of_the_exact_optima(tmp_path, capsys):
    inst = instance()
    refs = {name: exhaustive(ScheduleProblem(inst, name, 2, 4)).objective for name in GENERATORS}
    # the API without a time limit: every schedule proven, the least one proven least
    results = solve_schedules(inst, 2, 4, time_limit=None)
    for r in results:
        assert r.status == "optimal" and math.isclose(r.objective, refs[r.info["schedule"]], rel_tol=1e-6)
    best, proven = best_schedule(results)
    assert best.info["schedule"] == min(refs, key=refs.get) and proven
    # the command (under its one time limit): one row per schedule, each claim honest
    path = write(inst, tmp_path / "six.json")
    assert main(["solve", str(path), "--schedule", "auto", "--stages", "2", "--microbatches", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["schedule"]: r for r in out["schedules"]}
    assert set(rows) == set(GENERATORS)
    for name, row in rows.items():
        assert row["status"] in ("optimal", "time_limit") and row["space"] == f"schedule:{name}"
        assert row["iteration_time"] >= refs[name] * (1 - 1e-9) and row["lower_bound"] <= refs[name] * (1 + 1e-9)
    assert main(["solve", str(path), "--schedule", "zbvzerobubble", "--stages", "2", "--microbatches", "4"]) == 0
    text = capsys.readouterr().out
    assert "ZBVZeroBubble" in text and "best: ZBVZeroBubble" in text and "chunk 3 on rank 0" in text
    # the short alias and the class name reach the same schedule
    assert main(["solve", str(path), "--schedule", "zbv", "--stages", "2", "--microbatches", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["best"] == "ZBVZeroBubble"
    assert main(["solve", str(path), "--problem", "schedule", "--method", "uniform", "--stages", "2", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["schedules"][0]
    assert row["schedule"] == "1F1B" and row["method"] == "uniform" and row["status"] == "feasible"
    # a v the named schedule does not run is refused, not ignored (exit code 2, the message)
    assert main(["solve", str(path), "--schedule", "1F1B", "--stages", "2", "--stages-per-rank", "3"]) == 2
    assert "1 stage(s) per rank, not 3" in capsys.readouterr().err
    assert main(["solve", str(path), "--schedule", "nope", "--stages", "2"]) == 2
    assert "unknown schedule 'nope'; choose from GPipe" in capsys.readouterr().err


def test_refused_schedules_get_a_row_and_memory_can_rule_out_all():
    inst = instance()
    res = solve_schedules(inst, 2, 3, ["DualPipeV", "1F1B"], time_limit=None)  # DualPipeV needs m >= 2p
    assert isinstance(res[0], tuple) and "DualPipeV" in res[0][1]
    best, proven = best_schedule(res)
    assert best.info["schedule"] == "1F1B" and proven
    none = solve_schedules(instance(memory=1e8), 2, 4, ["1F1B", "GPipe"], time_limit=None)
    assert best_schedule(none) == (None, False)
    assert all(r.status == "infeasible" for r in none)
