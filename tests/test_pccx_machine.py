"""pccx v002 machine: data-mode effects vs numpy, per-op timing vs closed forms, errors, back-pressure, overlap.

All runs are on virtual time (System.run uses the virtual clock); the closed-form
service times below are written out here from the documented formulas, not
imported from the model.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from actors.pccx.builder import build_machine
from emulator import numerics
from actors.pccx.profile import load_profile
from actors.pccx.numerics import from_bf16, to_bf16
from actors.pccx.program import ProgramBuilder, weight_blob
from emulator.system import System
from protocols import pccx_isa as isa

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ["pccx-v002-documented", "pccx-v002-rtl"]
A = {"async": 1}
S = {"async": 0}


def bf(x):
    return to_bf16(np.asarray(x, np.float32))


def f(b):
    return from_bf16(b).astype(np.float32)


def run(b: ProgramBuilder, profile, mode="data"):
    system = System("t", seed=1, mode=mode)
    build_machine(system, profile, b.steps, b.ddr if mode == "data" else None)
    res = system.run()
    assert res.status == "finished", (res.status, res.error, res.deadlock)
    return system


def records(system, op=None, kind="retire"):
    return [r for r in system.actors["pccx/axil_stat"].records if r["kind"] == kind and (op is None or r["op"] == op)]


def l2(system, elem, n):
    return system.actors["pccx/l2"].mem[elem:elem + n]


def load_vector(b: ProgramBuilder, bits: np.ndarray, l2_word: int, slot: int = 0):
    """MEMSET fmap[slot] = len, sync MEMCPY host->L2 of ``bits`` (BF16) to ``l2_word``."""
    addr = b.put(bits.astype(np.uint16).tobytes())
    b.push("MEMSET", dest_cache=0, dest_addr=slot, a_value=bits.size, b_value=1, c_value=1)
    b.push("MEMCPY", from_device=1, to_device=0, dest_addr=l2_word, aux_addr=addr // 16, shape_ptr_addr=slot, **S)


# --------------------------------------------------------------------------- data-mode effects
def test_memset_memcpy_round_trip_data():
    prof = load_profile("pccx-v002-rtl")
    rng = np.random.default_rng(0)
    x = bf(rng.normal(size=40))
    b = ProgramBuilder(prof)
    load_vector(b, x, 100, slot=5)
    b.push("MEMSET", dest_cache=1, dest_addr=63, a_value=7, b_value=8, c_value=9)
    out = b.alloc(80)
    b.push("MEMCPY", from_device=0, to_device=1, src_addr=100, aux_addr=out // 16, shape_ptr_addr=5, **S)
    b.wait("end")
    s = run(b, prof)
    assert np.array_equal(l2(s, 800, 40), x)
    assert not l2(s, 840, 8).any()           # ceil(40/8) = 5 words, nothing beyond
    assert np.array_equal(s.actors["pccx/ddr"].mem[out:out + 80].view(np.uint16), x)
    ram = s.actors["pccx/dispatcher"].ram
    assert ram[0][5] == [40, 1, 1] and ram[1][63] == [7, 8, 9]


def mm(a, b, acc):
    """``a @ b`` summed in a fixed order (no BLAS: the same bits under any OpenBLAS kernel)."""
    return numerics.matmul(a, b, acc=acc)


def gemv_ref(W, x_bits, scale_bits=None):
    """numpy GEMV of the lanes: exact (float64) dot products -> float32, times the float32 scale."""
    y = mm(W, f(x_bits), np.float64).astype(np.float32)
    return y if scale_bits is None else (y * f(scale_bits)).astype(np.float32)


@pytest.mark.parametrize("name", PROFILES)
def test_gemv_gemm_and_accm_data(name):
    """GEMV split over 4 and 2 lanes (+ accm) and a GEMM vs numpy.  N = 24: parallel_lane=4 gives lanes
    6 rows each, parallel_lane=2 12 rows each; as built (rtl) lanes C/D have no weight FIFO, so rows
    12..23 of the 4-lane GEMV are 0 (reference §0/§3: C/D get zero weights)."""
    prof = load_profile(name)
    rng = np.random.default_rng(1)
    K, N = 96, 24
    x = bf(rng.normal(size=K))
    W1, W2, Wg = rng.integers(-8, 8, (N, K)), rng.integers(-8, 8, (N, K)), rng.integers(-8, 8, (32, K))
    s1, sg = bf(rng.uniform(0.01, 0.1, N)), bf(rng.uniform(0.01, 0.1, 32))
    b = ProgramBuilder(prof)
    load_vector(b, x, 0)
    b.push("MEMSET", dest_cache=1, dest_addr=2, a_value=N, b_value=K, c_value=1)
    b.stream_gemv(W1, s1, 4)
    b.push("GEMV", dest_reg=50, src_addr=0, w_scale=1, size_ptr_addr=2, shape_ptr_addr=0, parallel_lane=4)
    b.stream_gemv(W2, None, 2)
    b.push("GEMV", dest_reg=50, src_addr=0, accm=1, size_ptr_addr=2, shape_ptr_addr=0, parallel_lane=2)
    b.stream_weights("gemm", weight_blob(Wg, sg))
    b.push("GEMM", dest_reg=60, src_addr=0, w_scale=1, shape_ptr_addr=0)
    b.wait("end")
    s = run(b, prof)
    xf = f(x)
    y1 = gemv_ref(W1, x, s1)
    if name == "pccx-v002-rtl":
        y1[12:] = 0
    y1 = bf(y1)
    y2 = bf(gemv_ref(W2, x) + f(y1))
    assert np.array_equal(l2(s, 400, N), y2)
    assert (name == "pccx-v002-rtl") == (s.actors["pccx/gemv/lane2"].zero_rows == 6)
    assert np.array_equal(l2(s, 480, 32), bf(mm(Wg, xf, np.float32) * f(sg)))
    assert [r["op"] for r in records(s)].count("GEMV") == 2


def _serial_bf16_sum(v):
    acc = np.float32(0)
    for e in f(v):
        acc = f(bf(acc + e))[()]
    return acc


@pytest.mark.parametrize("func", list(isa.CVO_FUNCS))
def test_cvo_functions_data(func):
    prof = load_profile("pccx-v002-documented")
    rng = np.random.default_rng(2)
    n = 37
    x = bf(rng.uniform(0.1, 3.0, n) * rng.choice([-1, 1], n) if func not in ("SQRT", "RECIP")
           else rng.uniform(0.1, 3.0, n))
    b = ProgramBuilder(prof)
    load_vector(b, x, 0)
    src, dst = 3, 1000 * 8 + 5                   # element addresses, deliberately not word aligned
    length = n - 3
    b.push("CVO", cvo_func=isa.CVO_FUNCS[func], src_addr=src, dst_addr=dst, length=length, **S)
    b.wait("end")
    s = run(b, prof)
    v = f(x[src:src + length])
    want = {
        "EXP": lambda: bf(np.exp(v)), "SQRT": lambda: bf(np.sqrt(v)),
        "GELU": lambda: bf(v / (1 + np.exp(-1.702 * v))),
        "SIN": lambda: bf(np.sin(np.clip(v, -4, 4))), "COS": lambda: bf(np.cos(np.clip(v, -4, 4))),
        "REDUCE_SUM": lambda: bf([_serial_bf16_sum(x[src:src + length])]),
        "SCALE": lambda: bf(v[1:] * v[0]), "RECIP": lambda: bf(1 / v),
    }[func]()
    assert np.array_equal(l2(s, dst, want.size), want)
    assert not l2(s, dst + want.size, 1).any()


def test_cvo_scale_recip_zero_scalar_and_sub_emax():
    prof = load_profile("pccx-v002-documented")
    b = ProgramBuilder(prof)
    vec = bf([0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 5.0, 6.0, -2.0, 8.0])   # [0] zero scalar, [5] zero scalar, [6:] data
    load_vector(b, vec, 0)
    b.push("CVO", cvo_func=isa.CVO_FUNCS["SCALE"], src_addr=0, dst_addr=800, length=5, recip_scale=1, **S)
    b.push("CVO", cvo_func=isa.CVO_FUNCS["SCALE"], src_addr=6, dst_addr=808, length=4, recip_scale=1, **S)
    # GEMV with findemax -> e_max; CVO EXP with sub_emax subtracts it
    K, N = 16, 8
    W = np.eye(N, K, dtype=int) * 2
    x = bf(np.arange(K) * 0.25)
    load_vector(b, x, 20, slot=2)
    b.push("MEMSET", dest_cache=1, dest_addr=3, a_value=N, b_value=K, c_value=1)
    b.stream_gemv(W, None, 0)
    b.push("GEMV", dest_reg=30, src_addr=20, findemax=1, size_ptr_addr=3, shape_ptr_addr=2)
    b.wait("gemv")
    b.push("CVO", cvo_func=isa.CVO_FUNCS["EXP"], src_addr=240, dst_addr=900, length=N, sub_emax=1, **S)
    b.wait("end")
    s = run(b, prof)
    assert not l2(s, 800, 4).any()                                      # recip_scale with scalar 0 -> 0
    assert np.array_equal(l2(s, 808, 3), bf(f(vec[7:10]) * f(bf(1 / np.float32(5.0)))))
    y = f(bf(mm(W, f(x), np.float32)))
    assert np.array_equal(l2(s, 240, N), bf(y))
    assert np.array_equal(l2(s, 900, N), bf(np.exp(f(bf(y - y.max())))))


# --------------------------------------------------------------------------- timing
def cyc(prof):
    return 10**12 // prof["clocks"]["core"], 10**12 // prof["clocks"]["axi"]


def ceil_div(a, b):
    return -(-a // b)


# Architecture, not profile: the L2 word and the HP beat are 128 bits (reference §3): 8 BF16 or 32 INT4.
WORD_BYTES = 16
BF16_PER_WORD = 8
INT4_PER_BEAT = 32

# The per-opcode timing program (a test input): a K-element BF16 x, an N x K INT4 GEMV, a 32 x K GEMM,
# a MEMCPY of COPY_ELEMS elements each way, every CVO function on CVO_LEN elements from element CVO_SRC
# to element CVO_DST (mid-word on both sides).
K, N = 256, 16
COPY_ELEMS, COPY_SLOT, COPY_L2_WORD = 96, 1, 200
GEMV_SHAPE_SLOT = 2
CVO_SRC, CVO_DST, CVO_LEN = 5, 4003, 50


def memset_ps(prof):
    """MEMSET: ``dispatcher.memset_cycles`` core cycles (actors/pccx/memory.py, MemDispatcher)."""
    return prof["dispatcher"]["memset_cycles"] * cyc(prof)[0]


def memcpy_host_to_l2_ps(prof, words):
    """MEMCPY host->L2 of one ACP burst (actors/pccx/memory.py, MemDispatcher + Acp): the length lookup
    pipeline, the DDR read (bytes / ddr.bandwidth + ddr.latency), ``words x acp.cycles_per_word``, then the
    L2 port-A write at one word per core cycle."""
    assert words <= prof["acp"]["burst_words"], "closed form for one ACP burst"
    tc, _ = cyc(prof)
    ddr = ceil_div(words * WORD_BYTES * 10**12, prof["ddr"]["bandwidth"]) + prof["ddr"]["latency"]
    return (prof["dispatcher"]["len_lookup_cycles"] * tc + ddr + words * prof["acp"]["cycles_per_word"] * tc
            + words * tc)


def memcpy_l2_to_host_ps(prof, words):
    """MEMCPY L2->host of one ACP burst (actors/pccx/memory.py, Acp): the length lookup pipeline, the L2
    port-A read (``words + l2.read_latency_cycles``), ``words x acp.cycles_per_word``, the DDR write."""
    assert words <= prof["acp"]["burst_words"], "closed form for one ACP burst"
    tc, _ = cyc(prof)
    ddr = ceil_div(words * WORD_BYTES * 10**12, prof["ddr"]["bandwidth"]) + prof["ddr"]["latency"]
    return (prof["dispatcher"]["len_lookup_cycles"] * tc + (words + prof["l2"]["read_latency_cycles"]) * tc
            + words * prof["acp"]["cycles_per_word"] * tc + ddr)


def burst_costs(bursts, macs_per_cycle):
    """MAC cycles of each burst of one weight stream (``bursts`` = beats per burst), rounded over the stream:
    ``ceil(W_k / R) - ceil(W_{k-1} / R)``, ``W_k`` = weights of bursts 1..k (actors/pccx/gemv.py, compute.py)."""
    costs, done = [], 0
    for beats in bursts:
        costs.append(ceil_div(INT4_PER_BEAT * (done + beats), macs_per_cycle)
                     - ceil_div(INT4_PER_BEAT * done, macs_per_cycle))
        done += beats
    return costs


def stream_bursts(nbytes, prof):
    """Beats per HP burst of an ``nbytes`` weight stream: full ``hp.burst_beats`` bursts, then the rest."""
    beats, per = ceil_div(nbytes, WORD_BYTES), prof["hp"]["burst_beats"]
    return [per] * (beats // per) + ([beats % per] if beats % per else [])


def gemv_lane_bursts(prof, parallel_lane):
    """The bursts of each lane's stream for the N x K GEMV with BF16 scales (rows split in equal blocks)."""
    rows = ceil_div(N, parallel_lane)
    return stream_bursts(rows * K // 2 + 2 * rows, prof)


def gemv_ps(prof, parallel_lane):
    """GEMV of the N x K INT4 weights + BF16 scales on ``parallel_lane`` lanes, weights already in the FIFOs
    (actors/pccx/gemv.py, "Service time"): ``(ceil(K/8) + Lrd) + max_i(start_i + sum c_k) + F + ceil(N/8)``.

    A lane whose HP port (``gemv.lane_ports``) also feeds an earlier lane starts its MACs when that lane
    takes its second-to-last burst, ``sum_{j < k-2} c_j`` later (the switch's HOL blocking, gemv.py); a
    lane without a port computes on zero weights at once.
    """
    tc, _ = cyc(prof)
    g = prof["gemv"]
    costs = burst_costs(gemv_lane_bursts(prof, parallel_lane), g["macs_per_lane"])
    start, ends = {}, []
    for port in g["lane_ports"][:parallel_lane]:
        begin = start.get(port, 0) if port is not None else 0
        if port is not None:
            start[port] = begin + sum(costs[:len(costs) - 2])
        ends.append(begin + sum(costs))
    lrd = prof["l2"]["read_latency_cycles"]
    return (ceil_div(K, BF16_PER_WORD) + lrd + max(ends) + g["pipeline_cycles"] + ceil_div(N, BF16_PER_WORD)) * tc


def gemm_ps(prof):
    """GEMM of the 32 x K INT4 weights (no scales), weights already in the FIFOs (actors/pccx/compute.py,
    MatEngine): ``(ceil(K/8) + Lrd) + ceil(32 B / R) + F + ceil(rows/8)``, B = the op's weight beats."""
    tc, _ = cyc(prof)
    gm = prof["gemm"]
    beats = ceil_div(gm["rows"] * K // 2, WORD_BYTES)
    return (ceil_div(K, BF16_PER_WORD) + prof["l2"]["read_latency_cycles"]
            + ceil_div(INT4_PER_BEAT * beats, gm["macs_per_cycle"]) + gm["fill_cycles"]
            + ceil_div(gm["rows"], BF16_PER_WORD)) * tc


def words_spanned(first_elem, n):
    return (first_elem + n - 1) // BF16_PER_WORD - first_elem // BF16_PER_WORD + 1


def cvo_ps(prof, func):
    """CVO ``func`` on CVO_LEN elements (actors/pccx/compute.py, Cvo): ``words(src, L) * Crd + lat_f
    (+ L * Cred for REDUCE_SUM) + output_register_cycles + out * Cwr + words(dst, out)``;
    out = 1 for REDUCE_SUM, L - 1 for SCALE (the first element is the scalar), else L."""
    tc, _ = cyc(prof)
    c = prof["cvo"]
    out = {"REDUCE_SUM": 1, "SCALE": CVO_LEN - 1}.get(func, CVO_LEN)
    t = words_spanned(CVO_SRC, CVO_LEN) * c["read_cycles_per_word"] + c["latency"][func] + c["output_register_cycles"]
    t += CVO_LEN * c["reduce_cycles_per_element"] if func == "REDUCE_SUM" else 0
    t += out * c["write_cycles_per_element"] + words_spanned(CVO_DST, out)
    return t * tc


@pytest.fixture(scope="module", params=[(name, mode) for name in PROFILES for mode in ("timing", "data")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def per_op_run(request):
    """One run per profile and mode of a program that issues every opcode on an idle machine.

    Returns ``(profile, lat)``, ``lat(op)`` = the engine-arrival -> retire time of each ``op`` in issue order.
    """
    name, mode = request.param
    prof = load_profile(name)
    b = ProgramBuilder(prof)
    x = bf(np.linspace(-1, 1, K))
    load_vector(b, x, 0)                                       # MEMSET + MEMCPY in (32 words: 2 bursts)
    b.push("MEMSET", dest_cache=0, dest_addr=COPY_SLOT, a_value=COPY_ELEMS, b_value=1, c_value=1)
    xa = b.put(x[:COPY_ELEMS].tobytes())
    b.push("MEMCPY", from_device=1, to_device=0, dest_addr=COPY_L2_WORD, aux_addr=xa // 16, shape_ptr_addr=COPY_SLOT,
           **S)
    b.wait("in")                                              # idle DDR: no weight stream competes with it
    b.push("MEMSET", dest_cache=1, dest_addr=GEMV_SHAPE_SLOT, a_value=N, b_value=K, c_value=1)
    rng = np.random.default_rng(3)
    b.stream_gemv(rng.integers(-8, 8, (N, K)), bf(np.ones(N)), 2)
    b.stream_gemv(rng.integers(-8, 8, (N, K)), bf(np.ones(N)), 4)
    b.stream_weights("gemm", weight_blob(rng.integers(-8, 8, (prof["gemm"]["rows"], K)), None))
    b.steps.append(("sleep", 200_000_000))                   # let the weight FIFOs fill (idle machine afterwards)
    b.push("GEMV", dest_reg=300, src_addr=0, w_scale=1, size_ptr_addr=GEMV_SHAPE_SLOT, shape_ptr_addr=0,
           parallel_lane=2)
    b.wait("gemv")
    b.push("GEMV", dest_reg=302, src_addr=0, w_scale=1, size_ptr_addr=GEMV_SHAPE_SLOT, shape_ptr_addr=0,
           parallel_lane=4)
    b.wait("gemv4")
    b.push("GEMM", dest_reg=310, src_addr=0, shape_ptr_addr=0)
    b.wait("gemm")
    for func in isa.CVO_FUNCS:
        b.push("CVO", cvo_func=isa.CVO_FUNCS[func], src_addr=CVO_SRC, dst_addr=CVO_DST, length=CVO_LEN, **S)
    out = b.alloc(COPY_ELEMS * 2)
    b.push("MEMCPY", from_device=0, to_device=1, src_addr=COPY_L2_WORD, aux_addr=out // 16,
           shape_ptr_addr=COPY_SLOT, **S)
    b.wait("end")
    s = run(b, prof, mode)
    return prof, lambda op: [r["end"] - r["start"] for r in records(s, op)]


def test_memset_timing(per_op_run):
    prof, lat = per_op_run
    assert lat("MEMSET") == [memset_ps(prof)] * 3


def test_memcpy_timing(per_op_run):
    """The second MEMCPY (host -> L2) and the third (L2 -> host) move COPY_ELEMS elements: one ACP burst each."""
    prof, lat = per_op_run
    words = ceil_div(COPY_ELEMS, BF16_PER_WORD)
    m = lat("MEMCPY")
    assert m[1] == memcpy_host_to_l2_ps(prof, words)
    assert m[2] == memcpy_l2_to_host_ps(prof, words)


@pytest.mark.parametrize("name", PROFILES)
def test_gemv_burst_costs_worked_example(name):
    """The burst costs gemv_ps uses, worked by hand: parallel_lane=2 gives each lane 8 rows = 1024 B + 16 B
    scales = 65 beats (16, 16, 16, 16, 1); parallel_lane=4: 4 rows = 520 B = 33 beats (16, 16, 1).  At 32
    MAC/clk (rtl) a 16-beat burst (512 weights) takes 16 cycles; at 1024 (documented) 2080 weights take
    ceil(2080/1024) = 3 cycles in all, 1056 weights 2."""
    prof = load_profile(name)
    rate = prof["gemv"]["macs_per_lane"]
    two, four = gemv_lane_bursts(prof, 2), gemv_lane_bursts(prof, 4)
    assert (two, four) == ([16, 16, 16, 16, 1], [16, 16, 1])
    assert burst_costs(two, rate) == ([16, 16, 16, 16, 1] if rate == 32 else [1, 0, 1, 0, 1])
    assert burst_costs(four, rate) == ([16, 16, 1] if rate == 32 else [1, 0, 1])


def test_gemv_timing(per_op_run):
    """parallel_lane=2: lanes A, B on their own ports (HP2, HP3) in both profiles, nothing to wait for.
    parallel_lane=4: documented, C and D share HP2/HP3 with A/B behind the switch; rtl, no FIFO (zero weights)."""
    prof, lat = per_op_run
    assert lat("GEMV") == [gemv_ps(prof, 2), gemv_ps(prof, 4)]


def test_gemm_timing(per_op_run):
    prof, lat = per_op_run
    assert lat("GEMM") == [gemm_ps(prof)]


def test_cvo_timing(per_op_run):
    prof, lat = per_op_run
    assert lat("CVO") == [cvo_ps(prof, func) for func in isa.CVO_FUNCS]


@pytest.mark.parametrize("mode", ["timing", "data"])
def test_prefetched_documented_gemm_runs_at_the_configured_mac_rate(mode):
    """Weights already in the FIFOs: the GEMM's MAC time is ceil(32 * beats / 2048) cycles for the whole op,
    not one cycle (or more) per 16-beat burst of 512 weights, which would cap the array at 512 MAC/clk."""
    prof = load_profile("pccx-v002-documented")
    tc, _ = cyc(prof)
    gm = prof["gemm"]
    assert gm["macs_per_cycle"] == 2048 and prof["hp"]["burst_beats"] == 16
    K = 1000
    rng = np.random.default_rng(7)
    x, W, sc = bf(rng.normal(size=K)), rng.integers(-8, 8, (32, K)), bf(rng.uniform(0.01, 0.1, 32))
    b = ProgramBuilder(prof)
    load_vector(b, x, 0)
    b.stream_weights("gemm", weight_blob(W, sc))
    b.steps.append(("sleep", 200_000_000))                   # the weight FIFOs fill; the machine idles
    b.push("GEMM", dest_reg=310, src_addr=0, w_scale=1, shape_ptr_addr=0)
    b.wait("gemm")
    s = run(b, prof, mode)
    # 32 x 1000 INT4 = 16000 B + 32 BF16 scales = 16064 B = 1004 beats = 62 bursts of 16 + one of 12
    beats = (32 * K) // 2 // 16 + 64 // 16
    assert beats == 1004
    mac = ceil_div(32 * beats, 2048)
    assert mac == 16                                          # per-burst rounding would give 63
    spans = s.actors["pccx/gemm"].spans
    assert len(spans) == 63
    assert sum(e - a for a, e, _, _ in spans) == mac * tc
    assert spans[-1][1] - spans[0][0] == mac * tc              # back to back: no burst waited for
    # read 125 words + 3, MACs, fill, 4-word write
    assert [r["end"] - r["start"] for r in records(s, "GEMM")] == [((125 + 3) + mac + gm["fill_cycles"] + 4) * tc]
    if mode == "data":
        assert np.array_equal(l2(s, 310 * 8, 32), bf(mm(W, f(x), np.float32) * f(sc)))


def test_rtl_cvo_costs_about_three_cycles_per_element():
    prof = load_profile("pccx-v002-rtl")
    b = ProgramBuilder(prof)
    b.push("CVO", cvo_func=isa.CVO_FUNCS["EXP"], src_addr=0, dst_addr=8 * 2000, length=2048, **S)
    b.wait("end")
    s = run(b, prof, "timing")
    per_elem = (records(s, "CVO")[0]["end"] - records(s, "CVO")[0]["start"]) / 10_000 / 2048
    assert 3.0 < per_elem < 3.3        # reference §1.3 (derived): ≈3.1 cycles/element + function latency


# --------------------------------------------------------------------------- errors
BAD = {
    "reserved_opcode": (lambda: 0x5000_0000_0000_0000, isa.ERR_RESERVED_OPCODE),
    "reserved_bits": (lambda: isa.encode("MEMSET", dest_addr=40, a_value=5) | 0b1010, isa.ERR_RESERVED_BITS),
    "undefined_value": (lambda: isa.encode("MEMSET") | 2 << 58, isa.ERR_RESERVED_BITS),
    "l2_range": (lambda: isa.encode("GEMV", dest_reg=114688), 3),
    "l2_extent": (lambda: isa.encode("MEMCPY", from_device=1, dest_addr=114687, shape_ptr_addr=0), 3),
    "cvo_length": (lambda: isa.encode("CVO", length=2049), 4),
    # a 17-bit field, but the CVO stream bridge keeps 16 bits of an element address (reference §1.6)
    "cvo_address": (lambda: isa.encode("CVO", src_addr=70000, length=8), 3),
}


@pytest.mark.parametrize("errors", ["strict", "rtl"])
@pytest.mark.parametrize("case", list(BAD))
def test_bad_instruction_interrupt_or_drop(case, errors):
    """strict: error interrupt + halted driver; rtl: dropped silently — except non-zero reserved
    bits, which the RTL decoder never looks at: the instruction executes as if they were 0 (reference §1.7)."""
    prof = load_profile("pccx-v002-rtl", {"errors": errors})
    word, code = BAD[case][0](), BAD[case][1]
    b = ProgramBuilder(prof)
    b.push("MEMSET", dest_cache=0, dest_addr=0, a_value=16, b_value=1, c_value=1)
    b.wait("setup")
    b.raw(word)
    b.wait("bad")
    for i in range(20):
        b.push("MEMSET", dest_cache=0, dest_addr=1 + i, a_value=i, b_value=1, c_value=1)
    b.wait("end")
    s = run(b, prof, "timing")
    drv, stat = s.actors["pccx/driver"], s.actors["pccx/axil_stat"]
    bad = [(r["kind"], r["seq"], r["code"]) for r in stat.records if r["kind"] != "retire"]
    if errors == "strict":
        assert bad == [("error", 1, code)]
        assert drv.halted["code"] == code and drv.halted["word"] == f"0x{word:016X}" and drv.halted["seq"] == 1
        assert drv.pushed == 2                        # halted: nothing pushed after the bad instruction
        assert s.reports["pccx/driver"]["halted"]["class"]
        assert stat.word() & 0b100                    # ERROR bit
    else:
        assert drv.halted is None and drv.pushed == 22
        if case == "reserved_bits":
            assert bad == [] and s.actors["pccx/dispatcher"].ram[0][40] == [5, 0, 0]
        else:
            assert bad == [("drop", 1, code)]
        assert stat.word() & 0b100 == 0


def test_kick_marker_is_dropped_silently_in_both_modes():
    for errors in ("strict", "rtl"):
        prof = load_profile("pccx-v002-documented", {"errors": errors})
        b = ProgramBuilder(prof)
        b.steps.append(("kick",))
        b.push("MEMSET", dest_cache=0, dest_addr=0, a_value=1, b_value=1, c_value=1)
        b.wait("end")
        s = run(b, prof, "timing")
        assert s.actors["pccx/driver"].halted is None
        assert [r["kind"] for r in s.actors["pccx/axil_stat"].records] == ["retire"]


def test_status_done_bit_follows_profile():
    for name, done in (("pccx-v002-rtl", False), ("pccx-v002-documented", True)):
        prof = load_profile(name)
        b = ProgramBuilder(prof)
        x = bf(np.ones(8))
        load_vector(b, x, 0)          # ends with a MEMCPY: the RTL raises no DONE for it (reference §2.1)
        b.wait("end")
        s = run(b, prof, "timing")
        assert s.actors["pccx/driver"].waits[-1]["done_bit"] is done


# --------------------------------------------------------------------------- back-pressure
def test_full_weight_fifo_stalls_hp_port():
    prof = load_profile("pccx-v002-rtl", {"hp": {"fifo_words": 64}})     # lane A reads HP2's FIFO
    cap = 64 // 16                                   # 4 bursts of 16 beats
    N, K = 16, 640                                   # 5120 B of weights = 20 bursts
    W = np.random.default_rng(4).integers(-8, 8, (N, K))
    b = ProgramBuilder(prof)
    b.stream_gemv(W, None, 1)
    b.steps.append(("sleep", 50_000_000))            # 50 µs: far longer than 20 transfers
    s0 = run(b, prof, "timing")
    hp = s0.actors["pccx/hp2"]
    assert len(hp.spans) == cap + 1                  # FIFO full + one burst held at the port
    assert s0.link("wfifo2.gemv.lane0").blocked_count >= 1
    # now with a consumer: every burst beyond the FIFO's capacity moves only after the GEMV took one out
    x = bf(np.ones(K))
    load_vector(b, x, 0)
    b.push("MEMSET", dest_cache=1, dest_addr=1, a_value=N, b_value=K, c_value=1)
    b.push("GEMV", dest_reg=200, src_addr=0, size_ptr_addr=1, shape_ptr_addr=0, parallel_lane=1)
    b.wait("end")
    s = run(b, prof, "data")
    hp, gemv = s.actors["pccx/hp2"], s.actors["pccx/gemv/lane0"]
    assert len(hp.spans) == 20 and len(gemv.spans) == 20
    for j in range(cap + 1, 20):
        assert hp.spans[j][0] >= gemv.spans[j - cap - 1][0]
    assert hp.spans[cap + 1][0] > 50_000_000         # stalled until the GEMV ran
    assert np.array_equal(l2(s, 1600, N), bf(mm(W, f(x), np.float32)))


# --------------------------------------------------------------------------- overlap scenario
@pytest.mark.parametrize("scenario", ["program.yaml", "program-rtl.yaml"])
def test_overlap_scenario_trace(scenario, tmp_path):
    """Weight prefetch of GEMV n+1 under GEMV n's compute, from the trace alone (no script makes it).

    Both scenarios queue every DataMover command up front; the weight FIFOs' credits decide when
    a burst moves.  Documented (parallel_lane=4, lanes A/C on HP2, B/D on HP3, 1024 MAC/clk): the
    lanes are weight-starved, so each port streams back to back.  As built (parallel_lane=2, lane A
    on HP2, B on HP3, 32 MAC/clk = one beat per clock = the port's beat rate): the lanes are
    rate-matched with their ports, so the lead the FIFO built before GEMV 0 started is never lost and
    the next stream's transfer runs under the compute for at least that lead.
    """
    from actors import registry
    from emulator.scenario import load_scenario
    from emulator.trace import read_trace
    from tools.run.runner import run_scenario

    sc = load_scenario(str(ROOT / "scenarios" / "pccx" / scenario), registry, [])
    path = tmp_path / "t.emutrace"
    res, _, _ = run_scenario(sc, trace_path=str(path))
    assert res["status"] == "finished" and res["max_abs_err"] == 0
    tr = read_trace(str(path))
    names = tr.actors
    compute: dict[str, dict[int, list]] = {}    # lane -> stream -> MAC spans
    xfer: dict[str, dict[int, list]] = {}       # port -> stream -> burst transfers
    for ev in tr.of_kind("busy"):
        _, t0, actor, t1, label = ev
        who = names[actor]
        if who.startswith("pccx/gemv/lane") and label.startswith("GEMV#") and " w" in label:
            lane = compute.setdefault(who[len("pccx/gemv/"):], {})
            lane.setdefault(int(label.rsplit(" w", 1)[1]), []).append((t0, t1))
        elif who in ("pccx/hp2", "pccx/hp3"):
            xfer.setdefault(who[len("pccx/"):], {}).setdefault(int(label[1:]), []).append((t0, t1))
    rtl = "rtl" in scenario
    wiring = {"hp2": ["lane0"], "hp3": ["lane1"]} if rtl else {"hp2": ["lane0", "lane2"], "hp3": ["lane1", "lane3"]}
    assert sorted(compute) == sorted(sum(wiring.values(), []))      # every lane in use computed (its own stream)
    for port, lanes in wiring.items():
        spans = {st: [sp for ln in lanes for sp in compute[ln].get(st, [])] for st in range(3)}
        assert all(spans.values()) and sorted(xfer[port]) == [0, 1, 2]
        lead = min(a for a, _ in spans[0]) - min(a for a, _ in xfer[port][0])
        assert lead > 0                        # the FIFO filled before the lanes started
        for n in (0, 1):
            c0, c1 = min(a for a, _ in spans[n]), max(b for _, b in spans[n])
            nxt = xfer[port][n + 1]
            # the port streams back to back: the prefetch of n+1 starts when n's last burst is in the
            # FIFO, before GEMV n's compute ends, not when GEMV n retires
            assert min(a for a, _ in nxt) == max(b for _, b in xfer[port][n]) < c1
            ov = sum(max(0, min(b, c1) - max(a, c0)) for a, b in nxt)
            assert ov > 0, f"no {port} transfer of stream {n + 1} during GEMV stream {n}"
            if rtl:
                assert ov >= lead, (port, n, ov, lead)


def test_emu_run_prints_latency_table_both_profiles_and_is_deterministic(emu):
    path = ROOT / "scenarios" / "pccx" / "program.yaml"
    runs = [json.loads(emu("run", path, "--json", "--no-bundle", "--quiet", *extra, check=0).stdout)
            for extra in ([], [], ["--set", "machine.profile=pccx-v002-rtl"])]
    for r in runs:
        assert r["status"] == "finished" and r["max_abs_err"] == 0
        table = next(v for k, v in r["tables"].items() if "latency" in k)
        assert {row["op"] for row in table} == set(isa.OPCODES)
    assert runs[0]["digest"] == runs[1]["digest"]
    assert runs[0]["end_time_ps"] != runs[2]["end_time_ps"]
    text = emu("run", ROOT / "scenarios" / "pccx" / "program-rtl.yaml", "--no-bundle", "--quiet", check=0).stdout
    assert "pccx per-opcode latency" in text and "weight prefetch overlap" in text


def test_wait_without_weights_times_out_instead_of_hanging():
    prof = load_profile("pccx-v002-rtl", {"driver": {"wait_timeout": "50us"}})
    b = ProgramBuilder(prof)
    b.push("MEMSET", dest_cache=1, dest_addr=1, a_value=8, b_value=8, c_value=1)
    b.push("MEMSET", dest_cache=0, dest_addr=0, a_value=8, b_value=1, c_value=1)
    b.push("GEMV", dest_reg=10, src_addr=0, size_ptr_addr=1)     # no weight stream was queued
    b.wait("never")
    s = run(b, prof, "timing")
    h = s.actors["pccx/driver"].halted
    assert h["class"] == "timeout" and "1 of 3 instructions not retired" in h["text"]
    assert 50_000_000 <= h["at_ps"] <= 52_000_000


def test_program_timing_and_data_mode_share_virtual_time():
    from actors.pccx.program import PARAMS, build
    from emulator.schema import load_yaml, validate

    params = validate(PARAMS, load_yaml("{gemvs: 2, K: 256, N: 32}", "<test>"))
    prof = load_profile("pccx-v002-documented")
    out = {}
    for mode in ("timing", "data"):
        system = System("p", seed=3, mode=mode)
        build(system, prof, params)
        res = system.run()
        assert res.status == "finished"
        out[mode] = (res.end_time_ps, [(r["op"], r["start"], r["end"]) for r in system.actors["pccx/axil_stat"].records])
    assert out["timing"] == out["data"]


def test_asm_workload_runs_text_program_and_reports_clear_errors(emu, run_with_context, tmp_path):
    from actors import registry
    from emulator.scenario import load_scenario

    sc = load_scenario(str(ROOT / "scenarios" / "pccx" / "softmax-asm.yaml"), registry, [])
    res, system, outs = run_with_context(sc)
    assert res["status"] == "finished"
    mem = system.actors["pccx/ddr"].mem
    (sa, _), (pa, _) = outs["scores"], outs["probs"]
    scores = f(mem[sa:sa + 128].view(np.uint16))
    probs = f(mem[pa:pa + 128].view(np.uint16))
    want = np.exp(scores - scores.max())
    want /= want.sum()
    assert np.allclose(probs, want, rtol=0.03, atol=1e-3)
    assert abs(probs.sum() - 1) < 0.02
    bad = tmp_path / "bad.pasm"
    bad.write_text("data x len=8\nGEMV dest_reg=1 lanes=2\n")
    scen = tmp_path / "bad.yaml"
    scen.write_text(f"machine: {{profile: pccx-v002-rtl}}\nworkload: {{kind: asm, params: {{source: {bad}}}}}\n")
    p = emu("run", scen, "--no-bundle", "--quiet")
    assert p.returncode != 0 and "bad.pasm:2" in (p.stdout + p.stderr) and "Traceback" not in p.stderr


# --------------------------------------------------------------------------- GEMV lanes
@pytest.mark.parametrize("scenario,switches,direct", [
    ("program.yaml", ["wfifo2.gemv.wsw2", "wfifo3.gemv.wsw3", "gemv.wsw2.lane0", "gemv.wsw2.lane2",
                      "gemv.wsw3.lane1", "gemv.wsw3.lane3"], []),
    ("program-rtl.yaml", [], ["wfifo2.gemv.lane0", "wfifo3.gemv.lane1"]),
])
def test_explain_shows_gemv_lane_actors_and_wiring(emu, scenario, switches, direct):
    """`emu explain` lists the front, the 4 lane actors, their job/result links and the weight wiring:
    documented HP2 -> switch -> lanes A/C, HP3 -> lanes B/D; as built HP2 -> A, HP3 -> B, C/D no weight port."""
    text = emu("explain", ROOT / "scenarios" / "pccx" / scenario, check=0).stdout
    assert "pccx/gemv [GemvFront]" in text
    for i in range(4):
        assert f"pccx/gemv/lane{i} [GemvLane]" in text
        assert f"gemv.job.lane{i}:" in text and f"gemv.res.lane{i}:" in text
    for name in switches + direct + ["wfifo0.gemm", "wfifo1.gemm"]:
        assert f"  {name}: capacity" in text
    assert ("WeightSwitch" in text) == bool(switches)
    if direct:
        assert "pccx/gemv/lane2 [GemvLane] in=job out=res" in text     # no weight port


def test_gemv_lanes_run_in_parallel_on_their_own_ports():
    """rtl: parallel_lane=1 streams everything through HP2 into lane A; parallel_lane=2 halves the rows per
    lane and uses HP3 for lane B, so the MAC phase halves: 8 rows x 512 = 2048 B = 8 bursts of 16 beats
    (16 cycles each at 32 MAC/clk) on one lane, 4 bursts per lane on two."""
    prof = load_profile("pccx-v002-rtl")
    tc, _ = cyc(prof)
    K, N = 512, 8
    rng = np.random.default_rng(5)
    W = rng.integers(-8, 8, (N, K))
    x = bf(rng.normal(size=K))
    b = ProgramBuilder(prof)
    load_vector(b, x, 0)
    b.push("MEMSET", dest_cache=1, dest_addr=1, a_value=N, b_value=K, c_value=1)
    b.stream_gemv(W, None, 1)
    b.stream_gemv(W, None, 2)
    b.steps.append(("sleep", 100_000_000))
    b.push("GEMV", dest_reg=100, src_addr=0, size_ptr_addr=1, parallel_lane=1)
    b.wait("one")
    b.push("GEMV", dest_reg=101, src_addr=0, size_ptr_addr=1, parallel_lane=2)
    b.wait("two")
    s = run(b, prof)
    fixed = (ceil_div(K, 8) + 3) + prof["gemv"]["pipeline_cycles"] + 1
    assert [r["end"] - r["start"] for r in records(s, "GEMV")] == [(fixed + 8 * 16) * tc, (fixed + 4 * 16) * tc]
    assert [len(s.actors[f"pccx/hp{p}"].spans) for p in (2, 3)] == [8 + 4, 4]
    assert [len(s.actors[f"pccx/gemv/lane{i}"].spans) for i in range(4)] == [8 + 4, 4, 0, 0]
    want = bf(gemv_ref(W, x))
    assert np.array_equal(l2(s, 800, N), want) and np.array_equal(l2(s, 808, N), want)
    assert [r["text"] for r in records(s, "GEMV")] == ["lane0:w0", "lane0:w1 lane1:w1"]


def test_gemv_weight_routing_errors_are_clear():
    prof = load_profile("pccx-v002-rtl")
    b = ProgramBuilder(prof)
    blob = weight_blob(np.ones((8, 16), int), None)
    b.steps.append(("hp", 2, 0, b.put(blob), len(blob), 1))        # lane B's TDEST on lane A's port
    b.push("MEMSET", dest_cache=1, dest_addr=1, a_value=8, b_value=16, c_value=1)
    b.push("MEMSET", dest_cache=0, dest_addr=0, a_value=16, b_value=1, c_value=1)
    b.push("GEMV", dest_reg=10, src_addr=0, size_ptr_addr=1, parallel_lane=1)
    b.wait("x")
    system = System("t", seed=1, mode="timing")
    build_machine(system, prof, b.steps, None)
    res = system.run()
    assert res.status == "error" and "pccx/gemv/lane0" in res.error and "burst for lane 1" in res.error
    from emulator.errors import BuildError
    from emulator.schema import SchemaError
    for lane_ports, text in (([2, 3, 0, None], "must not share"), ([2, 3], "2 entries for 4 lanes"),
                             ([2, 3, 7, None], "port 7 does not exist")):
        with pytest.raises(BuildError, match=text):
            build_machine(System("u", seed=1), load_profile("pccx-v002-rtl", {"gemv": {"lane_ports": lane_ports}}), [])
    with pytest.raises(SchemaError, match="integer >= 0 or null"):
        load_profile("pccx-v002-rtl", {"gemv": {"lane_ports": [2, "x", None, None]}})
    with pytest.raises(ValueError, match="use stream_gemv"):
        ProgramBuilder(prof).stream_weights("gemv", blob)


def test_a_halted_driver_makes_the_run_an_error(emu):
    # one GEMV: its lost DataMover command leaves it waiting for weights no later stream reveals
    p = emu("run", ROOT / "scenarios" / "pccx" / "program.yaml", "--no-bundle", "--quiet", "--set", "workload.params.gemvs=1",
            "--set", "faults=[{kind: drop, link: '*hp2*', count: 1}]", "--set", "machine.overrides.driver.wait_timeout=50us")
    assert p.returncode == 1 and "pccx-program: error" in p.stdout
    assert "pccx/driver halted" in p.stderr and "timeout" in p.stderr


def test_a_lost_weight_stream_is_named_by_the_gemv_that_reads_the_next_one(emu):
    """Three GEMVs, the first DataMover command on HP2 dropped: lane 0 of GEMV#6 (the first GEMV) finds the bursts
    of the stream tagged for instruction #7 (the second GEMV) and says its own weights never came."""
    p = emu("run", ROOT / "scenarios" / "pccx" / "program.yaml", "--no-bundle", "--quiet",
            "--set", "faults=[{kind: drop, link: '*hp2*', count: 1}]", "--set", "machine.overrides.driver.wait_timeout=50us")
    assert p.returncode == 1
    assert "GEMV#6 reads weight stream 1, which the driver streamed for the later instruction #7" in p.stderr
    assert "GEMV#6's own weights never reached the FIFO" in p.stderr


def test_program_check_handles_results_that_do_not_fill_whole_words(emu):
    # N = 37: each GEMV result takes 5 L2 words (40 elements); the reference must use that stride
    p = emu("run", ROOT / "scenarios" / "pccx" / "program.yaml", "--json", "--no-bundle", "--quiet",
            "--set", "workload.params.N=37", check=0)
    import json as _json
    assert _json.loads(p.stdout)["max_abs_err"] == 0


@pytest.mark.parametrize("mode", ["timing", "data"])
def test_head_parallel_gemv_runs_each_lane_on_its_own_head(mode):
    """Documented profile (gemv.head_parallel): parallel_lane = bit 4 | 4 gives lane i the activation at
    src + i * ceil(K/8) words and its result at dest + i * S (S = max(ceil(N/8), weight-shape Z) = 16 words);
    the one weight stream, dealt over HP2/HP3 (first half on HP2), reaches every lane (multicast); each lane's
    result has its own e_max (an EXP with sub_emax on head 2 gives exp(0) = 1 at head 2's maximum)."""
    prof = load_profile("pccx-v002-documented")
    K, N, G, Z = 512, 64, 4, 16
    rng = np.random.default_rng(11)
    x = bf(rng.normal(size=G * K))
    W = rng.integers(-8, 8, (N, K))
    sc = bf(rng.uniform(0.002, 0.02, N))
    b = ProgramBuilder(prof)
    load_vector(b, x, 0)
    b.push("MEMSET", dest_cache=0, dest_addr=1, a_value=K, b_value=1, c_value=1)
    b.push("MEMSET", dest_cache=1, dest_addr=1, a_value=N, b_value=1, c_value=Z)
    b.stream_gemv(W, sc, isa.HEAD_AXIS | G)
    b.push("GEMV", dest_reg=300, src_addr=0, w_scale=1, findemax=1, size_ptr_addr=1, shape_ptr_addr=1,
           parallel_lane=isa.HEAD_AXIS | G)
    b.wait("gemv")
    b.push("CVO", cvo_func=isa.CVO_FUNCS["EXP"], src_addr=(300 + 2 * Z) * 8, dst_addr=4000 * 8, length=N, sub_emax=1,
           **{"async": 0})
    b.wait("exp")
    s = run(b, prof, mode)
    hp = {p: sum(e - t for t, e, _st in s.actors[f"pccx/hp{p}"].spans) for p in (2, 3)}
    assert hp[2] == hp[3] > 0                                   # the stream split in halves over the two ports
    assert [r["text"] for r in records(s, "GEMV")] == ["lane0:w0 lane1:w0 lane2:w0 lane3:w0"]
    if mode == "data":
        for i in range(G):
            want = bf(gemv_ref(W, x[i * K:(i + 1) * K], sc))
            assert np.array_equal(l2(s, (300 + i * Z) * 8, N), want), i
        y2 = f(l2(s, (300 + 2 * Z) * 8, N))
        e = f(l2(s, 4000 * 8, N))
        assert e[int(np.argmax(y2))] == 1.0 and e.max() == 1.0
