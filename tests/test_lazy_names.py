"""A method whose name is also its module's (``binary_search`` in ``.binary_search``, ``mcmc``,
``pipedream``) stays the function on its package, whatever imported the module first: the
import system binds a submodule to its package, which made ``from pipeopt.problems.partition
import binary_search`` return the module after a method run had imported it lazily."""

import subprocess
import sys

import pytest

from pipeopt.lazy import lazy_attributes

CASES = ["binary_search", "mcmc", "pipedream"]


@pytest.mark.parametrize("name", CASES)
def test_name_is_the_function_after_its_module_was_imported(name):
    code = (f"import importlib, pipeopt.problems.partition as p\n"
            f"importlib.import_module('pipeopt.problems.partition.{name}')\n"  # the module first
            f"from pipeopt.problems.partition import {name} as f\n"
            f"assert callable(f) and not isinstance(f, type(p)), f\n"
            f"assert f is getattr(p, '{name}')\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_only_same_named_modules_are_guarded():
    import types

    mod = types.ModuleType("pkg_for_test")
    sys.modules["pkg_for_test"] = mod
    try:
        lazy_attributes("pkg_for_test", {"f": ".f", "g": ".other"})
        sub = types.ModuleType("pkg_for_test.f")
        sub.f = len
        mod.f = sub  # what the import system does
        assert mod.f is len
        other = types.ModuleType("pkg_for_test.g")
        mod.g = other  # not a same-named module: bound as given
        assert mod.g is other
    finally:
        del sys.modules["pkg_for_test"]
