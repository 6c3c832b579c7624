"""Action orders out to torch's compute-only CSV and back (pure Python; torch's own loader reads
them in tests/export/test_torch_csv_load.py), the export of multi-chunk and free-order plans to
torchtitan, and the refusals: Megatron-LM and DeepSpeed refuse several stages per rank, a
broken order (a missing action, a backward before its forward, a cycle of waits between ranks)
is refused naming its first broken action, on the CLI with exit code 2."""

from __future__ import annotations

import io
import json
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeopt.cli import main
from pipeopt.errors import InvalidPlanError, ReadError, UnsupportedPlanError
from pipeopt.export import export, torch_csv
from pipeopt.plan import Plan, Stage
from pipeopt.schedules import TORCH_SCHEDULES, Action, Schedule, make_schedule
from strategies import hand_free_order

NAMES = ["tok_emb", "pos_emb", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "head"]
CHUNKS4 = [NAMES[:3], NAMES[3:4], NAMES[4:6], NAMES[6:]]
V = {"GPipe": 1, "1F1B": 1}


def torch_order(name: str, ranks: int = 2, m: int = 4) -> Schedule:
    return make_schedule(name, ranks=ranks, microbatches=m, stages_per_rank=V.get(name, 2))


free_order = hand_free_order


def plan_with(order: Schedule, chunks, devices: bool = True) -> Plan:
    return Plan(tuple(Stage(tuple(c), devices=(f"cpu{r}",) if devices else ())
                      for c, r in zip(chunks, order.placement, strict=True)), schedule=order.to_dict())


def read(text: str, **kw) -> Schedule:
    return torch_csv.read_csv(io.StringIO(text), **kw)


@pytest.mark.parametrize("name", TORCH_SCHEDULES)
def test_csv_round_trips_torchs_seven_orders(name):
    order = torch_order(name)
    back = read(torch_csv.to_csv(order), name=name)
    assert back.steps == order.steps and back.placement == order.placement
    assert back.microbatches == order.microbatches and back.stages_per_rank == order.stages_per_rank


def test_csv_round_trips_a_free_order_and_its_cells_are_torchs_spelling():
    order = free_order()
    text = torch_csv.to_csv(order)
    assert text.splitlines()[1] == "1F0,1I0,1F1,1I1,1F2,1I2,1W0,1W1,1W2"
    assert read(text).steps == order.steps
    dual = torch_csv.to_csv(torch_order("DualPipeV"))
    assert "OVERLAP_F_B" in dual and read(dual).steps == torch_order("DualPipeV").steps
    # empty cells are idle steps (torch reads them as None) and are skipped
    assert read("0F0,,0B0\n1F0,1B0\n").steps == ((( Action("F", 0, 0),), (Action("B", 0, 0),)),
                                                 ((Action("F", 1, 0),), (Action("B", 1, 0),)))


def test_export_torch_csv_of_a_free_order_plan_has_the_split_and_the_order():
    order = free_order()
    out = export(plan_with(order, [NAMES[:3], NAMES[3:]]), "torch-csv")
    assert out["csv"] == torch_csv.to_csv(order) and out["order"] == "free" and out["schedule"] == "free"
    assert out["ranks"] == 2 and out["stages_per_rank"] == 1 and out["microbatches"] == 3
    assert out["stages"] == [NAMES[:3], NAMES[3:]] and out["split_spec"] == {"layers.1": "SplitPoint.BEGINNING"}
    # layer names that are not module FQNs: the order still goes out, without a split_spec, saying why
    odd = Plan((Stage(("input 0", "a")), Stage(("b",))), schedule=order.to_dict())
    out = export(odd, "torch-csv")
    assert out["split_spec"] is None and any("no split_spec" in n for n in out["notes"])


