"""A 2-D HBM block access on a PE's pseudo-channels, shared by the DMA engine (dma.py) and the HBM port
(hbmport.py): address striping (costs.stripe), one request per channel that holds part of the block, all
in parallel, and the block image gathered from the answers (data mode).  At ``fidelity: pipeline`` in timing
mode the PE's channels are one actor (memory.HbmStack): :func:`stack_access` sends it the block's bytes per
channel in one request and waits for its one answer."""
from __future__ import annotations

from functools import lru_cache

from emulator.actor import Actor
from protocols.ahbm import HbmReq, PcReq

from actors.ahbm.costs import pc_occupancy_ps, stripe

__all__ = ["block_offset", "channel_access", "stack_access", "channel_bytes", "channel_bursts", "check_block"]


def block_offset(addr: int, base: int, rows: int, row_bytes: int, pitch: int) -> int:
    """Position of HBM byte ``addr`` of a 2-D block in its contiguous image."""
    r, col = divmod(addr - base, pitch) if rows > 1 else (0, addr - base)
    return r * row_bytes + col


async def channel_access(actor: Actor, pc_req, pc_resp, client: str, op: str, addr: int, rows: int,
                         row_bytes: int, pitch: int, blob: bytes | None, data_mode: bool, seq: list) -> bytes | None:
    """Run one block access on the pseudo-channels (all in parallel); return the image read (data mode).

    ``pc_resp`` is where this access's answers come from (:class:`Mailbox` or :class:`Direct`).
    """
    prm = actor.prm
    pieces = stripe(addr, rows, row_bytes, pitch, prm.burst, prm.pcs)
    sent = 0
    for pc, plist in enumerate(pieces):
        if not plist:
            continue
        nbytes = sum(length for _, length in plist)
        items = []
        if data_mode:
            if op == "write":
                items = [[a, ln, blob[(o := block_offset(a, addr, rows, row_bytes, pitch)):o + ln]] for a, ln in plist]
            else:
                items = [[a, ln] for a, ln in plist]
        seq[0] += 1
        pc_resp.expect(seq[0])
        await pc_req[pc].send(PcReq(seq[0], op, nbytes, items, client))
        sent += 1
    image = bytearray(rows * row_bytes) if (data_mode and op == "read") else None
    for _ in range(sent):
        r = await pc_resp.recv()
        if image is not None:
            for a, data in r.items:
                o = block_offset(a, addr, rows, row_bytes, pitch)
                image[o:o + len(data)] = data
    return None if image is None else bytes(image)


async def stack_access(actor: Actor, hbm_req, hbm_resp, client: str, op: str, addr: int, rows: int,
                       row_bytes: int, pitch: int, seq: list) -> None:
    """One block access on the PE's HBM stack (memory.HbmStack, timing mode): one
    :class:`~protocols.ahbm.HbmReq` with the bytes the block has on each channel (costs.stripe, the
    figures :func:`channel_access` charges per channel), then its one answer.  ``hbm_resp`` as in
    :func:`channel_access`."""
    nbytes = channel_bytes(actor.prm, addr, rows, row_bytes, pitch)
    seq[0] += 1
    hbm_resp.expect(seq[0])
    await hbm_req.send(HbmReq(seq[0], op, nbytes, client))
    await hbm_resp.recv()


def channel_bytes(prm, addr: int, rows: int, row_bytes: int, pitch: int) -> list:
    """Bytes of a 2-D block on each of the PE's channels (costs.stripe; shared, not to be changed)."""
    span = prm.burst * prm.pcs
    return _channel_bytes(addr % span, rows, row_bytes, pitch % span, prm.burst, prm.pcs)


@lru_cache(maxsize=4096)
def _channel_bytes(addr: int, rows: int, row_bytes: int, pitch: int, burst: int, pcs: int) -> list:
    """Bytes of a block on each channel (costs.stripe), remembered.  A row's pieces depend on its start only
    modulo ``burst x pcs`` (the channel of byte ``a`` is ``(a // burst) % pcs``), and row ``r`` starts at
    ``addr + r x pitch``, so the caller passes both modulo that span; the list is shared, not to be changed."""
    return [sum(length for _, length in plist) for plist in stripe(addr, rows, row_bytes, pitch, burst, pcs)]


def channel_bursts(prm, nbytes: list, ready: int, free_at: list, busy: list, bursts: list, by_pc: list) -> tuple:
    """One access's bursts on the channels (memory.HbmStack's per-channel model, also run by the PE scheduler
    holding the stack at ``fidelity: stream``, pipeline.HeldDma): channel ``pc`` with ``b = nbytes[pc] > 0`` bursts
    ``pc_occupancy_ps(b)`` from ``max(ready, free_at[pc])``; ``free_at``, ``busy``, ``bursts`` and ``by_pc`` (bytes)
    are updated per channel.  Returns ``(end of the last burst or ready, its start, bytes, burst time, bursts)``."""
    done = last = ready
    total = occ_sum = n = 0
    for pc, nb in enumerate(nbytes):
        if not nb:
            continue
        occ = pc_occupancy_ps(nb, prm)
        end = (ready if ready > free_at[pc] else free_at[pc]) + occ
        free_at[pc] = end
        busy[pc] += occ
        bursts[pc] += 1
        by_pc[pc] += nb
        total += nb
        occ_sum += occ
        n += 1
        if end > done:
            done, last = end, end - occ
    return done, last, total, occ_sum, n


def check_block(prm, who: str, addr: int, rows: int, row_bytes: int, pitch: int) -> None:
    """A clear error for a block whose rows overlap or that lies outside the PE's HBM."""
    if row_bytes > pitch and rows > 1:
        raise RuntimeError(f"{who}: rows overlap (row_bytes {row_bytes} > pitch {pitch})")
    if addr < 0 or addr + (rows - 1) * pitch + row_bytes > prm.hbm_capacity:
        raise RuntimeError(f"{who}: block at {addr:#x} outside the PE's HBM ({prm.hbm_capacity} B)")
