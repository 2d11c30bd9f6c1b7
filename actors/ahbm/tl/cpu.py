"""The PE CPU that runs ``tl`` kernels: the adapter from the runtime's backend calls to engine messages.

:class:`TlCpu` is one actor per PE (``sip0/cube00/pe3/cpu``).  It waits for a
:class:`~protocols.ahbm_tl.KernelLaunch`, looks the kernel up (:func:`kernel`),
enters a greenback portal and calls the synchronous kernel function in its own
Trio task; every ``tl`` call awaits the methods below, which send the AHBM
engine messages of protocols/ahbm.py (DmaCmd, GemmCmd, MathCmd, CompositeCmd,
IpcqCmd, TcmReq) and collect :class:`~protocols.ahbm.Done` /
:class:`~protocols.ahbm.IpcqResp` completions on its ``done`` / ``ipcq_resp``
ports.  When the kernel returns and its outstanding commands are complete it
sends a :class:`~protocols.ahbm_tl.KernelDone` to the host.

Time charged by the CPU itself: ``costs.dispatch_ps(kind)`` per op (profile
``cpu.dispatch_cycles``), and the explicit CPU work of runtime.py (transpose,
fills).  A kernel error (KernelError) ends the run with the PE and kernel line.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

import greenback

from emulator.actor import Actor
from collections import deque

from protocols.ahbm import CompositeCmd, DmaCmd, GemmCmd, IpcqCmd, MathCmd, NocPacket, payload
from protocols.ahbm_tl import KernelDone, KernelLaunch

from actors.ahbm.costs import dispatch_ps
from actors.ahbm.memory import TcmClient
from actors.ahbm.tl.backend import PeBackend
from actors.ahbm.tl.errors import KernelError, site_of
from actors.ahbm.tl.runtime import Tl

__all__ = ["TlCpu", "register_kernel", "kernel", "KERNELS"]

_DMA_FIELDS = {f.name for f in dataclasses.fields(DmaCmd)}

#: kernel name -> function ``f(**args, tl=tl)``
KERNELS: dict[str, Callable] = {}


def register_kernel(fn: Callable, name: str | None = None) -> str:
    """Make ``fn`` launchable by name (default ``module:qualname``); returns the name."""
    name = name or f"{fn.__module__}:{fn.__qualname__}"
    KERNELS[name] = fn
    return name


def kernel(name: str) -> Callable:
    """The kernel called ``name``: registered, or importable as ``package.module:function``."""
    fn = KERNELS.get(name)
    if fn is None and ":" in name:
        mod, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError):
            fn = None
    if fn is None:
        raise KeyError(f"unknown kernel {name!r}; registered: {', '.join(sorted(KERNELS)) or 'none'}")
    return fn


class TlCpu(Actor, PeBackend):
    """A PE CPU running ``tl`` kernels (see the module docstring)."""

    daemon = True

    def __init__(self, name: str, *, prm, pe: str, dirs, coord=(0, 0, 0)):
        super().__init__(name)
        self.prm = prm
        self.pe = pe
        self.dirs = tuple(dirs)
        self.coord = [int(c) for c in coord]
        self.launch = self.in_port("launch")
        self.kernel_done = self.out_port("kernel_done")
        self.to = {k: self.out_port(k) for k in ("dma", "gemm", "math", "sched", "ipcq")}
        self.done = self.in_port("done")
        self.ipcq_resp = self.in_port("ipcq_resp")
        self.noc_out = self.out_port("noc_out")
        self.noc_in = self.in_port("noc_in")
        self.mailbox: dict[tuple, deque] = {}     # NOC packets that arrived before their recv, per source
        self.noc_waiting: dict[tuple, deque] = {}  # posted NOC receives (cid, buf), per source
        self.pkt_seq = 0
        self.tcm = TcmClient(self, "cpu")
        self.seq = 0
        self.completed: dict[int, dict] = {}
        self.kernels_run = 0

    @property
    def mode(self) -> str:
        return self.system.mode

    # -- backend ------------------------------------------------------------------
    async def dispatch(self, kind: str) -> None:
        ps = dispatch_ps(kind, self.prm)
        if ps:
            await self.busy(ps, f"dispatch {kind}")

    async def cpu_busy(self, ps: int, label: str) -> None:
        if ps:
            await self.busy(ps, label)

    def _id(self) -> int:
        self.seq += 1
        return self.seq

    async def dma(self, op, addr, rows, row_bytes, pitch, buf, shape, dtype) -> int:
        cid = self._id()
        kw = dict(id=cid, op=op, addr=int(addr), rows=int(rows), row_bytes=int(row_bytes), pitch=int(pitch), buf=buf,
                  shape=list(shape), dtype=dtype, client="cpu")
        if "target" in _DMA_FIELDS:
            kw["target"] = []  # this PE's own HBM
        await self.to["dma"].send(DmaCmd(**kw))
        return cid

    async def gemm(self, a, b, acc, m, k, n) -> int:
        cid = self._id()
        await self.to["gemm"].send(GemmCmd(cid, a, b, acc, False, "", "<f4", m, k, n, "cpu"))
        return cid

    async def math(self, op, srcs, out, scalar, out_dtype) -> int:
        cid = self._id()
        await self.to["math"].send(MathCmd(cid, op, list(srcs), out, float(scalar), out_dtype, "cpu"))
        return cid

    async def composite(self, a_addr, b_addr, c_addr, m, k, n, dtype, epilogue) -> int:
        cid = self._id()
        await self.to["sched"].send(CompositeCmd(cid, a_addr, b_addr, c_addr, m, k, n, dtype,
                                                 [list(e) for e in epilogue], "cpu"))
        return cid

    async def ipcq(self, op, dir, buf) -> int:
        cid = self._id()
        await self.to["ipcq"].send(IpcqCmd(cid, op, dir, buf))
        return cid

    @property
    def has_noc(self) -> bool:
        return self.noc_out.link is not None

    async def noc_send(self, dst, buf) -> None:
        """A NocPacket to PE ``dst = [sip, cube, pe]`` over the CUBE NOC (actors/ahbm/noc.py): the CPU
        reads its TCM buffer (zero time, memory.Tcm) and the packet enters the PE's router attach link."""
        data = await self.tcm.read(buf)
        self.pkt_seq += 1
        s, c, p = self.coord
        pid = self.pkt_seq * self.prm.pes + (s * self.prm.cubes + c) * self.prm.P + p
        await self.noc_out.send(NocPacket(pid, list(self.coord), [int(x) for x in dst], 0, payload(data)))

    async def noc_recv(self, src, buf) -> int:
        """Post a receive of the next NOC packet from ``src``; completes when it is in TCM ``buf``."""
        cid = self._id()
        src = tuple(int(x) for x in src)
        box = self.mailbox.get(src)
        if box:
            await self.tcm.write(buf, box.popleft().payload.t)
            self.completed[cid] = {"engine": "noc", "end": self.now}
        else:
            self.noc_waiting.setdefault(src, deque()).append((cid, buf))
        return cid

    async def _arrived(self, pkt) -> None:
        src = tuple(pkt.src)
        waiting = self.noc_waiting.get(src)
        if waiting:
            cid, buf = waiting.popleft()
            await self.tcm.write(buf, pkt.payload.t)
            self.completed[cid] = {"engine": "noc", "end": self.now, "hops": pkt.hops}
        else:
            self.mailbox.setdefault(src, deque()).append(pkt)

    async def wait(self, cid: int) -> dict:
        ports = (self.done, self.ipcq_resp, self.noc_in) if self.noc_in.links else (self.done, self.ipcq_resp)
        while cid not in self.completed:
            port, msg = await self.select(*ports)
            if port is self.done:
                self.completed[msg.id] = {"engine": msg.engine, "start": msg.start, "end": msg.end, **msg.info}
            elif port is self.ipcq_resp:
                self.completed[msg.id] = {"engine": "ipcq", "end": self.now}
            else:
                await self._arrived(msg)
        return self.completed[cid]

    async def tcm_read(self, buf):
        return await self.tcm.read(buf)

    async def tcm_write(self, buf, data) -> None:
        await self.tcm.write(buf, data)

    async def tcm_free(self, buf) -> None:
        await self.tcm.free(buf)

    def report(self, key, value) -> None:
        Actor.report(self, key, value)

    # -- the actor ----------------------------------------------------------------
    async def run(self) -> None:
        if not self.launch.links:
            return  # not part of any launch grid: an idle PE
        await greenback.ensure_portal()
        while True:
            launch: KernelLaunch = await self.launch.recv()
            try:
                fn = kernel(launch.kernel)
            except KeyError as e:
                raise KernelError(self.pe, str(e.args[0]), site="launch") from None
            start = self.now
            tl = Tl(self, program_id=launch.program_id, num_programs=launch.num_programs)
            try:
                fn(**launch.args, tl=tl)
                stats = tl.finish()
            except KernelError:
                raise
            except Exception as e:  # a bug in the kernel itself: name the PE and the kernel line
                raise KernelError(self.pe, f"the kernel raised {type(e).__name__}: {e}",
                                  site_of(e.__traceback__)) from None
            self.kernels_run += 1
            await self.kernel_done.send(KernelDone(self.pe, launch.kernel, start, self.now, stats))

    def describe(self) -> dict:
        return {**super().describe(), "dirs": list(self.dirs),
                "dispatch_ps": {k: dispatch_ps(k, self.prm) for k in sorted(self.prm.dispatch)}}
