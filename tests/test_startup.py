"""Start-up: ``import pipeopt`` and ``pipeopt --help`` import no solver, numba, pandas, torch or
matplotlib (each checked in a fresh interpreter through ``sys.modules``); the lazy stand-ins
(:mod:`pipeopt.lazy`, :mod:`pipeopt.jit`) and the lazy registry still give the real thing.

No timing is asserted here: the times are measured by ``benchmarks/startup.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("ortools", "pulp", "highspy", "numba", "pandas", "pyarrow", "torch", "matplotlib", "tqdm", "dask")

PROBE = """
import json, sys
{code}
print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))
"""


def loaded_after(code: str) -> set[str]:
    """Top-level packages in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", PROBE.format(code=code)], capture_output=True, text=True,
                         check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_pipeopt_imports_nothing_heavy():
    loaded = loaded_after("import pipeopt")
    assert not loaded & set(HEAVY)
    assert "pipeopt" in loaded


def test_help_imports_no_problem_and_no_heavy_module():
    code = """
import contextlib, io
from pipeopt.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    assert main(["--help"]) == 0
assert "solve" in out.getvalue()
problems = [m for m in sys.modules if m.startswith("pipeopt.problems.") and m != "pipeopt.problems.method"]
assert not problems, problems
"""
    loaded = loaded_after(code)
    assert not loaded & {*HEAVY, "networkx", "numpy"}


def test_reading_a_problems_methods_imports_no_solver():
    """The registry imports the problem packages, whose method modules import their solvers when run."""
    loaded = loaded_after("import pipeopt.registry as r; r.METHODS; [r.problem_class(p) for p in r.PROBLEMS]")
    assert not loaded & set(HEAVY)


def test_registry_names_and_lazy_loading_agree():
    from pipeopt import registry

    assert list(registry.PROBLEMS) == list(registry.PACKAGES)
    names = {m.problem for m in registry.METHODS}
    assert names <= set(registry.PROBLEMS)
    for problem in registry.PROBLEMS:
        assert registry.methods(problem) == [m for m in registry.METHODS if m.problem == problem]
        assert isinstance(registry.problem_class(problem), type)
    assert "nope" not in registry.PROBLEMS
    with pytest.raises(KeyError):
        registry.PROBLEMS["nope"]


def test_public_names_resolve():
    import pipeopt

    for name in pipeopt.__all__:
        assert getattr(pipeopt, name) is not None, name
    assert callable(pipeopt.solve) and not isinstance(pipeopt.solve, type(pipeopt))
    with pytest.raises(AttributeError):
        pipeopt.no_such_name  # noqa: B018


def test_lazy_module_imports_on_first_attribute():
    from pipeopt.lazy import lazy_module

    m = lazy_module("json")
    assert "not imported" in repr(m)
    assert m.dumps([1]) == "[1]"
    assert "imported" in repr(m) and "not" not in repr(m)
    with pytest.raises(AttributeError):
        m.no_such_function  # noqa: B018


def test_lazy_kernel_compiles_and_calls_other_kernels():
    pytest.importorskip("numba")
    import numpy as np

    from pipeopt.problems import ideals
    from pipeopt.problems.partition import convex

    # a kernel read through another module (convex imports walk_supersets) is the same function
    assert convex.walk_supersets.py_func is ideals.walk_supersets.py_func
    # _passes: whether J - a stays within the class's limits
    qty = np.array([[0.0, 1.0, 3.0]])
    lim = np.array([[2.0]])
    bad = np.zeros((1, 3), dtype=np.int64)
    assert ideals._passes(0, 1, qty, lim, bad)
    assert not ideals._passes(0, 2, qty, lim, bad)


PROFILES = __import__("pathlib").Path(__file__).resolve().parents[2] / "shared" / "data" / "pipedream-profiles"


@pytest.mark.parametrize("name, stages", [("alexnet", 4), ("gnmt", 8), ("resnet50", 4)])
def test_solving_a_pipedream_profile_imports_no_networkx_and_no_solver(name, stages):
    """``pipeopt solve PROFILE --stages N`` (dp or probe, the tie-break's enumeration or descent)
    reads the profile into a LazyDiGraph and never needs networkx, PuLP, OR-Tools or numba, nor
    the partition methods it does not run, nor logging (the bench's and the sweep's)."""
    code = f"""
import contextlib, io
from pipeopt.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    assert main(["solve", {str(PROFILES / (name + ".txt"))!r}, "--stages", "{stages}"]) == 0
assert "optimal" in out.getvalue()
others = {{"pipeopt.problems.partition." + m for m in ("milp", "cpsat", "convex", "convex_milp", "events", "model",
                                                     "mcmc", "pipedream", "frameworks", "recompute_baselines")}}
assert not others & set(sys.modules), others & set(sys.modules)
"""
    loaded = loaded_after(code)
    assert not loaded & {*HEAVY, "networkx", "logging"}
