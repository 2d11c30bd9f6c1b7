"""CUBE NOC routers (XY routing) and the UCIe links between CUBEs and SIPs.

One router per CUBE (``sip0/cube05/router``).  The machine is one mesh of
``(sips * cubes.x) x cubes.y`` CUBEs: SIPs join in a line along x, so a packet
between SIPs is XY-routed like any other and crosses the SIP boundary on an
inter-SIP UCIe link (assumption: SIP line topology; the seed ships 2 SIPs).
Dimension-order routing, x first then y (ref §2.4 "XY routing", R7 of §4.6).
N is towards y-1, S towards y+1, E towards x+1, W towards x-1.

Links on a path (builder.py): PE attach links (CPU, DMA, HBM port), latency
``noc.link_cycles``, B = ``noc.attach_bandwidth`` (128 GB/s, ref §1.2
sram_to_router_bw_gbs) for the CPU and DMA links and ``noc.hbm_attach_bandwidth``
(256 GB/s, ref §1.2 hbm_to_router_bw_gbs) for the HBM port's links, so a path
that starts or ends at an HBM port (remote DMA, host load) has that attach
bandwidth on that end; CUBE<->CUBE in a SIP: UCIe, B = 128 GB/s, latency
``2 x port_latency (8 ns, ref §1.2/§2.5) + link_cycles``; SIP<->SIP: UCIe x16
64 GB/s, 20 ns (ref §2.5, assumption there); the host interface: ``io.*``.
``alpha = noc.router_cycles`` at the NOC clock (3 cycles, ref §2.4, BookSim
RC/VA/SA/ST pipeline) is the router pipeline latency; the router is a crossbar:
packets to different outputs do not wait for each other, packets to one output
leave in the order they became ready there (FIFO per directed link, R2).

``noc.switching`` (ref §4.6 R1: "declare cut-through vs store-and-forward,
configurable"):

* ``store_and_forward`` (default: the fidelity target of §4.6 is ASTRA-sim's
  congestion-aware backend, which is store-and-forward per chunk, ref §4.2;
  it is also what every existing closed form assumes).  A router forwards a
  packet ``alpha`` after its tail arrived; the link serialises it (``S / B +
  latency``, FIFO occupancy per directed link, emulator/link.py).  Zero load,
  S bytes over h CUBE links (L_i, B_i):
  ``T = (S/B_att,src + L_att) + (S/B_att,dst + L_att) + (h + 1) alpha + sum_i (S/B_i + L_i)``
  (``B_att,src = B_att,dst = B_att`` between PE CPUs: ``2 (S/B_att + L_att)``).
* ``cut_through`` (virtual cut-through at message level, as BookSim's wormhole
  routers at zero load, ref §2.4/§4.3, and kernbench2's chunk streaming, ref
  §4.4).  The head is forwarded ``alpha`` after it arrives; the tail follows
  at the pace of the slowest link so far.  Routers serialise themselves: at
  run start a router takes the bandwidth of every link it sends on and of the
  attach links it receives from (``Link.serialise_at_sender``: the link keeps its
  latency, FIFO order and credits; the router reports the occupancy with
  ``Link.charge_occupancy`` so link utilisation still reads right).  Per packet of S bytes (msgpack size, as
  the link would charge):

  - from an attach link (bandwidth B_in, latency L_in): ``start_in = max(now -
    L_in, free_in)``, ``free_in = start_in + S/B_in``; head = ``start_in +
    L_in``, tail = head + S/B_in (the injection link stays FIFO);
  - from a router: head = delivery time, tail = head + ``lag`` (carried in
    the message, protocols/ahbm.py ``LAG_DOC``);
  - on output o (bandwidth B_o): ``start = max(head + alpha, free_o)``,
    ``end = max(start + S/B_o, tail + alpha)``, ``free_o = end``.  Towards a
    router the packet is sent at ``start`` with ``lag = end - start`` (the next
    router sees the head at ``start + L_o``); towards an endpoint (PE agent,
    host) it is sent at ``end``, so the endpoint receives it whole at ``end + L_o``.

  Zero load: ``T = 2 L_att + (h + 1) alpha + sum_i L_i + S / min(B_att,src, B_i, B_att,dst)``
  = R1's ``alpha_hop h + S/B_bottleneck`` (with every ``S/B`` rounded up to a
  ps, emulator/units.transfer_ps).  Back-to-back packets on one path leave
  ``S/B_bottleneck`` apart.  Message-level approximations (no flits, ref §4.6
  out-of-scope list): a router learns of a packet when its head arrives from a
  router, or when it was sent + L_in on an attach link, and orders an output
  by that time (not by head-ready time);
  a credit is taken when the head leaves (``start``); a credit stall of d ps
  shifts the whole packet by d.  Link fault ``bandwidth_factor`` does not
  apply to the links a cut-through router serialises (delay and drop do).

Each output holds at most ``noc.buffer`` packets; when it is full the input
stops accepting and the upstream link's credits run out (back-pressure).
Every routing decision is a trace mark ``hop`` = ``[packet id, router, output]``.

Occupancy (utilisation): every mesh / UCIe output of a router (and the host
interface output of the IO die's CUBE) has a passive actor ``<router>/out_<dir>``
(:class:`PortLoad`) that records one busy span per packet: the link's
serialisation ``[end - S/B, end]`` (store-and-forward) or ``[start, end]``
(cut-through).  It only records, so timing is unchanged; ``emu trace summary``
and the plots show NOC load per output port (plot group ``<router>``).  The
router adds them to the system when the builder adds the router (see
:attr:`Router.system`).  PE attach outputs are not recorded (3 P more actors
per router); their links' metrics still count bytes (and, store-and-forward,
busy time).

Routed messages: :class:`NocPacket` (PE to PE, delivered to the CPU),
:class:`MemReq` (to the owner PE's HBM port) and :class:`MemResp` (back to the DMA,
or to the host interface ``io`` when the requester is the IO die: PE index P).
"""
from __future__ import annotations

