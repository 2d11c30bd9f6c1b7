"""Workloads of the ``tl`` runtime: the seed's baseline attention kernels (seed §A).

* ``attention_decode``  - split-KV partial attention per rank, all-to-all (m, l, O) fan-out
  with log-sum-exp merge (kernels/attention_decode.py);
* ``attention_prefill`` - open-mesh bidirectional K/V propagation with online-softmax
  folding (kernels/attention_prefill.py).

Both run on ``ranks`` PEs that form an open line: a snake through each CUBE's PE
grid (row 0 west->east, row 1 east->west, ...), so consecutive ranks inside a
CUBE are IPCQ neighbours; with ``cubes > 1`` the line continues in the next CUBE
and the hop between CUBEs is a CUBE-NOC message (XY routed, actors/ahbm/noc.py).
A larger PE grid (``machine.overrides: {pes_per_cube: 16, pe_grid: {x: 8, y: 2}}``)
gives longer all-IPCQ lines.  Only the CUBEs used are built (one SIP).

Inputs are drawn from the scenario seed (stream ``attention/inputs``), normal(0, 1),
rounded to bf16's numpy proxy float16 (ref §3.3) and placed in each rank's HBM
before the run; in timing mode nothing is placed (same shapes, same times).
``check`` compares every rank's output with a float64 numpy attention over the
same inputs (data mode: ``max_abs_err``, ``max_rel_err``) and returns a latency
table.  Timing starts at the host's launch (t = 0).
"""
from __future__ import annotations

import math

import numpy as np

from actors.ahbm.kernels.attention_decode import attention_decode
from actors.ahbm.kernels.attention_prefill import attention_prefill
from actors.ahbm.params import Params
from actors.ahbm.tl.cpu import register_kernel
from actors.ahbm.tl.launcher import launch
from actors.ahbm.tl.pe import build_cubes, grid_xy, hbm_fetch, hbm_place
from actors.registry import Workload
from emulator.errors import BuildError
from emulator.schema import Enum, Int, Map
from emulator.units import format_time

__all__ = ["WORKLOADS", "line_order", "reference_attention"]

DECODE = register_kernel(attention_decode, "attention_decode")
PREFILL = register_kernel(attention_prefill, "attention_prefill")

COMMON = {
    "ranks": Int(min=1, default=8, doc="PEs on the open line (<= cubes x pes_per_cube)"),
    "cubes": Int(min=1, default=1, doc="CUBEs used (<= cubes.x or a multiple of it); the line crosses CUBEs"
                                       " over the CUBE NOC"),
    "d": Int(min=1, default=64, doc="head dimension (seed validation scale: 64)"),
    "s_per_rank": Int(min=1, default=16, doc="keys per rank (seed validation scale: 16)"),
    "tile": Int(min=0, default=0, doc="keys per tile, 0 = the whole slice in one shot; must divide s_per_rank"),
}
DECODE_PARAMS = Map({
    **COMMON,
    "rows": Int(min=1, default=1, doc="query rows M = G x T_q (seed validation: h_q = 1, T_q = 1)"),
    "gemm": Enum(["dot", "composite"], default="dot",
                 doc="dot: blocking tl.dot (the baseline); composite: non-blocking tl.composite (seed hybrid)"),
})
PREFILL_PARAMS = Map({
    **COMMON,
    "rows": Int(min=1, default=16, doc="query rows per rank (seed validation: S_q = 16)"),
})


def line_order(prm: Params, n: int, cubes: int = 1) -> list[tuple[int, int]]:
    """``(cube, pe)`` of an ``n``-rank open line: a snake through each CUBE's PE grid, CUBE after CUBE."""
    snake = []
    for y in range(prm.gy):
        xs = range(prm.gx) if y % 2 == 0 else range(prm.gx - 1, -1, -1)
        snake += [y * prm.gx + x for x in xs]
    return [(c, p) for c in range(cubes) for p in snake][:n]


def _peer(a: tuple[int, int], b: tuple[int, int], prm: Params):
    """How rank at ``a`` reaches rank at ``b``: an IPCQ direction, or ``[sip, cube, pe]`` over the CUBE NOC."""
    if a[0] == b[0]:
        (ax, ay), (bx, by) = grid_xy(a[1], prm), grid_xy(b[1], prm)
        d = {(1, 0): "E", (-1, 0): "W", (0, 1): "S", (0, -1): "N"}.get((bx - ax, by - ay))
        if d is not None:
            return d
    return [0, b[0], b[1]]


