"""Workload ``gqa_attention``: the seed's GQA fused attention kernel (kernels/gqa_attention.py) as kernel hooks.

Launch: ``heads`` KV heads, each on its CUBE Group of ``C`` CUBEs x ``P`` PEs
(gqa_index.GroupLayout: Groups are contiguous rectangles of each SIP's CUBE mesh,
head ``h`` on Group ``h``, SIP-major); ``P`` is 1 (PE 0 of each CUBE) or the
machine's PEs per CUBE.  Every launched PE gets the same arguments; the kernel
derives its rank from ``tl.program_id``.  ``request_id`` gives the rotation
``start_cube = request_id mod C``, ``start_pe = (request_id div C) mod P``.

HBM layout per PE (fixed regions, so the DMA engines' ``loads_by_region``
report counts K/V reads by address): Q at 0, O at 64 MiB, K at 1 GiB (pre-transposed
per KV tile, ``[d, keys]``), V at 1.5 GiB; the ``tl`` runtime's HBM scratch is the
upper half (runtime.py).  Inputs (data mode): per head ``q [G, T, d]``, ``K, V
[context, d]`` drawn normal(0, 1) from the scenario seed and rounded to float16
(bf16 proxy, ref §3.3) -- asymmetric, so a missing transpose shows.  Placement:

* decode: token ``i`` on rank ``i mod R`` at slot ``i div R`` (seed §2.1 / P5,
  the kept formula of gqa_index);
* prefill, ``C = P = 1``: the whole context on one PE; ``q`` holds the chunk's
  last ``chunk`` positions in query blocks of ``T_q`` (block-major ``[nb, G*T_q, d]``);
* prefill, ``C*P > 1`` (Ring): ring-order sharding, rank ``r`` (ring position)
  holds positions ``[r*B, (r+1)*B)`` of Q, K and V (a fresh prompt: ``chunk = context``),
  or with ``ring_order: zigzag`` the chunks ``r`` and ``2R-1-r`` of ``B/2``; K and V per chunk
  (K transposed), Q and O sub-block-major ``[B/q_tile, G*q_tile, d]``, chunk after chunk.

Reference: float64 causal softmax attention (decode: the query at position
``context - 1`` attends every cached key).  Metrics (flat, for sweeps):
``latency_ps``, ``bound_ps``, ``ratio_to_bound`` (kernels/gqa_bound.py),
``l2_rounds``, ``l1_rounds`` (depth of the reduction trees the decode used; 0 for a
prefill, which reduces nothing: Ring folds K/V blocks instead), ``merges_ipcq``,
``merges_noc``, ``roots`` (PEs that stored a result), ``kv_bytes_read`` and
``kv_loads`` (DMA loads from the K/V regions, all PEs), ``gemm_commands``
(composites + dots), ``ring_steps``, ``ring_steps_skipped``, ``tiles_computed`` (KV tiles
swept, all ranks: decode tiles, prefill tiles, Ring folds), ``tiles_skipped`` (causal skips), ``ring_q_tile`` / ``ring_spill`` / ``ring_piece`` (the Ring's query sub-block width, whether its
running O lives in HBM, the keys of the K/V units its blocks travel in).
"""
from __future__ import annotations

import math

import numpy as np

from actors.ahbm.kernels.gqa_attention import (decode_tiles, gqa_attention, prefill_tiles, ring_chunks, ring_folds,
                                               ring_position, ring_query_tiling, ring_units)
from actors.ahbm.kernels.gqa_bound import attention_bound, critical_path_bound
from actors.ahbm.kernels.gqa_index import (GroupLayout, coords_of_rank, reduce_tree, ring_rounds, root_of, snake,
                                           tree_depth, valid_len)
from actors.ahbm.dma import REGION_BITS
from actors.ahbm.pipeline import FIDELITY
from actors.ahbm.params import pe_name
from actors.ahbm.tl.gqa_phases import decode_phases
from actors.ahbm.tl.kernel_registry import register_kernel
from actors.ahbm.tl.kernel_workload import KernelHooks, KernelLayout, Output, kernel_workload
from actors.ahbm.tl.scratch import scheduler_reserve
from actors.registry import HOST_DATA_BYTES, format_bytes
from emulator import numerics
from emulator.errors import BuildError
from emulator.schema import Enum, Int, Map
from emulator.units import format_time

