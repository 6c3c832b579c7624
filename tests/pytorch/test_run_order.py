"""``pipeopt run`` of an action order: a 2-rank free-order plan of gpt-tiny (1F1B with the
backward split into I and W and rank 1's W's moved to its end: none of torch's seven orders)
runs for real on torch's ``_PipelineScheduleRuntime``, one gloo CPU process per rank, beside
the executor's prediction (no timing asserted: the machine is shared); and a broken order -
from the plan or from a CSV edited by hand - is refused before any process starts, naming its
first broken action, with exit code 2 on the CLI."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("torch.distributed.pipelining")

from test_run import NAMES, tiny_instance  # noqa: E402

from pipeopt.cli import main  # noqa: E402
from pipeopt.errors import InvalidPlanError, InvalidProblemError, ReadError  # noqa: E402
from pipeopt.export.torch_csv import to_csv  # noqa: E402
from pipeopt.io import write  # noqa: E402
from pipeopt.plan import Plan, Stage  # noqa: E402
from pipeopt.schedules import Action, Schedule, make_schedule, run_schedule  # noqa: E402
from pipeopt.torch.runtime import RunReport, order_prediction, run_plan  # noqa: E402
from strategies import hand_free_order  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")

SPLIT = (tuple(NAMES[:3]), tuple(NAMES[3:]))


free_order = hand_free_order


def free_plan(order: Schedule | None = None) -> Plan:
    order = order or free_order()
    names = [d.name for d in tiny_instance().cluster.devices]
    return Plan(tuple(Stage(c, devices=(names[r],)) for c, r in zip(SPLIT, order.placement, strict=True)),
                schedule=order.to_dict())


@pytest.mark.torchrun
def test_a_free_order_runs_on_torchs_runtime_beside_the_executor():
    inst = tiny_instance()
    order = free_order()
    assert order.name == "free" and all(order.steps != make_schedule(n, ranks=2, microbatches=3).steps
                                        for n in ("GPipe", "1F1B"))
    plan = free_plan(order)
    report = run_plan(plan, "gpt-tiny", instance=inst, iterations=2, warmup=1, timeout=240)
    assert isinstance(report, RunReport) and report.ranks == 2 and report.schedule == "free"
    assert report.stages == [NAMES[:3], NAMES[3:]] and report.membership_matches
    assert len(report.times) == 2 and all(t > 0 and math.isfinite(t) for t in report.times)
    assert report.predicted == run_schedule(inst, order, plan).time == order_prediction(inst, plan, order)
    assert "_PipelineScheduleRuntime" in report.info["runtime"] and report.info["order"] == order.to_dict()
    text = report.summary()
    assert "2 stages on 2 CPU processes" in text and "run_schedule" in text


def _plan_file(tmp_path, plan: Plan):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    inst = tmp_path / "inst.json"
    write(tiny_instance(), inst)
    return path, inst


BROKEN = {
    "missing": ("0F0,0F1,0I0,0W0,0F2,0I1,0W1,0I2\n1F0,1I0,1F1,1I1,1F2,1I2,1W0,1W1,1W2\n",
                "rank 0 never runs 0W2"),
    "backward-before-forward": ("0F0,0I0,0W0,0I1,0F1,0W1,0F2,0I2,0W2\n1F0,1I0,1F1,1I1,1F2,1I2,1W0,1W1,1W2\n",
                                r"rank 0, step 3 \(0I1\): 0I1 runs before its forward 0F1"),
    "cycle": ("0F0,0I0,0W0,0F1,0I1,0W1,0F2,0I2,0W2\n1F1,1F0,1I0,1I1,1F2,1I2,1W0,1W1,1W2\n",
              r"deadlocks at rank 0, step 1 \(0I0\).*after its step 0 \(1F1\) that waits for 0F1"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_an_edited_csv_is_refused_before_anything_runs(case, tmp_path, capsys):
    text, match = BROKEN[case]
    csv_path = tmp_path / "order.csv"
    csv_path.write_text(text)
    plan = Plan(tuple(Stage(c) for c in SPLIT))
    with pytest.raises(InvalidPlanError, match=match):
        run_plan(plan, "gpt-tiny", order=csv_path, timeout=1e-9)  # a spawn would time out at once
    plan_path, inst = _plan_file(tmp_path, plan)
    code = main(["run", str(plan_path), "--model", "gpt-tiny", "--instance", str(inst), "--order", str(csv_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("pipeopt: error:") and "order.csv" in err


def test_a_plans_broken_order_and_mismatches_are_refused(tmp_path, capsys):
    d = free_plan().to_dict()
    d["schedule"]["orders"] = [BROKEN["cycle"][0].splitlines()[r].split(",") for r in range(2)]
    plan_path, inst = _plan_file(tmp_path, Plan.from_dict(d))
    assert main(["run", str(plan_path), "--model", "gpt-tiny", "--instance", str(inst)]) == 2
    assert "deadlocks at rank 0, step 1 (0I0)" in capsys.readouterr().err
    with pytest.raises(InvalidProblemError, match="own action order"):
        run_plan(free_plan(), "gpt-tiny", schedule="1f1b")
    with pytest.raises(InvalidPlanError, match="runs 3 microbatches, not 4"):
        run_plan(free_plan(), "gpt-tiny", microbatches=4)
    four = tmp_path / "four.csv"
    four.write_text(to_csv(make_schedule("interleaved", ranks=2, microbatches=3)))
    with pytest.raises(InvalidPlanError, match="runs 4 stages on 2 ranks; the plan has 2"):
        run_plan(free_plan(), "gpt-tiny", order=four)
    bad = tmp_path / "bad.csv"
    bad.write_text("0F0,0SEND_F0\n")
    with pytest.raises(ReadError, match="communication action"):
        run_plan(free_plan(), "gpt-tiny", order=bad)


@pytest.mark.torchrun
def test_cli_runs_a_v_placed_order_from_its_csv_two_chunks_per_rank(tmp_path, capsys):
    """ZBVZeroBubble's order, exported to CSV and given with --order: rank 0 holds stages 0 and
    3, rank 1 stages 1 and 2 (adjacent stages on one rank)."""
    order = make_schedule("ZBVZeroBubble", ranks=2, microbatches=2)
    chunks = [tuple(NAMES[:3]), tuple(NAMES[3:4]), tuple(NAMES[4:6]), tuple(NAMES[6:])]
    plan_path, inst = _plan_file(tmp_path, Plan(tuple(Stage(c) for c in chunks)))
    csv_path = tmp_path / "zbv.csv"
    csv_path.write_text(to_csv(order))
    assert main(["run", str(plan_path), "--model", "gpt-tiny", "--instance", str(inst), "--order", str(csv_path),
                 "--iterations", "1", "--warmup", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ranks"] == 2 and out["membership_matches"] and out["stages"] == [list(c) for c in chunks]
    assert out["info"]["placement"] == [0, 1, 1, 0] and out["predicted_iteration"] > 0


def test_a_chunk_plan_without_an_order_is_not_run_as_one_stage_per_process():
    names = [d.name for d in tiny_instance().cluster.devices]
    chunks = [tuple(NAMES[:3]), tuple(NAMES[3:4]), tuple(NAMES[4:6]), tuple(NAMES[6:])]
    plan = Plan(tuple(Stage(c, devices=(names[s % 2],)) for s, c in enumerate(chunks)))
    from pipeopt.errors import UnsupportedPlanError

    with pytest.raises(UnsupportedPlanError, match="4 stages .chunks. on 2 ranks.*--order"):
        run_plan(plan, "gpt-tiny", instance=tiny_instance())
