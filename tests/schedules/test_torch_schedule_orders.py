"""pipeopt's orders are torch's: for each of torch.distributed.pipelining's seven schedules,
p in {2, 4}, m in {4, 8} (and v = 3 for the looped ones), the order of ``pipeline_order``
(``_schedule_visualizer.get_schedule_ops``), torch's stage-to-rank mapping, and for the
single-stage schedules the order their runtime (``_step_microbatches``) really runs, recorded
with a mock stage. pipeopt's execution of torch's order equals that of its own."""

from __future__ import annotations

import math
import random
import warnings
from unittest import mock

import pytest

torch = pytest.importorskip("torch")
schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
visualizer = pytest.importorskip("torch.distributed.pipelining._schedule_visualizer")

from pipeopt.cost.passes import PassTimes  # noqa: E402
from pipeopt.errors import InvalidPlanError, InvalidProblemError  # noqa: E402
from pipeopt.schedules import GENERATORS, Action, Schedule, execute, make_schedule  # noqa: E402

KIND = {"F": "F", "B": "B", "I": "I", "W": "W"}  # torch _ComputationType values -> pipeopt kinds
SINGLE = ("GPipe", "1F1B")
CASES = [(name, p, m, None) for name in GENERATORS for p in (2, 4) for m in (4, 8)]
CASES += [(name, p, m, 3) for name in ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble")
          for p in (2, 4) for m in (4, 8)]


def torch_steps(name: str, p: int, m: int, v: int | None) -> list:
    """torch's compute order per rank as pipeopt steps: idle slots and REDUCE_GRAD dropped, an
    OVERLAP_F_B becomes one step of its sub-actions."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ops = visualizer.get_schedule_ops(name, p, m, num_stages_per_rank=v)
    out = []
    for rank in ops:
        steps = []
        for a in rank:
            if a is None or a.computation_type.value == "REDUCE_GRAD":
                continue
            subs = a.sub_actions if a.sub_actions is not None else (a,)
            steps.append(tuple(Action(KIND[x.computation_type.value], x.stage_index, x.microbatch_index)
                               for x in subs))
        out.append(tuple(steps))
    return out


def ours(name: str, p: int, m: int, v: int | None) -> Schedule:
    return make_schedule(name, p, m, v)


@pytest.mark.parametrize("name, p, m, v", CASES, ids=lambda x: str(x))
def test_orders_equal_torchs(name, p, m, v):
    try:
        theirs = torch_steps(name, p, m, v)
    except (ValueError, AssertionError) as exc:  # torch refuses (DualPipeV with m < 2p)
        with pytest.raises(InvalidProblemError):
            ours(name, p, m, v)
        assert name == "DualPipeV", exc
        return
    s = ours(name, p, m, v)
    if name == "1F1B" and list(s.steps) != theirs:
        # torch 2.13's Schedule1F1B._get_pipeline_order numbers the last rank's forwards 1..m
        # (microbatch m does not exist); its runtime runs 0..m-1 (test_single_stage_runtime)
        assert list(s.steps[:-1]) == theirs[:-1]
        shifted = tuple(tuple(a._replace(microbatch=a.microbatch + 1) if a.kind == "F" else a for a in st)
                        for st in s.steps[-1])
        assert shifted == theirs[-1]
        with pytest.raises(InvalidPlanError, match=f"runs {p - 1}B0 before its F"):
            Schedule("torch 1F1B IR", p, 1, m, s.placement, theirs)
        return
    assert list(s.steps) == theirs
    style = "v" if name in ("ZBVZeroBubble", "DualPipeV") else "loop"
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    mapping = generate_stage_to_rank_mapping(p, s.stages, style=style)
    assert s.placement == tuple(mapping[i] for i in range(s.stages))
    # pipeopt runs torch's order as its own, to the last action
    rng = random.Random(f"{name}{p}{m}{v}")
    S = s.stages
    i = [rng.random() for _ in range(S)]
    w = [rng.random() for _ in range(S)]
    times = PassTimes(tuple(rng.random() for _ in range(S)), tuple(a + b for a, b in zip(i, w, strict=True)),
                      tuple(i), tuple(w), tuple(rng.random() for _ in range(S - 1)),
                      tuple(rng.random() for _ in range(S - 1)), (1.0,) * S, (1.0,) * S, (math.inf,) * S)
    mine = execute(s, times)
    torchs = execute(Schedule(name, p, s.stages_per_rank, m, s.placement, theirs), times)
    assert mine.time == torchs.time and mine.action_times() == torchs.action_times()


def runtime_order(cls, p: int, m: int, rank: int) -> tuple:
    """The actions torch's single-stage runtime runs on ``rank``, recorded on a mock stage
    with communication switched off."""
    from torch.distributed.pipelining.stage import PipelineStage

    st = mock.create_autospec(PipelineStage, instance=True)
    st.group_rank, st.group_size, st.num_stages, st.stage_index = rank, p, p, rank
    st.submod = None
    st.is_first, st.is_last = rank == 0, rank == p - 1
    done = []
    st.forward_one_chunk.side_effect = lambda j, *a, **k: done.append((Action("F", rank, j),))
    st.backward_one_chunk.side_effect = lambda j, *a, **k: done.append((Action("B", rank, j),))
    sched = cls(st, m)
    sched._initialize_stage = lambda *a, **k: None
    with mock.patch.object(schedules, "_batch_p2p", lambda *a, **k: []), \
            mock.patch.object(schedules, "_sorted_batch_p2p", lambda *a, **k: {}), \
            mock.patch.object(schedules, "_wait_batch_p2p", lambda *a, **k: None):
        sched._step_microbatches([()] * m, [{}] * m)
    return tuple(done)


@pytest.mark.parametrize("name", SINGLE)
@pytest.mark.parametrize("p, m", [(2, 4), (2, 8), (4, 4), (4, 8)])
def test_single_stage_runtime_runs_pipeopts_order(name, p, m):
    cls = {"GPipe": schedules.ScheduleGPipe, "1F1B": schedules.Schedule1F1B}[name]
    needed = ("_batch_p2p", "_sorted_batch_p2p", "_wait_batch_p2p")
    if not all(hasattr(schedules, n) for n in needed) or not hasattr(cls, "_step_microbatches"):
        pytest.skip("this torch has no runtime internals to record")
    s = ours(name, p, m, None)
    for r in range(p):
        assert runtime_order(cls, p, m, r) == s.steps[r], (name, r)
