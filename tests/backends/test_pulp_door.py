"""The one PuLP door (pipeopt.backends.pulp.solve_pulp) on CBC and HiGHS.

Small models whose optimum is found by enumeration here; an infeasible and an unbounded
model; a model no solver closes within its limit (status, bound and the deadline); warm
starts on both solvers.
"""

from __future__ import annotations

import itertools
import random
import time

import pulp
import pytest

from pipeopt.backends.deadline import Deadline
from pipeopt.backends.pulp import SOLVERS, PulpOutcome, cbc_log_bound, kill_grace, solve_pulp
from pipeopt.errors import InvalidProblemError

TOL = 1e-6


def knapsack(n: int = 12, seed: int = 1, maximise: bool = True, constant: float = 0.0):
    """A 0/1 knapsack (as max, or as min of the negated profit) plus its optimum by enumeration."""
    rng = random.Random(seed)
    weight = [rng.randint(1, 40) for _ in range(n)]
    profit = [rng.randint(1, 50) for _ in range(n)]
    cap = sum(weight) // 3
    sense = 1 if maximise else -1
    prob = pulp.LpProblem("knapsack", pulp.LpMaximize if maximise else pulp.LpMinimize)
    x = [pulp.LpVariable(f"take_{i}", cat=pulp.LpBinary) for i in range(n)]
    prob += sense * pulp.lpSum(p * v for p, v in zip(profit, x, strict=True)) + constant
    prob += pulp.lpSum(w * v for w, v in zip(weight, x, strict=True)) <= cap, "capacity"
    best = max(
        sum(p for p, b in zip(profit, bits, strict=True) if b)
        for bits in itertools.product((0, 1), repeat=n)
        if sum(w for w, b in zip(weight, bits, strict=True) if b) <= cap
    )
    return prob, x, sense * best + constant


def packing(n: int = 3000, rows: int = 3000, k: int = 12, seed: int = 0):
    """A random 0/1 packing MILP (max profit, ``rows`` sparse knapsack rows), too big to
    close in a second: CBC alone needs about 9 s for its first LP here. Also a greedy
    feasible value (a lower bound on the optimum) and its solution."""
    rng = random.Random(seed)
    profit = [rng.randint(10, 99) for _ in range(n)]
    prob = pulp.LpProblem("packing", pulp.LpMaximize)
    x = [pulp.LpVariable(f"x{i}", cat=pulp.LpBinary) for i in range(n)]
    prob += pulp.lpSum(p * v for p, v in zip(profit, x, strict=True))
    rows_of = [[] for _ in range(n)]
    cons = []
    for r in range(rows):
        idx = rng.sample(range(n), k)
        coef = {i: rng.randint(5, 60) for i in idx}
        cap = rng.randint(60, 150)
        prob += pulp.lpSum(c * x[i] for i, c in coef.items()) <= cap, f"row_{r}"
        cons.append([coef, cap, 0])
        for i in idx:
            rows_of[i].append(r)
    take = {}
    for i in sorted(range(n), key=lambda i: -profit[i]):  # greedy by profit
        if all(cons[r][2] + cons[r][0][i] <= cons[r][1] for r in rows_of[i]):
            for r in rows_of[i]:
                cons[r][2] += cons[r][0][i]
            take[i] = 1
    greedy_value = sum(profit[i] for i in take)
    start = {f"x{i}": float(i in take) for i in range(n)}
    return prob, greedy_value, start


@pytest.fixture(scope="module")
def big_packing():
    return packing()


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("maximise", [True, False])
def test_small_milp_optimal_with_bound_equal_to_objective(solver, maximise):
    prob, x, best = knapsack(maximise=maximise, constant=7.5)
    out = solve_pulp(prob, solver=solver, deadline=Deadline(None))
    assert isinstance(out, PulpOutcome)
    assert out.status == "optimal" and out.proven and out.has_solution
    assert out.objective == pytest.approx(best, abs=TOL)  # the constant is included
    assert out.bound == pytest.approx(best, abs=TOL)
    # a lower bound when minimising, an upper bound when maximising
    assert (out.bound >= out.objective) if maximise else (out.bound <= out.objective)
    assert not out.killed
    # the values are returned by name and written into the problem's variables
    assert set(out.values) == {v.name for v in x}
    assert pulp.value(prob.objective) == pytest.approx(best, abs=TOL)
    assert out.value(x[0]) == out.values["take_0"] == x[0].varValue


@pytest.mark.parametrize("solver", SOLVERS)
def test_lp_optimal(solver):
    prob = pulp.LpProblem("lp", pulp.LpMinimize)
    a, b = pulp.LpVariable("a", 0), pulp.LpVariable("b", 0)
    prob += 3 * a + 2 * b + 1
    prob += a + b >= 4
    prob += a - b <= 1
    prob += b <= 3
    out = solve_pulp(prob, solver=solver, deadline=Deadline(None))
    assert out.status == "optimal"
    assert out.objective == pytest.approx(3 * 1 + 2 * 3 + 1, abs=TOL)
    assert out.bound == pytest.approx(out.objective, abs=TOL)


