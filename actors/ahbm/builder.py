"""Wires an AHBM machine from a validated profile.

Per PE (``sipS/cubeCC/peP``): ``cpu``, ``sched``, ``dma``, ``gemm``, ``math``,
``tcm``, ``ipcq``, ``hbm/pc0..pc{n-1}`` and ``hbm/port``.  Per CUBE a ``router``.  One
``io/host``.  At ``fidelity: pipeline`` in timing mode a PE's channels are one ``hbm/stack``
(memory.HbmStack: the same per-channel timing, one request and one answer per block access).
Link parameters (everything else is a zero-time, unbounded-rate on-PE wire; assumption:
intra-PE control paths are not modelled as a cost):

* engine command queues: capacity ``cpu.command_queue_depth`` of the profile (16 commands, assumption);
* completion queues into the CPU (engines, scheduler, IPCQ -> CPU): :func:`completion_depth` entries, one
  per command-queue slot plus one per command the engine holds off its queue; the CPU never has more
  commands in flight per engine than entries (completion credits, cpu.py docstring), so no engine
  blocks on a completion;
* PE <-> router (CPU, DMA and HBM port each attach; assumption: separate attach links per PE agent),
  latency ``noc.link_cycles``: CPU and DMA ``noc.attach_bandwidth`` (128 GB/s, ref §1.2
  sram_to_router_bw_gbs), HBM port ``noc.hbm_attach_bandwidth`` (256 GB/s, ref §1.2
  hbm_to_router_bw_gbs);
* router <-> router: UCIe intra-SIP / inter-SIP (noc.py docstring);
* IPCQ data / credit links (ipcq.py docstring);
* host <-> CPU: ``io.launch_latency`` (launches and completions; capacity 1);
* host interface <-> the ``io.attach`` CUBE router: ``io.bandwidth``, ``io.latency`` (timed tensor loads).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from actors.ahbm.cpu import PeCpu
from actors.ahbm.dma import DmaEngine
from actors.ahbm.gemm import GemmEngine
from actors.ahbm.hbmport import HbmPort
from actors.ahbm.host import Host, RequestPlan
from actors.ahbm.ipcq import Ipcq
from actors.ahbm.mathunit import MathEngine
from actors.ahbm.memory import HbmChannel, HbmStack, Tcm
from actors.ahbm.noc import Router
from actors.ahbm.params import OPPOSITE, Params, cube_name, pe_name
from actors.ahbm.scheduler import PeScheduler
from emulator.declare import params_for
from protocols.ahbm import Launch
from protocols.ahbm_tl import KernelLaunch

__all__ = ["TCM_CLIENTS", "Pe", "Machine", "pe_neighbours", "completion_depth", "programs_of", "build_machine"]

TCM_CLIENTS = ["cpu", "dma", "gemm", "math", "ipcq", "sched"]


@dataclass
class Pe:
    coord: tuple
    cpu: PeCpu
    sched: PeScheduler
    dma: DmaEngine
    gemm: GemmEngine
    math: MathEngine
    tcm: Tcm
    ipcq: Ipcq
    pcs: list                         # the HbmChannels ([] when the PE has an HBM stack)
    port: HbmPort
    stack: HbmStack | None = None     # fidelity pipeline, timing mode (memory.HbmStack)


@dataclass
class Machine:
    prm: Params
    pes: dict = field(default_factory=dict)       # (sip, cube, pe) -> Pe
    routers: dict = field(default_factory=dict)   # (sip, cube) -> Router
    host: Host | None = None

    def pe(self, sip: int, cube: int, pe: int) -> Pe:
        try:
            return self.pes[(sip, cube, pe)]
        except KeyError:
            raise KeyError(f"no PE [{sip}, {cube}, {pe}] in a machine of {self.prm.sips} SIP(s),"
                           f" {self.prm.cubes} CUBEs, {self.prm.P} PEs") from None


def pe_neighbours(prm: Params, pe: int) -> dict[str, int]:
    """IPCQ neighbours of PE ``pe`` in its CUBE's PE grid (N = row above)."""
    x, y = pe % prm.gx, pe // prm.gx
    out = {}
    for d, (dx, dy) in {"N": (0, -1), "S": (0, 1), "E": (1, 0), "W": (-1, 0)}.items():
        nx, ny = x + dx, y + dy
        if 0 <= nx < prm.gx and 0 <= ny < prm.gy:
            out[d] = ny * prm.gx + nx
    return out


