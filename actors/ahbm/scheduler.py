"""The PE scheduler: a composite GEMM command -> tile plan -> streamed engine commands.

Seed §0 (``CompositeCmd``, ADR-0014 D6): the scheduler builds the tile plan
(tiles.plan) and streams per tile DMA -> GEMM -> write, with the epilogue MATH
steps on each finished output tile.  Streaming policy (double buffering,
assumption): GEMM s is sent to the engine as soon as its operands are loaded,
without waiting for GEMM s-1 (the engine is a FIFO pipeline, gemm.py, so GEMM s
streams behind s-1); then the scheduler waits for GEMM s-1 to complete (its
operand buffers are free, its output block is final), queues the loads of step
s+1 into s-1's buffers, and finishes s-1's output tile if it was the tile's
last K step (epilogue MATH steps on the tile, then its store, which queues on
the DMA behind those loads).  So, with ``done_s = start_s + fill_drain + core_s``
for the last K step of an output block and ``start_s + core_s`` for the others
(the partial block stays in the array, gemm.py), the GEMM engine free again at
``start_s + core_s``:

* ``L_{s+1}`` = DMA(A block) then DMA(B block), FIFO on the one DMA engine,
  issued at ``max(L_s done, end of the finish of s-2, done_{s-1})``;
* GEMM s starts at ``max(L_s done, end of the finish of s-2, start_{s-1} + core_{s-1})``;
* the command completes when the last tile is finished and its store done.

The epilogue reads the output block from the tile's output buffer (GEMM s writes
the fp32 block there), not from the accumulator the next block already uses.

The scheduler adds no service time of its own (assumption: plan generation is
hidden behind the first loads); all time is engine time, so the composite's
total follows from the engine formulas and this recurrence.  TCM use: two A,
two B buffers, one fp32 accumulator and two output buffers, plus two B panel
buffers (below) within the reserve tl keeps for the scheduler.

TCM-resident operands (``CompositeCmd.a_buf`` / ``b_buf`` / ``c_buf``, seed §B.3:
composite operands and outputs live in the TCM scratch arena): an A or B block
that is already in the TCM is copied from its buffer into the step's operand
buffer (tcm_block.copy_block) instead of DMA-loaded, and a finished C block is
placed into the result buffer (tcm_block.place_block) instead of DMA-stored.  Each
is one posted TCM access the TCM carries out itself: it goes through the TCM actor
(one request at a time) and takes no time (memory.Tcm; the GEMM engine's drain writes the block, its
time is in ``fill_drain``).  So a composite with A and C in the TCM and B in HBM
(the seed's ``S = q·Kᵀ``, ``O = P·V``) issues DMAs for its B blocks only, and
completes when its last GEMM (and epilogue) step is done.

Cross-composite prefetch with B panels (seed §B.7: the next GEMM's operands stream
while the current one computes).  Once the current composite has issued the loads
of its last step, the scheduler takes the next composite waiting in its queue (if
any) and queues that composite's HBM B operand as *panels* (tiles.panels): its
first step's block alone, then runs of consecutive B blocks forming one rectangle,
one 2-D DMA each, of at most
:func:`panel_budget` bytes (8 KiB for bf16 at the default 32/64/32 tiles: the
scheduler's TCM reserve is sized for 4-byte operands, so half of its B/A space is
free with 2-byte ones; two panel buffers ``sched/p0``/``sched/p1``).  Panel loads
are issued as soon as a ring slot is free; a slot frees when every step of its
previous panel has copied its block out (tcm_block.copy_block into the step's B
buffer, no time, like a TCM-resident B), so no load overwrites a panel in use.
The taken-ahead composite then runs the recurrence above with its B blocks
copied from the landed panels instead of DMA-loaded.  Why panels only for
taken-ahead composites: their load is hidden behind the previous composite, so
the bigger first DMA does not delay their first GEMM; a composite that arrives
at an idle scheduler keeps the per-block stream (first GEMM after one block, the
closed form closed_forms.composite_model unchanged).  DMA concurrency stays as
the profile says (``dma.outstanding`` 1, an assumption, dma.py): raising it
would also change every dot-only kernel's DMA timing; fewer, larger DMAs save the
per-command setup and access latency instead (a [128, 32] bf16 panel: 20 + 30 +
40 ns vs 2 x (20 + 30 + 20) ns for its two blocks, costs.dma_ps).

Within a composite that reaches an idle scheduler, the first step's B block is
one DMA (its first GEMM waits for no more than before) and the rest of B follows
as panels queued right behind it, so block s+1's operands are already on their
way while GEMM s runs.

Composite boundary: when a composite has been taken ahead, the scheduler does
not wait for the current one's last GEMM before starting it: its first GEMM goes
into the engine behind that GEMM (the engine is a FIFO pipeline, gemm.py), and
the last GEMM's completion (epilogue, result block, the ``Done`` to the CPU) is
handled in the new composite's first step, where the recurrence waits for
GEMM s-1 anyway.  Buffer safety (_Job): the new composite's A/B buffer parity is
flipped if its first step would use the buffers of that still-running GEMM, and
the output buffers alternate over all tiles of all composites, so no write lands
in a buffer still read.

``fidelity: pipeline`` (timing mode, pipeline.py).  A composite with A, B and C in
the TCM is one GemmBatch (:meth:`PeScheduler._run_pipeline`).  Any other (an
operand in HBM: the decode's and the no-SP prefill's K/V tiles) runs the block
stream above, its DMAs, panels, epilogue commands and their issue times
unchanged, so the DMA engine and the HBM channels (shared with the CPU and the
HBM port) model their contention as at ``block``; but the scheduler holds the
GEMM array for the run (protocols.ahbm.GemmHold, one hold and one release) and
computes each step's start, completion and ``Done`` time with the engine's own
formulas (pipeline.HeldArray), waiting for that time as it waited for the
``Done`` (emulator.link.select_until: a composite arriving meanwhile is still
taken ahead at its arrival).  The epilogue ops go as ``MathOp`` (the block's
shape in the command: no TCM access), and the TCM block copies (no time, and
no engine reads the copied blocks) are left out.  So the end times are the
block model's; what differs is a CPU GEMM reaching the array during a hold,
served after the release instead of between the steps (not in the kernels'
composite mode, where every GEMM goes through the scheduler).

``fidelity: stream`` (timing mode) is ``pipeline`` with the DMA engine held as well: at the start of a
held run the scheduler also sends a ``DmaHold`` (the engine finishes the commands before it and
holds its HBM stack; the answer says when each channel is free) and times the run's loads, panels
and stores itself with the engine's and the stack's formulas (pipeline.HeldDma), waiting for each
one's ``Done`` time as for a held GEMM step; the release carries the run's spans and counts.  What
differs from ``pipeline``: another client's DMA command (the CPU's) or HBM-port access reaching the
held engine or stack is served after the release (docs/gqa.md "Fidelity" measures it).
"""
from __future__ import annotations

