"""Bad input gets a clear, typed error: through the CLI (exit 2, one ``error:`` line, never a
traceback) and through the Python API (a :class:`pipeopt.errors.PipeoptError` subclass naming
the problem)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import networkx as nx
import pytest
from conftest import PROFILE_DIR
from strategies import chain_graph

import pipeopt
import pipeopt.simulate
from pipeopt import Cluster, Device, Instance, Plan, Settings, Stage, evaluate, solve
from pipeopt import bench
from pipeopt.cli import main
from pipeopt.errors import (
    InvalidClusterError,
    InvalidGraphError,
    InvalidPlanError,
    InvalidProblemError,
    InvalidUnitError,
    PipeoptError,
    ReadError,
)
from pipeopt.io import from_dict, native, read, read_pipedream
from pipeopt.io.dnn_partitioning import read_dnn_partitioning
from pipeopt.units import MAX_BYTES, MAX_SECONDS

ALEXNET = PROFILE_DIR / "alexnet.txt"
DNN = PROFILE_DIR.parent / "dnn-partitioning" / "latency-inputs" / "OperatorGraphs" / "bert_l-3_inference.json"


# ---- small instances ------------------------------------------------------------------------
def chain(n: int = 4, **attrs) -> nx.DiGraph:
    """n layers of 10 / 20 ms and 1 MB each; ``attrs`` (node attributes, valid or not) override
    them on every layer."""
    return chain_graph([0.01] * n, 0.02, 1e6, 1e6, 1e6, attrs=attrs)


def homogeneous(n: int = 4, **attrs) -> Instance:
    return Instance(chain(n, **attrs), Cluster.homogeneous(4, memory=1e10), name="tiny")


def heterogeneous() -> Instance:
    g = chain(4, fwd={"gpu": 0.01, "cpu": 0.05}, bwd={"gpu": 0.02, "cpu": 0.1})
    devices = (Device("a", {"gpu": 1, "cpu": 2}), Device("b", {"cpu": 4}), Device("c", {"gpu": 2}))
    return Instance(g, Cluster(devices, 1e10), name="mixed")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Instance, plan and junk files the CLI cases read (names -> paths)."""
    d = tmp_path_factory.mktemp("bad")
    out = {"part": native.write_instance(homogeneous(), d / "part.json"),
           "group": native.write_instance(heterogeneous(), d / "group.json")}

    def mutated(name, mutate):
        data = native.to_dict(homogeneous())
        mutate(data)
        path = d / f"{name}.json"
        path.write_text(json.dumps(data))
        out[name] = path

    def set_node(key, value):
        def mutate(data):
            for node in data["graph"]["nodes"]:
                node[key] = value
        return mutate

    mutated("huge_time", set_node("fwd", {"gpu": 1e308}))
    mutated("huge_bytes", set_node("act_bytes", 3e18))
    mutated("huge_memory", lambda data: [dev.update(memory=1e19) for dev in data["cluster"]["devices"]])
    mutated("bad_bandwidth", lambda data: data["cluster"].update(bandwidth="10G"))
    for name, text in {
        "list": "[1, 2]",
        "plan_list": "[1, 2]",
        "plan_no_layers": json.dumps({"stages": [{"devices": ["gpu0"]}]}),
        "plan_unknown_layer": json.dumps({"stages": [{"layers": ["zz"], "devices": ["gpu0"]}]}),
        "plan_bad_json": '{"stages": [',
        "junk": "hello\n",
    }.items():
        out[name] = d / f"{name}.{'txt' if name == 'junk' else 'json'}"
        out[name].write_text(text)
    (d / "empty_dir").mkdir()
    (d / "junk_dir").mkdir()
    (d / "junk_dir" / "x.txt").write_text("hello\n")
    out["empty_dir"], out["junk_dir"] = d / "empty_dir", d / "junk_dir"
    out["a_file"] = d / "part.json"  # a file used as a folder makes any path under it unwritable
    out["tmp"] = d
    return out


def _args(template: list[str], files) -> list[str]:
    out = []
    for a in template:
        if a.startswith("@"):
            key, _, rest = a[1:].partition("/")
            a = str(files[key]) + (f"/{rest}" if rest else "")
        out.append(a)
    return out


