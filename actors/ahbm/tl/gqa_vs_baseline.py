"""Workload ``gqa_vs_baseline_decode``: the GQA decode kernel and the baseline fan-out decode side by side.

One KV head's decode, the same inputs (``q [G, d]``, ``K, V [context, d]``, drawn
once from the scenario seed) run by both kernels in the same machine at the same
time, on disjoint CUBEs of SIP 0:

* GQA (kernels/gqa_attention.py) on CUBE Group 0 (``C`` CUBEs x ``P`` PEs), K/V by
  the seed's hierarchical round-robin (§2.1), 2-level reduce-to-root;
* the baseline (kernels/attention_decode.py, seed §A) on the ``C*P`` PEs of CUBE
  Group 1 as an open line (snake through each CUBE's PEs, CUBE after CUBE), rank
  ``r`` holding the contiguous slice ``[r*S, (r+1)*S)``, all-to-all fan-out.

Each kernel's latency is the last end time of its PEs (host report, from the
launch); ``speedup`` = baseline / GQA.  Both outputs are checked against the same
float64 reference (GQA at its Group root, the baseline at every rank).  The two
share the NOC only at the IO die's router (launches, completions); their Level-1 /
line traffic stays inside their own Groups' CUBEs.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from actors.ahbm.kernels.gqa_attention import decode_tiles
from actors.ahbm.kernels.gqa_index import GroupLayout, snake
from actors.ahbm.params import pe_name
from actors.ahbm.tl import baseline_workload as base   # the baseline's kernel and line geometry
from actors.ahbm.tl import gqa_workload as gw
from actors.ahbm.tl.kernel_workload import KernelHooks, KernelLayout, Output, kernel_workload
from emulator.errors import BuildError
from emulator.schema import Enum, Int, Map
from emulator.units import format_time

__all__ = ["HOOKS", "WORKLOAD"]

PARAMS = Map({
    "C": Int(min=1, default=2, doc="CUBEs per Group (both kernels get C x P PEs)"),
    "P": Int(min=1, default=8, doc="PEs per CUBE: the machine's pes_per_cube"),
    "G": Int(min=1, default=4, doc="query heads per KV head (rows of the baseline)"),
    "d": Int(min=1, default=64),
    "context": Int(min=1, default=1024, doc="tokens in the KV cache; a multiple of C x P"),
    "tile": Int(min=0, default=64, doc="keys per KV tile, both kernels; 0 = one shot"),
    "gemm": Enum(["composite", "dot"], default="composite", doc="GQA kernel's GEMMs"),
    "baseline_gemm": Enum(["composite", "dot"], default="dot", doc="baseline kernel's GEMMs"),
})
BASE_ADDR = {"q": 0, "k": 2048 * gw.MiB, "v": 2560 * gw.MiB, "o": 128 * gw.MiB}   # below the tl HBM scratch


def _gqa_params(p) -> dict:
    return {"case": "decode", "C": p["C"], "P": p["P"], "heads": 1, "G": p["G"], "d": p["d"],
            "context": p["context"], "chunk": 1, "T_q": 1, "tile": p["tile"], "gemm": p["gemm"], "l2": "tree",
            "l1": "mesh", "request_id": 0}


def _layout(prm, p) -> KernelLayout:
    R = p["C"] * p["P"]
    if p["P"] != prm.P:
        raise BuildError(f"workload.params.P: the machine's pes_per_cube ({prm.P}), found {p['P']}")
    if p["context"] % R:
        raise BuildError(f"workload.params.context: a multiple of C x P = {R}, found {p['context']}")
    S = p["context"] // R
    if p["tile"] and S % p["tile"]:
        raise BuildError(f"workload.params.tile: must divide context / (C x P) = {S}, found {p['tile']}")
    lay = GroupLayout(prm.cx, prm.cy, p["C"])
    if lay.groups_per_sip < 2:
        raise BuildError(f"workload.params.C: two Groups of {p['C']} CUBEs must fit one SIP's"
                         f" {prm.cx}x{prm.cy} CUBE mesh")
    g = gw.gqa_layout(prm, _gqa_params(p))
    _, cubes = lay.cubes_of_head(1)
    w, h = lay.shape
    pes = snake(prm.gx, prm.gy)
    line = [(0, cubes[c], pe) for c in snake(w, h) for pe in pes]
    rank = {c: r for r, c in enumerate(line)}
    M, d = p["G"], p["d"]

    def args_of(c):
        if c not in rank:
            return g.args_of(c)
        r = rank[c]
        return dict(q_ptr=BASE_ADDR["q"], k_ptr=BASE_ADDR["k"], v_ptr=BASE_ADDR["v"], o_ptr=BASE_ADDR["o"], M=M, d=d,
                    S=S, tile=p["tile"], scale=1.0 / math.sqrt(d), rank=r, n=R,
                    fwd=base.line_peer(line[r], line[r + 1], prm) if r + 1 < R else None,
                    bwd=base.line_peer(line[r], line[r - 1], prm) if r > 0 else None, gemm=p["baseline_gemm"])

    info = {**g.info, "gqa": list(g.coords), "baseline": line, "S": S}
    return KernelLayout(list(g.coords) + line, args_of, g.grid_of, g.num_programs, info)


def _kernel(c, lay: KernelLayout) -> str:
    return base.DECODE if c in set(lay.info["baseline"]) else gw.KERNEL


def _inputs(rng, lay, p) -> dict:
    return gw.gqa_inputs(rng, lay, {**_gqa_params(p), "heads": 1})


def _place(place, lay, data, p) -> None:
    gw.gqa_place(place, lay, data, _gqa_params(p))
    x = data[0]
    S, T = lay.info["S"], (p["tile"] if 0 < p["tile"] < lay.info["S"] else lay.info["S"])
    for r, c in enumerate(lay.info["baseline"]):
        k = x["k"][r * S:(r + 1) * S]
        if p["baseline_gemm"] == "composite":
            k = k.reshape(S // T, T, p["d"]).transpose(0, 2, 1)
        for name, arr in (("q", x["q"][:, 0, :]), ("k", k), ("v", x["v"][r * S:(r + 1) * S])):
            place.write(c, BASE_ADDR[name], np.ascontiguousarray(arr).tobytes())


def _outputs(ctx) -> list:
    p = ctx.params
    gctx = _as_gqa(ctx)
    outs = gw.gqa_outputs(gctx)
    outs += [Output(c, BASE_ADDR["o"], (p["G"], p["d"]), "h0") for c in ctx.layout.info["baseline"]]
    return outs


def _as_gqa(ctx):
    return replace(ctx, params={**_gqa_params(ctx.params)})


def _reference(ctx) -> dict:
    return gw.gqa_reference(_as_gqa(ctx))


def _metrics(ctx, system, res) -> dict:
    pes = system.reports["io/host"]["pes"]
    lat = {k: max(pes[pe_name(*c)]["end_ps"] for c in ctx.layout.info[k]) for k in ("gqa", "baseline")}
    p = ctx.params
    row = {"C": p["C"], "P": p["P"], "G": p["G"], "d": p["d"], "context": p["context"], "tile": p["tile"],
           "gqa": f"{format_time(lat['gqa'])} ({p['gemm']})",
           "baseline": f"{format_time(lat['baseline'])} ({p['baseline_gemm']})",
           "speedup": round(lat["baseline"] / lat["gqa"], 3)}
    if "max_abs_err" in res:
        row["max_abs_err"] = res["max_abs_err"]
    return {"gqa_latency_ps": lat["gqa"], "baseline_latency_ps": lat["baseline"], "speedup": row["speedup"],
            "tables": {"GQA vs baseline decode (same inputs, same machine)": [row]}}


HOOKS = KernelHooks("gqa_vs_baseline_decode", "GQA decode and the baseline fan-out decode side by side, same inputs",
                    PARAMS, _kernel, _layout, _inputs, _place, _outputs, _reference, _metrics)
WORKLOAD = kernel_workload(HOOKS)
