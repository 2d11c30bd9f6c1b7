"""Workloads of the ``tl`` runtime: the seed's baseline attention kernels (seed §A).

* ``attention_decode``  - split-KV partial attention per rank, all-to-all (m, l, O) fan-out
  with log-sum-exp merge (kernels/attention_decode.py);
* ``attention_prefill`` - open-mesh bidirectional K/V propagation with online-softmax
  folding (kernels/attention_prefill.py).

Both run on ``ranks`` PEs of the machine built by actors/ahbm/builder.py from
the scenario's profile (ahbm-1sip / 2sip / 4sip), launched by its host
(``io/host``).  The ranks form an open line: a snake through each CUBE's PE grid
(row 0 west->east, row 1 east->west, ...), so consecutive ranks inside a CUBE
are IPCQ neighbours; with ``cubes > 1`` the line continues in the next CUBE of
a snake through the machine's global CUBE mesh (row 0 of SIP 0, SIP 1, ... west
to east, then row 1 back east to west, ...: SIPs join along x, noc.py), so
consecutive CUBEs are NOC neighbours and the hop between them is a CUBE-NOC
message, over intra-SIP UCIe, or over inter-SIP UCIe when the line crosses into
the next SIP (``cubes`` > ``cubes.x`` with 2+ SIPs).  A larger PE grid
(``machine.overrides: {pes_per_cube: 16, pe_grid: {x: 8, y: 2}}``) gives longer
all-IPCQ lines.

Inputs are drawn from the scenario seed (stream ``attention/inputs``), normal(0, 1),
rounded to bf16's numpy proxy float16 (ref §3.3) and placed in each rank's HBM
before the run; in timing mode nothing is placed (same shapes, same times).
``check`` compares every rank's output with a float64 numpy attention over the
same inputs (data mode: ``max_abs_err``, ``max_rel_err``) and returns a latency
table.  Timing starts at the host's launch (t = 0): the kernel latency is the
host's, from sending the launches to receiving the last KernelDone.
"""
from __future__ import annotations

import math

import numpy as np

from actors.ahbm.kernels.attention_decode import attention_decode
from actors.ahbm.kernels.attention_prefill import attention_prefill
from actors.ahbm.builder import build_machine
from actors.ahbm.params import Params, pe_name
from actors.ahbm.placement import Placement
from actors.ahbm.tl.cpu import register_kernel
from actors.ahbm.tl.launcher import kernel_launches
from actors.registry import Workload
from emulator.errors import BuildError
from emulator.schema import Enum, Int, Map
from emulator.units import format_time

__all__ = ["WORKLOADS", "line_order", "cube_line", "reference_attention", "output_of"]

DECODE = register_kernel(attention_decode, "attention_decode")
PREFILL = register_kernel(attention_prefill, "attention_prefill")

