"""torch is optional: ``import pipeopt`` never imports it, and the PyTorch entry points name the
install command when it is missing (issue 9.1). Runs with or without torch installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _blocked(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter in which ``import torch`` fails."""
    prelude = "import sys\nsys.modules['torch'] = None\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], check=False, capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def test_import_pipeopt_works_without_torch():
    """No torch needed for the core package; from_torch and the CLI name the install command."""
    proc = _blocked(
        """
        import pipeopt
        assert sys.modules['torch'] is None and 'pipeopt.torch' not in sys.modules
        try:
            pipeopt.from_torch(object(), ())
        except pipeopt.PipeoptError as exc:
            print(type(exc).__name__, exc)
        from pipeopt.cli import main
        print('exit', main(['profile', 'gpt-tiny', '--out', '/nonexistent-dir-is-not-reached/x.json']))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "MissingExtraError" in proc.stdout
    assert "pip install torch==2.13.0" in proc.stdout and "pipeopt[torch]" in proc.stdout
    assert "exit 2" in proc.stdout
    assert "pip install torch==2.13.0" in proc.stderr  # the CLI's one-line error
