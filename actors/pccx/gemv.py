"""The GEMV unit: a front actor, one actor per lane, and weight switches.

Structure (reference §3 "GEMV" row; ``device_pkg.sv`` ``VecPipelineCnt = 4``)::

    dispatcher --uop--> GemvFront (pccx/gemv) --job--> GemvLane (pccx/gemv/lane0..3) --result--> GemvFront
                          |  L2 port B: x (+ old) read, y write          ^
                          +--> status, e_max, direct FIFO to the SFU     | weight bursts
    hp{p} --weight FIFO--> lane            (port p feeds one lane)
    hp{p} --weight FIFO--> WeightSwitch (pccx/gemv/wsw{p}) --> lanes     (port p feeds several lanes)

**Wiring** (profile ``gemv.lane_ports``: lane i reads the weight FIFO of HP
``lane_ports[i]``, ``null`` = no FIFO).  As built (rtl profile): HP2 -> lane A,
HP3 -> lane B, lanes C/D get zero weights (``pccx_npu_top.sv``, reference §0, §3).
Documented profile: the docs give HP2/HP3 to the GEMV (``Devices/kv260.rst``) and
four working cores (``gemv_core.rst``) without a lane map; ASSUMPTION: lanes A/B
as in the RTL, C on HP2, D on HP3, a port shared by two lanes feeding them through
an AXI-Stream switch that routes each burst by its TDEST (the lane the driver
named in the DataMover command).  With ``gemv.head_parallel`` every GEMV port's
switch reaches every wired lane (a 2 x 4 interconnect, ASSUMPTION) and a TDEST of
``MULTICAST | lane mask`` hands each burst to every lane of the mask (an AXIS
broadcast: the switch passes a burst on when all those lanes took it).

**Modes** (``parallel_lane``, 5 bits: "selects the number of active cores and the
partition axis", pccx docs ``gemv_core.rst`` §4; the bit assignment is an ASSUMPTION:
bits [3:0] = lanes used, 1..``gemv.lanes``, else all; bit 4 = head axis):

* row parallelism (bit 4 clear, the only mode the RTL has): output rows in
  contiguous blocks of ``r = ceil(N / lanes_used)``, lane i computing rows
  ``[i*r, min(N, (i+1)*r))`` (ASSUMPTION: the reference gives no row-to-lane map),
  every lane on the same activation (the broadcast fmap: ``GEMV_top.sv`` builds one
  ``GEMV_generate_lut`` from ``IN_fmap_broadcast`` for all four reduction branches);
  each lane's rows are its own weight stream on its port.
* head parallelism (bit 4 set, profile ``gemv.head_parallel``; docs ``gemv_core.rst``
  §4 "Head Parallelism: four cores handle different Multi-Head Attention heads, both
  activation (Q) and weights partitioned along the head axis"): lane i computes all
  N rows on its own activation, the K elements at ``src_addr + i * ceil(K/8)`` words,
  and writes them at ``dest_reg + i * S`` words, ``S = max(ceil(N/8), Z)`` with Z the
  weight-shape RAM's Z at ``size_ptr_addr`` (ASSUMPTION: the docs give no addressing).
  The lanes share one weight stream: for grouped-query attention the query heads of
  a KV head read the same K (and V) rows, so the driver streams them once, dealt over
  the GEMV's HP ports (:func:`port_split`: the first part on the lowest port) and
  multicast to the lanes; each lane takes its part of every port (``quota``).  The
  RTL has no such mode (one fmap LUT for all lanes), so the rtl profile leaves
  ``gemv.head_parallel`` off and the program streams a KV head once per query head.

**Weight layout** (one stream per lane in row mode, one for all lanes in head mode):
chunk-major, the order the RTL lane consumes beats in (``GEMV_accumulate.sv``: every
beat's reduction-tree sum goes to result slot ``res_vec_idx``, which advances every
beat, so consecutive beats are consecutive output rows and the 32 fmap elements
change once per pass over the rows): for each 32-element slice of K (one 128-bit
beat of 32 INT4 per row, a row's last slice zero-padded), the rows' beats in row
order; then the rows' BF16 scales: ``bytes = rows * 16 * ceil(K/32) + 2 * rows *
w_scale`` (:func:`lane_bytes`).  ``GemvBatch`` = 512 rows per pass is not modelled
(ASSUMPTION: a lane accumulates all its rows).  The KV ring relies on it: a ring
of slots stored along K (V^T) has its valid prefix in contiguous DDR bytes.

**Service time** (``Tc`` = core clock period; G = lanes in a head-parallel GEMV, else 1),
from the µop's arrival at the front, weights already in the FIFOs and the L2 port idle::

    T = Tc * [ (ceil(K/8) * G + Lrd)                          front: activation read, L2 port B
             + accm * (ceil(N/8) + (G-1) * S + Lrd)           front: old result read when accm=1
             + max_i ( ceil(32 * B_i / R) + F )               lanes in parallel (B_i = beats lane i takes)
             + ceil(N/8) * G ]                                front: result write(s), L2 port B

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
its rate (a head-parallel lane takes the bursts of both ports as they come).
A lane without a FIFO (RTL lanes C/D) computes its rows on zero
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

**Data**: lane i returns ``float32(W_i @ x_i) * scale_i`` (the dot products are
accumulated exactly, in float64 — ASSUMPTION standing for the lane's wide
accumulator; the RTL's 27-bit fixed-point e_max alignment, reference §1.6, is not
bit-modelled); the front concatenates the rows (row mode), adds ``old`` when ``accm``
and rounds to BF16.  Rows of an unwired lane are 0 (+ old).  ``findemax`` hands
``max(y)`` of each result piece (a lane's result in head mode, else the whole
result) to the CVO unit with the piece's L2 range (assumption: the RTL takes e_max
from the GEMM normaliser, reference §1.3).

**Direct GEMV->SFU FIFO** (pccx docs' overlap rule 2: "the SFU consumes GEMV
output via a direct FIFO", seed §3.2: the results go to L2 and, through the FIFO,
to the SFU at once; profile ``cvo.gemv_fifo_words`` = its depth D in L2 words, 0 =
none, the RTL top has no such path, reference §3).  The front keeps every claim
the scheduler sends (``claims``: a CVO reading GEMV seq's result was issued) in
order; a claimed GEMV's pieces of ``n = ceil(N/8) <= D`` words each enter the FIFO
as :class:`FifoPiece` entries, each as its L2 write-back starts (the FIFO and the L2
port take the same words, one per clock, so the SFU, reading one word per clock,
can start on word 0 while the rest is written and never overtakes the write);
after each piece's write a ``written`` notice follows (every GEMV, claimed or not:
a CVO that reads L2 waits for it).  Credits: the front starts with D words,
spends n per entry and gets them back when the SFU releases an entry (``credit``,
actors/pccx/compute.py); with too few credits the front waits before the piece's
write-back, so the GEMV retires late: the FIFO back-pressures the GEMV instead of
overwriting results the SFU has not consumed (``sfu_fifo_stall_ps``).  Reverse
direction (same profile switch): a GEMV µop carries the L2 word ranges of the CVOs
in flight at its issue (``after_cvo``, GlobalScheduler); the front waits until the
newest one overlapping its activation words ``[src, src + G * ceil(K/8))`` has
retired (the SFU reports every retirement on ``cvo_done``; it retires in order)
before it reads the activation (``cvo_wait_ps``).  The old result an ``accm``
GEMV reads is not checked.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import trio

from actors.pccx.compute import mac_cycles, read_operands
from actors.pccx.memory import L2_CLIENT_PORTS
from actors.pccx.numerics import WEIGHTS_PER_BEAT, payload_nbytes, from_bf16, pack_int4, to_bf16, unpack_int4
from actors.pccx.profile import declare
from emulator import numerics
from emulator.actor import Actor
from emulator.declare import In, Out, Param
from protocols.codec import TensorDesc
from protocols.pccx_isa import HEAD_AXIS, gemv_mode
from protocols.pccx import EMax, FifoClaim, FifoCredit, FifoPiece, L2Write, LaneJob, LaneResult, Status, Uop, WeightBurst

__all__ = ["GemvFront", "GemvLane", "WeightSwitch", "HEAD_AXIS", "MULTICAST", "gemv_mode", "lanes_used", "lane_rows",
           "lane_bytes", "lane_blob", "port_split", "gemv_ports", "k_chunks"]

MULTICAST = 0x10     # TDEST flag: the low 4 bits are the mask of the lanes that take the burst
BEAT_BYTES = 16


def lanes_used(parallel_lane: int, lanes: int) -> int:
    """Lanes a row-parallel GEMV uses: ``parallel_lane & 0xF`` if 1..lanes, else all of them."""
    return gemv_mode(parallel_lane, lanes, False)[1]


def lane_rows(N: int, used: int) -> list[tuple[int, int]]:
    """(first row, rows) of lanes 0..used-1: contiguous blocks of ceil(N/used) rows (may be 0 rows)."""
    r = -(-N // used)
    return [(min(N, i * r), max(0, min(N, (i + 1) * r) - i * r)) for i in range(used)]


def k_chunks(K: int) -> int:
    """32-element slices of K: one 128-bit beat per row and slice."""
    return -(-K // WEIGHTS_PER_BEAT)


def lane_bytes(rows: int, K: int, w_scale: bool) -> int:
    """Bytes of one weight stream (chunk-major INT4 beats, then the rows' BF16 scales; module docstring)."""
    return rows * BEAT_BYTES * k_chunks(K) + (2 * rows if w_scale else 0)


def lane_blob(W: np.ndarray, scales_bf16: np.ndarray | None) -> bytes:
    """The weight stream of ``W`` [rows, K] (+ BF16 scales) in the lane's chunk-major layout."""
    W = np.asarray(W)
    rows, K = W.shape
    c = k_chunks(K)
    padded = np.zeros((rows, c * WEIGHTS_PER_BEAT), np.int8)
    padded[:, :K] = W
    blob = pack_int4(padded.reshape(rows, c, WEIGHTS_PER_BEAT).transpose(1, 0, 2)).tobytes()
    return blob + (np.asarray(scales_bf16).astype(np.uint16).tobytes() if scales_bf16 is not None else b"")


def unpack_lane(blob: np.ndarray, rows: int, K: int) -> np.ndarray:
    """INT4 values [rows, K] of a chunk-major stream (the inverse of :func:`lane_blob`'s weight part)."""
    c = k_chunks(K)
    nw = rows * BEAT_BYTES * c
    flat = unpack_int4(blob[:nw], rows * c * WEIGHTS_PER_BEAT)
    return flat.reshape(c, rows, WEIGHTS_PER_BEAT).transpose(1, 0, 2).reshape(rows, c * WEIGHTS_PER_BEAT)[:, :K]


def port_split(total: int, nports: int) -> list[int]:
    """Bytes of a head-parallel stream on each of ``nports`` GEMV ports: consecutive parts of whole beats,
    as even as beats allow, the first part on the lowest port (the driver and the lanes both use this)."""
    per = -(-(-(-total // BEAT_BYTES)) // nports) * BEAT_BYTES
    out, left = [], total
    for _ in range(nports):
        out.append(min(per, left))
        left -= out[-1]
    return out


def gemv_ports(g: dict) -> list[int]:
    """The HP ports feeding GEMV lanes (profile ``gemv``), ascending."""
    return sorted({p for p in g["lane_ports"] if p is not None})


class GemvFront(Actor):
    """GEMV control: L2 reads, the row / head split over the lanes in use, the combine and the result write."""
    STATE = ("credits", "sfu_fifo_words", "claimed", "fifo_entries", "fifo_stall_ps", "cvo_retired")   # what a state snapshot shows (emulator/snapshot.py)

    daemon = True
    PORTS = (In("uop", Uop, doc="GEMV µops from the dispatcher", idle=True),
             *L2_CLIENT_PORTS,
             Out("status", Status, doc="retirement, to the scheduler"), Out("emax", EMax, doc="findemax result, to the CVO"),
             Out("job{i}", LaneJob, doc="row block (or head) of lane i"), In("res{i}", LaneResult, doc="lane i's result"),
             Out("sfu", FifoPiece, doc="result pieces and written notices, to the SFU's direct FIFO (cvo.gemv_fifo_words > 0)"),
             In("claims", FifoClaim, doc="which GEMV results a CVO will read (from the scheduler)"),
             In("credit", FifoCredit, doc="direct-FIFO credits returned by the SFU"),
             In("cvo_done", Status, doc="CVO retirements (a GEMV waits for the CVO writing its input)"))
    PARAMS = (*declare("cycle_ps", "read_latency_cycles"),
              Param("lanes", "gemv.lanes", "count", "GEMV lanes"),
              Param("lane_ports", "gemv.lane_ports", "ports", "HP port feeding each lane (null: none)"),
              Param("head_parallel", "gemv.head_parallel", "bool", "parallel_lane bit 4 selects head parallelism"),
              Param("emax_out", "cvo.emax_from", "bool", "emax_from != gemm: the GEMV sends its e_max",
                    lambda p: p["cvo"]["emax_from"] != "gemm"),
              Param("sfu_fifo_words", "cvo.gemv_fifo_words", "words", "depth of the GEMV->SFU FIFO (0: none)"))

    def __init__(self, name: str, *, cycle_ps: int, lanes: int, read_latency_cycles: int, data_mode: bool,
                 lane_ports: list | None = None, head_parallel: bool = False, emax_out: bool = True,
                 sfu_fifo_words: int = 0):
        super().__init__(name)
        # seed §3.2 rule 2: claimed results of up to sfu_fifo_words L2 words per piece also go to the SFU's FIFO
        self.sfu_fifo_words = sfu_fifo_words
        self.sfu = self.out_port("sfu") if sfu_fifo_words else None
        self.claims = self.in_port("claims") if sfu_fifo_words else None
        self.credit = self.in_port("credit") if sfu_fifo_words else None
        self.credits = sfu_fifo_words     # free words of the direct FIFO
        self.claimed: deque[int] = deque()   # GEMV seqs a CVO claimed, in issue order (not yet served)
        self.fifo_stall_ps = 0
        self.fifo_entries = 0
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
        self.lane_ports = list(lane_ports) if lane_ports is not None else [None] * lanes
        self.ports = sorted({p for p in self.lane_ports if p is not None})
        self.head_parallel = head_parallel
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

    async def _after_cvo(self, f: dict, words: int) -> None:
        """Reverse direction (module docstring): wait for the in-flight CVOs that write the activation."""
        lo, hi = f["src_addr"], f["src_addr"] + words
        need = max((k for k, a, b in f["after_cvo"] if a < hi and lo < b), default=-1)
        t = self.now
        while self.cvo_retired < need:
            await self.cvo_retired_ev.wait()
        if self.now > t:
            self.cvo_wait_ps += self.now - t
            self.report("cvo_wait_ps", self.cvo_wait_ps)

    def _plan(self, f: dict, head: bool, used: int, K: int, N: int, x) -> list:
        """(lane, first row, rows, activation, quota) of each lane with work (module docstring, "Modes")."""
        w_scale = bool(f["w_scale"])
        if not head:
            return [(i, r0, n, x, [[self.lane_ports[i], lane_bytes(n, K, w_scale)]])
                    for i, (r0, n) in enumerate(lane_rows(N, used)) if n]
        wx = -(-K // 8)
        quota = [list(q) for q in zip(self.ports, port_split(lane_bytes(N, K, w_scale), len(self.ports)))]
        return [(i, 0, N, x[i * wx * 8:i * wx * 8 + K] if self.data_mode else x, quota) for i in range(used)]

    async def _serve(self) -> None:
        while True:
            u = await self.uop.recv()
            f = u.fields
            start = self.now
            K, N = f["K"], f["N"]
            head, used = gemv_mode(f["parallel_lane"], self.lanes, self.head_parallel)
            G = used if head else 1
            wx, wy = -(-K // 8), -(-N // 8)
            S = f.get("S", wy)
            if "after_cvo" in f:
                await self._after_cvo(f, G * wx)
            x, old = await read_operands(self, f, (G - 1) * wx * 8 + K, (G - 1) * S * 8 + N)
            plan = self._plan(f, head, used, K, N, x)
            for i, r0, n, xi, quota in plan:
                await self.job[i].send(LaneJob(u.seq, r0, n, K, bool(f["w_scale"]), xi, quota))
            ys = [np.zeros(N, np.float32) for _ in range(G)] if self.data_mode else None
            streams = []
            for k, (i, r0, n, _x, _q) in enumerate(plan):
                r = await self.res[i].recv()
                if r.seq != u.seq:
                    raise RuntimeError(f"{self.name}: lane {i} returned GEMV#{r.seq} while GEMV#{u.seq} runs")
                streams.append(f"lane{i}:" + (f"w{r.stream}" if r.stream >= 0 else "zero"))
                if self.data_mode:
                    ys[k if head else 0][r0:r0 + n] = r.y
            for k in range(G):
                elem = (f["dest_reg"] + k * S) * 8
                if self.data_mode:
                    y = ys[k]
                    if old is not None:
                        y = (y + from_bf16(old[k * S * 8:k * S * 8 + N])).astype(np.float32)
                    out = to_bf16(y)
                else:
                    out = TensorDesc.of((N,), "u2")
                if f["findemax"] and self.emax_out:
                    bits = int(to_bf16(from_bf16(out).max())) if self.data_mode else 0
                    await self.emax.send(EMax(bits, elem, N))
                await self._write(u.seq, elem, N, out, k == G - 1)
            if self.claimed and self.claimed[0] == u.seq:
                self.claimed.popleft()
            await self.status.send(Status("retire", "GEMV", u.seq, 0, start, self.now, " ".join(streams)))

    def _is_claimed(self, seq: int) -> bool:
        """Rule 2: has a CVO claimed GEMV ``seq``'s result?  Every claim is kept, in order, until served."""
        while (c := self.claims.poll()) is not None:
            self.claimed.append(c.seq)
        while self.claimed and self.claimed[0] < seq:   # claimed after that GEMV had retired: too late
            self.claimed.popleft()
        return bool(self.claimed) and self.claimed[0] == seq

    async def _write(self, seq: int, elem: int, n: int, out, last: bool) -> None:
        """One result piece to L2; with the direct FIFO (module docstring) also the FIFO entry as the
        write-back starts (claimed, fits, credits allowing) and the written notice after it."""
        if self.sfu is not None:
            while (c := self.credit.poll()) is not None:
                self.credits += c.words
            words = -(-n // 8)
            if self._is_claimed(seq) and words <= self.sfu_fifo_words:
                t = self.now
                while self.credits < words:   # back-pressure: wait until the SFU releases older entries
                    self.credits += (await self.credit.recv()).words
                if self.now > t:
                    self.fifo_stall_ps += self.now - t
                    self.report("sfu_fifo_stall_ps", self.fifo_stall_ps)
                self.credits -= words
                self.fifo_entries += 1
                self.report("sfu_fifo_entries", self.fifo_entries)
                await self.sfu.send(FifoPiece(seq, elem, n, out, False, last))
        await self.l2_req.send(L2Write(0, elem, n, out))
        await self.l2_resp.recv()
        if self.sfu is not None:
            await self.sfu.send(FifoPiece(seq, elem, n, None, True, last))


class GemvLane(Actor):
    """One GEMV lane: ``macs_per_lane`` MAC/clk on the bursts of its weight input(s) (none: zero weights)."""
    STATE = ("macs", "zero_rows")   # what a state snapshot shows (emulator/snapshot.py)

    daemon = True
    PORTS = (In("job", LaneJob, doc="row blocks / heads from the GEMV front", idle=True),
             In("w{p}", WeightBurst, doc="its weight input from HP port p (the FIFO or a switch output)"),
             Out("res", LaneResult, doc="the block's result"))
    PARAMS = (*declare("cycle_ps"),
              Param("macs_per_lane", "gemv.macs_per_lane", "MAC/clk", "MACs per lane per cycle"),
              Param("pipeline_cycles", "gemv.pipeline_cycles", "cycles", "lane pipeline depth"),
              Param("burst_bytes", ("hp.burst_beats", "hp.beat_bytes", "hp.chunk_bursts"), "B",
                    "one FIFO message: burst_beats x beat_bytes x chunk_bursts",
                    lambda p: p["hp"]["burst_beats"] * p["hp"]["beat_bytes"] * p["hp"]["chunk_bursts"]),
              Param("beat_bytes", "hp.beat_bytes", "B", "bytes per AXI beat"))

    def __init__(self, name: str, *, index: int, cycle_ps: int, macs_per_lane: int, pipeline_cycles: int,
                 burst_bytes: int, beat_bytes: int, inputs: list[int], data_mode: bool):
        super().__init__(name)
        self.index = index
        self.job = self.in_port("job", idle=True)
        self.res = self.out_port("res")
        self.w = {p: self.in_port(f"w{p}") for p in inputs}
        self.port_of = {port: p for p, port in self.w.items()}
        self.cycle_ps = cycle_ps
        self.rate = macs_per_lane
        self.pipeline_cycles = pipeline_cycles
        self.burst_bytes = burst_bytes
        self.beat_bytes = beat_bytes
        self.data_mode = data_mode
        self.spans: list[tuple[int, int, int, int]] = []   # (start, end, seq, stream) of every MAC span
        self.zero_rows = 0
        self.macs = 0      # rows x K of every job, the energy model's count (actors/pccx/energy.py)

    def _burst_cycles(self, done_beats: int, beats: int) -> int:
        """Cycles of a burst of ``beats`` after ``done_beats`` beats of the same job (module docstring)."""
        return mac_cycles(done_beats, beats, self.rate)

    def _check(self, j: LaneJob, b: WeightBurst, stream: int) -> None:
        """A burst meant for another lane or another instruction is an error that names the cause."""
        mine = b.dest == self.index or (b.dest & MULTICAST and b.dest >> self.index & 1)
        if not mine:
            raise RuntimeError(f"{self.name}: GEMV#{j.seq} received a burst for lane {b.dest} "
                               f"(driver named the wrong lane / HP port?)")
        if b.tag >= 0 and b.tag < j.seq:
            raise RuntimeError(f"{self.name}: GEMV#{j.seq} reads weight stream {b.stream}, which the driver streamed "
                               f"for instruction #{b.tag}: instruction #{b.tag} never reached the GEMV unit (dropped "
                               f"or rejected on its way: see the status block), so its weights are still in the FIFO "
                               f"ahead of GEMV#{j.seq}'s")
        if b.tag > j.seq:
            raise RuntimeError(f"{self.name}: GEMV#{j.seq} reads weight stream {b.stream}, which the driver streamed "
                               f"for the later instruction #{b.tag}: GEMV#{j.seq}'s own weights never reached the "
                               f"FIFO (a DataMover command lost or not issued?)")
        if stream >= 0 and b.stream != stream:
            raise RuntimeError(f"{self.name}: GEMV#{j.seq} expected weight stream {stream}, the FIFO "
                               f"holds stream {b.stream} (driver streamed the wrong byte count?)")

    async def run(self) -> None:
        while True:
            j = await self.job.recv()
            total = lane_bytes(j.rows, j.K, j.w_scale)
            stream = -1
            done = 0   # beats of this job already charged
            if not self.w:
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
                quota = {p: n for p, n in j.quota if n > 0}
                if sum(quota.values()) != total or any(p not in self.w for p in quota):
                    raise RuntimeError(f"{self.name}: GEMV#{j.seq} asks for {j.quota} from HP ports {sorted(self.w)}, "
                                       f"{total} bytes expected (gemv.lane_ports / head_parallel wiring)")
                order = [p for p, _n in j.quota]
                chunks: dict[int, list] = {p: [] for p in order}
                while quota:
                    ports = [self.w[p] for p in sorted(quota)]
                    if len(ports) == 1:
                        port, b = ports[0], await ports[0].recv()
                    else:
                        port, b = await self.select(*ports)
                    p = self.port_of[port]
                    self._check(j, b, stream)
                    stream = b.stream
                    quota[p] -= payload_nbytes(b.data)
                    if quota[p] < 0:
                        raise RuntimeError(f"{self.name}: GEMV#{j.seq} received more weight bytes from HP{p} than "
                                           f"its {dict(j.quota)[p]} (driver streamed the wrong byte count?)")
                    if quota[p] == 0:
                        del quota[p]
                    if self.data_mode:
                        chunks[p].append(np.asarray(b.data, np.uint8))
                    t = self.now
                    await self.busy(self._burst_cycles(done, b.beats) * self.cycle_ps, f"GEMV#{j.seq} w{stream}")
                    done += b.beats
                    self.spans.append((t, self.now, j.seq, stream))
                blob = np.concatenate([c for p in order for c in chunks[p]]) if self.data_mode else None
            await self.busy(self.pipeline_cycles * self.cycle_ps, f"GEMV#{j.seq} drain")
            self.macs += j.rows * j.K
            y = self._compute(blob, j.x, j.rows, j.K, j.w_scale) if self.data_mode else TensorDesc.of((j.rows,), "f4")
            await self.res.send(LaneResult(j.seq, self.index, stream, y))

    @staticmethod
    def _compute(blob: np.ndarray, x_bits, rows: int, K: int, w_scale: bool) -> np.ndarray:
        W = unpack_lane(blob, rows, K)
        y = numerics.matmul(W, from_bf16(x_bits), acc=np.float64).astype(np.float32)
        if w_scale:
            nw = rows * BEAT_BYTES * k_chunks(K)
            y = (y * from_bf16(blob[nw:nw + 2 * rows].view(np.uint16))).astype(np.float32)
        return y


class WeightSwitch(Actor):
    """AXI-Stream switch after a weight FIFO feeding several lanes: routes each burst by its TDEST (one lane, or
    with ``MULTICAST`` every lane of the mask: passed on when all of them took it)."""

    daemon = True
    PORTS = (In("in", WeightBurst, doc="the weight FIFO", idle=True),
             Out("lane{i}", WeightBurst, doc="to lane i"))

    def __init__(self, name: str, *, port: int, lanes: list[int]):
        super().__init__(name)
        self.port = port
        self.inp = self.in_port("in", idle=True)
        self.out = {i: self.out_port(f"lane{i}") for i in lanes}

    async def run(self) -> None:
        while True:
            b = await self.inp.recv()
            dests = [i for i in range(4) if b.dest >> i & 1] if b.dest & MULTICAST else [b.dest]
            for i in dests:
                out = self.out.get(i)
                if out is None:
                    raise RuntimeError(f"{self.name}: burst of stream {b.stream} for lane {i}, but HP{self.port} "
                                       f"feeds lanes {sorted(self.out)} (gemv.lane_ports, gemv.head_parallel)")
                await out.send(b)
