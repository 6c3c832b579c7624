"""When no split of a schedule fits, the result says by how much (issue 25): the least, over every
split (and every recompute choice), of the fullest rank's memory beyond the device's
(:func:`pipeopt.problems.schedule.shortfall.least_overshoot`) equals the brute force over the
executor's memory with one chunk per rank, and bounds it from below with two; an infeasible
result carries it, and the command exits 2 with it."""

from __future__ import annotations

import math

import pytest
from brute_force import schedule_recompute_plans
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import chain_graph

from pipeopt import Cluster, Instance, Settings
from pipeopt.cli import main
from pipeopt.io import write
from pipeopt.problems.schedule import ScheduleProblem, exhaustive, solve_milp
from pipeopt.problems.schedule.shortfall import least_overshoot
from pipeopt.schedules import run_schedule

FEW = settings(max_examples=8, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SCHEDULES = {"GPipe": 1, "1F1B": 1, "InterleavedZeroBubble": 1, "ZBVZeroBubble": 2, "Interleaved1F1B": 2}
"""Schedules tested -> v (p = 2 ranks)."""


def _instance(fwd, act, param, memory, dp=None):
    g = chain_graph(fwd, [2 * f for f in fwd], out=1e6, act=act, param=param)
    extra = {"dp": dp, "optimizer_ratio": 6.0, "gradient_ratio": 1.0, "zero": 1} if dp else {}
    return Instance(g, Cluster.homogeneous(2, kind="gpu", memory=memory, bandwidth=1e9),
                    Settings(microbatches=4, **extra), name="short")


@st.composite
def problems(draw, schedule: str):
    """A ScheduleProblem on a random chain of 2 v .. 2 v + 2 layers (byte counts not integral),
    m = 4, memory anywhere from far too small to enough, with or without data parallelism."""
    v = SCHEDULES[schedule]
    n = draw(st.integers(2 * v, 2 * v + 2))
    fwd = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=n, max_size=n))
    act = draw(st.lists(st.floats(0.0, 1e9).map(lambda x: x + 0.3), min_size=n, max_size=n))
    param = draw(st.lists(st.floats(0.0, 5e8).map(lambda x: x + 0.7), min_size=n, max_size=n))
    memory = draw(st.floats(1e8, 6e9))
    dp = draw(st.sampled_from([None, None, 4]))
    return ScheduleProblem(_instance(fwd, act, param, memory, dp), schedule, 2, 4, v)


def _brute(problem, recompute: bool) -> float:
    """The least, over every split (and, with ``recompute``, every per-layer choice of none or
    full), of the fullest rank's bytes beyond its device's, by the executor."""
    cap = problem.capacity
    plans = schedule_recompute_plans(problem.instance, problem.schedule)
    if not recompute:
        plans = (p for p in plans if not any(s.recompute for s in p.stages))
    return min(max(run_schedule(problem.instance, problem.schedule, p).memory) - cap for p in plans)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("rc", ["none", "auto"])
def test_least_overshoot_is_the_brute_force(schedule, rc):
    @FEW
    @given(base=problems(schedule))
    def run(base):
        problem = ScheduleProblem(base.instance, base.schedule, recompute=rc)
        short = least_overshoot(problem)
        brute = _brute(problem, rc == "auto")
        tol = 1e-9 * max(problem.capacity, abs(brute))
        assert short.exact == (SCHEDULES[schedule] == 1)
        if short.exact:
            assert math.isclose(short.bytes, brute, rel_tol=1e-9, abs_tol=tol), (short, brute)
        else:
            assert short.bytes <= brute + tol, (short, brute)
        # the exact method agrees: no split fits iff the least overshoot is above 0 (v = 1)
        if short.exact and abs(short.bytes) > tol:
            res = exhaustive(problem)
            assert (str(res.status) == "infeasible") == (short.bytes > 0), (res.status, short)

    run()


def test_an_infeasible_result_says_by_how_much():
    # 1F1B on 2 ranks: rank 0 keeps 2 microbatches in flight, rank 1 one; 4 layers of 1 GB
    # activations and 0.5 GB parameters, 1.6 GB per rank. Splits (rank 0 | rank 1): 1 | 3 needs
    # max(2 x 1 + 0.5, 3 x 1 + 1.5) = 4.5 GB, 2 | 2 max(5, 3) GB, 3 | 1 max(7.5, 1.5) GB: the best
    # misses by 4.5 - 1.6 = 2.9 GB
    inst = _instance([1.0, 1.0, 1.0, 1.0], 1e9, 5e8, 1.6e9)
    problem = ScheduleProblem(inst, "1F1B", 2, 4)
    short = least_overshoot(problem)
    assert short.exact and short.starts == [1] and math.isclose(short.bytes, 4.5e9 - 1.6e9, rel_tol=1e-12)
    for res in (exhaustive(problem), solve_milp(problem, time_limit=None)):
        assert str(res.status) == "infeasible" and res.plan is None
        assert res.info["shortfall"]["exact"] and math.isclose(res.info["shortfall"]["bytes"], 2.9e9)
        assert "misses the limit by 2.701 GiB" in res.info["note"] and "try recompute='auto'" in res.info["note"]
    # with recomputation a full layer keeps only its input (1 MB): the same split needs far less
    auto = least_overshoot(ScheduleProblem(inst, "1F1B", 2, 4, recompute="auto"))
    assert auto.bytes < short.bytes


def test_the_command_exits_2_with_the_shortfall(tmp_path, capsys):
    path = write(_instance([1.0, 1.0, 1.0, 1.0], 1e9, 5e8, 1.6e9), tmp_path / "short.json")
    code = main(["solve", str(path), "--schedule", "1F1B", "--stages", "2", "--microbatches", "4"])
    err = capsys.readouterr().err
    assert code == 2 and "no schedule has a split that fits: 1F1B: no split fits" in err
    assert "misses the limit by 2.701 GiB" in err
    code = main(["solve", str(path), "--schedule", "auto", "--stages", "2", "--microbatches", "4"])
    err = capsys.readouterr().err
    assert code == 2 and "ZBVZeroBubble: no split fits" in err and "by at least" in err
