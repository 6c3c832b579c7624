"""Where the bench's solves run: in this process, in N local processes, or on a Dask cluster.

A sweep is a list of *calls* ``(instance index, *args)``. An executor runs
``fn(instance, *args)`` for every call and yields ``(call index, value)`` as each one
finishes (completion order; the caller puts the values back in call order). ``fn`` must be a
module-level function (it travels by reference, so the workers need pipeopt installed) that
returns a picklable value. A call never stops the sweep: if ``fn`` raises, or the process
running it dies (a crashed solver that took its worker along, a worker killed by the
out-of-memory killer), the executor yields a :class:`Failure` naming what happened.

* :class:`Sequential` - in this process, one call after the other (``--jobs 1``).
* :class:`Processes` - ``jobs`` local worker processes (``spawn``), at most ``jobs`` calls in
  flight. When a worker dies the pool is rebuilt; the calls that were in flight are rerun
  one at a time in a pool of their own, so only the call that kills its worker alone gets
  the failure.
* :class:`DaskCluster` - a Dask distributed cluster (``distributed.Client(address)``; the
  address ``"local"`` starts a :class:`distributed.LocalCluster` of single-threaded worker
  processes). A call whose workers keep dying ends as ``KilledWorker`` after the scheduler's
  ``allowed-failures`` retries; such calls are then rerun one at a time (a worker that dies
  takes the calls queued on it along), so only the call that kills its worker alone gets the
  failure.

Instances travel as native dicts (:func:`pipeopt.io.native.to_dict`, exact round trip), so
workers need no shared files; each worker process decodes each instance once.
"""

from __future__ import annotations

import logging
import multiprocessing
import numbers
import os
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from .errors import ExecutorError, InvalidProblemError, MissingExtraError, PipeoptError
from .instance import Instance
from .io import native

logger = logging.getLogger("pipeopt")
if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):  # a library's logger
    logger.addHandler(logging.NullHandler())

MAX_JOBS = 1024
"""Largest ``jobs`` accepted (local worker processes)."""

SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""Set in every local worker process, so that the processes a solve starts (the HiGHS runner,
CBC) do not start a thread per core either."""

DASK_INSTALL = 'pip install "pipeopt[dask]"'

_CACHE_SIZE = 64  # decoded instances kept per worker process


@dataclass(frozen=True)
class Failure:
    """A call that produced no value: ``message`` names the exception or the dead process."""

    message: str


def check_jobs(jobs) -> int:
    """``jobs`` as an int in 1 .. :data:`MAX_JOBS`.

    Raises
    ------
    InvalidProblemError
        If ``jobs`` is not such an integer (``0``, ``-1``, ``2.5``, ``True``, ``"2"``).
    """
    if isinstance(jobs, bool) or not isinstance(jobs, numbers.Integral) or not 1 <= jobs <= MAX_JOBS:
        raise InvalidProblemError(f"jobs must be an integer in 1..{MAX_JOBS} (worker processes), got {jobs!r}")
    return int(jobs)


def executor(*, jobs: int = 1, dask: str | None = None):
    """The executor the bench options name: :class:`Sequential` (``jobs=1``, no ``dask``),
    :class:`Processes` (``jobs > 1``) or :class:`DaskCluster` (``dask`` = a scheduler address,
    or ``"local"`` for a local cluster of ``jobs`` workers when ``jobs > 1``, else one per core).

    Nothing is started here; the arguments are checked (and Dask's presence), before any work.

    Raises
    ------
    InvalidProblemError
        Bad ``jobs``; ``dask`` not a non-empty string; ``jobs > 1`` with a scheduler address
        (the cluster's workers set the parallelism there).
    MissingExtraError
        ``dask`` given but the ``distributed`` package is not installed.
    """
    jobs = check_jobs(jobs)
    if dask is None:
        return Sequential() if jobs == 1 else Processes(jobs)
    if not isinstance(dask, str) or not dask.strip():
        raise InvalidProblemError(f"dask must be a scheduler address (tcp://host:8786) or 'local', got {dask!r}")
    dask = dask.strip()
    if jobs > 1 and dask != "local":
        raise InvalidProblemError(
            f"jobs={jobs} with the Dask scheduler {dask}: the cluster's workers set the parallelism "
            "(start them with `dask worker ADDRESS --nworkers N --nthreads 1`); drop jobs"
        )
    _require_distributed()
    return DaskCluster(dask, workers=jobs if jobs > 1 else None)


def _require_distributed():
    try:
        import distributed
    except ImportError:
        raise MissingExtraError(f"running on a Dask cluster needs the dask extra: {DASK_INSTALL}") from None
    return distributed


# -- worker side ------------------------------------------------------------------------------

_POOL_PAYLOADS: list = []  # this local worker's instances (set by _init_pool)
_DECODED: dict = {}  # key -> Instance, at most _CACHE_SIZE


def _payload(instance: Instance):
    """What a worker receives for ``instance``: its native dict, or the object itself if it has
    no native form (a pickle: local processes only need the same pipeopt)."""
    try:
        return native.to_dict(instance)
    except PipeoptError as exc:
        logger.info("%s travels pickled: %s", instance.name, exc)
        return instance


def _decode(key, payload) -> Instance:
    inst = _DECODED.get(key)
    if inst is None:
        inst = payload if isinstance(payload, Instance) else native.from_dict(payload, source="<sweep>")
        if len(_DECODED) >= _CACHE_SIZE:
            _DECODED.pop(next(iter(_DECODED)))
        _DECODED[key] = inst
    return inst


def _guarded(fn: Callable, instance: Callable[[], Instance], args: tuple):
    """``fn(instance(), *args)``, or a :class:`Failure` naming the exception raised."""
    try:
        return fn(instance(), *args)
    except Exception as exc:  # noqa: BLE001 - a failed call is a row, not the end of the sweep
        logger.warning("a sweep call failed", exc_info=True)
        return Failure(f"{type(exc).__name__}: {exc}")


def _init_pool(payloads: list, env: dict) -> None:
    """Initializer of a local worker process: one thread per solver process, the instances."""
    global _POOL_PAYLOADS
    os.environ.update(env)
    _POOL_PAYLOADS = payloads
    _DECODED.clear()


def _pool_call(fn: Callable, index: int, args: tuple):
    return _guarded(fn, lambda: _decode(index, _POOL_PAYLOADS[index]), args)


def _dask_call(fn: Callable, key: str, payload, args: tuple):
    return _guarded(fn, lambda: _decode(key, payload), args)


# -- executors --------------------------------------------------------------------------------


class Sequential:
    """Every call in this process, in order (a worker that dies here ends the sweep: the
    solvers already run in child processes of their own)."""

    parallel = False

    def __repr__(self) -> str:
        return "Sequential()"

    def run(self, fn: Callable, instances: Sequence[Instance], calls: Sequence[tuple]) -> Iterator[tuple[int, object]]:
        """Yield ``(i, fn(instances[calls[i][0]], *calls[i][1:]))`` for i = 0, 1, ..."""
        for i, call in enumerate(calls):
            yield i, _guarded(fn, lambda call=call: instances[call[0]], tuple(call[1:]))


class Processes:
    """``jobs`` local worker processes (``spawn``); see the module docstring."""

    parallel = True

    def __init__(self, jobs: int):
        self.jobs = check_jobs(jobs)

    def __repr__(self) -> str:
        return f"Processes(jobs={self.jobs})"

    def _pool(self, payloads: list, workers: int) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_pool, initargs=(payloads, SINGLE_THREAD_ENV))

    def run(self, fn: Callable, instances: Sequence[Instance], calls: Sequence[tuple]) -> Iterator[tuple[int, object]]:
        """Yield ``(i, value)`` for every call as it finishes (a :class:`Failure` for a call
        that raised or whose worker died)."""
        if not calls:
            return
        payloads = [_payload(inst) for inst in instances]
        pending = deque(range(len(calls)))
        while pending:
            suspects: list[int] = []
            pool = self._pool(payloads, min(self.jobs, len(pending)))
            with _closing(pool):
                yield from self._drain(pool, fn, calls, pending, suspects)
            for i in suspects:  # alone, so that a death names its own call
                pool = self._pool(payloads, 1)
                with _closing(pool):
                    future = pool.submit(_pool_call, fn, calls[i][0], tuple(calls[i][1:]))
                    yield i, _outcome(future, alone=True)

    def _drain(self, pool, fn, calls, pending: deque, suspects: list) -> Iterator[tuple[int, object]]:
        """Run pending calls, at most ``jobs`` in flight, until none is left or the pool
        breaks; then the calls in flight go to ``suspects`` (those that had finished are
        yielded)."""
        running: dict = {}
        while pending or running:
            broken = False
            while pending and len(running) < self.jobs and not broken:
                i = pending.popleft()
                try:
                    running[pool.submit(_pool_call, fn, calls[i][0], tuple(calls[i][1:]))] = i
                except BrokenProcessPool:  # a call in flight has just killed its worker
                    pending.appendleft(i)
                    broken = True
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                i = running.pop(future)
                if _died(future):
                    broken = True
                    suspects.append(i)
                else:
                    yield i, _outcome(future)
            if broken:
                wait(running)  # a broken pool fails every future at once
                for future, i in running.items():
                    if _died(future):
                        suspects.append(i)
                    else:
                        yield i, _outcome(future)
                return


def _died(future) -> bool:
    return isinstance(future.exception(), BrokenProcessPool)


def _outcome(future, alone: bool = False):
    """The value of a finished future, or a :class:`Failure` naming why there is none."""
    exc = future.exception()
    if exc is None:
        return future.result()
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, BrokenProcessPool) and alone:
        message = f"the worker process running this task died (also when run alone): {message}"
    return Failure(message[:300])


class _Killed(Failure):
    """A Dask task whose workers died while it ran (``KilledWorker``): maybe its own doing,
    maybe a neighbour's on the same worker; run again alone to tell."""


def _dask_outcome(future):
    """The value of a finished Dask future, a :class:`_Killed` if its workers died, or a
    :class:`Failure` naming why there is none."""
    try:
        return future.result()
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - KilledWorker, a cancelled or lost task: a row
        kind = _Killed if type(exc).__name__ == "KilledWorker" else Failure
        return kind(f"{type(exc).__name__}: {exc}"[:300])


class _closing:
    """Shut a pool down on leaving; kill its workers if leaving on an exception (Ctrl-C, the
    consumer of the rows failed) rather than waiting for their solves."""

    def __init__(self, pool: ProcessPoolExecutor):
        self.pool = pool

    def __enter__(self) -> ProcessPoolExecutor:
        return self.pool

    def __exit__(self, kind, exc, tb) -> None:
        if kind is not None:
            for process in list((getattr(self.pool, "_processes", None) or {}).values()):
                process.terminate()
        self.pool.shutdown(wait=kind is None, cancel_futures=True)


class DaskCluster:
    """A Dask distributed cluster at ``address`` (``"local"``: a
    :class:`distributed.LocalCluster` of ``workers`` single-threaded processes, default one per
    core, started for the sweep and closed after it)."""

    parallel = True

    def __init__(self, address: str, workers: int | None = None):
        self.address = address
        self.workers = workers

    def __repr__(self) -> str:
        return f"DaskCluster({self.address!r})"

    def _connect(self):
        """``(client, cluster or None)``.

        Raises
        ------
        ExecutorError
            If the scheduler does not answer, or the local cluster cannot start.
        """
        distributed = _require_distributed()
        if self.address == "local":
            try:
                cluster = distributed.LocalCluster(n_workers=self.workers or os.cpu_count() or 1,
                                                   threads_per_worker=1, processes=True,
                                                   dashboard_address=None, silence_logs=logging.ERROR)
            except Exception as exc:  # noqa: BLE001 - ports, spawn failures: one message
                raise ExecutorError(f"cannot start a local Dask cluster: {type(exc).__name__}: {exc}") from None
            return distributed.Client(cluster), cluster
        try:
            return distributed.Client(self.address, timeout="20s"), None
        except (OSError, TimeoutError, ValueError, TypeError) as exc:
            raise ExecutorError(f"cannot reach the Dask scheduler at {self.address}: {type(exc).__name__}: {exc}") \
                from None

    def run(self, fn: Callable, instances: Sequence[Instance], calls: Sequence[tuple]) -> Iterator[tuple[int, object]]:
        """Yield ``(i, value)`` for every call as it finishes on the cluster (a
        :class:`Failure` for a call that raised or whose workers died)."""
        if not calls:
            return
        distributed = _require_distributed()
        client, cluster = self._connect()
        try:
            token = uuid.uuid4().hex[:12]
            # every task carries its instance: tasks without dependencies are spread over the
            # workers as they free up, and a task retried after its worker died finds its data
            # (an instance shipped once would pull every task to the worker that holds it, and
            # die with it)
            payloads = {k: _payload(instances[k]) for k in sorted({call[0] for call in calls})}

            def submit(i: int, key: str):
                call = calls[i]
                return client.submit(_dask_call, fn, f"{token}-{call[0]}", payloads[call[0]], tuple(call[1:]),
                                     pure=False, key=key)

            futures = {submit(i, f"pipeopt-{token}-{i}"): i for i in range(len(calls))}
            suspects: list[int] = []
            for future in distributed.as_completed(futures):
                value = _dask_outcome(future)
                future.release()
                if isinstance(value, _Killed):
                    suspects.append(futures[future])
                else:
                    yield futures[future], value
            for i in sorted(suspects):  # alone, so that a death names its own call
                future = submit(i, f"pipeopt-{token}-{i}-alone")
                distributed.wait(future)
                value = _dask_outcome(future)
                future.release()
                if isinstance(value, _Killed):
                    value = Failure(f"the workers running this task died (also when run alone): {value.message}"[:300])
                yield i, value
        finally:
            client.close()
            if cluster is not None:
                cluster.close()
