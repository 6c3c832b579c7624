"""The one clock of a solve: pipeopt.backends.deadline.Deadline."""

from __future__ import annotations

import math
import time

import pytest

from pipeopt.backends.deadline import Deadline, DeadlineReached
from pipeopt.errors import InvalidProblemError, PipeoptError


@pytest.mark.parametrize("limit", [0, -1, -0.5, math.nan, -math.inf, "5", True, False, [1], 1j])
def test_invalid_limits_are_rejected_naming_the_value(limit):
    with pytest.raises(InvalidProblemError, match="time limit") as err:
        Deadline(limit)
    assert repr(limit) in str(err.value)


@pytest.mark.parametrize("limit", [None, math.inf])
def test_no_limit(limit):
    d = Deadline(limit)
    assert not d.bounded
    assert d.remaining() == math.inf
    assert not d.expired()
    d.check("anything")  # never raises
    assert d.elapsed() >= 0


@pytest.mark.parametrize("limit", [1, 2.5, 10**6])
def test_positive_limits(limit):
    d = Deadline(limit)
    assert d.bounded and d.limit == float(limit)
    assert d.end == pytest.approx(d.started + limit)
    assert 0 < d.remaining() <= limit
    assert not d.expired()


def test_numpy_numbers_are_accepted():
    np = pytest.importorskip("numpy")
    assert Deadline(np.float64(3.0)).limit == 3.0
    assert Deadline(np.int64(2)).limit == 2.0


def test_expiry_and_check():
    d = Deadline(0.02)
    time.sleep(0.05)
    assert d.expired()
    assert d.remaining() == 0.0
    assert d.elapsed() >= 0.05
    with pytest.raises(DeadlineReached, match="bisection step 3") as err:
        d.check("bisection step 3")
    assert err.value.what == "bisection step 3"
    assert err.value.elapsed >= 0.05


def test_deadline_reached_is_internal_not_an_api_error():
    assert not issubclass(DeadlineReached, PipeoptError)


def test_of_passes_deadlines_through_and_wraps_numbers():
    d = Deadline(5)
    assert Deadline.of(d) is d
    assert Deadline.of(3).limit == 3.0
    assert not Deadline.of(None).bounded
    with pytest.raises(InvalidProblemError):
        Deadline.of(0)


def test_sub_shares_the_clock_and_never_ends_later():
    d = Deadline(100)
    s = d.sub(1.0)
    assert s.started == d.started  # elapsed() still counts from solve entry
    assert s.end <= d.end
    assert s.remaining() <= 1.0
    assert d.sub(1000).end == d.end  # capped by the parent
    half = d.sub(fraction=0.5)
    assert half.remaining() <= 0.5 * d.remaining() + 1e-3
    assert d.sub().end == d.end
    u = Deadline(None).sub(2.0)
    assert u.bounded and u.remaining() <= 2.0
    assert not Deadline(None).sub(fraction=0.5).bounded


@pytest.mark.parametrize("kw", [{"seconds": 0}, {"seconds": -1}, {"fraction": 0}, {"fraction": 1.5}])
def test_sub_rejects_bad_arguments(kw):
    with pytest.raises(InvalidProblemError):
        Deadline(10).sub(**kw)


def test_sub_of_an_expired_deadline_is_expired():
    d = Deadline(0.01)
    time.sleep(0.03)
    assert d.sub(5).expired()
    assert d.sub(fraction=0.5).expired()
