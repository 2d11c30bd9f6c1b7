"""Analytic lower bound of the GQA kernel's latency, from the machine profile alone.

Used by the GQA workload's report (``bound_ps``, ``ratio_to_bound``) and reusable
by a sweep.  Every term is a time no schedule can beat on the modelled machine:

* ``launch``: the IO die -> PE command path, ``io.launch_latency`` (host.py);
* ``first_access``: one DMA setup + one closed-page HBM access before the first
  K byte reaches the PE (``dma.setup_cycles`` + ``hbm.access_latency``, costs.dma_ps);
* ``kv``: the K/V bytes the busiest-path rank must read, at the usable HBM
  bandwidth of one PE, ``pcs_per_pe x pc_bandwidth x efficiency`` (costs.pc_ps:
  8 x 32 GB/s x 0.8 = 204.8 GB/s by default);
* ``gemm``: the padded MAC-array cycles of its GEMMs, ``ceil(m/R) ceil(n/C) k`` per
  GEMM as the engine charges them (costs.gemm_core_cycles, ``charge_padded``), without
  the fill/drain (a lower bound for any tiling: back-to-back commands overlap it);
* ``reduction``: per Level-2 tree level one IPCQ hop carrying ``O`` (``ipcq.fixed_overhead``
  + O bytes / ``ipcq.bandwidth``), per Level-1 level one CUBE-to-CUBE crossing
  (intra-SIP UCIe ``2 x port_latency + link`` + O bytes / UCIe bandwidth); a chunked-O ring level
  (``l*_chunks = n``) has ``n - 1 + n div 2`` levels (rounds) of one hop carrying ``O / n`` each
  (the smallest chunk, rounded down).

``bound = launch + first_access + max(kv, gemm) + reduction``: K/V streaming and
the GEMMs may overlap perfectly, so only the larger one counts; the reduction
needs the last partial.  An emulated latency below this bound is a model bug
(tests/test_gqa_kernel.py asserts ratio >= 1).
"""
from __future__ import annotations

from emulator.units import transfer_ps

from actors.ahbm.costs import gemm_core_cycles

__all__ = ["padded_gemm_cycles", "attention_bound"]


def padded_gemm_cycles(m: int, k: int, n: int, prm) -> int:
    """MAC-array cycles of one GEMM without fill/drain: the engine's own core formula (costs.gemm_core_cycles)."""
    return gemm_core_cycles(m, k, n, prm)


def attention_bound(prm, *, M: int, d: int, tiles: list[int], kv_keys: int, l2_depth: int, l1_depth: int,
                    l2_chunks: int = 1, l1_chunks: int = 1) -> dict:
    """Terms and total (ps) for one rank sweeping ``tiles`` (keys per KV tile, M query rows) over ``kv_keys``
    keys of K and V, followed by ``l2_depth`` IPCQ and ``l1_depth`` CUBE-NOC reduction levels."""
    kv_bytes = 2 * kv_keys * d * 2
    hbm_bw = prm.pcs * prm.pc_bw_eff
    cycles = sum(padded_gemm_cycles(M, d, n, prm) + padded_gemm_cycles(M, n, d, prm) for n in tiles)
    o_bytes = M * d * 4
    hop2 = prm.ipcq_overhead + transfer_ps(o_bytes // l2_chunks, prm.ipcq_bw)
    hop1 = prm.cube_link_latency + transfer_ps(o_bytes // l1_chunks, prm.cube_link_bw)
    terms = {"launch_ps": prm.launch_latency, "first_access_ps": prm.dma_setup + prm.hbm_latency,
             "kv_ps": transfer_ps(kv_bytes, hbm_bw), "gemm_ps": prm.pe_clk.ps(cycles),
             "reduction_ps": l2_depth * hop2 + l1_depth * hop1}
    terms["bound_ps"] = (terms["launch_ps"] + terms["first_access_ps"] + max(terms["kv_ps"], terms["gemm_ps"])
                         + terms["reduction_ps"])
    terms["kv_bytes_per_rank"] = kv_bytes
    return terms
