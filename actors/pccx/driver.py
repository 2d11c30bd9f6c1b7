"""The host driver: the PS-side program that feeds the NPU over AXI-Lite.

API as the seed names it (seed §2, §5; reference §2.4 — doc-only names, no code
defines them): :meth:`HostDriver.open`, :meth:`HostDriver.kv_init`,
:meth:`HostDriver.start`, :meth:`HostDriver.push` (one instruction),
:meth:`HostDriver.wait_done` (the per-layer DONE poll), plus
:meth:`HostDriver.stream_weights` (a DataMover command to an HP page: in pccx
the PS drives the DataMovers, the NPU never generates host addresses, reference §2.2).

Register map used (base ``0xA000_0000``; RTL ``AXIL_CMD_IN.sv`` / ``AXIL_STAT_OUT.sv``,
reference §2.1; ERROR and the retired count are emulator additions, see
actors/pccx/frontend.py)::

    write 0x000   push the 64-bit instruction into the 8-deep command FIFO (AW stalls when full)
    write 0x008   push the kick marker 0x8000_0000_0000_0000 (dropped by the decoder)
    read  any     status word: bit0 BUSY, bit1 DONE (sticky), bit2 ERROR, [11:8] error class,
                  [63:32] retired instructions
    +0x1000*(p+1) HP p DataMover page (p = 0..3): CMD_PUSH of {addr, bytes}, 8-deep

Timing: an AXI-Lite access costs the host link's flight time (``axil.latency``
each way, one outstanding access); polling waits ``driver.poll_interval`` between
status reads (doubling after each unsuccessful read up to ``driver.poll_max_interval``,
ASSUMPTION: a uca_sync-style backoff; equal to ``poll_interval`` = fixed period).  ``wait_done`` returns when the retired count equals the
instructions pushed and BUSY is clear.

A ``wait_done`` that sees no completion within ``driver.wait_timeout`` halts the
driver (like ``uca_sync(timeout_us)``, reference §2.4) instead of polling forever.

Errors (strict profile): the error interrupt (``irq`` port) or the ERROR bit
makes the driver log the offending instruction (report ``halted``) and stop.
``kv_init`` records the KV ring cap (``pccx_kv_init``, seed §2 step 4): nothing in
the RTL holds it (reference §5), so it has no hardware effect.  ``start`` raises
the driver's core-enable gate (``pccx_start``): instructions are pushed only after it.
"""
from __future__ import annotations

from actors.pccx.frontend import status_fields
from emulator.actor import Actor
from emulator.declare import In, Out, Param
from protocols import pccx_isa as isa
from protocols.codec import TensorDesc
from protocols.pccx import Ack, AxiRead, AxiReadData, AxiWrite, DdrData, DdrRead, DdrWrite, DmCmd, Irq

__all__ = ["HostDriver", "REG_INSTR", "REG_KICK", "REG_STATUS"]

REG_INSTR, REG_KICK, REG_STATUS = 0x000, 0x008, 0x010
BASE = 0xA000_0000


class DriverHalt(Exception):
    pass


