"""The PE GEMM engine: an R x C bf16 MAC array with fp32 accumulation, pipelined.

Service time (costs.gemm_cycles): a command occupies the array for its core cycles
``ceil(m/R) * ceil(n/C) * k`` (padded tiles charged, ``gemm.charge_padded: true``;
else ``ceil(m*n*k / (R*C))``) and completes ``fill_drain`` cycles after that, while
the next command's operands already enter the array (ref §2.3, §2.6; costs.py
says why).  So command i starts at ``max(arrival_i, start_{i-1} + core_{i-1})`` and
completes at ``start_i + fill_drain + core_i``; a lone command takes
``fill_drain + core`` as before.  Exception: a PE-scheduler K step that names no
``out`` (not the last K step of its output block) leaves the partial sums in the
array's accumulators for the next step (output-stationary); nothing drains, so it
completes when its operands have entered (``start_i + core_i``): its operand
buffers are free then, which is what the scheduler waits for.  Trace: a command's
core cycles are a busy span "gemm MxKxN", its drain a busy span "drain" (so a
lone command shows ``fill_drain + core`` of busy time, as before); the drain of
one command may overlap the next one's core span, so with back-to-back commands
``busy_ps`` counts that overlap twice; ``array_ps`` is the array's occupancy alone.  Commands are served FIFO.  Operands come from the
TCM (zero-time ports, see memory.Tcm), read in one access when the command starts; the
accumulator and the output are written in one posted access when its core cycles end
(they are only read after the completion).

Data mode (ref §3.3): bf16 is stored as float16; products are accumulated in
float32, as each cell of an output-stationary array does: ``acc`` (when
``accumulate``) first, then the products in increasing k, one rounding per add
(``emulator.numerics.matmul``: the same bits on every CPU, no BLAS);
``out`` (if named) receives ``acc`` cast to ``out_dtype`` in the drain stage
(no extra cycles: the cast rides the drain, assumption).
"""
from __future__ import annotations

from collections import deque

import numpy as np

from emulator import numerics
from emulator.actor import Actor
from emulator.declare import In, Out
from emulator.trace import BUSY
from emulator.waitqueue import WaitQueue
from protocols.ahbm import Done, GemmBatch, GemmCmd, GemmHold
from protocols.codec import TensorDesc

from actors.ahbm.costs import gemm_occupancy_ps, gemm_ps
from actors.ahbm.hold import wait_release
from actors.ahbm.memory import TCM_CLIENT_PORTS, TcmClient
from actors.ahbm.params import declare
from actors.ahbm.pipeline import plan_cached, schedule

__all__ = ["GemmEngine"]


