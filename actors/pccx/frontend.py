"""The control plane: AXI-Lite command FIFO, status block, decoder, global scheduler.

Path of an instruction (reference §1.5, §2.1)::

    host driver --AXI-Lite write--> AxilCmdIn --8-deep cmd FIFO link--> Decoder
        --> GlobalScheduler --> memory dispatcher (GEMV, GEMM, MEMCPY, MEMSET) | CVO

Service times (core clock ``Tc``):

* AxilCmdIn: no busy time; the AXI-Lite flight time is the host link latency
  (``axil.latency``).  The command FIFO is a link of capacity ``axil.cmd_fifo_depth``
  (8, ``AXIL_CMD_IN.sv``), so a full FIFO holds the AW channel: the host's write
  blocks (reference §1.5 item 1 "AW stalls when full").
* Decoder: ``decoder_cycles`` x Tc per word (1 instr/cycle, ``ctrl_npu_decoder.sv``).
* GlobalScheduler: ``scheduler_cycles`` x Tc per instruction (registers µops 1
  cycle later, ``Global_Scheduler.sv``).

Issue is in order, one instruction per cycle, so at most one LOAD µop becomes
valid per cycle; the reference's LOAD priority GEMM > GEMV > MEMCPY > CVO is
applied where requests actually meet, at the L2 compute port
(actors/pccx/memory.py ``L2``).  Assumption (stated, reference §1.5 item 4): the
RTL has no back-pressure from engines, the emulator gives each engine a µop FIFO
of ``uop_fifo_depth`` (the v002.1 proposal) so the scheduler waits instead of
overwriting a µop.

Errors (``errors`` profile switch, reference §1.7 / seed §5):

* ``strict``: reserved opcode, non-zero reserved bits / undefined enumerated
  value (decoder), L2 base address >= ``l2.words``, CVO length > ``cvo.max_length``
  and a CVO element address beyond the 16 bits the stream bridge keeps (the fields
  have 17; reference §1.6) (scheduler), L2 extent out of range (dispatcher) -> the instruction is not
  executed, the status block sets ERROR and raises the error interrupt;
* ``rtl``: the same instructions are dropped silently (counted as dropped).

The kick marker (``0x8000...0``, write to 0x008) is always dropped: it is not an
instruction in either machine.

Status FIFO: the RTL pushes a status snapshot every cycle into the 8-deep
``AXIL_STAT_OUT`` FIFO, so a read returns a snapshot a few cycles old (reference
§2.1); the emulator answers a read with the state at the moment it arrives
(assumption: <= 8 core cycles of staleness is far below the driver's poll period).

STORE µops: each engine writes its own results to L2 (GEMV/GEMM ``ceil(N/8)``
words, CVO its output elements) as the last step of its service time, so the
RTL's separate STORE µop is folded into the engine (compute.py formulas).

Status word (read at any address, reference §2.1 ``{32'b0, mmio_npu_stat}``, with
the emulator's additions marked *):

* bit 0 BUSY = instructions accepted by the command FIFO and not yet retired;
* bit 1 DONE = sticky, set when an op of ``status.done_on`` retires (RTL: MEMSET,
  CVO, GEMM store), cleared at the next issue;
* bit 2 ERROR* = sticky (position from the bare-metal driver's map
  ``npu_driver.h``; no RTL drives it), bits 11:8* = last error class
  (1 reserved opcode, 2 reserved bits/value, 3 L2 address range, 4 CVO length);
* bits 63:32* = retired-instruction count mod 2^32 (the bare-metal map's token
  field position) so the driver's DONE poll is race-free.
"""
from __future__ import annotations

from emulator.actor import Actor
from emulator.declare import In, Out, Param
from protocols import pccx_isa as isa
from protocols.pccx import AxiRead, AxiReadData, AxiWrite, CmdWord, FifoClaim, Irq, Status, Uop
from protocols.pccx_isa import ERR_CVO_LENGTH, ERR_L2_RANGE

from actors.pccx.profile import clocks, declare

