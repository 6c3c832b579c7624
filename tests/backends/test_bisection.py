"""The one bisection on T (pipeopt.backends.bisection.bisect) and its greedy adapter bisect_limit."""

from __future__ import annotations

import math
import time

import pytest

from pipeopt.backends.bisection import (
    FEASIBLE,
    INFEASIBLE,
    UNKNOWN,
    Bisection,
    LimitSearch,
    Probe,
    bisect,
    bisect_limit,
)
from pipeopt.backends.deadline import Deadline


def exact_probe(optimum: float, calls: list | None = None):
    """A proof-giving probe of a problem whose optimum is ``optimum``: at T >= optimum the plan
    "optimum" itself (value = optimum), below it a proof of infeasibility."""

    def probe(T, deadline):
        if calls is not None:
            calls.append((T, deadline))
        return Probe(FEASIBLE, ("plan", optimum), optimum) if T >= optimum else Probe(INFEASIBLE)

    return probe


def test_exact_probe_closes_the_bracket_around_the_optimum():
    found = bisect(exact_probe(3.7), 1.0, 10.0, start=("start", 10.0), rel_tol=1e-6)
    assert isinstance(found, Bisection)
    assert found.closed and found.plan == ("plan", 3.7) and found.value == found.upper == 3.7
    assert found.stop == "closed"
    assert found.lower <= 3.7 and found.upper - found.lower <= 1e-6 * found.lower
    # the first feasible probe jumps the upper end to the plan's value: every later probe is below it
    assert [o for _, o in found.steps][0] == FEASIBLE
    assert all(o == INFEASIBLE for _, o in found.steps[1:])
    assert found.iterations == len(found.steps)


def test_closed_means_within_rel_tol_of_the_lower_bound():
    """Closed is measured against the lower end, so the plan is within (1 + rel_tol) of any optimum
    the lower end bounds (not only of the plan's own value)."""
    for opt in (0.37, 1.0, 2.5e-4):
        found = bisect(exact_probe(opt), 0.0, 4.0 * opt, start="s", rel_tol=1e-4)
        assert found.closed and found.upper <= (1 + 1e-4) * found.lower and found.lower <= opt


def test_start_value_and_bounds_that_already_meet():
    found = bisect(exact_probe(2.0), 2.0, 2.0, start="given")
    assert found.closed and found.plan == "given" and found.steps == []


def test_without_a_start_the_top_is_probed_first_with_all_the_time():
    calls = []
    d = Deadline(30)
    found = bisect(exact_probe(3.0, calls), 0.5, 8.0, deadline=d, step_share=0.1, rel_tol=1e-3)
    assert calls[0][0] == 8.0 and calls[0][1] is d  # the top, the whole deadline
    assert found.closed and found.plan == ("plan", 3.0)


def test_without_a_start_an_infeasible_top_is_a_closed_search_without_plan():
    found = bisect(lambda T, d: Probe(INFEASIBLE), 0.5, 8.0)
    assert found.plan is None and found.closed and found.lower == 8.0 and found.value == math.inf
    undecided = bisect(lambda T, d: Probe(UNKNOWN), 0.5, 8.0)
    assert undecided.plan is None and not undecided.closed and undecided.lower == 0.5
    assert undecided.stop == "undecided"


def test_unknown_answers_are_searched_around():
    """A probe that cannot decide above 5 on its share of the time: the search goes below (and
    proves what it can there), then retries above with all the time left."""
    full = Deadline(60)

    def probe(T, deadline):
        if T > 5.0 and deadline is not full:
            return Probe(UNKNOWN)
        return exact_probe(6.0)(T, deadline)

    found = bisect(probe, 2.0, 9.0, start="s", deadline=full, step_share=0.2, rel_tol=1e-6)
    outcomes = [o for _, o in found.steps]
    assert outcomes[0] == UNKNOWN and INFEASIBLE in outcomes
    assert found.closed and found.upper == 6.0 and found.lower <= 6.0


def test_a_probe_that_never_decides_stops_the_search_with_a_valid_bracket():
    def probe(T, deadline):
        return Probe(UNKNOWN) if T > 2.0 else Probe(INFEASIBLE)

    found = bisect(probe, 1.0, 9.0, start="s", deadline=Deadline(60), step_share=0.2, rel_tol=1e-6)
    assert not found.closed and found.plan == "s" and found.upper == 9.0
    assert 1.0 < found.lower <= 2.0
    assert found.stop == "undecided"  # stopped with time left: the caller must not call it a time limit


def test_a_plan_that_does_not_improve_the_incumbent_is_no_progress():
    """A solver's plan whose exact value is not below the incumbent (it missed T beyond its
    tolerance) counts as undecided, never as a move of the upper end."""

    def probe(T, deadline):
        return Probe(FEASIBLE, "bad", 9.5) if T > 4.0 else Probe(INFEASIBLE)

    found = bisect(probe, 1.0, 9.0, start="s", rel_tol=1e-6)
    assert found.plan == "s" and found.upper == 9.0 and not found.closed