import numpy as np

from emulator.actor import Actor
from emulator.declare import In, Out
from emulator.link import select, select_until
from protocols.ahbm import CompositeCmd, DmaCmd, DmaHold, Done, GemmBatch, GemmCmd, GemmHold, MathBatch, MathCmd, MathOp
from protocols.codec import TensorDesc

from actors.ahbm.costs import math_ps
from actors.ahbm.memory import TCM_CLIENT_PORTS, TcmClient
from actors.ahbm.params import declare
from actors.ahbm.pipeline import HeldArray, HeldDma, plan_cached
from actors.ahbm.tcm_block import copy_block, place_block
from actors.ahbm.tiles import Panel, panels
from actors.ahbm.tl.scratch import scheduler_reserve

__all__ = ["PeScheduler", "EPILOGUE_OPS", "PANEL_RING", "panel_budget", "panel_plan"]

#: epilogue steps a composite accepts (single-operand MATH ops, seed §0 bias/relu/scale)
EPILOGUE_OPS = ("scale", "relu", "exp")

#: B panel buffers (``sched/p0``, ``sched/p1``): one being consumed, one being loaded
PANEL_RING = 2


def panel_budget(prm, esize: int) -> int:
    """Bytes of one B panel buffer: the scheduler's TCM reserve (tl/scratch.scheduler_reserve, sized for
    4-byte operands) minus the step buffers actually used at operand size ``esize`` (two A, two B blocks,
    the fp32 accumulator and two fp32 output blocks), split over the :data:`PANEL_RING` panels.  0 for
    4-byte operands: no panels, the per-block stream."""
    tm, tk, tn = prm.tile
    used = esize * (2 * tm * tk + 2 * tk * tn) + 4 * 3 * tm * tn
    return max(0, scheduler_reserve(prm) - used) // PANEL_RING


