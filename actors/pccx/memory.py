"""Memories and movers: host DDR4, L2, HP weight ports, ACP, memory dispatcher.

Service times (every figure is a profile parameter; sources in the profile YAML):

* **HostDDR** serves reads and writes from all requesters (HP0-3, ACP) in arrival
  order, busy ``ceil(bytes * 1e12 / ddr.bandwidth)`` ps each; its replies fly
  ``ddr.latency`` on the reply links, so a requester with reads outstanding hides
  the latency (reference §3 "host DDR4 19.2 GB/s peak"; latency an assumption).
* **L2** (reference §3 ``mem_L2_cache_fmap.sv``: 114,688 x 128 bit, dual port,
  A = ACP DMA, B = compute) holds each port for ``words x cycles_per_word`` core
  cycles per access (``cycles_per_word`` = 1 for the compute engines and the ACP,
  ``cvo.read_cycles_per_word`` for the CVO stream bridge); the requester adds its
  read latency (``l2.read_latency_cycles`` = 3 for GEMV/GEMM/ACP).  On port B,
  waiting requests are served by the reference's LOAD priority GEMM > GEMV > CVO
  (§1.5; MEMCPY uses port A).
* **HpPort** (a DataMover page + HP port, reference §2.2/§3): takes DataMover
  commands (FIFO ``hp.dm_cmd_depth`` = 8), reads DDR in bursts of
  ``hp.burst_beats`` x 16 B with up to ``hp.outstanding`` reads in flight, and moves
  each burst into its weight FIFO in ``beats x Taxi`` (one 128-bit beat per AXI
  cycle, ``mem_HP_buffer.sv``), tagged with the command's TDEST (``dest``: the GEMV
  lane(s) the bursts are for) and TAG (the instruction the stream is for).  The weight FIFO is the link to the consumer with
  capacity ``hp.fifo_words / hp.burst_beats`` bursts (4096 x 128 bit = 64 KB), so a
  full FIFO blocks the port's transfer: back-pressure, not a script.
  **Chunks** (``hp.chunk_bursts`` = c, default 1): for speed a DDR read and a FIFO
  message may carry c consecutive bursts of one command (the FIFO link then holds
  ``fifo_words / (burst_beats * c)`` chunks; the profile check requires c to divide
  the FIFO's bursts).  Byte counts and busy totals are unchanged; what changes is
  granularity: a consumer sees a chunk only when its last burst has arrived, so
  each stream's first MAC starts at most ``(c - 1) x burst_beats x Taxi`` later
  and the FIFO frees space in chunk steps (bound measured by
  tests/test_gemma3n_streaming.py and stated in docs/pccx-gemma3n.md).
* **Acp**: MEMCPY data mover, host->L2 (route 0x01) in bursts of
  ``acp.burst_words`` with DDR reads ahead, ``words x Tacp`` per burst
  (``acp.cycles_per_word`` core cycles per 128-bit word: "ACP port moves 1
  word/core-clk", reference §3) then an L2 port-A write (``words`` cycles);
  L2->host (0x10): L2 port-A read (``words + read latency`` cycles), ``words x Tacp``,
  DDR write.  Retires when the last write is acknowledged.
* **MemDispatcher** (``mem_dispatcher.sv``): owns the two 64-entry shape RAMs
  (fmap, weight; {X, Y, Z} written from MEMSET a/b/c, reference §1.6).  MEMSET
  costs ``dispatcher.memset_cycles``; GEMV/GEMM/MEMCPY pass its transfer-length
  pipeline: busy 1 cycle (one µop per cycle), delivered
  ``dispatcher.len_lookup_cycles - 1`` cycles later (7-stage pipeline: the latency
  of the builder's links from the dispatcher to the ACP, GEMV and GEMM).  Lengths:
  ``ceil(X*Y*Z / 8)`` words from the fmap RAM at ``shape_ptr_addr``; zero-length
  MEMCPYs are dropped (RTL).  Assumption: GEMV/GEMM take their output rows N
  from the weight-shape RAM X at ``size_ptr_addr`` (the RTL uses the raw 6-bit
  field as a count and leaves that RAM unread, reference §1.6); a head-parallel
  GEMV its result stride ``max(ceil(N/8), Z)`` words from Z (actors/pccx/gemv.py).
"""
from __future__ import annotations


