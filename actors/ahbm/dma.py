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

Outstanding commands (``dma.outstanding`` = N, profile).  Commands are taken
in arrival order by one front end that does the TCM read of a store and the
``setup`` span, one command at a time (the descriptor processor, serial).  The
command then enters its *data phase* (the channel accesses, or the NOC round
trip of a remote access, then the TCM write of a load and the completion) and
the front end takes the next command; at most N commands are in their data
phase at once (the front end waits for a slot).  So command k of a stream
starts its setup at ``max(arrival_k, setup end of k-1, data-phase end of
k-N)``.  N = 1 is the serial engine of the seed's single DMA queue: every
closed form of the scheduler (scheduler.py) and the tests holds as before.
Default 1 (assumption: no public figure for the engine's outstanding-request
depth; 1 keeps the scheduler's FIFO-DMA recurrence exact); N > 1 models a DMA
engine with N outstanding transactions (as AXI-style engines have), so a remote
access no longer blocks local ones behind it.  Completions may then return out
of order: each :class:`~protocols.ahbm.Done` carries the command ``id``, and
every client (cpu.py, scheduler.py, tl/kernel_registry.py) already matches completions by
id (a set / dict of finished ids), so no client changes.

Ordering kept with N > 1: a command whose TCM buffer ``buf`` is the target of
an in-flight *load* waits at the front end until that load completes
(read-after-write and write-after-write on a TCM buffer keep issue order; a
store reads its buffer at admission, so a later load into it is safe).  HBM
order is kept by the hardware paths: channel requests leave in admission order
and each channel is FIFO; remote requests to one owner follow one XY path over
FIFO links to a port that serves them in order.  Answers are matched to their
command by request id (pseudo-channel ``PcResp.id``, remote ``MemResp.id``).

Data mode: a load gathers the bytes and writes the TCM buffer as an array of
the command's shape/dtype; a store reads the TCM buffer and scatters its bytes.
Timing mode moves TensorDescs only.

HBM stack (``hbm_stack``, built at ``fidelity: pipeline`` in timing mode, builder.py): the PE's channels
are one actor (memory.HbmStack) with the same per-channel FIFO timing; a block access is one
:class:`~protocols.ahbm.HbmReq` (its bytes per channel) and one answer when its last burst ends, so the
formulas above hold unchanged (hbm_access.stack_access).

Held (``fidelity: stream``, :class:`~protocols.ahbm.DmaHold`): the PE scheduler holds the engine for a run
of HBM-operand composites and times their commands itself with the formulas above (pipeline.HeldDma);
the engine holds its HBM stack meanwhile, queues other clients' commands until the release and records
the run's setup spans, loads and bytes from it.

Scatter-gather (:class:`~protocols.ahbm.DmaGather`): one command between a
contiguous HBM range and several TCM buffers, its parts back to back.  It is
timed as a one-row block of the parts' total size (the formulas above: one
setup, one request per pseudo-channel holding part of the range); a load writes
every part's buffer in one TCM access, a store reads them in one.
"""
from __future__ import annotations

import numpy as np

from collections import deque

from emulator.actor import Actor
from emulator.declare import In, Out
from emulator.waitqueue import WaitQueue
from protocols.ahbm import DmaCmd, DmaGather, DmaHold, Done, HbmHold, HbmReq, HbmResp, MemReq, MemResp, PcReq, PcResp, payload
from protocols.codec import TensorDesc

from actors.ahbm.answers import Answers, Mailbox
from actors.ahbm.hold import wait_release
from actors.ahbm.hbm_access import channel_access, check_block, stack_access
from actors.ahbm.memory import TCM_CLIENT_PORTS, TcmClient
from actors.ahbm.params import declare

__all__ = ["DmaEngine", "REGION_BITS"]


#: loads are counted per 2**REGION_BITS-byte address region (256 MiB)
REGION_BITS = 28


def _block_of(c) -> tuple[list, int, int, int]:
    """``(TCM buffers, rows, row_bytes, pitch)`` of a command: a DmaGather is a one-row block of its parts'
    total size (module docstring)."""
    if type(c) is DmaGather:
        total = sum(TensorDesc.of(shape, dtype).nbytes for _, shape, dtype in c.parts)
        return [buf for buf, _, _ in c.parts], 1, total, total
    return ([c.buf] if c.buf else []), c.rows, c.row_bytes, c.pitch


def _scatter(parts, image) -> list:
    """The TCM writes of a DmaGather load: each part's slice of ``image`` (data mode) or its descriptor."""
    out, at = [], 0
    for buf, shape, dtype in parts:
        desc = TensorDesc.of(shape, dtype)
        if image is None:
            out.append((buf, desc))
            continue
        out.append((buf, np.frombuffer(image[at:at + desc.nbytes], dtype=np.dtype(dtype)).reshape(shape)))
        at += desc.nbytes
    return out


