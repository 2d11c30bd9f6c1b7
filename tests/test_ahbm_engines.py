"""AHBM PE engines: profiles, DMA / GEMM / MATH / composite formulas, data mode vs numpy.

Closed forms are written out here (engines) and in the test kit (NOC paths, actors/ahbm/testkit.py)
from the profile numbers (ref §2.6 defaults), independently of actors/ahbm/costs.py.
"""
import json

import numpy as np
import pytest

from actors.ahbm.params import Params
from actors.ahbm.testkit import (ATT, CUBE, HBM, NS, build, ceil_div, load_profile, log, noc_time, read_sizes,
                                 remote_load_store, write_sizes)
from actors.ahbm.tiles import plan
from protocols.ahbm import IpcqData, NocPacket, payload
from protocols.codec import TensorDesc, encode

PE = (0, 0, 0)
LAUNCH = 100 * NS


def per_pc_bytes(addr, rows, row_bytes, pitch, burst=256, pcs=8):
    """Bytes each pseudo-channel serves: pc = (addr // burst) % pcs, byte by byte in 8-byte steps."""
    out = [0] * pcs
    for r in range(rows):
        start = addr + r * pitch
        for a in range(start, start + row_bytes):
            out[(a // burst) % pcs] += 1
    return out


def dma_closed(per_pc):
    # setup 20 cycles @ 1 GHz + max over used PCs (30 ns + bytes / (32 GB/s * 0.8))
    return 20 * NS + max(30 * NS + ceil_div(b * 10**12, 25_600_000_000) for b in per_pc if b)


def sequential_fp32(a, b, acc=None):
    """What each cell of the MAC array computes: ``acc``, then each product added in increasing k, in
    float32 (written out here as the spec, independently of emulator.numerics)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    for k in range(a.shape[1]):
        p = a[:, k:k + 1] * b[k:k + 1, :]
        acc = p if acc is None else (acc + p).astype(np.float32)
    return acc


def gemm_core(m, k, n, padded=True):
    """Cycles the 32x32 array is occupied (ns at 1 GHz)."""
    return (ceil_div(m, 32) * ceil_div(n, 32) * k if padded else ceil_div(m * n * k, 1024)) * NS


def gemm_closed(m, k, n, padded=True):
    """A lone GEMM command: 48 cycles fill/drain + core."""
    return 48 * NS + gemm_core(m, k, n, padded)


def test_profiles_validate():
    for name, sips in (("ahbm-1sip", 1), ("ahbm-2sip", 2), ("ahbm-4sip", 4)):
        prof = load_profile(name)
        prm = Params.of(prof)
        assert prm.sips == sips and prm.cubes == 16 and prm.P == 8 and prm.pes == 128 * sips
        assert prm.pc_bw_eff == 25_600_000_000 and prm.tile == (32, 64, 32) and prm.tcm_bytes == 1 << 20
        assert prm.cube_link_latency == 17 * NS and prm.router_ps == 3 * NS


def test_profile_error_is_clear():
    from emulator.schema import SchemaError
    with pytest.raises(SchemaError) as e:
        load_profile("ahbm-1sip", {"pe_grid": {"x": 3, "y": 2}})
    assert "pe_grid" in str(e.value) and "pes_per_cube" in str(e.value)


async def test_dma_own_hbm_matches_formula(vclock):
    sizes = [256, 4096, 65536, 100_000]
    script = []
    system, m, place = build({PE: script})
    rng = np.random.default_rng(0)
    for n in sizes:
        addr = place.put(PE, rng.integers(0, 255, n, dtype=np.uint8))
        script += [{"op": "dma", "kind": "load", "addr": addr, "row_bytes": n, "buf": "x", "shape": [n],
                    "dtype": "|u1", "label": f"l{n}"}, {"op": "free", "buf": "x"}]
    # a 2-D block whose rows all fall on pseudo-channel 0 (pitch = 8 PCs x 256 B): channel conflict
    addr = place.put(PE, np.zeros(32 * 2048, np.uint8))
    script.append({"op": "dma", "kind": "load", "addr": addr, "rows": 32, "row_bytes": 128, "pitch": 2048,
                   "buf": "y", "shape": [32, 128], "dtype": "|u1", "label": "conflict"})
    res = await system.run_async()
    assert res.status == "finished", res.error
    for n in sizes:
        _, _, issued, done = log(m, PE, f"l{n}")
        assert done - issued == dma_closed(per_pc_bytes(0, 1, n, n)), n
    _, _, issued, done = log(m, PE, "conflict")
    assert done - issued == 20 * NS + 30 * NS + ceil_div(32 * 128 * 10**12, 25_600_000_000) == 210 * NS
    # whole-run check: the first command starts after the launch link, and dispatch is 8 cycles
    assert log(m, PE, "l256")[1] == LAUNCH and log(m, PE, "l256")[2] == LAUNCH + 8 * NS


@pytest.mark.parametrize("mode", ["timing", "data"])
async def test_remote_dma_over_the_noc(vclock, mode):
    """Load from / store to another CUBE's PE HBM: setup + Z(req) + channels + Z(resp) (dma.py docstring).

    Every message runs between the requester's DMA attach link (128 GB/s, ref §1.2 sram_to_router_bw_gbs)
    and the owner's HBM port attach link (256 GB/s, ref §1.2 hbm_to_router_bw_gbs), both + 1 ns.
    """
    me, owner = (0, 0, 0), (0, 5, 3)                 # CUBE (0,0) -> CUBE (1,1): 2 hops
    n = 8192
    data = np.random.default_rng(3).integers(0, 255, n, dtype=np.uint8)
    system, m, place, addr, dst = remote_load_store(me, owner, data, mode=mode)
    res = await system.run_async()
    assert res.status == "finished", res.error

    def Z(S, h):   # NOC zero-load time, store-and-forward: DMA attach + (h+1) routers + h CUBE links + HBM attach
        return noc_time(S, [ATT] + [CUBE] * h + [HBM])

    chan = 30 * NS + ceil_div(n // 8 * 10**12, 25_600_000_000)
    req, resp = read_sizes(me, owner, addr, n)
    _, _, issued, done = log(m, me, "rload")
    assert done - issued == 20 * NS + Z(req, 2) + chan + Z(resp, 2)
    wreq, ack = write_sizes(me, owner, dst, n, tag=2)
    _, _, issued, done = log(m, me, "rstore")
    assert done - issued == 20 * NS + Z(wreq, 2) + chan + Z(ack, 2)
    assert m.pe(*owner).port.served == 2 and m.pe(*me).port.served == 0
    if mode == "data":
        assert place.read(owner, dst, n) == data.tobytes()


@pytest.mark.parametrize("padded", [True, False])
async def test_gemm_and_math_formulas(vclock, padded):
    prof = load_profile("ahbm-1sip", {"gemm": {"charge_padded": padded}})
    script = [
        {"op": "gemm", "a": "a", "b": "b", "acc": "c", "m": 32, "k": 64, "n": 32, "label": "full"},
        {"op": "gemm", "a": "a8", "b": "b", "acc": "c8", "m": 8, "k": 64, "n": 32, "label": "partial"},
        {"op": "math", "fn": "exp", "srcs": ["x"], "out": "y", "label": "exp"},
        {"op": "math", "fn": "rowsum", "srcs": ["x"], "out": "s", "label": "rowsum"},
        {"op": "math", "fn": "add", "srcs": ["x", "x"], "out": "z", "label": "add"},
    ]
    system, m, place = build({PE: script}, prof)
    for name, shape in (("a", (32, 64)), ("b", (64, 32)), ("a8", (8, 64)), ("x", (32, 128))):
        place.tcm_put(PE, name, np.ones(shape, np.float16))
    res = await system.run_async()
    assert res.status == "finished", res.error
    dur = {k: log(m, PE, k)[3] - log(m, PE, k)[2] for k in ("full", "partial", "exp", "rowsum", "add")}
    assert dur["full"] == gemm_closed(32, 64, 32) == 112 * NS   # ref §2.3: 64 + 48 cycles
    assert dur["partial"] == gemm_closed(8, 64, 32, padded)
    assert dur["partial"] == (112 * NS if padded else 64 * NS)
    assert dur["exp"] == (8 + 4096 // 64) * NS
    assert dur["rowsum"] == (8 + 4096 // 64 + 6) * NS
    assert dur["add"] == (8 + 4096 // 64) * NS


def test_tile_plan():
    steps = plan(96, 200, 40, (32, 64, 32))
    assert len(steps) == 3 * 2 * 4
    assert [s.tk for s in steps[:4]] == [64, 64, 64, 8]
    assert {(s.m0, s.n0, s.tn) for s in steps if s.last} == {(m0, n0, tn) for m0 in (0, 32, 64)
                                                               for n0, tn in ((0, 32), (32, 8))}
    assert sum(s.first for s in steps) == sum(s.last for s in steps) == 6


def composite_closed(M, K, N, a, b, c, epilogue_ops):
    """Double-buffered stream on one FIFO DMA queue (scheduler.py docstring), recomputed here: the first
    step's B block one DMA, the other B blocks in panels (scheduler.panel_plan) queued behind it, at most
    two not yet fully taken (a panel is queued when the last step of the panel two before takes its block)."""
    from actors.ahbm.scheduler import panel_budget, panel_plan
    dma_free = 0
    serial = 0

    def dma(t, cost):
        nonlocal dma_free, serial
        serial += cost
        dma_free = max(t, dma_free) + cost
        return dma_free

    def block(addr, rows, rb, pitch):
        return dma_closed(per_pc_bytes(addr, rows, rb, pitch))

    tiles = []
    for m0 in range(0, M, 32):
        for n0 in range(0, N, 32):
            ks = list(range(0, K, 64))
            for i, k0 in enumerate(ks):
                tiles.append((m0, k0, n0, min(32, M - m0), min(64, K - k0), min(32, N - n0), i == len(ks) - 1, i > 0))
    steps = plan(M, K, N, (32, 64, 32))
    assert [(s.m0, s.k0, s.n0) for s in steps] == [t[:3] for t in tiles]   # row-major walk: every step loads B
    pls = panel_plan(steps[1:], 2, panel_budget(Params.of(load_profile()), 2))
    assert pls and max(len(p.steps) for p in pls) > 1
    owner = {i: r for r, p in enumerate(pls) for i in p.steps}
    left = [len(p.steps) for p in pls]
    landed = []

    def issue_panels(t):
        while len(landed) < len(pls) and (len(landed) < 2 or left[len(landed) - 2] == 0):
            p = pls[len(landed)]
            landed.append(dma(t, block(b + (p.k_lo * N + p.n_lo) * 2, p.k_hi - p.k_lo, (p.n_hi - p.n_lo) * 2,
                                       N * 2)))

    def loads(i, t):
        m0, k0, n0, tm, tk, tn, _, _ = tiles[i]
        done = dma(t, block(a + (m0 * K + k0) * 2, tm, tk * 2, K * 2))
        if i not in owner:
            done = dma(t, block(b + (k0 * N + n0) * 2, tk, tn * 2, N * 2))
        return done

    def finish(st, t):   # after GEMM st: epilogue + store of the tile it ended
        nonlocal end, serial
        m0, k0, n0, tm, tk, tn, last, _ = st
        if last:
            t += epilogue_ops * (8 + ceil_div(tm * tn, 64)) * NS
            serial += epilogue_ops * (8 + ceil_div(tm * tn, 64)) * NS
            end = dma(t, block(c + (m0 * N + n0) * 2, tm, tn * 2, N * 2))
        return t

    # the GEMM engine is a pipeline: busy for core cycles, result 48 cycles later; GEMM i is sent when its
    # operands are in (A load, B block or its panel), then the scheduler waits for GEMM i-1, queues the
    # loads of i+1 and finishes i-1's tile
    ready, t, end, free = loads(0, 0), 0, 0, 0
    issue_panels(0)
    prev = None
    for i, st in enumerate(tiles):
        m0, k0, n0, tm, tk, tn, last, acc = st
        t = max(t, ready)
        if i in owner:
            t = max(t, landed[owner[i]])
            left[owner[i]] -= 1
            if not left[owner[i]]:
                issue_panels(t)
        start = max(t, free)
        free = start + gemm_core(tm, tk, tn)
        serial += gemm_closed(tm, tk, tn)
        if prev is not None:
            t = max(t, prev[1])
        if i + 1 < len(tiles):
            ready = loads(i + 1, t)
        if prev is not None:
            t = finish(prev[0], t)
        prev = (st, start + gemm_closed(tm, tk, tn) if last else free)   # K steps before the last: no drain
    t = finish(prev[0], max(t, prev[1]))
    return max(t, end), serial


@pytest.mark.parametrize("mode", ["timing", "data"])
async def test_composite_gemm_time_and_result(vclock, mode):
    M, K, N = 80, 160, 48
    rng = np.random.default_rng(1)
    A = rng.standard_normal((M, K)).astype(np.float16)
    B = rng.standard_normal((K, N)).astype(np.float16)
    script = []
    system, m, place = build({PE: script}, mode=mode)
    a, b, c = place.put(PE, A), place.put(PE, B), place.put(PE, np.zeros((M, N), np.float16))
    script.append({"op": "composite", "a_addr": a, "b_addr": b, "c_addr": c, "m": M, "k": K, "n": N,
                   "dtype": "<f2", "epilogue": [["scale", 0.5], ["relu", 0]], "label": "cg"})
    res = await system.run_async()
    assert res.status == "finished", res.error
    _, start, issued, done = log(m, PE, "cg")
    assert issued - start == 32 * NS                       # composite dispatch: 32 cycles
    overlapped, serial = composite_closed(M, K, N, a, b, c, 2)
    assert done - issued == overlapped
    # load/compute overlap emerged from the DMA and GEMM engines working concurrently
    assert done - issued < serial
    assert m.pe(*PE).gemm.array_ps == sum(gemm_core(s.tm, s.tk, s.tn) for s in plan(M, K, N, (32, 64, 32)))
    if mode == "data":
        got = np.frombuffer(place.read(PE, c, M * N * 2), np.float16).reshape(M, N)
        acc = sequential_fp32(A, B)   # fp32 accumulation over K, in order, across the K tiles (ref §3.3)
        ref = np.maximum(acc * np.float32(0.5), 0).astype(np.float16)
        np.testing.assert_array_equal(got, ref)


async def test_data_mode_engines_equal_numpy(vclock):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((32, 64)).astype(np.float16)
    b = rng.standard_normal((64, 32)).astype(np.float16)
    x = rng.standard_normal((8, 128)).astype(np.float32)
    script = [
        {"op": "gemm", "a": "a", "b": "b", "acc": "acc", "out": "c", "out_dtype": "<f2", "m": 32, "k": 64, "n": 32},
        {"op": "gemm", "a": "a", "b": "b", "acc": "acc", "accumulate": True, "m": 32, "k": 64, "n": 32},
        {"op": "math", "fn": "rowmax", "srcs": ["x"], "out": "mx"},
        {"op": "math", "fn": "sub_row", "srcs": ["x", "mx"], "out": "xs"},
        {"op": "math", "fn": "exp", "srcs": ["xs"], "out": "p"},
        {"op": "math", "fn": "rowsum", "srcs": ["p"], "out": "l"},
        {"op": "math", "fn": "div_row", "srcs": ["p", "l"], "out": "sm"},
        {"op": "dma", "kind": "store", "addr": 0, "row_bytes": 32 * 32 * 4, "buf": "acc", "shape": [32, 32],
         "dtype": "<f4"},
        {"op": "dma", "kind": "store", "addr": 8192, "row_bytes": 8 * 128 * 4, "buf": "sm", "shape": [8, 128],
         "dtype": "<f4"},
    ]
    system, m, place = build({PE: script}, mode="data")
    for name, arr in (("a", a), ("b", b), ("x", x)):
        place.tcm_put(PE, name, arr)
    res = await system.run_async()
    assert res.status == "finished", res.error
    acc = np.frombuffer(place.read(PE, 0, 4096), np.float32).reshape(32, 32)
    once = sequential_fp32(a, b)
    np.testing.assert_array_equal(acc, sequential_fp32(a, b, once))   # the second GEMM continues the first's sums
    sm = np.frombuffer(place.read(PE, 8192, 4096), np.float32).reshape(8, 128)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(sm, e / e.sum(axis=1, keepdims=True), rtol=1e-6)


async def test_tcm_overflow_is_a_clear_error(vclock):
    script = [{"op": "dma", "kind": "load", "addr": 0, "row_bytes": 2 << 20, "buf": "big", "shape": [1 << 20],
               "dtype": "<f2"}]
    system, m, place = build({PE: script})
    res = await system.run_async()
    assert res.status == "error"
    assert "TCM overflow" in res.error and "sip0/cube00/pe0/tcm" in res.error


def test_payload_size_same_in_both_modes():
    for shape, dt in (((2048,), "<f2"), ((32, 64), "<f2"), ((8, 128), "<f4"), ((1,), "<f4"), ((300, 300), "<f2")):
        arr = np.zeros(shape, dt)
        for rec in (lambda p: IpcqData(1, p), lambda p: NocPacket(1 << 16, [0, 1, 2], [0, 3, 4], 2, p)):
            assert encode(rec(payload(arr)))[1] == encode(rec(payload(TensorDesc.like(arr))))[1]


def test_microbench_cli_table_and_determinism(emu):
    """The CLI scenario: every measured time equals its closed form; two processes agree (R8)."""
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scenarios" / "ahbm" / "microbench.yaml"
    runs = [json.loads(emu("run", path, "--json", "--compact", "--no-bundle", check=0).stdout) for _ in range(2)]
    assert runs[0]["digest"] == runs[1]["digest"]
    rows = runs[0]["tables"]["AHBM microbenchmarks: measured vs closed form"]
    assert len(rows) >= 15
    for r in rows:
        assert r["measured_ns"] is not None and abs(r["err_%"]) <= 0.01, r
    text = emu("run", path, "--no-bundle", check=0).stdout
    assert "measured_ns" in text and "noc 6 hops" in text and "composite" in text
