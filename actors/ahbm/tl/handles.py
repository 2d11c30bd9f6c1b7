"""Tensor handles: what ``tl`` calls return.

A :class:`TensorHandle` names a tensor that lives in this PE's TCM (``buf``),
in its HBM (``addr``: a ``tl.ref`` or a composite's result) or both, and the
command still producing it (``pending`` on ``engine``).  Nothing waits when a
handle is made: the runtime waits at the first use that needs the data on
another engine (lazy ``tl.load``, non-blocking ``tl.composite``, ``tl.recv_async``).

Python operators ``+ - * /`` (with a handle or a number) issue MATH commands.
A handle whose scratch scope ended (or whose carried variable was rebound, see
scratch.py) is *dead*: any use raises a KernelError saying where it died.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["TensorHandle", "nbytes", "dtype_info"]


#: dtype (as given) -> (numpy ``dtype.str``, item size): a kernel uses a few dtypes on every op
_DTYPES: dict = {}


def dtype_info(dtype) -> tuple[str, int]:
    """``(numpy dtype.str, item size)`` of ``dtype`` as given (remembered per dtype)."""
    try:
        return _DTYPES[dtype]
    except KeyError:
        dt = np.dtype(dtype)
        _DTYPES[dtype] = info = (dt.str, dt.itemsize)
        return info
    except TypeError:               # unhashable: numpy's own error, or its answer
        dt = np.dtype(dtype)
        return dt.str, dt.itemsize


def nbytes(shape, dtype) -> int:
    return math.prod(map(int, shape)) * dtype_info(dtype)[1]


class TensorHandle:
    __slots__ = ("rt", "shape", "dtype", "buf", "addr", "pending", "engine", "arena", "dead", "readers",
                 "check", "desc", "__weakref__")

    def __init__(self, rt, shape, dtype, *, buf=None, addr=None, pending=None, engine=None, arena=None):
        self.rt = rt
        self.shape = tuple(map(int, shape))
        self.dtype = dtype_info(dtype)[0]
        self.buf = buf              # TCM buffer name, or None
        self.addr = addr            # HBM byte address, or None
        self.pending = pending      # command id still producing the data
        self.engine = engine        # engine of that command
        self.arena = arena          # scratch arena owning the TCM buffer
        self.dead = None            # why it may no longer be used
        self.readers = None         # {engine: last command reading it}, waited before its buffer is freed
        self.check = None           # (shape, dtype) to verify when a pending recv completes
        self.desc = False           # a MathOp result not in the TCM yet (fidelity pipeline: Tl._tcm writes it)

    @property
    def nbytes(self) -> int:
        return nbytes(self.shape, self.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        where = self.buf or (f"hbm@{self.addr:#x}" if self.addr is not None else "?")
        return f"<TensorHandle {where} {self.shape} {self.dtype}{' dead' if self.dead else ''}>"

    # -- operators: MATH commands ------------------------------------------------
    def __add__(self, o):
        return self.rt._binary("add", self, o)

    def __radd__(self, o):
        return self.rt._binary("add", o, self)

    def __sub__(self, o):
        return self.rt._binary("sub", self, o)

    def __rsub__(self, o):
        return self.rt._binary("sub", o, self)

    def __mul__(self, o):
        return self.rt._binary("mul", self, o)

    def __rmul__(self, o):
        return self.rt._binary("mul", o, self)

    def __truediv__(self, o):
        return self.rt._binary("div", self, o)

    def __rtruediv__(self, o):
        return self.rt._binary("div", o, self)

    def __neg__(self):
        return self.rt._binary("mul", self, -1.0)

    @property
    def T(self):
        return self.rt.trans(self)

    def __bool__(self):
        raise self.rt.error("a TensorHandle has no truth value (its data lives on the PE; use tl ops)")
