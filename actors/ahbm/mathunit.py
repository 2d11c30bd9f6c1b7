"""The PE MATH engine: element-wise ops and row reductions on TCM buffers.

Service time (costs.math_ps): ``fixed + passes * ceil(elements / lanes)`` cycles,
``+ ceil(log2 lanes)`` for a row reduction (rowmax, rowsum); 64 fp32 lanes,
1 element / lane / cycle (ref §2.3).  ``elements`` is the size of the largest
operand.  Commands are served FIFO.

TCM traffic (memory.py, "what a TCM message models"): an op reads all its
operands in one TCM access at its start and writes its result at its end.  When
the next command is already queued at that moment, the result write and the
next op's operand reads are one access (the engine streams: op N+1 starts at the
instant op N ends, as before); otherwise the write is posted alone.  Either way
the result is in the TCM before the op's ``Done`` leaves, at the same virtual
time as before, so no timing changes: only the per-operand and per-answer
messages are gone (5.6 -> ~2 TCM messages per op on the 32-rank decode).

Data mode: computed in float32 (ref §3.3: keep m, l, acc in fp32), result cast
to ``out_dtype``; ``exp`` is ``emulator.numerics.exp`` rounded to float32 (the same
bits on every CPU, unlike numpy's SIMD float32 exp).  Ops: copy, cast, add, sub, mul, div, maximum (two
operands); scale (x scalar), bias (+ row vector, second operand), relu, exp;
rowmax, rowsum (last axis, keepdims); sub_row, mul_row, div_row (broadcast a
[rows, 1] column over the first operand).
"""
from __future__ import annotations

import functools
import math
from collections import deque

import numpy as np

from emulator import numerics
from emulator.actor import Actor
from emulator.declare import In, Out
from emulator.link import select_until
from protocols.ahbm import Done, MathBatch, MathCmd, MathOp, MathRun
from protocols.codec import TensorDesc

from actors.ahbm.costs import MATH_OPS, math_ps
from actors.ahbm.memory import TCM_CLIENT_PORTS, TcmClient
from actors.ahbm.params import declare

__all__ = ["MathEngine", "compute", "result_shape"]

_ARITY = {"add": 2, "sub": 2, "mul": 2, "div": 2, "maximum": 2, "bias": 2, "sub_row": 2, "mul_row": 2, "div_row": 2}


def compute(op: str, xs: list[np.ndarray], scalar: float) -> np.ndarray:
    """The numpy meaning of a MATH op (float32)."""
    a = np.asarray(xs[0], np.float32)
    b = np.asarray(xs[1], np.float32) if len(xs) > 1 else None
    if op in ("copy", "cast"):
        return a
    if op in ("add", "bias"):
        return a + b
    if op == "sub" or op == "sub_row":
        return a - b
    if op == "mul" or op == "mul_row":
        return a * b
    if op == "div" or op == "div_row":
        return a / b
    if op == "maximum":
        return np.maximum(a, b)
    if op == "scale":
        return a * np.float32(scalar)
    if op == "relu":
        return np.maximum(a, np.float32(0))
    if op == "exp":
        return numerics.exp(a).astype(np.float32)
    if op == "rowmax":
        return a.max(axis=-1, keepdims=True)
    if op == "rowsum":
        return a.sum(axis=-1, keepdims=True, dtype=np.float32)
    raise ValueError(f"unknown MATH op {op!r}")


def result_shape(op: str, shapes: list[tuple]) -> tuple:
    if op in ("rowmax", "rowsum"):
        return tuple(shapes[0][:-1]) + (1,)
    return tuple(np.broadcast_shapes(*shapes)) if len(shapes) > 1 else tuple(shapes[0])


@functools.lru_cache(maxsize=1024)
def _result_shape_of(op: str, shapes: tuple) -> tuple:
    """:func:`result_shape` remembered per (op, operand shapes): a kernel repeats a few shapes."""
    return result_shape(op, list(shapes))


