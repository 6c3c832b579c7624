"""The one CP-SAT door (pipeopt.backends.cpsat.solve_cpsat)."""

from __future__ import annotations

import itertools
import os
import random
import time

import pytest
from ortools.sat.python import cp_model

from pipeopt.backends.cpsat import CAN_ISOLATE, CpsatOutcome, solve_cpsat
from pipeopt.backends.deadline import Deadline
from pipeopt.backends.pulp import kill_grace
from pipeopt.errors import InvalidProblemError


def knapsack(n: int = 12, seed: int = 3, maximise: bool = True):
    """A 0/1 knapsack model and its optimum (profit, or minus profit when minimising)."""
    rng = random.Random(seed)
    weight = [rng.randint(1, 40) for _ in range(n)]
    profit = [rng.randint(1, 50) for _ in range(n)]
    cap = sum(weight) // 3
    m = cp_model.CpModel()
    x = [m.new_bool_var(f"take_{i}") for i in range(n)]
    m.add(sum(w * v for w, v in zip(weight, x, strict=True)) <= cap)
    total = sum(p * v for p, v in zip(profit, x, strict=True))
    if maximise:
        m.maximize(total + 4)
    else:
        m.minimize(-total + 4)
    best = max(
        sum(p for p, b in zip(profit, bits, strict=True) if b)
        for bits in itertools.product((0, 1), repeat=n)
        if sum(w for w, b in zip(weight, bits, strict=True) if b) <= cap
    )
    return m, x, (best if maximise else -best) + 4


def packing(n: int = 3000, rows: int = 3000, k: int = 12, seed: int = 0, with_rows: bool = False):
    """A random 0/1 packing model (max profit) and a greedy feasible value (and, with
    ``with_rows``, the variables, the rows ``(coefficients, capacity)``, the profits and the
    greedy selection)."""
    rng = random.Random(seed)
    profit = [rng.randint(10, 99) for _ in range(n)]
    m = cp_model.CpModel()
    x = [m.new_bool_var(f"x{i}") for i in range(n)]
    m.maximize(sum(p * v for p, v in zip(profit, x, strict=True)))
    rows_of = [[] for _ in range(n)]
    cons = []
    for r in range(rows):
        coef = {i: rng.randint(5, 60) for i in rng.sample(range(n), k)}
        cap = rng.randint(60, 150)
        m.add(sum(c * x[i] for i, c in coef.items()) <= cap)
        cons.append([coef, cap, 0])
        for i in coef:
            rows_of[i].append(r)
    value = 0
    chosen = set()
    for i in sorted(range(n), key=lambda i: -profit[i]):
        if all(cons[r][2] + cons[r][0][i] <= cons[r][1] for r in rows_of[i]):
            for r in rows_of[i]:
                cons[r][2] += cons[r][0][i]
            value += profit[i]
            chosen.add(i)
    if with_rows:
        return m, value, x, [(c[0], c[1]) for c in cons], profit, chosen
    return m, value


@pytest.mark.parametrize("maximise", [True, False])
def test_small_model_optimal_with_bound_equal_to_objective(maximise):
    m, x, best = knapsack(maximise=maximise)
    out = solve_cpsat(m, deadline=Deadline(30), threads=2, seed=1)
    assert isinstance(out, CpsatOutcome)
    assert out.status == "optimal" and out.proven and out.has_solution
    assert out.objective == best
    assert out.bound == best
    assert out.value(x[0]) in (0, 1)
    assert out.boolean_value(x[0]) == bool(out.value(x[0]))
    assert out.info()["solver_status"] == "OPTIMAL"


def test_hint_replaces_previous_hints():
    m, x, best = knapsack()
    m.add_hint(x[1], 1)
    out = solve_cpsat(m, deadline=Deadline(30), hint={v: 0 for v in x})
    assert out.status == "optimal" and out.objective == best
    assert len(m.proto.solution_hint.vars) == len(x)


def test_infeasible_is_proven():
    m = cp_model.CpModel()
    x = [m.new_bool_var(f"x{i}") for i in range(3)]
    m.add(sum(2 * v for v in x) == 3)
    m.minimize(sum(x))
    out = solve_cpsat(m, deadline=Deadline(30))
    assert out.status == "infeasible"
    assert out.objective is None and out.bound is None and not out.has_solution
    with pytest.raises(RuntimeError, match="no solution"):
        out.value(x[0])


def test_model_without_objective():
    m = cp_model.CpModel()
    a = m.new_int_var(0, 5, "a")
    m.add(a >= 3)
    out = solve_cpsat(m, deadline=Deadline(30))
    assert out.status == "optimal" and out.objective is None and out.bound is None
    assert 3 <= out.value(a) <= 5


def test_expired_deadline_runs_no_solver():
    m, _, _ = knapsack()
    d = Deadline(0.001)
    time.sleep(0.01)
    out = solve_cpsat(m, deadline=d)
    assert out.status == "no_solution" and out.response is None and out.solver_status == "not run"


def test_stopped_model_is_never_optimal_and_keeps_the_deadline():
    """A model CP-SAT does not close in 1 s: an incumbent or none, and a valid bound."""
    m, greedy_value = packing()
    limit = 1.0
    d = Deadline(limit)
    out = solve_cpsat(m, deadline=d, threads=2)
    wall = d.elapsed()
    assert out.status in ("feasible", "no_solution")
    if out.bound is not None:  # an upper bound (maximisation): above every feasible value
        assert out.bound >= greedy_value
        assert out.bound >= out.objective
    assert wall <= limit + kill_grace(limit) + 5.0  # the contract, with a wide margin


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"threads": 0}, "threads"),
        ({"threads": True}, "threads"),
        ({"seed": -1}, "seed"),
        ({"rel_gap": -0.1}, "rel_gap"),
        ({"grace": float("nan")}, "grace"),
        ({"parameters": {"max_time_in_seconds": 5}}, "door's own arguments"),
        ({"parameters": {"no_such_parameter": 1}}, "no_such_parameter"),
    ],
)
def test_bad_options(kw, match):
    m, _, _ = knapsack(n=4)
    with pytest.raises(InvalidProblemError, match=match):
        solve_cpsat(m, **kw)


