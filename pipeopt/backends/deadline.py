"""One clock per solve: the :class:`Deadline` created at :func:`pipeopt.solve` entry.

Everything a method does under a time limit draws from the same deadline: start heuristics,
bound LPs, every bisection step and every solver call (the PuLP and CP-SAT doors,
:func:`pipeopt.backends.pulp.solve_pulp` and :func:`pipeopt.backends.cpsat.solve_cpsat`, take
the deadline itself and give the solver what is left). ``Result.runtime`` is
:meth:`Deadline.elapsed`, the wall time since entry.

A step that may be cut short asks :meth:`Deadline.check` between units of work; when time is
up that raises :class:`DeadlineReached`, which the method catches to return its incumbent
with status ``time_limit``. A step that should use only part of what is left (a bound LP
that must leave time for the search) takes a :meth:`Deadline.sub` deadline: the same clock
with an earlier end.
"""

from __future__ import annotations

import math
import numbers
import time

from ..errors import InvalidProblemError

__all__ = ["Deadline", "DeadlineReached"]


class DeadlineReached(Exception):  # noqa: N818 - a signal, not an error
    """Internal signal: the deadline passed during ``what``.

    Not a :class:`~pipeopt.errors.PipeoptError`: it never leaves a method, which catches it
    and returns its incumbent with status ``time_limit``.

    Attributes
    ----------
    what
        The step that was cut short (e.g. ``"bisection step 7"``).
    elapsed
        Seconds since the deadline's clock started.
    """

    def __init__(self, what: str, elapsed: float):
        super().__init__(f"time limit reached during {what} after {elapsed:.3f} s")
        self.what = what
        self.elapsed = elapsed


def _validate_limit(limit) -> float:
    """Seconds as a float (``math.inf`` for no limit), or :class:`InvalidProblemError`."""
    if limit is None:
        return math.inf
    if isinstance(limit, bool) or not isinstance(limit, numbers.Real):
        raise InvalidProblemError(
            f"time limit must be a positive number of seconds (or None for no limit), got {limit!r}"
        )
    value = float(limit)
    if math.isnan(value) or value <= 0:
        raise InvalidProblemError(
            f"time limit must be a positive number of seconds (or None for no limit), got {limit!r}"
        )
    return value  # +inf: no limit


class Deadline:
    """A wall-clock deadline: the time limit of one solve, measured from its creation.

    Parameters
    ----------
    limit
        Seconds (positive; ``None`` or ``math.inf`` for no limit).
    clock
        Internal: the ``time.perf_counter`` origin to share (used by :meth:`sub`); a new
        deadline starts its own clock now.

    Attributes
    ----------
    started
        ``time.perf_counter()`` at creation (the origin of :meth:`elapsed`).
    limit
        Seconds from ``started`` to the end (``math.inf`` if none).
    end
        ``started + limit`` on the ``time.perf_counter`` clock (``math.inf`` if none).

    Raises
    ------
    InvalidProblemError
        If ``limit`` is not a positive number (zero, negative, NaN, a string, a bool).

    Examples
    --------
    >>> d = Deadline(5.0)
    >>> 0.0 <= d.elapsed() < 5.0 and d.remaining() > 0 and not d.expired()
    True
    >>> Deadline(None).remaining()
    inf
    """

    __slots__ = ("end", "limit", "started")

    def __init__(self, limit: float | None, *, clock: float | None = None):
        self.limit = _validate_limit(limit)
        self.started = time.perf_counter() if clock is None else float(clock)
        self.end = self.started + self.limit

    @classmethod
    def of(cls, limit: Deadline | float | None) -> Deadline:
        """``limit`` itself if it is a :class:`Deadline`, else a new one of ``limit`` seconds.

        Lets a method called directly (not through :func:`pipeopt.solve`) take either a
        deadline or a number of seconds.

        Parameters
        ----------
        limit
            A deadline, seconds, or ``None`` (no limit).

        Returns
        -------
        Deadline

        Raises
        ------
        InvalidProblemError
            If ``limit`` is a number that is not a valid time limit.
        """
        return limit if isinstance(limit, Deadline) else cls(limit)

    @property
    def bounded(self) -> bool:
        """``True`` if there is a limit at all."""
        return math.isfinite(self.limit)

    def elapsed(self) -> float:
        """Seconds since :attr:`started` (wall time, ``time.perf_counter``)."""
        return time.perf_counter() - self.started

    def remaining(self) -> float:
        """Seconds left, ``>= 0`` (``math.inf`` without a limit)."""
        if not self.bounded:
            return math.inf
        return max(0.0, self.end - time.perf_counter())

    def expired(self) -> bool:
        """``True`` once the deadline has passed."""
        return self.bounded and time.perf_counter() >= self.end

    def check(self, what: str = "the solve") -> None:
        """Raise :class:`DeadlineReached` if the deadline has passed.

        Parameters
        ----------
        what
            The step about to run or running, named in the signal.

        Raises
        ------
        DeadlineReached
            If :meth:`expired`.
        """
        if self.expired():
            raise DeadlineReached(what, self.elapsed())

    def sub(self, seconds: float | None = None, *, fraction: float | None = None) -> Deadline:
        """A deadline on the same clock that ends no later than this one.

        Parameters
        ----------
        seconds
            At most this many seconds from now.
        fraction
            At most this fraction (0 < fraction <= 1) of what is left now.

        Returns
        -------
        Deadline
            Same :attr:`started` (so ``elapsed()`` still counts from solve entry), end
            ``min(self.end, now + seconds, now + fraction * remaining)``. With neither
            argument, a copy of this deadline.

        Raises
        ------
        InvalidProblemError
            If ``seconds`` is not positive or ``fraction`` is outside (0, 1].
        """
        now = time.perf_counter()
        end = self.end
        if seconds is not None:
            end = min(end, now + _validate_limit(seconds))
        if fraction is not None:
            f = float(fraction)
            if not 0.0 < f <= 1.0:
                raise InvalidProblemError(f"deadline fraction must be in (0, 1], got {fraction!r}")
            if self.bounded:
                end = min(end, now + f * max(0.0, self.end - now))
        child = Deadline(None, clock=self.started)
        child.limit = end - self.started
        child.end = end
        return child

    def __repr__(self) -> str:
        if not self.bounded:
            return f"Deadline(None, elapsed={self.elapsed():.3f}s)"
        return f"Deadline({self.limit:.3f}s, remaining={self.remaining():.3f}s)"
