"""Memories of a PE: its HBM pseudo-channel controllers and its TCM (scratch).

:class:`HbmChannel` is one pseudo-channel controller (``.../pe3/hbm/pc5``):
it serves requests FIFO and pipelines them (costs.pc_occupancy_ps): a request
arriving at ``t`` has its data burst on the channel's bus at
``max(t + access_latency, end of the previous burst)`` for ``bytes / (32 GB/s x
0.8)``, and is answered when its burst ends; the access latency (row activation
+ CAS, closed page) of one request overlaps the bursts of the requests ahead of
it.  A lone request therefore takes ``pc_ps(bytes)`` = access latency + transfer
as before (costs.pc_ps, ref §2.1-2.2), and a queue of requests drains at the
channel's bandwidth.  The PE's address space is striped over its channels in
``burst``-byte units (costs.stripe).  In data mode it stores bytes per burst; in
timing mode it stores nothing.

:class:`HbmStack` (``.../pe3/hbm/stack``) is all pseudo-channels of one PE in one
actor, built instead of the channels at ``fidelity: pipeline`` in timing mode
(builder.py): the same per-channel FIFO pipeline, kept as each channel's end of
its last burst, but one :class:`~protocols.ahbm.HbmReq` per block access (the
bytes of every channel holding part of the block) and one
:class:`~protocols.ahbm.HbmResp` when the last of its bursts ends, instead of
one PcReq and one PcResp per channel (docs/gqa.md "Fidelity").

:class:`Tcm` is the 1 MiB scratch (seed §A "1 MiB scratch", DESIGN.md §4): named
buffers, numpy arrays in data mode and TensorDescs in timing mode.  It enforces
its capacity (a write that does not fit is a clear error) and answers at once
(assumption: single-cycle SRAM ports; its access time is part of the engines'
pipeline figures).

What a TCM message models: one *access* of one client through its port, the
unit the hardware arbitrates.  Contention is the order of the single request
queue (clients are served FIFO by delivery, every access at once).  An access
may write, copy, free and read several buffers (a MATH op reads all its operands
in one access; a scope's end frees all its buffers in one; the PE scheduler's
composite operand and result blocks move inside the TCM in one posted access
each, TcmReq ``copies``): the TCM keeps no port
time, so splitting an access into one message per buffer modelled nothing.
Only an access that reads is answered; a write or a free is posted - the answer
carried no data and no time, and the client's link (capacity 1, FIFO) already
orders its later accesses after it.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from emulator.actor import Actor
from emulator.declare import In, Out, Param
from emulator.trace import BUSY
from emulator.waitqueue import WaitQueue
from protocols.ahbm import HbmHold, HbmReq, HbmResp, PcReq, PcResp, TcmReq, TcmResp
from protocols.codec import TensorDesc

from actors.ahbm.costs import pc_occupancy_ps
from actors.ahbm.hbm_access import channel_bursts
from actors.ahbm.hold import wait_release
from actors.ahbm.params import declare

__all__ = ["HbmChannel", "HbmStack", "Tcm", "TcmClient", "TCM_CLIENT_PORTS", "nbytes_of"]


class HbmChannel(Actor):
    """One HBM pseudo-channel controller of a PE (pipelined, see the module docstring)."""
    STATE = ("bytes_by_op",)   # what a state snapshot shows (emulator/snapshot.py)

    daemon = True
    starts_on = "req"    # started by its first request (Actor.starts_on)
    PORTS = (In("req", PcReq, doc="channel requests, FIFO (the PE's DMA and HBM port)", idle=True),
             Out("resp_{client}", PcResp, doc="answers to each requester (dma, port)"))
    PARAMS = declare("burst", "pc_bw_eff", "hbm_latency")

    def __init__(self, name: str, *, index: int, prm):
        super().__init__(name)
        self.req = self.in_port("req", idle=True)
        self.resp = {c: self.out_port(f"resp_{c}") for c in ("dma", "port")}
        self.index = index
        self.prm = prm
        self.store: dict[int, bytearray] = {}
        self._queue: deque = deque()      # (earliest burst start, request), arrival order
        self._arrived = WaitQueue()
        self.bytes_by_op = {"read": 0, "write": 0}   # bytes served, the energy model's HBM count (actors/ahbm/energy.py)

    def preload(self, addr: int, data: bytes) -> None:
        """Build-time initial contents of one piece (the host's placement, before the run)."""
        self._write(addr, data)

    def _write(self, addr: int, data) -> None:
        burst = self.prm.burst
        b, off = divmod(addr, burst)
        blk = self.store.get(b)
        if blk is None:
            blk = self.store[b] = bytearray(burst)
        blk[off:off + len(data)] = data

    def _read(self, addr: int, length: int) -> bytes:
        burst = self.prm.burst
        b, off = divmod(addr, burst)
        blk = self.store.get(b)
        return bytes(length) if blk is None else bytes(blk[off:off + length])

    async def run(self) -> None:
        """Take requests as they arrive (the command path); the bus task serves their bursts in order.

        The bus task and its nursery start with the first request: most channels of a machine serve
        nothing in a run.  The events are the same as starting the bus at once: its first step would
        only park on ``_arrived``, and the first request's unpark would have made it runnable exactly
        where it is spawned now (``WaitQueue.start_at_first_unpark`` gives the argument).
        """
        req: PcReq = await self.req.recv()
        async with self.subtasks() as n:
            self._arrived.start_at_first_unpark(n, self._bus)
            while True:
                self._queue.append((self.now + self.prm.hbm_latency, req))
                self._arrived.unpark()
                req = await self.req.recv()

    async def _bus(self) -> None:
        """The channel's data bus: one burst at a time, ``pc_occupancy_ps`` each, not before its access latency."""
        data_mode = self.system.mode == "data"
        while True:
            while not self._queue:
                await self._arrived.park()
            ready, req = self._queue.popleft()
            await self.busy(pc_occupancy_ps(req.nbytes, self.prm), f"{req.op} {req.nbytes}B", start=ready)
            self.bytes_by_op[req.op] += req.nbytes
            items = []
            if data_mode:
                if req.op == "write":
                    for addr, _length, data in req.items:
                        self._write(addr, data)
                else:
                    items = [[addr, self._read(addr, length)] for addr, length in req.items]
            await self.resp[req.client].send(PcResp(req.id, self.index, items))

    def describe(self) -> dict:
        return {**super().describe(), "pc": self.index, "bandwidth_eff_Bps": self.prm.pc_bw_eff,
                "latency_ps": self.prm.hbm_latency}


class HbmStack(Actor):
    """All pseudo-channels of one PE's HBM in one actor (``fidelity: pipeline``, timing mode only).

    The per-channel model of :class:`HbmChannel`, exactly: channel ``pc`` serves its pieces FIFO in
    arrival order, a piece of ``b`` bytes arriving at ``t`` has its burst at
    ``start = max(t + access_latency, end_pc)`` for ``pc_occupancy_ps(b)`` (costs.py) and
    ``end_pc = start + pc_occupancy_ps(b)`` afterwards.  One :class:`~protocols.ahbm.HbmReq` carries a
    block access's bytes on every channel (``nbytes[pc]``, costs.stripe of the block, the same figures
    as its PcReqs), all arriving at the same ``t`` (as the access's PcReqs did: they leave in one step
    of the client); its one :class:`~protocols.ahbm.HbmResp` leaves at ``max over its channels of
    end_pc``, when the access's last PcResp would have.  Requests are served in the order they reach
    the stack; two clients' accesses at the same ps take every channel in that one order (with the
    per-channel actors each channel took its PcReqs in delivery order, the same order, since a
    client's PcReqs of one access leave in one step).

    Kept per channel (``report``): ``pc_busy_ps`` (burst time), ``pc_bursts`` and ``pc_bytes``
    (read / write, the energy model's per-channel count, energy.py).  The actor's own ``busy_ps`` is
    the channels' mean burst time (``sum // pcs``, so actors.csv's utilisation is the mean channel
    utilisation) and its ``busy_spans`` the bursts.  The trace shows one span per access, its last
    burst (so a critical path through the HBM stays the HBM's), not every channel's bursts; there
    are no fault hooks on the bursts.  Data mode is not modelled here (the builder keeps the channels).
    """
    STATE = ("free_at", "bytes_by_op")   # what a state snapshot shows (emulator/snapshot.py)

    daemon = True
    starts_on = "req"    # started by its first request (Actor.starts_on)
    PORTS = (In("req", HbmReq, HbmHold, idle=True,
                doc="block accesses, FIFO (the PE's DMA and HBM port), one per access (HbmHold: fidelity stream)"),
             Out("resp_dma", HbmResp, HbmHold, doc="one answer per access to the DMA engine (HbmHold: the hold's)"),
             Out("resp_port", HbmResp, doc="one answer per access to the HBM port"))
    PARAMS = declare("pcs", "pc_bw_eff", "hbm_latency")

    CLIENTS = ("dma", "port")

    def __init__(self, name: str, *, prm):
        super().__init__(name)
        self.req = self.in_port("req", idle=True)
        self.resp = {c: self.out_port(f"resp_{c}") for c in self.CLIENTS}
        self.prm = prm
        n = prm.pcs
        self.free_at = [0] * n             # end of each channel's last burst (ps)
        self.pc_busy_ps = [0] * n
        self._busy_total = 0               # sum of pc_busy_ps
        self.pc_bursts = [0] * n
        self.pc_bytes = {"read": [0] * n, "write": [0] * n}
        self.bytes_by_op = {"read": 0, "write": 0}   # the stack's total (the channels' sum)
        self._pending = {c: deque() for c in self.CLIENTS}   # (answer time, span start, label, HbmResp)
        self._lots = {c: WaitQueue() for c in self.CLIENTS}
        self._later: deque = deque()       # requests that arrived while the DMA engine held the stack (HbmHold)
        self.held_back = 0

    def serve(self, req: HbmReq, t: int) -> tuple[int, int]:
        """Take ``req`` arriving at ``t`` onto its channels (class docstring); return its answer time and the
        start of the burst that ends last (the access's trace span)."""
        done, last, total, occ, n = channel_bursts(self.prm, req.nbytes, t + self.prm.hbm_latency, self.free_at,
                                                   self.pc_busy_ps, self.pc_bursts, self.pc_bytes[req.op])
        self._busy_total += occ
        self.busy_spans += n
        self.bytes_by_op[req.op] += total
        self.busy_ps = self._busy_total // self.prm.pcs
        return done, last

    async def run(self) -> None:
        """Take requests as they arrive; each client's answers leave at their times (:meth:`_answers`).

        A client's answers are sent by one task in time order; an answer due before one already
        pending for that client (possible only with ``dma.outstanding`` > 1) gets a task of its own."""
        req: HbmReq = await self.req.recv()
        self.report("pc_busy_ps", self.pc_busy_ps)
        self.report("pc_bursts", self.pc_bursts)
        self.report("pc_bytes", self.pc_bytes)
        async with self.subtasks() as n:
            for c in self.CLIENTS:
                self._lots[c].start_at_first_unpark(n, self._answers, c)
            while True:
                if type(req) is HbmHold:
                    req = await self._held(req)
                    continue
                at, start = self.serve(req, self.now)
                q = self._pending[req.client]
                entry = (at, start, f"{req.op} {sum(req.nbytes)}B", HbmResp(req.id))
                if q and q[-1][0] > at:
                    n.start_soon(self._answer_at, *entry, req.client)
                else:
                    q.append(entry)
                    self._lots[req.client].unpark()
                req = self._later.popleft() if self._later else await self.req.recv()

    async def _held(self, h: HbmHold):
        """``fidelity: stream`` (protocols.ahbm.DmaHold): the DMA engine holds the stack for its scheduler.  The
        answer gives each channel's end of its last burst; requests that arrive until the release wait (served
        after it, at the release time: the coarse part of fidelity stream); the release brings the run's
        channel figures and spans, recorded as :meth:`serve` and :meth:`_span` would have.  Returns the next
        request to serve (a deferred one, or the next to arrive)."""
        await self.resp["dma"].send(HbmHold(h.id, False, [], [], [], [], list(self.free_at), []))
        r = await wait_release(self, self.req, HbmHold, h.id)
        n = self.prm.pcs
        for pc in range(n):
            self.pc_busy_ps[pc] += r.pc_busy[pc]
            self._busy_total += r.pc_busy[pc]
            self.pc_bursts[pc] += r.pc_bursts[pc]
            self.busy_spans += r.pc_bursts[pc]
            self.pc_bytes["read"][pc] += r.pc_read[pc]
            self.pc_bytes["write"][pc] += r.pc_write[pc]
            if r.free_at[pc] > self.free_at[pc]:
                self.free_at[pc] = r.free_at[pc]
        self.bytes_by_op["read"] += sum(r.pc_read)
        self.bytes_by_op["write"] += sum(r.pc_write)
        self.busy_ps = self._busy_total // n
        for start, end, label in r.spans:
            self._span(start, end, label)
        return self._later.popleft() if self._later else await self.req.recv()

    def _span(self, start: int, end: int, label: str) -> None:
        """The access's trace span: the burst that ends it, ``[start, end)`` (as the channel that served it
        would have shown it; the critical path then runs through the HBM, not through a wait).  It adds
        nothing to ``busy_ps`` / ``busy_spans`` (the channels' figures, :meth:`serve`)."""
        self._emit((BUSY, start, self.id, end, label))

    async def _answers(self, client: str) -> None:
        q, lot, out = self._pending[client], self._lots[client], self.resp[client]
        while True:
            while not q:
                await lot.park()
            at, start, label, msg = q[0]
            self._span(start, at, label)
            if at > self.now:
                await self.sleep_until(at)
            q.popleft()
            await out.send(msg)

    async def _answer_at(self, at: int, start: int, label: str, msg: HbmResp, client: str) -> None:
        self._span(start, at, label)
        await self.sleep_until(at)
        await self.resp[client].send(msg)

    def describe(self) -> dict:
        return {**super().describe(), "pcs": self.prm.pcs, "bandwidth_eff_Bps": self.prm.pc_bw_eff,
                "latency_ps": self.prm.hbm_latency}


def _check_block(buf: str, shape, r0: int, c0: int, rows: int, cols: int) -> None:
    if len(shape) != 2 or r0 < 0 or c0 < 0 or r0 + rows > shape[0] or c0 + cols > shape[1]:
        raise RuntimeError(f"TCM block [{r0}:{r0 + rows}, {c0}:{c0 + cols}] outside buffer {buf!r} of shape"
                           f" {tuple(shape)}")


def nbytes_of(x) -> int:
    t = type(x)
    return x.nbytes if t is TensorDesc or t is np.ndarray or isinstance(x, TensorDesc) else int(np.asarray(x).nbytes)


class Tcm(Actor):
    """The PE's scratch memory: named buffers, capacity-checked."""
    STATE = ("used", "peak", "capacity")   # what a state snapshot shows (emulator/snapshot.py), at rest too
    STATE_AT_REST = True

    daemon = True
    starts_on = "req"    # started by its first access (Actor.starts_on)
    PORTS = (In("req", TcmReq, idle=True,
                doc="one access of one client: its writes, copies, frees, then reads (answered only if it reads)"),
             Out("to_{client}", TcmResp, doc="the answer to each client (cpu, dma, gemm, math, ipcq)"))
    PARAMS = (Param("capacity", "tcm.size", "B", "TCM (scratch) capacity", lambda prm: prm.tcm_bytes),)

    def __init__(self, name: str, *, clients: list[str], capacity: int):
        super().__init__(name)
        self.req = self.in_port("req", idle=True)
        self.out = {c: self.out_port(f"to_{c}") for c in clients}
        self.capacity = capacity
        self.bufs: dict[str, object] = {}
        self.used = 0
        self.peak = 0

    def state(self) -> dict:
        """``STATE`` and the bytes each live buffer holds, largest first (a snapshot's TCM occupancy); nothing
        for a TCM never used."""
        if not self.peak:
            return {}
        by_buf = sorted(((nbytes_of(v), k) for k, v in self.bufs.items()), reverse=True)
        return {**super().state(), "buffers": len(by_buf), "bytes_by_buffer": {k: n for n, k in by_buf[:16]}}

    def preload(self, buf: str, data) -> None:
        """Build-time initial contents (the host's placement before the run)."""
        self.bufs[buf] = data
        self.used += nbytes_of(data)
        if self.used > self.capacity:
            raise ValueError(f"{self.name}: preloading {buf!r} exceeds the TCM capacity {self.capacity} B")
        self.peak = max(self.peak, self.used)

    def _write(self, buf: str, data, client: str) -> None:
        old = self.bufs.get(buf)
        need = self.used - (nbytes_of(old) if old is not None else 0) + nbytes_of(data)
        if need > self.capacity:
            raise RuntimeError(f"TCM overflow: writing {buf!r} ({nbytes_of(data)} B) for {client} needs {need} B,"
                               f" capacity {self.capacity} B; buffers: "
                               + ", ".join(f"{k}={nbytes_of(v)}" for k, v in self.bufs.items()))
        self.bufs[buf] = data
        self.used = need
        if need > self.peak:
            self.peak = need

    def _read(self, buf: str, client: str):
        try:
            return self.bufs[buf]
        except KeyError:
            raise RuntimeError(f"TCM read of unknown buffer {buf!r} by {client}; "
                               f"present: {', '.join(sorted(self.bufs)) or '(none)'}") from None

    def _copy(self, src: str, sr: int, sc: int, rows: int, cols: int, dst: str, dr: int, dc: int, client: str) -> None:
        """A block move inside the TCM (TcmReq ``copies``): ``src[sr:sr+rows, sc:sc+cols]`` into ``dst`` at
        ``(dr, dc)``, or as the new buffer ``dst`` when ``dr < 0``.  Timing mode moves descriptors: a new
        buffer is the block's descriptor, a patched one keeps its own."""
        x = self._read(src, client)
        _check_block(src, x.shape, sr, sc, rows, cols)
        if dr < 0:
            block = (TensorDesc.of((rows, cols), x.dtype) if type(x) is TensorDesc
                     else np.ascontiguousarray(np.asarray(x)[sr:sr + rows, sc:sc + cols]))
            self._write(dst, block, client)
            return
        y = self._read(dst, client)
        _check_block(dst, y.shape, dr, dc, rows, cols)
        if type(y) is not TensorDesc:
            y = np.array(y)   # the TCM's arrays are shared read-only across links: patch a copy
            y[dr:dr + rows, dc:dc + cols] = np.asarray(x)[sr:sr + rows, sc:sc + cols]
        self._write(dst, y, client)

    async def run(self) -> None:
        bufs = self.bufs
        while True:
            r: TcmReq = await self.req.recv()
            for buf, data in r.writes:
                self._write(buf, data, r.client)
            for copy in r.copies:
                self._copy(*copy, r.client)
            for buf in r.frees:
                old = bufs.pop(buf, None)
                if old is not None:
                    self.used -= nbytes_of(old)
            if r.reads:
                try:
                    data = [bufs[b] for b in r.reads]
                except KeyError:    # an unknown buffer: the error that names it
                    data = [self._read(b, r.client) for b in r.reads]
                await self.out[r.client].send(TcmResp(r.id, data))

    def describe(self) -> dict:
        return {**super().describe(), "capacity_B": self.capacity}


#: the two ports a :class:`TcmClient` adds to its actor (part of every TCM client's ``PORTS``)
TCM_CLIENT_PORTS = (Out("tcm_req", TcmReq, doc="requests to the PE's TCM"),
                    In("tcm_resp", TcmResp, doc="the TCM's answers"))


class TcmClient:
    """Helper an engine uses to talk to its TCM over its two ports (zero-time links).

    :meth:`access` is one TCM access (module docstring): posted when it only
    writes or frees, else it waits for the answer with the data read.  One
    answered access at a time: when several tasks of one actor use it (the DMA
    engine's in-flight commands, dma.py) a reader waits for the previous
    answer first (FIFO wake-up, no time; an uncontended call does not yield),
    so answers always match their request.  A posted access needs no turn: the
    request link keeps the order of everything sent on it.
    """

    def __init__(self, actor: Actor, client: str):
        self.actor = actor
        self.client = client
        self.req = actor.out_port("tcm_req")
        self.resp = actor.in_port("tcm_resp")
        self.seq = 0
        self._busy = False
        self._turn = WaitQueue()

    async def access(self, writes=(), reads=(), frees=(), copies=()) -> list | None:
        """One access: ``writes`` (``[(buf, data), ...]``), then ``copies`` (TcmReq's block moves), then
        ``frees``, then ``reads``; the data read (a list in ``reads`` order) or None for a posted access."""
        self.seq += 1
        req = TcmReq(self.seq, self.client, [[b, d] for b, d in writes] if writes else [],
                     [list(c) for c in copies] if copies else [], list(frees), list(reads))
        if not reads:
            await self.req.send(req)
            return None
        while self._busy:
            await self._turn.park()
        self._busy = True
        try:
            await self.req.send(req)
            r = await self.resp.recv()
            if r.id != req.id:
                raise RuntimeError(f"{self.actor.name}: TCM answered request {r.id}, expected {req.id}")
            return r.data
        finally:
            self._busy = False
            if self._turn:          # someone waits for its turn (an uncontended call wakes nobody)
                self._turn.unpark()

    async def read(self, buf: str):
        return (await self.access(reads=(buf,)))[0]

    async def read_all(self, bufs) -> list:
        """Several buffers in one access (e.g. all operands of one engine command)."""
        return await self.access(reads=bufs)

    async def write(self, buf: str, data) -> None:
        await self.access(writes=((buf, data),))

    async def free(self, buf: str) -> None:
        await self.access(frees=(buf,))

    async def free_all(self, bufs) -> None:
        """Free several buffers in one access (a scope's end)."""
        if bufs:
            await self.access(frees=bufs)
