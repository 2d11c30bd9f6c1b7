"""The PE GEMM engine: an R x C bf16 MAC array with fp32 accumulation.

Service time (costs.gemm_ps): ``fill_drain + ceil(m/R) * ceil(n/C) * k`` cycles, without
``fill_drain`` for a command that accumulates onto the block already in the array
(padded tiles charged, ``gemm.charge_padded: true``) or
``fill_drain + ceil(m*n*k / (R*C))`` (actual MACs); ref §2.3, §2.6.  Commands are
served FIFO.  Operands come from the TCM (zero-time ports, see memory.Tcm).

Data mode (ref §3.3): bf16 is stored as float16; products are accumulated in
float32: ``acc = (acc if accumulate else 0) + a.astype(f32) @ b.astype(f32)``;
``out`` (if named) receives ``acc`` cast to ``out_dtype`` in the drain stage
(no extra cycles: the cast rides the drain, assumption).
"""
from __future__ import annotations

import numpy as np

from emulator.actor import Actor
from emulator.declare import In, Out
from protocols.ahbm import Done, GemmCmd
from protocols.codec import TensorDesc

from actors.ahbm.costs import gemm_ps
from actors.ahbm.memory import TCM_CLIENT_PORTS, TcmClient
from actors.ahbm.params import declare

__all__ = ["GemmEngine"]


class GemmEngine(Actor):
    """The R x C MAC array (module docstring)."""

    daemon = True
    PORTS = (In("cmd", GemmCmd, doc="GEMM commands from the CPU and the scheduler, FIFO", idle=True),
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

    async def run(self) -> None:
        data_mode = self.system.mode == "data"
        while True:
            c: GemmCmd = await self.cmd.recv()
            start = self.now
            a = await self.tcm.read(c.a)
            b = await self.tcm.read(c.b)
            if tuple(a.shape) != (c.m, c.k) or tuple(b.shape) != (c.k, c.n):
                raise RuntimeError(f"GEMM {c.id}: operand shapes {tuple(a.shape)} @ {tuple(b.shape)} do not match"
                                   f" m,k,n = {c.m},{c.k},{c.n}")
            prev = await self.tcm.read(c.acc) if c.accumulate else None
            await self.busy(gemm_ps(c.m, c.k, c.n, self.prm, c.accumulate), f"gemm {c.m}x{c.k}x{c.n}")
            self.macs += c.m * c.k * c.n
            self.report("macs", self.macs)
            if data_mode:
                acc = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
                if prev is not None:
                    acc = acc + np.asarray(prev, np.float32)
                await self.tcm.write(c.acc, acc)
                if c.out:
                    await self.tcm.write(c.out, acc.astype(np.dtype(c.out_dtype)))
            else:
                await self.tcm.write(c.acc, TensorDesc.of((c.m, c.n), "<f4"))
                if c.out:
                    await self.tcm.write(c.out, TensorDesc.of((c.m, c.n), c.out_dtype))
            await self.done[c.client].send(Done(c.id, "gemm", start, self.now, {}))

    def describe(self) -> dict:
        p = self.prm
        return {**super().describe(), "array": [p.array_rows, p.array_cols], "fill_drain_cycles": p.fill_drain,
                "charge_padded": p.charge_padded}
