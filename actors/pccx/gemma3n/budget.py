"""The Gemma 3N run's budget: bounds from the profile, the bound that binds, and the seed's §6 budget row by row.

**Bounds** (tok/s, independent of the run): the bytes a token must read, ``weights + KV read
once`` — every weight matrix's INT4 values and BF16 row scales once (no beat padding), every
attended K and V entry once per layer and KV head with its quantisation scales (no padding,
no re-reads, no softmax-sum row) — over the GEMV's HP ports (``ports x hp.beat_bytes x
f_axi``) and over host DDR (``ddr.bandwidth``); and the GEMV MACs of the token over
``lanes x gemv.macs_per_lane x f_core``.  The smallest binds; the report gives the run's
tok/s over it.

**The seed's budget** (seed §6: 20 tok/s, ~1.6 GB/s L2, ~6 GB/s KV at 8K, ~3 GB/s weight
stream; §1 / §3.2: a weight buffer holding one GEMV's weights; §2 step 2: W_embed, the
PLE table and the LM head resident in L2): each row beside what the emulator measures and
what the seed's own numbers imply (e.g. 20 tok/s x the bytes a token reads = the weight
stream it needs; two 128-bit HP ports at 250 MHz = 8 GB/s raw; the KV row's own formula
``20 layers x 512 x b/8 x 2 x L / 50 ms``).
"""
from __future__ import annotations

from collections import defaultdict

from emulator.units import ClockDomain

__all__ = ["BUDGET_TABLE", "bounds", "design_budget", "hp_idle_per_stage"]

GB = 1e9

#: the title of the workload's budget table in ``tables``; the energy rows join it after the run
#: (actors/pccx/energy.py ``energy_report``)
BUDGET_TABLE = "budget vs the pccx Gemma 3N plan and bounds"


def bounds(comp, profile: dict, ntok: int) -> dict:
    """Bytes per token (streamed and read-once) and the three bounds; ``binding`` names the smallest."""
    tc = ClockDomain(profile["clocks"]["core"], "core").ps(1)
    taxi = ClockDomain(profile["clocks"]["axi"], "axi").ps(1)
    g = profile["gemv"]
    hp_bw = len(comp.ports) * profile["hp"]["beat_bytes"] * 1e12 / taxi
    mac_rate = comp.lanes * g["macs_per_lane"] * 1e12 / tc
    hp = comp.weight_bytes_per_token() / ntok
    kv = comp.kv_bytes / ntok
    once = (comp.weight_min + comp.kv_once + comp.kv_scale_once) / ntok
    tok = {"weight_stream": hp_bw / once, "macs": mac_rate / (comp.macs / ntok),
           "ddr": profile["ddr"]["bandwidth"] / once}
    kv_once = comp.kv_once / ntok
    return {"hp_bytes_per_token": int(hp), "weight_bytes_per_token": int(hp - kv),
            "weight_min_bytes_per_token": int(comp.weight_min / ntok),
            "weight_pad_bytes_per_token": int(hp - kv - comp.weight_min / ntok),
            "kv_bytes_per_token": int(kv), "kv_read_once_bytes_per_token": int(kv_once),
            "kv_overhead_bytes_per_token": {"scales": int(comp.kv_scale_bytes / ntok),
                                            "softmax_sum_row": int(comp.kv_sum_bytes / ntok),
                                            "padding": int(comp.kv_pad_bytes / ntok),
                                            "reread": int(kv - kv_once - (comp.kv_scale_bytes + comp.kv_sum_bytes
                                                                          + comp.kv_pad_bytes) / ntok)},
            "bound_bytes_per_token": int(once), "gemv_macs_per_token": int(comp.macs / ntok),
            "hp_gemv_bandwidth_GBps": round(hp_bw / GB, 3), "gemv_mac_rate_GMACps": round(mac_rate / GB, 3),
            **{f"tok_s_bound_{k}": round(v, 3) for k, v in tok.items()},
            "binding": min(tok, key=tok.get), "tok_s_bound": round(min(tok.values()), 3)}


