"""Kernel errors: misuse of the ``tl`` API, named by PE and by the kernel's source line.

A :class:`KernelError` says *where*: the PE whose kernel misbehaved and the
``file:line`` of the user's kernel code that made the call, found by walking the
Python stack outwards past the runtime's own frames (this package, the machine's
modules in actors/ahbm/*.py such as the PE CPU, the engine, the protocols,
greenback/greenlet/trio and the standard library).
"""
from __future__ import annotations

import os
import sys

__all__ = ["KernelError", "user_site", "site_of"]

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_SKIP = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    os.path.join(_ROOT, "emulator") + os.sep,
    os.path.join(_ROOT, "protocols") + os.sep,
)
_SKIP_PARTS = ("site-packages", f"{os.sep}lib{os.sep}python", "<frozen")
#: the machine's own modules (actors/ahbm/*.py: the PE CPU the runtime awaits, costs, memory); its
#: ``kernels/`` package is user code
_MACHINE = os.path.join(_ROOT, "actors", "ahbm")


def _skipped(filename: str) -> bool:
    fn = os.path.abspath(filename) if not filename.startswith("<") else filename
    return fn.startswith(_SKIP) or os.path.dirname(fn) == _MACHINE or any(p in fn for p in _SKIP_PARTS)


#: file name -> its name relative to the repository (``fn.startswith(_ROOT)`` means absolute)
_REL: dict[str, str] = {}
#: absolute file name -> skipped?  (every scratch scope's end names its site: a few files, many calls)
_SKIPPED: dict[str, bool] = {}


def _skipped_cached(filename: str) -> bool:
    """:func:`_skipped`, remembered for absolute names (their answer does not depend on the cwd)."""
    hit = _SKIPPED.get(filename)
    if hit is None:
        hit = _skipped(filename)
        if os.path.isabs(filename):
            _SKIPPED[filename] = hit
    return hit


def user_site(depth: int = 1) -> str:
    """``file:line`` of the innermost frame that is kernel code (not runtime, engine or library)."""
    f = sys._getframe(depth)
    while f is not None:
        fn = f.f_code.co_filename
        if not _skipped_cached(fn):
            rel = _REL.get(fn)
            if rel is None:
                rel = _REL[fn] = os.path.relpath(fn, _ROOT) if fn.startswith(_ROOT) else fn
            return f"{rel}:{f.f_lineno}"
        f = f.f_back
    return "<unknown kernel line>"


def site_of(tb) -> str:
    """``file:line`` of the innermost kernel-code frame of a traceback (an exception raised by the kernel)."""
    site = "<unknown kernel line>"
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        if not _skipped(fn):
            rel = os.path.relpath(fn, _ROOT) if fn.startswith(_ROOT) else fn
            site = f"{rel}:{tb.tb_lineno}"
        tb = tb.tb_next
    return site


class KernelError(Exception):
    """A kernel misused the ``tl`` API (shape mismatch, TCM overflow, bad direction, use after scope...)."""

    def __init__(self, pe: str, message: str, site: str | None = None):
        self.pe = pe
        self.site = site or user_site(2)
        self.reason = message
        super().__init__(f"kernel on {pe}, at {self.site}: {message}")
