"""Model zoo: analytic layer graphs of real architectures and a catalogue of real devices.

Layer graphs are computed from the architectures' shapes (FLOP, activation and parameter
bytes per layer, :mod:`pipeopt.zoo.shapes` and :mod:`pipeopt.zoo.models`) and turned into
times per resource kind with the device catalogue (:mod:`pipeopt.zoo.devices`: 1 unit of a
kind = 1 TFLOP/s of peak; time = FLOP / (1e12 x efficiency of the kind)).

>>> from pipeopt import zoo
>>> g = zoo.model("vgg16", microbatch=32)               # doctest: +SKIP
>>> inst = zoo.instance("alexnet", "a100-40gb", 8, bandwidth="nvlink3")  # doctest: +SKIP

``python -m pipeopt.zoo [DIR]`` writes the shipped instance files (:mod:`pipeopt.zoo.__main__`).
"""

from __future__ import annotations

from .build import BACKWARD_FLOP_FACTOR as BACKWARD_FLOP_FACTOR
from .build import MODELS as MODELS
from .build import cluster as cluster
from .build import instance as instance
from .build import model as model
from .devices import DEVICES as DEVICES
from .devices import KINDS as KINDS
from .devices import LINKS as LINKS

__all__ = ["BACKWARD_FLOP_FACTOR", "DEVICES", "KINDS", "LINKS", "MODELS", "cluster", "instance", "model"]
