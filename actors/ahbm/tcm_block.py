"""2-D sub-block access to a named TCM buffer, built on the public TcmClient calls (read / write).

The PE scheduler reads the ``[rows, cols]`` operand block of a composite GEMM
step out of a TCM-resident A or B matrix and writes each finished C block into a
TCM-resident result (seed §B.3: composite operands and outputs in the TCM
scratch arena).  The TCM keeps whole named buffers (memory.Tcm), so a block read
is a whole-buffer read sliced here, and a block write is read, patch, write
back.  Every access still goes through the TCM actor, which serves its clients
one request at a time (port contention kept); the TCM answers at once
(memory.Tcm: single-cycle SRAM ports, assumption), so these add no time.

Timing mode moves :class:`~protocols.codec.TensorDesc` only: a block read is a
descriptor of the block, a block write checks the block fits and keeps the
buffer's descriptor.

Merge note: if the TCM protocol grows native sub-block reads/writes, these two
functions are the only callers to switch.
"""
from __future__ import annotations

import numpy as np

from protocols.codec import TensorDesc

__all__ = ["read_block", "write_block", "copy_block"]


def _check(buf: str, shape, r0: int, c0: int, rows: int, cols: int) -> None:
    if len(shape) != 2 or r0 < 0 or c0 < 0 or r0 + rows > shape[0] or c0 + cols > shape[1]:
        raise RuntimeError(f"TCM block [{r0}:{r0 + rows}, {c0}:{c0 + cols}] outside buffer {buf!r} of shape"
                           f" {tuple(shape)}")


async def read_block(tcm, buf: str, r0: int, c0: int, rows: int, cols: int):
    """The ``[rows, cols]`` block of 2-D TCM buffer ``buf`` at ``(r0, c0)``."""
    x = await tcm.read(buf)
    _check(buf, x.shape, r0, c0, rows, cols)
    if isinstance(x, TensorDesc):
        return TensorDesc.of((rows, cols), x.dtype)
    return np.ascontiguousarray(np.asarray(x)[r0:r0 + rows, c0:c0 + cols])


async def write_block(tcm, buf: str, r0: int, c0: int, block) -> None:
    """Write ``block`` into 2-D TCM buffer ``buf`` at ``(r0, c0)`` (cast to the buffer's dtype)."""
    x = await tcm.read(buf)
    rows, cols = block.shape
    _check(buf, x.shape, r0, c0, rows, cols)
    if isinstance(x, TensorDesc):
        await tcm.write(buf, x)
        return
    y = np.array(x)   # the TCM's arrays are shared read-only across links: patch a copy
    y[r0:r0 + rows, c0:c0 + cols] = block
    await tcm.write(buf, y)


async def copy_block(tcm, src: str, r0: int, c0: int, rows: int, cols: int, dst: str) -> None:
    """Copy the ``[rows, cols]`` block of ``src`` at ``(r0, c0)`` into the whole buffer ``dst``."""
    await tcm.write(dst, await read_block(tcm, src, r0, c0, rows, cols))