def panel_plan(steps: list, esize: int, budget: int) -> list[Panel]:
    """The panels of ``steps`` (tiles.panels), or none if one of them would not fit a panel buffer."""
    pls = panels(steps, esize, budget)
    if any((p.k_hi - p.k_lo) * (p.n_hi - p.n_lo) * esize > budget for p in pls):
        return []
    return pls


class _Job:
    """One composite in the scheduler: its plan and the TCM buffer names its steps use.

    ``ax``/``bx`` flip the plan's A/B buffer parity (0/1) so the first step of a composite that
    starts while the previous one's last GEMM is still in the engine never writes that GEMM's
    operand buffers; ``tile_base`` continues the output-buffer alternation across composites, so
    its first output block never lands in the buffer the previous one's last epilogue reads."""
    __slots__ = ("c", "steps", "start", "serial", "c_dtype", "stores", "tile_base", "ax", "bx")

    def __init__(self, c, steps, start, serial, tile_base, ax=0, bx=0):
        self.c, self.steps, self.start, self.serial = c, steps, start, serial
        self.c_dtype = c.c_dtype or c.dtype
        self.stores: list[int] = []
        self.tile_base, self.ax, self.bx = tile_base, ax, bx

    def a(self, s) -> str:
        return f"sched/a{s.a_buf ^ self.ax}"

    def b(self, s) -> str:
        return f"sched/b{s.b_buf ^ self.bx}"

    def out(self, s) -> str:
        return f"sched/c{(self.tile_base + s.tile) % 2}"


class _Live:
    """A panel whose DMA has been issued into ring slot ``slot``."""
    __slots__ = ("panel", "slot", "id", "landed", "left")

    def __init__(self, panel: Panel, slot: int, dma_id: int):
        self.panel, self.slot, self.id, self.landed, self.left = panel, slot, dma_id, False, len(panel.steps)


