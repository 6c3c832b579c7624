"""The stage overhead as the pipeline runtime pays it, per stage (issue 24, 4b).

:func:`pipeopt.cost.rules.stage_overhead` adds a constant to the forward and the backward of
**every** stage per microbatch. It must therefore be measured on stages, not on the whole
model: the whole model pays work that no stage of a split pays. Hugging Face GPT-2 is the
case in point: its LM head and token embedding share one weight, and in one module autograd
sums the two 154 MB gradient contributions out of place (``aten::add``, a fresh allocation)
before the accumulation; ``pipeline()`` gives each stage its own copy of a tied weight
(``MultiUseParameterConfig.REPLICATE``), so a split model never pays it. Measured on one CPU
thread (thread CPU time, shared machine): the whole tied model 593 ms per forward + backward,
the same model untied 531 ms; one out-of-place sum of two 154 MB tensors 61 ms. Charged as a
per-stage constant, that excess was charged on each of the two stages of a split that pays none
of it. The cost model now prices the sum where it happens (:func:`pipeopt.cost.rules.tie_sum_time`,
a stage holding two of a tie's layers), so :func:`fit` takes it out of both measurements first.

:func:`split_passes` therefore cuts the model into two stages with torch's own ``pipeline()``
(:func:`pipeopt.torch.runtime.build_pipe`, the stage modules ``pipeopt run`` runs), at the
middle layer of the execution order, and times each stage module alone in one process, in
rounds (stage 0 forward, stage 1 forward, stage 1 backward, stage 0 backward; backward from
gradients of ones, as the layers are timed; gradients reset every M rounds and accumulating in
between, as in an iteration of M microbatches). :func:`fit` then splits what the runtime adds
to the layers' measured times into a constant per stage (the graph attribute
``stage_overhead``) and a share proportional to the layers' times (a scale on every layer's
``fwd`` and ``bwd``), so that the cost model reproduces both the whole model run as one stage
and these two stages. What runs between stages (sends and receives) is the cost model's
latency and bandwidth, not measured here.

Where ``pipeline()`` cannot split the model in two (a model it cannot trace, fewer than two
layers, a stage that does not run the layers planned for it) :func:`split_passes` returns
``None`` and the profile falls back to the whole model (:func:`pipeopt.torch.profile.stage_overhead`),
saying so in its provenance.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from ..cost.rules import tie_sum_time


def split_point(names) -> str | None:
    """The layer where :func:`split_passes` cuts: the middle one of the execution order
    (``names[len(names) // 2]``), or ``None`` for fewer than two layers."""
    names = list(names)
    return names[len(names) // 2] if len(names) >= 2 else None


def split_passes(module: nn.Module, example_inputs: tuple, names, *, repeats: int, warmup: int,
                 microbatches: int = 1, whole: nn.Module | None = None) -> dict | None:
    """Time the two stage modules of ``pipeline()``'s split of ``module`` at :func:`split_point`.

    Parameters
    ----------
    module
        The model (not changed: ``pipeline()`` runs on a copy).
    example_inputs
        One microbatch, the model's positional arguments.
    names
        The profiled layers' FQNs in execution order.
    repeats, warmup
        Timed and untimed rounds.
    microbatches
        M: gradients are reset every M rounds and accumulate in between.
    whole
        The whole model as one stage (:func:`pipeopt.torch.probe.runtime_module`), or
        ``None``: if given, it runs forward and backward in the same rounds, before the two
        stages, so that a burst of load from other processes hits both measurements alike
        (their difference is the per-stage constant of :func:`fit`).

    Returns
    -------
    dict or None
        ``{"split": fqn, "stages": [[fqn, ...], [fqn, ...]], "total": [s, s], "forward": [s, s]}``
        (per stage: its layers as built, the median seconds of its forward plus backward, of
        its forward) and, with ``whole``, ``"whole_total"`` and ``"whole_forward"`` (the same
        of the whole model, from the same rounds); or ``None`` where ``pipeline()`` cannot make
        these two stages (module docstring).
    """
    import warnings

    from .probe import _backward
    from .runtime import build_pipe, stage_membership

    names = [str(n) for n in names]
    cut = split_point(names)
    if cut is None:
        return None
    k = names.index(cut)
    exported = {"num_stages": 2, "split_spec": {cut: "SplitPoint.BEGINNING"}}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pipe = build_pipe(module, tuple(example_inputs), exported)
        stages = [pipe.get_stage_module(i) for i in range(2)]
        built = [stage_membership(s, names) for s in stages]
        if built != [names[:k], names[k:]]:
            return None
        runner = _Stages(pipe.split_gm)
        total: list[list[float]] = [[], []]
        forward: list[list[float]] = [[], []]
        params = [list(s.parameters()) for s in stages] + ([list(whole.parameters())] if whole is not None else [])
        every = max(int(microbatches), 1)
        one: tuple[list, list] = ([], [])
        for r in range(warmup + repeats):
            if r % every == 0:
                for ps in params:
                    for p in ps:
                        p.grad = None
            if whole is not None:
                t0 = time.perf_counter()
                out = whole(*example_inputs)
                t1 = time.perf_counter()
                _backward(out)
                t2 = time.perf_counter()
                del out
                if r >= warmup:
                    one[0].append(t2 - t0)
                    one[1].append(t1 - t0)
            fwd, bwd = runner.step(tuple(example_inputs))
            if r >= warmup:
                for i in range(2):
                    total[i].append(fwd[i] + bwd[i])
                    forward[i].append(fwd[i])
    except Exception:  # noqa: BLE001 - any tracing or running failure: the whole model instead
        return None
    out = {"split": cut, "stages": built, "total": [statistics.median(t) for t in total],
           "forward": [statistics.median(f) for f in forward]}
    if whole is not None:
        out.update(whole_total=statistics.median(one[0]), whole_forward=statistics.median(one[1]))
    return out


class _Stages(torch.fx.Interpreter):
    """Runs a ``Pipe``'s root graph (``pipe.split_gm``: placeholders, one ``call_module`` per
    stage, ``getitem`` between them) with every stage cut off from the previous one: a stage's
    floating inputs from another stage are fresh leaves that require grad, as a pipeline stage
    receives them. :meth:`step` times each stage's forward, then each stage's backward from
    gradients of ones, last stage first."""

    def __init__(self, gm) -> None:
        super().__init__(gm)
        self.fwd: list[float] = []
        self.outs: list[list[torch.Tensor]] = []

    def call_module(self, target, args, kwargs):
        first = not self.fwd
        if not first:
            args = tuple(_leaf(a) for a in args)
            kwargs = {k: _leaf(v) for k, v in kwargs.items()}
        mod = self.fetch_attr(target)
        t0 = time.perf_counter()
        out = mod(*args, **kwargs)
        self.fwd.append(time.perf_counter() - t0)
        flat = out if isinstance(out, (tuple, list)) else (out,)
        self.outs.append([t for t in flat if isinstance(t, torch.Tensor) and t.requires_grad
                          and t.is_floating_point()])
        return out

    def step(self, inputs: tuple) -> tuple[list[float], list[float]]:
        """One forward of every stage and one backward of every stage (seconds each)."""
        self.fwd, self.outs = [], []
        self.run(*inputs)
        bwd = [0.0] * len(self.outs)
        for i in reversed(range(len(self.outs))):
            outs = self.outs[i]
            t0 = time.perf_counter()
            if outs:
                torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
            bwd[i] = time.perf_counter() - t0
        fwd = self.fwd
        self.fwd, self.outs = [], []
        return fwd, bwd


def _leaf(value):
    if isinstance(value, torch.Tensor):
        value = value.detach()
        return value.requires_grad_(True) if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_leaf(v) for v in value)
    return value


def fit(whole_total: float, whole_forward: float, measured: dict, layer_total: dict, layer_forward: dict,
        sums=()) -> dict:
    """What the runtime adds to the layers' measured times, as a constant per stage and a
    share proportional to the layers' times, fitted so that the cost model reproduces both
    measurements: the whole model as one stage (:func:`pipeopt.torch.probe.runtime_module`)
    and the two stages of :func:`split_passes`.

    For the forward and for the backward apart, with ``L`` the layers' summed times,
    ``E1`` = the whole model's time - ``L`` and ``E2`` = the two stages' summed times - ``L``
    (each at least 0): a stage pays ``c`` (the per-stage constant) plus ``p * (its layers'
    time) / L``, so one stage pays ``c + p`` and two stages ``2 c + p``. Hence
    ``c = E2 - E1`` and ``p = E2 - 2 c``, with ``c`` clamped to ``[0, E2 / 2]`` so that both
    parts are at least 0 and the split is always reproduced exactly; when ``E1 > E2`` (the
    whole model pays work no stage of a split pays, beyond the tie sums ``sums`` the cost model
    prices) ``c = 0`` and ``p = E2``: the one-stage run is then predicted ``E1 - E2`` short,
    which the assumption line states.

    Parameters
    ----------
    whole_total, whole_forward
        Median seconds of the whole model's forward + backward and forward (gradients
        accumulating as in an iteration).
    measured
        :func:`split_passes`' result.
    layer_total, layer_forward
        ``{layer: seconds}``: each layer's measured forward + backward, and forward.
    sums
        ``[(layers of a tie, seconds of one gradient sum)]``: the tied parameters' gradient sums
        (:func:`pipeopt.cost.rules.tie_sum_time`, priced by the cost model itself) are taken out
        of both measurements' backward first: the whole model sums each tie's gradients
        (k - 1 times for k layers), a stage of the split those of the ties it holds twice or more.

    Returns
    -------
    dict
        ``{"stage_overhead": {"forward": c_f, "backward": c_b}, "scale": {"forward": 1 + p_f / L_f,
        "backward": 1 + p_b / L_b}, "whole_excess": {...}, "split_excess": {...}}`` (seconds per
        microbatch; the scale is 1 where ``L`` is 0).
    """
    stages = measured["stages"]
    whole_sums = sum(float(tie_sum_time(len(layers), sec)) for layers, sec in sums)
    split_sums = sum(float(tie_sum_time(len(layers & set(st)), sec)) for layers, sec in sums for st in stages)
    lf = sum(layer_forward[x] for st in stages for x in st)
    lt = sum(layer_total[x] for st in stages for x in st)
    parts = {
        "forward": (lf, float(whole_forward) - lf, sum(measured["forward"]) - lf),
        "backward": (lt - lf, (float(whole_total) - float(whole_forward)) - (lt - lf) - whole_sums,
                     (sum(measured["total"]) - sum(measured["forward"])) - (lt - lf) - split_sums),
    }
    over, scale, e1s, e2s = {}, {}, {}, {}
    for key, (base, e1, e2) in parts.items():
        e1, e2 = max(e1, 0.0), max(e2, 0.0)
        c = min(max(e2 - e1, 0.0), e2 / 2) if base > 0 else e2 / 2
        p = e2 - 2 * c
        over[key], scale[key] = c, (1.0 + p / base) if base > 0 else 1.0
        e1s[key], e2s[key] = e1, e2
    return {"stage_overhead": over, "scale": scale, "whole_excess": e1s, "split_excess": e2s}


__all__ = ["fit", "split_passes", "split_point"]