__all__ = ["GQA", "reference_gqa", "ADDR", "KERNEL", "MiB", "gqa_layout", "gqa_inputs", "gqa_place", "gqa_outputs",
           "gqa_reference"]

KERNEL = register_kernel(gqa_attention, "gqa_attention")
MiB = 1 << 20
ADDR = {"q": 0, "o": 64 * MiB, "k": 1024 * MiB, "v": 1536 * MiB}
F16 = np.float16

PARAMS = Map({
    "case": Enum(["decode", "prefill"], default="decode", doc="ADR-0060 §5: decode (T_q = 1) or prefill"),
    "C": Int(min=1, default=8, doc="CUBEs per CUBE Group: 1, 2, 4, 8 (ADR-0060 §0 knob); default 8, the fastest"
                                   " of 1/2/4/8 for Llama3-70B decode at 8K context on ahbm-1sip (measured"
                                   " 24.9 / 13.4 / 7.7 / 5.1 us; needs a 4x2 CUBE rectangle per head)"),
    "P": Int(min=1, default=8, doc="PEs per CUBE used: 1 or the machine's pes_per_cube"),
    "heads": Int(min=1, default=1, doc="KV heads run, one CUBE Group each (<= SIPs x Groups per SIP)"),
    "G": Int(min=1, default=4, doc="query heads per KV head, folded into M (Llama3-70B: 8)"),
    "d": Int(min=1, default=64, doc="head dimension (Llama3-70B: 128)"),
    "context": Int(min=1, default=256, doc="tokens in the KV cache (global_token_counter)"),
    "chunk": Int(min=1, default=64, doc="prefill: query tokens, the context's last `chunk` positions"),
    "T_q": Int(min=1, default=16, doc="prefill no-SP: query block width"),
    "q_tile": Int(min=0, default=0, doc="Ring prefill: query tokens per sub-block inside a ring step (must divide"
                                        " context / (C x P)); 0 = the largest that keeps every sub-block's running"
                                        " state in the TCM, else HBM spill (kernels/gqa_attention.ring_query_tiling)"),
    "ring_order": Enum(["contiguous", "zigzag"], default="contiguous",
                       doc="Ring prefill sharding: contiguous blocks (causal step skip: rank r runs r+1 steps) or"
                           " zigzag (rank r owns chunks r and 2R-1-r of 2R: balanced causal work, R steps each)"),
    "kv_piece": Int(min=0, default=0, doc="Ring prefill: keys of the K/V units a block travels round the ring in"
                                          " (one piece of each chunk; must divide the block, its chunks evenly);"
                                          " 0 = the whole block if it fits the TCM, else the pieces that give the"
                                          " fewest folds (kernels/gqa_attention.ring_query_tiling)"),
    "ring_state": Enum(["auto", "tcm", "hbm"], default="auto",
                       doc="Ring prefill: where the sub-blocks' running state lives between ring steps: tcm (m, l, O"
                           " in the TCM), hbm (O in HBM, m, l in the TCM), auto (tcm if it fits)"),
    "tile": Int(min=0, default=64, doc="keys per KV tile, 0 = one shot"),
    "gemm": Enum(["composite", "dot"], default="composite",
                 doc="composite: non-blocking tl.composite GEMMs (seed hybrid); dot: blocking tl.dot"),
    "l2": Enum(["tree", "chain", "ring"], default="tree",
               doc="Level-2 (PEs of a CUBE, IPCQ) reduction topology: tree = centre root; chain = the snake"
                   " towards its middle (whole O per hop); ring = chunked-O ring (reduce-scatter + gather)"),
    "l1": Enum(["mesh", "chain", "ring"], default="mesh",
               doc="Level-1 (CUBE roots, CUBE NOC) reduction topology: mesh = centre root; chain; ring ="
                   " chunked-O ring"),
    "request_id": Int(min=0, default=0, doc="rotation: start_cube = id mod C, start_pe = (id div C) mod P"),
    "fidelity": FIDELITY,
})


