"""The IO die / host: loads tensors into HBM over the NOC, then launches every PE's program and collects completions.

Two ways to get tensors into HBM (placement.py):

* ``Placement.put``: the initial memory image, written before the run (t < 0);
* ``Placement.load``: a *timed* host load.  At t = 0 the host sends one
  :class:`~protocols.ahbm.MemReq` write per tensor through its host interface
  (``io.bandwidth``, ``io.latency``; assumptions, see the profile) to the NOC
  router it attaches to (``io.attach``), which XY-routes it to the owner PE's
  HBM port (hbmport.py); the port answers with an acknowledgement.  Requests
  are pipelined (as many in flight as the interface link has credits).  At
  zero load one load of S bytes over h CUBE hops takes
  ``S/B_io + L_io + (h+1) alpha + h (S/B_cube + L_cube) + S/B_hbm + L_att + channels(N)``
  plus the acknowledgement's way back, where ``B_hbm`` is the HBM port's router
  link (``noc.hbm_attach_bandwidth``, 256 GB/s, reference §1.2).

When every load is acknowledged the host sends each PE that has a program its
launch, over a link of latency ``io.launch_latency`` (assumption: 100 ns IO die
-> PE command path): a :class:`~protocols.ahbm.Launch` (a command script) or a
:class:`~protocols.ahbm_tl.KernelLaunch` (a ``tl`` kernel on a grid of PEs,
actors/ahbm/tl/launcher.py); then it waits for every completion message over
links of the same latency (:class:`~protocols.ahbm.PeDone` /
:class:`~protocols.ahbm_tl.KernelDone`).

Reports: ``loads_done_ps`` (with loads), ``launch_ps`` (when the launches were
sent), ``pes_done``, ``last_done_ps``; with kernels also ``kernel_latency_ps``
(last kernel completion received minus ``launch_ps``) and ``pes``: per PE its
kernel start/end relative to ``launch_ps`` and the kernel's counters.
``logs`` holds each script PE's per-command timings, ``kernels`` each kernel PE's KernelDone.

**Requests** (several kernel launches per PE over time, :class:`RequestPlan`): instead of one
program per PE the host serves a list of requests, each a sequence of *steps* (one launch per PE
of the step, e.g. one decode token of one request).  A request's first step is launched at its
arrival time (``launch_ps`` + ``arrival_ps``), each later step as soon as the host has every
KernelDone of the step before (the request's closed loop: the next token needs the previous
one's output).  A PE's CPU runs its launches one after the other in the order they reach it
(cpu.py: one launch at a time); its launch link holds every launch the plan may queue on it
(builder.py), so a launch never waits for the host, only for the PE.  The k-th KernelDone from a
PE answers the k-th launch sent to it (FIFO link, one CPU).  ``request_log`` (report
``requests``): per request its arrival, and per step the launch and the done time (the last
KernelDone of the step received), and per PE the kernel's start and end, all relative to
``launch_ps``.

**Batches** (:class:`BatchPlan`, continuous batching): one launch per PE serves a whole batch of
requests (kernels/gqa_batched.py).  Each batch step launches the requests active at its start
(arrived, steps left), one step each; the next batch step is launched when every PE has answered
the previous one; an idle host waits for the next arrival.  ``requests`` as above (each step names
its ``batch``), and ``batches``: per batch its launch and done times, members and per-PE stats.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from emulator.actor import Actor
from emulator.declare import In, Out
from protocols.ahbm import Launch, MemReq, MemResp, PeDone, payload
from protocols.ahbm_tl import KernelDone, KernelLaunch
from protocols.codec import TensorDesc

__all__ = ["Host", "RequestPlan", "BatchPlan"]


@dataclass
class BatchPlan:
    """Continuous batching (module docstring): request ``r`` arrives ``arrivals[r]`` after the launch time and
    needs ``steps[r]`` decode steps; ``launches(members)`` gives the batch's ``{PE name: KernelLaunch}`` for
    ``members`` = [(request, step)]."""
    names: list
    arrivals: list
    steps: list
    launches: object


@dataclass
class RequestPlan:
    """One request: arrives ``arrival_ps`` after the launch time and runs ``steps`` in order, each step
    ``{PE name: KernelLaunch}`` (the module docstring)."""
    name: str
    arrival_ps: int
    steps: list

class Host(Actor):
    """The IO die: timed tensor loads, then the PEs' launches and completions (module docstring)."""

    PORTS = (Out("launch_{i}", Launch, KernelLaunch, doc="the launch of the i-th PE with a program"),
             In("done", PeDone, KernelDone, doc="completions of every launched PE"),
             Out("noc_out", MemReq, doc="timed loads, into the host interface"),
             In("noc_in", MemResp, doc="the loads' acknowledgements"))
    def __init__(self, name: str, *, programs: dict, coord: list, requests: list | None = None,
                 batches: BatchPlan | None = None):
        """``programs``: {PE name: Launch | KernelLaunch}; or ``requests`` (:class:`RequestPlan` list) or
        ``batches`` (:class:`BatchPlan`) and ``programs`` naming every PE they launch on."""
        super().__init__(name)
        self.programs = programs
        self.requests = requests or []
        self.batches = batches
        self.coord = list(coord)
        self.outs = {pe: self.out_port(f"launch_{i}") for i, pe in enumerate(programs)}
        self.done = self.in_port("done")
        self.noc_out = self.out_port("noc_out")
        self.noc_in = self.in_port("noc_in")
        #: timed loads ``(coord, addr, array or TensorDesc)``, filled by Placement.load before the run
        self.loads: list[tuple] = []
        self.logs: dict[str, list] = {}
        self.kernels: dict[str, KernelDone] = {}
        self.load_done: list[int] = []

    async def _send_loads(self) -> None:
        data_mode = self.system.mode == "data"
        for i, (coord, addr, arr) in enumerate(self.loads, start=1):
            if data_mode:
                blob = np.frombuffer(np.ascontiguousarray(arr).tobytes(), np.uint8)
            else:
                blob = TensorDesc.of((arr.nbytes,), "|u1")
            n = int(blob.nbytes)
            await self.noc_out.send(MemReq(i, "write", self.coord, list(coord), 0, addr, 1, n, n, payload(blob)))

    async def _load_all(self) -> None:
        """Send every load (pipelined) while a second task takes the acknowledgements as they arrive."""
        async def acks():
            for _ in range(len(self.loads)):
                await self.noc_in.recv()
                self.load_done.append(self.now)

        async with self.subtasks() as n:
            n.start_soon(acks)
            await self._send_loads()

    async def run(self) -> None:
        if self.loads:
            await self._load_all()
            self.report("loads_done_ps", self.now)
        t0 = self.now
        self.report("launch_ps", t0)
        if self.requests:
            await self._serve_requests(t0)
            return
        if self.batches is not None:
            await self._serve_batches(t0)
            return
        for pe, launch in self.programs.items():
            await self.outs[pe].send(launch)
        for _ in range(len(self.programs)):
            d = await self.done.recv()
            if isinstance(d, PeDone):
                self.logs[d.pe] = d.log
            else:
                self.kernels[d.pe] = d
        self.report("pes_done", len(self.logs) + len(self.kernels))
        self.report("last_done_ps", self.now)
        if self.kernels:
            self.report("kernel_latency_ps", self.now - t0)
            self.report("pes", {pe: {"start_ps": d.start - t0, "end_ps": d.end - t0, **d.stats}
                                for pe, d in sorted(self.kernels.items())})

    async def _serve_requests(self, t0: int) -> None:
        """Launch every request's steps (arrival, then closed loop) and collect their completions."""
        reqs = self.requests
        owner = {pe: deque() for pe in self.outs}      # per PE: (request, step) of each launch in flight, in order
        left: dict[tuple[int, int], int] = {}
        log = [{"request": r.name, "arrival_ps": r.arrival_ps, "steps": []} for r in reqs]
        total = sum(len(step) for r in reqs for step in r.steps)

        async def launch(r: int, s: int) -> None:
            step = reqs[r].steps[s]
            left[(r, s)] = len(step)
            log[r]["steps"].append({"launch_ps": self.now - t0, "pes": {}})
            for pe, msg in step.items():
                owner[pe].append((r, s))
                await self.outs[pe].send(msg)

        async def arrivals() -> None:
            for r in sorted(range(len(reqs)), key=lambda i: (reqs[i].arrival_ps, i)):
                await self.sleep_until(t0 + reqs[r].arrival_ps)
                await launch(r, 0)

        async with self.subtasks() as n:
            n.start_soon(arrivals)
            for _ in range(total):
                d = await self.done.recv()
                r, s = owner[d.pe].popleft()
                step = log[r]["steps"][s]
                step["pes"][d.pe] = {"start_ps": d.start - t0, "end_ps": d.end - t0, **d.stats}
                left[(r, s)] -= 1
                if left[(r, s)] == 0:
                    step["done_ps"] = self.now - t0
                    if s + 1 < len(reqs[r].steps):
                        await launch(r, s + 1)
        self.report("pes_done", total)
        self.report("last_done_ps", self.now)
        self.report("kernel_latency_ps", self.now - t0)
        self.report("requests", log)

    async def _serve_batches(self, t0: int) -> None:
        """Continuous batching: each batch step serves the requests active at its start (module docstring)."""
        plan = self.batches
        n = len(plan.arrivals)
        order = sorted(range(n), key=lambda i: (plan.arrivals[i], i))
        log = [{"request": plan.names[r], "arrival_ps": plan.arrivals[r], "steps": []} for r in range(n)]
        batches, active, nxt = [], [], 0
        while nxt < n or active:
            if not active:
                await self.sleep_until(t0 + plan.arrivals[order[nxt]])
            while nxt < n and plan.arrivals[order[nxt]] <= self.now - t0:
                active.append((order[nxt], 0))
                nxt += 1
            launch_ps = self.now - t0
            msgs = plan.launches(list(active))
            for pe, msg in msgs.items():
                await self.outs[pe].send(msg)
            pes = {}
            for _ in range(len(msgs)):
                d = await self.done.recv()
                pes[d.pe] = {"start_ps": d.start - t0, "end_ps": d.end - t0, **d.stats}
            done_ps = self.now - t0
            for r, s in active:
                log[r]["steps"].append({"launch_ps": launch_ps, "done_ps": done_ps, "batch": len(batches), "pes": pes})
            batches.append({"launch_ps": launch_ps, "done_ps": done_ps, "members": [list(m) for m in active],
                            "pes": pes})
            active = [(r, s + 1) for r, s in active if s + 1 < plan.steps[r]]
        self.report("pes_done", sum(len(b["pes"]) for b in batches))
        self.report("last_done_ps", self.now)
        self.report("kernel_latency_ps", self.now - t0)
        self.report("requests", log)
        self.report("batches", batches)
