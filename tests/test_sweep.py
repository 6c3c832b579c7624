"""Sweeps past one process: ``bench --jobs N`` and ``bench --dask ADDRESS`` give the rows of a
sequential run in the same order; a failing task is an error row under every executor; a
sweep resumes from its partial CSV; bad flags are typed errors."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd
import pytest
import sweep_faulty

from pipeopt import bench, registry, rowlog, sweep
from pipeopt.cli import main
from pipeopt.errors import InvalidProblemError, MissingExtraError, ReadError

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "instances/homogeneous/alexnet-a100-40gb-x4.json",
         ROOT / "instances/homogeneous/resnet50-a100-40gb-x4.json",
         ROOT / "instances/heterogeneous/alexnet-server-mix4.json"]
# methods whose rows repeat exactly (threads pinned to 1; no time-limited search such as MCMC) and
# cheap enough for the budget (the group MILP is not), and boom
METHODS = ["dp", "cpsat", "binary_search", "pipedream", "uniform", "algorithm2", "round_robin", "boom"]
# no wall-clock limit: a solve cut short under load in one run and not in the other would differ
RUN = dict(methods=METHODS, stages=[2, 4], workers=[2], time_limit=math.inf, threads=1, progress=False)
TIMING = ["runtime"]


@pytest.fixture(scope="module")
def faulty():
    """boom and die known to the test process and (through the environment) to workers."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "METHODS", [*registry.METHODS, *sweep_faulty.METHODS])
        mp.setenv(sweep_faulty.ENV, "1")
        yield


@pytest.fixture(scope="module")
def sequential(faulty):
    return bench.run(FILES, **RUN)


