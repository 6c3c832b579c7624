"""The rules written once in pipeopt/cost/rules.py (issue 22): the overlap rule (the sender
carries its transfer), the one-order windows, the window recursion's carry; and the named
tolerances they read."""

from __future__ import annotations

import numpy as np
import pytest

from pipeopt.cost import rules, tolerance


@pytest.mark.parametrize("S", [1, 2, 5])
def test_windows_are_in_flight_of_every_stage(S):
    assert rules.windows(S) == [S - s for s in range(S)]
    assert rules.windows(S, split=True) == [2 * (S - s) for s in range(S)]
    assert rules.windows(S) == [rules.in_flight(s, S) for s in range(S)]


def test_the_sender_carries_its_transfer_without_overlap():
    x, y = [10.0, 20.0], [1.0, 2.0]
    S = 3
    assert [rules.carried(s, S, 100.0, 200.0, x, y, True) for s in range(S)] == [(100.0, 200.0)] * 3
    # stage s sends its activations over cut s (forward) and its gradients over cut s - 1 (backward)
    assert [rules.carried(s, S, 100.0, 200.0, x, y, False) for s in range(S)] == \
        [(110.0, 200.0), (120.0, 201.0), (100.0, 202.0)]
    assert rules.on_links(x, y, True) == (x, y)
    assert rules.on_links(x, y, False) == ([0.0, 0.0], [0.0, 0.0])
    assert rules.on_links([], [], False, 1) == ([], [])


def test_boundary_terms():
    send, busy, trip = np.array([0.0, 3.0, 0.0]), np.array([0.0, 4.0, 0.0]), np.array([0.0, 6.0, 0.0])
    added, bound, t = rules.boundary_terms(send, busy, trip, True)
    assert not added.any() and (bound == busy).all() and (t == trip).all()
    added, bound, t = rules.boundary_terms(send, busy, trip, False)
    assert (added == send).all() and not bound.any() and not t.any()


def test_window_step_is_the_brute_force_window_rows():
    rng = np.random.default_rng(3)
    for _ in range(50):
        S = int(rng.integers(1, 7))
        w, C = rng.uniform(0, 1, S), rng.uniform(0, 0.5, max(S - 1, 0))
        D = np.array(rules.windows(S), dtype=float)
        U = D - 1
        T = float(rng.uniform(0.3, 1.5))
        G, prev = [], -np.inf
        for l in range(S):
            prev, ok = rules.window_step(prev, C[l - 1] if l else 0.0, w[l], D[l], U[l], T)
            assert prev == w[l] + rules.window_carry(G[-1] if G else -np.inf, C[l - 1] if l else 0.0, D[l], T)
            G.append(prev)
            rows = [w[i:l + 1].sum() + C[i:l].sum() <= (D[i] - U[l]) * T * (1 + 1e-12) for i in range(l + 1)]
            brute = [w[i:l + 1].sum() + C[i:l].sum() - (D[i] - U[l]) * T for i in range(l + 1)]
            assert bool(ok) == all(rows) or abs(max(brute)) < 1e-12


def test_tolerances_are_named_once():
    from pipeopt import result
    from pipeopt.problems import secondary
    from pipeopt.problems.partition import model

    assert rules.MEMORY_SLACK == secondary.CAP_REL == result.BOUND_TOLERANCE == tolerance.SUM_ORDER
    assert model.MILP_REL_GAP == model.BOUND_SLACK == tolerance.SOLVER_GAP
    assert model.MILP_TOLERANCE == tolerance.SOLVER_CLAIM
    assert tolerance.FLOAT_NOISE < tolerance.SUM_ORDER < tolerance.SOLVER_GAP < tolerance.SOLVER_CLAIM
