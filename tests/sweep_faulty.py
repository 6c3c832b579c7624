"""Test-only partition methods that fail, for tests/test_sweep.py: ``boom`` raises (a bug in a
method), ``die`` ends its process at once (a crash that takes the worker along).

The test process registers them with monkeypatch. A worker process (a local one of
``--jobs``, or a Dask worker) knows them because it imports this module when it unpickles a
task that names one of them, and the import registers them there when the test has set
:data:`ENV` (the workers inherit it); the test process imports it without the variable, so its
registry is left alone.
"""

from __future__ import annotations

import os

from pipeopt import registry
from pipeopt.problems.method import Method

ENV = "PIPEOPT_TEST_FAULTY_METHODS"


def boom(problem, **options):
    """Raise an exception that is not a pipeopt error (what a bug looks like)."""
    raise ZeroDivisionError("boom: a method with a bug")


def die(problem, **options):
    """End the process at once, as a segfaulting solver in-process would."""
    os._exit(3)


METHODS = [
    Method("partition", "boom", boom, exact=False, space="one-order", default=False),
    Method("partition", "die", die, exact=False, space="one-order", default=False),
]

if os.environ.get(ENV) == "1" and not any(m.name == "boom" for m in registry.METHODS):
    registry.METHODS.extend(METHODS)
