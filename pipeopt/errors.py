"""Typed errors. Every problem with the input names itself here, never deep in a solver."""

from __future__ import annotations


class PipeoptError(ValueError):
    """Base class of every error pipeopt raises on bad input or an impossible request."""


class InvalidGraphError(PipeoptError):
    """The layer graph is not a valid DAG of layers (cycle, missing or negative attribute)."""


class InvalidClusterError(PipeoptError):
    """The cluster is malformed (no devices, a device without resources, bad bandwidth)."""


class InvalidUnitError(InvalidClusterError):
    """A bandwidth or memory size is written in no accepted form (``10G``: bits or bytes?)
    or is not a positive finite amount; the message lists the accepted forms
    (:mod:`pipeopt.units`)."""


class InvalidPlanError(PipeoptError):
    """A plan does not describe a valid split (dropped or duplicated layer, empty stage,
    a backward edge between stages, unknown device, share outside [0, 1])."""


class UnsupportedPlanError(InvalidPlanError):
    """A valid plan that a pipeline runtime cannot express (:mod:`pipeopt.export`): a cut
    inside a module the runtime cannot split, a non-contiguous stage, per-stage replication,
    an embedding or head placement its format has no word for. The message names the
    runtime and the problem."""


class PipelineRunError(PipeoptError):
    """A real pipeline run failed (``pipeopt run``, :mod:`pipeopt.torch.runtime`): a stage
    process raised or did not finish in time; the message names the rank and quotes its error."""


class InvalidProblemError(PipeoptError):
    """The request cannot be posed on this instance (more stages than layers, more
    workers than devices, unknown method or option)."""


class InfeasibleError(PipeoptError):
    """An exact method proved that no plan satisfies the constraints (e.g. memory)."""


class ReadError(PipeoptError):
    """A file could not be read or is malformed; the message names the file and the line."""


class WriteError(PipeoptError):
    """An output file cannot be written (missing or read-only folder); the message names it."""


class MissingExtraError(PipeoptError):
    """A feature needs an optional extra that is not installed (e.g. ``--dask`` needs
    ``pip install "pipeopt[dask]"``); the message names the pip command."""


class ExecutorError(PipeoptError):
    """The bench's workers cannot be started or reached (a Dask scheduler that does not
    answer at the address given); the message names the address."""


class ClaimError(RuntimeError):
    """A method's result contradicts itself: a lower bound above the objective of its own plan,
    or ``optimal`` / ``feasible`` with a plan that breaks memory. Raised by
    :class:`pipeopt.Result` at construction, so that no false claim ever reaches a user; it is
    a bug in pipeopt (not a :class:`PipeoptError`, which is about the input)."""
