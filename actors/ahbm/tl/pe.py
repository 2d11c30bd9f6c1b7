"""A CUBE of PEs for ``tl`` kernels, built from the AHBM engine actors (actors/ahbm/*.py).

Per PE (``sip0/cube00/pe3/...``): the ``tl`` CPU (cpu.TlCpu), the PE scheduler,
DMA, GEMM and MATH engines, the TCM, ``hbm.pcs_per_pe`` HBM pseudo-channels and
the IPCQ block; IPCQ pairs join PEs adjacent in the CUBE's PE grid (``pe_grid``;
PE p sits at x = p % grid.x, y = p // grid.x; N = y-1, S = y+1, E = x+1, W = x-1,
as actors/ahbm/noc.py).

Wiring inside a PE (assumptions): command and TCM links have no latency and no
bandwidth limit (the engines' own formulas carry the time); command queues hold
``CMD_DEPTH`` commands (a full queue back-pressures the issuer); completion
queues hold ``DONE_DEPTH`` entries, more than a kernel keeps outstanding.  IPCQ
data links: latency ``ipcq.fixed_overhead``, bandwidth ``ipcq.bandwidth``,
capacity ``ipcq.depth`` (credits are enforced by the IPCQ block); credit return
links: latency ``ipcq.credit_latency`` (actors/ahbm/ipcq.py).

This builder exists because the machine builder of actors/ahbm is not ready;
it uses the engine actors unchanged and only adds the ``tl`` CPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from actors.ahbm.costs import stripe
from actors.ahbm.dma import DmaEngine
from actors.ahbm.gemm import GemmEngine
from actors.ahbm.ipcq import Ipcq
from actors.ahbm.mathunit import MathEngine
from actors.ahbm.memory import HbmChannel, Tcm
from actors.ahbm.noc import Router
from actors.ahbm.params import OPPOSITE, cube_name, pe_name
from actors.ahbm.scheduler import PeScheduler
from actors.ahbm.tl.cpu import TlCpu

__all__ = ["Pe", "build_cube", "build_cubes", "grid_xy", "neighbour", "hbm_place", "hbm_fetch", "CMD_DEPTH", "DONE_DEPTH"]

CMD_DEPTH = 16
DONE_DEPTH = 1 << 16
_STEP = {"N": (0, -1), "S": (0, 1), "E": (1, 0), "W": (-1, 0)}


@dataclass
class Pe:
    name: str
    index: int              # PE index inside its CUBE
    cpu: TlCpu
    cube: int = 0
    sip: int = 0
    channels: list = field(default_factory=list)
    actors: dict = field(default_factory=dict)


def grid_xy(p: int, prm) -> tuple[int, int]:
    return p % prm.gx, p // prm.gx


def neighbour(p: int, d: str, prm) -> int | None:
    x, y = grid_xy(p, prm)
    dx, dy = _STEP[d]
    x, y = x + dx, y + dy
    if 0 <= x < prm.gx and 0 <= y < prm.gy:
        return y * prm.gx + x
    return None


def _wire(system, src, dst, *, capacity=1, latency=0, bandwidth=0):
    system.connect(src, dst, capacity=capacity, latency=latency, bandwidth=bandwidth)


def build_pe(system, prm, sip: int, cube: int, p: int) -> Pe:
    name = pe_name(sip, cube, p)
    dirs = [d for d in ("N", "S", "E", "W") if neighbour(p, d, prm) is not None]
    add = system.add
    cpu = add(TlCpu(f"{name}/cpu", prm=prm, pe=name, dirs=dirs, coord=(sip, cube, p)))
    sched = add(PeScheduler(f"{name}/sched", prm=prm))
    dma = add(DmaEngine(f"{name}/dma", prm=prm, clients=["cpu", "sched"]))
    gemm = add(GemmEngine(f"{name}/gemm", prm=prm, clients=["cpu", "sched"]))
    mth = add(MathEngine(f"{name}/math", prm=prm, clients=["cpu", "sched"]))
    clients = ["cpu", "dma", "gemm", "math", "ipcq"]
    tcm = add(Tcm(f"{name}/tcm", clients=clients, capacity=prm.tcm_bytes))
    ipcq = add(Ipcq(f"{name}/ipcq", depth=prm.ipcq_depth, dirs=dirs))
    chans = [add(HbmChannel(f"{name}/hbm/pc{i}", index=i, prm=prm)) for i in range(prm.pcs)]
    # commands
    _wire(system, cpu.to["dma"], dma.cmd, capacity=CMD_DEPTH)
    _wire(system, cpu.to["gemm"], gemm.cmd, capacity=CMD_DEPTH)
    _wire(system, cpu.to["math"], mth.cmd, capacity=CMD_DEPTH)
    _wire(system, cpu.to["sched"], sched.cmd, capacity=CMD_DEPTH)
    _wire(system, cpu.to["ipcq"], ipcq.cmd, capacity=CMD_DEPTH)
    _wire(system, sched.dma, dma.cmd, capacity=CMD_DEPTH)
    _wire(system, sched.gemm, gemm.cmd, capacity=CMD_DEPTH)
    _wire(system, sched.math, mth.cmd, capacity=CMD_DEPTH)
    # completions
    for eng in (dma, gemm, mth):
        _wire(system, eng.done["cpu"], cpu.done, capacity=DONE_DEPTH)
        _wire(system, eng.done["sched"], sched.done, capacity=DONE_DEPTH)
    _wire(system, sched.done_cpu, cpu.done, capacity=DONE_DEPTH)
    _wire(system, ipcq.resp, cpu.ipcq_resp, capacity=DONE_DEPTH)
    # TCM
    for c, actor in (("cpu", cpu), ("dma", dma), ("gemm", gemm), ("math", mth), ("ipcq", ipcq)):
        client = actor.tcm
        _wire(system, client.req, tcm.req)
        _wire(system, tcm.out[c], client.resp)
    # HBM
    for i, ch in enumerate(chans):
        _wire(system, dma.pc_req[i], ch.req, capacity=CMD_DEPTH)
        _wire(system, ch.resp["dma"] if isinstance(ch.resp, dict) else ch.resp, dma.pc_resp, capacity=CMD_DEPTH)
    actors = {"cpu": cpu, "sched": sched, "dma": dma, "gemm": gemm, "math": mth, "tcm": tcm, "ipcq": ipcq}
    return Pe(name, p, cpu, cube, sip, chans, actors)


def build_cube(system, prm, sip: int = 0, cube: int = 0) -> list[Pe]:
    """All ``pes_per_cube`` PEs of one CUBE with their IPCQ pairs."""
    pes = [build_pe(system, prm, sip, cube, p) for p in range(prm.P)]
    for pe in pes:
        for d in pe.cpu.dirs:
            if d not in ("E", "S"):
                continue
            other = pes[neighbour(pe.index, d, prm)]
            back = OPPOSITE[d]
            a, b = pe.actors["ipcq"], other.actors["ipcq"]
            for x, dx, y, dy in ((a, d, b, back), (b, back, a, d)):
                _wire(system, x.tx[dx], y.rx[dy], capacity=prm.ipcq_depth, latency=prm.ipcq_overhead,
                      bandwidth=prm.ipcq_bw)
                _wire(system, y.cr_tx[dy], x.cr_rx[dx], capacity=prm.ipcq_depth, latency=prm.credit_latency)
    return pes


def build_cubes(system, prm, n_cubes: int, sip: int = 0) -> list[list[Pe]]:
    """CUBEs ``0 .. n_cubes-1`` of SIP ``sip`` (a rectangle of the CUBE mesh: ``n_cubes <= cubes.x`` or a
    multiple of it), each with its PEs, IPCQ pairs and NOC router, routers joined over intra-SIP UCIe.

    Links as actors/ahbm/builder.py (noc.py docstring): PE <-> router attach links
    ``noc.attach_bandwidth`` / ``noc.link_cycles``; router <-> router ``ucie.intra_sip``
    bandwidth and ``2 x port_latency + link_cycles``; capacity ``noc.link_capacity``.
    """
    if not (1 <= n_cubes <= prm.cubes) or (n_cubes > prm.cx and n_cubes % prm.cx):
        raise ValueError(f"{n_cubes} CUBEs: expected 1..{prm.cx} or a multiple of cubes.x = {prm.cx}"
                         f" up to {prm.cubes} (a rectangle of the mesh, so XY routes stay inside it)")
    cubes = [build_cube(system, prm, sip, c) for c in range(n_cubes)]
    built = set(range(n_cubes))

    def near(c):
        x, y = c % prm.cx, c // prm.cx
        out = {}
        for d, (dx, dy) in _STEP.items():
            nx, ny = x + dx, y + dy
            if 0 <= nx < prm.cx and 0 <= ny < prm.cy and ny * prm.cx + nx in built:
                out[d] = ny * prm.cx + nx
        return out

    routers = {c: system.add(Router(f"{cube_name(sip, c)}/router", sip=sip, cube=c, prm=prm, dirs=list(near(c))))
               for c in built}
    for c, pes in enumerate(cubes):
        r = routers[c]
        for pe in pes:
            system.connect(pe.cpu.noc_out, r.ins[f"pe{pe.index}"], capacity=prm.link_capacity, latency=prm.link_ps,
                           bandwidth=prm.attach_bw)
            system.connect(r.outs[f"pe{pe.index}"], pe.cpu.noc_in, capacity=prm.link_capacity, latency=prm.link_ps,
                           bandwidth=prm.attach_bw)
        for d, other in near(c).items():
            system.connect(r.outs[d], routers[other].ins[OPPOSITE[d]], capacity=prm.link_capacity,
                           latency=prm.cube_link_latency, bandwidth=prm.cube_link_bw)
    return cubes


def hbm_place(pe: Pe, prm, addr: int, array: np.ndarray) -> None:
    """Initial HBM contents (the host's placement before the run): ``array`` at ``addr``, striped over PCs."""
    blob = np.ascontiguousarray(array).tobytes()
    for pc, pieces in enumerate(stripe(addr, 1, len(blob), len(blob), prm.burst, prm.pcs)):
        for a, ln in pieces:
            pe.channels[pc].preload(a, blob[a - addr:a - addr + ln])


def hbm_fetch(pe: Pe, prm, addr: int, shape, dtype) -> np.ndarray:
    """Read a tensor back from a PE's HBM after the run (data mode)."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    out = bytearray(n)
    for pc, pieces in enumerate(stripe(addr, 1, n, n, prm.burst, prm.pcs)):
        for a, ln in pieces:
            out[a - addr:a - addr + ln] = pe.channels[pc]._read(a, ln)
    return np.frombuffer(bytes(out), dtype=np.dtype(dtype)).reshape(shape)