class DmaEngine(Actor):
    """HBM <-> TCM block moves, local or remote (module docstring)."""
    STATE = ("in_flight", "peak_in_flight", "outstanding", "bytes_moved", "loading")   # what a state snapshot shows (emulator/snapshot.py)

    daemon = True
    starts_on = "cmd"    # started by its first command (Actor.starts_on)
    PORTS = (In("cmd", DmaCmd, DmaGather, DmaHold, doc="DMA commands from the CPU and the scheduler (DmaGather:"
                " several TCM buffers, one contiguous HBM range; DmaHold: fidelity stream)", idle=True),
             Out("done_{client}", Done, doc="completion to each client (cpu, sched)"),
             Out("pc{i}", PcReq, doc="requests to pseudo-channel i of its PE"),
             Out("hbm", HbmReq, HbmHold, doc="block accesses to its PE's HBM stack (fidelity pipeline, timing mode;"
                 " HbmHold: fidelity stream)"),
             In("pc_resp", PcResp, HbmResp, HbmHold, doc="the channels' (or the HBM stack's) answers"),
             Out("noc_out", MemReq, doc="remote HBM requests, into the router attach link"),
             In("noc_in", MemResp, doc="remote HBM answers"),
             *TCM_CLIENT_PORTS)
    PARAMS = declare("pcs", "burst", "hbm_capacity", "dma_setup", "dma_outstanding")

    def __init__(self, name: str, *, prm, clients: list[str], coord: tuple = (0, 0, 0), hbm_stack: bool = False):
        """``hbm_stack``: the PE's channels are one :class:`~actors.ahbm.memory.HbmStack` (port ``hbm``)."""
        super().__init__(name)
        self.hbm_stack = hbm_stack
        self.hbm = self.out_port("hbm")
        self.prm = prm
        self.coord = list(coord)
        self.cmd = self.in_port("cmd", idle=True)
        self.done = {c: self.out_port(f"done_{c}") for c in clients}
        self.pc_req = [self.out_port(f"pc{i}") for i in range(prm.pcs)]
        self.pc_resp = self.in_port("pc_resp")
        self.noc_out = self.out_port("noc_out")
        self.noc_in = self.in_port("noc_in")
        self.tcm = TcmClient(self, "dma")
        self.seq = [0]
        self.req_seq = 0
        self.bytes_moved = 0
        self.loads_by_region: dict[str, list[int]] = {}   # "client@region" -> [loads, bytes] (reported)
        self.outstanding = prm.dma_outstanding
        self.in_flight = 0
        self.peak_in_flight = 0
        self.loading: dict[str, int] = {}       # TCM buffer -> in-flight loads into it
        self._freed = WaitQueue()
        self._pc_answers = Answers(self, self.pc_resp)
        self._noc_answers = Answers(self, self.noc_in)
        self._later: deque = deque()    # commands that arrived while the scheduler held the engine (DmaHold)
        self.held_back = 0

    async def run(self) -> None:
        # Idle until the first command: the nursery and the answer readers are made then (most DMA
        # engines of a large machine get none).  The same events as making them at the start: opening
        # a nursery emits nothing, the readers' first step only parks on their ports, and it comes
        # before any answer can arrive (the first request leaves after the setup time).
        c = await self.cmd.recv()
        async with self.subtasks() as n:
            n.start_soon(self._pc_answers.run)
            if self.noc_in.links:
                n.start_soon(self._noc_answers.run)
            await self._front(n, c)

    async def _front(self, nursery, c: DmaCmd) -> None:
        """Take commands in order (``c`` the first): admission (slot, TCM hazards), store's TCM read, setup;
        then the data phase."""
        data_mode = self.system.mode == "data"
        prm = self.prm
        while True:
            if c is None:
                c = self._later.popleft() if self._later else await self.cmd.recv()
            if type(c) is DmaHold:
                await self._held(c)
                c = None
                continue
            if c.op not in ("load", "store"):
                raise RuntimeError(f"DMA {c.id}: unknown op {c.op!r}")
            bufs, rows, row_bytes, pitch = block = _block_of(c)
            total = rows * row_bytes
            check_block(prm, f"DMA {c.id}", c.addr, rows, row_bytes, pitch)
            while self.in_flight >= self.outstanding or any(b in self.loading for b in bufs):
                await self._freed.park()
            start = self.now
            src = await self.tcm.read_all(bufs) if c.op == "store" else None
            blob = None
            if data_mode and src is not None:
                blob = b"".join(np.ascontiguousarray(x).tobytes() for x in src)
                if len(blob) != total:
                    raise RuntimeError(f"DMA store {c.id}: TCM buffer(s) {', '.join(map(repr, bufs))} hold"
                                       f" {len(blob)} B, block is {total} B")
            await self.busy(prm.dma_setup, f"setup {c.op}")
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            if c.op == "load":
                for b in bufs:
                    self.loading[b] = self.loading.get(b, 0) + 1
                self._count_load(c, total)
            nursery.start_soon(self._data, c, block, start, blob, data_mode)
            c = None

    def _count_load(self, c: DmaCmd, total: int) -> None:
        """Loads per client and 256 MiB address region (``addr >> 28``), reported as ``loads_by_region``
        so a workload can count e.g. its K/V reads by where it placed K and V (measured, not derived)."""
        self._count(c.client, c.addr, total)

    def _count(self, client: str, addr: int, total: int) -> None:
        if not self.loads_by_region:
            self.report("loads_by_region", self.loads_by_region)
        n = self.loads_by_region.setdefault(f"{client}@{addr >> REGION_BITS}", [0, 0])
        n[0] += 1
        n[1] += total

    async def _held(self, h: DmaHold) -> None:
        """``fidelity: stream`` (protocols.ahbm.DmaHold, pipeline.HeldDma): the scheduler holds the engine.  Once
        the commands before the hold have finished their data phases, the engine holds its HBM stack too
        (HbmHold) and answers with when each channel is free; commands that arrive until the release wait
        (``_later``: served after it, the coarse part of fidelity stream); the release brings the run's setup
        spans, loads and bytes, recorded as the front end would have, and its channel figures for the stack."""
        if self.faults:    # the scheduler times the held commands from the formulas: a fault could not act on them
            raise RuntimeError(f"{self.name}: a fault plan targets this DMA engine; fidelity stream holds it for"
                               " HBM-operand composites (pipeline.HeldDma): run it at fidelity pipeline or block")
        if not self.hbm_stack:
            raise RuntimeError(f"{self.name}: DmaHold needs the PE's HBM stack (fidelity stream, timing mode)")
        while self.in_flight:          # the commands before the hold finish first
            await self._freed.park()
        self.seq[0] += 1
        rid = self.seq[0]
        box = Mailbox(self._pc_answers)
        box.expect(rid)
        await self.hbm.send(HbmHold(rid, False, [], [], [], [], [], []))
        free = (await box.recv()).free_at
        await self.done[h.client].send(Done(h.id, "dma", self.now, self.now, {"pc_free": free}))
        r = await wait_release(self, self.cmd, DmaHold, h.id)
        self.record_spans(r.spans)
        for addr, total in r.loads:
            self._count(h.client, addr, total)
        self.bytes_moved += r.moved
        await self.hbm.send(HbmHold(rid, True, *r.stack))

    async def _data(self, c, block: tuple, start: int, blob, data_mode: bool) -> None:
        """The data phase of one command (``block`` = :func:`_block_of`): channel accesses or the remote round
        trip, TCM write, completion."""
        op = "write" if c.op == "store" else "read"
        remote = bool(c.target) and list(c.target) != self.coord
        bufs, rows, row_bytes, pitch = block
        total = rows * row_bytes
        if remote:
            image = await self._remote(c, op, blob, total, data_mode, rows, row_bytes, pitch)
        elif self.hbm_stack:
            image = await stack_access(self, self.hbm, Mailbox(self._pc_answers), "dma", op, c.addr, rows, row_bytes,
                                       pitch, self.seq)
        else:
            image = await channel_access(self, self.pc_req, Mailbox(self._pc_answers), "dma", op, c.addr, rows,
                                         row_bytes, pitch, blob, data_mode, self.seq)
        if c.op == "load":
            if type(c) is DmaGather:
                await self.tcm.access(writes=_scatter(c.parts, image if data_mode else None))
            elif data_mode:
                arr = np.frombuffer(image, dtype=np.dtype(c.dtype)).reshape(c.shape)
                await self.tcm.write(c.buf, arr)
            elif c.buf:     # (no buffer: a block no engine reads, the held array's, scheduler.PeScheduler._into)
                await self.tcm.write(c.buf, TensorDesc.of(c.shape, c.dtype))
        self.bytes_moved += total
        await self.done[c.client].send(Done(c.id, "dma", start, self.now, {"bytes": total, "remote": remote}))
        self.in_flight -= 1
        if c.op == "load":
            for b in bufs:
                self.loading[b] -= 1
                if not self.loading[b]:
                    del self.loading[b]
        self._freed.unpark_all()

    async def _remote(self, c, op: str, blob, total: int, data_mode: bool, rows: int, row_bytes: int, pitch: int):
        data = None
        if op == "write":
            data = payload(np.frombuffer(blob, np.uint8) if data_mode else TensorDesc.of((total,), "|u1"))
        if not self.noc_out.link or not self.noc_in.links:
            raise RuntimeError(f"{self.name}: DMA {c.id} to PE {list(c.target)} needs the NOC, which is not wired")
        self.req_seq += 1
        rid = self.req_seq
        box = Mailbox(self._noc_answers)
        box.expect(rid)
        await self.noc_out.send(MemReq(rid, op, self.coord, list(c.target), 0, c.addr, rows, row_bytes, pitch, data))
        resp = await box.recv()
        if op == "read" and data_mode:
            return np.asarray(resp.data.t).tobytes()
        return None

    def describe(self) -> dict:
        return {**super().describe(), "setup_ps": self.prm.dma_setup, "pcs": self.prm.pcs,
                "outstanding": self.outstanding}