import numpy as np
import trio

from emulator.actor import Actor
from emulator.declare import In, Out, Param
from emulator.units import transfer_ps
from protocols import pccx_isa as isa
from protocols.pccx_isa import gemv_mode
from protocols.codec import TensorDesc
from protocols.pccx import (Ack, AcpJob, DdrData, DdrRead, DdrWrite, DmCmd, L2Data, L2Read, L2Write, Status, Uop,
                            WeightBurst)

from actors.pccx.profile import clocks, declare

__all__ = ["HostDDR", "L2", "HpPort", "Acp", "MemDispatcher", "words_touched", "L2_CLIENT_PORTS"]

#: the L2 ports of a unit that reads and writes L2 (part of its ``PORTS``; the ACP on port A, the rest on port B)
L2_CLIENT_PORTS = (Out("l2_req", L2Read, L2Write, doc="L2 reads and writes"),
                   In("l2_resp", L2Data, Ack, doc="L2 answers"))


def words_touched(elem: int, nelem: int) -> int:
    """128-bit L2 words covered by ``nelem`` BF16 elements from element address ``elem`` (8 per word)."""
    if nelem <= 0:
        return 0
    return (elem + nelem - 1) // 8 - elem // 8 + 1


class HostDDR(Actor):
    """Host DDR4 shared with the PS: one FIFO server for every requester."""

    daemon = True
    PORTS = (In("req_{requester}", DdrRead, DdrWrite, doc="requests of hp<p>, acp, host", idle=True),
             Out("resp_hp{p}", DdrData, doc="read data to HP port p"),
             Out("resp_{requester}", DdrData, Ack, doc="read data / write acknowledgements to acp, host"))
    PARAMS = (Param("bandwidth", "ddr.bandwidth", "B/s", "DDR rate shared by every requester"),
              Param("size", "ddr.model_size", "B", "bytes of host DDR modelled"))

    def __init__(self, name: str, *, requesters: list[str], bandwidth: int, size: int, data_mode: bool,
                 init: dict | None = None):
        super().__init__(name)
        self.req = {r: self.in_port(f"req_{r}", idle=True) for r in requesters}
        self.resp = {r: self.out_port(f"resp_{r}") for r in requesters}
        self.bandwidth = bandwidth
        self.size = size
        self.mem = np.zeros(size, np.uint8) if data_mode else None
        self.rd_bytes = self.wr_bytes = 0
        for addr, blob in (init or {}).items():
            if self.mem is not None:
                b = np.frombuffer(bytes(blob), np.uint8)
                self.mem[addr:addr + b.size] = b

    def _check(self, addr: int, n: int) -> None:
        if addr < 0 or addr + n > self.size:
            raise RuntimeError(f"host DDR access [{addr}, {addr + n}) outside the modelled {self.size} bytes")

    async def run(self) -> None:
        ports = list(self.req.values())
        names = list(self.req)
        while True:
            port, m = await self.select(*ports)
            who = names[ports.index(port)]
            if isinstance(m, DdrRead):
                self._check(m.addr, m.nbytes)
                await self.busy(transfer_ps(m.nbytes, self.bandwidth), f"rd {who}")
                self.rd_bytes += m.nbytes     # the energy model's DDR counts (actors/pccx/energy.py)
                data = (self.mem[m.addr:m.addr + m.nbytes].copy() if self.mem is not None
                        else TensorDesc.of((m.nbytes,), "u1"))
                await self.resp[who].send(DdrData(m.req, data))
            else:
                n = m.data.nbytes if not isinstance(m.data, np.ndarray) else m.data.size
                self._check(m.addr, n)
                await self.busy(transfer_ps(n, self.bandwidth), f"wr {who}")
                self.wr_bytes += n
                if self.mem is not None:
                    self.mem[m.addr:m.addr + n] = m.data
                await self.resp[who].send(Ack(m.req))