from collections import deque

import trio

from emulator.actor import Actor
from emulator.declare import In, Out
from emulator.trace import BUSY
from emulator.units import transfer_ps
from emulator.waitqueue import WaitQueue
from protocols.ahbm import MemReq, MemResp, NocPacket
from protocols.codec import encode

from actors.ahbm.params import GEOMETRY, declare

__all__ = ["Router", "PortLoad", "LOCAL"]

#: local output of a routed message at its destination CUBE: CPU mailbox, HBM port, DMA
LOCAL = {NocPacket: "pe", MemReq: "mem", MemResp: "dma"}


class _Queue:
    """A bounded FIFO between the router's input and output tasks (deterministic wake order)."""

    def __init__(self, cap: int):
        self.cap = cap
        self.items: deque = deque()
        self.not_empty = WaitQueue()
        self.not_full = WaitQueue()

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


class PortLoad(Actor):
    """Occupancy record of one router output (``<router>/out_<port>``).

    Part of its router, not an independent component: a named trace track that
    the owning router writes (the builder adds it next to the router).  It
    sends and receives nothing and adds no time; the router calls :meth:`span`
    once per packet it puts on that output, so utilisation per actor (trace
    summary, plots) shows the output's load.
    """

    daemon = True

    def span(self, t0: int, t1: int, label: str) -> None:
        """Record ``[t0, t1)`` as busy (t0 may be in the future, like ``Actor.busy(start=...)``)."""
        if t1 > t0:
            self.busy_ps += t1 - t0
            self.busy_spans += 1
            if t1 > self.busy_until:
                self.busy_until, self.busy_label = t1, label
            self._emit((BUSY, t0, self.id, t1, label))

    async def run(self) -> None:
        await trio.sleep_forever()


