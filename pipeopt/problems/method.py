"""What every method of every problem declares about itself: :class:`Method`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    """One method of one problem, referenced directly (no dispatch through strings).

    Every method is a plain function ``function(problem, *, time_limit=60.0, solver="cbc",
    seed=0, threads=2) -> Result``: ``time_limit`` is seconds or the
    :class:`~pipeopt.backends.deadline.Deadline` that :func:`pipeopt.solve` created at entry;
    ``solver`` the MILP backend (``"cbc"`` or ``"highs"``); ``threads`` the CP-SAT search
    threads. A method that does not use an argument accepts and ignores it (a heuristic has
    no solver).

    Attributes
    ----------
    problem
        Problem name (``"partition"``, ...).
    name
        Method name as typed on the command line.
    function
        The method function.
    exact
        True if the method proves optimality or a lower bound.
    space
        Search space it covers (:mod:`pipeopt.problems.spaces`; a gap is taken against bounds of
        the same or a larger space): ``"one-order"`` or ``"replicated-one-order"`` for
        partition; ``"auto"`` follows the problem's option.
    default
        Part of the default ``pipeopt bench`` run.
    source
        Paper or framework it implements.
    requires
        What an instance must carry for the method to apply (``""``: any instance;
        ``"torch"``: a layer graph of :func:`pipeopt.torch.from_torch` at a container
        granularity, which the frameworks' block-counting splits read). Elsewhere the method
        raises :class:`~pipeopt.errors.InvalidProblemError`.
    """

    problem: str
    name: str
    function: Callable
    exact: bool
    space: str = "auto"
    default: bool = True
    source: str = ""
    requires: str = ""

    def __call__(self, problem, **kw):
        """Run the method on a problem object."""
        return self.function(problem, **kw)
