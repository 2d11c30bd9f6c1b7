"""The GEMV unit: a front actor, one actor per lane, and weight switches.

Structure (reference §3 "GEMV" row; ``device_pkg.sv`` ``VecPipelineCnt = 4``)::

    dispatcher --uop--> GemvFront (pccx/gemv) --job--> GemvLane (pccx/gemv/lane0..3) --result--> GemvFront
                          |  L2 port B: x (+ old) read, y write          ^
                          +--> status, e_max                             | weight bursts
    hp{p} --weight FIFO--> lane            (port p feeds one lane)
    hp{p} --weight FIFO--> WeightSwitch (pccx/gemv/wsw{p}) --> lanes     (port p feeds several lanes)

**Wiring** (profile ``gemv.lane_ports``: lane i reads the weight FIFO of HP
``lane_ports[i]``, ``null`` = no FIFO).  As built (rtl profile): HP2 -> lane A,
HP3 -> lane B, lanes C/D get zero weights (``pccx_npu_top.sv``, reference §0, §3).
Documented profile: the docs give HP2/HP3 to the GEMV (``Devices/kv260.rst``) and
four working cores (``gemv_core.rst``) without a lane map; ASSUMPTION: lanes A/B
as in the RTL, C on HP2, D on HP3, a port shared by two lanes feeding them through
an AXI-Stream switch that routes each burst by its TDEST (the lane the driver
named in the DataMover command).

**Split** of one GEMV µop (``lanes_used`` = ``parallel_lane`` if 1..``gemv.lanes``,
else all lanes): output rows in contiguous blocks of ``r = ceil(N / lanes_used)``,
lane i computing rows ``[i*r, min(N, (i+1)*r))`` (ASSUMPTION: the reference gives
no row-to-lane map; ``GemvBatch`` = 512 rows per call is not modelled).  The
host lays each lane's weights out as its own stream: packed INT4 rows then the
rows' BF16 scales, ``bytes_i = ceil(rows_i * K / 2) + 2 * rows_i * w_scale``,
cut by the HP port into bursts of ``hp.burst_beats`` beats.

**Service time** (``Tc`` = core clock period), from the µop's arrival at the front,
weights already in the FIFOs and the L2 port idle::

    T = Tc * [ (ceil(K/8) + Lrd)                            front: activation read, L2 port B
             + accm * (ceil(N/8) + Lrd)                     front: old result read when accm=1
             + max_i ( ceil(32 * B_i / R) + F )             lanes in parallel (B_i = lane i's weight beats)
             + ceil(N/8) ]                                  front: result write, L2 port B

``R = gemv.macs_per_lane`` MAC/clk per lane (32 weights per 128-bit beat;
reference §3: 32 per ``gemv_core.rst``/RTL, the seed's 1024 in the documented
profile, seed §6), ``F = gemv.pipeline_cycles`` (the lane's adder tree drain),
``Lrd = l2.read_latency_cycles``.  A lane charges its MAC time burst by burst,
rounded over its job, not per burst: burst k of lane i costs ``c_k =
ceil(W_k / R) - ceil(W_{k-1} / R)`` cycles, ``W_k = 32 * (beats of the lane's
bursts 1..k)``, ``W_0 = 0`` (so the c_k add up to ``ceil(32 * B_i / R)``; a
burst may cost 0 cycles).  ASSUMPTION, as for the GEMM (compute.py): a lane
consumes its weight stream at R MAC/clk across burst boundaries; a 16-beat
burst (512 weights) is less than one clock at 1024 MAC/clk, and a per-burst
ceil would cap such a lane at 512 MAC/clk.  A burst not yet in the FIFO is waited for: a
weight-starved lane runs at its HP port's rate, and lanes sharing a port share
its rate.  A lane without a FIFO (RTL lanes C/D) computes its rows on zero
weights with the same burst costs c_k, without waiting.  Lanes sharing a FIFO
(documented profile) get their bursts in FIFO order, each lane's stream behind
the previous lane's: the switch passes the first burst of the next lane into
that lane's one-burst output slice as soon as it has handed the previous lane
its last burst, i.e. when the previous lane (k bursts j = 0..k-1, costs c_j as
above) takes its second-to-last one, so the next lane's MACs begin ``sum_{j < k-2} c_j`` cycles
after its job instead of at once (HOL blocking; the per-op test derives this
for parallel_lane=4).  The x broadcast to the
lanes and the partial-result return are free (ASSUMPTION: wires inside the
unit); the switch forwards a burst in zero time (ASSUMPTION: an AXIS switch
moves 1 beat/clk, no slower than the HP port feeding it) and holds at most one
burst per lane (its output link, capacity 1).

**Data**: lane i returns ``float32(W_i @ x) * scale_i`` (the dot products are
accumulated exactly, in float64 — ASSUMPTION standing for the lane's wide
accumulator; the RTL's 27-bit fixed-point e_max alignment, reference §1.6, is not
bit-modelled); the front concatenates the rows, adds ``old`` when ``accm`` and
rounds to BF16.  Rows of an unwired lane are 0 (+ old).  ``findemax`` hands
``max(y)`` to the CVO unit (assumption: the RTL takes e_max from the GEMM
normaliser, reference §1.3).

**Direct GEMV->SFU FIFO** (pccx docs' overlap rule: "the SFU consumes GEMV
output via a direct FIFO"; profile ``cvo.gemv_fifo_words`` = its depth D in L2
words, 0 = none, the RTL top has no such path, reference §3): after the L2
write, a result the scheduler has claimed (a CVO reading it was issued,
``fifo_claim``) and of ``n = ceil(N/8) <= D`` words enters the FIFO; any other
result sends the SFU a data-less notice (result in L2 only).  Credits: the front
starts with D words, spends n per entry and gets them back when the SFU releases
an entry (``credit``, actors/pccx/compute.py); with too few credits the front
waits, so the GEMV retires late: the FIFO back-pressures the GEMV instead of
overwriting results the SFU has not consumed.  The wait is reported as
``sfu_fifo_stall_ps``.  ASSUMPTION: the result enters the FIFO as one entry once
the L2 write is done (the RTL front writes once all lanes finished).  Reverse
direction (same profile switch): a GEMV µop carries the L2 word ranges of the
CVOs in flight at its issue (``after_cvo``, GlobalScheduler); the front waits
until the newest one overlapping its activation words ``[src, src + ceil(K/8))``
has retired (the SFU reports every retirement on ``cvo_done``; it retires in
order) before it reads the activation; the wait is reported as
``cvo_wait_ps``.  The old result an ``accm`` GEMV reads is not checked.
"""
from __future__ import annotations