class MathEngine(Actor):
    """Element-wise ops and row reductions (module docstring)."""
    STATE = ("elements",)   # what a state snapshot shows (emulator/snapshot.py)

    daemon = True
    starts_on = "cmd"    # started by its first command (Actor.starts_on)
    PORTS = (In("cmd", MathCmd, MathBatch, MathOp, MathRun, idle=True,
                doc="MATH commands from the CPU and the scheduler, FIFO (MathBatch, MathOp, MathRun: fidelity"
                    " pipeline)"),
             Out("done_{client}", Done, doc="completion to each client (cpu, sched)"),
             *TCM_CLIENT_PORTS)
    PARAMS = declare("lanes", "math_fixed", "pe_clk")

    def __init__(self, name: str, *, prm, clients: list[str]):
        super().__init__(name)
        self.prm = prm
        self.cmd = self.in_port("cmd", idle=True)
        self.done = {c: self.out_port(f"done_{c}") for c in clients}
        self.tcm = TcmClient(self, "math")
        self.elements = 0

    def _check(self, c: MathCmd) -> None:
        if c.op not in MATH_OPS:
            raise RuntimeError(f"MATH {c.id}: unknown op {c.op!r}; known: {', '.join(sorted(MATH_OPS))}")
        if len(c.srcs) != _ARITY.get(c.op, 1):
            raise RuntimeError(f"MATH {c.id}: {c.op} takes {_ARITY.get(c.op, 1)} operand(s), got {len(c.srcs)}")

    async def _one(self, c: MathCmd, data_mode: bool, arrived: int) -> None:
        """One command on its own (read, compute, write, Done): a command served between the tiles of a batch
        (``arrived``: when it reached the engine)."""
        if type(c) is MathRun:
            return await self._runs(c, arrived)
        if type(c) is MathOp:    # shapes in the command, no TCM access (run)
            start = self.now
            self.elements += c.elements
            await self.busy(math_ps(c.op, c.elements, self.prm), f"{c.op} {c.elements}")
            await self.done[c.client].send(Done(c.id, "math", start, self.now, {"elements": c.elements}))
            return
        self._check(c)
        xs = await self.tcm.read_all(c.srcs)
        start = self.now
        shapes = tuple([tuple(x.shape) for x in xs])
        elements = max(map(math.prod, shapes))
        self.elements += elements
        await self.busy(math_ps(c.op, elements, self.prm), f"{c.op} {elements}")
        out = (compute(c.op, xs, c.scalar).astype(np.dtype(c.out_dtype)) if data_mode
               else TensorDesc.of(_result_shape_of(c.op, shapes), c.out_dtype))
        await self.tcm.write(c.out, out)
        await self.done[c.client].send(Done(c.id, "math", start, self.now, {"elements": elements}))

    async def _batch(self, b: MathBatch, data_mode: bool) -> None:
        """``fidelity: pipeline`` (actors/ahbm/pipeline.py): the epilogue ops of a composite's tiles, each tile's
        not before its time.  Commands queued by then came first in the block model (the scheduler would have
        sent the tile's op at that time), so they are served first; then the tile's ops back to back.  The
        operands are the scheduler's output block (timing mode: no TCM access, the block's descriptor is
        the result); one ``Done`` when the last tile is done.

        Served in closed form: from tile ``k`` on, with nothing else arriving, tile ``j`` is looked at
        (the queue polled) at ``p_j = max(end of tile j-1, its time)`` and ends at ``p_j`` + its ops; the
        engine waits once, until the last ``p_j`` or an arrival, whichever comes first.  A command delivered
        at ``x`` is the one the poll at the first ``p_j >= x`` would have found: the tiles before it keep their
        spans, the command is served at ``p_j`` as the poll would have, and the plan resumes at tile ``j``.
        So the spans and times are the per-tile loop's (:meth:`_batch_loop`, still used with faults installed,
        whose hooks lengthen spans one by one), with one or two wake-ups per batch instead of two per tile."""
        if data_mode:
            raise RuntimeError(f"MATH batch {b.id}: fidelity pipeline runs in timing mode only")
        if self.faults:
            return await self._batch_loop(b, data_mode)
        start = self.now
        pending = []        # later batches that arrived meanwhile (served after this one)
        tiles, prm = b.tiles, self.prm
        costs = [[(op, el, math_ps(op, el, prm)) for op, _scalar in b.ops] for _at, el in tiles]
        k, free = 0, self.now     # the next tile; when the engine is done with what it has taken on
        while k < len(tiles):
            polls, t = [], free
            for j in range(k, len(tiles)):
                t = max(t, tiles[j][0])
                polls.append(t)
                t += sum(c for _, _, c in costs[j])
            arrived = self.cmd.head_delivered()
            got = self.cmd.poll()
            if got is None and polls[-1] > self.now:   # (at the current instant the loop polls without yielding)
                got = await select_until((self.cmd,), polls[-1])
                got, arrived = got and got[1], self.now
            upto = len(polls) if got is None else next(i for i, p in enumerate(polls) if p >= self.now)
            for i in range(upto):       # the tiles polled before the arrival keep their place and spans
                free = polls[i]
                for op, el, c in costs[k + i]:
                    self.elements += el
                    free = self.record_busy(free, c, f"{op} {el}")
            k += upto
            if got is None:
                break
            if self.now < polls[upto]:
                await self.sleep_until(polls[upto])
            while got is not None:      # the poll at tile k: what it finds is served first, as in the loop
                if type(got) is MathBatch:
                    pending.append(got)
                else:
                    await self._one(got, data_mode, arrived)
                arrived = self.cmd.head_delivered()
                got = self.cmd.poll()
            free = self.now
            for op, el, c in costs[k]:  # then tile k's ops
                self.elements += el
                free = self.record_busy(free, c, f"{op} {el}")
            k += 1
        if free > self.now:
            await self.sleep_until(free)
        await self.done[b.client].send(Done(b.id, "math", start, self.now, {"tiles": len(tiles)}))
        for p in pending:
            await self._batch(p, data_mode)

    async def _batch_loop(self, b: MathBatch, data_mode: bool) -> None:
        """:meth:`_batch` tile by tile (each tile's poll and ops a wake-up of their own): with faults installed."""
        start = self.now
        pending = []
        for at, elements in b.tiles:
            while True:
                if self.now < at:
                    await self.sleep_until(at)
                arrived = self.cmd.head_delivered()
                nxt = self.cmd.poll()
                if nxt is None:
                    break
                if type(nxt) is MathBatch:
                    pending.append(nxt)
                else:
                    await self._one(nxt, data_mode, arrived)
            for op, _scalar in b.ops:
                self.elements += elements
                await self.busy(math_ps(op, elements, self.prm), f"{op} {elements}")
        await self.done[b.client].send(Done(b.id, "math", start, self.now, {"tiles": len(b.tiles)}))
        for p in pending:
            await self._batch_loop(p, data_mode)

    async def _runs(self, r: MathRun, arrived: int) -> None:
        """``fidelity: pipeline``: the CPU's ops of run ``r`` (which reached the engine at ``arrived``), each
        served as the op on its own would have been: FIFO by arrival, op ``j`` having arrived ``j * gap`` after
        the first (protocols.ahbm.MathRun), so it starts at ``max(arrival, end of the previous)``.

        In closed form: the engine waits once, until the run's last op has arrived or another command arrives
        before it, and takes on every op that arrived first, recording its span (Actor.record_busy); such a
        command is served next, once those ops are done, the others after it.  A run the CPU sends next (its
        ops arrive after this one's) joins the queue.  Once all its ops are taken on, nothing can delay them,
        so the run's ``Done`` leaves then, with every op's ``[start, end]``: the CPU that waits for an op
        resumes at that op's end (PeCpu.wait), as it would have on the op's own ``Done``.  Not as one by one:
        a MathBatch (a composite's epilogue) that arrives meanwhile is served after the queued runs, not
        between their ops (it never does in the shipped kernels: the CPU waits for a TCM-resident composite
        before its next MATH op)."""
        prm = self.prm
        ops = deque()           # (arrival, op, elements, cost, run id), in arrival order
        runs = {}               # run id -> [run, ops not yet taken on, [[start, end], ...]]
        batches = []

        def add(run, at):
            if ops:
                raise RuntimeError(f"MATH run {run.id} arrived before the ops of run {ops[0][4]} had")
            runs[run.id] = [run, len(run.ops), []]
            for j, (op, el) in enumerate(run.ops):
                ops.append((at + j * run.gap, op, el, math_ps(op, el, prm), run.id))

        add(r, arrived)
        free = self.now
        while ops:
            got = None
            y = self.cmd.head_delivered()
            if y is not None:
                got = self.cmd.poll()
            elif ops[-1][0] > self.now:
                got = await select_until((self.cmd,), ops[-1][0])
                got, y = got and got[1], self.now
            while ops and (got is None or ops[0][0] <= y):   # every op that arrived before it (or all)
                at, op, el, cost, rid = ops.popleft()
                start = max(free, at)
                free = self.record_busy(start, cost, f"{op} {el}")
                self.elements += el
                rec = runs[rid]
                rec[2].append([start, free])
                rec[1] -= 1
                if not rec[1]:
                    del runs[rid]
                    await self.done[rec[0].client].send(Done(rid, "math", rec[2][0][0], free, {"ops": rec[2]}))
            if got is None:
                continue
            if free > self.now:
                await self.sleep_until(free)
            if type(got) is MathRun:
                add(got, y)
            elif type(got) is MathBatch:
                batches.append(got)
            else:
                await self._one(got, False, y)
                free = self.now
        if free > self.now:
            await self.sleep_until(free)
        for b in batches:
            await self._batch(b, False)

    async def run(self) -> None:
        data_mode = self.system.mode == "data"
        clock = self.system.clock
        c = await self.cmd.recv()
        arrived = self.now
        xs = None            # the operands of ``c`` once read (a MathCmd)
        while True:
            t = type(c)
            if t is MathRun or t is MathBatch or t is MathOp:   # fidelity pipeline
                if t is MathRun:
                    await self._runs(c, arrived)
                elif t is MathBatch:
                    await self._batch(c, data_mode)
                else:   # shapes came with the command; no TCM access (tl writes the result's descriptor if another
                        # engine reads it, runtime.Tl._tcm)
                    start = clock.now
                    self.elements += c.elements
                    await self.busy(math_ps(c.op, c.elements, self.prm), f"{c.op} {c.elements}")
                    await self.done[c.client].send(Done(c.id, "math", start, clock.now, {"elements": c.elements}))
                arrived, xs = self.cmd.head_delivered(), None
                c = self.cmd.poll()
                if c is None:
                    c = await self.cmd.recv()
                    arrived = clock.now
                continue
            if xs is None:
                self._check(c)
                xs = await self.tcm.read_all(c.srcs)
            start = clock.now
            shapes = tuple([tuple(x.shape) for x in xs])
            elements = max(map(math.prod, shapes))
            await self.busy(math_ps(c.op, elements, self.prm), f"{c.op} {elements}")
            self.elements += elements     # element ops, the energy model's MATH count (actors/ahbm/energy.py)
            if data_mode:
                out = compute(c.op, xs, c.scalar).astype(np.dtype(c.out_dtype))
            else:
                out = TensorDesc.of(_result_shape_of(c.op, shapes), c.out_dtype)
            done = Done(c.id, "math", start, clock.now, {"elements": elements})
            nxt = self.cmd.poll()
            if type(nxt) is MathCmd:     # streaming: result write + next operands in one TCM access
                self._check(nxt)
                xs = await self.tcm.access(writes=((c.out, out),), reads=nxt.srcs)
                await self.done[c.client].send(done)
            else:
                await self.tcm.write(c.out, out)
                await self.done[c.client].send(done)
                xs = None
                if nxt is None:
                    nxt = await self.cmd.recv()
                    arrived = clock.now
            c = nxt

    def describe(self) -> dict:
        return {**super().describe(), "lanes": self.prm.lanes, "fixed_cycles": self.prm.math_fixed}