class HostDriver(Actor):
    """Runs ``steps`` (any iterable, e.g. a compiler generator): ``("open",)``, ``("kv_init", n)``,
    ``("start",)``, ``("push", word)``, ``("kick",)``, ``("hp", port, stream, addr, nbytes[, dest[, tag]])``,
    ``("wait", label)``, ``("sleep", ps)``, ``("host", label, ps[, reads, fn])`` (host CPU work: busy ``ps``),
    ``("mark", name, value)`` (a trace mark, e.g. where a prefetch is issued).

    ``where(seq)`` (optional) names the program place of pushed instruction
    ``seq`` (e.g. ``token 0 layer 3 stage attention``) for the halt log."""

    PORTS = (Out("axil_w", AxiWrite, doc="AXI-Lite writes (instructions, kick)"),
             Out("axil_r", AxiRead, doc="AXI-Lite status reads"), In("axil_rd", AxiReadData, doc="the status word"),
             In("irq", Irq, doc="the error interrupt"), Out("hp{p}", DmCmd, doc="DataMover commands of HP port p"),
             Out("ddr_req", DdrRead, DdrWrite, doc="host compute steps' DDR accesses (host_ddr)"),
             In("ddr_resp", DdrData, Ack, doc="their answers"))
    PARAMS = (Param("poll_interval", "driver.poll_interval", "ps", "DONE poll period"),
              Param("poll_max_interval", "driver.poll_max_interval", "ps", "poll backoff cap"),
              Param("wait_timeout", "driver.wait_timeout", "ps", "a DONE wait longer than this halts the driver"),
              Param("hp_ports", "hp.ports", "count", "HP ports it drives"))

    def __init__(self, name: str, *, steps, poll_interval: int, hp_ports: int, wait_timeout: int = 0,
                 where=None, poll_max_interval: int = 0, host_ddr: bool = False):
        super().__init__(name)
        self.axil_w = self.out_port("axil_w")
        self.axil_r = self.out_port("axil_r")
        self.axil_rd = self.in_port("axil_rd")
        self.irq = self.in_port("irq")
        self.hp = [self.out_port(f"hp{p}") for p in range(hp_ports)]
        self.ddr_req = self.out_port("ddr_req") if host_ddr else None
        self.ddr_resp = self.in_port("ddr_resp") if host_ddr else None
        self.steps = steps
        self.poll_interval = poll_interval
        self.wait_timeout = wait_timeout
        self.opened = False
        self.started = False
        self.kv_max_tokens = None
        self.pushed = 0
        self.words: list[int] = []
        self.polls = 0
        self.waits: list = []
        self.halted = None
        self.where = where
        self.poll_max_interval = max(poll_interval, poll_max_interval)
        self.host_spans: list[tuple[int, int, str]] = []   # (start, end, label) of host compute steps

    # -- the API ---------------------------------------------------------------
    async def open(self) -> None:
        """``pccx_open``: map the AXI-Lite window and the DataMover pages."""
        self.opened = True
        self.report("register_map", {"base": BASE, "instr": REG_INSTR, "kick": REG_KICK, "status": "any read",
                                     "hp_pages": [0x1000 * (p + 1) for p in range(len(self.hp))]})

    async def kv_init(self, max_tokens: int) -> None:
        """``pccx_kv_init(handle, max_tokens)``: the KV ring's hard cap (driver state only)."""
        if max_tokens <= 0:
            raise ValueError(f"kv_init: max_tokens must be positive, found {max_tokens}")
        self.kv_max_tokens = max_tokens

    async def start(self) -> None:
        """``pccx_start``: raise core-enable; pushes are allowed from now on."""
        if not self.opened:
            raise RuntimeError("start() before open()")
        self.started = True

    async def push(self, word: int) -> None:
        """Write one instruction to 0x000 (blocks while the command FIFO is full)."""
        if not self.started:
            raise RuntimeError("push() before start()")
        self._check_irq()
        await self.axil_w.send(AxiWrite(REG_INSTR, word))
        self.words.append(word)
        self.pushed += 1

    async def kick(self) -> None:
        await self.axil_w.send(AxiWrite(REG_KICK, isa.KICK_WORD))

    async def stream_weights(self, port: int, stream: int, addr: int, nbytes: int, dest: int = 0,
                             tag: int = -1) -> None:
        """Push a DataMover command to HP ``port``: stream ``nbytes`` at DDR ``addr`` into its weight FIFO,
        with TDEST ``dest`` (the GEMV lane(s) the bursts are for; 0 for the GEMM ports) and TAG ``tag`` (the
        instruction the stream is for, -1 unknown: protocols.pccx.DmCmd)."""
        self._check_irq()
        await self.hp[port].send(DmCmd(stream, addr, nbytes, dest, tag))

    async def read_status(self) -> int:
        await self.axil_r.send(AxiRead(REG_STATUS))
        self.polls += 1
        return (await self.axil_rd.recv()).data

    async def wait_done(self, label: str = "") -> None:
        """Poll the status word until every pushed instruction retired (the per-layer DONE poll)."""
        t0 = self.now
        interval = self.poll_interval
        while True:
            self._check_irq()
            s = status_fields(await self.read_status())
            if s["error"]:
                self._check_irq()   # the interrupt names the instruction; halt with it when it has arrived
                self._halt(None, s["error_code"], "ERROR bit set in the status word")
            if s["retired"] == self.pushed & 0xFFFF_FFFF and not s["busy"]:
                self.waits.append({"label": label, "at_ps": self.now, "waited_ps": self.now - t0,
                                   "done_bit": s["done"]})
                return
            if self.wait_timeout and self.now - t0 >= self.wait_timeout:
                self._halt(None, 0, f"timeout: wait '{label}' saw {self.pushed - s['retired']} of {self.pushed} "
                                    f"instructions not retired after {self.now - t0} ps (an engine waits for "
                                    f"weights or data that never come?)")
            await self.sleep(interval)
            interval = min(2 * interval, self.poll_max_interval)   # backoff (off when max = poll_interval)

    async def host_step(self, label: str, ps: int, reads=(), fn=None) -> None:
        """Host CPU work: read ``reads`` [(addr, nbytes)] from host DDR, compute ``ps``, write what ``fn``
        returns [(addr, uint8 array or byte count)].  DDR traffic is charged on the DDR like any requester."""
        t = self.now
        got = []
        for i, (addr, n) in enumerate(reads):
            await self.ddr_req.send(DdrRead(i, addr, n, i == 0))
            got.append((await self.ddr_resp.recv()).data)
        await self.busy(ps, f"host {label}")
        for i, (addr, data) in enumerate(fn(got) if fn is not None else []):
            if isinstance(data, int):
                data = TensorDesc.of((data,), "u1")
            await self.ddr_req.send(DdrWrite(i, addr, data))
            await self.ddr_resp.recv()
        self.host_spans.append((t, self.now, label))

    # -- errors ----------------------------------------------------------------
    def _check_irq(self) -> None:
        m = self.irq.poll()
        if m is not None:
            self._halt(m.seq, m.code, m.text)

    def _halt(self, seq, code, text) -> None:
        word = self.words[seq] if seq is not None and 0 <= seq < len(self.words) else None
        self.halted = {"at_ps": self.now, "seq": seq, "code": code,
                       "class": isa.ERROR_NAMES.get(code, "timeout" if code == 0 else "?"),
                       "word": f"0x{word:016X}" if word is not None else None, "text": text}
        if word is not None:
            self.halted["instruction"] = isa.disasm_word(word)
        if self.where is not None and seq is not None:
            self.halted["where"] = self.where(seq)
        self.mark("driver_halt", self.halted)
        raise DriverHalt(text)

    # -- the program -----------------------------------------------------------
    async def run(self) -> None:
        try:
            for step in self.steps:
                kind = step[0]
                if kind == "push":
                    await self.push(step[1])
                elif kind == "hp":
                    await self.stream_weights(*step[1:])
                elif kind == "wait":
                    await self.wait_done(step[1])
                elif kind == "sleep":
                    await self.sleep(step[1])
                elif kind == "host":
                    await self.host_step(*step[1:])
                elif kind == "mark":
                    self.mark(step[1], step[2])
                elif kind == "kick":
                    await self.kick()
                elif kind == "open":
                    await self.open()
                elif kind == "kv_init":
                    await self.kv_init(step[1])
                elif kind == "start":
                    await self.start()
                else:
                    raise ValueError(f"unknown driver step {step!r}")
        except DriverHalt:
            self.report("halted", self.halted)
        self.report("pushed", self.pushed)
        self.report("status_polls", self.polls)
        self.report("waits", self.waits)
        if self.kv_max_tokens is not None:
            self.report("kv_max_tokens", self.kv_max_tokens)
