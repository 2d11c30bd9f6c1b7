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
two B buffers, one fp32 accumulator and two output buffers per composite.

TCM-resident operands (``CompositeCmd.a_buf`` / ``b_buf`` / ``c_buf``, seed §B.3:
composite operands and outputs live in the TCM scratch arena): an A or B block
that is already in the TCM is read from its buffer (tcm_block.copy_block into the
step's operand buffer) instead of DMA-loaded, and a finished C block is written
into the result buffer (tcm_block.write_block) instead of DMA-stored.  These TCM
accesses go through the TCM actor (one request at a time) and take no time (the
TCM answers at once, memory.Tcm; the GEMM engine's drain writes the block, its
time is in ``fill_drain``).  So a composite with A and C in the TCM and B in HBM
(the seed's ``S = q·Kᵀ``, ``O = P·V``) issues DMAs for its B blocks only, and
completes when its last GEMM (and epilogue) step is done.
"""
from __future__ import annotations

import numpy as np

from emulator.actor import Actor
from emulator.declare import In, Out
from protocols.ahbm import CompositeCmd, DmaCmd, Done, GemmCmd, MathCmd
from protocols.codec import TensorDesc

from actors.ahbm.memory import TCM_CLIENT_PORTS, TcmClient
from actors.ahbm.params import declare
from actors.ahbm.tcm_block import copy_block, write_block
from actors.ahbm.tiles import plan

__all__ = ["PeScheduler", "EPILOGUE_OPS"]

#: epilogue steps a composite accepts (single-operand MATH ops, seed §0 bias/relu/scale)
EPILOGUE_OPS = ("scale", "relu", "exp")


class PeScheduler(Actor):
    """Composite GEMM -> tile plan -> streamed DMA / GEMM / MATH commands (module docstring)."""

    daemon = True
    PORTS = (In("cmd", CompositeCmd, doc="composite commands from the CPU", idle=True),
             Out("done_cpu", Done, doc="completion of a composite to the CPU"),
             Out("dma", DmaCmd, doc="tile loads and stores"),
             Out("gemm", GemmCmd, doc="tile GEMMs"),
             Out("math", MathCmd, doc="epilogue steps"),
             In("done", Done, doc="completions of its DMA / GEMM / MATH commands"),
             *TCM_CLIENT_PORTS)
    PARAMS = declare("tile")

    def __init__(self, name: str, *, prm):
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
        self.finished: set[int] = set()

    def _id(self) -> int:
        self.seq += 1
        return self.seq

    async def _wait(self, ids) -> None:
        for i in ids:
            while i not in self.finished:
                d: Done = await self.done.recv()
                self.finished.add(d.id)
            self.finished.discard(i)

    async def _load(self, c: CompositeCmd, s, esize: int) -> list[int]:
        """Bring step ``s``'s A and B blocks into the operand buffers: DMA ids to wait for
        (a TCM-resident operand is copied at once and needs no wait)."""
        K, N = c.k, c.n
        ids = []
        if s.load_a:       # else: A block resident from this row's first N tile (tiles.py)
            if c.a_buf:
                await copy_block(self.tcm, c.a_buf, s.m0, s.k0, s.tm, s.tk, f"sched/a{s.a_buf}")
            else:
                ids.append(self._id())
                await self.dma.send(DmaCmd(ids[-1], "load", c.a_addr + (s.m0 * K + s.k0) * esize, s.tm, s.tk * esize,
                                           K * esize, f"sched/a{s.a_buf}", [s.tm, s.tk], c.dtype, "sched", []))
        if not s.load_b:   # B block resident from this column's first M tile (tiles.py)
            return ids
        if c.b_buf:
            await copy_block(self.tcm, c.b_buf, s.k0, s.n0, s.tk, s.tn, f"sched/b{s.b_buf}")
            return ids
        ib = self._id()
        await self.dma.send(DmaCmd(ib, "load", c.b_addr + (s.k0 * N + s.n0) * esize, s.tk, s.tn * esize, N * esize,
                                   f"sched/b{s.b_buf}", [s.tk, s.tn], c.dtype, "sched", []))
        return ids + [ib]

    async def _open_result(self, c: CompositeCmd, c_dtype: str, data_mode: bool) -> None:
        """Create the TCM result buffer ``c_buf`` (its space is the kernel's, allocated by tl)."""
        await self.tcm.write(c.c_buf, np.zeros((c.m, c.n), np.dtype(c_dtype)) if data_mode
                             else TensorDesc.of((c.m, c.n), c_dtype))

    async def _finish(self, c: CompositeCmd, s, c_dtype: str, stores: list[int]) -> None:
        """After GEMM step ``s`` is done: if it ended an output tile, the epilogue, then the tile's store
        (HBM result, DMA id appended to ``stores``) or its write into the TCM result."""
        if not s.last:
            return
        cbuf = f"sched/c{s.tile % 2}"
        for i, (op, scalar) in enumerate(c.epilogue):
            mid = self._id()
            last = i == len(c.epilogue) - 1
            await self.math.send(MathCmd(mid, op, [cbuf], cbuf, float(scalar), c_dtype if last else "<f4", "sched"))
            await self._wait([mid])
        if c.c_buf:    # the block goes straight into the TCM result (seed §B.3)
            await write_block(self.tcm, c.c_buf, s.m0, s.n0, await self.tcm.read(cbuf))
            return
        sid = self._id()
        csize = np.dtype(c_dtype).itemsize
        await self.dma.send(DmaCmd(sid, "store", c.c_addr + (s.m0 * c.n + s.n0) * csize, s.tm, s.tn * csize,
                                   c.n * csize, cbuf, [s.tm, s.tn], c_dtype, "sched", []))
        stores.append(sid)

    async def run(self) -> None:
        data_mode = self.system.mode == "data"
        while True:
            c: CompositeCmd = await self.cmd.recv()
            start = self.now
            esize = np.dtype(c.dtype).itemsize
            c_dtype = c.c_dtype or c.dtype
            steps = plan(c.m, c.k, c.n, self.prm.tile)
            for op, _ in c.epilogue:
                if op not in EPILOGUE_OPS:
                    raise RuntimeError(f"composite {c.id}: unsupported epilogue step {op!r};"
                                       f" supported: {', '.join(EPILOGUE_OPS)}")
            if c.c_buf:
                await self._open_result(c, c_dtype, data_mode)
            stores: list[int] = []
            pending = await self._load(c, steps[0], esize)
            prev = None
            for s in steps:
                await self._wait(pending)
                g = self._id()
                out, out_dtype = "", ""
                if s.last:
                    out, out_dtype = f"sched/c{s.tile % 2}", ("<f4" if c.epilogue else c_dtype)
                await self.gemm.send(GemmCmd(g, f"sched/a{s.a_buf}", f"sched/b{s.b_buf}", "sched/acc",
                                             not s.first, out, out_dtype or c_dtype, s.tm, s.tk, s.tn, "sched"))
                if prev is not None:
                    await self._wait([prev[1]])    # GEMM s-1 done: its operand buffers are free
                if s.index + 1 < len(steps):
                    pending = await self._load(c, steps[s.index + 1], esize)
                if prev is not None:
                    await self._finish(c, prev[0], c_dtype, stores)
                prev = (s, g)
            await self._wait([prev[1]])
            await self._finish(c, prev[0], c_dtype, stores)
            await self._wait(stores)
            await self.done_cpu.send(Done(c.id, "sched", start, self.now, {"steps": len(steps)}))