def test_export_torch_csv_builds_a_named_order_or_refuses_saying_how():
    plan = Plan(tuple(Stage(tuple(c), devices=(f"cpu{r}",)) for c, r in zip(CHUNKS4, (0, 1, 0, 1))))
    out = export(plan, "torch-csv", schedule="interleaved", microbatches=4)
    assert out["csv"] == torch_csv.to_csv(torch_order("Interleaved1F1B")) and out["placement"] == [0, 1, 0, 1]
    with pytest.raises(UnsupportedPlanError, match="no action order.*--schedule NAME"):
        export(plan, "torch-csv")
    with pytest.raises(UnsupportedPlanError, match="1F1B runs 1 stage"):
        export(plan, "torch-csv", schedule="1f1b")
    with pytest.raises(InvalidPlanError, match="carries its own order"):
        export(plan_with(free_order(), [NAMES[:3], NAMES[3:]]), "torch-csv", schedule="gpipe")


def test_torchtitan_multi_chunk_degree_is_the_ranks_and_the_csv_is_named():
    for name, expect in (("Interleaved1F1B", "Interleaved1F1B"), ("ZBVZeroBubble", "ZBVZeroBubble")):
        order = torch_order(name)
        out = export(plan_with(order, CHUNKS4), "torchtitan", csv_path="/tmp/x/order.csv")
        cfg = tomllib.loads(out["toml"])["parallelism"]
        assert cfg["pipeline_parallel_degree"] == 2 and cfg["pipeline_parallel_schedule"] == expect
        assert cfg["pipeline_parallel_schedule_csv"] == "/tmp/x/order.csv" and out["csv"] == torch_csv.to_csv(order)
        assert cfg["module_fqns_per_model_part"] == CHUNKS4
    # a free order on a V placement is placed by a V schedule's name, the CSV says the order
    zbv = torch_order("ZBVZeroBubble")
    free_v = Schedule("free", 2, 2, zbv.microbatches, zbv.placement, zbv.steps)
    out = export(plan_with(free_v, CHUNKS4), "torchtitan")
    assert out["pipeline_parallel_schedule"] == "ZBVZeroBubble" and out["pipeline_parallel_schedule_csv"] == "schedule.csv"
    assert any("only places the stages" in n for n in out["notes"])
    # a one-chunk free order: degree 2, a single-stage name for the placement
    out = export(plan_with(free_order(), [NAMES[:3], NAMES[3:]]), "torchtitan")
    assert out["pipeline_parallel_degree"] == 2 and out["pipeline_parallel_schedule"] == "1F1B"
    # a placement torchtitan cannot build (neither looped nor V) is refused
    odd = Schedule("free", 2, 2, 1, (0, 0, 1, 1), (((Action("F", 0, 0),), (Action("F", 1, 0),), (Action("B", 1, 0),),
                                                    (Action("B", 0, 0),)),
                                                   ((Action("F", 2, 0),), (Action("F", 3, 0),), (Action("B", 3, 0),),
                                                    (Action("B", 2, 0),))))
    with pytest.raises(UnsupportedPlanError, match="cannot build this order's placement"):
        export(plan_with(odd, CHUNKS4), "torchtitan")


def test_torchtitan_by_name_uses_ranks_not_stages():
    devices = Plan(tuple(Stage(tuple(c), devices=(f"cpu{r}",)) for c, r in zip(CHUNKS4, (0, 1, 0, 1))))
    bare = Plan(tuple(Stage(tuple(c)) for c in CHUNKS4))
    for plan in (devices, bare):
        out = export(plan, "torchtitan", schedule="interleaved")
        assert out["pipeline_parallel_degree"] == 2 and "pipeline_parallel_degree = 2" in out["toml"]
    with pytest.raises(UnsupportedPlanError, match="--schedule"):
        export(devices, "torchtitan")  # 4 chunks on 2 ranks are not 1F1B


