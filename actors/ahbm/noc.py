"""CUBE NOC routers (XY routing) and the UCIe links between CUBEs and SIPs.

One router per CUBE (``sip0/cube05/router``).  The machine is one mesh of
``(sips * cubes.x) x cubes.y`` CUBEs: SIPs join in a line along x, so a packet
between SIPs is XY-routed like any other and crosses the SIP boundary on an
inter-SIP UCIe link (assumption: SIP line topology; the seed ships 2 SIPs).
Dimension-order routing, x first then y (ref §2.4 "XY routing", R7 of §4.6).
N is towards y-1, S towards y+1, E towards x+1, W towards x-1.

Per-hop cost, store-and-forward per message (ASTRA-sim congestion-aware model,
ref §4.2, §4.4; R1 declares store-and-forward):

* router: ``alpha_router = noc.router_cycles`` at the NOC clock (3 cycles, ref §2.4,
  BookSim RC/VA/SA/ST pipeline), charged as pipeline latency: the router is a
  crossbar, packets to different outputs do not wait for each other, packets to
  one output leave in arrival order;
* link: ``S / B + latency`` with FIFO occupancy per directed link
  (emulator/link.py), directions independent (R2).  PE attach links: B =
  ``noc.attach_bandwidth`` (128 GB/s, ref §1.2 sram_to_router_bw), latency
  ``noc.link_cycles``; CUBE<->CUBE in a SIP: UCIe, B = 128 GB/s, latency
  ``2 x port_latency (8 ns, ref §1.2/§2.5) + link_cycles``; SIP<->SIP: UCIe
  x16 64 GB/s, 20 ns (ref §2.5, assumption there).

So a message of S bytes over h CUBE hops at zero load takes
``2 (S/B_attach + L_attach) + (h + 1) alpha_router + h (S/B_cube + L_cube)``.
Each output holds at most ``noc.buffer`` packets; when it is full the input
stops accepting and the upstream link's credits run out (back-pressure).
Every routing decision is a trace mark ``hop`` = ``[packet id, router, output]``.
Routed messages: :class:`NocPacket` (PE to PE, delivered to the CPU),
:class:`MemReq` (to the owner PE's HBM port) and :class:`MemResp` (back to the DMA,
or to the host interface ``io`` when the requester is the IO die: PE index P).
"""
from __future__ import annotations

from collections import deque

from trio.lowlevel import ParkingLot
import trio

from emulator.actor import Actor
from protocols.ahbm import MemReq, MemResp, NocPacket

#: local output of a routed message at its destination CUBE: CPU mailbox, HBM port, DMA
LOCAL = {NocPacket: "pe", MemReq: "mem", MemResp: "dma"}


def first_error(eg: BaseException) -> BaseException:
    """The first leaf of an exception group (so a failing internal task reads as a plain error)."""
    while isinstance(eg, BaseExceptionGroup):
        eg = eg.exceptions[0]
    return eg


class _Queue:
    """A bounded FIFO between the router's input and output tasks (deterministic wake order)."""

    def __init__(self, cap: int):
        self.cap = cap
        self.items: deque = deque()
        self.not_empty = ParkingLot()
        self.not_full = ParkingLot()

    async def put(self, item) -> None:
        while len(self.items) >= self.cap:
            await self.not_full.park()
        self.items.append(item)
        self.not_empty.unpark()

    async def get(self):
        while not self.items:
            await self.not_empty.park()
        item = self.items.popleft()
        self.not_full.unpark()
        return item


class Router(Actor):
    """The NOC router of one CUBE."""

    daemon = True

    def __init__(self, name: str, *, sip: int, cube: int, prm, dirs: list[str]):
        super().__init__(name)
        self.prm = prm
        self.sip = sip
        self.cube = cube
        self.gx = prm.global_x(sip, cube)
        self.gy = cube // prm.cx
        self.dirs = list(dirs)
        self.ins = {d: self.in_port(f"in_{d}") for d in dirs}
        self.outs = {d: self.out_port(f"out_{d}") for d in dirs}
        for p in range(prm.P):
            for kind in LOCAL.values():      # each PE attaches its CPU, its DMA and its HBM port
                self.ins[f"{kind}{p}"] = self.in_port(f"in_{kind}{p}")
                self.outs[f"{kind}{p}"] = self.out_port(f"out_{kind}{p}")
        self.ins["io"] = self.in_port("in_io")
        self.outs["io"] = self.out_port("out_io")
        self.forwarded = 0

    def route(self, pkt: NocPacket) -> str:
        sip, cube, pe = pkt.dst
        prm = self.prm
        if not (0 <= sip < prm.sips and 0 <= cube < prm.cubes and 0 <= pe <= prm.P):
            raise RuntimeError(f"{self.name}: packet {pkt.id} to nonexistent PE {pkt.dst}")
        gx, gy = prm.global_x(sip, cube), cube // prm.cx
        if gx != self.gx:
            return "E" if gx > self.gx else "W"
        if gy != self.gy:
            return "S" if gy > self.gy else "N"
        if pe == prm.P:
            return "io"       # the host interface of the IO die (params.Params.io_coord)
        return f"{LOCAL[type(pkt)]}{pe}"

    async def _input(self, port, queues) -> None:
        while True:
            pkt = await port.recv()
            out = self.route(pkt)
            if out not in queues:
                raise RuntimeError(f"{self.name}: route {out} for packet {pkt.id} is not wired")
            self.mark("hop", [pkt.id, self.name, out])
            await queues[out].put((self.now + self.prm.router_ps, pkt))

    async def _output(self, port, q: _Queue) -> None:
        while True:
            ready, pkt = await q.get()
            if ready > self.now:
                await self.sleep_until(ready)
            pkt.hops += 1
            await port.send(pkt)
            self.forwarded += 1

    async def run(self) -> None:
        wired_out = {k: p for k, p in self.outs.items() if p.link is not None}
        queues = {k: _Queue(self.prm.router_buffer) for k in wired_out}
        try:
            async with trio.open_nursery() as n:
                for k, p in wired_out.items():
                    n.start_soon(self._output, p, queues[k])
                for k, p in self.ins.items():
                    if p.links:
                        n.start_soon(self._input, p, queues)
        except BaseExceptionGroup as eg:
            raise first_error(eg) from None

    def describe(self) -> dict:
        return {**super().describe(), "router_ps": self.prm.router_ps, "xy": [self.gx, self.gy]}