def design_budget(comp, profile: dict, b: dict, tok_s: float, tok_ps: float, ntok: int) -> list[dict]:
    """The seed's §6 rows (and the two capacity claims behind them), module docstring."""
    c = comp.c
    taxi = ClockDomain(profile["clocks"]["axi"], "axi").ps(1)
    per_s = 1e12 / tok_ps
    L = comp.ring.attended()
    kvb = comp.kv_bits / 8
    kv_formula = 20 * 512 * kvb * 2 * L / 0.05
    hp_raw = 2 * profile["hp"]["beat_bytes"] * 1e12 / taxi
    biggest = max(comp.mats.values(), key=lambda m: m.nbytes)
    ffn = comp.mats.get("L0.gate", biggest)   # the seed's example: one FFN GEMV
    tables = {k: comp.ddr.regions[k][1] for k in ("embed_table", "ple_table")}
    tables["lm_head"] = sum(m.nbytes for n, m in comp.mats.items() if n.startswith("lm_head."))
    l2_bytes = profile["l2"]["words"] * 16
    r = lambda x, n=3: round(x, n)   # noqa: E731
    return [
        {"row": "decode throughput (tok/s)", "design_doc": 20,
         "doc_implies": r(20 * b["bound_bytes_per_token"] / GB),
         "implies_what": "GB/s of weight + KV stream 20 tok/s needs (20 x bytes a token reads once)",
         "emulated": tok_s, "note": f"binding bound {b['binding']}: {b['tok_s_bound']} tok/s"},
        {"row": "L2 activation traffic (GB/s)", "design_doc": 1.6,
         "doc_implies": r(20 * comp.l2_bytes / ntok / GB),
         "implies_what": "GB/s at 20 tok/s of this program's L2 activation bytes per token",
         "emulated": r(comp.l2_bytes / ntok * per_s / GB), "note": f"{int(comp.l2_bytes / ntok)} bytes per token"},
        {"row": f"KV read at {L} slots (GB/s)", "design_doc": 6, "doc_implies": r(kv_formula / GB),
         "implies_what": f"the seed's formula 20 layers x 512 x {kvb:g} B x 2 x {L} / 50 ms",
         "emulated": r(b["kv_bytes_per_token"] * per_s / GB),
         "note": f"{b['kv_bytes_per_token']} bytes per token, read once {b['kv_read_once_bytes_per_token']}"},
        {"row": "weight stream (GB/s)", "design_doc": 3, "doc_implies": r(hp_raw / GB),
         "implies_what": "GB/s raw of two 128-bit HP ports at the AXI clock (the seed's own basis)",
         "emulated": r(b["weight_bytes_per_token"] * per_s / GB),
         "note": f"20 tok/s needs {r(20 * b['weight_min_bytes_per_token'] / GB)} GB/s of weights alone"},
        {"row": "weight buffer holds one GEMV's weights (bytes)", "design_doc": profile["hp"]["fifo_words"] * 16,
         "doc_implies": ffn.nbytes, "implies_what": f"bytes of one FFN GEMV ({ffn.name}; the largest: "
                                                     f"{biggest.name}, {biggest.nbytes})",
         "emulated": profile["hp"]["fifo_words"] * 16, "note": "a FIFO per HP port; rule 1 overlaps at most that"},
        {"row": "W_embed, PLE table, LM head resident in L2 (bytes)", "design_doc": l2_bytes,
         "doc_implies": sum(tables.values()), "implies_what": " + ".join(f"{k} {v}" for k, v in tables.items()),
         "emulated": l2_bytes, "note": "kept in host DDR: the host dequantises the rows, the LM head streams"},
    ]


def hp_idle_per_stage(system, comp, t0: int, t1: int, ntok: int) -> dict:
    """GEMV-port idle time in ``[t0, t1)`` per stage of the stream that starts after each idle gap (averaged over
    the GEMV ports, per token, µs): where the weight stream stops and why (its consumer waits for host work,
    polls or the SFU)."""
    idle: dict[str, float] = defaultdict(float)
    for p in comp.ports:
        prev = t0
        for s, e, st in sorted(system.actors[f"pccx/hp{p}"].spans):
            if e <= t0 or s >= t1:
                continue
            if s > prev:
                idle[comp.stream_where[st][2] if st < len(comp.stream_where) else "?"] += s - prev
            prev = max(prev, e)
        idle["(after the last stream)"] += max(0, t1 - prev)
    n = len(comp.ports) * ntok
    return {k: round(v / n / 1e6, 3) for k, v in sorted(idle.items(), key=lambda kv: -kv[1])}
