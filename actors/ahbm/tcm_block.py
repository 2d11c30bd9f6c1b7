"""2-D sub-block moves inside the TCM, for the PE scheduler's composites (TcmReq ``copies``).

The PE scheduler copies the ``[rows, cols]`` operand block of a composite GEMM
step out of a TCM-resident A or B matrix (or out of a B panel it loaded), and
places each finished C block into a TCM-resident result (seed §B.3: composite
operands and outputs in the TCM scratch arena).  The TCM keeps whole named
buffers (memory.Tcm); a block move is one *posted* access the TCM carries out
itself (memory.Tcm._copy): the request goes through the TCM's one request queue
like every access (port contention kept) and the TCM takes it at once
(single-cycle SRAM ports, assumption), so it adds no time.  (Until issue #13's
third step a block copy was a read answered with the whole buffer plus a write,
and a result block a read of the block, a read of the result and a write: three
and five messages for one move inside one memory.)

Later accesses see the moved block: the TCM serves its queue in order, and any
engine that reads the block does so after a message that left the scheduler
after the copy (a GEMM command, a Done).
"""
from __future__ import annotations

__all__ = ["copy_block", "place_block"]


async def copy_block(tcm, src: str, r0: int, c0: int, rows: int, cols: int, dst: str) -> None:
    """The ``[rows, cols]`` block of ``src`` at ``(r0, c0)`` becomes the whole buffer ``dst``."""
    await tcm.access(copies=((src, r0, c0, rows, cols, dst, -1, -1),))


async def place_block(tcm, src: str, rows: int, cols: int, dst: str, r0: int, c0: int) -> None:
    """The whole ``[rows, cols]`` buffer ``src`` goes into ``dst`` at ``(r0, c0)`` (cast to ``dst``'s dtype)."""
    await tcm.access(copies=((src, 0, 0, rows, cols, dst, r0, c0),))