@pytest.mark.parametrize("solver", SOLVERS)
def test_infeasible_milp_and_lp_are_proven(solver):
    milp = pulp.LpProblem("odd", pulp.LpMinimize)
    x = [pulp.LpVariable(f"x{i}", cat=pulp.LpBinary) for i in range(3)]
    milp += pulp.lpSum(x)
    milp += pulp.lpSum(2 * v for v in x) == 3  # an even sum cannot be 3
    lp = pulp.LpProblem("box", pulp.LpMinimize)
    y = pulp.LpVariable("y", 0, 1)
    lp += y
    lp += y >= 2
    for prob in (milp, lp):
        out = solve_pulp(prob, solver=solver, deadline=Deadline(None))
        assert out.status == "infeasible"
        assert out.values == {} and out.objective is None and out.bound is None
        assert not out.has_solution


@pytest.mark.parametrize("solver", SOLVERS)
def test_unbounded_lp(solver):
    prob = pulp.LpProblem("ray", pulp.LpMaximize)
    a, b = pulp.LpVariable("a", 0), pulp.LpVariable("b", 0)
    prob += a + b
    prob += a - b <= 1
    out = solve_pulp(prob, solver=solver, deadline=Deadline(None))
    assert out.status == "unbounded"
    assert out.bound is None and not out.has_solution


@pytest.mark.parametrize("solver", SOLVERS)
def test_model_without_objective_and_with_odd_names(solver):
    prob = pulp.LpProblem("find")
    x = pulp.LpVariable("x-y[1]", 0, 3, cat=pulp.LpInteger)  # PuLP names it x_y_1_
    prob += x >= 2
    out = solve_pulp(prob, solver=solver, deadline=Deadline(None), warm_start={x: 3})
    assert out.status == "optimal"
    assert set(out.values) == {x.name}  # no PuLP dummy column
    assert 2 <= out.value(x) <= 3
    assert out.objective == 0.0


@pytest.mark.parametrize("solver", SOLVERS)
def test_expired_deadline_runs_no_solver(solver):
    prob, _, _ = knapsack()
    d = Deadline(0.001)
    time.sleep(0.01)
    out = solve_pulp(prob, solver=solver, deadline=d)
    assert out.status == "no_solution" and out.solver_status == "not run"
    assert out.values == {} and out.bound is None and not out.killed


@pytest.mark.parametrize("solver", SOLVERS)
def test_stopped_big_model_is_never_optimal_and_keeps_the_deadline(solver, big_packing):
    """1 s on a model no solver closes in 1 s. CBC alone runs about 9 s here (its first LP
    ignores the limit); the door ends it. The wall-time check has a wide margin: it is the
    contract (the deadline holds), not a speed."""
    prob, greedy_value, _ = big_packing
    limit = 1.0
    d = Deadline(limit)
    out = solve_pulp(prob, solver=solver, deadline=d)
    wall = d.elapsed()
    assert out.status in ("feasible", "no_solution")
    assert not out.proven
    if out.bound is not None:  # an upper bound (maximisation): above every feasible value
        assert out.bound >= greedy_value - TOL
        if out.objective is not None:
            assert out.bound >= out.objective - TOL
    if out.has_solution:
        assert out.objective <= out.bound + TOL if out.bound is not None else True
        # the incumbent is a feasible point of the model
        for name, c in prob.constraints.items():
            assert c.value() <= 1e-6, name
    assert wall <= limit + kill_grace(limit) + 5.0  # generous: without the kill CBC takes ~9 s
    assert out.runtime <= wall


@pytest.mark.parametrize("solver", SOLVERS)
def test_warm_start_is_accepted(solver):
    prob, greedy_value, start = packing(n=300, rows=300)
    out = solve_pulp(prob, solver=solver, deadline=Deadline(2), warm_start=start)
    assert out.start_accepted is True
    assert out.has_solution
    assert out.objective >= greedy_value - TOL  # never worse than the start


@pytest.mark.parametrize("solver", SOLVERS)
def test_warm_start_on_a_small_model(solver):
    prob, x, best = knapsack(n=10)
    start = {v: 0 for v in x}  # taking nothing is feasible
    out = solve_pulp(prob, solver=solver, deadline=Deadline(None), warm_start=start)
    assert out.status == "optimal"
    assert out.objective == pytest.approx(best, abs=TOL)
    assert out.start_accepted in (True, None)  # HiGHS's presolve may solve it before looking


def test_cbc_says_when_a_start_is_infeasible():
    prob, x, _ = knapsack(n=10)
    out = solve_pulp(prob, solver="cbc", deadline=Deadline(None), warm_start={v: 1 for v in x})
    assert out.status == "optimal"
    assert out.start_accepted is False


def test_warm_start_with_an_unknown_variable_is_a_programming_error():
    prob, _, _ = knapsack(n=4)
    with pytest.raises(ValueError, match="no_such_var"):
        solve_pulp(prob, solver="cbc", warm_start={"no_such_var": 1})