class L2(Actor):
    """The L2 (URAM) with port A (ACP) and port B (compute, priority GEMM > GEMV > CVO)."""
    STATE = ("rd_words", "wr_words")   # what a state snapshot shows (emulator/snapshot.py)

    daemon = True
    PORT_B_PRIORITY = ("gemm", "gemv", "cvo")
    PORTS = (In("req_{unit}", L2Read, L2Write, doc="requests of acp (port A), gemm, gemv, cvo (port B)", idle=True),
             Out("resp_{unit}", L2Data, Ack, doc="read data / write acknowledgements"))
    PARAMS = (Param("words", "l2.words", "words", "L2 size in 128-bit words"), *declare("cycle_ps"))

    def __init__(self, name: str, *, words: int, cycle_ps: int, data_mode: bool):
        super().__init__(name)
        self.words = words
        self.cycle_ps = cycle_ps
        self.mem = np.zeros(words * 8, np.uint16) if data_mode else None
        self.rd_words = self.wr_words = 0
        self.clients = ("acp",) + self.PORT_B_PRIORITY
        self.req = {c: self.in_port(f"req_{c}", idle=True) for c in self.clients}
        self.resp = {c: self.out_port(f"resp_{c}") for c in self.clients}

    async def _serve(self, port_name: str, clients: tuple[str, ...]) -> None:
        ports = [self.req[c] for c in clients]
        while True:
            who = next((c for c, p in zip(clients, ports) if len(p)), None)
            if who is None:
                port, m = await self.select(*ports)
                who = clients[ports.index(port)]
            else:
                m = self.req[who].poll()
            nwords = words_touched(m.elem, m.nelem)
            if m.elem < 0 or (m.elem + m.nelem + 7) // 8 > self.words:
                raise RuntimeError(f"L2 access by {who}: elements [{m.elem}, {m.elem + m.nelem}) beyond "
                                   f"{self.words} words (the dispatcher should have caught it)")
            if isinstance(m, L2Read):
                await self.busy(nwords * m.cycles_per_word * self.cycle_ps, f"{port_name}:rd {who}")
                self.rd_words += nwords       # the energy model's URAM counts (actors/pccx/energy.py)
                data = (self.mem[m.elem:m.elem + m.nelem].copy() if self.mem is not None
                        else TensorDesc.of((m.nelem,), "u2"))
                await self.resp[who].send(L2Data(m.req, data))
            else:
                await self.busy(nwords * self.cycle_ps, f"{port_name}:wr {who}")
                self.wr_words += nwords
                if self.mem is not None:
                    self.mem[m.elem:m.elem + m.nelem] = m.data
                await self.resp[who].send(Ack(m.req))

    async def run(self) -> None:
        async with self.subtasks() as n:
            n.start_soon(self._serve, "A", ("acp",))
            n.start_soon(self._serve, "B", self.PORT_B_PRIORITY)