def test_each_probe_gets_its_share_of_the_time():
    calls = []
    d = Deadline(100)
    bisect(exact_probe(3.0, calls), 1.0, 10.0, start="s", deadline=d, step_share=0.25, min_step=1.0, rel_tol=1e-2)
    for _, step in calls:
        assert step is not d and step.started == d.started and step.end <= d.end
        assert step.remaining() <= 0.25 * 100 + 1e-6


def test_no_probe_after_the_deadline():
    calls = []
    late = Deadline(1e-9)
    time.sleep(0.001)
    found = bisect(exact_probe(3.0, calls), 1.0, 10.0, start="s", deadline=late)
    assert calls == [] and found.plan == "s" and not found.closed and found.stop == "deadline"
    assert bisect(exact_probe(3.0, calls), 1.0, 10.0, deadline=late).plan is None and calls == []


def test_score_picks_the_plan_kept():
    def probe(T, deadline):
        return Probe(FEASIBLE, [T]) if T >= 3.7 else Probe(INFEASIBLE)

    found = bisect(probe, 0.0, 10.0, start=[10.0], score=lambda st: (st[0] - 6.0) ** 2)
    assert found.plan == [5.0] and found.upper < 3.7 * (1 + 2e-9)


def test_bisect_limit_keeps_its_contract():
    """The greedy adapter: (starts, limit, iterations), check(lo) first, deadlines as perf_counter
    values or Deadline objects."""

    def check(T):
        return [T] if T >= 3.7 else None

    found = bisect_limit(check, 0.0, 10.0, [10.0], rel_tol=1e-9)
    assert isinstance(found, LimitSearch)
    assert 3.7 <= found.limit <= 3.7 * (1 + 2e-9) and found.starts == [found.limit]
    assert bisect_limit(check, 4.0, 10.0, [10.0]) == ([4.0], 4.0, 0)
    assert bisect_limit(check, 0.0, 10.0, [10.0], max_iter=3) == ([3.75], 3.75, 3)
    assert bisect_limit(check, 0.0, 10.0, [10.0], deadline=time.perf_counter() - 1.0) == ([10.0], 10.0, 0)
    late = Deadline(1e-9)
    time.sleep(0.001)
    assert bisect_limit(check, 0.0, 10.0, [10.0], deadline=late) == ([10.0], 10.0, 0)


@pytest.mark.parametrize("opt", [0.1, 1.0, 123.0])
def test_bisect_limit_and_bisect_agree_on_a_greedy_check(opt):
    def check(T):
        return [T] if T >= opt else None

    a = bisect_limit(check, 0.0, 4 * opt, [4 * opt], rel_tol=1e-9)
    b = bisect(lambda T, d: Probe(FEASIBLE, check(T)) if check(T) else Probe(INFEASIBLE), 0.0, 4 * opt,
               start=[4 * opt], rel_tol=1e-9, probe_lower=True)
    assert (a.starts, a.limit, a.iterations) == (b.plan, b.upper, b.iterations)


def test_stop_reasons_max_iter_and_floats():
    capped = bisect(exact_probe(3.0), 1.0, 10.0, start="s", max_iter=2, rel_tol=1e-9)
    assert not capped.closed and capped.stop == "max_iter" and capped.iterations == 2
    tiny = bisect(exact_probe(1.0), 1.0, math.nextafter(1.0, 2.0), start="s", rel_tol=0.0)
    assert tiny.stop == "floats" and tiny.iterations == 0


def staircase_probe(values: list, optimum: float, calls: list):
    """A proof-giving probe whose plans improve in steps: at T it returns the largest of
    ``values`` (then ``optimum``) that is <= T, and proves infeasibility below ``optimum``."""

    def probe(T, deadline):
        calls.append(T)
        if T < optimum:
            return Probe(INFEASIBLE)
        v = max(x for x in [*values, optimum] if x <= T)
        return Probe(FEASIBLE, ("plan", v), v)

    return probe


def test_probe_top_closes_on_an_optimal_start_in_one_probe():
    calls: list = []
    found = bisect(staircase_probe([], 3.0, calls), 1.0, 3.0, start="start", rel_tol=1e-4, probe_top=True)
    assert found.closed and found.plan == "start" and found.lower <= 3.0
    assert len(calls) == 1 and calls[0] < 3.0 <= calls[0] * (1 + 1e-4)
    plain: list = []
    assert bisect(staircase_probe([], 3.0, plain), 1.0, 3.0, start="start", rel_tol=1e-4).closed
    assert len(plain) > 10  # the midpoints walk the lower end up from 1.0