class GemmEngine(Actor):
    """The R x C MAC array (module docstring)."""
    STATE = ("macs", "array_ps")   # what a state snapshot shows (emulator/snapshot.py)

    daemon = True
    starts_on = "cmd"    # started by its first command (Actor.starts_on)
    PORTS = (In("cmd", GemmCmd, GemmBatch, GemmHold, idle=True,
                doc="GEMM commands from the CPU and the scheduler, FIFO (GemmBatch, GemmHold: fidelity pipeline)"),
             Out("done_{client}", Done, doc="completion to each client (cpu, sched)"),
             *TCM_CLIENT_PORTS)
    PARAMS = declare("array_rows", "array_cols", "fill_drain", "charge_padded", "pe_clk")

    def __init__(self, name: str, *, prm, clients: list[str]):
        super().__init__(name)
        self.prm = prm
        self.cmd = self.in_port("cmd", idle=True)
        self.done = {c: self.out_port(f"done_{c}") for c in clients}
        self.tcm = TcmClient(self, "gemm")
        self.macs = 0
        self.array_ps = 0                # time the array was occupied by operands (core cycles)
        self._done: deque = deque()      # (completion time, client, Done), in command order
        self._drained = WaitQueue()
        self._pl = None                  # fidelity pipeline: (T_A, E_last) of the last scheduler batch (pipeline.py)
        self._later: deque = deque()     # commands that arrived while the scheduler held the array (GemmHold)
        self.held_back = 0               # how many (read by tests)

    async def run(self) -> None:
        # idle until the first command: the nursery is opened then (opening it emits nothing, and its
        # one sub-task starts at its queue's first unpark anyway)
        c = await self.cmd.recv()
        async with self.subtasks() as n:
            self._drained.start_at_first_unpark(n, self._complete)
            await self._array(c)

    async def _array(self, c: GemmCmd) -> None:
        """Take commands in order (``c`` the first); each occupies the array for its core cycles."""
        data_mode = self.system.mode == "data"
        while True:
            if c is None:
                c = self._later.popleft() if self._later else await self.cmd.recv()
            if type(c) is GemmBatch:
                await self._batch(c, data_mode)
                c = None
                continue
            if type(c) is GemmHold:
                await self._held(c)
                c = None
                continue
            self._pl = None
            start = self.now
            # all operands in one TCM access (as a MATH op reads its operands; issue #13)
            if c.accumulate:
                a, b, prev = await self.tcm.read_all((c.a, c.b, c.acc))
            else:
                a, b = await self.tcm.read_all((c.a, c.b))
                prev = None
            if tuple(a.shape) != (c.m, c.k) or tuple(b.shape) != (c.k, c.n):
                raise RuntimeError(f"GEMM {c.id}: operand shapes {tuple(a.shape)} @ {tuple(b.shape)} do not match"
                                   f" m,k,n = {c.m},{c.k},{c.n}")
            core = gemm_occupancy_ps(c.m, c.k, c.n, self.prm)
            await self.busy(core, f"gemm {c.m}x{c.k}x{c.n}")
            self.array_ps += core
            self.macs += c.m * c.k * c.n
            self.report("macs", self.macs)
            if data_mode:
                acc = numerics.matmul(a, b, acc=np.float32, init=prev)
                writes = [(c.acc, acc)]
                if c.out:
                    writes.append((c.out, acc.astype(np.dtype(c.out_dtype))))
            else:
                writes = [(c.acc, TensorDesc.of((c.m, c.n), "<f4"))]
                if c.out:
                    writes.append((c.out, TensorDesc.of((c.m, c.n), c.out_dtype)))
            await self.tcm.access(writes=writes)   # the accumulator and the output in one (posted) access
            # a scheduler K step without ``out`` leaves its partial block in the array's accumulators for the
            # next step: nothing drains, it is complete once its operands have entered (module docstring)
            end = self.now if (c.client == "sched" and not c.out) else start + gemm_ps(c.m, c.k, c.n, self.prm)
            self._done.append((end, c.client, Done(c.id, "gemm", start, end, {})))
            self._drained.unpark()
            c = None

    async def _batch(self, c: GemmBatch, data_mode: bool) -> None:
        """``fidelity: pipeline``: a whole TCM-resident composite (pipeline.py).  No TCM access: in timing mode
        the TCM holds descriptors only and takes no time, the operand shapes were checked by the tl runtime
        and come with the batch.  Its steps' core cycles are busy spans merged where back to back, the epilogue's
        per-tile start times go to the scheduler at once (a ``Done`` with id ``-c.id``, the scheduler hands
        them to the MATH engine), and the batch completes when the block scheduler's loop would have closed
        its last step."""
        if data_mode:
            raise RuntimeError(f"GEMM batch {c.id}: fidelity pipeline runs in timing mode only")
        now = self.now
        steps = plan_cached(c.m, c.k, c.n, tuple(c.tile))
        pl = self._pl
        if pl is not None and c.sent <= pl[0]:    # taken ahead: the same loop goes on
            send0, e_prev = pl[0], pl[1]
        else:
            send0, e_prev = (c.sent if pl is None else max(c.sent, pl[1])), None
        sch = schedule(steps, self.prm, list(c.epi_ps), max(send0, 0), e_prev, now, 0)
        self._pl = (sch.t_a, sch.e_last)
        if sch.epi_at:
            await self.done[c.client].send(Done(-c.id, "gemm", sch.first_start, sch.first_start,
                                                {"epi_at": sch.epi_at}))
        label = f"gemm batch {c.m}x{c.k}x{c.n}"
        if self.faults:     # a fault hook may lengthen a span (Actor.busy): span by span
            for t0, t1 in sch.spans:
                await self.busy(t1 - t0, label, start=t0)
        else:               # the same spans as busy() would record (recorded when scheduled), one wake-up
            emit, aid = self._emit, self.id
            for t0, t1 in sch.spans:
                self.busy_ps += t1 - t0
                self.busy_spans += 1
                emit((BUSY, t0, aid, t1, label))
            self.busy_until, self.busy_label = sch.spans[-1][1], label     # what a state snapshot shows
            await self.sleep_until(sch.spans[-1][1])
        self.array_ps += sch.core_ps
        self.macs += sch.macs
        self.report("macs", self.macs)
        end = max(sch.t_a, sch.done_last)
        self._done.append((end, c.client, Done(c.id, "gemm", sch.first_start, end, {"steps": len(steps)})))
        self._drained.unpark()

    async def _held(self, h: GemmHold) -> None:
        """``fidelity: pipeline``: the scheduler holds the array (protocols.ahbm.GemmHold, pipeline.HeldArray).
        The answer says when the array is free (now: the commands before the hold have had their core
        cycles) and when its last queued completion leaves; commands that arrive until the release wait
        in ``_later``; the release brings the run's busy spans, recorded as :meth:`busy` would have."""
        if self.faults:     # the scheduler times the held steps from the formulas: a fault could not lengthen them
            raise RuntimeError(f"{self.name}: a fault plan targets this GEMM engine; fidelity pipeline holds the"
                               " array for HBM-operand composites (pipeline.HeldArray): run it at fidelity block")
        self._pl = None
        deliv = max([e for e, _, _ in self._done], default=self.now)
        await self.done[h.client].send(Done(h.id, "gemm", self.now, max(deliv, self.now), {}))
        r = await wait_release(self, self.cmd, GemmHold, h.id)
        self.record_spans(r.spans)
        self.array_ps += r.core_ps
        self.macs += r.macs
        self.report("macs", self.macs)

    async def _complete(self) -> None:
        """The drain: each completion leaves ``fill_drain`` after its command's core cycles, in order."""
        while True:
            while not self._done:
                await self._drained.park()
            end, client, done = self._done.popleft()
            if end > self.now:   # the drain: a span of its own (it overlaps the next command's core cycles)
                await self.busy(end - self.now, "drain")
            await self.done[client].send(done)

    def describe(self) -> dict:
        p = self.prm
        return {**super().describe(), "array": [p.array_rows, p.array_cols], "fill_drain_cycles": p.fill_drain,
                "charge_padded": p.charge_padded}
