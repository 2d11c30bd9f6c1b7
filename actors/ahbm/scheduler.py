"""The PE scheduler: a composite GEMM command -> tile plan -> streamed engine commands.

Seed §0 (``CompositeCmd``, ADR-0014 D6): the scheduler builds the tile plan
(tiles.plan) and streams per tile DMA -> GEMM -> write, with the epilogue MATH
steps on each finished output tile.  Streaming policy (double buffering,
assumption): the loads of step s+1 are queued on the DMA engine as soon as the
loads of step s are complete, i.e. while GEMM step s runs; output tiles are
stored asynchronously (the store queues on the DMA behind the next loads).  So:

* ``L_s`` = DMA(A block) then DMA(B block), FIFO on the one DMA engine;
* GEMM s starts at ``max(L_s done, GEMM s-1 done, epilogue/store issue of s-1)``;
* the command completes when the last store is done.

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
from protocols.ahbm import CompositeCmd, DmaCmd, Done, GemmCmd, MathCmd
from protocols.codec import TensorDesc

from actors.ahbm.memory import TcmClient
from actors.ahbm.tcm_block import copy_block, write_block
from actors.ahbm.tiles import plan

__all__ = ["PeScheduler", "EPILOGUE_OPS"]

#: epilogue steps a composite accepts (single-operand MATH ops, seed §0 bias/relu/scale)
EPILOGUE_OPS = ("scale", "relu", "exp")


class PeScheduler(Actor):
    daemon = True

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
            for s in steps:
                await self._wait(pending)
                if s.index + 1 < len(steps):
                    pending = await self._load(c, steps[s.index + 1], esize)
                out = f"sched/c{s.tile % 2}" if (s.last and not c.epilogue) else ""
                g = self._id()
                await self.gemm.send(GemmCmd(g, f"sched/a{s.a_buf}", f"sched/b{s.b_buf}", "sched/acc",
                                             not s.first, out, c_dtype, s.tm, s.tk, s.tn, "sched"))
                await self._wait([g])
                if not s.last:
                    continue
                for i, (op, scalar) in enumerate(c.epilogue):
                    last = i == len(c.epilogue) - 1
                    mid = self._id()
                    await self.math.send(MathCmd(mid, op, ["sched/acc"], f"sched/c{s.tile % 2}" if last else "sched/acc",
                                                 float(scalar), c_dtype if last else "<f4", "sched"))
                    await self._wait([mid])
                if c.c_buf:    # the block goes straight into the TCM result (seed §B.3)
                    await write_block(self.tcm, c.c_buf, s.m0, s.n0, await self.tcm.read(f"sched/c{s.tile % 2}"))
                    continue
                sid = self._id()
                csize = np.dtype(c_dtype).itemsize
                await self.dma.send(DmaCmd(sid, "store", c.c_addr + (s.m0 * c.n + s.n0) * csize, s.tm, s.tn * csize,
                                           c.n * csize, f"sched/c{s.tile % 2}", [s.tm, s.tn], c_dtype, "sched", []))
                stores.append(sid)
            await self._wait(stores)
            await self.done_cpu.send(Done(c.id, "sched", start, self.now, {"steps": len(steps)}))
