"""The one rule for the time unit of an exact model: seconds per unit of its time values."""

from __future__ import annotations

import math

UNIT_FLOOR = 1e-290
"""The smallest time unit (seconds) a model uses: far below it the unit's reciprocal (the factor
a model multiplies its seconds by) would overflow, as with subnormal layer times (2.2e-309 s).
Times of 1e-205 s keep their own scale (a unit of 1 s there left the solver's tolerance larger
than every time, and its bound above the plan's evaluated 0)."""


def model_unit(reference: float, values: float) -> float:
    """Seconds per unit of a model's time values, so that ``reference`` seconds is ``values``
    units (the solvers' tolerances, about 1e-6, are then a negligible fraction of the times).

    Parameters
    ----------
    reference
        A time the model's values should be measured against, seconds (a lower bound, a known
        plan's objective).
    values
        How many units ``reference`` should be (100 for the bottleneck MILPs, 1000 for the
        event-time MILPs, the tick count for CP-SAT).

    Returns
    -------
    float
        ``reference / values``, at least :data:`UNIT_FLOOR`; ``1.0`` if ``reference`` is not a
        positive finite number.
    """
    if not (isinstance(reference, (int, float)) and math.isfinite(reference) and reference > 0):
        return 1.0
    return max(float(reference) / values, UNIT_FLOOR)