def _router_dirs(prm: Params, sip: int, cube: int) -> dict[str, tuple[int, int]]:
    gx, gy = prm.global_x(sip, cube), cube // prm.cx
    W = prm.sips * prm.cx
    out = {}
    for d, (dx, dy) in {"N": (0, -1), "S": (0, 1), "E": (1, 0), "W": (-1, 0)}.items():
        nx, ny = gx + dx, gy + dy
        if 0 <= nx < W and 0 <= ny < prm.cy:
            out[d] = (nx // prm.cx, ny * prm.cx + nx % prm.cx)
    return out


def completion_depth(prm: Params, engine: str) -> int:
    """Entries of ``engine``'s completion queue into the CPU: ``prm.cmd_depth`` + the commands the engine holds
    off its command queue at most - 1 for GEMM, MATH, the scheduler and IPCQ (served one at a time; IPCQ
    sends too), ``dma.outstanding + 1`` for the DMA (N in their data phase and one at its front end,
    dma.py).  With that many completion credits (cpu.py) the CPU's credit can only run out when its
    command queue is full anyway or the completions are already waiting, so bounding the completion
    queue costs no time.  IPCQ receives the block holds without bound are limited to this many
    outstanding per CPU (assumption: the kernel's posted receives live in the completion queue's slots)."""
    held = prm.dma_outstanding + 1 if engine == "dma" else 1
    return prm.cmd_depth + held


def programs_of(scripts: dict | None, kernels: dict | None) -> dict:
    """``{(sip, cube, pe): Launch | KernelLaunch}`` from scripts ``{coord: [commands]}`` and kernel launches
    ``{coord: KernelLaunch}``; a PE gets one program."""
    out: dict = {}
    for coord, script in (scripts or {}).items():
        out[tuple(coord)] = Launch(script)      # the same list: workloads may fill it in after building
    for coord, launch in (kernels or {}).items():
        if not isinstance(launch, KernelLaunch):
            raise TypeError(f"kernels[{list(coord)}]: expected a KernelLaunch, found {type(launch).__name__}")
        if tuple(coord) in out:
            raise ValueError(f"PE {list(coord)} is given both a script and a kernel")
        out[tuple(coord)] = launch
    return out


def build_machine(system, profile: dict, scripts: dict | None = None, kernels: dict | None = None,
                  requests: list | None = None, batches=None, batch_pes=(), fidelity: str = "block") -> Machine:
    """Add every actor and link of the machine to ``system``.

    What the host launches, per PE ``(sip, cube, pe)``: ``scripts`` = {coord: [commands]} (cpu.py) and
    ``kernels`` = {coord: KernelLaunch} (``tl`` kernels, actors/ahbm/tl/launcher.py).  The scripts' lists
    are sent as they are when the run starts, so they may be filled in after building.  Or ``requests``:
    :class:`~actors.ahbm.host.RequestPlan` s whose steps are ``{coord: KernelLaunch}`` (host.py); a PE's
    launch link then holds every launch the plan sends it (its CPU's launch queue: assumption, the
    launches wait in the PE's command memory, so the host never waits to hand one over).  Or ``batches``:
    a :class:`~actors.ahbm.host.BatchPlan` whose launches go to the PEs ``batch_pes`` (one at a time).
    ``fidelity``: ``block`` (the default model), ``pipeline`` or ``stream`` (actors/ahbm/pipeline.py, timing mode).
    """
    prm = Params.of(profile)
    m = Machine(prm)
    add, connect = system.add, system.connect
    v = cache(lambda cls: params_for(cls, prm))   # each class reads only the parameters it declares
    # MATH ops as MathOp (actors/ahbm/pipeline.py); stream is pipeline with the DMA engine held too
    math_op = fidelity in ("pipeline", "stream") and system.mode == "timing"
    stacked = math_op        # the PE's HBM channels as one HbmStack (memory.py), same condition


    for sip in range(prm.sips):
        for cube in range(prm.cubes):
            m.routers[(sip, cube)] = add(Router(f"{cube_name(sip, cube)}/router", sip=sip, cube=cube, prm=v(Router),
                                                dirs=list(_router_dirs(prm, sip, cube))))
            for load in m.routers[(sip, cube)].loads.values():   # its output-occupancy tracks
                add(load)
            for p in range(prm.P):
                base = pe_name(sip, cube, p)
                nb = pe_neighbours(prm, p)
                pe = Pe(
                    (sip, cube, p),
                    cpu=add(PeCpu(f"{base}/cpu", prm=v(PeCpu), coord=(sip, cube, p), dirs=list(nb), math_op=math_op)),
                    sched=add(PeScheduler(f"{base}/sched", prm=v(PeScheduler), fidelity=fidelity, math_op=math_op)),
                    dma=add(DmaEngine(f"{base}/dma", prm=v(DmaEngine), clients=["cpu", "sched"], coord=(sip, cube, p),
                                      hbm_stack=stacked)),
                    gemm=add(GemmEngine(f"{base}/gemm", prm=v(GemmEngine), clients=["cpu", "sched"])),
                    math=add(MathEngine(f"{base}/math", prm=v(MathEngine), clients=["cpu", "sched"])),
                    tcm=add(Tcm(f"{base}/tcm", clients=TCM_CLIENTS, **v(Tcm).kwargs())),
                    ipcq=add(Ipcq(f"{base}/ipcq", dirs=list(nb), **v(Ipcq).kwargs())),
                    pcs=[] if stacked else [add(HbmChannel(f"{base}/hbm/pc{i}", index=i, prm=v(HbmChannel)))
                                            for i in range(prm.pcs)],
                    port=add(HbmPort(f"{base}/hbm/port", prm=v(HbmPort), coord=(sip, cube, p), hbm_stack=stacked)),
                    stack=add(HbmStack(f"{base}/hbm/stack", prm=v(HbmStack))) if stacked else None,
                )
                m.pes[(sip, cube, p)] = pe
                for eng in (pe.dma, pe.gemm, pe.math):
                    key = {pe.dma: "dma", pe.gemm: "gemm", pe.math: "math"}[eng]
                    connect(pe.cpu.to[key], eng.cmd, capacity=prm.cmd_depth)
                    connect(getattr(pe.sched, key), eng.cmd, capacity=prm.cmd_depth)
                    connect(eng.done["cpu"], pe.cpu.done, capacity=completion_depth(prm, key))
                    connect(eng.done["sched"], pe.sched.done, capacity=prm.cmd_depth)
                connect(pe.cpu.to["sched"], pe.sched.cmd, capacity=prm.cmd_depth)
                connect(pe.sched.done_cpu, pe.cpu.done, capacity=completion_depth(prm, "sched"))
                connect(pe.cpu.to["ipcq"], pe.ipcq.cmd, capacity=prm.cmd_depth)
                connect(pe.ipcq.resp, pe.cpu.ipcq_resp, capacity=completion_depth(prm, "ipcq"))
                for client, actor in zip(TCM_CLIENTS, (pe.cpu, pe.dma, pe.gemm, pe.math, pe.ipcq, pe.sched)):
                    connect(actor.tcm.req, pe.tcm.req, capacity=1)
                    connect(pe.tcm.out[client], actor.tcm.resp, capacity=1)
                if pe.stack is not None:
                    for client, actor in (("dma", pe.dma), ("port", pe.port)):
                        connect(actor.hbm, pe.stack.req, capacity=prm.cmd_depth)
                        connect(pe.stack.resp[client], actor.pc_resp, capacity=prm.cmd_depth)
                for i, pc in enumerate(pe.pcs):
                    connect(pe.dma.pc_req[i], pc.req, capacity=prm.cmd_depth)
                    connect(pc.resp["dma"], pe.dma.pc_resp, capacity=prm.cmd_depth)
                    connect(pe.port.pc_req[i], pc.req, capacity=prm.cmd_depth)
                    connect(pc.resp["port"], pe.port.pc_resp, capacity=prm.cmd_depth)
                r = m.routers[(sip, cube)]
                for kind, out, inp, bw in (("pe", pe.cpu.to["noc_out"], pe.cpu.noc_in, prm.attach_bw),
                                           ("dma", pe.dma.noc_out, pe.dma.noc_in, prm.attach_bw),
                                           ("mem", pe.port.out, pe.port.req, prm.hbm_attach_bw)):
                    connect(out, r.ins[f"{kind}{p}"], capacity=prm.link_capacity, latency=prm.link_ps,
                            bandwidth=bw)
                    connect(r.outs[f"{kind}{p}"], inp, capacity=prm.link_capacity, latency=prm.link_ps,
                            bandwidth=bw)

    # IPCQ pairs inside each CUBE
    for (sip, cube, p), pe in m.pes.items():
        for d, q in pe_neighbours(prm, p).items():
            other = m.pes[(sip, cube, q)]
            o = OPPOSITE[d]
            connect(pe.ipcq.tx[d], other.ipcq.rx[o], capacity=prm.ipcq_depth + 1, latency=prm.ipcq_overhead,
                    bandwidth=prm.ipcq_bw)
            connect(pe.ipcq.cr_tx[d], other.ipcq.cr_rx[o], capacity=prm.ipcq_depth + 1, latency=prm.credit_latency)

    # CUBE NOC / UCIe mesh
    for (sip, cube), r in m.routers.items():
        for d, (nsip, ncube) in _router_dirs(prm, sip, cube).items():
            other = m.routers[(nsip, ncube)]
            lat, bw = (prm.cube_link_latency, prm.cube_link_bw) if nsip == sip else (prm.sip_link_latency,
                                                                                   prm.sip_link_bw)
            connect(r.outs[d], other.ins[OPPOSITE[d]], capacity=prm.link_capacity, latency=lat, bandwidth=bw)

    _add_host(system, m, prm, programs_of(scripts, kernels), requests or [], batches, batch_pes)
    return m


def _add_host(system, m: Machine, prm, programs: dict, requests: list, batches, batch_pes) -> None:
    """The host / IO die and its links: the load path through its router, a launch and a completion link per
    launched PE (a requests plan's launch link holds every launch queued for that PE, build_machine)."""
    queued = {c: 1 for c in programs}
    plans = []
    for req in requests:
        for step in req.steps:
            for coord, launch in step.items():
                queued[tuple(coord)] = queued.get(tuple(coord), 0) + 1
                programs.setdefault(tuple(coord), launch)
        plans.append(RequestPlan(req.name, req.arrival_ps,
                                 [{pe_name(*c): launch for c, launch in step.items()} for step in req.steps]))
    for coord in batch_pes:
        programs.setdefault(tuple(coord), None)
    for coord in programs:
        m.pe(*coord)   # a clear error for a PE outside the machine
    m.host = system.add(Host("io/host", programs={pe_name(*c): p for c, p in programs.items()}, coord=prm.io_coord,
                             requests=plans, batches=batches))
    r = m.routers[prm.io_attach]
    connect = system.connect
    connect(m.host.noc_out, r.ins["io"], capacity=prm.link_capacity, latency=prm.io_latency, bandwidth=prm.io_bw)
    connect(r.outs["io"], m.host.noc_in, capacity=prm.link_capacity, latency=prm.io_latency, bandwidth=prm.io_bw)
    for coord in programs:
        pe = m.pe(*coord)
        connect(m.host.outs[pe_name(*coord)], pe.cpu.launch, capacity=queued.get(coord, 1) if plans else 1,
                latency=prm.launch_latency)
        connect(pe.cpu.pe_done, m.host.done, capacity=1, latency=prm.launch_latency)
