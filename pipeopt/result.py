"""The outcome of one method on one instance."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from enum import Enum

from .cost import Evaluation
from .cost.tolerance import SUM_ORDER
from .errors import ClaimError
from .plan import Plan

ONE_ORDER = "one-order"
"""The default space, :data:`pipeopt.problems.spaces.ONE_ORDER` (spelled out here: the data
model imports no problem module)."""

BOUND_TOLERANCE = SUM_ORDER
"""Relative tolerance of a lower bound above its own plan's objective (float rounding of
the bound); within it the bound is taken as the objective, beyond it :class:`Result` raises
:class:`~pipeopt.errors.ClaimError`."""


def optimality_gap(objective: float, bound: float | None) -> float | None:
    """The optimality gap ``(objective - bound) / objective`` (a fraction, >= 0), the one
    definition used by :attr:`Result.gap`, the bench tables and the plots.

    Returns ``None`` without a bound, or when the objective is not finite and positive.
    """
    if bound is None or not math.isfinite(objective) or objective <= 0 or math.isnan(bound):
        return None
    return max(0.0, (objective - bound) / objective)


class Status(str, Enum):
    """What a method can say about the plan it returns."""

    OPTIMAL = "optimal"  # proven optimal (within the method's stated tolerance)
    FEASIBLE = "feasible"  # a valid plan, optimality not proven (heuristics)
    TIME_LIMIT = "time_limit"  # an exact method stopped at its time limit: incumbent + bound
    INFEASIBLE = "infeasible"  # no plan satisfies the constraints (or the heuristic's plan does not)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Result:
    """A plan, its evaluation and what the method proved.

    Attributes
    ----------
    method
        Method name (``"dp"``, ``"milp"``, ``"pipedream"``, ...).
    plan
        The plan (``None`` if no plan was found).
    evaluation
        ``evaluate(instance, plan)``; ``objective`` is always read from it. For the schedule
        problem (:mod:`pipeopt.problems.schedule`) the plan's chunks run one of torch's
        schedules and the evaluation is their :class:`pipeopt.schedules.Execution` (the
        schedule executor, :func:`pipeopt.schedules.run_schedule`: ``objective`` its
        iteration time, ``feasible`` and ``violations`` its ranks' memory), the claims check
        the same.
    status
        :class:`Status`.
    lower_bound
        Best proven lower bound on the objective in the method's search space, seconds
        (``None`` for a heuristic, which proves nothing).
    runtime
        Wall time, seconds.
    space
        Search space the method covers (:mod:`pipeopt.problems.spaces`): ``"one-order"``
        (contiguous splits of one layer order, one worker per stage), ``"replicated-one-order"``
        (the same with PipeDream's stage replication), ``"convex"`` (convex ordered stages of the
        layer DAG), ``"replicated-convex"``, or a problem-specific name (``"split"``, ...). A gap
        is taken only against a bound of the same or a larger space
        (:func:`pipeopt.problems.spaces.contains`). Also in ``info["space"]``.
    info
        Free-form details (solver name, scaling tolerance, nodes, ...); ``info["space"]`` is
        always :attr:`space`.
    """

    method: str
    plan: Plan | None
    evaluation: Evaluation | None
    status: Status
    lower_bound: float | None = None
    runtime: float = 0.0
    space: str = ONE_ORDER
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Enforce what a result may claim (the only place a bound is compared with its plan).

        * ``optimal`` and ``feasible`` need a plan that fits (a heuristic's plan that breaks
          memory is reported ``infeasible`` by :meth:`scored`);
        * a lower bound is a number, at most the objective of the plan (up to
          :data:`BOUND_TOLERANCE`, within which it is set to the objective);
        * ``optimal`` without an explicit bound has the objective as its bound;
        * ``info["space"]`` is :attr:`space`.

        Raises
        ------
        ClaimError
            If the method claims more than its plan shows (a bug in that method).
        """
        object.__setattr__(self, "status", Status(self.status))
        if self.info.get("space") != self.space:
            object.__setattr__(self, "info", {**self.info, "space": self.space})
        if self.status in (Status.OPTIMAL, Status.FEASIBLE):
            if self.plan is None or self.evaluation is None:
                raise ClaimError(f"{self.method}: status {self.status} without a plan")
            if not self.evaluation.feasible:
                raise ClaimError(
                    f"{self.method}: status {self.status} with a plan that breaks the constraints: "
                    + "; ".join(self.evaluation.violations)
                )
        if self.lower_bound is not None:
            bound = float(self.lower_bound)
            if math.isnan(bound):
                raise ClaimError(f"{self.method}: lower bound is NaN")
            obj = self.objective
            if math.isfinite(obj) and bound > obj:
                if bound > obj * (1 + BOUND_TOLERANCE) + 1e-300:
                    raise ClaimError(
                        f"{self.method}: lower bound {bound!r} s exceeds the objective {obj!r} s of its own plan"
                    )
                bound = obj
            object.__setattr__(self, "lower_bound", bound)
        elif self.status == Status.OPTIMAL:
            object.__setattr__(self, "lower_bound", self.objective)

    def as_fallback(self, method: str, why: str) -> "Result":
        """This result under the name of the method that handed the problem over (``method``),
        with ``info["fallback"]`` = ``why``: a method whose own model is too large for the
        instance returns another exact method's result on the same clock."""
        return replace(self, method=method, info={**self.info, "fallback": why})

    @classmethod
    def scored(
        cls,
        instance,
        method: str,
        plan: Plan | None,
        status: Status,
        *,
        lower_bound: float | None = None,
        started: float | None = None,
        space: str = ONE_ORDER,
        info: dict | None = None,
    ) -> Result:
        """A Result whose plan is scored by :func:`pipeopt.evaluate` on ``instance``.

        A heuristic (status ``FEASIBLE``) whose plan breaks memory gets ``INFEASIBLE``;
        ``runtime`` counts from ``started`` (a ``time.perf_counter()`` value); the instance's
        assumptions go into ``info["assumptions"]`` and ``space`` into ``info["space"]``.
        """
        from .cost import evaluate

        ev = evaluate(instance, plan) if plan is not None else None
        if ev is not None and not ev.feasible and status == Status.FEASIBLE:
            status = Status.INFEASIBLE
        from .instance import OBJECTIVE_TEXT

        info = dict(info or {})
        info.setdefault("assumptions", list(instance.assumptions) + list(instance.cost_terms)
                        + list(getattr(ev, "notes", None) or []))  # e.g. the plan's recomputation
        info["space"] = space
        info.setdefault("objective", OBJECTIVE_TEXT[instance.settings.objective])
        if ev is not None and math.isfinite(ev.objective) and "secondary" not in info:
            # the secondary objective of the tie-break (computed only when the method gave none)
            info["secondary"] = {"iteration_time": ev.iteration_time, "peak_memory": max(ev.memory)}
        return cls(
            method=method,
            plan=plan,
            evaluation=ev,
            status=status,
            lower_bound=lower_bound,
            runtime=time.perf_counter() - started if started is not None else 0.0,
            space=space,
            info=info,
        )

    @property
    def objective(self) -> float:
        """Objective of the plan by :func:`pipeopt.evaluate`, seconds (``inf`` without a plan)."""
        return self.evaluation.objective if self.evaluation is not None else math.inf

    @property
    def gap(self) -> float | None:
        """:func:`optimality_gap` of the objective and the method's own lower bound
        (``None`` without a bound)."""
        return optimality_gap(self.objective, self.lower_bound)

    def summary(self) -> str:
        """A few lines: method, status, objective, bound, gap, search space, stages."""
        found = (f"objective {self.objective * 1e3:.4f} ms" if self.plan is not None
                 else "no plan found" + (" within the time limit" if self.status == Status.TIME_LIMIT else ""))
        lines = [f"{self.method}: {self.status}  {found}"]
        if self.lower_bound is not None:
            gap = self.gap
            lines[0] += f"  bound {self.lower_bound * 1e3:.4f} ms" + (f"  gap {gap:.2%}" if gap is not None else "")
        lines[0] += f"  space {self.space}  ({self.runtime:.2f} s)"
        if "objective" in self.info:
            lines.append(f"  objective: {self.info['objective']}")
        if self.status == Status.TIME_LIMIT and self.info.get("stopped"):
            lines.append(f"  stopped: {self.info['stopped']}")
        if self.plan is not None and hasattr(self.evaluation, "chunk_lines"):  # a schedule's execution
            lines += ["  " + x for x in self.evaluation.summary().splitlines()]
            lines += self.evaluation.chunk_lines(self.plan)
        elif self.plan is not None and self.evaluation is not None:
            for i, st in enumerate(self.plan.stages):
                e = self.evaluation
                extra = f" x{st.replicas}" if st.replicas > 1 else ""
                line = f"  stage {i}{extra}: {len(st.layers)} layers [{st.layers[0]} .. {st.layers[-1]}]"
                if st.bwd_layers is not None and st.bwd_layers != st.layers:
                    bl = st.bwd_layers
                    line += f", backward of {len(bl)} layers [{bl[0]} .. {bl[-1]}]"
                line += f" on {','.join(st.devices)}"
                if st.beta is not None:
                    line += " forward share " + ", ".join(f"{k} {b:.3f}" for k, b in sorted(st.beta.items()))
                if st.recompute:
                    line += f" recomputing {len(st.recompute)}"
                t, what = (e.load[i], "load") if e.load else (e.stage_time[i], "time")
                line += f"  {what} {t * 1e3:.4f} ms  memory {e.memory[i] / 2**30:.3f} GiB"
                lines.append(line)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def to_dict(self) -> dict:
        """JSON-ready dict: objective and lower_bound in seconds, status, stages, ..."""
        return {
            "method": self.method,
            "status": str(self.status),
            "objective": self.objective,
            "lower_bound": self.lower_bound,
            "gap": self.gap,
            "runtime": self.runtime,
            "space": self.space,
            "stages": self.plan.layer_lists() if self.plan is not None else [],
            "plan": self.plan.to_dict() if self.plan is not None else None,
            "info": self.info,
        }
