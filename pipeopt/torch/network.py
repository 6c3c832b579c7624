"""The link between two CPU processes over torch.distributed's ``gloo`` backend: its per-message
latency alpha and its bandwidth beta (the alpha-beta model of :func:`pipeopt.cost.rules.transfer_time`),
and the bus bandwidth of its all-reduce (:attr:`pipeopt.Cluster.collective_bandwidth`).

:func:`measure_link` starts two processes on this machine (``spawn``, one torch thread each, as
``pipeopt run`` runs its stages), sends a tensor of each of several sizes back and forth
``repeats`` times after a warm-up (a ping-pong), takes the median one-way time per size, and fits
the line ``time = alpha + bytes / beta`` by least relative squared error over the sizes: ``alpha`` the
per-message latency, ``beta`` the bandwidth. ``pipeopt profile --bandwidth measure`` uses it with
sizes from 4 bytes up to the largest edge of the profiled graph, so the cost model gets both.
:func:`measure_bandwidth` is the older single-size *effective* bandwidth (``bytes / one-way
time``, latency included). Takes a few seconds (process start-up and the gloo rendezvous
dominate).
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..errors import InvalidProblemError


MIN_LARGEST = 1 << 24
"""The largest default message size is at least 16 MiB: below a few MiB the time of a local gloo
message is mostly its latency, and on a loaded machine the slope (the bandwidth) drowns in the
noise of a fraction of a millisecond."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _median_seconds(op, repeats: int, warmup: int) -> float:
    """Median seconds of ``op()`` over ``repeats`` runs after ``warmup`` untimed ones, each
    started together on both ranks (a barrier before it)."""
    samples = []
    for r in range(warmup + repeats):
        dist.barrier()
        t0 = time.perf_counter()
        op()
        if r >= warmup:
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _worker(rank: int, port: int, sizes: tuple, reduce: tuple, repeats: int, warmup: int, queue) -> None:
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        peer = 1 - rank

        def ping_pong(t) -> None:
            if rank == 0:
                dist.send(t, peer)
                dist.recv(t, peer)
            else:
                dist.recv(t, peer)
                dist.send(t, peer)

        medians = [_median_seconds(lambda t=torch.zeros(max(n // 4, 1)): ping_pong(t), repeats, warmup) / 2.0
                   for n in sizes]  # one way: half the round trip
        # the all-reduce of the collective sizes, both ranks sending and receiving at once
        reduced = [_median_seconds(lambda t=torch.ones(max(n // 4, 1)): dist.all_reduce(t), repeats, warmup)
                   for n in reduce]
        if rank == 0:
            queue.put((medians, reduced))
    finally:
        dist.destroy_process_group()


def _check(value, what: str, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidProblemError(f"{what} must be an integer >= {low}, got {value!r}")


COLLECTIVE_MIN = 1 << 20
"""The all-reduce is timed on the sizes of at least 1 MiB (:func:`collective_sizes`): what
collectives move (gradients, tied weights) is large, and below that the time is mostly latency."""


def collective_sizes(sizes) -> tuple:
    """The sizes the all-reduce is timed on: those of at least :data:`COLLECTIVE_MIN` bytes, or
    the two largest if fewer than two are."""
    big = tuple(s for s in sizes if s >= COLLECTIVE_MIN)
    return big if len(big) >= 2 else tuple(sorted(sizes)[-2:])


def _one_way(sizes: tuple, repeats: int, warmup: int, reduce: tuple = ()) -> tuple[list[float], list[float]]:
    """Median one-way seconds of a message of each size (whole float32 elements, at least one),
    and median seconds of an all-reduce between the two of each size in ``reduce``."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(_free_port(), sizes, reduce, repeats, warmup, queue), nprocs=2,
                       start_method="spawn")
    return queue.get()


@dataclass(frozen=True)
class Link:
    """A measured link (:func:`measure_link`).

    Attributes
    ----------
    latency
        alpha, seconds per message (the fitted line's intercept, clamped at 0).
    bandwidth
        beta, bytes/s (the inverse of the fitted slope).
    sizes, seconds
        ``tuple`` of the message sizes (bytes) and their median one-way seconds.
    collective_bandwidth
        The all-reduce's bus bandwidth, bytes/s (:attr:`pipeopt.Cluster.collective_bandwidth`):
        the inverse slope of the line through its median times on ``collective_sizes`` (on two
        processes the ring all-reduce of n bytes is ``2 latency + n / bus bandwidth``);
        ``None`` if not measured.
    collective_sizes, collective_seconds
        ``tuple`` of the all-reduced sizes (bytes) and their median seconds.
    """

    latency: float
    bandwidth: float
    sizes: tuple
    seconds: tuple
    collective_bandwidth: float | None = None
    collective_sizes: tuple = ()
    collective_seconds: tuple = ()

    def describe(self) -> str:
        """One line: the fit and the points it was fitted on."""
        pts = ", ".join(f"{n} B {t * 1e3:.3f} ms" for n, t in zip(self.sizes, self.seconds, strict=True))
        text = (f"latency {self.latency * 1e3:.4g} ms per message and bandwidth {self.bandwidth:.4g} B/s, the "
                f"line of least relative squared error through the median one-way times of a gloo ping-pong between "
                f"two local processes ({pts})")
        if self.collective_bandwidth is not None:
            pts = ", ".join(f"{n} B {t * 1e3:.3f} ms"
                            for n, t in zip(self.collective_sizes, self.collective_seconds, strict=True))
            text += (f"; collectives at a bus bandwidth of {self.collective_bandwidth:.4g} B/s, fitted the same way "
                     f"through the median times of a gloo all-reduce between the two ({pts})")
        return text


def fit_line(sizes, seconds) -> tuple[float, float]:
    """``(alpha, beta)`` of the line ``seconds = alpha + size / beta`` of least *relative* squared
    error (weights ``1 / seconds**2``: a small message's time counts as much as a large one's,
    so the line fits the sizes between, where activations are, not only the largest); alpha is
    clamped at 0 (a negative intercept is measurement noise), beta is refitted through the
    origin then.

    Raises
    ------
    InvalidProblemError
        Fewer than two distinct sizes, or a slope that is not positive (the times do not grow
        with the size: measure larger messages).
    """
    xs, ys = [float(x) for x in sizes], [float(y) for y in seconds]
    if len(set(xs)) < 2 or len(xs) != len(ys):
        raise InvalidProblemError(f"fitting alpha and beta needs two or more distinct sizes, got {sizes!r}")
    ws = [1.0 / y**2 if y > 0 else 0.0 for y in ys]
    if sum(ws) <= 0:
        raise InvalidProblemError(f"the one-way times {ys!r} are not positive: no line can be fitted")
    mx = sum(w * x for w, x in zip(ws, xs, strict=True)) / sum(ws)
    my = sum(w * y for w, y in zip(ws, ys, strict=True)) / sum(ws)
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs, strict=True))
    slope = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys, strict=True)) / sxx if sxx > 0 else 0.0
    alpha = my - slope * mx
    if alpha < 0:
        alpha = 0.0
        slope = (sum(w * x * y for w, x, y in zip(ws, xs, ys, strict=True))
                 / sum(w * x * x for w, x in zip(ws, xs, strict=True)))
    if not slope > 0:
        raise InvalidProblemError(
            f"the one-way times {ys!r} do not grow with the message sizes {xs!r}: no bandwidth can be fitted "
            "(measure larger messages)"
        )
    return alpha, 1.0 / slope


def measure_link(sizes=None, *, largest: int = 1 << 22, repeats: int = 20, warmup: int = 3) -> Link:
    """Measure alpha and beta between two local gloo processes and fit the line (module docstring).

    Parameters
    ----------
    sizes
        Message sizes in bytes, two or more distinct (each rounded down to whole float32
        elements, at least one); default seven sizes from 4 bytes to ``largest`` (at least
        :data:`MIN_LARGEST`) on a logarithmic scale.
    largest
        The largest default size (``pipeopt profile`` passes the largest edge of the graph).
    repeats, warmup
        Timed and untimed round trips per size.

    Returns
    -------
    Link

    Raises
    ------
    InvalidProblemError
        If a count or size is not a positive integer, fewer than two distinct sizes are
        given, or no positive bandwidth fits the times.
    """
    _check(largest, "largest", 8)
    _check(repeats, "repeats", 1)
    _check(warmup, "warmup", 0)
    if sizes is None:
        steps, top = 6, max(largest, MIN_LARGEST)
        sizes = sorted({max(4, int(round(4 * (top / 4) ** (i / steps)))) // 4 * 4 for i in range(steps + 1)})
    sizes = tuple(sizes)
    for s in sizes:
        _check(s, "a message size", 4)
    if len(set(sizes)) < 2:
        raise InvalidProblemError(f"measuring alpha and beta needs two or more distinct sizes, got {sizes!r}")
    big = tuple(s // 4 * 4 for s in collective_sizes(sizes))
    seconds, reduced = _one_way(sizes, repeats, warmup, big)
    alpha, beta = fit_line([s // 4 * 4 for s in sizes], seconds)
    try:  # n bytes on two ranks: 2 (2 - 1) / 2 * n / bus
        bus = fit_line(big, reduced)[1]
    except InvalidProblemError:  # times that do not grow with the size (noise): the link's bandwidth stands
        bus = None
    return Link(alpha, beta, tuple(s // 4 * 4 for s in sizes), tuple(seconds), bus, big, tuple(reduced))


def measure_bandwidth(nbytes: int = 1 << 20, *, repeats: int = 20, warmup: int = 3) -> float:
    """Effective bytes/s of one message of ``nbytes`` between two local gloo processes
    (latency included: ``nbytes / median one-way seconds``; :func:`measure_link` separates
    the two).

    Parameters
    ----------
    nbytes
        Message size in bytes (rounded down to whole float32 elements, at least one).
    repeats, warmup
        Timed and untimed round trips.

    Returns
    -------
    float
        ``nbytes / median one-way seconds``.

    Raises
    ------
    InvalidProblemError
        If a count is not a positive integer (``warmup`` may be 0).
    """
    _check(nbytes, "nbytes", 4)
    _check(repeats, "repeats", 1)
    _check(warmup, "warmup", 0)
    seconds = _one_way((nbytes,), repeats, warmup)[0][0]
    return (nbytes // 4 * 4) / seconds
