"""The one cost model (DESIGN.md, "The cost model").

* :func:`evaluate` scores every plan of every method (:mod:`.evaluate`).
"""

from __future__ import annotations

from .evaluate import Evaluation as Evaluation
from .evaluate import check_plan as check_plan
from .evaluate import evaluate as evaluate
from .evaluate import stage_compute as stage_compute