def same_rows(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Every column but the timing ones equal, row by row (NaN = NaN)."""
    assert list(a.columns) == list(b.columns) == bench.COLUMNS
    assert len(a) == len(b)
    for col in a.columns:
        if col in TIMING:
            continue
        for i, (x, y) in enumerate(zip(a[col], b[col])):
            both_nan = isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)
            assert both_nan or x == y, f"row {i} ({a['instance'][i]} {a['method'][i]}) column {col}: {x!r} != {y!r}"


def test_sequential_rows_cover_the_tasks_and_boom_is_an_error_row(sequential):
    # 2 partition instances x S in {2, 4} x (6 methods + the replicated DP), the group instance x 3 methods
    assert len(sequential) == 2 * 2 * 7 + 3
    boom = sequential[sequential["method"] == "boom"]
    assert len(boom) == 4 and set(boom["status"]) == {"error"}
    assert boom["note"].str.startswith("ZeroDivisionError: boom").all()
    others = sequential[sequential["method"] != "boom"]
    assert set(others["status"]) <= {"optimal", "feasible"}, others[["method", "status", "note"]].to_string()


def test_jobs_rows_equal_sequential(sequential, tmp_path):
    out = tmp_path / "rows.csv"
    rows = bench.run(FILES, **RUN, jobs=2, out=out)
    same_rows(sequential, rows)
    same_rows(rows, bench.load_rows(out))  # the final file: every row, in task order


def test_dask_rows_equal_sequential_and_a_dead_worker_is_an_error_row(sequential):
    distributed = pytest.importorskip("distributed")
    import dask

    # every task sent to a worker at once (no queuing on the scheduler), so the tasks queued with
    # `die` die with its worker and must be rerun alone; a task fails at its first worker death
    # (so the test waits for one restart per death, not four)
    config = {"distributed.scheduler.worker-saturation": "inf", "distributed.scheduler.allowed-failures": 0}
    with dask.config.set(config), distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                                         dashboard_address=None) as cluster:
        rows = bench.run(FILES, **RUN, dask=cluster.scheduler_address)
        same_rows(sequential, rows)
        crash = bench.run(FILES[:1], **dict(RUN, methods=["binary_search", "uniform", "die"], stages=[4], workers=None),
                          dask=cluster.scheduler_address)
    assert list(crash["method"]) == ["binary_search", "uniform", "die"]
    assert list(crash["status"]) == ["feasible", "feasible", "error"]
    assert "KilledWorker" in crash["note"][2] and "also when run alone" in crash["note"][2]


def test_a_worker_that_dies_is_an_error_row_and_the_sweep_goes_on(faulty):
    one = dict(RUN, methods=["binary_search", "uniform", "die"], stages=[4], workers=None)
    rows = bench.run(FILES[:1], **one, jobs=2)
    assert list(rows["method"]) == ["binary_search", "uniform", "die"]  # the registry's order
    died = rows.iloc[2]
    assert died["status"] == "error" and "died" in died["note"] and math.isnan(died["runtime"])
    assert list(rows["status"][:2]) == ["feasible", "feasible"]


def test_resume_keeps_the_rows_of_the_partial_csv(faulty, tmp_path, monkeypatch):
    run = dict(RUN, methods=["dp", "binary_search", "uniform", "boom", "round_robin"])
    out = tmp_path / "rows.csv"
    full = bench.run(FILES, **run, out=out)
    lines = out.read_text().splitlines(keepends=True)
    half = 1 + len(full) // 2
    out.write_text("".join(lines[:half]) + lines[half][:17])  # a sweep killed while writing a line
    calls = []
    solve_row = bench._row
    monkeypatch.setattr(bench, "_row", lambda *a, **k: calls.append(a[3].name) or solve_row(*a, **k))
    resumed = bench.run(FILES, **run, out=out, resume=True)
    assert len(calls) == len(full) - (half - 1)  # only the missing rows were solved
    same_rows(full, resumed)
    kept = pd.read_csv(out).head(half - 1)
    assert list(kept["runtime"]) == list(full["runtime"].head(half - 1))  # the first half: not recomputed
    calls.clear()
    again = bench.run(FILES, **run, out=out, resume=True)  # a finished sweep: nothing to do
    assert calls == []
    same_rows(full, again)


def test_resume_refuses_rows_of_another_sweep(tmp_path):
    out = tmp_path / "rows.csv"
    bench.run(FILES[:1], methods=["uniform"], stages=[2], progress=False, out=out)
    with pytest.raises(InvalidProblemError, match="no task of this sweep"):
        bench.run(FILES[:1], methods=["binary_search"], stages=[2], progress=False, out=out, resume=True)
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ReadError, match="lacks benchmark columns"):
        bench.run(FILES[:1], methods=["uniform"], stages=[2], progress=False, out=tmp_path / "other.csv", resume=True)


def test_rowlog_appends_flushed_lines(tmp_path):
    path = tmp_path / "log.csv"
    with rowlog.RowLog(path, bench.COLUMNS) as log:
        log.append({"instance": "a", "status": "error", "note": "x, \"quoted\"\nnewline", "stages": 2})
        assert len(bench.load_rows(path)) == 1  # readable while the sweep runs
    back = bench.load_rows(path)
    assert back["note"][0] == "x, \"quoted\"\nnewline" and back["stages"][0] == 2


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(jobs=0), InvalidProblemError, "jobs"),
    (dict(jobs=2.5), InvalidProblemError, "jobs"),
    (dict(jobs=True), InvalidProblemError, "jobs"),
    (dict(threads=0), InvalidProblemError, "threads"),
    (dict(dask=""), InvalidProblemError, "dask"),
    (dict(dask="tcp://127.0.0.1:8786", jobs=2), InvalidProblemError, "drop jobs"),
    (dict(resume=True), InvalidProblemError, "resume needs"),
    (dict(resume=True, out="rows.parquet"), InvalidProblemError, "resume needs"),
])
def test_bad_sweep_options_are_typed_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        bench.run(FILES[:1], methods=["uniform"], stages=[2], progress=False, **kwargs)


def test_dask_missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    with pytest.raises(MissingExtraError, match=r'pip install "pipeopt\[dask\]"'):
        sweep.executor(dask="local")


@pytest.mark.parametrize("argv, message", [
    (["--jobs", "0"], "--jobs must be in 1..1024"),
    (["--jobs", "two"], "--jobs must be an integer"),
    (["--resume", "--out", "@tmp/rows.parquet"], "resume needs"),
])
def test_bad_flags_exit_2(argv, message, tmp_path, capsys):
    argv = [a.replace("@tmp", str(tmp_path)) for a in argv]
    code = main(["bench", str(FILES[0]), "--methods", "uniform", "--stages", "2", "--no-progress",
                 "--out", str(tmp_path / "o.csv"), *argv])
    assert code == 2
    assert message in capsys.readouterr().err


def test_cli_dask_missing_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)
    code = main(["bench", str(FILES[0]), "--methods", "uniform", "--no-progress", "--out", str(tmp_path / "o.csv"),
                 "--dask", "local"])
    assert code == 2
    assert 'pip install "pipeopt[dask]"' in capsys.readouterr().err


def test_cli_resume(tmp_path, capsys):
    out = tmp_path / "rows.csv"
    argv = ["bench", str(FILES[0]), "--methods", "uniform", "binary_search", "--stages", "2", "4", "--no-progress",
            "--out", str(out)]
    assert main(argv) == 0
    first = bench.load_rows(out)
    out.write_text("".join(out.read_text().splitlines(keepends=True)[:2]))  # header + one row
    assert main([*argv, "--resume"]) == 0
    same_rows(first, bench.load_rows(out))
    assert bench.load_rows(out)["runtime"][0] == first["runtime"][0]
