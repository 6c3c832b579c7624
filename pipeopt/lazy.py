"""Heavy modules imported on first use: ``pulp = lazy_module("pulp")`` in place of ``import pulp``.

pipeopt's solver doors and models read PuLP, OR-Tools' CP-SAT, highspy and pandas through
module-level names; importing them all costs about a second (OR-Tools' ``cp_model`` alone pulls
in pandas and pyarrow). A :class:`LazyModule` stands in for such a name: the module is imported
when an attribute is first read from it (``pulp.LpProblem``, ``cp_model.CpModel()``), and each
attribute read is kept on the stand-in, so later reads cost an ordinary attribute lookup.
Nothing is put in :data:`sys.modules` until the real import happens, so ``"pulp" in
sys.modules`` stays a true statement of what was loaded.
"""

from __future__ import annotations

import importlib

__all__ = ["LazyFunction", "LazyModule", "lazy_attributes", "lazy_function", "lazy_module"]


class LazyModule:
    """A module imported (:func:`importlib.import_module`) on the first attribute read."""

    def __init__(self, name: str):
        object.__setattr__(self, "_LazyModule__name", name)
        object.__setattr__(self, "_LazyModule__module", None)

    def _load(self):
        """The real module (imported now if it was not)."""
        module = self.__module
        if module is None:
            module = importlib.import_module(self.__name)
            object.__setattr__(self, "_LazyModule__module", module)
        return module

    def __getattr__(self, attr: str):
        value = getattr(self._load(), attr)
        if not attr.startswith("__"):
            object.__setattr__(self, attr, value)  # later reads: a plain instance attribute
        return value

    def __setattr__(self, attr: str, value) -> None:  # e.g. monkeypatching a function of the module
        setattr(self._load(), attr, value)
        object.__setattr__(self, attr, value)

    def __delattr__(self, attr: str) -> None:
        delattr(self._load(), attr)
        self.__dict__.pop(attr, None)

    def __dir__(self):
        return dir(self._load())

    def __repr__(self) -> str:
        state = "imported" if self.__module is not None else "not imported yet"
        return f"<lazy module {self.__name!r} ({state})>"


def lazy_module(name: str) -> LazyModule:
    """A stand-in for module ``name`` that imports it on first attribute read."""
    return LazyModule(name)


def lazy_attributes(package: str, where: dict[str, str]):
    """A package's PEP 562 ``__getattr__`` and ``__dir__`` for names imported on first use.

    Parameters
    ----------
    package
        The package's ``__name__``.
    where
        Public name -> the module (relative to ``package``) that defines it.

    Returns
    -------
    tuple
        ``(__getattr__, __dir__)``: ``__getattr__(name)`` imports the name's module, keeps the
        value in the package's namespace (later reads are plain lookups) and returns it, or raises
        :class:`AttributeError` for a name not in ``where``; ``__dir__()`` lists both.

    A name that is also its module's name (``binary_search`` in ``.binary_search``) would be
    replaced by the submodule when the import system binds it to the package (by any import of
    it, e.g. a method run through :class:`LazyFunction`); for those names the package's module
    class binds the name's value instead, as an eager ``from .binary_search import
    binary_search`` did.
    """
    import sys
    import types

    shadowed = frozenset(name for name, module in where.items() if module == f".{name}")
    if shadowed:
        class Package(types.ModuleType):
            def __setattr__(self, key, value):
                if key in shadowed and isinstance(value, types.ModuleType) and value.__name__ == f"{package}.{key}":
                    value = getattr(value, key)  # the submodule bound by the import system: keep its function
                super().__setattr__(key, value)

        sys.modules[package].__class__ = Package

    def __getattr__(name: str):
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__


class LazyFunction:
    """A module's function imported on first call (or first attribute read, e.g. ``__name__``):
    what a method table (``METHODS``) holds for a method whose module is not needed until the
    method runs, so that reading the table imports only the methods that are called.

    Parameters
    ----------
    module
        The module's name, absolute or relative to ``package``.
    name
        The function's name in that module.
    package
        The package a relative ``module`` is resolved against.
    """

    def __init__(self, module: str, name: str, package: str | None = None):
        object.__setattr__(self, "_LazyFunction__where", (module, name, package))
        object.__setattr__(self, "_LazyFunction__function", None)

    def load(self):
        """The real function (its module imported now if it was not)."""
        fn = self.__function
        if fn is None:
            module, name, package = self.__where
            fn = getattr(importlib.import_module(module, package), name)
            object.__setattr__(self, "_LazyFunction__function", fn)
        return fn

    def __call__(self, *args, **kwargs):
        return self.load()(*args, **kwargs)

    def __getattr__(self, attr: str):
        if attr.startswith("_LazyFunction__"):  # not set yet (a copy being built)
            raise AttributeError(attr)
        return getattr(self.load(), attr)

    def __reduce__(self):
        return (LazyFunction, self.__where)

    def __repr__(self) -> str:
        module, name, _ = self.__where
        return f"<lazy function {module}.{name}>"


def lazy_function(module: str, name: str, package: str | None = None) -> LazyFunction:
    """A stand-in for ``module.name`` that imports the module on first call (:class:`LazyFunction`)."""
    return LazyFunction(module, name, package)
