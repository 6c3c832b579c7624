"""Shared fixtures (the real PipeDream profiles from ../shared/data, never copied here) and the
two test tiers.

Tiers
-----
``python -m pytest`` runs the FAST tier: every test except those marked ``slow`` or
``torchrun``, with every hypothesis test at a fifth of its examples (:data:`FAST_EXAMPLES`).
``python -m pytest --full`` runs everything, every hypothesis test at its full example count:
the command of the README and of CI (``.ci/run``). ``-m EXPR`` selects by
marker as usual and overrides the tier's selection (``-m slow``: the slow tier alone).

A test is ``slow`` by its own ``@pytest.mark.slow`` or by :data:`SLOW` below: node-id patterns,
each with the reason it is slow (measured with ``--durations=0`` on the 2-core CI machine). The
fast tier keeps, for every family moved here, a cheaper member that covers the same code
(:data:`FAST_KEEP`). When the lists change, compare the line coverage of the two tiers (with
``pip install pytest-cov``; not in the ``test`` extra, which CI installs)::

    python -m pytest --full --cov=pipeopt --cov-report=term   # both tiers
    python -m pytest --cov=pipeopt --cov-report=term          # the fast tier

Measured 2026-11-28, 19:36 UTC, on the shared 2-core machine at load about 1 (``/usr/bin/time``,
user + sys): the fast tier (3,232 tests, 297 deselected) 301.4 CPU-s (282.9 + 18.6), 5 min 19 s of
wall; then the type DP's count-vector fallback test went from 7.6 s to 0.3 s (a lowered limit
instead of a 22-device MILP). The whole suite (``--full``, with per-test coverage contexts, load
about 1) 1,251 CPU-s, 20 min 23 s of wall. Coverage: of the 22,871 lines of ``pipeopt`` the whole
suite ran, 192 were run only by slow-tier tests (by the per-test contexts): the two-process torch
runs (``torch/runtime.py``, ``torch/network.py``, ``torch/memory.py``: 172), the free order's
user warm starts (16; since then the fast tier's ``test_warm_start_on_one_chain_and_bad_warm_starts``
runs them), and four solver paths reached only when a large profile meets its time limit.
The per-test contexts: ``--cov-context=test``, then ``coverage.CoverageData.contexts_by_lineno``
against the fast tier's ``--collect-only -q`` node ids. Again 2026-11-28, 23:10 UTC, another
machine of the same kind, load about 2 (a benchmark on the other core): the fast tier (3,323
tests, 297 deselected) 239.4 CPU-s (216.8 + 22.6), 4 min 5 s of wall. On 2026-11-29, 23:22 UTC, a
third machine of the kind, idle, second run (bytecode and pytest's rewritten modules cached): the
fast tier (3,437 tests, 298 deselected) 418.9 CPU-s (383.2 + 35.7), 6 min 3 s of wall - over the
5 CPU-minute target; that machine ran the start-up benchmark's small cases about 1.2x slower than
the machine of the day before. Where it goes (py-spy over the whole run): spread thin - the 40
costliest test functions are 170 s, no one is above 10 s; the hypothesis tests at their fifth 47 s;
torch's tracing and pipelining (the ``pytorch`` tests) about 50 s.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

ROOT = Path(__file__).resolve().parent.parent
PROFILE_DIR = ROOT.parent / "shared" / "data" / "pipedream-profiles"
PROFILES = sorted(p.stem for p in PROFILE_DIR.glob("*.txt") if p.stem != "LICENSE")

# ---- the tiers ---------------------------------------------------------------------------------

_PROFILE_FAMILY = "every PipeDream profile x S: the fast tier keeps small profiles (alexnet, vgg16)"
SLOW: dict[str, str] = {
    # node-id pattern (``*``: any text; relative to the repository root) -> why it is slow
    "tests/test_notebooks.py::*": "executes the notebooks end to end (3.4 min of the 53 min measured run)",
    "tests/problems/schedule/test_free_order.py::test_cpsat_equals_brute_force_over_every_order":
        "brute force over every order of every rank (depth-first, exponential) against CP-SAT",
    "tests/problems/schedule/test_free_order.py::test_given_warm_start_bounds_the_result":
        "the fixed order's exhaustive optimum on each example (about 4 s each)",
    "tests/problems/schedule/test_split_bound.py::test_split_bound_below_the_brute_force_over_every_order":
        "brute force over every order of every rank on each example (about 1 s each; the fast tier keeps"
        " test_split_first_equals_the_brute_force_over_every_order)",
    "tests/problems/partition/test_exact_partition.py::test_profiles_agree_with_dp[*]": _PROFILE_FAMILY,
    "tests/problems/partition/test_exact_partition.py::test_bare_formulations_agree_with_dp[*]":
        _PROFILE_FAMILY,
    "tests/problems/partition/test_exact_partition.py::test_settings_variants_agree_with_dp[*-8]":
        "gnmt_large with S = 8 in three settings: the fast tier keeps S = 4",
    "tests/problems/partition/test_exact_partition.py::test_time_limit_reports_incumbent_and_true_bound":
        "NASNet-A Large, three solvers for 1 s each plus the DP (the short-limit checks of "
        "test_partition_claims stay in the fast tier)",
    "tests/problems/partition/test_dp.py::test_dp_on_real_profiles[*]": _PROFILE_FAMILY,
    "tests/problems/partition/test_baselines.py::test_baselines_on_every_profile[*]": _PROFILE_FAMILY,
    "tests/problems/partition/test_window_rows.py::test_vgg16_milp_equals_cpsat[*-8]":
        "VGG16 with S = 8 under four models: the fast tier keeps S = 4",
    "tests/test_schedule_optimal.py::test_no_simulated_search_beats_the_certified_plan[*]":
        "simulated search over real profiles: the fast tier keeps alexnet",
    "tests/problems/partition/test_mcmc.py::test_reaches_the_optimum_on_small_profiles":
        "MCMC chains run to their budget on real profiles",
    "tests/problems/resource/test_windows.py::"
    "test_exact_methods_against_brute_force_scored_by_evaluate[group-*]":
        "brute force over every grouping: the fast tier keeps the joint cases",
    "tests/problems/bipartition/test_bipartition.py::test_time_limit_is_honest":
        "Inception-v3 in 8 stages, the aided MILP and bisection to the proof (the 1 s honesty "
        "check on NASNet-A Large stays in the fast tier)",
    "tests/problems/bipartition/test_bipartition.py::test_real_profiles_milp_beats_same_cut[*]":
        "five profiles x S: the fast tier keeps alexnet",
    "tests/problems/partition/test_mcmc.py::test_never_better_than_the_dp_on_real_profiles[*]":
        "MCMC to its budget on four profiles: the fast tier keeps vgg16",
    "tests/problems/resource/test_joint.py::test_milp_cbc_and_highs_and_cpsat_agree":
        "three solvers on an 8-layer joint problem (test_exact_methods_equal_brute_force stays)",
    "tests/pytorch/test_run_order.py::test_a_free_order_runs_on_torchs_runtime_beside_the_executor":
        "two spawned gloo processes trace gpt-tiny and run a free order (27.7 s; also marked torchrun); the "
        "order's checks and refusals stay in the fast tier",
    "tests/pytorch/test_run_order.py::test_cli_runs_a_v_placed_order_from_its_csv_two_chunks_per_rank":
        "two spawned gloo processes run ZBVZeroBubble's order from a CSV, 2 chunks per rank (25.9 s; torchrun)",
    "tests/pytorch/test_run_order_ties.py::test_the_tied_copies_hold_the_sum_after_a_free_order_run":
        "two spawned gloo processes run gpt-tiny with a tied head in a free order, gradients checked (21 s; torchrun)",
    "tests/pytorch/test_run_order_ties.py::test_a_*_sums_the_tied_*":
        "two spawned gloo processes run gpt-tiny with a tied head in an action order (7-8 s each; torchrun); the "
        "summing of the copies stays in the fast tier",
    "tests/pytorch/test_recompute_run.py::test_two_rank_run_recomputes_and_measures_less_activation_memory":
        "three 2-process gloo runs of gpt-tiny (pipeopt run, MemTracker with and without recompute; 38 s; torchrun)",
    "tests/pytorch/test_recompute_run.py::test_zero_bubble_order_reruns_each_recomputed_layer_once":
        "a 2-process gloo run of a ZBV order on gpt-tiny with recomputed layers (46 s under load; torchrun)",
    "tests/test_crosscheck.py::test_group_exact[milp-cbc]":
        "the group MILP through CBC on every drawn instance (10-20 s; the fast tier keeps [milp-highs] and"
        " [types-cbc])",
    "tests/test_crosscheck.py::test_group_exact[cpsat-cbc]":
        "the group CP-SAT model on every drawn instance (4-9 s; test_group.py's"
        " test_milp_agrees_with_brute_force_and_cpsat keeps it in the fast tier)",
    "tests/test_crosscheck.py::test_partition_heuristic[mcmc]":
        "MCMC chains to their budget on every drawn chain (5 s; test_mcmc keeps vgg16 in the fast tier)",
    "tests/problems/resource/test_group.py::test_exact_no_worse_than_baselines_on_a_larger_instance":
        "CP-SAT to a proof on 8 devices x 24 layers, beside the baselines (5.5 s; the small cases stay)",
}
"""Tests moved to the slow tier by node id (``*`` patterns), with the reason (measured
with ``--durations=0``); tests marked ``@pytest.mark.slow`` or ``torchrun`` in their files are
slow too."""

FAST_KEEP: dict[str, str] = {
    "*[alexnet-2]": "the smallest profile of each family",
    "*[alexnet-4]": "the smallest profile of each family",
    "*[vgg16-2]": "a second small profile",
    "*[2-alexnet]": "the same, parameters the other way round (test_dp, test_schedule_optimal)",
    "*[4-alexnet]": "the same",
    "*[8-vgg16]": "the same, one deeper split",
    "*[vgg16-4]": "test_mcmc's small profile",
    "*[group-3-4-1-3-tight-inf]": "the cheap group cases of test_windows",
    "*[group-15-3-2-3-tight-none]": "the cheap group cases of test_windows (nothing fits)",
    "tests/test_notebooks.py::test_notebook_is_stored_without_outputs[*]": "reads the files, runs nothing",
    "tests/test_notebooks.py::test_the_four_notebooks_exist": "reads the files, runs nothing",
}
"""Members of a :data:`SLOW` family kept in the fast tier (``*`` patterns)."""

FAST_EXAMPLES = 0.2
"""Fraction of each hypothesis test's ``max_examples`` run in the fast tier (at least
:data:`MIN_EXAMPLES`); ``--full`` runs them all."""
MIN_EXAMPLES = 3


@functools.lru_cache(maxsize=None)
def _pattern(pattern: str) -> re.Pattern:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


def _matches(node: str, pattern: str) -> bool:
    """``pattern`` matches all of the node id; ``*`` is any text, everything else literal
    (brackets included: they delimit parameters)."""
    return _pattern(pattern).fullmatch(node) is not None


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False,
                     help="run both tiers: also the tests marked slow or torchrun, and every hypothesis "
                          "test at its full number of examples (the README's and CI's command)")


def _full(config) -> bool:
    return bool(config.getoption("--full"))


def _fewer_examples(item) -> None:
    """The fast tier's share of a hypothesis test's examples (its own ``@settings`` included).

    Hypothesis reads the settings from the wrapped test when it runs, so the fast tier replaces
    them with a copy that has fewer examples; everything else (deadline, health checks,
    derandomize) is kept."""
    from hypothesis import settings

    fn = getattr(item, "obj", None)
    fn = getattr(fn, "__func__", fn)
    current = getattr(fn, "_hypothesis_internal_use_settings", None)
    if current is None or getattr(fn, "_fast_tier_examples", False):
        return
    fewer = max(MIN_EXAMPLES, math.ceil(current.max_examples * FAST_EXAMPLES))
    if fewer < current.max_examples:
        fn._hypothesis_internal_use_settings = settings(current, max_examples=fewer)
    fn._fast_tier_examples = True


def pytest_collection_modifyitems(config, items):
    for item in items:
        node = item.nodeid
        if any(_matches(node, p) for p in SLOW) and not any(_matches(node, p) for p in FAST_KEEP):
            item.add_marker(pytest.mark.slow)
    if _full(config):
        return
    for item in items:
        _fewer_examples(item)
    if config.getoption("markexpr"):  # an explicit -m chooses for itself
        return
    named = [a for a in config.args if "::" in a]  # a test named on the command line runs
    keep, slow = [], []
    for item in items:
        tiered = item.get_closest_marker("slow") or item.get_closest_marker("torchrun")
        if tiered and not any(item.nodeid.startswith(a) or a.endswith(item.nodeid) for a in named):
            slow.append(item)
        else:
            keep.append(item)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = keep


def pytest_report_header(config):
    if _full(config):
        return "tiers: --full (fast and slow tiers, every hypothesis example)"
    return ("tiers: fast (tests marked slow or torchrun deselected, hypothesis tests at "
            f"{FAST_EXAMPLES:.0%} of their examples); --full runs everything")


# ---- fixtures ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def profile(name: str, devices: int = 16):
    """A PipeDream profile read as an Instance on ``devices`` identical GPUs (cached)."""
    from pipeopt.io.pipedream import read_pipedream

    return read_pipedream(PROFILE_DIR / f"{name}.txt", devices=devices)


@pytest.fixture(scope="session")
def profile_dir() -> Path:
    if not PROFILE_DIR.exists():
        pytest.skip("../shared/data/pipedream-profiles is not present")
    return PROFILE_DIR
