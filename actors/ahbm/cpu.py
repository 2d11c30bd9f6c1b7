"""The PE CPU: runs a command script, dispatching commands to the PE's engines by message.

For this issue the CPU runs a *script*: a list of commands (dicts) received in
a :class:`~protocols.ahbm.Launch` from the host.  The later ``tl`` kernel
runtime plugs in at :meth:`PeCpu.execute`: every ``tl`` call becomes one such
command (``tl.load`` -> ``dma``, ``tl.composite`` -> ``composite``, ``tl.send``
-> ``send`` ...), awaited from the kernel's greenlet.

Each command costs the CPU a dispatch time first (costs.dispatch_ps, seed §B:
a composite descriptor push costs more than a primitive op), then is sent to
its engine.  A command is blocking unless ``"async": true`` (dma, gemm, math,
composite); ``{"op": "wait"}`` waits for every outstanding async command.

Commands (keys besides ``op``; ``label`` optional everywhere):

* ``dma``: ``kind`` load|store, ``addr``, ``rows``, ``row_bytes``, ``pitch``, ``buf``, ``shape``, ``dtype``,
  optional ``target`` = [sip, cube, pe] for another PE's HBM (over the NOC)
* ``gemm``: ``a``, ``b``, ``acc``, ``accumulate``, ``out``, ``out_dtype``, ``m``, ``k``, ``n``
* ``math``: ``fn``, ``srcs``, ``out``, ``scalar``, ``out_dtype``
* ``composite``: ``a_addr``, ``b_addr``, ``c_addr``, ``m``, ``k``, ``n``, ``dtype``, ``epilogue``
* ``send`` / ``recv``: ``dir`` (N/S/E/W IPCQ), ``buf``
* ``noc_send``: ``to`` = [sip, cube, pe], ``buf``; ``noc_recv``: ``buf``
* ``free``: ``buf``; ``wait``; ``sleep``: ``ps``

The CPU reports, per command, ``[label, t_start, t_issued, t_done]`` in its
:class:`~protocols.ahbm.PeDone` (t_start before dispatch, t_issued after).
"""
from __future__ import annotations

from collections import deque

from emulator.actor import Actor
from protocols.ahbm import (CompositeCmd, DmaCmd, GemmCmd, IpcqCmd, Launch, MathCmd, NocPacket,
                            PeDone, payload)

from actors.ahbm.costs import dispatch_ps
from actors.ahbm.memory import TcmClient

PKT_ID0 = 1 << 16  # packet ids start here so their msgpack size is constant (5 bytes)

_KIND = {"dma": "dma", "gemm": "gemm", "math": "math", "composite": "composite", "send": "ipcq", "recv": "ipcq",
         "noc_send": "noc", "noc_recv": "noc"}


class PeCpu(Actor):
    daemon = True

    def __init__(self, name: str, *, prm, coord: tuple[int, int, int]):
        super().__init__(name)
        self.prm = prm
        self.coord = list(coord)
        self.launch = self.in_port("launch")
        self.pe_done = self.out_port("pe_done")
        self.to = {k: self.out_port(k) for k in ("dma", "gemm", "math", "sched", "ipcq", "noc_out")}
        self.done = self.in_port("done")
        self.ipcq_resp = self.in_port("ipcq_resp")
        self.noc_in = self.in_port("noc_in")
        self.tcm = TcmClient(self, "cpu")
        self.seq = 0
        self.finished: set[int] = set()
        self.outstanding: list[int] = []
        self.mailbox: deque = deque()
        self.pkt_seq = 0

    def _id(self) -> int:
        self.seq += 1
        return self.seq

    async def _pump(self) -> None:
        """Take one completion or NOC message from whichever port has one."""
        port, msg = await self.select(self.done, self.ipcq_resp, self.noc_in)
        if port is self.noc_in:
            self.mailbox.append(msg)
        else:
            self.finished.add(msg.id)

    async def _await(self, cid: int) -> None:
        while cid not in self.finished:
            await self._pump()
        self.finished.discard(cid)

    async def execute(self, c: dict) -> None:
        """Dispatch one command and (unless async) wait for it."""
        op = c.get("op")
        if op not in _KIND and op not in ("wait", "free", "sleep"):
            raise RuntimeError(f"{self.name}: unknown script command {op!r}")
        if op in _KIND:
            await self.busy(dispatch_ps(_KIND[op], self.prm), f"dispatch {op}")
        cid = self._id()
        if op == "dma":
            await self.to["dma"].send(DmaCmd(cid, c["kind"], c["addr"], c.get("rows", 1), c["row_bytes"],
                                             c.get("pitch", c["row_bytes"]), c["buf"], list(c["shape"]),
                                             c["dtype"], "cpu", list(c.get("target") or [])))
        elif op == "gemm":
            await self.to["gemm"].send(GemmCmd(cid, c["a"], c["b"], c["acc"], bool(c.get("accumulate", False)),
                                               c.get("out", ""), c.get("out_dtype", "<f4"), c["m"], c["k"], c["n"],
                                               "cpu"))
        elif op == "math":
            await self.to["math"].send(MathCmd(cid, c["fn"], list(c["srcs"]), c["out"], float(c.get("scalar", 0.0)),
                                               c.get("out_dtype", "<f4"), "cpu"))
        elif op == "composite":
            await self.to["sched"].send(CompositeCmd(cid, c["a_addr"], c["b_addr"], c["c_addr"], c["m"], c["k"],
                                                     c["n"], c["dtype"], [list(e) for e in c.get("epilogue", [])],
                                                     "cpu"))
        elif op in ("send", "recv"):
            await self.to["ipcq"].send(IpcqCmd(cid, op, c["dir"], c["buf"]))
            await self._await(cid)
            return
        elif op == "noc_send":
            data = await self.tcm.read(c["buf"])
            self.pkt_seq += 1
            pid = PKT_ID0 + self.prm.pes * self.pkt_seq + self._flat()  # fixed-width (uint32) ids
            await self.to["noc_out"].send(NocPacket(pid, self.coord, list(c["to"]), 0, payload(data)))
            return
        elif op == "noc_recv":
            while not self.mailbox:
                await self._pump()
            pkt: NocPacket = self.mailbox.popleft()
            await self.tcm.write(c["buf"], pkt.payload.t)
            return
        elif op == "free":
            await self.tcm.free(c["buf"])
            return
        elif op == "sleep":
            await self.sleep(int(c["ps"]))
            return
        elif op == "wait":
            for i in self.outstanding:
                await self._await(i)
            self.outstanding.clear()
            return
        if c.get("async"):
            self.outstanding.append(cid)
        else:
            await self._await(cid)

    def _flat(self) -> int:
        s, cu, p = self.coord
        return (s * self.prm.cubes + cu) * self.prm.P + p

    async def run(self) -> None:
        if not self.launch.links:
            return  # no script for this PE in this workload: the CPU stays idle
        while True:
            launch: Launch = await self.launch.recv()
            log = []
            for i, c in enumerate(launch.script):
                t0 = self.now
                await self.execute(c)
                log.append([c.get("label", f"{i}:{c.get('op')}"), t0, t0 + (dispatch_ps(_KIND[c["op"]], self.prm)
                                                                             if c.get("op") in _KIND else 0), self.now])
            for i in self.outstanding:
                await self._await(i)
            self.outstanding.clear()
            await self.pe_done.send(PeDone(self.name, self.now, log))