BUSY_BIT, DONE_BIT, ERROR_BIT = 1, 2, 4
CVO_ELEM_MAX = 0xFFFF   # mem_CVO_stream_bridge.sv: CVO src/dst are 16-bit element addresses (reference §1.6)


def status_fields(word: int) -> dict:
    """The status word split into its fields (used by the driver and tests)."""
    return {"busy": bool(word & BUSY_BIT), "done": bool(word & DONE_BIT), "error": bool(word & ERROR_BIT),
            "error_code": (word >> 8) & 0xF, "retired": (word >> 32) & 0xFFFF_FFFF}


class AxilCmdIn(Actor):
    """``AXIL_CMD_IN``: write 0x000 pushes the instruction, 0x008 pushes the kick marker."""

    daemon = True
    PORTS = (In("w", AxiWrite, doc="AXI-Lite writes from the driver", idle=True),
             Out("fifo", CmdWord, doc="the command FIFO to the decoder"),
             Out("status", Status, doc="accept events, to the status block"))

    def __init__(self, name: str):
        super().__init__(name)
        self.w = self.in_port("w", idle=True)
        self.fifo = self.out_port("fifo")
        self.status = self.out_port("status")
        self.pushed = 0
        self.ignored = 0

    async def run(self) -> None:
        while True:
            m = await self.w.recv()
            if m.addr == 0x000:
                seq = self.pushed
                self.pushed += 1
                await self.fifo.send(CmdWord(m.data, seq))
                await self.status.send(Status("accept", "", seq, 0, self.now, self.now, ""))
            elif m.addr == 0x008:
                await self.fifo.send(CmdWord(isa.KICK_WORD, -1))
            else:
                self.ignored += 1   # other addresses are ignored (AXIL_CMD_IN.sv)


class AxilStatOut(Actor):
    """The status block: AXI-Lite reads return the status word; raises the error interrupt."""

    daemon = True
    PORTS = (In("rd", AxiRead, doc="AXI-Lite reads from the driver", idle=True),
             In("ev", Status, doc="status events of every unit", idle=True),
             Out("data", AxiReadData, doc="the status word"),
             Out("irq", Irq, doc="the error interrupt"))
    PARAMS = (Param("done_on", "status.done_on", "opcodes", "opcodes whose retirement sets DONE"),)

    def __init__(self, name: str, *, done_on: list[str]):
        super().__init__(name)
        self.rd = self.in_port("rd", idle=True)
        self.ev = self.in_port("ev", idle=True)
        self.data = self.out_port("data")
        self.irq = self.out_port("irq")
        self.done_on = set(done_on)
        self.accepted = 0
        self.retired = 0
        self.done = False
        self.error = False
        self.error_code = 0
        self.records: list[dict] = []     # one per retired / dropped / failed instruction
        self.irq_lost = 0

    def word(self) -> int:
        w = (BUSY_BIT if self.accepted != self.retired else 0) | (DONE_BIT if self.done else 0)
        w |= (ERROR_BIT if self.error else 0) | (self.error_code & 0xF) << 8
        return w | (self.retired & 0xFFFF_FFFF) << 32

    async def run(self) -> None:
        while True:
            port, m = await self.select(self.rd, self.ev)
            if port is self.rd:
                await self.data.send(AxiReadData(self.word()))
                continue
            k = m.kind
            if k == "accept":
                self.accepted += 1
            elif k == "issue":
                self.done = False
            elif k in ("retire", "drop", "error"):
                self.retired += 1
                self.records.append({"kind": k, "op": m.op, "seq": m.seq, "code": m.code, "start": m.start,
                                     "end": m.end, "text": m.text})
                if k == "retire" and m.op in self.done_on:
                    self.done = True
                if k == "error":
                    self.error = True
                    self.error_code = m.code
                    self.mark("error_irq", [m.seq, m.code, m.text])
                    if not self.irq.try_send(Irq(m.code, m.seq, m.text)):
                        self.irq_lost += 1