def _align(n: int, a: int = 4096) -> int:
    return -(-n // a) * a


def _inputs(seed_rng, kind: str, n: int, M: int, S: int, d: int) -> dict:
    f2 = np.float16
    q_shape = (M, d) if kind == "decode" else (n, M, d)
    q = seed_rng.standard_normal(q_shape).astype(np.float32).astype(f2)
    k = seed_rng.standard_normal((n, S, d)).astype(np.float32).astype(f2)
    v = seed_rng.standard_normal((n, S, d)).astype(np.float32).astype(f2)
    return {"q": q, "k": k, "v": v}


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Float64 softmax(q kᵀ / sqrt(d)) v over all keys (non-causal)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = q @ k.T / math.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _build(kind: str, system, profile: dict, p: dict) -> None:
    prm = Params.of(profile)
    n, d, S, tile, M, nc = p["ranks"], p["d"], p["s_per_rank"], p["tile"], p["rows"], p["cubes"]
    if n > nc * prm.P:
        raise BuildError(f"workload.params.ranks: at most cubes x pes_per_cube = {nc} x {prm.P} = {nc * prm.P}"
                         f" ranks, found {n} (raise workload.params.cubes, or pes_per_cube and pe_grid)")
    if tile and S % tile:
        raise BuildError(f"workload.params.tile: must divide s_per_rank = {S}, found {tile}")
    try:
        cubes = build_cubes(system, prm, nc)
    except ValueError as e:
        raise BuildError(f"workload.params.cubes: {e}") from None
    order = line_order(prm, n, nc)
    pes = [cubes[c][i] for c, i in order]
    T = tile if 0 < tile < S else S
    composite = kind == "decode" and p.get("gemm") == "composite"
    q_bytes = M * d * 2
    kv_bytes = S * d * 2
    addr = {"q": 0}
    addr["k"] = _align(q_bytes)
    addr["v"] = addr["k"] + _align(kv_bytes)
    addr["o"] = addr["v"] + _align(kv_bytes)
    data = None
    if system.mode == "data":
        data = _inputs(system.rng("attention/inputs"), kind, n, M, S, d)
        for r, pe in enumerate(pes):
            q = data["q"] if kind == "decode" else data["q"][r]
            k = data["k"][r]
            if composite:  # K pre-transposed, tile-major [S/T, d, T] (seed §B item 2)
                k = np.ascontiguousarray(k.reshape(S // T, T, d).transpose(0, 2, 1))
            hbm_place(pe, prm, addr["q"], q)
            hbm_place(pe, prm, addr["k"], k)
            hbm_place(pe, prm, addr["v"], data["v"][r])
    pos = {pe.name: r for r, pe in enumerate(pes)}

    def args_of(pe):
        r = pos[pe.name]
        a = dict(q_ptr=addr["q"], k_ptr=addr["k"], v_ptr=addr["v"], o_ptr=addr["o"], M=M, d=d, S=S, tile=tile,
                 scale=1.0 / math.sqrt(d), rank=r, n=n,
                 fwd=_peer(order[r], order[r + 1], prm) if r + 1 < n else None,
                 bwd=_peer(order[r], order[r - 1], prm) if r > 0 else None)
        if kind == "decode":
            a["gemm"] = p["gemm"]
        return a

    host = launch(system, prm, pes, DECODE if kind == "decode" else PREFILL, args_of,
                  lambda pe: (pe.index, pe.cube), (prm.P, nc))
    system.tl_attention = {"kind": kind, "prm": prm, "pes": pes, "addr": addr, "data": data, "host": host,
                           "params": dict(p)}


def _check(system, profile: dict, p: dict, result) -> dict:
    info = getattr(system, "tl_attention", None)
    if info is None or result.status != "finished":
        return {}
    kind, prm, pes = info["kind"], info["prm"], info["pes"]
    n, M, d, S = p["ranks"], p["rows"], p["d"], p["s_per_rank"]
    reps = system.reports
    cpus = [reps.get(f"{pe.name}/cpu", {}) for pe in pes]
    steps = max(c.get("reduction_steps", 0) for c in cpus)
    merges = sorted({c.get("merges", 0) for c in cpus})
    latency = reps["io/host"]["kernel_latency_ps"]
    partial = max(c.get("partial_done_ps", 0) for c in cpus) - reps["io/host"]["launch_ps"]
    out = {"latency_ps": latency, "reduction_steps": steps, "merges_per_rank": merges,
           "tcm_peak_B": max(v["tcm_peak_B"] for v in reps["io/host"]["pes"].values())}
    row = {"kernel": f"{kind}" + (f"/{p['gemm']}" if kind == "decode" else ""), "mode": system.mode, "ranks": n,
           "rows": M, "d": d, "S/rank": S, "tile": p["tile"] or S, "partial_ps": partial, "latency_ps": latency,
           "latency": format_time(latency), "steps": steps}
    if system.mode == "data":
        data = info["data"]
        k_all = data["k"].reshape(n * S, d)
        v_all = data["v"].reshape(n * S, d)
        worst_abs = worst_rel = 0.0
        for r, pe in enumerate(pes):
            q = data["q"] if kind == "decode" else data["q"][r]
            ref = reference_attention(q, k_all, v_all)
            got = hbm_fetch(pe, prm, info["addr"]["o"], (M, d), "<f4").astype(np.float64)
            err = np.abs(got - ref)
            worst_abs = max(worst_abs, float(err.max()))
            worst_rel = max(worst_rel, float((err / np.maximum(np.abs(ref), 1e-3)).max()))
        out["max_abs_err"] = worst_abs
        out["max_rel_err"] = worst_rel
        row["max_abs_err"] = worst_abs
    out["tables"] = {f"attention {kind} latency": [row]}
    return out


def build_decode(system, profile, p):
    _build("decode", system, profile, p)


def build_prefill(system, profile, p):
    _build("prefill", system, profile, p)


WORKLOADS = {
    "attention_decode": Workload(
        "attention_decode", "baseline decode attention: partial per rank, all-to-all (m, l, O) fan-out, LSE merge",
        DECODE_PARAMS, build_decode, _check),
    "attention_prefill": Workload(
        "attention_prefill", "baseline prefill attention: bidirectional open-mesh K/V propagation, online softmax",
        PREFILL_PARAMS, build_prefill, _check),
}