@pytest.mark.parametrize("fmt", ["megatron", "deepspeed"])
def test_megatron_and_deepspeed_refuse_several_stages_per_rank(fmt):
    order = torch_order("Interleaved1F1B")
    with pytest.raises(UnsupportedPlanError, match="4 stages .chunks. on 2 ranks.*torch-csv"):
        export(plan_with(order, CHUNKS4), fmt)
    with pytest.raises(UnsupportedPlanError, match="virtual|one stage per rank"):
        export(Plan(tuple(Stage(tuple(c)) for c in CHUNKS4)), fmt, schedule="interleaved")
    # one chunk per rank with a free order: the split goes out and the notes say whose order runs
    out = export(plan_with(free_order(), [NAMES[:3], NAMES[3:]]), fmt)
    assert out["num_stages"] == 2 and any("not the plan's free order" in n for n in out["notes"])


# ---- broken orders ---------------------------------------------------------------------------

GOOD = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"


def test_the_good_order_reads():
    assert read(GOOD).steps == make_schedule("1F1B", ranks=2, microbatches=2).steps


@pytest.mark.parametrize(("text", "match"), [
    ("0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n", r"rank 0 never runs the backward of microbatch 1 on stage 0 \(0B1"),
    ("0F0,0B0,0B1\n1F0,1B0,1F1,1B1\n", r"rank 0, step 2 \(0B1\): 0B1 runs before its forward 0F1"),
    ("0F0,0F1,0B0,0B1\n1F0,1W0,1F1,1B1\n", r"rank 1, step 1 \(1W0\): 1W0 runs before its input gradient 1I0"),
    ("0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n",
     r"deadlocks at rank 0, step 1 \(0B0\): rank 0, step 1 \(0B0\) waits for 1B0; which rank 1 runs at step 2, "
     r"after its step 0 \(1F1\) that waits for 0F1"),
    ("0F0,0F1,0B0,0B1,0F0\n1F0,1B0,1F1,1B1\n", r"0F0 runs twice"),
    ("0F0,0F1,0B0,0B1,1F0\n1F0,1B0,1F1,1B1\n", r"rank 1, step 0 \(1F0\): stage 1 also runs on rank 0"),
    ("0F0,0F1,0B0,0B1\n1F0,1B0,1F1\n", r"rank 1 never runs the backward of microbatch 1 on stage 1"),
])
def test_a_broken_order_names_its_first_broken_action(text, match):
    with pytest.raises(InvalidPlanError, match=match):
        read(text)


@pytest.mark.parametrize(("text", "match"), [
    ("0F0,0X1\n", r"row 1 \(rank 0\), column 2: '0X1' is not an action"),
    ("0F0,0SEND_F0\n", r"communication action"),
    ("(0F0;0B0\n", r"not a step of actions run back to back"),
    ("\n\n", r"no rows"),
])
def test_an_unreadable_cell_is_a_read_error_naming_row_and_column(text, match):
    with pytest.raises(ReadError, match=match):
        read(text)


def test_microbatches_given_must_all_run():
    with pytest.raises(InvalidPlanError, match="never runs 0F2"):
        read(GOOD, microbatches=3)


def test_a_plan_whose_order_deadlocks_is_refused_by_every_export():
    steps = ((((Action("F", 0, 0),), (Action("B", 0, 0),), (Action("F", 0, 1),), (Action("B", 0, 1),))),
             (((Action("F", 1, 1),), (Action("F", 1, 0),), (Action("B", 1, 0),), (Action("B", 1, 1),))))
    stuck = Schedule("edited", 2, 1, 2, (0, 1), steps)  # the Schedule itself allows it; the deadlock check does not
    plan = plan_with(stuck, [NAMES[:3], NAMES[3:]])
    for fmt in ("torch-csv", "torchtitan", "torch", "megatron"):
        with pytest.raises(InvalidPlanError, match=r"deadlocks at rank 0, step 1 \(0B0\)"):
            export(plan, fmt)


# ---- the command line --------------------------------------------------------------------------