class Decoder(Actor):
    """``ctrl_npu_decoder``: one word per ``decoder_cycles``; reserved encodings per ``errors``."""

    daemon = True
    PORTS = (In("in", CmdWord, doc="the command FIFO", idle=True), Out("out", Uop, doc="decoded µops"),
             Out("status", Status, doc="decode errors / drops, to the status block"))
    PARAMS = (Param("cycle_ps", ("decoder_cycles", "clocks.core"), "ps", "decode time: decoder_cycles core cycles",
                    lambda p: p["decoder_cycles"] * clocks(p)[0]),
              *declare("strict"),
              Param("cvo_ext", "cvo.tanh", "codes", "extension CVO function codes accepted (TANH when cvo.tanh)",
                    lambda p: frozenset([isa.CVO_EXT_FUNCS["TANH"]] if p["cvo"]["tanh"] else [])))

    def __init__(self, name: str, *, cycle_ps: int, strict: bool, cvo_ext: frozenset = frozenset()):
        super().__init__(name)
        self.inp = self.in_port("in", idle=True)
        self.out = self.out_port("out")
        self.status = self.out_port("status")
        self.cycle_ps = cycle_ps
        self.strict = strict
        self.cvo_ext = cvo_ext   # what-if CVO function codes this machine has (profile cvo.tanh)

    async def run(self) -> None:
        while True:
            m = await self.inp.recv()
            await self.busy(self.cycle_ps, "decode")
            if m.word == isa.KICK_WORD:
                continue
            try:
                ins = isa.decode(m.word, strict=self.strict, cvo_ext=self.cvo_ext)
            except isa.IsaError as e:
                await self.status.send(Status("error", "?", m.seq, e.code, self.now, self.now,
                                              f"0x{m.word:016X}: {e}"))
                continue
            if ins is None:  # RTL: unknown opcode dropped silently
                await self.status.send(Status("drop", "?", m.seq, isa.ERR_RESERVED_OPCODE, self.now, self.now,
                                              f"0x{m.word:016X}: reserved opcode 0x{m.word >> 60:X} dropped"))
                continue
            await self.out.send(Uop(ins.op, ins.fields, m.seq))


