"""The README's Python quickstart runs as written and its claims hold."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart_runs(capsys):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block, "README has no Python quickstart"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        scope: dict = {}
        exec(compile(block.group(1), "README-quickstart", "exec"), scope)
    finally:
        os.chdir(cwd)
    best, milp, heur, ev = scope["best"], scope["milp"], scope["heur"], scope["ev"]
    assert str(best.status) == "optimal" and str(milp.status) == "optimal"
    assert milp.objective == pytest.approx(best.objective, rel=1e-9)
    assert heur.objective >= best.objective * (1 - 1e-12)
    assert ev.objective == heur.objective
    assert "gap" in capsys.readouterr().out
