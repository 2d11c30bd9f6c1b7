"""The PE CPU: one actor per PE that runs what the host launches - a command script or a ``tl`` kernel.

The CPU is hardware; what it runs is software, chosen per launch by the message
the host sends (host.py), so every PE of every machine can run either:

* :class:`~protocols.ahbm.Launch`: a *script*, a list of commands (dicts), run
  in order by :meth:`PeCpu.execute`; answered by a :class:`~protocols.ahbm.PeDone`
  with per-command timings ``[label, t_start, t_issued, t_done]`` (t_start
  before dispatch, t_issued after);
* any other launch type with a handler registered by :meth:`PeCpu.register_launch`:
  the ``tl`` runtime registers :class:`~protocols.ahbm_tl.KernelLaunch` (a synchronous
  kernel run in a greenback portal, actors/ahbm/tl/kernel_registry.py), so this
  hardware module never imports the kernel runtime;
  answered by a :class:`~protocols.ahbm_tl.KernelDone`.

Both go through the same issue primitives (:meth:`dma`, :meth:`gemm`,
:meth:`math`, :meth:`composite`, :meth:`ipcq`, :meth:`noc_send`,
:meth:`noc_recv`, :meth:`wait`: the ``tl`` backend interface of
actors/ahbm/tl/backend.py), which send the engine messages of
protocols/ahbm.py.  Each command costs the CPU a dispatch time first
(costs.dispatch_ps, seed §B / §9 item 6: a composite descriptor push costs more
than a primitive op); a script charges it in :meth:`execute`, the ``tl``
runtime per call.

Completion tracking (why no command or completion queue can deadlock): every
engine answers on its own completion link into ``done`` / ``ipcq_resp``, of
``capacity`` entries (builder.completion_depth: one per command-queue slot plus
one per command the engine holds off its queue).  The CPU holds one
*completion credit* per entry: before it issues a command to an engine with
every credit of that engine taken by commands whose completion it has not yet
consumed, it first consumes completions (zero time; they are waiting in its
queue or arrive) until one frees.  So an engine never blocks on a full
completion queue, it always drains its command queue, and a CPU blocked on a
full command queue is always released.  (An unbounded completion queue would
hide the problem; a CPU that only drained completions while blocked on a send
would still let engines stall on a full queue while it dispatches.)  Because
the completion queue has an entry for every command the engine can hold, the
credit only binds when the completions are already there or when the command
queue is full anyway: it costs no time against an unbounded completion queue.
Assumption: consuming a completion takes no CPU time.

Script commands (keys besides ``op``; ``label`` optional everywhere):

* ``dma``: ``kind`` load|store, ``addr``, ``rows``, ``row_bytes``, ``pitch``, ``buf``, ``shape``, ``dtype``,
  optional ``target`` = [sip, cube, pe] for another PE's HBM (over the NOC)
* ``gemm``: ``a``, ``b``, ``acc``, ``accumulate``, ``out``, ``out_dtype``, ``m``, ``k``, ``n``
* ``math``: ``fn``, ``srcs``, ``out``, ``scalar``, ``out_dtype``
* ``composite``: ``a_addr``, ``b_addr``, ``c_addr``, ``m``, ``k``, ``n``, ``dtype``, ``epilogue``; optional
  ``a_buf`` / ``b_buf`` / ``c_buf`` (TCM-resident operand, no DMA) and ``c_dtype``
* ``send`` / ``recv``: ``dir`` (N/S/E/W IPCQ), ``buf``
* ``noc_send``: ``to`` = [sip, cube, pe], ``buf``; ``noc_recv``: ``buf``, optional ``from`` = [sip, cube, pe]
* ``free``: ``buf``; ``wait``; ``sleep``: ``ps``

A command is blocking unless ``"async": true`` (dma, gemm, math, composite);
``{"op": "wait"}`` waits for every outstanding async command.
"""
from __future__ import annotations

from collections import deque

import math

import numpy as np