class HpPort(Actor):
    """A DataMover + HP port feeding one weight FIFO (the ``fifo`` out-port's link)."""
    STATE = ("bursts", "moved_bytes", "outstanding")   # what a state snapshot shows (emulator/snapshot.py)

    daemon = True
    PORTS = (In("cmd", DmCmd, doc="DataMover commands from the driver", idle=True),
             Out("ddr_req", DdrRead, doc="burst reads"), In("ddr_resp", DdrData, doc="read data"),
             Out("fifo", WeightBurst, doc="the weight FIFO (its link's capacity is the FIFO depth)"))
    PARAMS = (Param("burst_bytes", ("hp.burst_beats", "hp.beat_bytes"), "B", "one AXI burst: burst_beats x beat_bytes",
                    lambda p: p["hp"]["burst_beats"] * p["hp"]["beat_bytes"]),
              Param("beat_bytes", "hp.beat_bytes", "B", "bytes per AXI beat"),
              Param("beat_ps", "clocks.axi", "ps", "AXI clock period (one beat)", lambda p: clocks(p)[1]),
              Param("outstanding", "hp.outstanding", "count", "DDR bursts in flight"),
              Param("chunk_bursts", "hp.chunk_bursts", "count", "bursts per DDR read / FIFO message"))

    def __init__(self, name: str, *, burst_bytes: int, beat_bytes: int, beat_ps: int, outstanding: int,
                 chunk_bursts: int = 1):
        super().__init__(name)
        self.cmd = self.in_port("cmd", idle=True)
        self.ddr_req = self.out_port("ddr_req")
        self.ddr_resp = self.in_port("ddr_resp")
        self.fifo = self.out_port("fifo")
        self.burst_bytes = burst_bytes * chunk_bursts   # one message = one chunk of chunk_bursts bursts
        self.beat_bytes = beat_bytes
        self.beat_ps = beat_ps
        self.outstanding = outstanding
        self.bursts = 0
        self.moved_bytes = 0
        self.spans: list[tuple[int, int, int]] = []   # (start, end, stream) of every burst transfer

    async def _fetch(self, ahead) -> None:
        req = 0
        while True:
            c = await self.cmd.recv()
            for i, off in enumerate(range(0, c.nbytes, self.burst_bytes)):
                n = min(self.burst_bytes, c.nbytes - off)
                await ahead.send((c.stream, i, n, c.dest, c.tag))
                await self.ddr_req.send(DdrRead(req, c.addr + off, n, i == 0))
                req += 1

    async def _move(self, behind) -> None:
        while True:
            stream, index, n, dest, tag = await behind.receive()
            d = await self.ddr_resp.recv()
            beats = -(-n // self.beat_bytes)
            t = self.now
            await self.busy(beats * self.beat_ps, f"w{stream}")
            self.moved_bytes += n             # the energy model's HP count (actors/pccx/energy.py)
            self.spans.append((t, self.now, stream))
            await self.fifo.send(WeightBurst(stream, index, beats, d.data, dest, tag))
            self.bursts += 1

    async def run(self) -> None:
        ahead, behind = trio.open_memory_channel(self.outstanding)
        async with self.subtasks() as n:
            n.start_soon(self._fetch, ahead)
            n.start_soon(self._move, behind)


class Acp(Actor):
    """The ACP data mover of MEMCPY (routes 0x01 host->L2 and 0x10 L2->host)."""

    daemon = True
    PORTS = (In("job", AcpJob, doc="MEMCPY jobs from the dispatcher", idle=True),
             Out("ddr_req", DdrRead, DdrWrite, doc="host DDR side"), In("ddr_resp", DdrData, Ack, doc="DDR answers"),
             *L2_CLIENT_PORTS,
             Out("status", Status, doc="retirement, to the scheduler"))
    PARAMS = (Param("burst_words", "acp.burst_words", "words", "L2 words per ACP burst"),
              Param("word_ps", ("acp.cycles_per_word", "clocks.core"), "ps", "cycles_per_word core cycles",
                    lambda p: p["acp"]["cycles_per_word"] * clocks(p)[0]),
              Param("read_latency_ps", ("l2.read_latency_cycles", "clocks.core"), "ps", "L2 read latency",
                    lambda p: p["l2"]["read_latency_cycles"] * clocks(p)[0]),
              Param("outstanding", "acp.outstanding", "count", "bursts in flight"))

    def __init__(self, name: str, *, burst_words: int, word_ps: int, read_latency_ps: int, outstanding: int):
        super().__init__(name)
        self.job = self.in_port("job", idle=True)
        self.ddr_req = self.out_port("ddr_req")
        self.ddr_resp = self.in_port("ddr_resp")
        self.l2_req = self.out_port("l2_req")
        self.l2_resp = self.in_port("l2_resp")
        self.status = self.out_port("status")
        self.burst_words = burst_words
        self.word_ps = word_ps
        self.read_latency_ps = read_latency_ps
        self.outstanding = outstanding

    def _bursts(self, words: int):
        for off in range(0, words, self.burst_words):
            yield off, min(self.burst_words, words - off)

    async def _host_to_l2(self, j: AcpJob) -> None:
        pending_acks = 0

        async def fetch(ahead):
            for off, n in self._bursts(j.words):
                await ahead.send((off, n))
                await self.ddr_req.send(DdrRead(off, j.host_addr + off * 16, n * 16, off == 0))
            await ahead.aclose()

        ahead, behind = trio.open_memory_channel(self.outstanding)
        async with self.subtasks() as nursery:
            nursery.start_soon(fetch, ahead)
            async for off, n in behind:
                d = await self.ddr_resp.recv()
                await self.busy(n * self.word_ps, "acp in")
                data = d.data.view(np.uint16) if isinstance(d.data, np.ndarray) else TensorDesc.of((n * 8,), "u2")
                await self.l2_req.send(L2Write(off, (j.l2_word + off) * 8, n * 8, data))
                pending_acks += 1
                while self.l2_resp.poll() is not None:
                    pending_acks -= 1
        while pending_acks:
            await self.l2_resp.recv()
            pending_acks -= 1

    async def _l2_to_host(self, j: AcpJob) -> None:
        pending = 0
        for off, n in self._bursts(j.words):
            await self.l2_req.send(L2Read(off, (j.l2_word + off) * 8, n * 8, 1))
            d = await self.l2_resp.recv()
            await self.sleep(self.read_latency_ps)
            await self.busy(n * self.word_ps, "acp out")
            data = d.data.view(np.uint8) if isinstance(d.data, np.ndarray) else TensorDesc.of((n * 16,), "u1")
            await self.ddr_req.send(DdrWrite(off, j.host_addr + off * 16, data))
            pending += 1
            while self.ddr_resp.poll() is not None:
                pending -= 1
        while pending:
            await self.ddr_resp.recv()
            pending -= 1

    async def run(self) -> None:
        while True:
            j = await self.job.recv()
            if j.route == isa.ROUTES["HOST_TO_L2"]:
                await self._host_to_l2(j)
            else:
                await self._l2_to_host(j)
            await self.status.send(Status("retire", "MEMCPY", j.seq, 0, j.start, self.now, f"route 0x{j.route:02X}"))


class MemDispatcher(Actor):
    """``mem_dispatcher``: shape RAMs, MEMSET, transfer lengths, routing to ACP / GEMV / GEMM."""

    daemon = True
    PORTS = (In("in", Uop, doc="GEMV, GEMM, MEMCPY, MEMSET µops from the scheduler", idle=True),
             Out("acp", AcpJob, doc="MEMCPY jobs"), Out("gemv", Uop, doc="GEMV µops"), Out("gemm", Uop, doc="GEMM µops"),
             Out("status", Status, doc="MEMSET retirements and errors, to the scheduler"))
    PARAMS = (*declare("cycle_ps", "strict", "l2_words"),
              Param("len_lookup_cycles", "dispatcher.len_lookup_cycles", "cycles", "shape-RAM lookup pipeline"),
              Param("memset_cycles", "dispatcher.memset_cycles", "cycles", "one MEMSET"),
              Param("gemm_rows", "gemm.rows", "count", "GEMM array rows"),
              Param("gemv_lanes", "gemv.lanes", "count", "GEMV lanes (a head-parallel GEMV's extent)"),
              Param("head_parallel", "gemv.head_parallel", "bool", "parallel_lane bit 4 selects head parallelism"))

    def __init__(self, name: str, *, cycle_ps: int, len_lookup_cycles: int, memset_cycles: int, strict: bool,
                 l2_words: int, gemm_rows: int, gemv_lanes: int = 4, head_parallel: bool = False):
        super().__init__(name)
        self.inp = self.in_port("in", idle=True)
        self.acp = self.out_port("acp")
        self.gemv = self.out_port("gemv")
        self.gemm = self.out_port("gemm")
        self.status = self.out_port("status")
        self.cycle_ps = cycle_ps
        self.len_lookup_cycles = len_lookup_cycles
        self.memset_cycles = memset_cycles
        self.strict = strict
        self.l2_words = l2_words
        self.gemm_rows = gemm_rows
        self.gemv_lanes = gemv_lanes
        self.head_parallel = head_parallel
        # two 64 x {X, Y, Z} shape RAMs (reference §1.6); index 0 = fmap_shape, 1 = weight_shape
        self.ram = [[[0, 0, 0] for _ in range(64)] for _ in range(2)]

    def fmap_len(self, ptr: int) -> int:
        x, y, z = self.ram[0][ptr]
        return x * y * z

    async def _fail(self, u: Uop, text: str) -> None:
        await self.status.send(Status("error" if self.strict else "drop", u.op, u.seq, isa.ERR_L2_RANGE, self.now,
                                      self.now, text))

    def _range(self, what: str, word: int, words: int) -> str | None:
        if word + words > self.l2_words:
            return f"{what} [{word}, {word + words}) exceeds the {self.l2_words} L2 words"
        return None

    async def run(self) -> None:
        while True:
            u = await self.inp.recv()
            f = u.fields
            start = self.now
            if u.op == "MEMSET":
                await self.busy(self.memset_cycles * self.cycle_ps, "memset")
                if f["dest_cache"] > 1:   # rtl profile only (strict rejects it at decode): no RAM selected
                    await self.status.send(Status("drop", "MEMSET", u.seq, isa.ERR_UNDEFINED_VALUE, start, self.now,
                                                  f"dest_cache={f['dest_cache']} selects no shape RAM"))
                    continue
                self.ram[f["dest_cache"]][f["dest_addr"]] = [f["a_value"], f["b_value"], f["c_value"]]
                await self.status.send(Status("retire", "MEMSET", u.seq, 0, start, self.now,
                                              f"{'fmap' if f['dest_cache'] == 0 else 'weight'}[{f['dest_addr']}]"))
                continue
            await self.busy(self.cycle_ps, "lookup")
            if u.op == "MEMCPY":
                words = -(-self.fmap_len(f["shape_ptr_addr"]) // 8)
                route = isa.memcpy_route(f["from_device"], f["to_device"])
                l2_word = f["dest_addr"] if route == isa.ROUTES["HOST_TO_L2"] else f["src_addr"]
                if words == 0:
                    await self.status.send(Status("drop", "MEMCPY", u.seq, 0, start, self.now, "zero length"))
                    continue
                bad = self._range("MEMCPY L2", l2_word, words)
                if bad:
                    await self._fail(u, bad)
                    continue
                await self.acp.send(AcpJob(u.seq, start, route, l2_word, f["aux_addr"] * 16, words))
                continue
            # GEMV / GEMM: K from the fmap shape, N from the weight shape (GEMM: the array's 32 columns); a
            # head-parallel GEMV spans G activations and G results at a stride S (actors/pccx/gemv.py)
            k = self.fmap_len(f["shape_ptr_addr"])
            n, _y, z = self.ram[1][f["size_ptr_addr"]] if u.op == "GEMV" else (self.gemm_rows, 1, 1)
            head, used = gemv_mode(f["parallel_lane"], self.gemv_lanes, self.head_parallel)
            g = used if head and u.op == "GEMV" else 1
            stride = max(-(-n // 8), z)
            bad = (self._range(f"{u.op} src", f["src_addr"], g * -(-k // 8))
                   or self._range(f"{u.op} dest", f["dest_reg"], (g - 1) * stride + -(-n // 8)))
            if bad or k == 0 or n == 0:
                await self._fail(u, bad or f"{u.op}: empty shape (K={k}, N={n})")
                continue
            out = dict(f, K=k, N=n, S=stride) if g > 1 else dict(f, K=k, N=n)
            await (self.gemv if u.op == "GEMV" else self.gemm).send(Uop(u.op, out, u.seq))
