"""Compute engines: GEMM (32x32 systolic array) and CVO/SFU.  The GEMV unit
(front + 4 lane actors) is in actors/pccx/gemv.py.

**MatEngine** (the GEMM; ``Tc`` = core clock period).  Per instruction, from
the µop's arrival (weights already in the FIFO, ports idle)::

    T = Tc * [ (ceil(K/8) + Lrd)                         activation read, L2 port B (Lrd = l2.read_latency_cycles)
             + accm * (ceil(N/8) + Lrd)                  old result read when accm=1
             + ceil(32 * B / R)                          MACs: B = the op's weight beats, 32 INT4 weights per 128-bit beat
             + F                                          pipeline drain
             + ceil(N/8) ]                                result write, L2 port B

* ``R = gemm.macs_per_cycle``, ``F = gemm.fill_cycles``
  (``SYSTOLIC_TOTAL_LATENCY 64``), N = 32 outputs = 4 L2 words ("one-row result
  contract", reference §1.6).  32 weights per beat: reference §3 (128-bit beat
  = 32 INT4).
* The MAC time is charged burst by burst, rounded over the op, not per burst:
  burst k costs ``ceil(W_k / R) - ceil(W_{k-1} / R)`` cycles, ``W_k = 32 *
  (beats of bursts 1..k)`` (``W_0 = 0``), so the costs add up to ``ceil(32 * B
  / R)``.  ASSUMPTION: the array consumes the weight stream at R MAC/clk across
  burst boundaries (a burst is the HP transfer unit, not a compute unit; a
  16-beat burst is only 512 weights, less than one clock of a 1024/2048 MAC/clk
  array).  A burst can thus cost 0 cycles.
* A burst that is not yet in the weight FIFO is waited for: a weight-starved
  engine runs at the HP ports' rate.  Bursts are taken round-robin from the
  engine's HP ports (``gemm.hp_ports``: HP0, HP1 — reference §3), in the order
  the driver split the stream.
* Data: ``y = (W_int4 @ x) * scale`` (per-channel BF16 scale when ``w_scale``,
  else 1), ``+ old`` when ``accm``, rounded to BF16.  ``findemax`` hands
  ``max(y)`` to the CVO unit as its ``e_max`` (reference §1.3: the RTL takes
  e_max from the GEMM normaliser).

**Cvo** (``CVO_top`` + ``mem_CVO_stream_bridge``, reference §1.3)::

    T = Tc * [ words(src, L) * Crd                      stream-bridge read phase on L2 port B
             + lat_f + (func == REDUCE_SUM) * L * Cred   function pipeline (REDUCE_SUM: 1 elem/clk serial add)
             + 1                                          CVO_top output register
             + out * Cwr                                  write phase per result element
             + words(dst, out) ]                          result write, L2 port B

Direct GEMV->SFU FIFO (profile ``cvo.gemv_fifo_words`` = depth D > 0; the pccx docs' Gemma 3N
pipeline: "the SFU consumes GEMV output via a direct FIFO"; the RTL top has no such path, reference
§3): a CVO the scheduler tagged ``fifo_seq`` (its source reaches the output of the last GEMV issued
before it) waits for that GEMV's result instead of the program polling DONE.  The GEMV sends each
result piece (a lane's result in a head-parallel GEMV, else the whole result) as a FIFO entry when
its L2 write-back starts (claimed results that fit) and a ``written`` notice when the piece is in L2
(actors/pccx/gemv.py).  A tagged CVO with ``fifo_data`` whose operand lies inside one entry streams
it from the FIFO as soon as the entry is there: the read phase costs ``words(src, L)`` cycles (1
word/clk, ASSUMPTION: the FIFO pops one 128-bit word per clock, as the bridge's documented 1
elem/clk x 8) instead of ``words * Crd``; any other tagged CVO (operand not in one entry, or partly
rewritten by a CVO after the GEMV: ``fifo_data`` false) reads L2 once the pieces up to its operand's
end are written.  Release (credit return to the GEMV unit): when the SFU starts a tagged CVO, every
entry of an older GEMV and every entry of the same GEMV that ends at or before the operand's start is
released (ASSUMPTION: a program reads a result's pieces in order, the scheduler tags in issue order,
so no later CVO reads them; several CVOs may read one entry, e.g. the EXP chunks of one score
vector); an entry that overlaps the operand without covering it is released too (no single entry can
serve it).  Entries are released before the SFU waits, so the FIFO cannot deadlock.

``e_max`` (``sub_emax``): each findemax result comes with its L2 range (:class:`EMax`); an EXP uses the
newest one whose range holds its first source element, else the newest of all (the single register of
the RTL, which takes it from the GEMM normaliser, reference §1.3).

``Crd`` = ``cvo.read_cycles_per_word`` (RTL bridge ≈17 per 8 elements; docs
1 elem/clk = 8), ``Cwr`` = ``cvo.write_cycles_per_element`` (RTL 1, docs 0:
overlapped), ``lat_f`` = ``cvo.latency[func]``.  ``out`` = 1 for REDUCE_SUM,
L-1 for SCALE (the first streamed element is the scalar), else L.  CVO
addresses are element addresses (8 BF16 per word, reference §1.6).
"""
from __future__ import annotations