from emulator.actor import Actor
from emulator.declare import In, Out
from protocols.ahbm import (CompositeCmd, DmaCmd, DmaGather, Done, GemmCmd, IpcqCmd, IpcqResp, Launch, MathCmd, MathOp,
                            MathRun, NocPacket, PeDone, payload)
from protocols.ahbm_tl import KernelDone, KernelLaunch

from actors.ahbm.costs import dispatch_ps
from actors.ahbm.memory import TCM_CLIENT_PORTS, TcmClient
from actors.ahbm.params import GEOMETRY, declare, pe_name

__all__ = ["PeCpu", "PKT_ID0"]

PKT_ID0 = 1 << 16  # packet ids start here so their msgpack size is constant (5 bytes)

_KIND = {"dma": "dma", "gemm": "gemm", "math": "math", "composite": "composite", "send": "ipcq", "recv": "ipcq",
         "noc_send": "noc", "noc_recv": "noc"}
#: engine (for completion credits) -> the out-port its commands leave on
_PORT = {"dma": "dma", "gemm": "gemm", "math": "math", "sched": "sched", "ipcq": "ipcq"}


#: what :meth:`PeCpu.wait` returns for a completed command whose info :meth:`PeCpu.forget` dropped
FORGOTTEN = {"engine": "", "end": 0, "forgotten": True}


