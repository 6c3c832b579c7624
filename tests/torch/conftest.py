"""tests/torch: the PyTorch tests.

Without torch installed, ``import torch`` finds this very folder (``tests/`` is on ``sys.path``)
as an empty namespace package, so ``pytest.importorskip("torch")`` does not skip and the
modules fail at import. When the real torch (``torch.nn``) is missing, the modules that need
it are left out of collection here; ``test_torch_optional.py`` (pipeopt without torch) runs
either way.
"""

from __future__ import annotations

from pathlib import Path

try:
    import torch.nn  # noqa: F401 - the real torch, not this folder
except ImportError:
    collect_ignore = [p.name for p in Path(__file__).parent.glob("test_*.py") if p.name != "test_torch_optional.py"]
