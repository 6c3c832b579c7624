"""pipeopt: exact pipeline-parallel planning for DNN training, and the gaps of the heuristics.

The public API: build or :func:`read` an :class:`Instance`, :func:`solve` a problem on it
(partition, allocate, joint, group, bipartition), score any plan with :func:`evaluate`.

>>> import pipeopt
>>> inst = pipeopt.read("../shared/data/pipedream-profiles/vgg16.txt")  # doctest: +SKIP
>>> pipeopt.solve(inst, method="dp", stages=4).status  # doctest: +SKIP
<Status.OPTIMAL: 'optimal'>
"""

from __future__ import annotations

from .lazy import lazy_attributes
from typing import TYPE_CHECKING

from .errors import InfeasibleError as InfeasibleError
from .errors import InvalidClusterError as InvalidClusterError
from .errors import InvalidGraphError as InvalidGraphError
from .errors import InvalidPlanError as InvalidPlanError
from .errors import InvalidProblemError as InvalidProblemError
from .errors import PipeoptError as PipeoptError
from .errors import ReadError as ReadError
from .solve import solve as solve  # eager: the name is also its module's, which an import would set here

_LAZY = {
    "Cluster": ".cluster",
    "Device": ".cluster",
    "Evaluation": ".cost",
    "evaluate": ".cost",
    "Instance": ".instance",
    "Settings": ".instance",
    "PartitionProblem": ".problems.partition.problem",
    "Plan": ".plan",
    "Stage": ".plan",
    "Result": ".result",
    "Status": ".result",
    "read": ".io",
    "write": ".io",
}
"""Public names imported on first use (PEP 562), so that ``import pipeopt`` (and the
``pipeopt`` command's parser) imports neither numpy, networkx nor any solver: name -> module."""

__all__ = [*_LAZY, "InfeasibleError", "InvalidClusterError", "InvalidGraphError", "InvalidPlanError",
           "InvalidProblemError", "PipeoptError", "ReadError", "from_torch", "solve"]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)


if TYPE_CHECKING:
    from .cluster import Cluster as Cluster
    from .cluster import Device as Device
    from .cost import Evaluation as Evaluation
    from .cost import evaluate as evaluate
    from .instance import Instance as Instance
    from .instance import Settings as Settings
    from .io import read as read
    from .io import write as write
    from .plan import Plan as Plan
    from .plan import Stage as Stage
    from .problems.partition.problem import PartitionProblem as PartitionProblem
    from .result import Result as Result
    from .result import Status as Status

__version__ = "0.1.0"


def from_torch(module, example_inputs, **options) -> Instance:
    """The pipeopt instance of a PyTorch ``nn.Module``: :func:`pipeopt.torch.profile.from_torch`
    (its options and errors), imported only when called so that ``import pipeopt`` never
    imports torch.

    Raises
    ------
    MissingExtraError
        If torch is not installed (the message names ``pip install torch==2.13.0 --index-url
        https://download.pytorch.org/whl/cpu`` and ``pipeopt[torch]``).
    """
    from .torch import from_torch as _from_torch

    return _from_torch(module, example_inputs, **options)


# The "pipeopt" logger (the bench and the sweep log to it) gets its NullHandler where it is
# first used (pipeopt.bench, pipeopt.sweep): logging is not imported at start-up.