COMMON = {
    "ranks": Int(min=1, default=8, doc="PEs on the open line (<= cubes x pes_per_cube)"),
    "cubes": Int(min=1, default=1, doc="CUBEs used, along a snake through the machine's CUBE mesh (row 0 of"
                                       " every SIP first); the line crosses CUBEs over the CUBE NOC and SIPs"
                                       " over UCIe"),
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


def cube_line(prm: Params, cubes: int) -> list[tuple[int, int]]:
    """``(sip, cube)`` of the first ``cubes`` CUBEs of a snake through the machine's global CUBE mesh
    (``sips * cubes.x`` wide, ``cubes.y`` high; SIPs join along x): consecutive CUBEs are NOC neighbours."""
    width = prm.sips * prm.cx
    out = []
    for gy in range(prm.cy):
        xs = range(width) if gy % 2 == 0 else range(width - 1, -1, -1)
        out += [(gx // prm.cx, gy * prm.cx + gx % prm.cx) for gx in xs]
    return out[:cubes]


def line_order(prm: Params, n: int, cubes: int = 1) -> list[tuple[int, int, int]]:
    """``(sip, cube, pe)`` of an ``n``-rank open line: a snake through each CUBE's PE grid, CUBE after CUBE."""
    snake = []
    for y in range(prm.gy):
        xs = range(prm.gx) if y % 2 == 0 else range(prm.gx - 1, -1, -1)
        snake += [y * prm.gx + x for x in xs]
    return [(s, c, p) for s, c in cube_line(prm, cubes) for p in snake][:n]


def _peer(a: tuple, b: tuple, prm: Params):
    """How rank at ``a`` reaches rank at ``b``: an IPCQ direction, or ``[sip, cube, pe]`` over the NOC / UCIe."""
    if a[:2] == b[:2]:
        (ax, ay), (bx, by) = (a[2] % prm.gx, a[2] // prm.gx), (b[2] % prm.gx, b[2] // prm.gx)
        d = {(1, 0): "E", (-1, 0): "W", (0, 1): "S", (0, -1): "N"}.get((bx - ax, by - ay))
        if d is not None:
            return d
    return list(b)


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


def output_of(system, r: int) -> np.ndarray:
    """Rank ``r``'s stored output ``O [M, d]`` (fp32) read back from its HBM after a data-mode run."""
    info = system.tl_attention
    M, d = info["params"]["rows"], info["params"]["d"]
    blob = info["placement"].read(info["coords"][r], info["addr"]["o"], M * d * 4)
    return np.frombuffer(blob, np.float32).reshape(M, d)


def _build(kind: str, system, profile: dict, p: dict) -> None:
    prm = Params.of(profile)
    n, d, S, tile, M, nc = p["ranks"], p["d"], p["s_per_rank"], p["tile"], p["rows"], p["cubes"]
    total = prm.sips * prm.cubes
    if nc > total:
        raise BuildError(f"workload.params.cubes: {nc} CUBEs, but the machine has {prm.sips} SIP(s) x {prm.cubes}"
                         f" CUBEs = {total}")
    if n > nc * prm.P:
        raise BuildError(f"workload.params.ranks: at most cubes x pes_per_cube = {nc} x {prm.P} = {nc * prm.P}"
                         f" ranks, found {n} (raise workload.params.cubes, or pes_per_cube and pe_grid)")
    if tile and S % tile:
        raise BuildError(f"workload.params.tile: must divide s_per_rank = {S}, found {tile}")
    order = line_order(prm, n, nc)
    T = tile if 0 < tile < S else S
    composite = kind == "decode" and p.get("gemm") == "composite"
    q_bytes = M * d * 2
    kv_bytes = S * d * 2
    addr = {"q": 0}
    addr["k"] = _align(q_bytes)
    addr["v"] = addr["k"] + _align(kv_bytes)
    addr["o"] = addr["v"] + _align(kv_bytes)

    rank_of = {c: r for r, c in enumerate(order)}

    def args_of(coord):
        r = rank_of[coord]
        a = dict(q_ptr=addr["q"], k_ptr=addr["k"], v_ptr=addr["v"], o_ptr=addr["o"], M=M, d=d, S=S, tile=tile,
                 scale=1.0 / math.sqrt(d), rank=r, n=n,
                 fwd=_peer(order[r], order[r + 1], prm) if r + 1 < n else None,
                 bwd=_peer(order[r], order[r - 1], prm) if r > 0 else None)
        if kind == "decode":
            a["gemm"] = p["gemm"]
        return a

    kernels = kernel_launches(DECODE if kind == "decode" else PREFILL, order, args_of,
                              lambda c: (c[2], c[1], c[0]), (prm.P, prm.cubes, prm.sips))
    machine = build_machine(system, profile, kernels=kernels)
    place = Placement(machine, system.mode == "data")
    data = None
    if system.mode == "data":
        data = _inputs(system.rng("attention/inputs"), kind, n, M, S, d)
        for r, coord in enumerate(order):
            q = data["q"] if kind == "decode" else data["q"][r]
            k = data["k"][r]
            if composite:  # K pre-transposed, tile-major [S/T, d, T] (seed §B item 2)
                k = np.ascontiguousarray(k.reshape(S // T, T, d).transpose(0, 2, 1))
            for name, x in (("q", q), ("k", k), ("v", data["v"][r])):
                place.write(coord, addr[name], np.ascontiguousarray(x).tobytes())
    system.tl_attention = {"kind": kind, "prm": prm, "machine": machine, "coords": order, "placement": place,
                           "addr": addr, "data": data, "params": dict(p)}


def _check(system, profile: dict, p: dict, result) -> dict:
    info = getattr(system, "tl_attention", None)
    if info is None or result.status != "finished":
        return {}
    kind, coords = info["kind"], info["coords"]
    n, M, d, S = p["ranks"], p["rows"], p["d"], p["s_per_rank"]
    reps = system.reports
    cpus = [reps.get(f"{pe_name(*c)}/cpu", {}) for c in coords]
    steps = max(c.get("reduction_steps", 0) for c in cpus)
    merges = sorted({c.get("merges", 0) for c in cpus})
    latency = reps["io/host"]["kernel_latency_ps"]
    partial = max(c.get("partial_done_ps", 0) for c in cpus) - reps["io/host"]["launch_ps"]
    out = {"latency_ps": latency, "reduction_steps": steps, "merges_per_rank": merges,
           "tcm_peak_B": max(v["tcm_peak_B"] for v in reps["io/host"]["pes"].values())}
    sips = sorted({c[0] for c in coords})
    row = {"kernel": f"{kind}" + (f"/{p['gemm']}" if kind == "decode" else ""), "mode": system.mode, "ranks": n,
           "sips": len(sips), "cubes": p["cubes"], "rows": M, "d": d, "S/rank": S, "tile": p["tile"] or S,
           "partial_ps": partial, "latency_ps": latency, "latency": format_time(latency), "steps": steps}
    if system.mode == "data":
        data = info["data"]
        k_all = data["k"].reshape(n * S, d)
        v_all = data["v"].reshape(n * S, d)
        worst_abs = worst_rel = 0.0
        for r in range(n):
            q = data["q"] if kind == "decode" else data["q"][r]
            ref = reference_attention(q, k_all, v_all)
            got = output_of(system, r).astype(np.float64)
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


from actors.ahbm.tl import gqa_workload  # noqa: E402  (kernel workloads defined by hooks)

WORKLOADS = {
    "attention_decode": Workload(
        "attention_decode", "baseline decode attention: partial per rank, all-to-all (m, l, O) fan-out, LSE merge",
        DECODE_PARAMS, build_decode, _check),
    "attention_prefill": Workload(
        "attention_prefill", "baseline prefill attention: bidirectional open-mesh K/V propagation, online softmax",
        PREFILL_PARAMS, build_prefill, _check),
}
WORKLOADS[gqa_workload.WORKLOAD.name] = gqa_workload.WORKLOAD