class PeCpu(Actor):
    """A PE CPU (see the module docstring); it offers the ``tl`` runtime's backend interface
    (actors/ahbm/tl/backend.py, a structural protocol) without importing the runtime."""
    STATE = ("inflight", "outstanding", "mailbox", "noc_waiting", "seq")   # what a state snapshot shows (emulator/snapshot.py)

    daemon = True
    PORTS = (In("launch", Launch, KernelLaunch, doc="a script or a registered launch type, from the host", idle=True),
             Out("pe_done", PeDone, KernelDone, doc="the launch's completion, to the host"),
             Out("dma", DmaCmd, DmaGather, doc="DMA commands"), Out("gemm", GemmCmd, doc="GEMM commands"),
             Out("math", MathCmd, MathOp, MathRun, doc="MATH commands (MathOp, MathRun: fidelity pipeline)"),
             Out("sched", CompositeCmd, doc="composites, to the scheduler"),
             Out("ipcq", IpcqCmd, doc="IPCQ send / recv"), Out("noc_out", NocPacket, doc="NOC packets to other PEs"),
             In("done", Done, doc="completions of the DMA, GEMM, MATH engines and the scheduler"),
             In("ipcq_resp", IpcqResp, doc="IPCQ completions"), In("noc_in", NocPacket, doc="NOC packets from other PEs"),
             *TCM_CLIENT_PORTS)
    #: what the CPU and the ``tl`` runtime and kernels it runs read (tl/runtime.py: TCM and HBM allocators,
    #: fills at the MATH lane rate; kernels: the PE grid)
    PARAMS = declare(*GEOMETRY, "gx", "gy", "dispatch", "tcm_bytes", "tile", "burst", "hbm_capacity", "pe_clk",
                     "lanes", "math_fixed")
    #: launch message type -> ``async handler(cpu, launch) -> done message``, for launches
    #: other than command scripts (:meth:`register_launch`)
    launch_handlers: dict = {}

    @classmethod
    def register_launch(cls, msg_type: type, handler) -> None:
        """Let this CPU run launches of ``msg_type`` with ``handler`` (e.g. the ``tl`` runtime's kernels)."""
        cls.launch_handlers[msg_type] = handler

    def __init__(self, name: str, *, prm, coord: tuple[int, int, int], dirs=(), math_op: bool = False):
        """``math_op``: send the MATH engine MathOps (fidelity pipeline in timing mode, actors/ahbm/pipeline.py)."""
        super().__init__(name)
        self.prm = prm
        self.coord = [int(c) for c in coord]
        self.pe = pe_name(*self.coord)
        self.dirs = tuple(dirs)
        self.launch = self.in_port("launch", idle=True)
        self.pe_done = self.out_port("pe_done")
        self.to = {k: self.out_port(k) for k in ("dma", "gemm", "math", "sched", "ipcq", "noc_out")}
        self.done = self.in_port("done")
        self.ipcq_resp = self.in_port("ipcq_resp")
        self.noc_in = self.in_port("noc_in")
        self.tcm = TcmClient(self, "cpu")
        self.seq = 0
        self.completed: dict[int, dict] = {}      # command id -> completion info (kept until the launch ends)
        self.engine_of: dict[int, str] = {}       # command id -> engine, while its completion is not consumed
        self.inflight = {e: 0 for e in _PORT}    # per engine: issued, completion not yet consumed
        self.credits: dict[str, int] = {}         # per engine: completion-queue entries (from the wiring)
        self.outstanding: list[int] = []          # async script commands
        self.mailbox: deque = deque()             # NOC packets arrived before their receive was posted
        self.noc_waiting: deque = deque()         # posted NOC receives (src or None, cid, buf)
        self.math_op = math_op
        self.forgotten_below = 0                  # every command id below it not in `completed` completed (forget)
        self.pkt_seq = 0
        self._pump_ports = None                   # the ports completions arrive on (_pump)

    # -- backend interface (actors/ahbm/tl/backend.py) ---------------------------------
    @property
    def mode(self) -> str:
        return self.system.mode

    @property
    def has_noc(self) -> bool:
        return self.to["noc_out"].link is not None

    def _id(self) -> int:
        self.seq += 1
        return self.seq

    def _flat(self) -> int:
        s, cu, p = self.coord
        return (s * self.prm.cubes + cu) * self.prm.P + p

    async def dispatch(self, kind: str) -> None:
        ps = dispatch_ps(kind, self.prm)
        if ps:
            await self.busy(ps, f"dispatch {kind}")

    async def cpu_busy(self, ps: int, label: str) -> None:
        if ps:
            await self.busy(ps, label)

    def _capacity(self, engine: str) -> int:
        """Completion-queue entries of ``engine``: the capacity of its completion link into this CPU."""
        cap = self.credits.get(engine)
        if cap is None:
            port = self.ipcq_resp if engine == "ipcq" else self.done
            peer = self.to[_PORT[engine]].peer
            cap = port.capacity_from(peer) if peer is not None else None
            if cap is None:
                raise RuntimeError(f"{self.name}: no completion link from the {engine} engine")
            self.credits[engine] = cap
        return cap

    async def _issue(self, engine: str, msg) -> int:
        """Send command ``msg`` to ``engine`` once a completion credit is free (module docstring)."""
        cap = self.credits.get(engine)
        if cap is None:
            cap = self._capacity(engine)
        while self.inflight[engine] >= cap:
            await self._pump()
        self.inflight[engine] += 1
        self.engine_of[msg.id] = engine
        await self.to[_PORT[engine]].send(msg)
        return msg.id

    async def dma(self, op, addr, rows, row_bytes, pitch, buf, shape, dtype, target=None) -> int:
        return await self._issue("dma", DmaCmd(id=self._id(), op=op, addr=int(addr), rows=int(rows),
                                               row_bytes=int(row_bytes), pitch=int(pitch), buf=buf,
                                               shape=list(shape), dtype=dtype, client="cpu",
                                               target=[int(x) for x in (target or [])]))

    async def dma_gather(self, op, addr, parts, target=None) -> int:
        """One DMA between the contiguous HBM range at ``addr`` and the TCM buffers ``parts``
        (``[[buf, shape, dtype], ...]``, back to back in HBM): :class:`~protocols.ahbm.DmaGather`."""
        return await self._issue("dma", DmaGather(self._id(), op, int(addr),
                                                  [[b, [int(x) for x in sh], dt] for b, sh, dt in parts], "cpu",
                                                  [int(x) for x in (target or [])]))

    async def gemm(self, a, b, acc, m, k, n, accumulate=False, out="", out_dtype="<f4") -> int:
        return await self._issue("gemm", GemmCmd(id=self._id(), a=a, b=b, acc=acc, accumulate=bool(accumulate),
                                                 out=out, out_dtype=out_dtype, m=int(m), k=int(k), n=int(n),
                                                 client="cpu"))

    async def math(self, op, srcs, out, scalar, out_dtype, shapes=None) -> int:
        """A MATH command; with ``shapes`` (the operands' and the result's, from the tl runtime) under
        ``fidelity: pipeline`` in timing mode, a :class:`MathOp` the engine runs without reading the TCM."""
        self.seq += 1     # self._id(), inlined (every MATH op)
        if shapes is not None and self.math_op:
            ins, res = shapes
            return await self._issue("math", MathOp(self.seq, op, list(srcs), out, float(scalar), out_dtype, "cpu",
                                                    max(map(math.prod, ins)), list(res)))
        return await self._issue("math", MathCmd(self.seq, op, list(srcs), out, float(scalar), out_dtype, "cpu"))

    def reserve_id(self) -> int:
        """A command id for a MATH op the tl runtime holds back to send in a :meth:`math_run` (zero time)."""
        self.seq += 1
        return self.seq

    async def math_run(self, first: int, ops: list) -> None:
        """Send MATH ops ``first``, ``first + 1``, ... (``[[op, elements], ...]``, ids from :meth:`reserve_id`)
        as one :class:`MathRun` (``fidelity: pipeline``), at the time and CPU cost of sending them one by one:
        each op costs its dispatch (costs.dispatch_ps ``math``) and would have left once its own was charged,
        so the first is charged, the run sent (the engine takes op ``j`` as arriving ``j`` dispatches later),
        the others charged in one span.  The run's ``Done`` gives every op's end (:meth:`wait`)."""
        gap = dispatch_ps("math", self.prm)
        if gap:
            await self.busy(gap, "dispatch math")
        await self._issue("math", MathRun(first, ops, gap, "cpu"))
        if gap and len(ops) > 1:
            await self.busy((len(ops) - 1) * gap, f"dispatch math x{len(ops) - 1}")

    async def composite(self, a_addr, b_addr, c_addr, m, k, n, dtype, epilogue, *, a_buf="", b_buf="", c_buf="",
                        c_dtype="") -> int:
        return await self._issue("sched", CompositeCmd(id=self._id(), a_addr=int(a_addr), b_addr=int(b_addr),
                                                       c_addr=int(c_addr), m=int(m), k=int(k), n=int(n), dtype=dtype,
                                                       epilogue=[list(e) for e in epilogue], client="cpu",
                                                       a_buf=a_buf, b_buf=b_buf, c_buf=c_buf, c_dtype=c_dtype))

    async def ipcq(self, op, dir, buf) -> int:
        return await self._issue("ipcq", IpcqCmd(id=self._id(), op=op, dir=dir, buf=buf))

    async def noc_send(self, dst, buf) -> None:
        """A NocPacket to PE ``dst = [sip, cube, pe]`` over the CUBE NOC / UCIe (noc.py): the CPU reads its
        TCM buffer (zero time, memory.Tcm) and the packet enters the PE's router attach link."""
        data = await self.tcm.read(buf)
        self.pkt_seq += 1
        pid = PKT_ID0 + self.prm.pes * self.pkt_seq + self._flat()  # fixed-width (uint32) ids
        await self.to["noc_out"].send(NocPacket(pid, list(self.coord), [int(x) for x in dst], 0, payload(data)))

    async def noc_recv(self, src, buf) -> int:
        """Post a receive of the next NOC packet from ``src`` (``None``: from anyone) into TCM ``buf``;
        returns a command id that completes when the packet is in the TCM."""
        cid = self._id()
        src = None if src is None else [int(x) for x in src]
        for i, pkt in enumerate(self.mailbox):
            if src is None or list(pkt.src) == src:
                del self.mailbox[i]
                await self._deliver_pkt(cid, buf, pkt)
                return cid
        self.noc_waiting.append((src, cid, buf))
        return cid

    async def _deliver_pkt(self, cid: int, buf: str, pkt: NocPacket) -> None:
        t = pkt.payload.t
        await self.tcm.write(buf, t)
        self.completed[cid] = {"engine": "noc", "end": self.now, "hops": pkt.hops, "shape": list(t.shape),
                               "dtype": np.dtype(t.dtype).str}

    async def _arrived(self, pkt: NocPacket) -> None:
        for i, (src, cid, buf) in enumerate(self.noc_waiting):
            if src is None or list(pkt.src) == src:
                del self.noc_waiting[i]
                await self._deliver_pkt(cid, buf, pkt)
                return
        self.mailbox.append(pkt)

    async def _pump(self) -> None:
        """Consume one completion or NOC packet from whichever port delivers first."""
        ports = self._pump_ports
        if ports is None:   # (the wiring is fixed once the machine is built)
            ports = self._pump_ports = ((self.done, self.ipcq_resp, self.noc_in) if self.noc_in.links
                                        else (self.done, self.ipcq_resp))
        port, msg = await self.select(*ports)
        if port is self.noc_in:
            await self._arrived(msg)
            return
        if port is self.done:
            ops = msg.info.get("ops")
            if ops is None:
                self.completed[msg.id] = {"engine": msg.engine, "start": msg.start, "end": msg.end, **msg.info}
            else:   # a MathRun: every op of it, ids msg.id, msg.id + 1, ... (ends maybe still to come: wait)
                for j, (start, end) in enumerate(ops):
                    self.completed[msg.id + j] = {"engine": msg.engine, "start": start, "end": end}
        else:
            self.completed[msg.id] = {"engine": "ipcq", "end": self.now}
            if msg.desc:    # a receive: what the IPCQ block wrote into the TCM
                self.completed[msg.id]["shape"], self.completed[msg.id]["dtype"] = msg.desc
        engine = self.engine_of.pop(msg.id, None)
        if engine is None:
            raise RuntimeError(f"{self.name}: completion of unknown command {msg.id}")
        self.inflight[engine] -= 1

    async def wait(self, cid: int) -> dict:
        """Wait until command ``cid`` completed (idempotent within a launch); its completion info
        (:data:`FORGOTTEN` for a completion :meth:`forget` dropped: it completed, so no wait)."""
        while cid not in self.completed:
            if cid < self.forgotten_below:
                return FORGOTTEN
            await self._pump()
        info = self.completed[cid]
        if info["end"] > self.now:   # an op of a MathRun: its Done came when it was taken on, with its end
            await self.sleep_until(info["end"])
        return info

    def forget(self, keep) -> None:
        """Drop the completion info of every completed command except ``keep`` (ids someone may still ask
        the info of: the tl runtime's live handles).  Waiting for a dropped one still returns at once,
        without consuming a completion, as before (every id below ``forgotten_below``, the smallest still
        in flight, has completed), so timing is unchanged; only its info is gone.  Why: the info of every
        command of a launch was kept until its end, 1.2 GB at a 16K Ring prefill (issue 22)."""
        w = self.seq + 1
        if self.engine_of:
            w = min(w, min(self.engine_of))
        for _src, cid, _buf in self.noc_waiting:
            w = min(w, cid)
        now = self.now
        for cid, info in self.completed.items():   # MathRun ops still running (wait sleeps until their end)
            if info["end"] > now and cid < w:
                w = cid
        self.completed = {k: v for k, v in self.completed.items() if k >= w or k in keep}
        self.forgotten_below = max(self.forgotten_below, w)

    async def wait_any(self, cids: list) -> int:
        """Index in ``cids`` of the command that completed first (earliest ``end``, then list order);
        consumes completions until one of them is done."""
        while True:
            done = [(self.completed[c].get("end", 0) if c in self.completed else 0, i) for i, c in enumerate(cids)
                    if c in self.completed or c < self.forgotten_below]
            if done:
                return min(done)[1]
            await self._pump()

    async def tcm_read(self, buf):
        return await self.tcm.read(buf)

    async def tcm_write(self, buf, data) -> None:
        await self.tcm.write(buf, data)

    async def tcm_free(self, buf) -> None:
        await self.tcm.free(buf)

    async def tcm_free_all(self, bufs) -> None:
        """Free several TCM buffers in one (posted) access: the CPU's allocator releases a scope at once."""
        await self.tcm.free_all(bufs)

    # -- scripts --------------------------------------------------------------------------
    async def execute(self, c: dict) -> None:
        """Dispatch one script command and (unless async) wait for it."""
        op = c.get("op")
        if op not in _KIND and op not in ("wait", "free", "sleep"):
            raise RuntimeError(f"{self.name}: unknown script command {op!r}")
        if op in _KIND:
            await self.busy(dispatch_ps(_KIND[op], self.prm), f"dispatch {op}")
        if op == "dma":
            cid = await self.dma(c["kind"], c["addr"], c.get("rows", 1), c["row_bytes"], c.get("pitch", c["row_bytes"]),
                                 c["buf"], c["shape"], c["dtype"], target=c.get("target"))
        elif op == "gemm":
            cid = await self.gemm(c["a"], c["b"], c["acc"], c["m"], c["k"], c["n"], c.get("accumulate", False),
                                  c.get("out", ""), c.get("out_dtype", "<f4"))
        elif op == "math":
            cid = await self.math(c["fn"], c["srcs"], c["out"], c.get("scalar", 0.0), c.get("out_dtype", "<f4"))
        elif op == "composite":
            cid = await self.composite(c.get("a_addr", 0), c.get("b_addr", 0), c.get("c_addr", 0), c["m"], c["k"],
                                       c["n"], c["dtype"], c.get("epilogue", []), a_buf=c.get("a_buf", ""),
                                       b_buf=c.get("b_buf", ""), c_buf=c.get("c_buf", ""),
                                       c_dtype=c.get("c_dtype", ""))
        elif op in ("send", "recv"):
            await self.wait(await self.ipcq(op, c["dir"], c["buf"]))
            return
        elif op == "noc_send":
            await self.noc_send(c["to"], c["buf"])
            return
        elif op == "noc_recv":
            await self.wait(await self.noc_recv(c.get("from"), c["buf"]))
            return
        elif op == "free":
            await self.tcm.free(c["buf"])
            return
        elif op == "sleep":
            await self.sleep(int(c["ps"]))
            return
        else:   # wait
            for i in self.outstanding:
                await self.wait(i)
            self.outstanding.clear()
            return
        if c.get("async"):
            self.outstanding.append(cid)
        else:
            await self.wait(cid)

    async def run_script(self, launch: Launch) -> PeDone:
        log = []
        for i, c in enumerate(launch.script):
            t0 = self.now
            await self.execute(c)
            issued = t0 + (dispatch_ps(_KIND[c["op"]], self.prm) if c.get("op") in _KIND else 0)
            log.append([c.get("label", f"{i}:{c.get('op')}"), t0, issued, self.now])
        for i in self.outstanding:
            await self.wait(i)
        self.outstanding.clear()
        return PeDone(self.name, self.now, log)

    # -- the actor ------------------------------------------------------------------------
    async def run(self) -> None:
        if not self.launch.links:
            return  # nothing is ever launched on this PE in this workload: the CPU stays idle
        while True:
            launch = await self.launch.recv()
            self.completed.clear()
            if isinstance(launch, Launch):
                done = await self.run_script(launch)
            else:
                handler = self.launch_handlers.get(type(launch))
                if handler is None:
                    raise RuntimeError(f"{self.name}: cannot run a {type(launch).__name__}"
                                       f" (launch types: Launch, {', '.join(t.__name__ for t in self.launch_handlers)})")
                done = await handler(self, launch)
            await self.pe_done.send(done)

    def describe(self) -> dict:
        return {**super().describe(), "dirs": list(self.dirs),
                "dispatch_ps": {k: dispatch_ps(k, self.prm) for k in sorted(self.prm.dispatch)}}