def test_in_process_highs_for_small_models():
    prob, _, best = knapsack()
    out = solve_pulp(prob, solver="highs", deadline=Deadline(None), isolate=False)
    assert out.status == "optimal" and out.objective == pytest.approx(best, abs=TOL)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"solver": "gurobi"}, "unknown MILP solver"),
        ({"rel_gap": -1}, "rel_gap"),
        ({"rel_gap": float("nan")}, "rel_gap"),
        ({"abs_gap": -1.0}, "abs_gap"),
        ({"threads": 0}, "threads"),
        ({"threads": 1.5}, "threads"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_options(kw, match):
    prob, _, _ = knapsack(n=4)
    with pytest.raises(InvalidProblemError, match=match):
        solve_pulp(prob, **kw)


def test_cbc_log_bound_rounds_printed_numbers_down():
    log = (
        "Continuous objective value is 100.9 - 0.03 seconds\n"
        "Cbc0010I After 100 nodes, 3 on tree, 120.5 best solution, best possible 110.25 (1.0 seconds)\n"
        "Lower bound:                    110.250\n"
    )
    b = cbc_log_bound(log)
    assert b <= 110.25 and b == pytest.approx(110.25, abs=1e-2)
    assert cbc_log_bound(log, interrupted=True) <= 100.9  # only the LP relaxation is trusted
    assert cbc_log_bound("Cbc0005I Partial search - best objective 1e+50 (best possible 1e+50)") is None
    assert cbc_log_bound("nothing here") is None
    # "Objective value:" is CBC's incumbent, never read as a bound (optimal = within the gap:
    # the door takes the allowed gap off the objective instead)
    done = "Objective value:                100.90035349\n"
    assert cbc_log_bound(done) is None
    assert cbc_log_bound(done, optimal=True) is None


def tiny_coefficient_model():
    """A 4-binary model of the partition MILP (3 stages of 5 layers) where CBC 2.10's integer
    preprocessing cut off the optimum (132.494...) and claimed 148.649... optimal: its window
    row carries a coefficient of 7.8e-8 (a transfer time in units of 1/100 of the bound)."""
    prob = pulp.LpProblem("partition_straight", pulp.LpMinimize)
    T = pulp.LpVariable("bottleneck", lowBound=100)
    y11, y12, y22, y23 = (pulp.LpVariable(f"started_{a}_by_{b}", cat=pulp.LpBinary)
                          for a, b in ((1, 1), (1, 2), (2, 2), (2, 3)))
    wm1, wm2, ws1, ws2 = (pulp.LpVariable(n) for n in ("window_min_1", "window_min_2", "window_sum_1", "window_sum_2"))
    prob += T
    prob += -T - 3.89206455902e-08 * y11 - 5.8277179997e-05 * y12 <= -6.33109168267e-05
    prob += -T - 5.8277179997e-05 * y22 - 0.0067385648949 * y23 <= -0.00680187581172
    prob += y11 - y12 <= 0
    prob += y22 - y23 <= 0
    prob += -y11 + y22 <= 0
    prob += -y12 + y23 <= 0
    prob += -T - 94.8032059518 * y11 - 53.8459268928 * y12 <= -186.34014831
    prob += -T + 94.8032059518 * y11 + 53.8459268928 * y12 - 53.8459268928 * y22 - 7.23629928261 * y23 <= -7.23629928261
    prob += -T + 53.8459268928 * y22 + 7.23629928261 * y23 <= -100
    prob += -2 * T - 53.8459268928 * y22 - 7.23629928261 * y23 - wm1 + ws1 <= -193.576447592
    prob += -3 * T - wm2 + ws2 <= -293.576447592
    prob += wm1 <= 0
    prob += T + 94.8032059518 * y11 + 53.8459268928 * y12 + wm1 - ws1 <= 186.34014831
    prob += -wm1 + wm2 <= 0
    prob += 2 * T + 53.8459268928 * y22 + 7.23629928261 * y23 + wm2 - ws2 <= 193.576447592
    prob += 7.78412911803e-08 * y11 + 0.000116554359994 * y12 + ws1 == 0.000126621833653
    prob += 0.000116554359994 * y22 + 0.0134771297898 * y23 - ws1 + ws2 == 0.0136037516234
    return prob


def test_tiny_coefficients_go_to_highs_and_keep_the_optimum():
    """The optimum (y = 0, 1, 0, 1: T = 186.340... - 53.846..., found by hand from the rows) is
    HiGHS's; asked of CBC (whose integer preprocessing claimed 148.649 optimal), the door solves
    the model with HiGHS and says so (CBC_TINY)."""
    for solver in ("highs", "cbc"):
        out = solve_pulp(tiny_coefficient_model(), solver=solver, rel_gap=1e-9)
        assert out.status == "optimal"
        assert out.objective == pytest.approx(186.34014831 - 53.8459268928, rel=1e-7)
        assert any("CBC_TINY" in note for note in out.notes) == (solver == "cbc")
        assert out.solver == "highs"