def test_probe_top_follows_improving_plans_then_bisects():
    # the start 3.0 is not optimal: plans at 2.9 and 2.8 lie just below it, the optimum is 2.0
    calls: list = []
    found = bisect(staircase_probe([2.9, 2.8], 2.0, calls), 1.0, 3.0, start="start", rel_tol=1e-4, probe_top=True)
    assert found.closed and found.plan == ("plan", 2.0) and found.lower <= 2.0 <= found.upper
    from pipeopt.backends.bisection import TOP_PROBES

    tops = calls[:TOP_PROBES]
    assert [round(t, 3) for t in tops[:2]] == [3.0, 2.9]  # each just below the incumbent
    assert found.upper - found.lower <= 1e-4 * found.lower


def test_probe_top_gets_a_smaller_clock_than_a_midpoint():
    """A top probe is given TOP_SHARE of a midpoint's share of the time left (a poor start
    must not cost a midpoint's worth of clock); both are sub-deadlines of the search's."""
    from pipeopt.backends.bisection import TOP_SHARE
    from pipeopt.backends.deadline import Deadline

    given: list = []

    def probe(T, deadline):
        given.append((T, deadline.remaining()))
        if T > 2.9:  # just below the start: undecided, the midpoints follow
            return Probe(UNKNOWN)
        return Probe(INFEASIBLE) if T < 2.0 else Probe(FEASIBLE, ("plan", T), T)

    found = bisect(probe, 1.0, 3.0, start="start", rel_tol=1e-2, probe_top=True, deadline=Deadline(1000.0),
                   step_share=0.3)
    assert found.closed
    (top_T, top), (mid_T, mid) = given[0], given[1]
    assert top_T > 2.9 and mid_T < top_T
    assert math.isclose(top, TOP_SHARE * 0.3 * 1000.0, rel_tol=1e-3)
    assert math.isclose(mid, 0.3 * 1000.0, rel_tol=1e-3)


def test_first_top_probe_gets_its_own_share_of_the_clock():
    """With first_top_share, the first probe just below the start gets that share of the time
    left; a second top probe (after a plan there) and the midpoints get their usual clocks."""
    from pipeopt.backends.bisection import TOP_SHARE
    from pipeopt.backends.deadline import Deadline

    given: list = []

    def probe(T, deadline):
        given.append((T, deadline.remaining()))
        if T > 2.9:  # just below the start: a plan at 2.95, then undecided
            return Probe(FEASIBLE, ("plan", 2.95), 2.95) if len(given) == 1 else Probe(UNKNOWN)
        return Probe(INFEASIBLE) if T < 2.0 else Probe(FEASIBLE, ("plan", T), T)

    found = bisect(probe, 1.0, 3.0, start="start", rel_tol=1e-2, probe_top=True, deadline=Deadline(1000.0),
                   step_share=0.3, first_top_share=1.0)
    assert found.closed
    (first_T, first), (second_T, second), (mid_T, mid) = given[:3]
    assert first_T > second_T > 2.9 > mid_T
    assert math.isclose(first, 1000.0, rel_tol=1e-3)
    assert math.isclose(second, TOP_SHARE * 0.3 * 1000.0, rel_tol=1e-3)
    assert math.isclose(mid, 0.3 * 1000.0, rel_tol=1e-3)


def ladder_probe(values: list[float]):
    """An exact probe over a finite set of plan values that returns the *worst* plan passing T
    (the largest value <= T), so midpoints find plans that are not optimal."""

    def probe(T, deadline):
        ok = [v for v in values if v <= T]
        return Probe(FEASIBLE, ("plan", max(ok)), max(ok)) if ok else Probe(INFEASIBLE)

    return probe


@pytest.mark.parametrize("seed", range(20))
def test_top_after_plan_reaches_the_same_optimum_in_fewer_probes(seed):
    import random

    rng = random.Random(seed)
    values = sorted(rng.uniform(1.0, 10.0) for _ in range(rng.randint(1, 12)))
    runs = {flag: bisect(ladder_probe(values), 0.5, 10.0, start=("start", 10.0), rel_tol=1e-12, probe_top=True,
                         top_after_plan=flag) for flag in (False, True)}
    for found in runs.values():
        assert found.closed and found.plan == ("plan", values[0]) and found.upper == values[0]
        assert found.lower <= values[0] and found.upper - found.lower <= 1e-12 * found.lower
    assert runs[True].iterations <= runs[False].iterations
    # each probe just below a new plan either proves it or finds a better one: at most two per plan
    assert runs[True].iterations <= 2 * (len(values) + 3) + 40


def test_top_after_plan_proves_a_midpoint_plan_at_once():
    steps = bisect(ladder_probe([3.7]), 1.0, 10.0, start=("start", 10.0), rel_tol=1e-12, top_after_plan=True).steps
    assert [o for _, o in steps] == ["feasible", "infeasible"]  # the midpoint 5.5 finds 3.7, then just below it
