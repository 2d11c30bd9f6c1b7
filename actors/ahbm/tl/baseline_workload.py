"""The baseline attention kernels of the design record (ADR-0060 §A) as ``tl`` workloads.

* ``attention_decode``  - split-KV partial attention per rank, all-to-all (m, l, O) fan-out
  with log-sum-exp merge (kernels/attention_decode.py);
* ``attention_prefill`` - open-mesh bidirectional K/V propagation with online-softmax
  folding (kernels/attention_prefill.py).

(The GQA kernel's hooks are in gqa_workload.py, the side-by-side run in gqa_vs_baseline.py;
workloads.py collects them all.)

Each is a set of kernel hooks (kernel_workload.py: layout and arguments, inputs,
placement, outputs, numpy reference, metrics); the generic build returns a
KernelContext that the runner hands to ``check``.

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
from actors.ahbm.params import Params
from actors.ahbm.pipeline import FIDELITY
from actors.ahbm.tl.kernel_registry import register_kernel
from actors.ahbm.tl.kernel_workload import KernelContext, KernelHooks, KernelLayout, Output, kernel_workload
from actors.registry import HOST_DATA_BYTES, format_bytes
from emulator import numerics
from emulator.errors import BuildError
from emulator.schema import Enum, Int, Map
from emulator.units import format_time

__all__ = ["DECODE", "PREFILL", "line_order", "cube_line", "reference_attention", "output_of", "DECODE_HOOKS",
           "PREFILL_HOOKS", "line_peer"]

DECODE = register_kernel(attention_decode, "attention_decode")
PREFILL = register_kernel(attention_prefill, "attention_prefill")

COMMON = {
    "ranks": Int(min=1, default=8, doc="PEs on the open line (<= cubes x pes_per_cube)"),
    "cubes": Int(min=1, default=1, doc="CUBEs used, along a snake through the machine's CUBE mesh (row 0 of"
                                       " every SIP first); the line crosses CUBEs over the CUBE NOC and SIPs"
                                       " over UCIe"),
    "d": Int(min=1, default=64, doc="head dimension (kernbench2 ADR-0060 validation scale: 64)"),
    "s_per_rank": Int(min=1, default=16, doc="keys per rank (kernbench2 ADR-0060 validation scale: 16)"),
    "tile": Int(min=0, default=0, doc="keys per tile, 0 = the whole slice in one shot; must divide s_per_rank"),
    "fidelity": FIDELITY,
}
DECODE_PARAMS = Map({
    **COMMON,
    "rows": Int(min=1, default=1, doc="query rows M = G x T_q (kernbench2 ADR-0060 validation: h_q = 1, T_q = 1)"),
    "gemm": Enum(["dot", "composite"], default="dot",
                 doc="dot: blocking tl.dot (the baseline); composite: non-blocking tl.composite (kernbench2 ADR-0060 hybrid)"),
})
PREFILL_PARAMS = Map({
    **COMMON,
    "rows": Int(min=1, default=16, doc="query rows per rank (kernbench2 ADR-0060 validation: S_q = 16)"),
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


def line_peer(a: tuple, b: tuple, prm: Params):
    """How rank at ``a`` reaches rank at ``b``: an IPCQ direction, or ``[sip, cube, pe]`` over the NOC / UCIe."""
    if a[:2] == b[:2]:
        (ax, ay), (bx, by) = (a[2] % prm.gx, a[2] // prm.gx), (b[2] % prm.gx, b[2] // prm.gx)
        d = {(1, 0): "E", (-1, 0): "W", (0, 1): "S", (0, -1): "N"}.get((bx - ax, by - ay))
        if d is not None:
            return d
    return list(b)


def _align(n: int, a: int = 4096) -> int:
    return -(-n // a) * a


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Float64 softmax(q kᵀ / sqrt(d)) v over all keys (non-causal)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = numerics.matmul(q, k.T, acc=np.float64) / math.sqrt(q.shape[-1])
    p = numerics.exp(s - s.max(-1, keepdims=True))
    return numerics.matmul(p / p.sum(-1, keepdims=True), v, acc=np.float64)


def _line_layout(kernel_args):
    """The open-line layout shared by both baselines; ``kernel_args(p)`` adds the kernel's own arguments."""
    def layout(prm: Params, p: dict) -> KernelLayout:
        n, d, S, tile, M, nc = p["ranks"], p["d"], p["s_per_rank"], p["tile"], p["rows"], p["cubes"]
        total = prm.sips * prm.cubes
        if nc > total:
            raise BuildError(f"workload.params.cubes: {nc} CUBEs, but the machine has {prm.sips} SIP(s) x"
                             f" {prm.cubes} CUBEs = {total}")
        if n > nc * prm.P:
            raise BuildError(f"workload.params.ranks: at most cubes x pes_per_cube = {nc} x {prm.P} ="
                             f" {nc * prm.P} ranks, found {n} (raise workload.params.cubes, or pes_per_cube and"
                             " pe_grid)")
        if tile and S % tile:
            raise BuildError(f"workload.params.tile: must divide s_per_rank = {S}, found {tile}")
        order = line_order(prm, n, nc)
        addr = {"q": 0}
        addr["k"] = _align(M * d * 2)
        addr["v"] = addr["k"] + _align(S * d * 2)
        addr["o"] = addr["v"] + _align(S * d * 2)
        rank_of = {c: r for r, c in enumerate(order)}

        def args_of(coord):
            r = rank_of[coord]
            return {**dict(q_ptr=addr["q"], k_ptr=addr["k"], v_ptr=addr["v"], o_ptr=addr["o"], M=M, d=d, S=S,
                           tile=tile, scale=1.0 / math.sqrt(d), rank=r, n=n,
                           fwd=line_peer(order[r], order[r + 1], prm) if r + 1 < n else None,
                           bwd=line_peer(order[r], order[r - 1], prm) if r > 0 else None), **kernel_args(p)}

        return KernelLayout(order, args_of, lambda c: (c[2], c[1], c[0]), (prm.P, prm.cubes, prm.sips),
                            {"addr": addr, "T": tile if 0 < tile < S else S})
    return layout


