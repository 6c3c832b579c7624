"""The bandwidth between two CPU processes over torch.distributed's ``gloo`` backend.

:func:`measure_bandwidth` starts two processes on this machine (``spawn``, one torch thread
each, as ``pipeopt run`` runs its stages), sends a tensor of ``nbytes`` back and forth
``repeats`` times after a warm-up, and returns ``nbytes / (median one-way time)``: an
*effective* bandwidth that includes the per-message latency, which is what the cost model's
single bandwidth number stands for when a pipeline sends one such tensor per microbatch.
Measure at the size of the activations your cuts carry (``pipeopt profile --bandwidth
measure`` uses the largest edge of the profiled graph). Takes a few seconds (process start-up
and the gloo rendezvous dominate).
"""

from __future__ import annotations

import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..errors import InvalidProblemError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, nbytes: int, repeats: int, warmup: int, queue) -> None:
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        t = torch.zeros(max(nbytes // 4, 1))
        peer = 1 - rank
        samples = []
        for r in range(warmup + repeats):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(t, peer)
                dist.recv(t, peer)
            else:
                dist.recv(t, peer)
                dist.send(t, peer)
            if r >= warmup:
                samples.append((time.perf_counter() - t0) / 2.0)
        if rank == 0:
            queue.put(statistics.median(samples))
    finally:
        dist.destroy_process_group()


def measure_bandwidth(nbytes: int = 1 << 20, *, repeats: int = 20, warmup: int = 3) -> float:
    """Effective bytes/s of one message of ``nbytes`` between two local gloo processes.

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
    for value, what, low in ((nbytes, "nbytes", 4), (repeats, "repeats", 1), (warmup, "warmup", 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidProblemError(f"{what} must be an integer >= {low}, got {value!r}")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(_free_port(), nbytes, repeats, warmup, queue), nprocs=2,
                       start_method="spawn")
    seconds = queue.get()
    return (nbytes // 4 * 4) / seconds