def _rot(p):
    C, P = p["C"], p["P"]
    return p["request_id"] % C, (p["request_id"] // C) % P


def _ring(p) -> bool:
    return p["case"] == "prefill" and p["C"] * p["P"] > 1


def gqa_layout(prm, p) -> KernelLayout:
    C, P, case = p["C"], p["P"], p["case"]
    try:
        lay = GroupLayout(prm.cx, prm.cy, C)
        lay.shape
    except ValueError as e:
        raise BuildError(f"workload.params.C: {e}") from None
    if P not in (1, prm.P):
        raise BuildError(f"workload.params.P: 1 or the machine's pes_per_cube ({prm.P}), found {P}")
    avail = prm.sips * lay.groups_per_sip
    if p["heads"] > avail:
        raise BuildError(f"workload.params.heads: at most SIPs x Groups per SIP = {prm.sips} x {lay.groups_per_sip}"
                         f" = {avail} with C = {C}, found {p['heads']}")
    R = C * P
    if case == "decode" and p["context"] < R:
        raise BuildError(f"workload.params.context: at least one key per rank (C x P = {R}), found {p['context']}")
    if case == "prefill":
        if p["chunk"] > p["context"]:
            raise BuildError(f"workload.params.chunk: at most context = {p['context']}, found {p['chunk']}")
        n = R * (2 if p["ring_order"] == "zigzag" else 1)
        if R > 1 and (p["chunk"] != p["context"] or p["context"] % n):
            raise BuildError(f"workload.params.chunk: Ring prefill (C x P = {R}, {p['ring_order']}) runs a fresh"
                             f" prompt: chunk = context, a multiple of {n}; found chunk {p['chunk']},"
                             f" context {p['context']}")
        if R == 1 and p["chunk"] % p["T_q"]:
            raise BuildError(f"workload.params.T_q: must divide chunk = {p['chunk']}, found {p['T_q']}")
    coords = []
    for h in range(p["heads"]):
        sip, cubes = lay.cubes_of_head(h)
        coords += [(sip, c, pe) for c in cubes for pe in (range(prm.P) if P > 1 else [0])]
    sc, sp = _rot(p)
    args = dict(q_ptr=ADDR["q"], k_ptr=ADDR["k"], v_ptr=ADDR["v"], o_ptr=ADDR["o"], case=case, G=p["G"],
                T_q=1 if case == "decode" else p["T_q"], d=p["d"], tile=p["tile"], scale=1.0 / math.sqrt(p["d"]),
                counter=p["context"], chunk=p["chunk"], start_cube=sc, start_pe=sp, C=C, P=P, gemm=p["gemm"],
                l2=p["l2"], l1=p["l1"])
    q_tile, spill, piece = _ring_tiling(prm, p) if _ring(p) else (0, False, 0)
    if _ring(p):   # only the Ring's launch carries them (other launches, and their digests, unchanged)
        args.update(q_tile=q_tile, spill=spill)
        if piece != p["context"] // R:
            args["piece"] = piece
        if p["ring_order"] != "contiguous":
            args["order"] = p["ring_order"]
    w, h_ = lay.shape
    if case == "decode":
        _check_chunked_rings(prm, p, w, h_)
    info = {"q_tile": q_tile, "spill": spill, "piece": piece, "group": lay,
            "l2_depth": _rounds(p["l2"], prm.gx, prm.gy) if P > 1 else 0,
            "l1_depth": _rounds(p["l1"], w, h_) if C > 1 else 0,
            "l2_chunks": P if p["l2"] == "ring" else 1, "l1_chunks": C if p["l1"] == "ring" else 1}
    return KernelLayout(coords, lambda c: args, lambda c: (c[2], c[1], c[0]), (prm.P, prm.cubes, prm.sips), info)


def _rounds(topology: str, w: int, h: int) -> int:
    return ring_rounds(w * h) if topology == "ring" else tree_depth(reduce_tree(topology, w, h))


def _check_chunked_rings(prm, p, w: int, h: int) -> None:
    """The chunked-O ring needs a closed IPCQ ring (the PE snake's ends are neighbours) and one row of O
    (``G`` rows in decode) per chunk."""
    if p["l2"] == "ring" and p["P"] > 1:
        ends = snake(prm.gx, prm.gy)
        a, b = ends[0], ends[-1]
        if abs(a % prm.gx - b % prm.gx) + abs(a // prm.gx - b // prm.gx) != 1:
            raise BuildError(f"workload.params.l2: ring needs a PE grid whose snake closes into an IPCQ ring"
                             f" (2 rows), found {prm.gx} x {prm.gy}")
    for key, n in (("l2", p["P"]), ("l1", p["C"])):
        if p[key] == "ring" and n > p["G"]:
            raise BuildError(f"workload.params.{key}: ring cuts O's G = {p['G']} rows into {n} chunks; needs"
                             f" G >= {n}, found G = {p['G']}")


def _ring_tiling(prm, p) -> tuple[int, bool, int]:
    """Ring prefill: (query tokens per sub-block, O spilled to HBM, keys per K/V unit) for this machine's TCM
    budget."""
    B = p["context"] // (p["C"] * p["P"])
    unit = B // 2 if p["ring_order"] == "zigzag" else B
    if p["q_tile"] and unit % p["q_tile"]:
        raise BuildError(f"workload.params.q_tile: must divide the Ring chunk ({p['ring_order']}) of {unit} tokens,"
                         f" found {p['q_tile']}")
    chunks = B // unit
    if p["kv_piece"] and (p["kv_piece"] % chunks or unit % (p["kv_piece"] // chunks)):
        raise BuildError(f"workload.params.kv_piece: must divide the Ring block of {B} tokens into equal pieces of"
                         f" its {chunks} chunk(s) of {unit} ({p['ring_order']}), found {p['kv_piece']}")
    try:
        return ring_query_tiling(B, p["G"], p["d"], prm.tcm_bytes - scheduler_reserve(prm), prm.array_rows,
                                 p["q_tile"], p["ring_state"], unit, p["gemm"] == "composite", p["kv_piece"])
    except ValueError as e:
        raise BuildError(f"workload.params.context: {e}") from None


def _limits(profile: dict, p: dict, mode: str) -> list:
    """Sizes refused before the build (``emu validate``): each rank's q, O, K, V must fit its
    region of the PE's HBM (:data:`ADDR`), and data-mode inputs the host's memory."""
    G, d, S, R = p["G"], p["d"], p["context"], p["C"] * p["P"]
    if p["case"] == "decode":
        rows, keys = G, -(-S // R)
    elif R == 1:
        rows, keys = G * p["chunk"], S
    else:   # Ring: the rank's own K and V, and worst case two staging areas of a block in pieces
        rows, keys = G * (S // R), 3 * (S // R)
    cap = profile["hbm"]["capacity"]
    spill = rows * d * 4 if p["case"] == "prefill" and R > 1 else 0   # worst case: the Ring's running O in HBM
    need = {"q": rows * d * 2, "o": rows * d * 4 + spill, "k": keys * d * 2, "v": keys * d * 2}
    room = {"q": ADDR["o"] - ADDR["q"], "o": ADDR["k"] - ADDR["o"], "k": ADDR["v"] - ADDR["k"],
            "v": cap - ADDR["v"]}
    out = []
    for name in ("q", "o", "k", "v"):
        if need[name] > room[name]:
            key = "context" if name in "kv" else "G" if p["case"] == "decode" else "chunk"
            out.append((key, f"a per-rank {name} of at most {format_bytes(max(room[name], 0))} (its HBM region; "
                             f"hbm.capacity = {format_bytes(cap)})", f"{format_bytes(need[name])} needed"))
    T = 1 if p["case"] == "decode" else p["chunk"]
    host = p["heads"] * (G * T * d + 2 * S * d) * 2
    if mode == "data" and host > HOST_DATA_BYTES:
        out.append(("context", f"data-mode inputs of at most {format_bytes(HOST_DATA_BYTES)} in host memory",
                    f"{format_bytes(host)} needed"))
    return out


def gqa_inputs(rng, lay: KernelLayout, p) -> dict:
    G, d, S = p["G"], p["d"], p["context"]
    T = 1 if p["case"] == "decode" else p["chunk"]
    out = {}
    for h in range(p["heads"]):
        q = rng.standard_normal((G, T, d)).astype(np.float32).astype(F16)
        k = rng.standard_normal((S, d)).astype(np.float32).astype(F16)
        v = rng.standard_normal((S, d)).astype(np.float32).astype(F16)
        out[h] = {"q": q, "k": k, "v": v}
    return out


def _rank_coord(lay: KernelLayout, p, prm, h: int, rank: int) -> tuple:
    """(sip, cube, pe) of decode rank ``rank`` of head ``h`` (seed §2.1 inverse)."""
    sip, cubes = lay.info["group"].cubes_of_head(h)
    sc, sp = _rot(p)
    gc, pe = coords_of_rank(rank, sc, sp, p["C"], p["P"])
    return sip, cubes[gc], pe if p["P"] > 1 else 0


def _write_kt_tiles(write, coord, k, starts):
    """K pre-transposed per tile (seed §B.2): tile (s0, n) is ``k[s0:s0+n].T`` at ``K + s0*d*2``."""
    d = k.shape[1]
    for s0, n in starts:
        write(coord, ADDR["k"] + s0 * d * 2, np.ascontiguousarray(k[s0:s0 + n].T).tobytes())


def gqa_place(place, lay: KernelLayout, data, p) -> None:
    prm = place.m.prm
    G, d, S, R = p["G"], p["d"], p["context"], p["C"] * p["P"]
    for h, x in data.items():
        q, k, v = x["q"], x["k"], x["v"]
        if p["case"] == "decode":
            for rank in range(R):
                c = _rank_coord(lay, p, prm, h, rank)
                kl, vl = k[rank::R], v[rank::R]
                _write_kt_tiles(place.write, c, kl, decode_tiles(len(kl), p["tile"]))
                place.write(c, ADDR["v"], np.ascontiguousarray(vl).tobytes())
                place.write(c, ADDR["q"], np.ascontiguousarray(q[:, 0, :]).tobytes())
        elif R == 1:
            sip, cubes = lay.info["group"].cubes_of_head(h)
            c = (sip, cubes[0], 0)
            T_q, nb = p["T_q"], p["chunk"] // p["T_q"]
            _write_kt_tiles(place.write, c, k, decode_tiles(S, p["tile"]))   # the kernel's prefill_tiles grid
            place.write(c, ADDR["v"], np.ascontiguousarray(v).tobytes())
            blocks = q.reshape(G, nb, T_q, d).transpose(1, 0, 2, 3).reshape(nb, G * T_q, d)
            place.write(c, ADDR["q"], np.ascontiguousarray(blocks).tobytes())
        else:
            B = S // R
            for c in _group_coords(lay, h):
                r = _ring_rank(lay, prm, p, c)
                chunks = ring_chunks(r, R, B, p["ring_order"])
                pieces = [kn for unit in ring_units(r, R, B, p["ring_order"], lay.info["piece"]) for kn in unit]
                for i, (k0, n) in enumerate(pieces):   # K (transposed) and V per piece, unit after unit
                    place.write(c, ADDR["k"] + i * n * d * 2, np.ascontiguousarray(k[k0:k0 + n].T).tobytes())
                    place.write(c, ADDR["v"] + i * n * d * 2, np.ascontiguousarray(v[k0:k0 + n]).tobytes())
                rows = np.concatenate([_sub_blocks(q[:, k0:k0 + n, :], lay.info["q_tile"]) for k0, n in chunks])
                place.write(c, ADDR["q"], np.ascontiguousarray(rows).tobytes())


def _sub_blocks(x, t: int):
    """``[G, B, ...]`` rows -> sub-block-major ``[B/t, G*t, ...]`` (the Ring kernel's Q and O layout)."""
    G, B = x.shape[:2]
    return x.reshape(G, B // t, t, *x.shape[2:]).swapaxes(0, 1).reshape(B // t, G * t, *x.shape[2:])


def _group_coords(lay: KernelLayout, h: int) -> list:
    sip, cubes = lay.info["group"].cubes_of_head(h)
    return [c for c in lay.coords if c[0] == sip and c[1] in cubes]


def _ring_rank(lay: KernelLayout, prm, p, c) -> int:
    g = lay.info["group"]
    w, h = g.shape
    return ring_position(c[2], g.index_in_group(c[1]), prm.gx, prm.gy, w, h, p["P"])


def reference_gqa(q, k, v, q_pos) -> np.ndarray:
    """Float64 causal attention: rows of ``q [n, d]`` at positions ``q_pos`` over keys ``0..len(k)-1``."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = numerics.matmul(q, k.T, acc=np.float64) / math.sqrt(q.shape[-1])
    s = np.where(np.arange(len(k))[None, :] <= np.asarray(q_pos)[:, None], s, -np.inf)
    e = numerics.exp(s - s.max(-1, keepdims=True))
    return numerics.matmul(e / e.sum(-1, keepdims=True), v, acc=np.float64)


def _root_coord(ctx, h: int) -> tuple:
    """The Group root: the Level-1 root CUBE's Level-2 root PE."""
    p, prm, g = ctx.params, ctx.prm, ctx.layout.info["group"]
    sip, cubes = g.cubes_of_head(h)
    w, hh = g.shape
    cube = cubes[root_of(reduce_tree(p["l1"], w, hh))] if p["C"] > 1 else cubes[0]
    pe = root_of(reduce_tree(p["l2"], prm.gx, prm.gy)) if p["P"] > 1 else 0
    return sip, cube, pe


def gqa_outputs(ctx) -> list:
    p, prm = ctx.params, ctx.prm
    G, d, R = p["G"], p["d"], p["C"] * p["P"]
    outs = []
    for h in range(p["heads"]):
        if p["case"] == "decode":
            outs.append(Output(_root_coord(ctx, h), ADDR["o"], (G, d), f"h{h}"))
        elif R == 1:
            sip, cubes = ctx.layout.info["group"].cubes_of_head(h)
            nb = p["chunk"] // p["T_q"]
            outs.append(Output((sip, cubes[0], 0), ADDR["o"], (nb, G * p["T_q"], d), f"h{h}"))
        else:
            B, t = p["context"] // R, ctx.layout.info["q_tile"]
            for c in _group_coords(ctx.layout, h):
                outs.append(Output(c, ADDR["o"], (B // t, G * t, d), f"h{h}/r{_ring_rank(ctx.layout, prm, p, c)}"))
    return outs


def gqa_reference(ctx) -> dict:
    p = ctx.params
    G, d, S, R = p["G"], p["d"], p["context"], p["C"] * p["P"]
    out = {}
    for h, x in ctx.data.items():
        q, k, v = x["q"], x["k"], x["v"]
        if p["case"] == "decode":
            out[f"h{h}"] = reference_gqa(q[:, 0, :], k, v, [S - 1] * G)
        elif R == 1:
            T_q, nb, q0 = p["T_q"], p["chunk"] // p["T_q"], S - p["chunk"]
            blocks = []
            for b in range(nb):
                rows = q[:, b * T_q:(b + 1) * T_q, :].reshape(G * T_q, d)
                pos = [q0 + b * T_q + t for _ in range(G) for t in range(T_q)]
                blocks.append(reference_gqa(rows, k, v, pos))
            out[f"h{h}"] = np.stack(blocks)
        else:
            B, t = S // R, ctx.layout.info["q_tile"]
            for r in range(R):
                chunks = ring_chunks(r, R, B, p["ring_order"])
                rows = np.concatenate([_sub_blocks(q[:, k0:k0 + n, :], t) for k0, n in chunks]).reshape(-1, d)
                pos = np.concatenate([_sub_blocks(np.broadcast_to(np.arange(k0, k0 + n), (G, n)), t)
                                      for k0, n in chunks]).reshape(-1)
                out[f"h{h}/r{r}"] = reference_gqa(rows, k, v, pos).reshape(B // t, G * t, d)
    return out


def kv_loads(system, coords) -> tuple[int, int]:
    """(loads, bytes) the DMA engines of ``coords`` read from the K and V regions (dma.py loads_by_region)."""
    regions = {ADDR["k"] >> REGION_BITS, ADDR["v"] >> REGION_BITS}
    n = b = 0
    for c in coords:
        for key, (cnt, nbytes) in system.reports.get(f"{pe_name(*c)}/dma", {}).get("loads_by_region", {}).items():
            if int(key.rsplit("@", 1)[1]) in regions:
                n += cnt
                b += nbytes
    return n, b


def _bound(ctx) -> dict:
    p, prm = ctx.params, ctx.prm
    G, d, S, R, gemm = p["G"], p["d"], p["context"], p["C"] * p["P"], p["gemm"]   # gemm: how the GEMMs are sent
    if p["case"] == "decode":
        keys = S // R   # the shortest slice: a lower bound for the deepest leaf
        tiles = [n for _, n in decode_tiles(keys, p["tile"])]
        info = ctx.layout.info
        if info["l2_chunks"] == info["l1_chunks"] == 1:   # tree / chain / mesh: one lse merge per level
            return critical_path_bound(prm, M=G, d=d, tiles=tiles, kv_keys=keys, l2_depth=info["l2_depth"],
                                       l1_depth=info["l1_depth"], gemm=gemm)
        return attention_bound(prm, M=G, d=d, tiles=tiles, kv_keys=keys, l2_depth=info["l2_depth"],
                               l1_depth=info["l1_depth"], l2_chunks=info["l2_chunks"], l1_chunks=info["l1_chunks"],
                               gemm=gemm)
    if R == 1:
        T_q = p["T_q"]
        tiles, keys = [], 0
        for b in range(p["chunk"] // T_q):
            qs = S - p["chunk"] + b * T_q
            ts, _ = prefill_tiles(S, p["tile"], qs, qs + T_q)
            tiles += [n for _, n, _ in ts]
            keys += sum(n for _, n, _ in ts)
        return attention_bound(prm, M=G * T_q, d=d, tiles=tiles, kv_keys=keys, l2_depth=0, l1_depth=0, gemm=gemm)
    B, t, pc = S // R, ctx.layout.info["q_tile"], ctx.layout.info["piece"]   # ring: the busiest rank's folds
    folds = max((ring_folds(r, R, B, p["ring_order"], t, pc) for r in range(R)), key=sum)
    return attention_bound(prm, M=G * t, d=d, tiles=folds, kv_keys=B, l2_depth=0, l1_depth=0, gemm=gemm)


def work_macs(ctx) -> int:
    """MACs the whole launch runs on the GEMM engines: ``2 M d n`` per fold of ``n`` keys (``Q Kᵀ`` and
    ``P V``), over every rank's folds (the kernel's tile / skip rules: decode_tiles, prefill_tiles,
    ring_folds), times the heads.  Equals the engines' final ``macs`` (tests/test_progress.py)."""
    p = ctx.params
    G, d, S, R = p["G"], p["d"], p["context"], p["C"] * p["P"]
    if p["case"] == "decode":
        per_head = 2 * G * d * S          # every key once, in some rank's slice
    elif R == 1:
        T_q = p["T_q"]
        keys = 0
        for b in range(p["chunk"] // T_q):
            qs = S - p["chunk"] + b * T_q
            keys += sum(n for _, n, _ in prefill_tiles(S, p["tile"], qs, qs + T_q)[0])
        per_head = 2 * G * T_q * d * keys
    else:
        B, t, pc = S // R, ctx.layout.info["q_tile"], ctx.layout.info["piece"]
        per_head = 2 * G * t * d * sum(sum(ring_folds(r, R, B, p["ring_order"], t, pc)) for r in range(R))
    return p["heads"] * per_head


def _partial_metrics(ctx, system, res) -> dict:
    """What an unfinished run still tells: the bound, the ratio the run has at least, a table row."""
    p = ctx.params
    b = _bound(ctx)
    least = res.get("latency_at_least_ps")
    out = {"bound_ps": b["bound_ps"], "ratio_to_bound": None,
           "ratio_to_bound_at_least": None if least is None else round(least / b["bound_ps"], 4),
           "bound_terms": {k: v for k, v in b.items() if k != "bound_ps"}}
    row = {"kernel": f"gqa/{p['case']}/{p['gemm']}", "mode": system.mode, "heads": p["heads"], "C": p["C"],
           "P": p["P"], "G": p["G"], "d": p["d"], "context": p["context"], "tile": p["tile"],
           "latency": "not reached" if least is None else f">= {format_time(least)} (unfinished)",
           "bound": format_time(b["bound_ps"]), "ratio": "" if least is None else f">= {out['ratio_to_bound_at_least']}",
           "done": f"{100 * res['progress']:.1f} % of MACs" if "progress" in res else ""}
    out["tables"] = {"gqa attention": [row]}
    return out


def _metrics(ctx, system, res) -> dict:
    p = ctx.params
    cpus = ctx.cpu_reports(system)
    pes = system.reports["io/host"]["pes"]
    ops = [pes.get(pe_name(*c), {}).get("ops", {}) for c in ctx.layout.coords]
    orders = [o for r in cpus.values() for o in r.get("merge_order", [])]
    n_kv, b_kv = kv_loads(system, ctx.layout.coords)
    b = _bound(ctx)
    lat = res["latency_ps"]
    reduces = p["case"] == "decode"      # only a decode reduces partials over the trees
    out = {"l2_rounds": ctx.layout.info["l2_depth"] if reduces else 0,
           "l1_rounds": ctx.layout.info["l1_depth"] if reduces else 0,
           "merges_ipcq": sum(1 for name, _ in orders if name.startswith("pe")),
           "merges_noc": sum(1 for name, _ in orders if name.startswith("cube")),
           "roots": sum(1 for r in cpus.values() if r.get("group_root")),
           "kv_loads": n_kv, "kv_bytes_read": b_kv,
           "gemm_commands": sum(o.get("composite", 0) + o.get("gemm", 0) for o in ops),
           "ring_steps": sum(r.get("ring_steps", 0) for r in cpus.values()),
           "ring_steps_skipped": sum(r.get("ring_steps_skipped", 0) for r in cpus.values()),
           "tiles_computed": sum(r.get("tiles_computed", 0) for r in cpus.values()),
           "tiles_skipped": sum(r.get("tiles_skipped", 0) for r in cpus.values()),
           "ring_folds_max": max((r.get("ring_folds", 0) for r in cpus.values()), default=0),
           "ring_q_tile": ctx.layout.info["q_tile"], "ring_spill": ctx.layout.info["spill"],
           "ring_piece": ctx.layout.info["piece"],
           "bound_ps": b["bound_ps"], "ratio_to_bound": round(lat / b["bound_ps"], 4),
           "bound_terms": {k: v for k, v in b.items() if k != "bound_ps"}}
    if "critical_bound_ps" in b:   # decode with one merge per level: the bound plus the dependent tail (gqa_bound)
        out["ratio_to_critical_bound"] = round(lat / b["critical_bound_ps"], 4)
    row = {"kernel": f"gqa/{p['case']}/{p['gemm']}", "mode": system.mode, "heads": p["heads"], "C": p["C"],
           "P": p["P"], "G": p["G"], "d": p["d"], "context": p["context"], "tile": p["tile"],
           "latency": format_time(lat), "bound": format_time(b["bound_ps"]), "ratio": out["ratio_to_bound"],
           "l2/l1": f"{out['l2_rounds']}/{out['l1_rounds']}", "kv_bytes": b_kv, "gemms": out["gemm_commands"]}
    if "ratio_to_critical_bound" in out:
        row["critical_ratio"] = out["ratio_to_critical_bound"]
    if "max_abs_err" in res:
        row["max_abs_err"] = res["max_abs_err"]
    out["tables"] = {"gqa attention": [row]}
    phases = decode_phases(system.reports.get("io/host", {}), {pe_name(*c): r for c, r in cpus.items()})
    if phases:   # where the latency sits along the critical chain (gqa_phases.py)
        out["phases"] = phases
        out["tables"]["gqa phases (critical chain: launch, sweep, reduction hops, store)"] = [
            {"phase": ph["phase"], "where": ph["where"], "time": format_time(ph["ps"]),
             "share": f"{100 * ph['ps'] / lat:.1f} %"} for ph in phases]
    return out


GQA = KernelHooks("gqa_attention", "seed ADR-0060 GQA fused attention: CUBE Groups, 2-level reduce-to-root, Ring",
                  PARAMS, KERNEL, gqa_layout, gqa_inputs, gqa_place, gqa_outputs, gqa_reference, _metrics, limits=_limits,
                  work=work_macs, partial_metrics=_partial_metrics)
WORKLOAD = kernel_workload(GQA)
