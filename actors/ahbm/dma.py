"""The PE DMA engine: HBM <-> TCM block moves, own HBM or another PE's over the NOC.

Own HBM (costs.dma_ps): ``setup + max over used PCs (access_latency +
bytes_pc / (pc_bandwidth x efficiency))``.  The engine is busy for ``setup``
(its own span), then sends one request per pseudo-channel that holds part of
the block (address striping, costs.stripe) and waits for all of them; the
channels are separate actors and work in parallel, each FIFO.

Remote HBM (``target`` = another PE; kernbench2 ADR-0019 D4, ref §1.2: a PE's
HBM is reachable only through that PE's router): after ``setup`` the engine
sends one :class:`~protocols.ahbm.MemReq` over the NOC to the owner's HBM port
(hbmport.py), which runs the same per-channel access and answers with one
:class:`~protocols.ahbm.MemResp`.  At zero load:
``setup + Z(S_req, h) + max_pc(pc_ps) + Z(S_resp, h)`` with ``Z`` the NOC
zero-load time of noc.py (the data rides in the request for a store, in the
response for a load).

Commands are served one at a time in arrival order (one DMA queue per PE;
assumption).  Data mode: a load gathers the bytes and writes the TCM buffer as
an array of the command's shape/dtype; a store reads the TCM buffer and
scatters its bytes.  Timing mode moves TensorDescs only.
"""
from __future__ import annotations

import numpy as np

from emulator.actor import Actor
from protocols.ahbm import DmaCmd, Done, MemReq, PcReq, payload
from protocols.codec import TensorDesc

from actors.ahbm.costs import stripe
from actors.ahbm.memory import TcmClient


def block_offset(addr: int, base: int, rows: int, row_bytes: int, pitch: int) -> int:
    """Position of HBM byte ``addr`` of a 2-D block in its contiguous image."""
    r, col = divmod(addr - base, pitch) if rows > 1 else (0, addr - base)
    return r * row_bytes + col


async def channel_access(actor: Actor, pc_req, pc_resp, client: str, op: str, addr: int, rows: int,
                         row_bytes: int, pitch: int, blob: bytes | None, data_mode: bool, seq: list) -> bytes | None:
    """Run one block access on the pseudo-channels (all in parallel); return the image read (data mode)."""
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


def check_block(prm, who: str, addr: int, rows: int, row_bytes: int, pitch: int) -> None:
    if row_bytes > pitch and rows > 1:
        raise RuntimeError(f"{who}: rows overlap (row_bytes {row_bytes} > pitch {pitch})")
    if addr < 0 or addr + (rows - 1) * pitch + row_bytes > prm.hbm_capacity:
        raise RuntimeError(f"{who}: block at {addr:#x} outside the PE's HBM ({prm.hbm_capacity} B)")


class DmaEngine(Actor):
    daemon = True

    def __init__(self, name: str, *, prm, clients: list[str], coord: tuple = (0, 0, 0)):
        super().__init__(name)
        self.prm = prm
        self.coord = list(coord)
        self.cmd = self.in_port("cmd")
        self.done = {c: self.out_port(f"done_{c}") for c in clients}
        self.pc_req = [self.out_port(f"pc{i}") for i in range(prm.pcs)]
        self.pc_resp = self.in_port("pc_resp")
        self.noc_out = self.out_port("noc_out")
        self.noc_in = self.in_port("noc_in")
        self.tcm = TcmClient(self, "dma")
        self.seq = [0]
        self.req_seq = 0
        self.bytes_moved = 0

    async def run(self) -> None:
        data_mode = self.system.mode == "data"
        prm = self.prm
        while True:
            c: DmaCmd = await self.cmd.recv()
            start = self.now
            if c.op not in ("load", "store"):
                raise RuntimeError(f"DMA {c.id}: unknown op {c.op!r}")
            check_block(prm, f"DMA {c.id}", c.addr, c.rows, c.row_bytes, c.pitch)
            total = c.rows * c.row_bytes
            src = await self.tcm.read(c.buf) if c.op == "store" else None
            blob = None
            if data_mode and src is not None:
                blob = np.ascontiguousarray(src).tobytes()
                if len(blob) != total:
                    raise RuntimeError(f"DMA store {c.id}: TCM buffer {c.buf!r} has {len(blob)} B, block is {total} B")
            await self.busy(prm.dma_setup, f"setup {c.op}")
            op = "write" if c.op == "store" else "read"
            remote = bool(c.target) and list(c.target) != self.coord
            if remote:
                image = await self._remote(c, op, blob, total, data_mode)
            else:
                image = await channel_access(self, self.pc_req, self.pc_resp, "dma", op, c.addr, c.rows, c.row_bytes,
                                             c.pitch, blob, data_mode, self.seq)
            if c.op == "load":
                if data_mode:
                    arr = np.frombuffer(image, dtype=np.dtype(c.dtype)).reshape(c.shape)
                    await self.tcm.write(c.buf, arr)
                else:
                    await self.tcm.write(c.buf, TensorDesc.of(c.shape, c.dtype))
            self.bytes_moved += total
            await self.done[c.client].send(Done(c.id, "dma", start, self.now, {"bytes": total, "remote": remote}))

    async def _remote(self, c: DmaCmd, op: str, blob, total: int, data_mode: bool):
        data = None
        if op == "write":
            data = payload(np.frombuffer(blob, np.uint8) if data_mode else TensorDesc.of((total,), "|u1"))
        self.req_seq += 1
        await self.noc_out.send(MemReq(self.req_seq, op, self.coord, list(c.target), 0, c.addr, c.rows, c.row_bytes,
                                       c.pitch, data))
        resp = await self.noc_in.recv()
        if resp.id != self.req_seq:
            raise RuntimeError(f"{self.name}: remote answer {resp.id}, expected {self.req_seq}")
        if op == "read" and data_mode:
            return np.asarray(resp.data.t).tobytes()
        return None

    def describe(self) -> dict:
        return {**super().describe(), "setup_ps": self.prm.dma_setup, "pcs": self.prm.pcs}
