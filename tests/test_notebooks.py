"""The analysis notebooks in ``notebooks/`` run from top to bottom and say what they claim.

Each notebook is executed with nbclient in a fresh kernel that runs *this* Python interpreter
(``sys.executable``, so the venv with pipeopt and ipykernel), with the notebooks folder as its
working directory and 120 s per cell. A cell that raises fails the test. Then a few facts are
read back from the executed kernel: the test appends one cell that prints, as JSON, values the
notebook computed (e.g. the quickstart's DP and MILP objectives), and checks them against each
other - so a notebook that runs but shows wrong numbers fails too.

The notebooks are stored without outputs (checked here as well).
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

from pipeopt.problems.spaces import contains

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(p.name for p in NB_DIR.glob("*.ipynb"))
PROFILE_DIR = NB_DIR.parent.parent / "shared" / "data" / "pipedream-profiles"
MARK = "@@FACTS@@"
KERNEL = "pipeopt-test-python"


class _ThisPython(KernelSpecManager):
    """A kernel spec manager whose one kernel is ipykernel on the running interpreter."""

    def get_kernel_spec(self, kernel_name):
        return KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name="Python (pipeopt tests)",
            language="python",
        )


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def run_notebook(name: str, facts: list[str] | None = None) -> tuple[dict, object]:
    """Execute ``notebooks/name``; return the JSON facts (``{expr: value}``) and the executed notebook.

    ``facts`` are Python expressions evaluated in the notebook's namespace after its last cell
    (``None`` when they raise NameError, i.e. a skipped optional part).
    """
    nb = nbformat.read(NB_DIR / name, as_version=4)
    if facts:
        src = (
            "import json as _json\n_facts = {}\n"
            f"for _expr in {facts!r}:\n"
            "    try:\n        _facts[_expr] = eval(_expr)\n"
            "    except NameError:\n        _facts[_expr] = None\n"
            f"print({MARK!r} + _json.dumps(_facts, default=str))\n"
        )
        nb.cells.append(nbformat.v4.new_code_cell(src))
    km = AsyncKernelManager(kernel_name=KERNEL, kernel_spec_manager=_ThisPython())
    client = nbclient.NotebookClient(
        nb, km=km, timeout=120, kernel_name=KERNEL, resources={"metadata": {"path": str(NB_DIR)}}
    )
    client.execute()  # raises CellExecutionError naming the cell if any cell raised
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", f"{name}: a cell raised {out.get('ename')}"
    found = {}
    if facts:
        text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
        line = next(ln for ln in text.splitlines() if ln.startswith(MARK))
        found = json.loads(line[len(MARK) :])
    return found, nb


def _images(nb) -> int:
    return sum(
        1 for cell in nb.cells for out in cell.get("outputs", []) if "image/png" in out.get("data", {})
    )


pytestmark = pytest.mark.skipif(
    not PROFILE_DIR.is_dir(), reason="../shared/data/pipedream-profiles is not present"
)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stored_without_outputs(name):
    nb = nbformat.read(NB_DIR / name, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{name}: cell {i} has stored outputs"


def test_quickstart():
    f, nb = run_notebook(
        "01_quickstart.ipynb",
        [
            "dp.objective",
            "dp.lower_bound",
            "milp.objective",
            "str(milp.status)",
            "S",
            "{k: (r.objective, str(r.status)) for k, r in results.items()}",
            "None if sim is None else (sim.time_per_microbatch, sim.iteration_time)",
            "M",
            "__import__('sys').executable",
        ],
    )
    # the kernel ran this interpreter (the venv with pipeopt), not whatever "python3" kernel is installed
    assert f["__import__('sys').executable"] == sys.executable
    opt = f["dp.objective"]
    assert opt > 0 and math.isclose(f["dp.lower_bound"], opt, rel_tol=1e-12)
    assert math.isclose(f["milp.objective"], opt, rel_tol=1e-6)
    assert f["str(milp.status)"] == "optimal"
    for name, (obj, status) in f["{k: (r.objective, str(r.status)) for k, r in results.items()}"].items():
        assert obj >= opt * (1 - 1e-9), f"{name} beats the proven optimum"
        assert status in ("optimal", "feasible"), (name, status)
    sim = f["None if sim is None else (sim.time_per_microbatch, sim.iteration_time)"]
    if _has("pipeopt.simulate"):
        per_mb, iteration = sim
        # one iteration of M microbatches cannot beat M bottlenecks, nor the fill of the pipeline
        assert iteration >= f["M"] * opt * (1 - 1e-9)
        assert per_mb >= opt * (1 - 1e-9)
    # a plan figure always (pipeopt.plot or the fallback); a Gantt chart when both modules exist
    assert _images(nb) >= (2 if _has("pipeopt.simulate") and _has("pipeopt.plot") else 1)


def test_solver_tips():
    f, nb = run_notebook(
        "04_solver_tips.ipynb",
        [
            "str(limited.status)",
            "limited.lower_bound",
            "limited.objective",
            "optimum_big.objective",
            "solvers.reset_index()[['instance', 'method', 'status', 'objective_ms', 'lower_bound_ms']].values.tolist()",
            "replicated.objective",
            "straight.objective",
        ],
    )
    # the time-limited MILP brackets the DP's optimum: bound <= optimum <= incumbent
    opt = f["optimum_big.objective"]
    assert f["limited.lower_bound"] <= opt * (1 + 1e-9) <= f["limited.objective"] * (1 + 1e-9)
    if f["str(limited.status)"] == "optimal":  # only if the solver really closed the gap
        assert math.isclose(f["limited.objective"], opt, rel_tol=1e-6)
    rows = f[
        "solvers.reset_index()[['instance', 'method', 'status', 'objective_ms', 'lower_bound_ms']].values.tolist()"
    ]
    dp_opt = {inst: obj for inst, method, _, obj, _ in rows if method == "dp"}
    assert len(dp_opt) == 2
    for inst, method, status, obj, bound in rows:
        assert bound <= dp_opt[inst] * (1 + 1e-9), (inst, method)
        if status == "optimal":
            assert math.isclose(obj, dp_opt[inst], rel_tol=1e-6), (inst, method)
    # replication can only help: the one-order plans are in the replicated-one-order space too
    assert f["replicated.objective"] <= f["straight.objective"] * (1 + 1e-9)
    assert _images(nb) >= 1


def test_heuristic_vs_optimal():
    cols = [
        "instance",
        "stages",
        "method",
        "exact",
        "space",
        "status",
        "objective",
        "lower_bound",
        "best_bound",
        "gap",
    ]
    f, nb = run_notebook(
        "02_heuristic_vs_optimal.ipynb",
        [
            f"df[{cols!r}].values.tolist()",
            "optimal.objective",
            "heuristic.objective",
            "None if sims is None else {k: s.time_per_microbatch for k, s in sims.items()}",
        ],
    )
    rows = [dict(zip(cols, r)) for r in f[f"df[{cols!r}].values.tolist()"]]
    assert {r["method"] for r in rows} >= {"dp", "milp"}
    assert len({r["instance"] for r in rows}) >= 6  # real profiles and zoo instances
    dp = {(r["instance"], r["stages"], r["space"]): r["objective"] for r in rows if r["method"] == "dp"}
    proven = {(r["instance"], r["stages"], r["space"]) for r in rows if r["exact"] and not math.isnan(r["lower_bound"])}
    assert not [r for r in rows if r["status"] == "error"], "a method raised in the benchmark"
    for r in rows:
        key = (r["instance"], r["stages"], r["space"])
        if r["status"] == "skipped":  # the method cannot pose this case (the row's note says why)
            continue
        if key not in dp:  # a space the DP does not search (the convex DP's, PipeDream's antichains)
            # a gap only against a bound of the same or a larger space (pipeopt.problems.spaces)
            bounded = any(i == r["instance"] and s == r["stages"] and contains(sp, r["space"]) for i, s, sp in proven)
            has_gap = r["gap"] is not None and not math.isnan(r["gap"])
            if not bounded:
                assert not has_gap, r
            elif r["status"] in ("optimal", "feasible"):
                assert has_gap, r
            continue
        assert math.isclose(r["best_bound"], dp[key], rel_tol=1e-6), r
        assert r["objective"] >= dp[key] * (1 - 1e-9), f"{r['method']} beats the DP optimum: {r}"
        assert r["gap"] >= 0
        if r["status"] == "optimal":
            assert math.isclose(r["objective"], dp[key], rel_tol=1e-6), r
    assert f["heuristic.objective"] > f["optimal.objective"]
    sims = f["None if sims is None else {k: s.time_per_microbatch for k, s in sims.items()}"]
    if _has("pipeopt.simulate"):
        # the simulated steady state never beats the analytic bottleneck
        assert sims["dp"] >= f["optimal.objective"] * (1 - 1e-9)
        assert sims["time_balanced"] >= f["heuristic.objective"] * (1 - 1e-9)
    # gap and solve-time charts always; the two Gantt charts when plot and simulate exist
    assert _images(nb) >= (4 if _has("pipeopt.plot") and _has("pipeopt.simulate") else 2)


def test_duan_wu_reproduction():
    cols = ["instance", "problem", "stages", "method", "exact", "status", "objective", "lower_bound", "gap"]
    f, nb = run_notebook(
        "03_duan_wu_reproduction.ipynb",
        [
            "HAVE_ZOO",
            "HAVE_RESOURCE",
            "HAVE_GROUP",
            f"None if depth is None else depth[{cols!r}].values.tolist()",
            f"None if group is None else group[{cols!r}].values.tolist()",
            "None if sim_check is None else sim_check.to_dict('records')",
        ],
    )
    depth = f[f"None if depth is None else depth[{cols!r}].values.tolist()"]
    group = f[f"None if group is None else group[{cols!r}].values.tolist()"]
    sims = f["None if sim_check is None else sim_check.to_dict('records')"]
    if f["HAVE_ZOO"] and f["HAVE_RESOURCE"]:
        obj = {(r[0], r[2], f"{r[1]}/{r[3]}"): r[6] for r in depth}
        cases = {(inst, S) for inst, S, _ in obj}
        assert len(cases) == 16  # two models x eight depths
        for inst, S in cases:
            o = {k: v for (i, s, k), v in obj.items() if (i, s) == (inst, S)}
            tol = 1 + 1e-9
            # the joint optimum beats every fixed-partition run; the best split beats the others
            assert o["joint/dp"] <= o["joint/two_step"] * tol
            assert o["joint/dp"] <= o["allocate/lp"] * tol
            # sequential execution is the split beta_k = F_k / (F_k + B_k): the LP's split is never worse
            assert o["allocate/lp"] <= o["allocate/theorem"] * tol
            assert o["allocate/lp"] <= o["allocate/sequential"] * tol
            # two_step is the binary-search partition with the best split: the allocate LP's plan
            assert math.isclose(o["joint/two_step"], o["allocate/lp"], rel_tol=1e-6)
        if _has("pipeopt.simulate"):
            for r in sims:
                assert r["simulated_ms"] >= r["analytic_ms"] * (1 - 1e-9), r
                # with transfers out of the way the split schedule runs at the analytic bottleneck
                assert math.isclose(r["simulated_fast_link_ms"], r["analytic_fast_link_ms"], rel_tol=1e-6), r
    if f["HAVE_ZOO"] and f["HAVE_GROUP"]:
        pools = {r[0] for r in group}
        assert len(pools) == 8
        for pool in pools:
            rows = [r for r in group if r[0] == pool]
            exact = [r for r in rows if r[4]]
            heur = [r for r in rows if not r[4]]
            assert exact and heur
            best_bound = max(r[7] for r in exact)
            for r in heur:
                assert r[6] >= best_bound * (1 - 1e-9), r
            # the exact methods start from the better of the two groupings: never worse than them
            for r in exact:
                assert r[6] <= min(h[6] for h in heur) * (1 + 1e-9), r
    everything = f["HAVE_ZOO"] and f["HAVE_GROUP"] and f["HAVE_RESOURCE"]
    assert _images(nb) >= (
        3 if everything and _has("pipeopt.plot") and _has("pipeopt.simulate") else 2 if everything else 0
    )


def test_the_four_notebooks_exist():
    assert {
        "01_quickstart.ipynb",
        "02_heuristic_vs_optimal.ipynb",
        "03_duan_wu_reproduction.ipynb",
        "04_solver_tips.ipynb",
    } <= set(NOTEBOOKS)
