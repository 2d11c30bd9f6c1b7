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
"""
from __future__ import annotations

import numpy as np

from emulator.actor import Actor
from emulator.declare import In, Out
from protocols.ahbm import CompositeCmd, DmaCmd, Done, GemmCmd, MathCmd

from actors.ahbm.params import declare
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
             In("done", Done, doc="completions of its DMA / GEMM / MATH commands"))
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
        K, N = c.k, c.n
        ids = []
        if s.load_a:       # else: A block resident from this row's first N tile (tiles.py)
            ids.append(self._id())
            await self.dma.send(DmaCmd(ids[-1], "load", c.a_addr + (s.m0 * K + s.k0) * esize, s.tm, s.tk * esize,
                                       K * esize, f"sched/a{s.a_buf}", [s.tm, s.tk], c.dtype, "sched", []))
        if not s.load_b:   # B block resident from this column's first M tile (tiles.py)
            return ids
        ib = self._id()
        await self.dma.send(DmaCmd(ib, "load", c.b_addr + (s.k0 * N + s.n0) * esize, s.tk, s.tn * esize, N * esize,
                                   f"sched/b{s.b_buf}", [s.tk, s.tn], c.dtype, "sched", []))
        return ids + [ib]

    async def run(self) -> None:
        while True:
            c: CompositeCmd = await self.cmd.recv()
            start = self.now
            esize = np.dtype(c.dtype).itemsize
            steps = plan(c.m, c.k, c.n, self.prm.tile)
            for op, _ in c.epilogue:
                if op not in EPILOGUE_OPS:
                    raise RuntimeError(f"composite {c.id}: unsupported epilogue step {op!r};"
                                       f" supported: {', '.join(EPILOGUE_OPS)}")
            stores: list[int] = []
            pending = await self._load(c, steps[0], esize)
            for s in steps:
                await self._wait(pending)
                if s.index + 1 < len(steps):
                    pending = await self._load(c, steps[s.index + 1], esize)
                out = f"sched/c{s.tile % 2}" if (s.last and not c.epilogue) else ""
                g = self._id()
                await self.gemm.send(GemmCmd(g, f"sched/a{s.a_buf}", f"sched/b{s.b_buf}", "sched/acc",
                                             not s.first, out, c.dtype, s.tm, s.tk, s.tn, "sched"))
                await self._wait([g])
                if not s.last:
                    continue
                for i, (op, scalar) in enumerate(c.epilogue):
                    last = i == len(c.epilogue) - 1
                    mid = self._id()
                    await self.math.send(MathCmd(mid, op, ["sched/acc"], f"sched/c{s.tile % 2}" if last else "sched/acc",
                                                 float(scalar), c.dtype if last else "<f4", "sched"))
                    await self._wait([mid])
                sid = self._id()
                await self.dma.send(DmaCmd(sid, "store", c.c_addr + (s.m0 * c.n + s.n0) * esize, s.tm, s.tn * esize,
                                           c.n * esize, f"sched/c{s.tile % 2}", [s.tm, s.tn], c.dtype, "sched", []))
                stores.append(sid)
            await self._wait(stores)
            await self.done_cpu.send(Done(c.id, "sched", start, self.now, {"steps": len(steps)}))