class GlobalScheduler(Actor):
    """``Global_Scheduler``: base-address and CVO-length checks, then the µop to its engine.

    Engines report completions on ``done``; the scheduler forwards them to the
    status block.  A MEMCPY or CVO with ``async=0`` is a synchronous op: issue of
    the next instruction waits until it retires (assumption: the seed's "async
    field" semantics, §5, applied to the two opcodes that have the bit,
    reference §1.2).  With ``sync_gemx`` (the as-built scheduler forces SYNC_OP on
    GEMM/GEMV load/store µops, reference §1.2) GEMV and GEMM are synchronous too.

    With ``gemv_fifo`` (profile ``cvo.gemv_fifo_words`` > 0, seed §3.2 rule 2: a direct GEMV->SFU FIFO)
    the scheduler keeps a one-entry scoreboard: the sequence number and destination word of the last
    GEMV it issued (N is known only after the dispatcher's shape lookup), and the element ranges the
    CVOs issued since then write.  A CVO whose source reaches at or above that word is tagged
    ``fifo_seq``: the SFU waits for that GEMV's result and, with ``fifo_data``, takes its operand from
    the FIFO (or, if the result does not cover the operand, reads L2 once it is written), so the
    program needs no DONE poll between them.  A source those later CVOs rewrote (an in-place EXP's
    output) is not the GEMV's result: wholly rewritten, the CVO is not tagged (the SFU is in order, the
    writer waited for the GEMV); partly, it is tagged without ``fifo_data`` (waits, reads L2).  The first
    ``fifo_data`` CVO of a GEMV also sends the GEMV unit a claim (``fifo_claim``): only a claimed result
    enters the FIFO (and takes credits there, see GemvFront).  Conservative: a CVO reading other data
    above that word waits for the GEMV too.  The pccx docs
    describe the FIFO, the RTL top has no such path and no hazard tracking (reference §1.2, §3).
    Reverse direction (the docs' "SFU results go back to L2 while the next GEMV starts"): the
    scheduler also keeps the L2 word ranges the in-flight CVOs write (``[dst, dst + out)`` elements,
    ``out`` as in Cvo; removed when their completion passes through ``done``) and attaches them to a
    GEMV µop as ``after_cvo``; the GEMV unit, which knows its K, waits for the newest overlapping one
    to retire before it reads its activation (GemvFront), so no DONE poll is needed between them.
    """
    STATE = ("last_gemv", "claimed", "cvo_writes")   # what a state snapshot shows (emulator/snapshot.py)

    daemon = True
    PORTS = (In("in", Uop, doc="decoded µops", idle=True), In("done", Status, doc="completions of every engine"),
             Out("mem", Uop, doc="GEMV, GEMM, MEMCPY, MEMSET, to the memory dispatcher"),
             Out("cvo", Uop, doc="CVO µops"), Out("status", Status, doc="issue / errors / completions, to the status block"),
             Out("fifo_claim", FifoClaim, doc="GEMV results a CVO will read, to the GEMV front (direct FIFO)"))
    PARAMS = (Param("cycle_ps", ("scheduler_cycles", "clocks.core"), "ps", "issue time: scheduler_cycles core cycles",
                    lambda p: p["scheduler_cycles"] * clocks(p)[0]),
              *declare("strict", "l2_words"),
              Param("cvo_max", "cvo.max_length", "elements", "longest CVO"),
              Param("sync_gemx", "sync_gemx", "bool", "GEMV / GEMM issue waits for their retirement"),
              Param("gemv_fifo", "cvo.gemv_fifo_words", "bool", "gemv_fifo_words > 0: the GEMV->SFU FIFO scoreboard",
                    lambda p: p["cvo"]["gemv_fifo_words"] > 0))

    def __init__(self, name: str, *, cycle_ps: int, strict: bool, l2_words: int, cvo_max: int,
                 sync_gemx: bool = False, gemv_fifo: bool = False):
        super().__init__(name)
        self.inp = self.in_port("in", idle=True)
        self.done = self.in_port("done")
        self.mem = self.out_port("mem")      # GEMV, GEMM, MEMCPY, MEMSET via the memory dispatcher
        self.cvo = self.out_port("cvo")
        self.status = self.out_port("status")
        self.cycle_ps = cycle_ps
        self.strict = strict
        self.l2_words = l2_words
        self.cvo_max = cvo_max
        self.sync_gemx = sync_gemx   # as built: SYNC_OP forced on GEMM/GEMV (reference §1.2)
        self.gemv_fifo = gemv_fifo
        self.last_gemv: tuple[int, int] | None = None   # (seq, dest word) of the last GEMV issued
        self.claimed = -1                                 # last GEMV whose result a CVO claimed
        self.since_gemv: list[tuple[int, int]] = []       # element ranges CVOs issued after the last GEMV write
        self.cvo_writes: dict[int, tuple[int, int]] = {}  # in-flight CVO seq -> L2 words [lo, hi) it writes
        self.fifo_claim = self.out_port("fifo_claim") if gemv_fifo else None

    def check(self, u: Uop) -> tuple[int, str] | None:
        f = u.fields
        if u.op in ("GEMV", "GEMM"):
            for k in ("dest_reg", "src_addr"):
                if f[k] >= self.l2_words:
                    return ERR_L2_RANGE, f"{u.op} {k}={f[k]} >= {self.l2_words} L2 words"
        elif u.op == "MEMCPY":
            k = "dest_addr" if (f["from_device"], f["to_device"]) == (1, 0) else "src_addr"
            if f[k] >= self.l2_words:
                return ERR_L2_RANGE, f"MEMCPY {k}={f[k]} >= {self.l2_words} L2 words"
        elif u.op == "CVO":
            if f["length"] > self.cvo_max:
                return ERR_CVO_LENGTH, f"CVO length={f['length']} > {self.cvo_max} elements"
            for k in ("src_addr", "dst_addr"):   # 17-bit fields, but the stream bridge keeps 16 bits (ref §1.6)
                if f[k] > CVO_ELEM_MAX:
                    return ERR_L2_RANGE, (f"CVO {k}={f[k]} beyond the {CVO_ELEM_MAX + 1} elements a CVO can address "
                                          f"(16-bit element addresses of the CVO stream bridge)")
        return None

    async def _forward(self, m) -> None:
        if m.op == "CVO":
            self.cvo_writes.pop(m.seq, None)
        await self.status.send(m)

    @staticmethod
    def _cvo_out(f: dict) -> int:
        """Elements a CVO writes from ``dst_addr``: 1 REDUCE_SUM, L-1 SCALE, else L."""
        name, L = isa.CVO_NAMES.get(f["cvo_func"]), f["length"]
        return 1 if name == "REDUCE_SUM" else max(L - 1, 0) if name == "SCALE" else L

    def _cvo_range(self, f: dict) -> tuple[int, int]:
        """L2 words a CVO writes."""
        return f["dst_addr"] // 8, -(-(f["dst_addr"] + self._cvo_out(f)) // 8)

    def _rewritten(self, lo: int, hi: int) -> int:
        """Elements of ``[lo, hi)`` that CVOs issued since the last GEMV write."""
        marks = sorted((max(a, lo), min(b, hi)) for a, b in self.since_gemv if a < hi and lo < b)
        n, end = 0, lo
        for a, b in marks:
            a = max(a, end)
            if b > a:
                n += b - a
                end = b
        return n

    async def _tag(self, u: Uop) -> Uop:
        """A CVO reading the last GEMV's result: ``fifo_seq`` (+ ``fifo_data``), and the claim (class docstring)."""
        f = u.fields
        lo, hi = f["src_addr"], f["src_addr"] + f["length"]
        if not self.last_gemv or hi <= 8 * self.last_gemv[1]:
            return u
        rewritten = self._rewritten(lo, hi)
        if rewritten == hi - lo:
            return u
        g = self.last_gemv[0]
        u = Uop(u.op, {**f, "fifo_seq": g, "fifo_data": rewritten == 0}, u.seq)
        if rewritten == 0 and g != self.claimed:   # the GEMV unit puts only claimed results into the FIFO
            self.claimed = g
            await self.fifo_claim.send(FifoClaim(g))
        return u

    async def run(self) -> None:
        while True:
            port, u = await self.select(self.inp, self.done)
            if port is self.done:
                await self._forward(u)
                continue
            await self.busy(self.cycle_ps, "issue")
            bad = self.check(u)
            if bad is not None:
                code, text = bad
                await self.status.send(Status("error" if self.strict else "drop", u.op, u.seq, code, self.now,
                                              self.now, text))
                continue
            await self.status.send(Status("issue", u.op, u.seq, 0, self.now, self.now, ""))
            if self.gemv_fifo:
                if u.op == "GEMV":
                    self.last_gemv = (u.seq, u.fields["dest_reg"])
                    self.since_gemv = []
                    if self.cvo_writes:   # reverse direction: the GEMV unit orders itself after them
                        u = Uop(u.op, {**u.fields, "after_cvo": [[k, lo, hi] for k, (lo, hi)
                                                                   in self.cvo_writes.items()]}, u.seq)
                elif u.op == "CVO":
                    u = await self._tag(u)
            if self.gemv_fifo and u.op == "CVO":
                self.cvo_writes[u.seq] = self._cvo_range(u.fields)
                self.since_gemv.append((u.fields["dst_addr"], u.fields["dst_addr"] + self._cvo_out(u.fields)))
            await (self.cvo if u.op == "CVO" else self.mem).send(u)
            if (u.op in ("MEMCPY", "CVO") and not u.fields["async"]) or (self.sync_gemx and u.op in ("GEMV", "GEMM")):
                while True:   # synchronous op: wait for its retirement
                    m = await self.done.recv()
                    await self._forward(m)
                    if m.seq == u.seq:
                        break
