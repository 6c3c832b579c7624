"""PyTorch in and out of pipeopt (optional: ``pip install "pipeopt[torch]"``).

* :func:`from_torch` -- the layer graph of an ``nn.Module`` with measured (this CPU) or
  estimated (a catalogue device) costs, as an :class:`~pipeopt.Instance`
  (:mod:`pipeopt.torch.profile`);
* :mod:`pipeopt.torch.models` -- the models pipeopt ships (a GPT-style decoder, a small
  ResNet-like CNN), registry :data:`MODELS`.

``import pipeopt`` never imports torch; importing this package without torch raises
:class:`~pipeopt.errors.MissingExtraError` with the install command.
"""

from __future__ import annotations

from ..errors import MissingExtraError

INSTALL = (
    'pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu (CPU build), '
    'or pip install "pipeopt[torch]"'
)
"""How to install the torch extra (the message of :class:`MissingExtraError`)."""

try:  # torch.nn, not torch: any folder named torch on sys.path would import as an empty namespace
    import torch.nn as _nn  # noqa: F401 - the check
except ImportError as exc:
    raise MissingExtraError(f"pipeopt's PyTorch support needs torch, which is not installed: {INSTALL}") from exc

from .models import MODELS as MODELS
from .profile import from_torch as from_torch
