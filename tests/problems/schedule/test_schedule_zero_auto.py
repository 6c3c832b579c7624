"""``zero="auto"`` in the schedule problem (issue 25): the ZeRO stage chosen with the split, one
exact solve per stage (:func:`pipeopt.problems.zero.best_zero_stage`), equal to the least of the
four stages solved one by one, through the API and the CLI; what cannot choose it is refused."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from strategies import chain_graph

import pipeopt
from pipeopt import Cluster, Instance, Settings
from pipeopt.errors import InvalidProblemError
from pipeopt.problems.schedule import ScheduleProblem, exhaustive
from pipeopt.problems.zero import ZERO_STAGES, best_zero_stage
from pipeopt.result import Status

STATE = {"dp": 4, "optimizer_ratio": 6.0, "gradient_ratio": 1.0}  # Adam-like state: ZeRO decides memory


def _instance(memory: float) -> Instance:
    g = chain_graph([1.0, 2.0, 1.5, 0.5, 1.2], [2.0, 3.0, 3.5, 1.0, 2.0], out=1e7, act=1e8, param=2e8)
    return Instance(g, Cluster.homogeneous(2, memory=memory, bandwidth=1e9), Settings(**STATE), name="zchain")


def _per_stage(inst, name, v=None):
    """Each ZeRO stage's exhaustive optimum (inf where no split fits)."""
    out = {}
    for z in ZERO_STAGES:
        try:
            r = exhaustive(ScheduleProblem(inst.with_settings(zero=z), name, 2, 4, v))
        except pipeopt.errors.InfeasibleError:
            out[z] = math.inf
            continue
        out[z] = r.objective if r.status == Status.OPTIMAL else math.inf
    return out


@pytest.mark.parametrize("memory", [2.0e9, 3.0e9, 6.0e9])  # ZeRO-2, ZeRO-1, ZeRO-0 least stage that fits
@pytest.mark.parametrize("name,v,method", [("1F1B", None, None), ("1F1B", None, "exhaustive"),
                                           ("ZBVZeroBubble", 2, None)])
def test_zero_auto_is_the_least_stage(memory, name, v, method):
    inst = _instance(memory)
    ref = _per_stage(inst, name, v)
    best = min(ref.values())
    res = pipeopt.solve(inst, problem="schedule", schedule=name, stages=2, microbatches=4, stages_per_rank=v,
                        method=method, zero="auto", time_limit=None)
    assert res.method == (method or "milp")  # the default: the first exact method that models ZeRO
    assert res.status == Status.OPTIMAL
    chosen = res.info["zero_auto"]["chosen"]
    assert chosen == min(z for z in ZERO_STAGES if ref[z] == pytest.approx(best, rel=1e-9))
    assert res.objective == pytest.approx(best, rel=1e-9)
    assert res.evaluation.objective == res.objective  # scored on the instance with the chosen stage
    again = pipeopt.solve(inst, problem="schedule", schedule=name, stages=2, microbatches=4, stages_per_rank=v,
                          method="exhaustive", zero=chosen, time_limit=None)
    assert again.objective == pytest.approx(res.objective, rel=1e-9)
    for z, seen in res.info["zero_auto"]["stages"].items():
        assert (seen == "infeasible") == (ref[z] == math.inf)


def test_every_stage_infeasible_is_an_infeasible_result():
    res = pipeopt.solve(_instance(1.5e9), problem="schedule", schedule="1F1B", stages=2, microbatches=4,
                        zero="auto", time_limit=None)
    assert res.status == Status.INFEASIBLE and res.plan is None
    assert res.info["zero_auto"] == {"stages": {z: "infeasible" for z in ZERO_STAGES}, "chosen": None}
    # by how much: the shortfall of ZeRO-3 (the least memory), as its own solve says it
    three = pipeopt.solve(_instance(1.5e9).with_settings(zero=3), problem="schedule", method="milp",
                          schedule="1F1B", stages=2, microbatches=4, time_limit=None)
    assert three.info["shortfall"]["exact"] and three.info["shortfall"]["bytes"] > 0
    assert res.info["note"] == f"every ZeRO stage refuted; at ZeRO-3: {three.info['note']}"
    assert "misses the limit by" in res.info["note"]


def test_a_stage_stopped_at_its_limit_is_reported_not_claimed():
    inst = _instance(3.0e9)

    def stage(z, deadline, *, cut=1, bound=True):
        res = pipeopt.solve(inst.with_settings(zero=z), problem="schedule", schedule="1F1B", stages=2,
                            microbatches=4, method="exhaustive", time_limit=None)
        if z == cut and res.plan is not None:  # as if this stage's solve had stopped at its limit
            res = dataclasses.replace(res, status=Status.TIME_LIMIT,
                                      lower_bound=0.5 * res.objective if bound else None)
        return res

    res = best_zero_stage(stage)
    assert res.status == Status.TIME_LIMIT and res.plan is not None
    assert res.lower_bound == pytest.approx(0.5 * res.info["zero_auto"]["stages"][1], rel=1e-12)
    res = best_zero_stage(lambda z, d: stage(z, d, bound=False))
    assert res.status == Status.TIME_LIMIT and res.lower_bound is None  # a stage without a bound: no bound


def test_methods_that_cannot_choose_the_stage_are_refused():
    inst = _instance(3.0e9)
    for method in ("uniform", "cpsat"):
        with pytest.raises(InvalidProblemError, match=f"not schedule/{method}; use schedule/milp, schedule/exhaustive"):
            pipeopt.solve(inst, problem="schedule", schedule="free" if method == "cpsat" else "1F1B", stages=2,
                          microbatches=4, method=method, zero="auto")


def test_cli_zero_auto_with_a_named_schedule(tmp_path, capsys):
    from pipeopt.cli import main
    from pipeopt.io import write

    path = write(_instance(3.0e9).with_settings(dp=1, optimizer_ratio=0.0, gradient_ratio=0.0), tmp_path / "z.json")
    args = ["--stages", "2", "--microbatches", "4", "--zero", "auto", "--dp", "4", "--gradient-ratio", "1",
            "--optimizer-ratio", "6", "--time-limit", "none"]
    assert main(["solve", str(path), "--schedule", "1F1B", *args, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["schedules"][0]
    assert row["zero_auto"]["chosen"] == 1 and row["status"] == "optimal"
    assert main(["solve", str(path), "--schedule", "1F1B", *args]) == 0
    assert "ZeRO stage chosen: 1" in capsys.readouterr().out
    assert main(["solve", str(path), "--schedule", "auto", *args]) == 2
    assert "--zero auto needs one named --schedule" in capsys.readouterr().err
