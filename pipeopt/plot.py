"""Figures: a simulated schedule, a plan's stage loads, benchmark gaps and solve times.

Every function builds a :class:`matplotlib.figure.Figure` directly (no pyplot state, so it
works headless with the Agg renderer and does not disturb a notebook's backend), returns it,
and saves it to ``path`` when one is given (format from the suffix: ``.png``, ``.pdf``,
``.svg``). In a notebook the returned figure displays itself.

* :func:`plot_schedule` -- Gantt chart of a :class:`~pipeopt.simulate.SimulationResult`:
  one row per worker (replica) and one thin row per link, forward, backward and
  communication in their own colours, microbatch numbers on the bars.
* :func:`plot_plan` -- a plan along the layer order: per-layer compute coloured by stage with
  the cuts, per-stage forward / backward / communication load against the bottleneck, and
  per-stage memory against capacity.
* :func:`plot_gaps`, :func:`plot_solve_times` -- from benchmark rows
  (:data:`pipeopt.bench.COLUMNS`: ``instance, stages, method, space, objective, lower_bound,
  gap, status, runtime``; ``gap`` in percent to the best bound of the same or a larger space).

References
----------
Gantt charts of pipeline schedules as drawn in Huang et al., GPipe (NeurIPS 2019) and
Narayanan et al., PipeDream (SOSP 2019).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .cost import evaluate, rules
from .errors import InvalidProblemError

COLOURS = {
    "F": "#4C72B0",  # forward
    "B": "#DD8452",  # backward
    "fwd": "#55A868",  # activation transfer
    "bwd": "#8172B3",  # gradient transfer
    "comm": "#8C8C8C",
    "bottleneck": "#C44E52",
    "capacity": "#C44E52",
}

BENCH_COLUMNS = ("instance", "stages", "method", "space", "objective", "lower_bound", "gap", "status", "runtime")
"""Columns :func:`plot_gaps` and :func:`plot_solve_times` read (``pipeopt.bench`` writes them)."""


def _save(fig: Figure, path) -> Figure:
    if path is not None:
        fig.savefig(Path(path), dpi=120, bbox_inches="tight")
    return fig


def _time_unit(span: float) -> tuple[float, str]:
    """Scale and label for a time axis of length ``span`` seconds."""
    if span < 1e-3:
        return 1e6, "µs"
    if span < 1.0:
        return 1e3, "ms"
    return 1.0, "s"


# ---------------------------------------------------------------------------------------------


def _method_colour(k: int):
    """A distinct colour for up to 20 methods (tab20 after the first ten)."""
    import matplotlib

    return f"C{k}" if k < 10 else matplotlib.colormaps["tab20"]((2 * (k - 10) + 1) % 20)


def plot_schedule(sim, path=None, *, until: float | None = None, labels: bool | None = None, title: str | None = None,
                  ax=None, legend: bool = True, unit: str | None = None) -> Figure:
    """Gantt chart of a simulated iteration.

    Parameters
    ----------
    sim
        :class:`pipeopt.simulate.SimulationResult`.
    path
        Where to save the figure (``str`` or ``Path``; ``None``: do not save).
    until
        Show events that start before this time (seconds); default: everything (for
        ``"async"`` runs, the first ``M + 2 S`` microbatches' span).
    labels
        Write microbatch numbers on the bars; default: when bars are wide enough to read.
    title
        Figure title; default: schedule, M, iteration time, bubble.
    ax
        A :class:`matplotlib.axes.Axes` to draw into (e.g. one panel of
        ``fig.subplots(1, 2)``, to put two schedules side by side); the figure's size and
        layout are then left to the caller. Default: a new figure.
    legend
        Draw the colour legend (to the right of the axes).
    unit
        Time unit of the axis, ``"s"``, ``"ms"`` or ``"µs"`` (``"us"``); default: from the
        chart's span. Give the same unit to charts that share a time axis.

    Returns
    -------
    matplotlib.figure.Figure
        Rows top to bottom: stage 0's workers, the link to stage 1, stage 1's workers, ...
        Split execution draws a worker's forward lane in the upper half of its row and the
        backward lane in the lower half. With ``ax``: the figure that holds it.
    """
    events, details = sim.events, sim.event_details
    S = sim.num_stages
    if until is None and sim.schedule == "async":
        limit = sim.microbatches + 2 * S
        until = max((e.end for e in events if e.microbatch < limit), default=0.0)
    if until is not None:
        keep = [k for k, e in enumerate(events) if e.start < until]
        events = [events[k] for k in keep]
        details = [details[k] for k in keep]
    span = max((e.end for e in events), default=1.0) or 1.0
    if unit is None:
        scale, unit = _time_unit(span)
    else:
        scales = {"s": 1.0, "ms": 1e3, "µs": 1e6, "us": 1e6}
        if unit not in scales:
            raise InvalidProblemError(f"unknown time unit {unit!r}; use one of {sorted(scales)}")
        scale, unit = scales[unit], unit.replace("us", "µs")

    # row layout: worker rows of height 1, link rows of height 0.45 between stages
    rows: dict = {}
    ticks, names = [], []
    y = 0.0
    for i in range(S):
        for r in range(sim.replicas[i]):
            rows[("w", i, r)] = (y, 1.0)
            ticks.append(y + 0.5)
            names.append(f"stage {i}" + (f" r{r}" if sim.replicas[i] > 1 else ""))
            y += 1.1
        if i < S - 1:
            rows[("l", i)] = (y, 0.45)
            ticks.append(y + 0.225)
            names.append(f"link {i}-{i + 1}")
            y += 0.55
    if ax is None:
        fig = Figure(figsize=(11, max(2.5, 0.42 * y + 1.2)))
        ax = fig.add_subplot()
        own = True
    else:
        fig, own = ax.figure, False
    split = sim.schedule == "split"
    widths = [e.end - e.start for e in events if e.kind != "comm"]
    if labels is None:
        labels = bool(widths) and min(widths) * scale / (span * scale) > 0.012
    for e, (rep, lane, direction) in zip(events, details, strict=True):
        if e.kind == "comm" and lane == "link":
            cut = e.stage if direction == "fwd" else e.stage - 1
            y0, h = rows[("l", cut)]
            colour = COLOURS[direction]
        else:
            y0, h = rows[("w", e.stage, rep)]
            colour = COLOURS[direction] if e.kind == "comm" else COLOURS[e.kind]
            if split and e.kind != "comm":
                h = h / 2
                y0 = y0 if e.kind == "F" else y0 + h
        w = (e.end - e.start) * scale
        if w <= 0:
            continue
        ax.broken_barh([(e.start * scale, w)], (y0, h), facecolors=colour, edgecolors="white", linewidth=0.4)
        if labels and e.kind != "comm":
            ax.text((e.start + e.end) / 2 * scale, y0 + h / 2, str(e.microbatch), ha="center", va="center",
                    fontsize=7, color="white")
    ax.set_yticks(ticks, names, fontsize=8)
    ax.set_ylim(y, -0.2)  # stage 0 on top
    ax.set_xlim(0, span * scale * 1.01)
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="x", alpha=0.3)
    if legend:
        handles = [Patch(color=COLOURS["F"], label="forward"), Patch(color=COLOURS["B"], label="backward"),
                   Patch(color=COLOURS["fwd"], label="activation transfer"),
                   Patch(color=COLOURS["bwd"], label="gradient transfer")]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    if title is None:
        it = sim.iteration_time * scale
        title = (f"{sim.schedule}: M = {sim.microbatches}, iteration {it:.3g} {unit}, "
                 f"{sim.time_per_microbatch * scale:.3g} {unit}/microbatch, bubble {sim.bubble_fraction:.0%}")
    ax.set_title(title, fontsize=10)
    if own:
        fig.tight_layout()
    return _save(fig, path)


# ---------------------------------------------------------------------------------------------


def plot_plan(instance, plan, path=None, *, title: str | None = None) -> Figure:
    """A plan along the layer order: layer times by stage, stage loads, memory.

    Parameters
    ----------
    instance
        :class:`pipeopt.Instance`.
    plan
        :class:`pipeopt.Plan` (scored with :func:`pipeopt.evaluate`).
    path
        Where to save the figure (``None``: do not save).
    title
        Figure title; default: instance name, S and the bottleneck.

    Returns
    -------
    matplotlib.figure.Figure
        Three panels. Top: forward + backward seconds of each unit of the layer order on one
        unit of the resource kind the cluster has most of, coloured by stage, cuts as dashed
        lines. Middle: per stage, its forward and backward time on its worker (stacked) and
        the communication time of the cut after it, with the bottleneck as a line. Bottom:
        per-stage memory (bytes per replica) against the worker's capacity.

    Raises
    ------
    InvalidPlanError
        If the plan is not a valid split of the instance.
    """
    ev = evaluate(instance, plan)
    chain = instance.chain
    S = plan.num_stages
    totals: dict = {}
    for d in instance.cluster.devices:
        for k, r in d.resources.items():
            totals[k] = totals.get(k, 0.0) + r
    kinds = [k for k in sorted(totals, key=lambda k: -totals[k]) if k in chain.fwd]
    kind = kinds[0] if kinds else chain.kinds[0]
    ref = next((d for d in instance.cluster.devices if d.resources.get(kind, 0) > 0), instance.cluster.devices[0])
    per_unit = np.asarray(chain.fwd[kind] + chain.bwd[kind], dtype=float) / ref.resources.get(kind, 1.0)
    stage_of = {n: i for i, st in enumerate(plan.stages) for n in st.layers}
    unit_stage = [stage_of[u[-1]] for u in chain.units]
    scale, unit = _time_unit(max(ev.bottleneck, float(np.nanmax(np.where(np.isfinite(per_unit), per_unit, 0)))))
    cmap = [f"C{i % 10}" for i in range(S)]

    fig = Figure(figsize=(11, 8.5))
    ax1, ax2, ax3 = fig.subplots(3, 1, gridspec_kw={"height_ratios": [1.2, 1, 1]})
    x = np.arange(chain.n)
    ax1.bar(x, np.where(np.isfinite(per_unit), per_unit, 0) * scale, width=1.0,
            color=[cmap[s] for s in unit_stage], linewidth=0)
    for c in range(1, chain.n):
        if unit_stage[c] != unit_stage[c - 1]:
            ax1.axvline(c - 0.5, color="black", linestyle="--", linewidth=0.8)
    ax1.set_xlim(-0.5, chain.n - 0.5)
    ax1.set_xlabel("layer (unit) in pipeline order")
    ax1.set_ylabel(f"F + B per layer\n({unit}, on {ref.name}'s {kind})")
    ax1.set_title(title or f"{instance.name}: {S} stages, bottleneck {ev.bottleneck * scale:.4g} {unit}", fontsize=10)

    idx = np.arange(S)
    labels = []
    for i, st in enumerate(plan.stages):
        rep = f" x{st.replicas}" if st.replicas > 1 else ""
        labels.append(f"{i}{rep}\n{len(st.layers)} layers")
    f = np.array(ev.forward_time) * scale
    b = np.array(ev.backward_time) * scale
    comm = np.array([*ev.comm_time, 0.0]) * scale
    ax2.bar(idx - 0.2, f, width=0.4, color=COLOURS["F"], label="forward")
    ax2.bar(idx - 0.2, b, width=0.4, bottom=f, color=COLOURS["B"], label="backward")
    ax2.scatter(idx - 0.2, np.array(ev.stage_time) * scale, marker="_", s=300, color="black", zorder=3,
                label="stage time")
    ax2.bar(idx + 0.2, comm, width=0.4, color=COLOURS["comm"], label="communication (cut after)")
    ax2.axhline(ev.bottleneck * scale, color=COLOURS["bottleneck"], linestyle="--", linewidth=1, label="bottleneck")
    ax2.set_xticks(idx, labels, fontsize=8)
    for t, c in zip(ax2.get_xticklabels(), cmap, strict=True):
        t.set_color(c)
    ax2.set_ylabel(f"time per microbatch ({unit})")
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)

    mem = np.array(ev.memory) / 2**30
    cap = np.array(ev.memory_capacity) / 2**30
    ax3.bar(idx, mem, width=0.6, color=[COLOURS["capacity"] if not rules.fits(m, c) else cmap[i]
                                         for i, (m, c) in enumerate(zip(mem, cap, strict=True))])
    if np.isfinite(cap).any():
        ax3.scatter(idx[np.isfinite(cap)], cap[np.isfinite(cap)], marker="_", s=600, color="black", zorder=3,
                    label="capacity")
        ax3.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    else:
        ax3.text(0.99, 0.95, "no memory limit", transform=ax3.transAxes, ha="right", va="top", fontsize=8)
    ax3.set_xticks(idx, labels, fontsize=8)
    ax3.set_ylabel("memory per replica (GiB)")
    ax3.set_xlabel("stage")
    fig.tight_layout()
    return _save(fig, path)


# ---------------------------------------------------------------------------------------------


def _bench(df, needed=BENCH_COLUMNS):
    import pandas as pd

    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise InvalidProblemError(f"benchmark rows lack column(s) {missing}; expected {list(needed)}")
    if len(df) == 0:
        raise InvalidProblemError("no benchmark rows to plot")
    df = df.copy()
    df["case"] = [
        str(i) if pd.isna(s) else f"{i}\nS={int(s)}" for i, s in zip(df["instance"], df["stages"], strict=True)
    ]
    spaces = df["space"].nunique() > 1
    df["label"] = [f"{m} ({sp})" if spaces else str(m) for m, sp in zip(df["method"], df["space"], strict=True)]
    return df


def _cases(df) -> list:
    order = df.drop_duplicates("case").sort_values(["instance", "stages"])
    return list(order["case"])


def plot_gaps(df, path=None, *, title: str = "optimality gap to the best proven bound") -> Figure:
    """Grouped bars of each method's gap per instance and pipeline depth.

    Parameters
    ----------
    df
        Benchmark rows, a :class:`pandas.DataFrame` with at least :data:`BENCH_COLUMNS`
        (``gap`` in percent; NaN where no bound exists).
    path
        Where to save the figure (``None``: do not save).
    title
        Figure title.

    Returns
    -------
    matplotlib.figure.Figure
        One group per (instance, stages), one bar per method (``method (space)`` when rows
        span several spaces), a dot on each bar so that zero gaps show; rows without a gap
        (no bound in their space or a larger one, no plan) are marked ``n/a``.

    Raises
    ------
    InvalidProblemError
        If a column is missing or there are no rows.
    """
    df = _bench(df)
    cases, methods = _cases(df), sorted(df["label"].unique())
    width = 0.8 / max(len(methods), 1)
    fig = Figure(figsize=(min(16.0, max(6.0, 0.22 * len(cases) * len(methods) + 3.5)), 4.5))
    ax = fig.add_subplot()
    handles = []
    for k, m in enumerate(methods):
        colour = _method_colour(k)
        handles.append(Patch(color=colour, label=m))
        sub = df[df["label"] == m].set_index("case")
        xs, ys, na = [], [], []
        for c, case in enumerate(cases):
            if case not in sub.index:
                continue
            g = sub.loc[[case], "gap"].astype(float).max()
            xpos = c - 0.4 + width * (k + 0.5)
            if math.isnan(g):
                na.append(xpos)
            else:
                xs.append(xpos)
                ys.append(g)
        ax.bar(xs, ys, width=width, color=colour)
        ax.scatter(xs, ys, color=colour, marker="o", s=10, zorder=3, clip_on=False)  # zero gaps stay visible
        for xpos in na:
            ax.text(xpos, 0, "n/a", rotation=90, ha="center", va="bottom", fontsize=6, color=colour)
    ax.set_xticks(range(len(cases)), cases, fontsize=8, rotation=35, ha="right", rotation_mode="anchor")
    ax.set_ylabel("gap (%)")
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return _save(fig, path)


def plot_solve_times(df, path=None, *, title: str = "solve time") -> Figure:
    """Wall time of each method per instance and pipeline depth, on a log scale.

    Parameters
    ----------
    df
        Benchmark rows (:data:`BENCH_COLUMNS`; ``runtime`` in seconds).
    path
        Where to save the figure (``None``: do not save).
    title
        Figure title.

    Returns
    -------
    matplotlib.figure.Figure
        One marker per row; methods by colour, with the status in the marker: filled
        (optimal or feasible), ``x`` (stopped at its time limit), hollow (infeasible,
        skipped or error).

    Raises
    ------
    InvalidProblemError
        If a column is missing or there are no rows.
    """
    df = _bench(df)
    cases, methods = _cases(df), sorted(df["label"].unique())
    pos = {c: i for i, c in enumerate(cases)}
    fig = Figure(figsize=(max(6.0, 0.9 * len(cases) + 3), 4.5))
    ax = fig.add_subplot()
    jitter = np.linspace(-0.25, 0.25, len(methods)) if len(methods) > 1 else [0.0]
    floor = 1e-4
    for k, m in enumerate(methods):
        sub = df[df["label"] == m]
        colour = _method_colour(k)
        xs = np.array([pos[c] + jitter[k] for c in sub["case"]])
        ts = np.maximum(sub["runtime"].astype(float).to_numpy(), floor)
        status = sub["status"].astype(str).to_numpy()
        ok = np.isin(status, ["optimal", "feasible"])
        lim = status == "time_limit"
        other = ~(ok | lim)
        ax.scatter(xs[ok], ts[ok], color=colour, marker="o", s=28, label=m)
        if lim.any():
            ax.scatter(xs[lim], ts[lim], color=colour, marker="x", s=40)
        if other.any():
            ax.scatter(xs[other], ts[other], facecolors="none", edgecolors=colour, marker="o", s=28)
    ax.set_yscale("log")
    ax.set_xticks(range(len(cases)), cases, fontsize=8, rotation=35, ha="right", rotation_mode="anchor")
    ax.set_ylabel(f"wall time (s, floor {floor:g})")
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.set_title(title + "  (x: time limit, hollow: infeasible / skipped / error)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return _save(fig, path)
