"""Closed-form models of the AHBM engines and interconnect: the times the microbench checks against.

Each function writes out the formula the engine's own docstring cites (dma.py,
gemm.py, mathunit.py, scheduler.py, noc.py, ipcq.py, host.py) from the machine
parameters (actors/ahbm/params.Params), independently of the actors, so a
measured time can be compared with it (actors/ahbm/microbench.py, tests).
The formulas and their sources are listed in microbench.py's docstring.
"""
from __future__ import annotations

import math

from emulator.units import transfer_ps
from protocols.ahbm import IpcqData, MemReq, MemResp, NocPacket, payload
from protocols.codec import TensorDesc, encode

from actors.ahbm.cpu import PKT_ID0
from actors.ahbm.tiles import plan

__all__ = ["BF16", "dma_model", "gemm_core", "gemm_model", "math_model", "composite_model", "path_model",
           "mesh_links", "noc_model", "remote_dma_model", "host_load_model", "ipcq_model"]

BF16 = "<f2"   # bf16 stored as float16 (ref §3.3)


def dma_model(nbytes: int, prm) -> int:
    """Aligned block of N bytes: ``setup + latency + ceil(ceil(N/pcs) / bw_eff)`` (every PC gets N/pcs)."""
    per_pc = -(-nbytes // prm.pcs) if nbytes >= prm.pcs * prm.burst else min(nbytes, prm.burst)
    return prm.dma_setup + prm.hbm_latency + transfer_ps(per_pc, prm.pc_bw_eff)


def gemm_core(m, k, n, prm) -> int:
    """Cycles the array is occupied: ``ceil(m/R) ceil(n/C) k`` (padded) or ``ceil(mnk / RC)``."""
    R, C = prm.array_rows, prm.array_cols
    return (-(-m // R)) * (-(-n // C)) * k if prm.charge_padded else -(-(m * n * k) // (R * C))


def gemm_model(m, k, n, prm) -> int:
    """A lone GEMM command: ``fill_drain + core`` cycles."""
    return prm.pe_clk.ps(prm.fill_drain + gemm_core(m, k, n, prm))


def math_model(elements: int, reduce: bool, prm) -> int:
    return prm.pe_clk.ps(prm.math_fixed + -(-elements // prm.lanes) + (math.ceil(math.log2(prm.lanes)) if reduce else 0))


def _block_ps(addr, rows, row_bytes, pitch, prm) -> int:
    per_pc = [0] * prm.pcs
    for r in range(rows):
        a, end = addr + r * pitch, addr + r * pitch + row_bytes
        while a < end:
            nxt = min(end, (a // prm.burst + 1) * prm.burst)
            per_pc[(a // prm.burst) % prm.pcs] += nxt - a
            a = nxt
    return prm.dma_setup + max(prm.hbm_latency + transfer_ps(b, prm.pc_bw_eff) for b in per_pc if b)


def composite_model(M, K, N, esize, epilogue, prm, a_addr=0, b_addr=0, c_addr=0) -> int:
    """The scheduler's double-buffered stream (scheduler.py docstring) as a recurrence, HBM operands,
    for a composite that reaches an idle scheduler (none taken ahead).

    One FIFO DMA queue; the GEMM engine a pipeline (gemm.py): GEMM s starts at
    ``max(its operands ready, engine free = start_{s-1} + core_{s-1})`` and completes
    ``fill_drain + core_s`` after its start if it ends its output block, else when its
    core cycles end (the partial block stays in the array, gemm.py).  After sending GEMM s the scheduler waits
    for GEMM s-1, queues the A load of step s+1, then runs the epilogue MATH steps and issues the store of
    the tile s-1 ended (if any); the command ends with the last tile's store.  B: the first step's block
    is one DMA, queued at 0 with A's; the other B blocks are panels (scheduler.panel_plan), queued at 0
    behind it, two at a time (PANEL_RING): panel r is queued when the last step of panel r-2 takes its
    block, and step s's operands are ready when its A load and its panel have landed.
    """
    from actors.ahbm.scheduler import PANEL_RING, panel_budget, panel_plan   # scheduler imports tl (late)
    dma_free = 0

    def dma(t, cost):
        nonlocal dma_free
        dma_free = max(t, dma_free) + cost
        return dma_free

    steps = plan(M, K, N, prm.tile)
    budget = panel_budget(prm, esize)
    pls = panel_plan(steps[1:], esize, budget) if budget else []
    panel_of = {i: r for r, p in enumerate(pls) for i in p.steps}
    left = [len(p.steps) for p in pls]
    landed: list[int] = []

    def pump(t):   # issue panels while a ring slot is free (panel r-RING fully taken)
        while len(landed) < len(pls) and (len(landed) < PANEL_RING or not left[len(landed) - PANEL_RING]):
            p = pls[len(landed)]
            landed.append(dma(t, _block_ps(b_addr + (p.k_lo * N + p.n_lo) * esize, p.k_hi - p.k_lo,
                                           (p.n_hi - p.n_lo) * esize, N * esize, prm)))

    def loads(s, t):   # resident blocks (tiles.py Step.load_a / load_b) are not re-loaded
        end = t
        if s.load_a:
            end = dma(t, _block_ps(a_addr + (s.m0 * K + s.k0) * esize, s.tm, s.tk * esize, K * esize, prm))
        if s.load_b and s.index not in panel_of:
            end = dma(t, _block_ps(b_addr + (s.k0 * N + s.n0) * esize, s.tk, s.tn * esize, N * esize, prm))
        return end

    def ready(s, t, a_ready):   # operands in the step's buffers: its DMAs, then its panel block copied
        t = max(t, a_ready)
        r = panel_of.get(s.index)
        if r is not None:
            t = max(t, landed[r])
            left[r] -= 1
            if not left[r]:
                pump(t)
        return t

    def finish(s, t):   # after GEMM s: its tile's epilogue and store
        nonlocal end
        if s.last:
            for _ in epilogue:
                t += math_model(s.tm * s.tn, False, prm)
            end = dma(t, _block_ps(c_addr + (s.m0 * N + s.n0) * esize, s.tm, s.tn * esize, N * esize, prm))
        return t

    a_ready = loads(steps[0], 0)
    pump(0)
    t = engine_free = end = 0
    prev = None
    for s in steps:
        t = ready(s, t, a_ready)
        start = max(t, engine_free)
        engine_free = start + prm.pe_clk.ps(gemm_core(s.tm, s.tk, s.tn, prm))
        done = start + gemm_model(s.tm, s.tk, s.tn, prm) if s.last else engine_free   # K steps 1..n-1: no drain
        if prev is not None:
            t = max(t, prev[1])            # GEMM s-1 done: its buffers are free
        if s.index + 1 < len(steps):
            a_ready = loads(steps[s.index + 1], t)
        if prev is not None:
            t = finish(prev[0], t)
        prev = (s, done)
    t = finish(prev[0], max(t, prev[1]))
    return max(t, end)


def path_model(S: int, links: list[tuple[int, int]], prm) -> int:
    """Zero-load time of one routed message of S bytes over ``links`` = [(bandwidth, latency), ...]
    (attach link, mesh links, attach link), with a router between consecutive links (noc.py docstring):

    * store-and-forward: ``sum_i (ceil(S/B_i) + L_i) + (n - 1) alpha``;
    * cut-through: ``sum_i L_i + (n - 1) alpha + max_i ceil(S/B_i)`` (R1: alpha h + S/B_bottleneck).
    """
    routers = (len(links) - 1) * prm.router_ps
    if prm.cut_through:
        return sum(lat for _, lat in links) + routers + max(transfer_ps(S, bw) for bw, _ in links)
    return sum(transfer_ps(S, bw) + lat for bw, lat in links) + routers


def mesh_links(hops: int, prm, *, sip_hops: int = 0) -> list[tuple[int, int]]:
    """The CUBE links of an XY path of ``hops`` links, ``sip_hops`` of them UCIe SIP crossings."""
    return ([(prm.cube_link_bw, prm.cube_link_latency)] * (hops - sip_hops)
            + [(prm.sip_link_bw, prm.sip_link_latency)] * sip_hops)


def noc_model(nbytes_payload: int, hops: int, prm, *, sip_hops: int = 0) -> int:
    """Zero-load time of one NOC packet PE -> PE over ``hops`` CUBE links (``sip_hops`` of them UCIe SIP links)."""
    S = encode(NocPacket(PKT_ID0, [0, 0, 0], [0, 0, 0], 0, payload(TensorDesc.of((nbytes_payload // 2,), BF16))))[1]
    att = (prm.attach_bw, prm.link_ps)
    return path_model(S, [att] + mesh_links(hops, prm, sip_hops=sip_hops) + [att], prm)


def remote_dma_model(nbytes: int, hops: int, addr: int, src, dst, prm) -> int:
    """Remote load: ``setup + Z(S_req, h) + latency + ceil((N/pcs) / bw_eff) + Z(S_resp, h)`` (dma.py docstring).

    The request runs DMA attach link -> mesh -> the owner's HBM port link; the response the
    reverse (builder.py: DMA links ``noc.attach_bandwidth``, HBM port links ``noc.hbm_attach_bandwidth``).
    """

    dma_att, hbm_att = (prm.attach_bw, prm.link_ps), (prm.hbm_attach_bw, prm.link_ps)
    mesh = mesh_links(hops, prm)
    req = encode(MemReq(1, "read", list(src), list(dst), 0, addr, 1, nbytes, nbytes, None))[1]
    resp = encode(MemResp(1, list(dst), list(src), 0, payload(TensorDesc.of((nbytes,), "|u1"))))[1]
    return (dma_model(nbytes, prm) + path_model(req, [dma_att] + mesh + [hbm_att], prm)
            + path_model(resp, [hbm_att] + mesh[::-1] + [dma_att], prm))


def host_load_model(nbytes: int, hops: int, addr: int, dst, prm) -> int:
    """Timed host load: request over the host interface + NOC, channels, acknowledgement back (host.py docstring).

    The request's last link and the acknowledgement's first are the owner's HBM port link
    (``noc.hbm_attach_bandwidth``, ref §1.2 hbm_to_router_bw_gbs 256; builder.py).
    """

    links = [(prm.io_bw, prm.io_latency)] + mesh_links(hops, prm) + [(prm.hbm_attach_bw, prm.link_ps)]
    io = prm.io_coord
    req = encode(MemReq(1, "write", io, list(dst), 0, addr, 1, nbytes, nbytes,
                        payload(TensorDesc.of((nbytes,), "|u1"))))[1]
    ack = encode(MemResp(1, list(dst), io, 0, None))[1]
    return (path_model(req, links, prm) + prm.hbm_latency + transfer_ps(-(-nbytes // prm.pcs), prm.pc_bw_eff)
            + path_model(ack, links[::-1], prm))


def ipcq_model(nbytes_payload: int, prm) -> int:
    """IPCQ message: ``S / ipcq.bandwidth + ipcq.fixed_overhead`` (ipcq.py docstring; ref §1.2 kernbench2 figures)."""
    S = encode(IpcqData(1, payload(TensorDesc.of((nbytes_payload // 2,), BF16))))[1]
    return transfer_ps(S, prm.ipcq_bw) + prm.ipcq_overhead


# --------------------------------------------------------------------------- build