# ---- the CLI: exit 2, an error line, no traceback ------------------------------------------
CLI_CASES = {
    # counts: zero, negative, absurd, not integers
    "stages 0": (["solve", "@part", "--stages", "0"], "--stages"),
    "stages negative": (["solve", "@part", "--stages", "-1"], "--stages"),
    "stages absurd": (["solve", "@part", "--stages", "1000000000"], "--stages"),
    "stages absurd on a profile": (["solve", str(ALEXNET), "--stages", "1000000000"], "--stages"),
    "stages above layers": (["solve", "@part", "--stages", "99"], "more stages"),
    "stages float": (["solve", "@part", "--stages", "2.5"], "integer"),
    "stages word": (["solve", "@part", "--stages", "two"], "integer"),
    "workers 0": (["solve", "@group", "--problem", "group", "--workers", "0"], "--workers"),
    "workers negative": (["solve", "@group", "--problem", "group", "--workers", "-3"], "--workers"),
    "workers absurd": (["solve", "@group", "--problem", "group", "--workers", "1000000000"], "--workers"),
    # an option the problem does not use
    "stages in group": (["solve", "@group", "--problem", "group", "--stages", "2"], "does not use --stages"),
    "workers in partition": (["solve", "@part", "--stages", "2", "--workers", "2"], "does not use --workers"),
    "replication in group": (["solve", "@group", "--problem", "group", "--replication"], "does not use --replication"),
    "stages in simulate group": (["simulate", "@group", "--problem", "group", "--stages", "2"], "does not use"),
    # time limits
    "time nan cpsat": (["solve", "@part", "--stages", "2", "--method", "cpsat", "--time-limit", "nan"], "time limit"),
    "time inf": (["solve", "@part", "--stages", "2", "--time-limit", "inf"], "time limit"),
    "time negative": (["solve", "@part", "--stages", "2", "--time-limit", "-1"], "time limit"),
    "time zero": (["solve", "@part", "--stages", "2", "--time-limit", "0"], "time limit"),
    "time word": (["solve", "@part", "--stages", "2", "--time-limit", "soon"], "time limit"),
    # units
    "bandwidth 10G": (["solve", "@part", "--stages", "2", "--bandwidth", "10G"], "Gbps"),
    "bandwidth words": (["solve", "@part", "--stages", "2", "--bandwidth", "10 gigs"], "not a bandwidth"),
    "bandwidth GBps": (["solve", "@part", "--stages", "2", "--bandwidth", "10GBps"], "not a bandwidth"),
    "bandwidth negative": (["solve", "@part", "--stages", "2", "--bandwidth", "-1"], "positive"),
    "bandwidth zero": (["solve", "@part", "--stages", "2", "--bandwidth", "0"], "positive"),
    "bandwidth nan": (["solve", "@part", "--stages", "2", "--bandwidth", "nan"], "positive"),
    "bandwidth overflowing": (["solve", "@part", "--stages", "2", "--bandwidth", "1e999"], "positive"),
    "memory 16G": (["solve", "@part", "--stages", "2", "--memory", "16G"], "GiB"),
    "memory bits": (["solve", "@part", "--stages", "2", "--memory", "16Gb"], "not a memory size"),
    "memory zero": (["solve", "@part", "--stages", "2", "--memory", "0"], "positive"),
    "memory negative": (["solve", "@part", "--stages", "2", "--memory", "-5"], "positive"),
    "memory nan": (["solve", "@part", "--stages", "2", "--memory", "nan"], "positive"),
    "memory absurd": (["solve", "@part", "--stages", "2", "--memory", "1e19"], "maximum"),
    "memory too small": (["solve", "@part", "--stages", "2", "--memory", "1MiB"], "fits"),
    "seed negative": (["solve", "@part", "--stages", "2", "--seed", "-1"], "seed"),
    "seed word": (["solve", "@part", "--stages", "2", "--seed", "x"], "seed"),
    # names
    "method unknown": (["solve", "@part", "--stages", "2", "--method", "nope"], "unknown method"),
    "method of another problem": (["solve", "@part", "--stages", "2", "--method", "algorithm2"], "unknown method"),
    "problem unknown": (["solve", "@part", "--problem", "nope"], "invalid choice"),
    # files
    "file missing": (["solve", "@tmp/nope.json"], "no such file"),
    "file is a JSON list": (["solve", "@list", "--stages", "2"], "neither"),
    "file is junk": (["solve", "@junk"], "not a PipeDream"),
    "layer time 1e308": (["solve", "@huge_time", "--stages", "2"], "maximum"),
    "bytes 3e18 under cpsat": (["solve", "@huge_bytes", "--stages", "2", "--method", "cpsat"], "3e+18"),
    "memory 1e19 in the file": (["solve", "@huge_memory", "--stages", "2", "--method", "cpsat"], "1e+19"),
    "bandwidth 10G in the file": (["solve", "@bad_bandwidth", "--stages", "2"], "cluster.bandwidth"),
    "save-plan unwritable": (["solve", "@part", "--stages", "2", "--save-plan", "@a_file/p.json"], "cannot write"),
    # simulate / show
    "microbatches 0": (["simulate", "@part", "--stages", "2", "--microbatches", "0"], "microbatches"),
    "microbatches negative": (["simulate", "@part", "--stages", "2", "--microbatches", "-3"], "microbatches"),
    "microbatches absurd": (["simulate", "@part", "--stages", "2", "--microbatches", "1000000000"], "microbatches"),
    "plan is a JSON list": (["simulate", "@part", "--plan", "@plan_list"], "'stages' list"),
    "plan stage without layers": (["simulate", "@part", "--plan", "@plan_no_layers"], "no 'layers'"),
    "plan unknown layer": (["simulate", "@part", "--plan", "@plan_unknown_layer"], "unknown layer"),
    "plan invalid JSON": (["simulate", "@part", "--plan", "@plan_bad_json"], "cannot read plan"),
    "plan missing": (["simulate", "@part", "--plan", "@tmp/nope.json"], "cannot read plan"),
    "gantt unwritable": (["simulate", "@part", "--stages", "2", "--gantt", "@a_file/g.png"], "cannot write"),
    "show out unwritable": (["show", "@part", "--stages", "2", "--out", "@a_file/p.png"], "cannot write"),
    "show out is a folder": (["show", "@part", "--stages", "2", "--out", "@tmp"], "folder"),
    "show microbatches 0": (["show", "@part", "--stages", "2", "--microbatches", "0"], "microbatches"),
    # bench
    "bench empty dir": (["bench", "@empty_dir", "--no-progress", "--out", "@tmp/o.csv"], "no instance file"),
    "bench missing path": (["bench", "@tmp/nope", "--no-progress", "--out", "@tmp/o.csv"], "no such file"),
    "bench nothing readable": (["bench", "@junk_dir", "--no-progress", "--out", "@tmp/o.csv"], "no instance could be read"),
    "bench every size skipped": (["bench", "@part", "--stages", "99", "--methods", "dp", "--no-progress", "--out", "@tmp/o.csv"],
                                 "no rows"),
    "bench stages 0": (["bench", "@part", "--stages", "0", "--no-progress", "--out", "@tmp/o.csv"], "--stages"),
    "bench workers 0": (["bench", "@group", "--workers", "2", "0", "--no-progress", "--out", "@tmp/o.csv"], "--workers"),
    "bench stages in group": (["bench", "@group", "--problem", "group", "--stages", "2", "--no-progress", "--out", "@tmp/o.csv"],
                              "does not use stages"),
    "bench workers on partition only": (["bench", "@part", "--workers", "2", "--no-progress", "--out", "@tmp/o.csv"],
                                        "does not use workers"),
    "bench out unwritable": (["bench", "@part", "--stages", "2", "--methods", "dp", "--no-progress", "--out", "@a_file/o.csv"],
                             "cannot write"),
    "bench time nan": (["bench", "@part", "--time-limit", "nan", "--no-progress", "--out", "@tmp/o.csv"], "time limit"),
    "bench method unknown": (["bench", "@part", "--methods", "nope", "--no-progress", "--out", "@tmp/o.csv"], "unknown method"),
    "zoo out unwritable": (["zoo", "--out", "@a_file/zoo"], "cannot write"),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_cli_rejects(case, files, capsys):
    argv, needle = CLI_CASES[case]
    code = main(_args(argv, files))
    captured = capsys.readouterr()
    assert code == 2, (case, captured.out[-300:], captured.err[-600:])
    lines = [line for line in captured.err.splitlines() if "error:" in line]
    assert lines, captured.err
    assert "Traceback" not in captured.err + captured.out
    assert needle in captured.err, captured.err


def test_cli_accepts_bits_and_bytes(files, capsys):
    """10Gbps is read as 1.25e9 B/s, not 1e10: a tighter link makes a cut dearer."""
    part = str(files["part"])
    assert main(["solve", part, "--stages", "2", "--bandwidth", "8Mbps", "--json"]) == 0
    bits = json.loads(capsys.readouterr().out)
    assert main(["solve", part, "--stages", "2", "--bandwidth", "1MB/s", "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert bits["objective"] == pytest.approx(same["objective"])  # 8 Mbit/s = 1 MB/s
    assert main(["solve", part, "--stages", "2", "--bandwidth", "8MB/s", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["objective"] < bits["objective"]


def test_bench_walks_directories(files, tmp_path, capsys):
    folder = tmp_path / "instances"
    (folder / "sub").mkdir(parents=True)
    native.write_instance(heterogeneous(), folder / "sub" / "mixed.json")
    native.write_instance(homogeneous(), folder / "tiny.json")
    (folder / "README.md").write_text("# not an instance\n")
    (folder / "LICENSE.txt").write_text("MIT\n")
    out = tmp_path / "rows.csv"
    code = main(["bench", str(folder), "--problem", "group", "--workers", "2", "--methods", "algorithm2",
                 "--no-progress", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = bench.load_rows(out)
    assert sorted(set(rows["instance"])) == ["mixed", "tiny"] and set(rows["workers"]) == {2}
    assert bench.expand_paths([folder]) == [folder / "sub" / "mixed.json", folder / "tiny.json"]


def test_auto_problem_notes_an_option_some_instances_do_not_use(files, tmp_path, capsys):
    code = main(["bench", str(files["part"]), str(files["group"]), "--stages", "2", "--methods", "dp", "algorithm2",
                 "--no-progress", "--out", str(tmp_path / "o.csv")])
    out = capsys.readouterr().out
    assert code == 0
    assert "note: stages not used by the group problem on mixed" in out


def test_unexpected_exception_is_one_line_naming_a_bug(files, capsys, monkeypatch):
    import pipeopt.cli as cli

    def boom(args):
        raise RuntimeError("something inside broke\nsecond line")

    monkeypatch.setattr(cli, "cmd_solve", boom)
    assert main(["solve", str(files["part"])]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "bug" in err and "RuntimeError: something inside broke" in err
    assert main(["solve", str(files["part"]), "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_usage_and_help_exit_codes(capsys):
    assert main(["solve"]) == 2  # missing path: argparse's usage error, returned, not raised
    assert main(["--help"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("command", [["solve", str(ALEXNET), "--stages", "4", "--json"],
                                     ["bench", str(ALEXNET), "--stages", "2", "--methods", "dp", "--no-progress"]])
def test_broken_pipe_exits_quietly(command, tmp_path):
    """``pipeopt ... | head -1``: the reader goes away; no traceback, exit 0."""
    if command[0] == "bench":
        command = [*command, "--out", str(tmp_path / "rows.csv")]
    code = "import sys; from pipeopt.cli import main; sys.exit(main())"
    proc = subprocess.Popen([sys.executable, "-c", code, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # nobody reads: the first write breaks the pipe
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "Error" not in err, err
    if command[0] == "bench":
        assert (tmp_path / "rows.csv").exists()  # rows are written before the table is printed


# ---- the API: PipeoptError subclasses naming the problem -----------------------------------
def _cycle() -> nx.DiGraph:
    g = chain()
    g.add_edge("l3", "l0")
    return g


def _missing() -> nx.DiGraph:
    g = chain()
    del g.nodes["l1"]["act_bytes"]
    return g


def _multi() -> nx.MultiDiGraph:
    return nx.MultiDiGraph(chain())


C = Cluster.homogeneous(4, memory=1e10)
I = homogeneous()

API_CASES = {
    # graph
    "graph is a list": (lambda: Instance([1, 2], C), InvalidGraphError, "DiGraph"),
    "graph is a multigraph": (lambda: Instance(_multi(), C), InvalidGraphError, "DiGraph"),
    "graph empty": (lambda: Instance(nx.DiGraph(), C), InvalidGraphError, "no layers"),
    "graph cycle": (lambda: Instance(_cycle(), C), InvalidGraphError, "cycle"),
    "attribute missing": (lambda: Instance(_missing(), C), InvalidGraphError, "act_bytes"),
    "time nan": (lambda: Instance(chain(fwd={"gpu": math.nan}), C), InvalidGraphError, "nan"),
    "time negative": (lambda: Instance(chain(fwd={"gpu": -1.0}), C), InvalidGraphError, "negative"),
    "time 1e308": (lambda: Instance(chain(fwd={"gpu": 1e308}, bwd={"gpu": 1e308}), C), InvalidGraphError, "maximum"),
    "time above max": (lambda: Instance(chain(bwd={"gpu": MAX_SECONDS * 2}), C), InvalidGraphError, "maximum"),
    "time string": (lambda: Instance(chain(fwd={"gpu": "1"}), C), InvalidGraphError, "'1'"),
    "time bool": (lambda: Instance(chain(fwd={"gpu": True}, bwd={"gpu": True}), C), InvalidGraphError, "True"),
    "fwd a list": (lambda: Instance(chain(fwd=[0.1]), C), InvalidGraphError, "dict"),
    "bytes 3e18": (lambda: Instance(chain(act_bytes=3e18), C), InvalidGraphError, "3e+18"),
    "bytes add up above max": (lambda: Instance(chain(6, param_bytes=MAX_BYTES / 4), C), InvalidGraphError, "add up"),
    "bytes nan": (lambda: Instance(chain(param_bytes=math.nan), C), InvalidGraphError, "param_bytes"),
    "bytes string": (lambda: Instance(chain(out_bytes="1e6"), C), InvalidGraphError, "out_bytes"),
    "no kind of the cluster": (lambda: Instance(chain(fwd={"tpu": 1.0}, bwd={"tpu": 1.0}), C), InvalidClusterError, "tpu"),
    # instance fields
    "cluster None": (lambda: Instance(chain(), None), InvalidClusterError, "Cluster"),
    "cluster a string": (lambda: Instance(chain(), "4xA100"), InvalidClusterError, "Cluster"),
    "settings a dict": (lambda: Instance(chain(), C, settings={"overlap": True}), InvalidProblemError, "Settings"),
    "name an int": (lambda: Instance(chain(), C, name=3), InvalidProblemError, "name"),
    "assumptions a string": (lambda: Instance(chain(), C, assumptions="abc"), InvalidProblemError, "assumptions"),
    "replace unknown field": (lambda: I.replace(bogus=1), InvalidProblemError, "bogus"),
    "with_settings unknown field": (lambda: I.with_settings(bogus=1), InvalidProblemError, "bogus"),
    # settings
    "microbatches 0": (lambda: Settings(microbatches=0), InvalidProblemError, "microbatches"),
    "microbatches float": (lambda: Settings(microbatches=2.0), InvalidProblemError, "microbatches"),
    "microbatches bool": (lambda: Settings(microbatches=True), InvalidProblemError, "microbatches"),
    "microbatches absurd": (lambda: Settings(microbatches=10**12), InvalidProblemError, "microbatches"),
    "overlap a string": (lambda: Settings(overlap="no"), InvalidProblemError, "overlap"),
    "objective unknown": (lambda: Settings(objective="fast"), InvalidProblemError, "objective"),
    "objective a list": (lambda: Settings(objective=["bottleneck"]), InvalidProblemError, "objective"),
    # cluster and devices
    "cluster empty": (lambda: Cluster(()), InvalidClusterError, "no devices"),
    "cluster devices None": (lambda: Cluster(None), InvalidClusterError, "sequence"),
    "cluster of dicts": (lambda: Cluster([{"name": "a"}]), InvalidClusterError, "Device"),
    "duplicate device names": (lambda: Cluster([Device("a", {"gpu": 1})] * 2), InvalidClusterError, "duplicate"),
    "bandwidth zero": (lambda: Cluster.homogeneous(2, bandwidth=0), InvalidUnitError, "bandwidth"),
    "bandwidth -inf": (lambda: Cluster.homogeneous(2, bandwidth=-math.inf), InvalidUnitError, "bandwidth"),
    "bandwidth None": (lambda: Cluster.homogeneous(2, bandwidth=None), InvalidUnitError, "bandwidth"),
    "bandwidth 10G": (lambda: Cluster.homogeneous(2, bandwidth="10G"), InvalidUnitError, "Gbps"),
    "homogeneous 1e9 devices": (lambda: Cluster.homogeneous(10**9), InvalidClusterError, "1000000000"),
    "homogeneous 0 devices": (lambda: Cluster.homogeneous(0), InvalidClusterError, "devices"),
    "homogeneous float count": (lambda: Cluster.homogeneous(2.0), InvalidClusterError, "integer"),
    "homogeneous string count": (lambda: Cluster.homogeneous("4"), InvalidClusterError, "integer"),
    "memory negative": (lambda: Device("a", {"gpu": 1}, -1), InvalidClusterError, "memory"),
    "memory 16G": (lambda: Device("a", {"gpu": 1}, "16G"), InvalidClusterError, "16G"),
    "memory 1e19": (lambda: Device("a", {"gpu": 1}, 1e19), InvalidClusterError, "maximum"),
    "memory nan": (lambda: Device("a", {"gpu": 1}, math.nan), InvalidClusterError, "memory"),
    "resources None": (lambda: Device("a", None), InvalidClusterError, "resources"),
    "resources empty": (lambda: Device("a", {}), InvalidClusterError, "no resources"),
    "resources a string amount": (lambda: Device("a", {"gpu": "1"}), InvalidClusterError, "'1'"),
    "device name an int": (lambda: Device(3, {"gpu": 1}), InvalidClusterError, "name"),
    # solve
    "solve unknown problem": (lambda: solve(I, problem="nope", stages=2), InvalidProblemError, "nope"),
    "solve unknown method": (lambda: solve(I, method="nope", stages=2), InvalidProblemError, "nope"),
    "solve problem None": (lambda: solve(I, problem=None, stages=2), InvalidProblemError, "None"),
    "solve unknown option": (lambda: solve(I, stages=2, foo=1), InvalidProblemError, "foo"),
    "solve stages float": (lambda: solve(I, stages=2.0), InvalidProblemError, "stages"),
    "solve stages bool": (lambda: solve(I, stages=True), InvalidProblemError, "stages"),
    "solve stages string": (lambda: solve(I, stages="2"), InvalidProblemError, "stages"),
    "solve stages None": (lambda: solve(I, stages=None), InvalidProblemError, "stages"),
    "solve stages 0": (lambda: solve(I, stages=0), InvalidProblemError, "stages"),
    "solve stages negative": (lambda: solve(I, stages=-2), InvalidProblemError, "stages"),
    "solve stages absurd": (lambda: solve(I, stages=10**9), InvalidProblemError, "more stages"),
    "solve instance None": (lambda: solve(None, stages=2), InvalidProblemError, "Instance"),
    "solve instance a path": (lambda: solve("x.json", stages=2), InvalidProblemError, "Instance"),
    "solve time limit nan": (lambda: solve(I, stages=2, method="cpsat", time_limit=math.nan), InvalidProblemError, "time limit"),
    "solve time limit string": (lambda: solve(I, stages=2, method="milp", time_limit="1"), InvalidProblemError, "time limit"),
    "solve time limit negative": (lambda: solve(I, stages=2, time_limit=-1), InvalidProblemError, "time limit"),
    "solve solver unknown": (lambda: solve(I, stages=2, method="milp", solver="gurobi"), InvalidProblemError, "gurobi"),
    "solve seed a string": (lambda: solve(I, stages=2, method="mcmc", seed="x"), InvalidProblemError, "seed"),
    "group workers 0": (lambda: solve(heterogeneous(), problem="group", method="algorithm2", workers=0),
                        InvalidProblemError, "workers"),
    "group with stages": (lambda: solve(heterogeneous(), problem="group", method="algorithm2", stages=2),
                          InvalidProblemError, "stages"),
    "bytes overflow under cpsat": (lambda: solve(Instance(chain(act_bytes=3e18), Cluster.homogeneous(4, memory=1e19)),
                                                 stages=2, method="cpsat"), PipeoptError, "e+1"),
    # plans
    "stage layers a string": (lambda: Stage("l0"), InvalidPlanError, "layers"),
    "stage devices a string": (lambda: Stage(("l0",), "gpu0"), InvalidPlanError, "devices"),
    "stage replicas 0": (lambda: Stage(("l0",), replicas=0), InvalidPlanError, "replicas"),
    "stage replicas float": (lambda: Stage(("l0",), replicas=1.5), InvalidPlanError, "replicas"),
    "stage beta a list": (lambda: Stage(("l0",), beta=[0.5]), InvalidPlanError, "beta"),
    "plan of tuples": (lambda: Plan([("l0",)]), InvalidPlanError, "Stage"),
    "plan None": (lambda: Plan(None), InvalidPlanError, "stages"),
    "plan from a list": (lambda: Plan.from_dict([1]), InvalidPlanError, "'stages' list"),
    "plan stage without layers": (lambda: Plan.from_dict({"stages": [{}]}), InvalidPlanError, "stage 0"),
    "plan stage unknown field": (lambda: Plan.from_dict({"stages": [{"layers": ["l0"], "layer": 1}]}), InvalidPlanError,
                                 "layer"),
    "evaluate unknown layer": (lambda: evaluate(I, Plan((Stage(("x",), ("gpu0",)),))), InvalidPlanError, "'x'"),
    "evaluate dropped layers": (lambda: evaluate(I, Plan((Stage(("l0",), ("gpu0",)),))), InvalidPlanError, "dropped"),
    "evaluate unknown device": (lambda: evaluate(I, Plan((Stage(("l0", "l1", "l2", "l3"), ("zz",)),))), InvalidPlanError,
                                "'zz'"),
    "evaluate share above 1": (lambda: evaluate(I, Plan((Stage(("l0", "l1", "l2", "l3"), ("gpu0",), beta={"gpu": 2.0}),))),
                               InvalidPlanError, "[0, 1]"),
    # readers
    "read missing file": (lambda: read("/nonexistent/x.json"), ReadError, "x.json"),
    "from_dict a list": (lambda: from_dict([1]), ReadError, "JSON object"),
    "read_pipedream 1e9 devices": (lambda: read_pipedream(ALEXNET, devices=10**9), InvalidClusterError, "devices"),
    "read_pipedream bandwidth 10G": (lambda: read_pipedream(ALEXNET, bandwidth="10G"), InvalidUnitError, "10G"),
    "read_pipedream memory 16G": (lambda: read_pipedream(ALEXNET, memory="16G"), InvalidUnitError, "16G"),
    "read_pipedream path None": (lambda: read_pipedream(None), ReadError, "None"),
    "read path None": (lambda: read(None), ReadError, "None"),
    "read path an int": (lambda: read(3), ReadError, "int"),
    "read a directory": (lambda: read(PROFILE_DIR), ReadError, "cannot read"),
    "read option of another format": (lambda: read(ALEXNET, accelerators=2), ReadError, "accelerators"),
    "dnn accelerators negative": (lambda: read_dnn_partitioning(DNN, accelerators=-1), ReadError, "accelerators"),
    "dnn cpus absurd": (lambda: read_dnn_partitioning(DNN, cpus=10**9), ReadError, "cpus"),
    "dnn no devices": (lambda: read_dnn_partitioning(DNN, accelerators=0, cpus=0), ReadError,
                       "no device (maxFPGAs = maxCPUs = 0)"),
    "cluster.device unknown": (lambda: I.cluster.device("zz"), InvalidClusterError, "'zz'"),
    # bench
    "bench stages [0]": (lambda: bench.run([I], stages=[0], progress=False), InvalidProblemError, "stages"),
    "bench stages an int": (lambda: bench.run([I], stages=2, progress=False), InvalidProblemError, "list"),
    "bench stages empty": (lambda: bench.run([I], stages=[], progress=False), InvalidProblemError, "empty"),
    "bench missing path": (lambda: bench.run(["/nonexistent"], progress=False), ReadError, "nonexistent"),
    "bench unknown problem": (lambda: bench.run([I], problem="nope", progress=False), InvalidProblemError, "nope"),
    "bench unknown method": (lambda: bench.run([I], problem="partition", methods=["nope"], progress=False),
                             InvalidProblemError, "nope"),
    "bench group with stages": (lambda: bench.run([I], problem="group", stages=[2], progress=False),
                                InvalidProblemError, "stages"),
    "bench time limit 0": (lambda: bench.run([I], time_limit=0, progress=False), InvalidProblemError, "time limit"),
    "bench instances None": (lambda: bench.run(None, progress=False), InvalidProblemError, "None"),
    "bench instance an int": (lambda: bench.run([3], progress=False), InvalidProblemError, "int"),
    "bench methods a string": (lambda: bench.run([I], methods="dp", progress=False), InvalidProblemError, "'dp'"),
    "bench solver unknown": (lambda: bench.run([I], solver="gurobi", progress=False), InvalidProblemError, "gurobi"),
    "bench seed a string": (lambda: bench.run([I], seed="x", progress=False), InvalidProblemError, "seed"),
    "load bandwidth 10G": (lambda: pipeopt.io.load(ALEXNET, bandwidth="10G"), InvalidUnitError, "10G"),
    "load devices absurd": (lambda: pipeopt.io.load(ALEXNET, devices=10**9), InvalidClusterError, "devices"),
    # simulator
    "simulate microbatches 0": (lambda: pipeopt.simulate.simulate(I, solve(I, stages=2).plan, microbatches=0),
                                InvalidProblemError, "microbatches"),
    "simulate schedule unknown": (lambda: pipeopt.simulate.simulate(I, solve(I, stages=2).plan, schedule="zz"),
                                  InvalidProblemError, "zz"),
}


@pytest.mark.parametrize("case", sorted(API_CASES))
def test_api_rejects(case):
    make, error, needle = API_CASES[case]
    with pytest.raises(error) as info:
        make()
    assert needle in str(info.value), str(info.value)


def test_counts():
    """The number of bad inputs this file checks (quoted in the issue's closing note)."""
    assert len(CLI_CASES) >= 70 and len(API_CASES) >= 115


# ---- infinite bandwidth (free communication) and forward shares read from a plan file -----------
def test_infinite_bandwidth_is_free_communication(files, capsys):
    """``--bandwidth inf`` (no communication cost, as many papers assume) is accepted and every
    transfer costs 0 s: no inf * 0 = NaN anywhere (the cost table, every exact partition method,
    evaluate, the simulator, the group problem)."""
    assert main(["solve", str(files["part"]), "--stages", "2", "--bandwidth", "inf", "--time-limit", "none", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "optimal" and math.isfinite(out["objective"])
    assert Cluster.homogeneous(2, bandwidth="inf").bandwidth == math.inf
    for settings in (Settings(), Settings(overlap=False)):
        inst = Instance(chain_graph([0.01, 0.03, 0.02, 0.04, 0.01], [0.02, 0.06, 0.04, 0.08, 0.02], 5e6, 1e6, 3e6),
                        Cluster.homogeneous(4, bandwidth=math.inf), settings, name="free")
        work = [0.03, 0.09, 0.06, 0.12, 0.03]  # forward + backward (twice the forward) per layer
        for S, rep in ((2, False), (3, False), (4, True)):
            results = [solve(inst, stages=S, replication=rep, method=m, time_limit=None)
                       for m in (("dp", "probe") if rep else ("dp", "probe", "milp", "cpsat"))]
            for res in results:
                ev = res.evaluation
                assert res.status == pipeopt.Status.OPTIMAL, res.method
                assert not any(math.isnan(v) for v in [*ev.comm_time, *ev.round_trip, *ev.stage_time, ev.objective])
                assert all(t == 0.0 for t in ev.comm_time) and all(t == 0.0 for t in ev.round_trip)
                assert res.objective == pytest.approx(results[0].objective, rel=1e-9)
            if not rep:  # no communication: the best split of the compute alone
                assert results[0].objective >= sum(work) / S - 1e-12
        sim = pipeopt.simulate.simulate(inst, results[0].plan, microbatches=4)
        assert math.isfinite(sim.iteration_time) and not math.isnan(sim.time_per_microbatch)
    g = heterogeneous().replace(cluster=Cluster(heterogeneous().cluster.devices, math.inf))
    res = solve(g, problem="group", workers=2, time_limit=None)
    assert res.status == pipeopt.Status.OPTIMAL and math.isfinite(res.objective)


@pytest.mark.parametrize("share", [1.5, -0.2, "nan"])
def test_simulate_refuses_forward_shares_outside_the_unit_interval(files, tmp_path, capsys, share):
    """``pipeopt simulate --plan FILE`` refuses a forward share outside [0, 1], naming the stage,
    even under a schedule that does not use the shares."""
    plan = {"stages": [{"layers": ["l0", "l1"], "devices": ["gpu0"], "beta": {"gpu": 0.5}},
                       {"layers": ["l2", "l3"], "devices": ["gpu1"],
                        "beta": {"gpu": float(share) if share != "nan" else math.nan}}]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    for schedule in ("1f1b", "split"):
        assert main(["simulate", str(files["part"]), "--plan", str(path), "--schedule", schedule]) == 2
        err = capsys.readouterr().err
        assert "stage 1" in err and "outside [0, 1]" in err and "Traceback" not in err
    with pytest.raises(InvalidPlanError, match=r"stage 1: forward share \(beta\) of 'gpu'"):
        Plan.from_dict(plan)