class Router(Actor):
    """The NOC router of one CUBE."""

    daemon = True
    PORTS = (In("in_{dir}", NocPacket, MemReq, MemResp, doc="from the neighbour router in N/S/E/W (mesh, UCIe)",
                idle=True),
             Out("out_{dir}", NocPacket, MemReq, MemResp, doc="to the neighbour router in N/S/E/W"),
             In("in_pe{p}", NocPacket, doc="PE p's CPU attach link", idle=True),
             Out("out_pe{p}", NocPacket, doc="to PE p's CPU"),
             In("in_dma{p}", MemReq, doc="PE p's DMA attach link (remote HBM requests)", idle=True),
             Out("out_dma{p}", MemResp, doc="remote HBM answers to PE p's DMA"),
             In("in_mem{p}", MemResp, doc="PE p's HBM port attach link (answers)", idle=True),
             Out("out_mem{p}", MemReq, doc="requests to PE p's HBM port"),
             In("in_io", MemReq, doc="the host interface (timed loads)", idle=True),
             Out("out_io", MemResp, doc="load acknowledgements to the host interface"))
    PARAMS = declare(*GEOMETRY, "io_attach", "router_ps", "router_buffer", "cut_through")

    def __init__(self, name: str, *, sip: int, cube: int, prm, dirs: list[str]):
        super().__init__(name)
        self.prm = prm
        self.sip = sip
        self.cube = cube
        self.gx = prm.global_x(sip, cube)
        self.gy = cube // prm.cx
        self.dirs = list(dirs)
        self.ins = {d: self.in_port(f"in_{d}", idle=True) for d in dirs}
        self.outs = {d: self.out_port(f"out_{d}") for d in dirs}
        for p in range(prm.P):
            for kind in LOCAL.values():      # each PE attaches its CPU, its DMA and its HBM port
                self.ins[f"{kind}{p}"] = self.in_port(f"in_{kind}{p}", idle=True)
                self.outs[f"{kind}{p}"] = self.out_port(f"out_{kind}{p}")
        self.ins["io"] = self.in_port("in_io", idle=True)
        self.outs["io"] = self.out_port("out_io")
        self.forwarded = 0
        # occupancy actors of the NOC outputs: the mesh / UCIe directions, and the host interface on
        # the IO die's CUBE (PE attach outputs are not recorded: 3 P more actors per router)
        self.loads = {k: PortLoad(f"{name}/out_{k}") for k in self.dirs}
        if (sip, cube) == tuple(prm.io_attach):
            self.loads["io"] = PortLoad(f"{name}/out_io")

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

    # -- store-and-forward ------------------------------------------------------
    async def _input(self, port, queues) -> None:
        while True:
            pkt = await port.recv()
            out = self._route_checked(pkt, queues)
            await queues[out].put((self.now + self.prm.router_ps, pkt))

    def _route_checked(self, pkt, queues) -> str:
        out = self.route(pkt)
        if out not in queues:
            raise RuntimeError(f"{self.name}: route {out} for packet {pkt.id} is not wired")
        self.mark("hop", [pkt.id, self.name, out])
        return out

    async def _output(self, port, q: _Queue, load: PortLoad | None) -> None:
        link = port.link
        while True:
            ready, pkt = await q.get()
            if ready > self.now:
                await self.sleep_until(ready)
            pkt.hops += 1
            before = link.busy_ps
            await port.send(pkt)
            self.forwarded += 1
            if load is not None:
                load.span(link.free_at - (link.busy_ps - before), link.free_at, f"{type(pkt).__name__} {pkt.id}")

    # -- cut-through (module docstring) -------------------------------------------
    async def _input_ct(self, key: str, port, queues, inj: dict | None) -> None:
        alpha = self.prm.router_ps
        while True:
            pkt = await port.recv()
            out = self._route_checked(pkt, queues)
            S = encode(pkt)[1]
            if inj is None:                       # from a router: head now, tail after the carried lag
                head = self.now
                tail = head + int(pkt.lag)
            else:                                 # from an attach link: this router serialises it
                start = max(self.now - inj["latency"], inj["free"])
                ser = transfer_ps(S, inj["bandwidth"])
                inj["free"] = start + ser
                inj["link"].charge_occupancy(ser)     # the link's statistics keep its occupancy
                head = start + inj["latency"]
                tail = head + ser
            await queues[out].put((head + alpha, tail + alpha, S, pkt))

    async def _output_ct(self, key: str, port, q: _Queue, bandwidth: int, load: PortLoad | None) -> None:
        to_router = key in self.dirs
        free = 0
        while True:
            head_ready, tail_ready, S, pkt = await q.get()
            start = max(head_ready, free, self.now)
            end = max(start + transfer_ps(S, bandwidth), tail_ready)
            pkt.hops += 1
            pkt.lag = float(end - start)
            t_send = start if to_router else end
            if t_send > self.now:
                await self.sleep_until(t_send)
            await port.send(pkt)
            stall = self.now - t_send             # credit stall: the whole packet moves later
            free = end + stall
            port.link.charge_occupancy(end - start)   # the link's statistics keep its occupancy
            self.forwarded += 1
            if load is not None:
                load.span(start + stall, end + stall, f"{type(pkt).__name__} {pkt.id}")

    async def run(self) -> None:
        wired_out = {k: p for k, p in self.outs.items() if p.link is not None}
        queues = {k: _Queue(self.prm.router_buffer) for k in wired_out}
        ct = self.prm.cut_through
        async with self.subtasks() as n:
            for k, p in wired_out.items():
                # an output's task starts with its first packet (the inputs that fill its queue start after it)
                if ct:
                    queues[k].not_empty.start_at_first_unpark(n, self._output_ct, k, p, queues[k],
                                                              p.link.serialise_at_sender(), self.loads.get(k))
                else:
                    queues[k].not_empty.start_at_first_unpark(n, self._output, p, queues[k], self.loads.get(k))
            for k, p in self.ins.items():
                if not p.links:
                    continue
                if not ct:
                    n.start_soon(self._input, p, queues)
                    continue
                inj = None
                if k not in self.dirs:
                    if len(p.links) != 1:
                        raise RuntimeError(f"{self.name}: cut-through needs one link into {p.path},"
                                           f" found {len(p.links)}")
                    link = p.links[0]
                    inj = {"bandwidth": link.serialise_at_sender(), "latency": link.latency, "free": 0, "link": link}
                n.start_soon(self._input_ct, k, p, queues, inj)

    def replay_blocker(self) -> str | None:
        if self.prm.cut_through:
            return ("a cut-through router serialises its links itself (it takes over their bandwidth), so its "
                    "timing depends on its neighbours' links, not only on the messages it received; replay a "
                    "store-and-forward run (noc.switching: store_and_forward) or the PEs around it")
        return None

    def describe(self) -> dict:
        return {**super().describe(), "router_ps": self.prm.router_ps, "xy": [self.gx, self.gy],
                "switching": "cut_through" if self.prm.cut_through else "store_and_forward"}