import numpy as np
import trio

from actors.pccx.memory import L2_CLIENT_PORTS, words_touched
from actors.pccx.numerics import WEIGHTS_PER_BEAT, payload_nbytes, cvo_apply, from_bf16, to_bf16, unpack_int4
from actors.pccx.profile import declare
from emulator import numerics
from emulator.actor import Actor
from emulator.declare import In, Out, Param
from protocols import pccx_isa as isa
from protocols.codec import TensorDesc
from protocols.pccx import EMax, FifoCredit, FifoPiece, L2Read, L2Write, Status, Uop, WeightBurst

__all__ = ["MatEngine", "Cvo", "mat_cycles", "mac_cycles", "cvo_cycles"]



def mat_cycles(K: int, N: int, burst_beats: list[int], rate: int, fill: int, read_latency: int, accm: bool) -> int:
    """The closed form of the MatEngine docstring, in core cycles (weights already buffered)."""
    wx, wy = -(-K // 8), -(-N // 8)
    return ((wx + read_latency) + (wy + read_latency if accm else 0)
            + mac_cycles(0, sum(burst_beats), rate) + fill + wy)


def mac_cycles(done_beats: int, beats: int, rate: int) -> int:
    """Cycles of a burst of ``beats`` beats after ``done_beats`` beats of the same op, at ``rate`` MAC/clk:
    ``ceil(32 * (done + beats) / R) - ceil(32 * done / R)`` (rounded over the op; module docstring)."""
    def upto(b: int) -> int:
        return -(-WEIGHTS_PER_BEAT * b // rate)
    return upto(done_beats + beats) - upto(done_beats)


def cvo_cycles(func: str, src: int, dst: int, length: int, cfg: dict) -> int:
    """The closed form of the Cvo docstring, in core cycles."""
    out = 1 if func == "REDUCE_SUM" else max(length - 1, 0) if func == "SCALE" else length
    c = words_touched(src, length) * cfg["read_cycles_per_word"] + cfg["latency"][func]
    if func == "REDUCE_SUM":
        c += length * cfg["reduce_cycles_per_element"]
    return c + cfg["output_register_cycles"] + out * cfg["write_cycles_per_element"] + words_touched(dst, out)


async def read_operands(engine: Actor, f: dict, K: int, N: int):
    """The activation (K elements at ``src_addr``) and, with ``accm``, the old result (N at ``dest_reg``).

    Each is one L2 port-B read plus the L2 read latency (the ``ceil(K/8) + Lrd``
    and ``accm * (ceil(N/8) + Lrd)`` terms of the module formula; a head-parallel
    GEMV reads all its lanes' activations / old results in one span each).  ``engine``
    has ports ``l2_req``/``l2_resp`` and ``read_latency_ps`` (MatEngine, GemvFront).
    """
    async def read(elem: int, n: int):
        await engine.l2_req.send(L2Read(0, elem, n, 1))
        d = await engine.l2_resp.recv()
        await engine.sleep(engine.read_latency_ps)
        return d.data

    x = await read(f["src_addr"] * 8, K)
    old = await read(f["dest_reg"] * 8, N) if f["accm"] else None
    return x, old


class MatEngine(Actor):
    """The GEMM systolic array (``lanes`` x ``macs_per_lane`` MAC/clk); see the module docstring."""
    STATE = ("macs", "next_port")   # what a state snapshot shows (emulator/snapshot.py)

    daemon = True
    PORTS = (In("uop", Uop, doc="GEMM µops from the dispatcher", idle=True),
             In("w{i}", WeightBurst, doc="weight FIFO i (gemm.hp_ports)"),
             *L2_CLIENT_PORTS,
             Out("status", Status, doc="retirement, to the scheduler"),
             Out("emax", EMax, doc="findemax result (normaliser), to the CVO"))
    PARAMS = (*declare("cycle_ps", "read_latency_cycles"),
              Param("weight_ports", "gemm.hp_ports", "count", "weight FIFOs feeding the array",
                    lambda p: len(p["gemm"]["hp_ports"])),
              Param("macs_per_lane", "gemm.macs_per_cycle", "MAC/clk", "MACs per cycle"),
              Param("fill_cycles", "gemm.fill_cycles", "cycles", "array fill per µop"))

    def __init__(self, name: str, *, op: str, cycle_ps: int, weight_ports: int, lanes: int, macs_per_lane: int,
                 fill_cycles: int, read_latency_cycles: int, data_mode: bool):
        super().__init__(name)
        self.op = op
        self.uop = self.in_port("uop", idle=True)
        self.w = [self.in_port(f"w{i}") for i in range(weight_ports)]
        self.l2_req = self.out_port("l2_req")
        self.l2_resp = self.in_port("l2_resp")
        self.status = self.out_port("status")
        self.emax = self.out_port("emax")
        self.cycle_ps = cycle_ps
        self.lanes = lanes
        self.macs_per_lane = macs_per_lane
        self.fill_cycles = fill_cycles
        self.read_latency_ps = read_latency_cycles * cycle_ps
        self.data_mode = data_mode
        self.next_port = 0
        self.spans: list[tuple[int, int, int, int]] = []   # (start, end, seq, stream) of every MAC span
        self.macs = 0      # N x K of every µop, the energy model's count (actors/pccx/energy.py)

    def rate(self, parallel_lane: int) -> int:
        """MAC/clk (the GEMM ignores ``parallel_lane``)."""
        return self.macs_per_lane * self.lanes

    async def run(self) -> None:
        while True:
            u = await self.uop.recv()
            f = u.fields
            start = self.now
            K, N = f["K"], f["N"]
            x, old = await read_operands(self, f, K, N)
            total = (N * K + 1) // 2 + (2 * N if f["w_scale"] else 0)
            rate = self.rate(f["parallel_lane"])
            got = 0
            beats_done = 0
            chunks = []
            stream = None
            label = None
            while got < total:
                b = await self.w[self.next_port].recv()
                self.next_port = (self.next_port + 1) % len(self.w)
                if b.tag >= 0 and b.tag != u.seq:
                    raise RuntimeError(f"{self.name}: {self.op}#{u.seq} reads weight stream {b.stream}, which the "
                                       f"driver streamed for instruction #{b.tag} (" + (
                                           f"instruction #{b.tag} never reached the {self.op} unit: dropped or "
                                           f"rejected on its way, see the status block)" if b.tag < u.seq else
                                           f"{self.op}#{u.seq}'s own weights never reached the FIFO)"))
                if stream is None:
                    stream = b.stream
                    label = f"{self.op}#{u.seq} w{stream}"
                elif b.stream != stream:
                    raise RuntimeError(f"{self.name}: {self.op}#{u.seq} expected weight stream {stream}, the FIFO "
                                       f"holds stream {b.stream} (driver streamed the wrong byte count?)")
                got += payload_nbytes(b.data)
                if self.data_mode:
                    chunks.append(np.asarray(b.data, np.uint8))
                t = self.now
                await self.busy(mac_cycles(beats_done, b.beats, rate) * self.cycle_ps, label)
                beats_done += b.beats
                self.spans.append((t, self.now, u.seq, stream))
            if got != total:
                raise RuntimeError(f"{self.name}: {self.op}#{u.seq} received {got} weight bytes, expected {total}")
            await self.busy(self.fill_cycles * self.cycle_ps, f"{self.op}#{u.seq} drain")
            self.macs += N * K
            if self.data_mode:
                y = self._compute(np.concatenate(chunks), x, old, N, K, bool(f["w_scale"]))
                out = to_bf16(y)
            else:
                out = TensorDesc.of((N,), "u2")
            await self.l2_req.send(L2Write(0, f["dest_reg"] * 8, N, out))
            await self.l2_resp.recv()
            if f["findemax"]:
                bits = int(to_bf16(from_bf16(out).max())) if self.data_mode else 0
                await self.emax.send(EMax(bits, f["dest_reg"] * 8, N))
            await self.status.send(Status("retire", self.op, u.seq, 0, start, self.now, f"w{stream}"))

    @staticmethod
    def _compute(blob: np.ndarray, x_bits, old_bits, N: int, K: int, w_scale: bool) -> np.ndarray:
        nw = (N * K + 1) // 2
        W = unpack_int4(blob[:nw], N * K).reshape(N, K)
        y = numerics.matmul(W, from_bf16(x_bits), acc=np.float32)
        if w_scale:
            y = y * from_bf16(blob[nw:nw + 2 * N].view(np.uint16))
        if old_bits is not None:
            y = y + from_bf16(old_bits)
        return y.astype(np.float32)


class Cvo(Actor):
    """The CVO/SFU unit with its L2 stream bridge; see the module docstring."""
    STATE = ("fifo_entries", "done_seq", "fifo_hits", "elements")   # what a state snapshot shows (emulator/snapshot.py)

    daemon = True
    PORTS = (In("uop", Uop, doc="CVO µops from the scheduler", idle=True),
             In("emax", EMax, doc="e_max from the GEMV / GEMM"),
             *L2_CLIENT_PORTS,
             Out("status", Status, doc="retirement / drop, to the scheduler"),
             In("fifo", FifoPiece, doc="GEMV result pieces / written notices on the direct FIFO (cvo.gemv_fifo_words > 0)"),
             Out("credit", FifoCredit, doc="direct-FIFO words released, to the GEMV front (credit return)"),
             Out("retired", Status, doc="a copy of each retirement, to the GEMV front (reverse direction)"))
    PARAMS = (*declare("cycle_ps"),
              Param("cfg", "cvo", "table", "the cvo section: per-function latency, read/write/reduce cycles, "
                    "max_length, gelu_form, emax_from, tanh, gemv_fifo_words"))

    def __init__(self, name: str, *, cycle_ps: int, cfg: dict, data_mode: bool):
        super().__init__(name)
        self.uop = self.in_port("uop", idle=True)
        self.emax_in = self.in_port("emax")
        self.l2_req = self.out_port("l2_req")
        self.l2_resp = self.in_port("l2_resp")
        self.status = self.out_port("status")
        self.cycle_ps = cycle_ps
        self.cfg = cfg
        self.data_mode = data_mode
        self.fifo = self.in_port("fifo") if cfg.get("gemv_fifo_words") else None
        self.credit = self.out_port("credit") if cfg.get("gemv_fifo_words") else None
        self.retired = self.out_port("retired") if cfg.get("gemv_fifo_words") else None   # -> GEMV unit
        self.fifo_entries: dict[tuple[int, int], FifoPiece] = {}   # (GEMV seq, elem) -> entry held in the FIFO
        self.written: dict[int, int] = {}       # GEMV seq -> end element of its last piece written to L2
        self.done_seq = -1                      # newest GEMV seq whose last piece is written
        self.fifo_arrived = trio.Event()
        self.fifo_hits = 0
        self.fifo_hits_by: dict[str, int] = {}
        self.elements = 0  # elements streamed through the SFU, the energy model's count (actors/pccx/energy.py)
        self.emax_log: list[tuple[int, int, int]] = []   # (elem, nelem, bits) of recent findemax results, newest last

    async def run(self) -> None:
        if self.fifo is None:
            await self._serve()
            return
        async with self.subtasks() as n:
            n.start_soon(self._drain)
            await self._serve()

    async def _drain(self) -> None:
        while True:
            m = await self.fifo.recv()
            if not m.written:
                self.fifo_entries[(m.seq, m.elem)] = m
            else:
                self.written[m.seq] = m.elem + m.nelem
                if m.last:
                    self.done_seq = max(self.done_seq, m.seq)
                    for k in [k for k in self.written if k < m.seq]:
                        del self.written[k]
            self.fifo_arrived.set()
            self.fifo_arrived = trio.Event()

    async def _release(self, keep) -> None:
        freed = 0
        for k in [k for k, m in self.fifo_entries.items() if not keep(m)]:
            freed += -(-self.fifo_entries.pop(k).nelem // 8)
        if freed:
            await self.credit.send(FifoCredit(freed))

    async def _from_fifo(self, seq: int, src: int, L: int, use_data: bool, func: str):
        """Rule 2 (module docstring): release passed entries, then wait for GEMV ``seq``'s result; its
        elements [src, src+L) from the FIFO, or None once they are in L2 (read there)."""
        await self._release(lambda m: m.seq > seq or (m.seq == seq and m.elem + m.nelem > src))
        while True:
            mine = [m for m in self.fifo_entries.values() if m.seq == seq]
            hit = next((m for m in mine if m.elem <= src and src + L <= m.elem + m.nelem), None) if use_data else None
            if hit is not None:
                self.fifo_hits += 1
                self.report("fifo_hits", self.fifo_hits)
                self.fifo_hits_by[func] = self.fifo_hits_by.get(func, 0) + 1
                self.report("fifo_hits_by_func", dict(self.fifo_hits_by))
                if self.data_mode:
                    return np.asarray(hit.data)[src - hit.elem:src - hit.elem + L]
                return TensorDesc.of((L,), "u2")
            if any(m.elem < src + L for m in mine):   # overlaps the operand without covering it: of no use
                await self._release(lambda m: m.seq != seq or m.elem >= src + L)
            if self.done_seq >= seq or self.written.get(seq, -1) >= src + L:
                return None
            await self.fifo_arrived.wait()

    def _emax(self, src: int) -> int:
        """e_max for an EXP reading from element ``src`` (module docstring)."""
        for elem, n, bits in reversed(self.emax_log):
            if elem <= src < elem + n:
                return bits
        return self.emax_log[-1][2] if self.emax_log else 0

    async def _serve(self) -> None:
        cfg = self.cfg
        while True:
            u = await self.uop.recv()
            f = u.fields
            direct = None
            if "fifo_seq" in f:   # rule 2: the operand comes from the GEMV's result, no DONE poll before
                direct = await self._from_fifo(f["fifo_seq"], f["src_addr"], f["length"], f["fifo_data"],
                                               isa.CVO_NAMES.get(f["cvo_func"], "TANH"))
            while (e := self.emax_in.poll()) is not None:
                self.emax_log = self.emax_log[-15:] + [(e.elem, e.nelem, e.bits)]
            emax_bits = self._emax(f["src_addr"]) if f["sub_emax"] else None
            start = self.now
            func = isa.CVO_NAMES.get(f["cvo_func"])
            if func is None and cfg["tanh"] and f["cvo_func"] == isa.CVO_EXT_FUNCS["TANH"]:
                func = "TANH"   # what-if SFU function (profile cvo.tanh)
            L = f["length"]
            if func is None:   # rtl profile: CVO_top falls back to idle on a reserved function
                await self._done(Status("drop", "CVO", u.seq, isa.ERR_RESERVED_BITS, start, self.now,
                                        f"cvo_func={f['cvo_func']} reserved"))
                continue
            out_n = 1 if func == "REDUCE_SUM" else max(L - 1, 0) if func == "SCALE" else L
            if direct is not None:
                await self.busy(words_touched(f["src_addr"], L) * self.cycle_ps, f"CVO#{u.seq} FIFO read")
                data = direct
            else:
                await self.l2_req.send(L2Read(0, f["src_addr"], L, cfg["read_cycles_per_word"]))
                data = (await self.l2_resp.recv()).data
            c = cfg["latency"][func] + cfg["output_register_cycles"] + out_n * cfg["write_cycles_per_element"]
            if func == "REDUCE_SUM":
                c += L * cfg["reduce_cycles_per_element"]
            await self.busy(c * self.cycle_ps, f"CVO#{u.seq} {func}")
            self.elements += L
            if self.data_mode:
                out = cvo_apply(func, data, emax_bits=emax_bits,
                                recip_scale=bool(f["recip_scale"]), gelu_form=cfg["gelu_form"])
            else:
                out = TensorDesc.of((out_n,), "u2")
            if out_n:
                await self.l2_req.send(L2Write(0, f["dst_addr"], out_n, out))
                await self.l2_resp.recv()
            await self._done(Status("retire", "CVO", u.seq, 0, start, self.now, func))

    async def _done(self, m: Status) -> None:
        """Completion to the scheduler and, with the direct FIFO, to the GEMV unit (reverse direction)."""
        await self.status.send(m)
        if self.retired is not None:
            await self.retired.send(m)