import numpy as np
import trio

from actors.pccx.compute import mac_cycles, read_operands
from actors.pccx.memory import L2_CLIENT_PORTS
from actors.pccx.numerics import payload_nbytes, from_bf16, to_bf16, unpack_int4
from actors.pccx.profile import declare
from emulator import numerics
from emulator.actor import Actor
from emulator.declare import In, Out, Param
from protocols.codec import TensorDesc
from protocols.pccx import EMax, FifoClaim, FifoCredit, L2Write, LaneJob, LaneResult, Status, Uop, WeightBurst

__all__ = ["GemvFront", "GemvLane", "WeightSwitch", "lanes_used", "lane_rows", "lane_bytes"]



def lanes_used(parallel_lane: int, lanes: int) -> int:
    """Lanes a GEMV uses: ``parallel_lane`` if 1..lanes, else all of them."""
    return parallel_lane if 1 <= parallel_lane <= lanes else lanes


def lane_rows(N: int, used: int) -> list[tuple[int, int]]:
    """(first row, rows) of lanes 0..used-1: contiguous blocks of ceil(N/used) rows (may be 0 rows)."""
    r = -(-N // used)
    return [(min(N, i * r), max(0, min(N, (i + 1) * r) - i * r)) for i in range(used)]


def lane_bytes(rows: int, K: int, w_scale: bool) -> int:
    """Bytes of one lane's weight stream: packed INT4 rows, then the rows' BF16 scales."""
    return (rows * K + 1) // 2 + (2 * rows if w_scale else 0)


class GemvFront(Actor):
    """GEMV control: L2 reads, the row split over the lanes in use, the combine and the result write."""

    daemon = True
    PORTS = (In("uop", Uop, doc="GEMV µops from the dispatcher", idle=True),
             *L2_CLIENT_PORTS,
             Out("status", Status, doc="retirement, to the scheduler"), Out("emax", EMax, doc="findemax result, to the CVO"),
             Out("job{i}", LaneJob, doc="row block of lane i"), In("res{i}", LaneResult, doc="lane i's result"),
             Out("sfu", L2Write, doc="the result, to the SFU's direct FIFO (cvo.gemv_fifo_words > 0)"),
             In("claims", FifoClaim, doc="which GEMV results a CVO will read (from the scheduler)"),
             In("credit", FifoCredit, doc="direct-FIFO credits returned by the SFU"),
             In("cvo_done", Status, doc="CVO retirements (a GEMV waits for the CVO writing its input)"))
    PARAMS = (*declare("cycle_ps", "read_latency_cycles"),
              Param("lanes", "gemv.lanes", "count", "GEMV lanes"),
              Param("emax_out", "cvo.emax_from", "bool", "emax_from != gemm: the GEMV sends its e_max",
                    lambda p: p["cvo"]["emax_from"] != "gemm"),
              Param("sfu_fifo_words", "cvo.gemv_fifo_words", "words", "depth of the GEMV->SFU FIFO (0: none)"))

    def __init__(self, name: str, *, cycle_ps: int, lanes: int, read_latency_cycles: int, data_mode: bool,
                 emax_out: bool = True, sfu_fifo_words: int = 0):
        super().__init__(name)
        # seed §3.2 rule 2: results of up to sfu_fifo_words L2 words also go to the SFU's direct FIFO
        self.sfu_fifo_words = sfu_fifo_words
        self.sfu = self.out_port("sfu") if sfu_fifo_words else None
        self.claims = self.in_port("claims") if sfu_fifo_words else None
        self.credit = self.in_port("credit") if sfu_fifo_words else None
        self.credits = sfu_fifo_words     # free words of the direct FIFO
        self.claimed = -1                 # newest GEMV seq a CVO claimed
        self.fifo_stall_ps = 0
        self.cvo_done = self.in_port("cvo_done") if sfu_fifo_words else None
        self.cvo_retired = -1             # newest CVO seq the SFU retired
        self.cvo_retired_ev = trio.Event()
        self.cvo_wait_ps = 0
        self.emax_out = emax_out   # False: as-built top takes e_max from the GEMM only (reference §1.3)
        self.uop = self.in_port("uop", idle=True)
        self.l2_req = self.out_port("l2_req")
        self.l2_resp = self.in_port("l2_resp")
        self.status = self.out_port("status")
        self.emax = self.out_port("emax")
        self.job = [self.out_port(f"job{i}") for i in range(lanes)]
        self.res = [self.in_port(f"res{i}") for i in range(lanes)]
        self.cycle_ps = cycle_ps
        self.lanes = lanes
        self.read_latency_ps = read_latency_cycles * cycle_ps
        self.data_mode = data_mode

    async def run(self) -> None:
        if self.cvo_done is None:
            await self._serve()
            return
        async with self.subtasks() as n:
            n.start_soon(self._track_cvo)
            await self._serve()

    async def _track_cvo(self) -> None:
        while True:
            self.cvo_retired = max(self.cvo_retired, (await self.cvo_done.recv()).seq)
            self.cvo_retired_ev.set()
            self.cvo_retired_ev = trio.Event()

    async def _after_cvo(self, f: dict, K: int) -> None:
        """Reverse direction (module docstring): wait for the in-flight CVOs that write the activation."""
        lo, hi = f["src_addr"], f["src_addr"] + -(-K // 8)
        need = max((k for k, a, b in f["after_cvo"] if a < hi and lo < b), default=-1)
        t = self.now
        while self.cvo_retired < need:
            await self.cvo_retired_ev.wait()
        if self.now > t:
            self.cvo_wait_ps += self.now - t
            self.report("cvo_wait_ps", self.cvo_wait_ps)

    async def _serve(self) -> None:
        while True:
            u = await self.uop.recv()
            f = u.fields
            start = self.now
            K, N = f["K"], f["N"]
            if "after_cvo" in f:
                await self._after_cvo(f, K)
            x, old = await read_operands(self, f, K, N)
            used = lanes_used(f["parallel_lane"], self.lanes)
            plan = [(i, r0, n) for i, (r0, n) in enumerate(lane_rows(N, used)) if n]
            for i, r0, n in plan:
                await self.job[i].send(LaneJob(u.seq, r0, n, K, bool(f["w_scale"]), x))
            y = np.zeros(N, np.float32) if self.data_mode else None
            streams = []
            for i, r0, n in plan:
                r = await self.res[i].recv()
                if r.seq != u.seq:
                    raise RuntimeError(f"{self.name}: lane {i} returned GEMV#{r.seq} while GEMV#{u.seq} runs")
                streams.append(f"lane{i}:" + (f"w{r.stream}" if r.stream >= 0 else "zero"))
                if self.data_mode:
                    y[r0:r0 + n] = r.y
            if self.data_mode:
                if old is not None:
                    y = (y + from_bf16(old)).astype(np.float32)
                out = to_bf16(y)
            else:
                out = TensorDesc.of((N,), "u2")
            await self.l2_req.send(L2Write(0, f["dest_reg"] * 8, N, out))
            await self.l2_resp.recv()
            if f["findemax"] and self.emax_out:
                bits = int(to_bf16(from_bf16(out).max())) if self.data_mode else 0
                await self.emax.send(EMax(bits))
            if self.sfu is not None:
                await self._to_sfu(u.seq, f["dest_reg"] * 8, N, out)
            await self.status.send(Status("retire", "GEMV", u.seq, 0, start, self.now, " ".join(streams)))


    async def _to_sfu(self, seq: int, elem: int, N: int, out) -> None:
        """Direct FIFO (module docstring): a claimed result that fits enters it once the credits allow,
        any other result sends a notice (``nelem`` 0); ``req`` = the GEMV's seq."""
        while (c := self.claims.poll()) is not None:
            self.claimed = max(self.claimed, c.seq)
        while (c := self.credit.poll()) is not None:
            self.credits += c.words
        words = -(-N // 8)
        if self.claimed != seq or words > self.sfu_fifo_words:
            await self.sfu.send(L2Write(seq, elem, 0, None))
            return
        t = self.now
        while self.credits < words:   # back-pressure: wait until the SFU releases older entries
            self.credits += (await self.credit.recv()).words
        if self.now > t:
            self.fifo_stall_ps += self.now - t
            self.report("sfu_fifo_stall_ps", self.fifo_stall_ps)
        self.credits -= words
        await self.sfu.send(L2Write(seq, elem, N, out))


class GemvLane(Actor):
    """One GEMV lane: ``macs_per_lane`` MAC/clk on the bursts of its weight FIFO (none: zero weights)."""

    daemon = True
    PORTS = (In("job", LaneJob, doc="row blocks from the GEMV front", idle=True),
             In("w", WeightBurst, doc="its weight FIFO (or switch output)"),
             Out("res", LaneResult, doc="the block's result"))
    PARAMS = (*declare("cycle_ps"),
              Param("macs_per_lane", "gemv.macs_per_lane", "MAC/clk", "MACs per lane per cycle"),
              Param("pipeline_cycles", "gemv.pipeline_cycles", "cycles", "lane pipeline depth"),
              Param("burst_bytes", ("hp.burst_beats", "hp.beat_bytes", "hp.chunk_bursts"), "B",
                    "one FIFO message: burst_beats x beat_bytes x chunk_bursts",
                    lambda p: p["hp"]["burst_beats"] * p["hp"]["beat_bytes"] * p["hp"]["chunk_bursts"]),
              Param("beat_bytes", "hp.beat_bytes", "B", "bytes per AXI beat"))

    def __init__(self, name: str, *, index: int, cycle_ps: int, macs_per_lane: int, pipeline_cycles: int,
                 burst_bytes: int, beat_bytes: int, wired: bool, data_mode: bool):
        super().__init__(name)
        self.index = index
        self.job = self.in_port("job", idle=True)
        self.res = self.out_port("res")
        self.w = self.in_port("w") if wired else None
        self.cycle_ps = cycle_ps
        self.rate = macs_per_lane
        self.pipeline_cycles = pipeline_cycles
        self.burst_bytes = burst_bytes
        self.beat_bytes = beat_bytes
        self.data_mode = data_mode
        self.spans: list[tuple[int, int, int, int]] = []   # (start, end, seq, stream) of every MAC span
        self.zero_rows = 0

    def _burst_cycles(self, done_beats: int, beats: int) -> int:
        """Cycles of a burst of ``beats`` after ``done_beats`` beats of the same job (module docstring)."""
        return mac_cycles(done_beats, beats, self.rate)

    async def run(self) -> None:
        while True:
            j = await self.job.recv()
            total = lane_bytes(j.rows, j.K, j.w_scale)
            stream = -1
            done = 0   # beats of this job already charged
            if self.w is None:
                # RTL lanes C/D: zero weights, computed at the lane's rate, nothing to wait for
                self.zero_rows += j.rows
                label = f"GEMV#{j.seq} zero"
                for off in range(0, total, self.burst_bytes):
                    t = self.now
                    beats = -(-min(self.burst_bytes, total - off) // self.beat_bytes)
                    await self.busy(self._burst_cycles(done, beats) * self.cycle_ps, label)
                    done += beats
                    self.spans.append((t, self.now, j.seq, stream))
                blob = np.zeros(total, np.uint8) if self.data_mode else None
            else:
                got, chunks = 0, []
                while got < total:
                    b = await self.w.recv()
                    if b.dest != self.index:
                        raise RuntimeError(f"{self.name}: GEMV#{j.seq} received a burst for lane {b.dest} "
                                           f"(driver named the wrong lane / HP port?)")
                    if stream < 0:
                        stream = b.stream
                    elif b.stream != stream:
                        raise RuntimeError(f"{self.name}: GEMV#{j.seq} expected weight stream {stream}, the FIFO "
                                           f"holds stream {b.stream} (driver streamed the wrong byte count?)")
                    got += payload_nbytes(b.data)
                    if self.data_mode:
                        chunks.append(np.asarray(b.data, np.uint8))
                    t = self.now
                    await self.busy(self._burst_cycles(done, b.beats) * self.cycle_ps, f"GEMV#{j.seq} w{stream}")
                    done += b.beats
                    self.spans.append((t, self.now, j.seq, stream))
                if got != total:
                    raise RuntimeError(f"{self.name}: GEMV#{j.seq} received {got} weight bytes for "
                                       f"{j.rows} rows, expected {total}")
                blob = np.concatenate(chunks) if self.data_mode else None
            await self.busy(self.pipeline_cycles * self.cycle_ps, f"GEMV#{j.seq} drain")
            y = self._compute(blob, j.x, j.rows, j.K, j.w_scale) if self.data_mode else TensorDesc.of((j.rows,), "f4")
            await self.res.send(LaneResult(j.seq, self.index, stream, y))

    @staticmethod
    def _compute(blob: np.ndarray, x_bits, rows: int, K: int, w_scale: bool) -> np.ndarray:
        nw = (rows * K + 1) // 2
        W = unpack_int4(blob[:nw], rows * K).reshape(rows, K)
        y = numerics.matmul(W, from_bf16(x_bits), acc=np.float64).astype(np.float32)
        if w_scale:
            y = (y * from_bf16(blob[nw:nw + 2 * rows].view(np.uint16))).astype(np.float32)
        return y


class WeightSwitch(Actor):
    """AXI-Stream switch after a weight FIFO shared by several lanes: routes each burst by its TDEST."""

    daemon = True
    PORTS = (In("in", WeightBurst, doc="the shared weight FIFO", idle=True),
             Out("lane{i}", WeightBurst, doc="to lane i"))

    def __init__(self, name: str, *, port: int, lanes: list[int]):
        super().__init__(name)
        self.port = port
        self.inp = self.in_port("in", idle=True)
        self.out = {i: self.out_port(f"lane{i}") for i in lanes}

    async def run(self) -> None:
        while True:
            b = await self.inp.recv()
            out = self.out.get(b.dest)
            if out is None:
                raise RuntimeError(f"{self.name}: burst of stream {b.stream} for lane {b.dest}, but HP{self.port} "
                                   f"feeds lanes {sorted(self.out)} (gemv.lane_ports)")
            await out.send(b)
