"""Service-time formulas of the AHBM engines, each with its source.

All results are integer picoseconds; cycle counts go through the profile's
exact :class:`~emulator.units.ClockDomain`.  The engines call these functions
and nothing else to decide how long they are busy, so the closed forms in the
tests and in the microbenchmark table are these formulas applied by hand.

Sources: ``ref §x`` = /work/shared/reference/ahbm.md section; ``seed §x`` = the
first seed (ADR-0060); "assumption" = no public source, value in the profile.
"""
from __future__ import annotations

import math

from emulator.units import transfer_ps

__all__ = ["MATH_OPS", "stripe", "pc_ps", "pc_occupancy_ps", "dma_ps", "gemm_core_cycles", "gemm_cycles", "gemm_ps",
           "gemm_occupancy_ps", "math_cycles", "math_ps", "dispatch_ps"]

# MATH ops: passes over the elements (1 element / lane / cycle each, ref §2.3
# "exp/max/sum at 1 elem/lane/cycle") and whether the op ends in a row
# reduction (log2(lanes) extra cycles for the lane tree, ref §2.3).
MATH_OPS = {
    "copy": (1, False), "cast": (1, False), "add": (1, False), "sub": (1, False), "mul": (1, False),
    "div": (1, False), "maximum": (1, False), "scale": (1, False), "bias": (1, False), "relu": (1, False),
    "exp": (1, False), "rowmax": (1, True), "rowsum": (1, True), "sub_row": (1, False), "mul_row": (1, False),
    "div_row": (1, False),
}


