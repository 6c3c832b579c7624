"""A schedule's JSON form (Schedule.to_dict / from_dict) and a plan that carries one."""

import json

import pytest

from pipeopt.errors import InvalidPlanError
from pipeopt.plan import Plan, Stage
from pipeopt.schedules import Action, Schedule, TORCH_SCHEDULES, make_schedule, parse_action


@pytest.mark.parametrize("name", TORCH_SCHEDULES)
def test_round_trip(name):
    v = 2 if name in ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV") else 1
    s = make_schedule(name, ranks=2, microbatches=4, stages_per_rank=v)
    d = json.loads(json.dumps(s.to_dict()))
    assert Schedule.from_dict(d) == s


def test_parse_action():
    assert parse_action("12W3") == Action("W", 12, 3)
    for bad in ("F0", "0X1", "a", 3, "0F"):
        with pytest.raises(InvalidPlanError, match="not <stage>"):
            parse_action(bad)


def test_bad_orders_are_named():
    d = make_schedule("1F1B", ranks=2, microbatches=2).to_dict()
    d["orders"][1][0] = "1Q0"
    with pytest.raises(InvalidPlanError, match=r"rank 1, step 0"):
        Schedule.from_dict(d)
    d = make_schedule("1F1B", ranks=2, microbatches=2).to_dict()
    d["orders"][0].remove("0B1")
    with pytest.raises(InvalidPlanError, match="microbatch 1 on stage 0"):
        Schedule.from_dict(d)
    with pytest.raises(InvalidPlanError, match="unknown field"):
        Schedule.from_dict({**make_schedule("1F1B", ranks=2, microbatches=2).to_dict(), "extra": 1})


def test_plan_carries_its_schedule():
    s = make_schedule("1F1B", ranks=2, microbatches=2)
    plan = Plan((Stage(("a",), ("d0",)), Stage(("b",), ("d1",))), schedule=s.to_dict())
    back = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert back == plan and Schedule.from_dict(back.schedule) == s
    assert "schedule" not in Plan(plan.stages).to_dict()
    with pytest.raises(InvalidPlanError, match="'schedule' must be a JSON object"):
        Plan.from_dict({"stages": [{"layers": ["a"]}], "schedule": [1]})
    with pytest.raises(InvalidPlanError, match="unknown field"):
        Plan.from_dict({"stages": [{"layers": ["a"]}], "order": []})