def test_cli_export_torch_csv_writes_json_and_csv(tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan_with(free_order(), [NAMES[:3], NAMES[3:]]).to_dict()))
    assert main(["export", str(plan_path), "--to", "torch-csv", "--out", str(tmp_path / "free.json")]) == 0
    assert (tmp_path / "free.csv").read_text() == torch_csv.to_csv(free_order())
    assert json.loads((tmp_path / "free.json").read_text())["format"] == "torch-csv"
    assert main(["export", str(plan_path), "--to", "torch-csv", "--out", str(tmp_path / "named.csv")]) == 0
    assert (tmp_path / "named.csv").read_text() == torch_csv.to_csv(free_order())
    assert json.loads((tmp_path / "named.json").read_text())["csv"] == torch_csv.to_csv(free_order())
    assert main(["export", str(plan_path), "--to", "torchtitan", "--out", str(tmp_path / "titan.json")]) == 0
    cfg = tomllib.loads((tmp_path / "titan.toml").read_text())["parallelism"]
    assert cfg["pipeline_parallel_schedule_csv"] == str((tmp_path / "titan.csv").resolve())
    assert (tmp_path / "titan.csv").read_text() == torch_csv.to_csv(free_order())
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(Plan((Stage(tuple(NAMES[:3])), Stage(tuple(NAMES[3:])))).to_dict()))
    capsys.readouterr()
    assert main(["export", str(bare), "--to", "torch-csv"]) == 2
    assert "--schedule NAME" in capsys.readouterr().err
    assert main(["export", str(bare), "--to", "torch-csv", "--schedule", "gpipe", "--microbatches", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["csv"] == torch_csv.to_csv(make_schedule("gpipe", 2, 3))


def test_cli_export_refuses_a_broken_order_with_exit_code_2(tmp_path, capsys):
    d = plan_with(free_order(), [NAMES[:3], NAMES[3:]]).to_dict()
    d["schedule"]["orders"][0] = ["0F0", "0I0", "0W0", "0F1", "0I1", "0W1", "0F2", "0I2", "0W2"]
    d["schedule"]["orders"][1] = ["1F1", "1F0", "1I0", "1I1", "1F2", "1I2", "1W0", "1W1", "1W2"]
    (tmp_path / "p.json").write_text(json.dumps(d))
    assert main(["export", str(tmp_path / "p.json"), "--to", "torch-csv"]) == 2
    err = capsys.readouterr().err
    assert "deadlocks at rank 0, step 1 (0I0)" in err and "(1F1) that waits for 0F1" in err


# ---- the deadlock check against the schedule graph -------------------------------------------

@st.composite
def shuffled_orders(draw):
    """An order of p = 2 ranks (v = 1 or 2, looped or V placement), m <= 3, each rank's actions
    in a random order that keeps F before B (or F, I, W) of each stage and microbatch: valid
    for :class:`Schedule`, deadlocking or not."""
    v = draw(st.sampled_from([1, 2]))
    m = draw(st.integers(1, 3))
    placement = draw(st.sampled_from([(0, 1)] if v == 1 else [(0, 1, 0, 1), (0, 1, 1, 0)]))
    steps = []
    for r in range(2):
        chains = []
        for s in (s for s, q in enumerate(placement) if q == r):
            for j in range(m):
                split = draw(st.booleans())
                chains.append([Action(k, s, j) for k in (("F", "I", "W") if split else ("F", "B"))])
        row = []
        while any(chains):
            live = [c for c in chains if c]
            row.append((live[draw(st.integers(0, len(live) - 1))].pop(0),))
        steps.append(tuple(row))
    return Schedule("shuffled", 2, v, m, placement, tuple(steps))


@settings(max_examples=300, deadline=None)
@given(shuffled_orders())
def test_the_rank_simulation_agrees_with_the_schedule_graph(order):
    from pipeopt.schedules import schedule_graph

    verdicts = []
    for overlap in (False, True):
        try:
            schedule_graph(order, overlap=overlap)
            verdicts.append(None)
        except InvalidPlanError:
            verdicts.append("deadlock")
    blocked = torch_csv.first_blocked(order)
    assert verdicts == [None, None] if blocked is None else verdicts == ["deadlock", "deadlock"]
    if blocked is None:  # and a runnable order round-trips through the CSV
        assert read(torch_csv.to_csv(order), name="shuffled").steps == order.steps
