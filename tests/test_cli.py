"""The command line and the benchmark rows, end to end on real profiles."""

from __future__ import annotations

import json
import math

import pytest
from conftest import PROFILE_DIR

from pipeopt import bench
from pipeopt.cli import main, parse_bytes, parse_rate
from pipeopt.errors import ReadError


def test_solve_json(capsys):
    assert main(["solve", str(PROFILE_DIR / "vgg16.txt"), "--stages", "4", "--method", "dp", "--json",
                 "--time-limit", "none"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "optimal"
    assert out["objective"] == pytest.approx(out["lower_bound"])
    assert len(out["stages"]) == 4 and all(out["stages"])
    assert sum(len(s) for s in out["stages"]) == 41


def test_a_solve_stopped_before_any_plan_says_so(capsys):
    """A time limit reached before the first plan (the convex DP's deadline is checked before its
    first block of ideals, so a limit of a microsecond stops it there on any machine): the summary
    says no plan was found and why it stopped, never an objective of inf ms."""
    assert main(["solve", str(PROFILE_DIR / "resnet18.txt"), "--stages", "4", "--method", "convex",
                 "--time-limit", "0.000001"]) == 0
    first, *rest = capsys.readouterr().out.splitlines()[1:]
    assert first.startswith("convex: time_limit  no plan found within the time limit  bound ")
    assert "inf ms" not in first and "objective" not in first
    assert any(line.startswith("  stopped: time limit reached") for line in rest)


def test_solve_prints_stages_and_assumptions(capsys):
    assert main(["solve", str(PROFILE_DIR / "alexnet.txt"), "--stages", "2"]) == 0
    out = capsys.readouterr().out
    assert "stage 0" in out and "stage 1" in out and "assumed: bandwidth" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--stages", "99"], "more stages"),
        (["--stages", "4", "--memory", "1MiB"], "fits"),
        (["--stages", "4", "--method", "nope"], "unknown method"),
    ],
)
def test_solve_errors_are_clear(capsys, args, needle):
    assert main(["solve", str(PROFILE_DIR / "vgg16.txt"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeopt: error:") and needle in err


def test_unreadable_file(capsys, tmp_path):
    bad = tmp_path / "x.txt"
    bad.write_text("hello\n")
    assert main(["solve", str(bad)]) == 2
    assert "not a PipeDream node" in capsys.readouterr().err


def test_bench_skips_non_profiles_and_writes_rows(tmp_path, capsys):
    out = tmp_path / "rows.csv"
    code = main(
        ["bench", str(PROFILE_DIR / "LICENSE.txt"), str(PROFILE_DIR / "alexnet.txt"), "--stages", "2", "4",
         "--methods", "dp", "--replication", "--out", str(out), "--no-progress",
         "--time-limit", "86400"]  # a day: the proofs asserted below do not race the clock
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "skipped" in text and "alexnet" in text
    df = bench.load_rows(out)
    assert list(df.columns) == bench.COLUMNS
    assert set(df["stages"]) == {2, 4} and (df["status"] == "optimal").all()
    assert (df["gap"] < 1e-8).all()  # percent: the DP's bisection proves its bound to 1e-12 relative


def test_rows_round_trip_parquet(tmp_path):
    df = bench.run([PROFILE_DIR / "squeezenet1_0.txt"], stages=[2], methods=["dp"], progress=False)
    p = bench.save_rows(df, tmp_path / "rows.parquet")
    back = bench.load_rows(p)
    assert back["objective"].tolist() == df["objective"].tolist()
    with pytest.raises(ReadError):
        bench.load_rows(tmp_path / "missing.csv")


def test_unit_parsers():
    assert parse_bytes("16GiB") == 16 * 2**30
    assert parse_bytes("80e9") == 80e9
    assert parse_rate("100Gbit/s") == parse_rate("100Gbps") == 12.5e9
    assert parse_rate("1.25e10") == 1.25e10


def test_auto_problem_follows_the_cluster(capsys, tmp_path):
    from pathlib import Path

    inst_dir = Path(__file__).resolve().parent.parent / "instances"
    files = [inst_dir / "heterogeneous" / "alexnet-soc-mix8.json", inst_dir / "homogeneous" / "alexnet-a100-40gb-x4.json"]
    # no wall-clock limit: the comparison below needs CP-SAT's proof, which a loaded machine may not reach in 30 s
    df = bench.run(files, methods=["dp", "cpsat", "algorithm2"], time_limit=math.inf, progress=False)
    assert set(df["problem"]) == {"group", "partition"}
    group = df[df["problem"] == "group"]
    assert set(group["method"]) == {"cpsat", "algorithm2"} and (group["workers"] == 4).all()
    # the exact grouping is never worse than Algorithm 2, and both are scored by evaluate
    assert group.set_index("method").loc["cpsat", "objective"] <= group.set_index("method").loc["algorithm2", "objective"]
    assert main(["bench", str(files[0]), "--methods", "nope", "--no-progress", "--out", str(tmp_path / "x.csv")]) == 2
    assert "unknown method" in capsys.readouterr().err


def test_solve_picks_the_problem_and_an_exact_method(capsys):
    from pathlib import Path

    f = Path(__file__).resolve().parent.parent / "instances" / "heterogeneous" / "alexnet-soc-mix8.json"
    assert main(["solve", str(f), "--workers", "2", "--method", "cpsat", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    stages = out["plan"]["stages"]
    assert len(stages) == 2 and all(s["devices"] and s["beta"] for s in stages)
    assert sorted(d for s in stages for d in s["devices"]) == sorted(set(d for s in stages for d in s["devices"]))


def test_summary_counts_and_gaps():
    df = bench.run([PROFILE_DIR / "alexnet.txt"], stages=[2, 4], methods=["dp", "uniform"], progress=False,
                   time_limit=math.inf)
    s = bench.summary(df).set_index("method")
    assert s.loc["dp", "optimal"] == 2 and s.loc["dp", "max_gap_%"] == 0.0
    assert s.loc["uniform", "optimal"] == 0 and s.loc["uniform", "mean_gap_%"] >= 0.0
    # the uniform split's gap is its objective's distance to the DP optimum
    u = df[df["method"] == "uniform"].set_index("stages")["objective"]
    d = df[df["method"] == "dp"].set_index("stages")["objective"]
    expected = ((u - d) / u * 100).mean()
    assert abs(s.loc["uniform", "mean_gap_%"] - expected) < 0.01


def test_simulate_json_and_saved_plans(tmp_path, capsys):
    profile_path = str(PROFILE_DIR / "resnet18.txt")
    plan = tmp_path / "plan.json"
    assert main(["solve", profile_path, "--stages", "4", "--save-plan", str(plan)]) == 0
    capsys.readouterr()
    assert main(["simulate", profile_path, "--plan", str(plan), "--schedule", "1f1b", "--microbatches", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("iteration_time", "time_per_microbatch", "bubble_fraction", "utilisation", "peak_memory"):
        assert key in out
    assert len(out["utilisation"]) == len(out["peak_memory"]) == 4
    assert 0.0 <= out["bubble_fraction"] < 1.0
    # the simulated steady state is never faster than the analytic bottleneck
    assert out["time_per_microbatch"] >= out["bottleneck"] * (1 - 1e-9)
    png = tmp_path / "gantt.png"
    assert main(["show", profile_path, "--plan", str(plan), "--schedule", "gpipe", "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["simulate", profile_path, "--plan", str(bad)]) == 2
    assert "cannot read plan" in capsys.readouterr().err


def test_time_limit_none_means_no_limit_for_solve_and_is_refused_by_bench(capsys):
    from pipeopt.cli import build_parser

    assert build_parser().parse_args(["solve", "x.json", "--time-limit", "None"]).time_limit is None
    assert main(["bench", str(PROFILE_DIR / "alexnet.txt"), "--stages", "2", "--methods", "dp",
                 "--time-limit", "none", "--no-progress"]) == 2
    assert "finite --time-limit" in capsys.readouterr().err