class PeScheduler(Actor):
    """Composite GEMM -> tile plan -> streamed DMA / GEMM / MATH commands (module docstring)."""

    daemon = True
    starts_on = "cmd"    # started by its first command (Actor.starts_on)
    PORTS = (In("cmd", CompositeCmd, doc="composite commands from the CPU", idle=True),
             Out("done_cpu", Done, doc="completion of a composite to the CPU"),
             Out("dma", DmaCmd, DmaHold, doc="tile loads and stores (DmaHold: fidelity stream, the engine held)"),
             Out("gemm", GemmCmd, GemmBatch, GemmHold,
                 doc="tile GEMMs (fidelity pipeline: GemmBatch, a whole composite; GemmHold, the array held)"),
             Out("math", MathCmd, MathBatch, MathOp,
                 doc="epilogue steps (fidelity pipeline: MathBatch, a composite's; MathOp, one without TCM access)"),
             In("done", Done, doc="completions of its DMA / GEMM / MATH commands"),
             *TCM_CLIENT_PORTS)
    PARAMS = declare("tile", "lanes", "math_fixed", "pe_clk", "array_rows", "array_cols", "fill_drain",
                     "charge_padded",
                     # fidelity stream: the held DMA engine's and HBM stack's formulas (pipeline.HeldDma)
                     "pcs", "burst", "hbm_capacity", "dma_setup", "dma_outstanding", "pc_bw_eff", "hbm_latency")

    def __init__(self, name: str, *, prm, fidelity: str = "block", math_op: bool = False):
        """``fidelity``: ``block`` or ``pipeline`` (the workload's choice, actors/ahbm/pipeline.py); ``math_op``:
        pipeline in timing mode, where the tl runtime writes a batched result's descriptor."""
        super().__init__(name)
        self.prm = prm
        self.cmd = self.in_port("cmd", idle=True)
        self.done_cpu = self.out_port("done_cpu")
        self.dma = self.out_port("dma")
        self.gemm = self.out_port("gemm")
        self.math = self.out_port("math")
        self.done = self.in_port("done")
        self.tcm = TcmClient(self, "sched")
        self.seq = 0
        self.tiles = 0                         # output tiles so far (output-buffer alternation)
        self.fidelity = fidelity
        self.math_op = math_op
        self.finished: set[int] = set()
        self.serial = 0                        # composites taken so far (panel keys)
        self.next = None                       # the composite taken ahead (cross-composite prefetch)
        self.look_open = False                 # the current composite has issued its last loads
        self.slots: list[_Live | None] = [None] * PANEL_RING
        self.queue: list[tuple] = []           # panels waiting for a free slot: (serial, composite, Panel)
        self.panel_of: dict[tuple[int, int], _Live | tuple] = {}   # (serial, step) -> panel (queued or live)
        # counters (read by tests): composites taken ahead, panel / per-block B loads, and the least time
        # by which a taken-ahead composite's first panel load was issued before the previous one completed
        self.taken_ahead = 0
        self.panel_loads = 0
        self.block_loads = 0
        self.min_panel_lead_ps: int | None = None
        self._first_panel_at: int | None = None
        # fidelity pipeline, timing mode, a composite with an HBM operand (_block): the array held, its steps
        # timed here (pipeline.HeldArray); GEMM id -> when its Done would leave; the hold's id and answer
        self.held = False
        self._arr: HeldArray | None = None
        self._vdone: dict[int, int] = {}
        self._hold_id = 0
        self._hold_ans: Done | None = None
        self.held_runs = 0
        # fidelity stream: the DMA engine (and its HBM stack) held too, the run's loads and stores timed here
        # (pipeline.HeldDma); the hold's id and answer
        self.hold_dma = fidelity == "stream"
        self._dma: HeldDma | None = None
        self._dhold_id = 0
        self._dhold_ans: Done | None = None

    def _id(self) -> int:
        self.seq += 1
        return self.seq

    async def _wait(self, ids) -> None:
        """Wait for completions ``ids``; meanwhile, once the current composite has issued its last
        loads, take the next queued composite and start its panel loads (cross-composite prefetch)."""
        for i in ids:
            t = self._vdone.pop(i, None) if self._vdone else None
            if t is not None:    # a held-array GEMM step (pipeline.HeldArray): its Done would leave at t
                await self._wait_until(t)
                continue
            while i not in self.finished:
                if self.look_open and self.next is None:
                    port, msg = await select(self.done, self.cmd)
                    if port is self.cmd:
                        await self._take_ahead(msg)
                        continue
                    d: Done = msg
                else:
                    d = await self.done.recv()
                self._finished(d)
            self.finished.discard(i)

    async def _wait_until(self, t: int) -> None:
        """Until ``t``, the time a held-array GEMM step's ``Done`` would have arrived, reacting to what
        :meth:`_wait` reacts to meanwhile (a composite to take ahead; completions are only noted)."""
        while self.now < t:
            if self.look_open and self.next is None:
                got = await select_until((self.done, self.cmd), t)
                if got is None:
                    return
                port, msg = got
                if port is self.cmd:
                    await self._take_ahead(msg)
                else:
                    self._finished(msg)
            else:
                await self.sleep_until(t)

    def _finished(self, d: Done) -> None:
        """Note completion ``d``; the answer to a hold (the array's, or at fidelity stream the DMA engine's) is
        kept, its times start the held model."""
        self.finished.add(d.id)
        if d.id == self._hold_id:
            self._hold_ans = d
        elif d.id == self._dhold_id:
            self._dhold_ans = d

    def _prepare_checks(self, c: CompositeCmd) -> None:
        for op, _ in c.epilogue:
            if op not in EPILOGUE_OPS:
                raise RuntimeError(f"composite {c.id}: unsupported epilogue step {op!r};"
                                   f" supported: {', '.join(EPILOGUE_OPS)}")

    def _prepare(self, c: CompositeCmd) -> list:
        self._prepare_checks(c)
        self.serial += 1
        return plan_cached(c.m, c.k, c.n, tuple(self.prm.tile))

    async def _take_ahead(self, c: CompositeCmd) -> None:
        """The next composite, taken while the current one computes: plan it and queue its B panels
        (HBM B only, panels within :func:`panel_budget`), loaded as ring slots free up."""
        start = self.now
        steps = self._prepare(c)
        self.next = (c, steps, start, self.serial)
        self.taken_ahead += 1
        await self._queue_panels(c, steps, self.serial, True)

    async def _queue_panels(self, c: CompositeCmd, steps: list, serial: int, first_alone: bool) -> None:
        """Queue the HBM B blocks of ``steps`` as panels (tiles.panels, within :func:`panel_budget`) and
        issue what the ring allows; nothing if B is in the TCM or a block does not fit a panel buffer.
        ``first_alone`` (a composite taken ahead): its first step's block is a panel of its own, so a composite issues the same DMAs
        whether it was taken ahead or reached an idle scheduler (its first block then a per-block
        load): DMA counts follow from the plan, not from timing."""
        esize = np.dtype(c.dtype).itemsize
        budget = panel_budget(self.prm, esize)
        if c.b_buf or not budget or not steps:
            return
        pls = (panel_plan(steps[:1], esize, budget) + panel_plan(steps[1:], esize, budget) if first_alone
               else panel_plan(steps, esize, budget))
        for p in pls:
            entry = (serial, c, p)
            self.queue.append(entry)
            for i in p.steps:
                self.panel_of[(serial, i)] = entry
        await self._pump()

    async def _pump(self) -> None:
        """Issue queued panel loads into free ring slots (a slot is free once every step of its
        previous panel has copied its block out, so no load overwrites a panel still in use)."""
        while self.queue and None in self.slots:
            serial, c, p = self.queue.pop(0)
            slot = self.slots.index(None)
            esize = np.dtype(c.dtype).itemsize
            live = _Live(p, slot, self._id())
            self.slots[slot] = live
            self.panel_loads += 1
            if self.next is not None and serial == self.next[3] and self._first_panel_at is None:
                self._first_panel_at = self.now
            for i in p.steps:
                self.panel_of[(serial, i)] = live
            rows, cols = p.k_hi - p.k_lo, p.n_hi - p.n_lo
            await self._send_dma(DmaCmd(live.id, "load", c.b_addr + (p.k_lo * c.n + p.n_lo) * esize, rows,
                                       cols * esize, c.n * esize, self._into(f"sched/p{slot}"), [rows, cols],
                                       c.dtype, "sched", []))

    async def _from_panel(self, job: _Job, s) -> None:
        """Step ``s``'s B block out of its panel into its B buffer (after the panel's DMA landed)."""
        live = self.panel_of.pop((job.serial, s.index))
        if not isinstance(live, _Live):    # panels are issued in step order as slots free: a bug if not
            raise RuntimeError(f"{self.name}: step {s.index} needs a panel that was never issued")
        if not live.landed:
            await self._wait([live.id])
            live.landed = True
        p = live.panel
        await self._copy(f"sched/p{live.slot}", s.k0 - p.k_lo, s.n0 - p.n_lo, s.tk, s.tn, job.b(s))
        live.left -= 1
        if not live.left:
            self.slots[live.slot] = None
            await self._pump()

    async def _load(self, job: _Job, s, esize: int) -> tuple[list[int], bool]:
        """Bring step ``s``'s A and B blocks into the operand buffers: DMA ids to wait for
        (a TCM-resident operand is copied at once and needs no wait), and whether the B block
        comes out of a panel once that has landed (:meth:`_ready`)."""
        c = job.c
        K, N = c.k, c.n
        ids = []
        if s.load_a:       # else: A block resident from this row's first N tile (tiles.py)
            if c.a_buf:
                await self._copy(c.a_buf, s.m0, s.k0, s.tm, s.tk, job.a(s))
            else:
                ids.append(self._id())
                await self._send_dma(DmaCmd(ids[-1], "load", c.a_addr + (s.m0 * K + s.k0) * esize, s.tm, s.tk * esize,
                                           K * esize, self._into(job.a(s)), [s.tm, s.tk], c.dtype, "sched", []))
        if not s.load_b:   # B block resident from this column's first M tile (tiles.py)
            return ids, False
        if (job.serial, s.index) in self.panel_of:
            return ids, True
        if c.b_buf:
            await self._copy(c.b_buf, s.k0, s.n0, s.tk, s.tn, job.b(s))
            return ids, False
        ib = self._id()
        self.block_loads += 1
        await self._send_dma(DmaCmd(ib, "load", c.b_addr + (s.k0 * N + s.n0) * esize, s.tk, s.tn * esize, N * esize,
                                   self._into(job.b(s)), [s.tk, s.tn], c.dtype, "sched", []))
        return ids + [ib], False

    async def _ready(self, job: _Job, s, pending: tuple[list[int], bool]) -> None:
        """Step ``s``'s operands are in its buffers: its DMAs done, its panel block copied."""
        await self._wait(pending[0])
        if pending[1]:
            await self._from_panel(job, s)

    async def _open_result(self, c: CompositeCmd, c_dtype: str, data_mode: bool) -> None:
        """Create the TCM result buffer ``c_buf`` (its space is the kernel's, allocated by tl)."""
        await self.tcm.write(c.c_buf, np.zeros((c.m, c.n), np.dtype(c_dtype)) if data_mode
                             else TensorDesc.of((c.m, c.n), c_dtype))

    async def _finish(self, job: _Job, s) -> None:
        """After GEMM step ``s`` is done: if it ended an output tile, the epilogue, then the tile's store
        (HBM result, DMA id appended to ``job.stores``) or its write into the TCM result."""
        if not s.last:
            return
        c, c_dtype, stores = job.c, job.c_dtype, job.stores
        cbuf = job.out(s)
        for i, (op, scalar) in enumerate(c.epilogue):
            mid = self._id()
            dt = c_dtype if i == len(c.epilogue) - 1 else "<f4"
            if self.held:    # the block's shape in the command: the MATH engine reads no descriptor
                await self.math.send(MathOp(mid, op, [cbuf], cbuf, float(scalar), dt, "sched", s.tm * s.tn,
                                            [s.tm, s.tn]))
            else:
                await self.math.send(MathCmd(mid, op, [cbuf], cbuf, float(scalar), dt, "sched"))
            await self._wait([mid])
        if c.c_buf:    # the block goes straight into the TCM result (seed §B.3)
            if not self.held:   # held: no engine reads the result's blocks (runtime.Tl._tcm writes its descriptor)
                await place_block(self.tcm, cbuf, s.tm, s.tn, c.c_buf, s.m0, s.n0)
            return
        if self.held and not self.hold_dma:   # the block's descriptor for the store's TCM read (the engine's write,
            await self.tcm.write(cbuf, TensorDesc.of((s.tm, s.tn), c_dtype))   # not made; stream: no TCM read)
        sid = self._id()
        csize = np.dtype(c_dtype).itemsize
        await self._send_dma(DmaCmd(sid, "store", c.c_addr + (s.m0 * c.n + s.n0) * csize, s.tm, s.tn * csize,
                                   c.n * csize, cbuf, [s.tm, s.tn], c_dtype, "sched", []))
        stores.append(sid)

    async def _close(self, job: _Job, s) -> None:
        """GEMM ``s`` of ``job`` is done: finish its tile; if it was the job's last step, wait for the
        job's stores and report the composite done."""
        await self._finish(job, s)
        if s.index + 1 < len(job.steps):
            return
        await self._wait(job.stores)
        if self._first_panel_at is not None:
            lead = self.now - self._first_panel_at
            self.min_panel_lead_ps = lead if self.min_panel_lead_ps is None else min(self.min_panel_lead_ps, lead)
            self._first_panel_at = None
        await self.done_cpu.send(Done(job.c.id, "sched", job.start, self.now, {"steps": len(job.steps)}))

    async def run(self) -> None:
        if self.fidelity in ("pipeline", "stream"):
            await self._run_pipeline()
        while True:
            await self._block(await self.cmd.recv())

    async def _run_pipeline(self) -> None:
        """``fidelity: pipeline`` (actors/ahbm/pipeline.py): a composite with A, B and C in the TCM goes to the
        GEMM engine as one GemmBatch as soon as it arrives (the engine runs the block loop's recurrence), its
        epilogue to the MATH engine as one MathBatch once the GEMM engine has said when each tile's may start;
        it completes when both are done.  Any other composite (an HBM operand, or data mode) runs the block
        stream once the batches in flight are done, in timing mode with the GEMM array held (module docstring)."""
        data_mode = self.system.mode == "data"
        parts: dict[int, list] = {}     # GEMM / MATH batch id -> [composite, start, steps, parts left, epilogue]
        c = None
        while True:
            if c is None:
                if not parts:
                    c = await self.cmd.recv()
                else:
                    port, msg = await select(self.done, self.cmd)
                    if port is self.done:
                        await self._pipeline_done(msg, parts)
                        continue
                    c = msg
            if data_mode or not (c.a_buf and c.b_buf and c.c_buf):
                while parts:
                    await self._pipeline_done(await self.done.recv(), parts)
                self.held = not data_mode
                await self._block(c)
                self.held = False
                c = None
                continue
            steps = plan_cached(c.m, c.k, c.n, tuple(self.prm.tile))
            self._prepare_checks(c)
            self.serial += 1
            if not self.math_op:   # else the tl runtime writes the result's descriptor if an engine reads it
                await self._open_result(c, c.c_dtype or c.dtype, False)
            epi_ps = []
            if c.epilogue:
                for st in steps:
                    if st.last:
                        epi_ps.append(sum(math_ps(op, st.tm * st.tn, self.prm) for op, _ in c.epilogue))
            g = self._id()
            entry = [c, self.now, len(steps), 1, epi_ps and [st.tm * st.tn for st in steps if st.last]]
            parts[g] = entry
            self.tiles += steps[-1].tile + 1
            await self.gemm.send(GemmBatch(g, c.a_buf, c.b_buf, c.m, c.k, c.n, list(self.prm.tile), epi_ps,
                                           self.now, "sched"))
            c = None

    async def _pipeline_done(self, d: Done, parts: dict) -> None:
        if d.id < 0:    # the GEMM engine's epilogue start times: the MATH batch goes out now
            entry = parts[-d.id]
            mid = self._id()
            parts[mid] = entry
            entry[3] += 1
            c = entry[0]
            await self.math.send(MathBatch(mid, [list(e) for e in c.epilogue],
                                           [[t, n] for t, n in zip(d.info["epi_at"], entry[4])], "sched"))
            return
        entry = parts.pop(d.id)
        entry[3] -= 1
        if entry[3] == 0:
            c = entry[0]
            await self.done_cpu.send(Done(c.id, "sched", entry[1], self.now, {"steps": entry[2]}))

    async def _block(self, first: CompositeCmd) -> None:
        """The block-by-block stream (module docstring) of ``first`` and of every composite taken ahead
        behind it, until one completes with nothing taken ahead."""
        data_mode = self.system.mode == "data"
        tiles = self.tiles   # output tiles so far (output-buffer alternation across composites)
        prev = None          # (job, step, GEMM id) whose completion is still to be handled
        c = first
        if self.held:        # fidelity pipeline: hold the array for the run (pipeline.HeldArray)
            self._hold_id, self._hold_ans = self._id(), None
            self.held_runs += 1
            await self.gemm.send(GemmHold(self._hold_id, "sched", False, [], 0, 0))
            if self.hold_dma:    # fidelity stream: and the DMA engine with its HBM stack (pipeline.HeldDma)
                self._dhold_id, self._dhold_ans = self._id(), None
                await self.dma.send(DmaHold(self._dhold_id, "sched", False, [], [], 0, []))
        while True:
            cold = c is not None
            if not cold:
                if self.next is None:
                    break
                c, steps, start, serial = self.next
                self.next = None
            else:
                start = self.now
                steps = self._prepare(c)
                serial = self.serial
            ax = bx = 0
            if prev is not None:   # the previous composite's last GEMM may still be in the engine
                pj, ps, _ = prev
                ax = int(steps[0].a_buf == ps.a_buf ^ pj.ax)
                bx = int(steps[0].b_buf == ps.b_buf ^ pj.bx)
            job = _Job(c, steps, start, serial, tiles, ax, bx)
            tiles += steps[-1].tile + 1
            self.tiles = tiles
            self.look_open = False
            esize = np.dtype(c.dtype).itemsize
            if c.c_buf and not self.held:   # held: the tl runtime writes the descriptor if an engine reads it
                await self._open_result(c, job.c_dtype, data_mode)
            pending = await self._load(job, steps[0], esize)
            if cold:   # the first block alone (first GEMM not delayed), the rest of B in panels behind it
                await self._queue_panels(c, steps[1:], serial, False)
            self.look_open = len(steps) == 1
            for s in steps:
                await self._ready(job, s, pending)
                g = self._id()
                out, out_dtype = "", ""
                if s.last:
                    out, out_dtype = job.out(s), ("<f4" if c.epilogue else job.c_dtype)
                if self.held:
                    await self._held_gemm(g, s, bool(out))
                else:
                    await self.gemm.send(GemmCmd(g, job.a(s), job.b(s), "sched/acc", not s.first, out,
                                                 out_dtype or job.c_dtype, s.tm, s.tk, s.tn, "sched"))
                if prev is not None:
                    await self._wait([prev[2]])    # GEMM s-1 done: its operand buffers are free
                if s.index + 1 < len(steps):
                    pending = await self._load(job, steps[s.index + 1], esize)
                    self.look_open = s.index + 2 >= len(steps)
                if prev is not None:
                    await self._close(prev[0], prev[1])
                prev = (job, s, g)
            if self.next is None:   # nothing taken ahead: complete this composite now
                await self._wait([prev[2]])
                await self._close(prev[0], prev[1])
                prev = None
            c = None
            # else: the next composite's first GEMM goes into the engine behind this one's last, whose
            # completion (epilogue, result, Done) is handled in the next composite's first step
        if self.held:        # the run's steps are all done: release the array with their spans
            if self._arr is None:    # (no step was sent: the hold's answer still comes)
                await self._wait([self._hold_id])
                self._arr = HeldArray(self.prm, self._hold_ans.start, self._hold_ans.end)
            arr, self._arr, self._hold_id = self._arr, None, 0
            await self.gemm.send(GemmHold(self._hold_ans.id, "sched", True, arr.spans, arr.macs, arr.core_ps))
            if self.hold_dma:
                dma = await self._held_dma()
                self._dma, self._dhold_id = None, 0
                await self.dma.send(DmaHold(self._dhold_ans.id, "sched", True, dma.spans, dma.loads, dma.moved,
                                            dma.stack_release()))

    async def _held_dma(self) -> HeldDma:
        """The held DMA engine's timing (fidelity stream), made once the hold's answer is in."""
        if self._dma is None:
            await self._wait([self._dhold_id])
            a = self._dhold_ans
            self._dma = HeldDma(self.prm, a.start, a.info["pc_free"])
        return self._dma

    async def _send_dma(self, c: DmaCmd) -> None:
        """A load or store of the block stream: to the DMA engine, or at fidelity stream (the engine held) timed
        here (pipeline.HeldDma), its ``Done`` awaited as the engine's would be (:meth:`_wait`)."""
        if self.held and self.hold_dma:
            dma = await self._held_dma()
            self._vdone[c.id] = dma.issue(self.now, c.op, c.addr, c.rows, c.row_bytes, c.pitch)
        else:
            await self.dma.send(c)

    def _into(self, buf: str) -> str:
        """The TCM buffer a load of the block stream lands in; none (``""``) while the array is held: no engine
        reads the block then (timing mode; the DMA engine's TCM write takes no time), so it is not written."""
        return "" if self.held else buf

    async def _copy(self, src: str, r0: int, c0: int, rows: int, cols: int, dst: str) -> None:
        """A step's operand block into its buffer (tcm_block.copy_block); none while the array is held: no
        engine reads the block then (timing mode, and the copy takes no time)."""
        if not self.held:
            await copy_block(self.tcm, src, r0, c0, rows, cols, dst)

    async def _held_gemm(self, g: int, s, out: bool) -> None:
        """GEMM step ``s`` (id ``g``) sent now to the held array: its ``Done`` time from the engine's formulas
        (pipeline.HeldArray), the array free from when the engine took the hold."""
        if self._arr is None:
            await self._wait([self._hold_id])
            a = self._hold_ans
            self._arr = HeldArray(self.prm, a.start, a.end)
        self._vdone[g] = self._arr.issue(self.now, s.tm, s.tk, s.tn, out)
