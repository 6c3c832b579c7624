"""Readers and writers of instance files.

:func:`read` recognises the format of a file by its content (and its suffix):

* pipeopt's native JSON instance (:mod:`pipeopt.io.native`; ``"format": "pipeopt-instance"``);
* Tarnawski et al.'s dnn-partitioning JSON workloads (:mod:`pipeopt.io.dnn_partitioning`), and
  their splits (:func:`read_dnn_partitioning_split`);
* a PipeDream profile ``graph.txt`` (:mod:`pipeopt.io.pipedream`).

:func:`write` writes the native format.
"""

from __future__ import annotations

import inspect
import os
from typing import TYPE_CHECKING

from ..errors import ReadError
from ..instance import Instance
from ..lazy import lazy_attributes
from .pipedream import read_pipedream

if TYPE_CHECKING:
    from pathlib import Path

# the JSON formats' readers are imported when first used (a PipeDream profile needs neither)
__getattr__, __dir__ = lazy_attributes(__name__, {
    "read_dnn_partitioning": ".dnn_partitioning", "read_dnn_partitioning_split": ".dnn_partitioning",
    "from_dict": ".native", "read_instance": ".native", "to_dict": ".native", "write_instance": ".native",
})

__all__ = ["from_dict", "load", "read", "read_dnn_partitioning", "read_dnn_partitioning_split", "read_instance",
           "read_pipedream", "to_dict", "write", "write_instance"]


def read(
    path: str | Path,
    *,
    bandwidth: float | str | None = None,
    memory: float | str | None = None,
    latency: float | str | None = None,
    **options,
) -> Instance:
    """Read an instance file of any supported format, with optional cluster overrides.

    Parameters
    ----------
    path
        A native JSON instance (``.json`` with the ``pipeopt-instance`` header), a
        dnn-partitioning workload (``.json`` with ``nodes`` carrying ``cpuLatency``), or a
        PipeDream profile (any other text file, usually ``.txt``).
    bandwidth
        Bytes/s between workers (or a string such as ``"100Gbps"``, :mod:`pipeopt.units`);
        replaces the file's value in every format.
    memory
        Bytes of memory per device (or ``"16GiB"``); replaces the file's value in every format.
    latency
        Seconds per message between workers (or ``"0.3ms"``, :func:`pipeopt.units.parse_latency`);
        replaces the file's value (default 0) in every format.
    **options
        Passed to the format's reader: for PipeDream profiles ``devices``, ``bandwidth``,
        ``memory``, ``count_input_time``, ``settings`` (see
        :func:`pipeopt.io.pipedream.read_pipedream`); for dnn-partitioning workloads see
        :func:`pipeopt.io.dnn_partitioning.read_dnn_partitioning`. Native files take none:
        they carry their own cluster and settings (replace them with
        :meth:`pipeopt.Instance.replace`).

    Returns
    -------
    Instance

    Raises
    ------
    ReadError
        If the file is missing or unreadable, its format is not recognised, it is malformed,
        or options are given that the format does not take.
    InvalidGraphError, InvalidClusterError, InvalidProblemError
        If the content is well-formed but invalid.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ReadError(f"a file path must be a str or Path, got {type(path).__name__} {path!r:.60}")
    instance = _read(path, bandwidth=bandwidth, memory=memory, **options)
    if bandwidth is not None or memory is not None or latency is not None:
        instance = instance.replace(cluster=instance.cluster.with_overrides(bandwidth=bandwidth, memory=memory,
                                                                            latency=latency))
    return instance


def load(
    path: str | Path,
    *,
    devices: int | None = None,
    bandwidth: float | str | None = None,
    memory: float | str | None = None,
    latency: float | str | None = None,
) -> Instance:
    """Read an instance file for a benchmark or the command line: :func:`read` with the
    cluster overrides, and for a PipeDream profile (which carries no cluster) ``devices``
    identical devices.

    Parameters
    ----------
    path
        Any file :func:`read` reads.
    devices
        Devices of the cluster assumed for a PipeDream profile (default 16); a file that
        carries its own cluster keeps it (so a benchmark can pass one count for every file).
    bandwidth, memory, latency
        As in :func:`read`.

    Raises
    ------
    ReadError, InvalidGraphError, InvalidClusterError, InvalidProblemError
        As :func:`read`.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ReadError(f"a file path must be a str or Path, got {type(path).__name__} {path!r:.60}")
    profile = os.path.splitext(os.fspath(path))[1].lower() != ".json"
    options = {"devices": devices if devices is not None else 16} if profile else {}
    return read(path, bandwidth=bandwidth, memory=memory, latency=latency, **options)


def _read(path, *, bandwidth, memory, **options) -> Instance:
    path = os.fspath(path)  # os.path, not pathlib: a profile's read is on the start-up path
    if not os.path.exists(path):
        raise ReadError(f"no such file: {path}")
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReadError(f"cannot read {path}: {exc}") from None
    if os.path.splitext(path)[1].lower() == ".json" or text.lstrip().startswith("{"):
        import json  # the JSON formats only (start-up of a profile's read)

        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ReadError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
        if isinstance(d, dict) and "format" in d:
            if options:
                raise ReadError(
                    f"{path}: a native instance file takes no reader options, got {sorted(options)}"
                )
            from .native import read_instance

            return read_instance(path)
        if (
            isinstance(d, dict)
            and isinstance(d.get("nodes"), list)
            and any(isinstance(n, dict) and "cpuLatency" in n for n in d["nodes"])
        ):
            from .dnn_partitioning import read_dnn_partitioning

            _check_options(path, read_dnn_partitioning, options)
            return read_dnn_partitioning(path, **options)
        raise ReadError(
            f"{path}: JSON file is neither a pipeopt instance (no 'format' field) nor a dnn-partitioning workload"
        )
    _check_options(path, read_pipedream, options)
    for key, value in (("bandwidth", bandwidth), ("memory", memory)):
        if value is not None:  # a profile's cluster is assumed: build it with the given values
            options[key] = value
    return read_pipedream(path, **options)


def _check_options(path: str, reader, options: dict) -> None:
    accepted = set(inspect.signature(reader).parameters) - {"path"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ReadError(
            f"{path}: option(s) {unknown} not taken by {reader.__name__} (it takes {sorted(accepted)})"
        )


def write(instance: Instance, path: str | Path) -> Path:
    """Write ``instance`` as a native JSON file (see :func:`pipeopt.io.native.write_instance`)."""
    from .native import write_instance

    return write_instance(instance, path)
