"""``pipeopt run`` exits non-zero and names the stages when the stages torch built are not the
plan's (e.g. a tied weight's layer built into two stages)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from pipeopt import cli  # noqa: E402
from pipeopt.torch.runtime import RunReport  # noqa: E402


def _report(stages, planned):
    return RunReport(schedule="1F1B", microbatches=2, iterations=1, warmup=0, stages=stages, planned=planned,
                     times=[0.01], barrier=0.0)


def test_report_names_the_differing_stages():
    same = _report([["a", "b"], ["c"]], [["b", "a"], ["c"]])
    assert same.membership_matches and same.differing_stages == [] and "membership = plan" in same.summary()
    tied = _report([["emb", "l0"], ["l1", "emb", "head"]], [["emb", "l0"], ["l1", "head"]])
    assert not tied.membership_matches and tied.differing_stages == [1]
    assert tied.membership_message() == "stage 1 also built emb"
    assert "DIFFERS from the plan: stage 1 also built emb" in tied.summary()
    assert tied.to_dict()["differing_stages"] == [1]
    fewer = _report([["a", "b", "c"]], [["a"], ["b", "c"]])
    assert fewer.differing_stages == [0, 1] and "stage 1 lacks b, c" in fewer.membership_message()


@pytest.mark.parametrize("built, code", [([["l0"], ["l1"]], 0), ([["l0"], ["l1", "l0"]], cli.RUN_DIFFERS)])
def test_run_exit_code(tmp_path, monkeypatch, capsys, built, code):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"stages": [{"layers": ["l0"]}, {"layers": ["l1"]}]}))
    import pipeopt.torch.runtime as runtime

    monkeypatch.setattr(runtime, "run_plan", lambda *a, **k: _report(built, [["l0"], ["l1"]]))
    assert cli.main(["run", str(plan), "--model", "gpt"]) == code
    err = capsys.readouterr().err
    assert ("stages built differ from the plan (stage 1 also built l0)" in err) == (code != 0)
