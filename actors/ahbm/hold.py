"""A component held by the PE scheduler (``fidelity: pipeline / stream``): the wait for the release.

The scheduler holds the GEMM array (protocols.ahbm.GemmHold) and, at ``stream``, the DMA engine and through it
the HBM stack (DmaHold, HbmHold), and times what it sends them itself (actors/ahbm/pipeline.py).  While held, a
component takes no other command: what reaches it is kept, in arrival order, in its ``_later`` queue (served
after the release, ahead of anything newer) and counted in ``held_back``.
"""
from __future__ import annotations

__all__ = ["wait_release"]


async def wait_release(actor, port, kind: type, hold_id: int):
    """Take messages from ``port`` until the release of hold ``hold_id`` (a ``kind`` with ``release`` set),
    keeping the others in ``actor._later``; return the release.  What ``_later`` holds already arrived after
    the hold, so it stays ahead of these."""
    while True:
        r = await port.recv()
        if type(r) is kind and r.id == hold_id and r.release:
            return r
        actor._later.append(r)
        actor.held_back += 1