def stripe(addr: int, rows: int, row_bytes: int, pitch: int, burst: int, pcs: int) -> list[list[tuple[int, int]]]:
    """Split a 2-D HBM block into per-pseudo-channel pieces ``(addr, length)``.

    Address striping of ref §2.6 / kernbench2 ADR-0033 D6 (ref §1.2):
    ``pc = (addr >> log2(burst)) & (pcs - 1)``; a piece never crosses a burst.
    """
    out: list[list[tuple[int, int]]] = [[] for _ in range(pcs)]
    for r in range(rows):
        a = addr + r * pitch
        end = a + row_bytes
        while a < end:
            nxt = min(end, (a // burst + 1) * burst)
            out[(a // burst) & (pcs - 1)].append((a, nxt - a))
            a = nxt
    return out


def pc_ps(nbytes: int, prm) -> int:
    """One pseudo-channel request on an idle channel: ``access_latency + pc_occupancy_ps(bytes)``.

    Closed-page access latency 30 ns (tRCD + tCL), 32 GB/s per PC (HBM4 at 8 Gb/s),
    efficiency 0.8 (refresh and turnarounds folded in): ref §2.1, §2.2, §2.6.
    """
    return prm.hbm_latency + pc_occupancy_ps(nbytes, prm)


def pc_occupancy_ps(nbytes: int, prm) -> int:
    """How long one request holds its pseudo-channel: its data burst, ``ceil(bytes / (pc_bandwidth x efficiency))``.

    A channel pipelines requests (memory.HbmChannel): request k's burst starts at
    ``max(arrival_k + access_latency, end of burst k-1)``.  The access latency is
    row activation + column access (tRCD + tCL, closed page), spent in a bank while
    the channel's data bus carries earlier requests' bursts: a pseudo-channel has
    several banks (bank groups; the tCCD/tFAW timings below are per channel), a new
    column command may follow the previous one after tCCD_L = 2.5 ns (ref §2.2, Ramulator 2 HBM3 preset), far below one
    256-B burst (10 ns at 25.6 GB/s), so the bus, not the access latency, limits a
    stream of requests.  Assumption: consecutive requests to one channel hit
    different banks (no row-cycle tRC stall), and activations are not limited by
    tFAW (4 per 30 ns, ref §2.2: binding only for requests under ~190 B).  Holding
    the channel for ``access_latency + transfer`` per request (the model before)
    serialised the latency of every request and cut a stream of 256-B requests to a
    quarter of the channel's bandwidth (30 + 10 ns per 10 ns of data).
    """
    return transfer_ps(nbytes, prm.pc_bw_eff)


def dma_ps(per_pc_bytes: list[int], prm) -> int:
    """A DMA command on the PE's own HBM: ``setup + max over used PCs of pc_ps(bytes_pc)``.

    The DMA engine spends ``setup`` (``dma.setup_cycles``, assumption: 20 cycles,
    sized so a small local DMA is ~50 ns, below kernbench2's 77 ns including its NOC,
    ref §1.2) then issues one request per pseudo-channel; the channels work in
    parallel, so the slowest one finishes the command.  Bytes per PC come from
    :func:`stripe`.  The TCM side is not a bottleneck (assumption: TCM port >= HBM rate).
    """
    used = [pc_ps(b, prm) for b in per_pc_bytes if b > 0]
    return prm.dma_setup + (max(used) if used else 0)


def gemm_core_cycles(m: int, k: int, n: int, prm) -> int:
    """Cycles the MAC array is occupied by ``[m, k] @ [k, n]``: its operands entering the array.

    ``ceil(m/R) * ceil(n/C) * k`` when padded tiles are charged (a fixed array computes
    the full R x C block whatever the valid rows: ref §2.3 caveat, ``gemm.charge_padded:
    true``), else ``ceil(m*n*k / (R*C))``.  R = C = 32 bf16 MACs/cycle, fp32 accumulate:
    ref §2.3, §2.6.
    """
    R, C = prm.array_rows, prm.array_cols
    if prm.charge_padded:
        return -(-m // R) * -(-n // C) * k
    return -(-(m * n * k) // (R * C))


def gemm_cycles(m: int, k: int, n: int, prm) -> int:
    """Latency of one GEMM command on an idle engine: ``fill_drain + gemm_core_cycles``.

    The array is a pipeline (gemm.py): a command occupies it for its core cycles, and
    its result leaves ``fill_drain`` cycles (the systolic skew in and the drain out,
    48 cycles: ref §2.3 "64 cycles steady state + ~32-64 cycles fill/drain" for a
    32x64x32 tile, §2.6) after its last operand entered.  The next command's operands
    follow right behind (output-stationary array with double-buffered output registers,
    assumption), so ``fill_drain`` overlaps the next command's core cycles; a command
    that continues the K sweep of the previous one's output block (GemmCmd.accumulate)
    streams behind it the same way.  A 32x64x32 tile alone = 64 + 48 = 112 cycles; n
    such tiles back to back = 48 + 64 n.  This is the rule the one-command form already
    applied across the output blocks of one command (``fill_drain`` once for all
    ``ceil(m/R) ceil(n/C)`` blocks); charging it per command made the same work cost
    more as the scheduler's per-block commands than as one ``tl.dot`` (a model error
    found by the composite-vs-dot comparison).
    """
    return prm.fill_drain + gemm_core_cycles(m, k, n, prm)


def gemm_ps(m: int, k: int, n: int, prm) -> int:
    return prm.pe_clk.ps(gemm_cycles(m, k, n, prm))


def gemm_occupancy_ps(m: int, k: int, n: int, prm) -> int:
    """How long the engine is busy with one command before it takes the next (gemm_cycles)."""
    return prm.pe_clk.ps(gemm_core_cycles(m, k, n, prm))


def math_cycles(op: str, elements: int, prm) -> int:
    """MATH engine cycles: ``fixed + passes * ceil(elements / lanes) (+ ceil(log2 lanes) for a reduction)``.

    64 fp32 lanes, 1 element per lane per cycle for exp/max/sum/element-wise ops,
    reductions log2(lanes) extra cycles: ref §2.3; ``fixed`` = per-op pipeline
    latency (``math.fixed_cycles``, assumption: 8 cycles, ref §4.5 "fixed op overheads").
    """
    if op not in MATH_OPS:
        raise ValueError(f"unknown MATH op {op!r}; known: {', '.join(sorted(MATH_OPS))}")
    passes, reduce = MATH_OPS[op]
    c = prm.math_fixed + passes * -(-elements // prm.lanes)
    if reduce:
        c += math.ceil(math.log2(prm.lanes)) if prm.lanes > 1 else 0
    return c


def math_ps(op: str, elements: int, prm) -> int:
    return prm.pe_clk.ps(math_cycles(op, elements, prm))


def dispatch_ps(kind: str, prm) -> int:
    """CPU dispatch cost of one op of ``kind`` (seed §B cost-model item: a composite
    descriptor push costs more than a primitive op).  Cycle counts in
    ``cpu.dispatch_cycles`` are assumptions (8 per primitive, 32 per composite)."""
    return prm.dispatch[kind]
