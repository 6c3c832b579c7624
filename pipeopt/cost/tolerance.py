"""The numeric tolerances of pipeopt, named once by what they mean.

pipeopt compares seconds and bytes that different code paths sum in different orders (a DP
from the last stage back, :func:`pipeopt.evaluate` from the first on, a MILP on prefix sums),
and quotes solver answers that hold only within the solver's own tolerances. Each comparison
that needs a slack takes one of the constants below - by meaning, not by value - and the
modules keep their own role names (``MEMORY_SLACK``, ``CAP_REL``, ``MILP_REL_GAP``, ...) as
aliases of these, documented where they are used.

All are relative (multiply the compared value) unless said otherwise.
"""

from __future__ import annotations

__all__ = ["BISECTION_WIDTH", "FLOAT_NOISE", "SOLVER_CLAIM", "SOLVER_GAP", "SUM_ORDER"]

FLOAT_NOISE = 1e-12
"""Two floats are "the same value" (one computed two ways, a few ulps apart): a tie-break
improvement smaller than this is noise (``value < old * (1 - FLOAT_NOISE)``), a DP's row test
``K <= D T`` passes within it, an MCMC tie is one within it. About 4,500 ulps of a double:
enough for sums of a few thousand terms, far below any time that matters."""

SUM_ORDER = 1e-9
"""One quantity summed over a whole chain in two orders (prefix differences against layer by
layer): a stage fits if ``memory <= capacity (1 + SUM_ORDER)``
(:data:`pipeopt.cost.rules.MEMORY_SLACK`), a plan ties with the proven one if its period is at
most ``cap (1 + SUM_ORDER)`` (:data:`pipeopt.problems.secondary.CAP_REL`), a result's bound may
exceed its objective by this much (:data:`pipeopt.result.BOUND_TOLERANCE`), and a bisection on
the period stops when its bracket is this narrow (relative)."""

BISECTION_WIDTH = 1e-12
"""An exact DP's bisection on the period T stops when ``upper - lower <= BISECTION_WIDTH *
upper`` (or at adjacent floats): its plan is optimal within this factor, its bound the largest
T the DP proved infeasible. (The generic bisection of :mod:`pipeopt.backends.bisection`, over
solver probes, stops at :data:`SUM_ORDER`.)"""

SOLVER_GAP = 1e-7
"""A MILP solver is asked to stop at this relative (and, in model units of about 10-1000,
absolute) gap, and its dual bound is quoted less this relative slack (its feasibility
tolerances: rows hold to about 1e-6 absolute on values of order 1-1000)."""

SOLVER_CLAIM = 1e-6
"""A MILP's incumbent is claimed optimal when its value, re-scored by the evaluation, is within
this relative distance of the valid bound (the bound already less :data:`SOLVER_GAP`)."""
