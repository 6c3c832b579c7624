"""``njit`` that imports numba on a kernel's first call, not when its module is imported.

``from pipeopt.jit import njit`` replaces ``from numba import njit`` in the modules that hold
compiled kernels (:mod:`pipeopt.problems.ideals`, :mod:`pipeopt.problems.partition.convex`,
:mod:`pipeopt.problems.placement.dp`, :mod:`pipeopt.problems.resource.kernels`,
:mod:`pipeopt.problems.resource.split`); the kernels and their decorator lines stay as they
were. Importing numba takes about 0.2 s, so a run that calls no kernel (``pipeopt --help``,
the partition DP) no longer pays it.

On the first call, :class:`LazyKernel` hands the Python function to ``numba.njit`` with the
decorator's options (``cache=True`` keeps the compiled code on disk: numba's cache files sit
in ``__pycache__`` next to the module, or, where that folder is not writable, in numba's
user-wide cache folder; ``NUMBA_CACHE_DIR`` overrides both) and from then on calls the
dispatcher. The cache key is the function's file, name and first line, exactly as with an
eager ``numba.njit``.

A kernel that calls another kernel reads it as a global when numba compiles it: before a
kernel is compiled, every global it names that is a :class:`LazyKernel` is replaced in its
module by that kernel's numba dispatcher (numba types calls to dispatchers only).
"""

from __future__ import annotations

import functools
import threading
import types

__all__ = ["LazyKernel", "njit"]

_LOCK = threading.RLock()
"""One kernel made at a time (two threads calling kernels first get one dispatcher each)."""


def _names(code: types.CodeType) -> set[str]:
    """The global names a code object and the code objects nested in it read."""
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _names(const)
    return out


class LazyKernel:
    """A Python function to be compiled by ``numba.njit(**options)`` on its first call.

    Calling it calls the compiled dispatcher; any other attribute (``py_func``,
    ``signatures``, ``inspect_types``, ...) is the dispatcher's.
    """

    def __init__(self, func, options: dict):
        self.py_func = func
        self._options = options
        self._dispatcher = None
        functools.update_wrapper(self, func)

    @property
    def dispatcher(self):
        """The numba dispatcher (created, and numba imported, on first use)."""
        if self._dispatcher is None:
            with _LOCK:
                if self._dispatcher is None:
                    import numba

                    glb = self.py_func.__globals__
                    for name in _names(self.py_func.__code__):  # callees must be numba dispatchers
                        obj = glb.get(name)
                        if isinstance(obj, LazyKernel) and obj is not self:
                            glb[name] = obj.dispatcher
                    dispatcher = numba.njit(**self._options)(self.py_func)
                    if glb.get(self.py_func.__name__) is self:  # its module's callers skip this wrapper
                        glb[self.py_func.__name__] = dispatcher
                    self._dispatcher = dispatcher
        return self._dispatcher

    def __call__(self, *args, **kwargs):
        return self.dispatcher(*args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("__") or name in ("_dispatcher", "_options", "py_func"):
            raise AttributeError(name)
        return getattr(self.dispatcher, name)

    def __repr__(self) -> str:
        state = "compiled on first call" if self._dispatcher is None else "dispatcher ready"
        return f"<LazyKernel {self.py_func.__module__}.{self.py_func.__qualname__} ({state})>"


def njit(func=None, **options):
    """``numba.njit`` with the same options, deferred to the first call (:class:`LazyKernel`).

    Usable as ``@njit`` or ``@njit(cache=True, nogil=True, ...)``.
    """
    if func is None:
        return lambda f: LazyKernel(f, options)
    return LazyKernel(func, options)