def test_extra_parameters_are_applied():
    m, _, best = knapsack()
    out = solve_cpsat(m, deadline=Deadline(30), parameters={"symmetry_level": 0}, threads=1)
    assert out.parameters.symmetry_level == 0
    assert out.parameters.num_workers == 1
    assert out.objective == best


def test_invalid_model_is_a_programming_error():
    m = cp_model.CpModel()
    a = m.new_int_var(0, 5, "a")
    m.add_division_equality(a, a, 0)  # division by the constant 0
    with pytest.raises(RuntimeError, match="rejected"):
        solve_cpsat(m, deadline=Deadline(5))


# ----------------------------------------------------------------------------- the child process


@pytest.mark.parametrize("isolate", [False, True])
def test_values_read_alike_in_this_process_and_in_the_child(isolate):
    m, x, best = knapsack()
    z = m.new_int_var(-5, 50, "z")
    m.add(z == 3 * x[0] - x[1] + 7)
    out = solve_cpsat(m, deadline=Deadline(30), isolate=isolate, seed=2)
    assert out.isolated is isolate and out.info()["solver_isolated"] is isolate
    assert out.status == "optimal" and out.objective == best and out.bound == best
    v = [out.value(b) for b in x]
    assert out.value(z) == 3 * v[0] - v[1] + 7
    assert out.value(2 * z - x[2] + 1) == 2 * out.value(z) - v[2] + 1
    assert out.value(5) == 5
    assert out.boolean_value(x[3]) is bool(v[3]) and out.boolean_value(~x[3]) is not bool(v[3])
    assert out.info()["branches"] >= 0


def test_bounded_deadline_isolates_unbounded_or_callback_does_not():
    m, _, best = knapsack(n=6)
    assert solve_cpsat(m, deadline=Deadline(30)).isolated
    assert not solve_cpsat(m).isolated

    class Count(cp_model.CpSolverSolutionCallback):
        def __init__(self):
            super().__init__()
            self.seen = 0

        def on_solution_callback(self):
            self.seen += 1

    cb = Count()
    out = solve_cpsat(m, deadline=Deadline(30), callback=cb)
    assert not out.isolated and cb.seen >= 1 and out.objective == best
    with pytest.raises(InvalidProblemError, match="isolate"):
        solve_cpsat(m, deadline=Deadline(30), callback=Count(), isolate=True)


def _live_children() -> set[int]:
    """Live (not zombie) processes whose parent is this one (Linux /proc)."""
    me, out = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                out.add(int(entry))
    return out


def _wait_gone(pids: set[int], seconds: float = 20.0) -> set[int]:
    stop = time.perf_counter() + seconds
    while (left := _live_children() - pids) and time.perf_counter() < stop:
        time.sleep(0.05)
    return left


@pytest.mark.skipif(not CAN_ISOLATE, reason="needs os.fork")
def test_killed_child_hands_back_its_last_incumbent_and_bound():
    """The door kills the child before CP-SAT's own limit (a negative grace): the incumbent
    streamed so far comes back, feasible, with a valid bound, and the child is gone."""
    m, greedy_value, x, rows, profit, chosen = packing(with_rows=True)
    before = _live_children()
    hint = {v: int(i in chosen) for i, v in enumerate(x)}
    out = solve_cpsat(m, deadline=Deadline(60.0), grace=-57.0, hint=hint)
    assert out.isolated and out.stopped and out.solver_status == "KILLED"
    assert any("ended at the deadline" in n for n in out.notes)
    assert out.status in ("feasible", "no_solution")
    if out.status == "feasible":  # the hint makes this the usual case
        take = [out.value(v) for v in x]
        assert all(sum(c * take[i] for i, c in coef.items()) <= cap for coef, cap in rows)
        assert out.objective == sum(p * t for p, t in zip(profit, take, strict=True))
        assert out.bound is not None and out.bound >= max(out.objective, greedy_value)
    assert not _wait_gone(before)


@pytest.mark.skipif(not CAN_ISOLATE, reason="needs os.fork")
def test_child_killed_before_any_incumbent_is_no_solution():
    m, _ = packing()
    out = solve_cpsat(m, deadline=Deadline(60.0), grace=-59.99)
    assert out.status == "no_solution" and out.stopped and out.response is None
    assert out.objective is None and out.bound is None and not out.has_solution
    with pytest.raises(RuntimeError, match="no solution"):
        out.value(0)


@pytest.mark.skipif(not CAN_ISOLATE, reason="needs os.fork")
def test_child_failures(monkeypatch):
    m, _, _ = knapsack(n=6)

    def fail(self, model, callback=None):
        raise ValueError("boom")

    monkeypatch.setattr(cp_model.CpSolver, "solve", fail)
    with pytest.raises(RuntimeError, match="child process: ValueError: boom"):
        solve_cpsat(m, deadline=Deadline(30))

    def die(self, model, callback=None):
        os._exit(3)

    monkeypatch.setattr(cp_model.CpSolver, "solve", die)
    out = solve_cpsat(m, deadline=Deadline(30))
    assert out.status == "no_solution" and not out.stopped
    assert any("without an answer (exit code 3)" in n for n in out.notes)