def _draw(rng, q_shape, p: dict) -> dict:
    f2 = np.float16
    n, S, d = p["ranks"], p["s_per_rank"], p["d"]
    q = rng.standard_normal(q_shape).astype(np.float32).astype(f2)
    k = rng.standard_normal((n, S, d)).astype(np.float32).astype(f2)
    v = rng.standard_normal((n, S, d)).astype(np.float32).astype(f2)
    return {"q": q, "k": k, "v": v}


def _place_line(q_of, k_of):
    """Write every rank's ``q_of(data, r)``, ``k_of(k, p, T)`` and its V slice at the layout's addresses."""
    def place(placement, lay: KernelLayout, data: dict, p: dict) -> None:
        addr, T = lay.info["addr"], lay.info["T"]
        for r, coord in enumerate(lay.coords):
            for name, x in (("q", q_of(data, r)), ("k", k_of(data["k"][r], p, T)), ("v", data["v"][r])):
                placement.write(coord, addr[name], np.ascontiguousarray(x).tobytes())
    return place


def _k_decode(k, p, T):
    if p["gemm"] == "composite":  # K pre-transposed, tile-major [S/T, d, T] (seed §B item 2)
        S, d = k.shape
        return np.ascontiguousarray(k.reshape(S // T, T, d).transpose(0, 2, 1))
    return k


def _outputs(ctx) -> list:
    M, d = ctx.params["rows"], ctx.params["d"]
    return [Output(c, ctx.layout.info["addr"]["o"], (M, d), f"r{r}") for r, c in enumerate(ctx.layout.coords)]


def _reference(q_of):
    def reference(ctx) -> dict:
        data, p = ctx.data, ctx.params
        n, S, d = p["ranks"], p["s_per_rank"], p["d"]
        k_all, v_all = data["k"].reshape(n * S, d), data["v"].reshape(n * S, d)
        return {f"r{r}": reference_attention(q_of(data, r), k_all, v_all) for r in range(n)}
    return reference


def _metrics(label):
    def metrics(ctx, system, res) -> dict:
        p, coords = ctx.params, ctx.layout.coords
        cpus = list(ctx.cpu_reports(system).values())
        steps = max(c.get("reduction_steps", 0) for c in cpus)
        merges = sorted({c.get("merges", 0) for c in cpus})
        host = system.reports["io/host"]
        latency = res["latency_ps"]
        partial = max(c.get("partial_done_ps", 0) for c in cpus) - host["launch_ps"]
        row = {"kernel": label(p), "mode": system.mode, "ranks": p["ranks"], "sips": len({c[0] for c in coords}),
               "cubes": p["cubes"], "rows": p["rows"], "d": p["d"], "S/rank": p["s_per_rank"],
               "tile": p["tile"] or p["s_per_rank"], "partial_ps": partial, "latency_ps": latency,
               "latency": format_time(latency), "steps": steps}
        if "max_abs_err" in res:
            row["max_abs_err"] = res["max_abs_err"]
        return {"reduction_steps": steps, "merges_per_rank": merges,
                "tables": {f"attention {label(p).split('/')[0]} latency": [row]}}
    return metrics


def output_of(ctx: KernelContext, r: int) -> np.ndarray:
    """Rank ``r``'s stored output ``O [M, d]`` (fp32) read back from its HBM after a data-mode run."""
    return ctx.read(_outputs(ctx)[r])


def _limits(profile: dict, p: dict, mode: str) -> list:
    """Sizes refused before the build: a rank's q, K, V, O must fit its HBM; data-mode inputs the host."""
    n, d, S, M = p["ranks"], p["d"], p["s_per_rank"], p["rows"]
    cap = profile["hbm"]["capacity"]
    per_rank = _align(M * d * 2) + 2 * _align(S * d * 2) + M * d * 4
    out = []
    if per_rank > cap:
        key = "rows" if M * d * 2 >= S * d * 2 else "s_per_rank"
        out.append((key, f"a per-rank footprint (q {M}x{d} bf16, K and V {S}x{d} bf16, O {M}x{d} fp32) that fits "
                         f"one PE's HBM (hbm.capacity = {format_bytes(cap)})", f"{format_bytes(per_rank)} needed"))
    host = n * per_rank
    if mode == "data" and host > HOST_DATA_BYTES:
        out.append(("ranks", f"data-mode inputs of at most {format_bytes(HOST_DATA_BYTES)} in host memory",
                    f"{format_bytes(host)} needed ({n} ranks x {format_bytes(per_rank)})"))
    return out


DECODE_HOOKS = KernelHooks(
    "attention_decode", "baseline decode attention: partial per rank, all-to-all (m, l, O) fan-out, LSE merge",
    DECODE_PARAMS, DECODE, _line_layout(lambda p: {"gemm": p["gemm"]}),
    lambda rng, lay, p: _draw(rng, (p["rows"], p["d"]), p),
    _place_line(lambda data, r: data["q"], _k_decode), _outputs, _reference(lambda data, r: data["q"]),
    _metrics(lambda p: f"decode/{p['gemm']}"), limits=_limits)
PREFILL_HOOKS = KernelHooks(
    "attention_prefill", "baseline prefill attention: bidirectional open-mesh K/V propagation, online softmax",
    PREFILL_PARAMS, PREFILL, _line_layout(lambda p: {}),
    lambda rng, lay, p: _draw(rng, (p["ranks"], p["rows"], p["d"]), p),
    _place_line(lambda data, r: data["q"][r], lambda k, p, T: k), _outputs, _reference(lambda data, r: data["q"][r]),
    _metrics(lambda p: "prefill"), limits=_limits)
