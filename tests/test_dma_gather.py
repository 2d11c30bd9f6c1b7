"""Scatter-gather DMA (protocols.ahbm.DmaGather, tl.load_parts / tl.store_parts): one command for several
TCM buffers that are back to back in HBM (issue 22: the Ring prefill's spilled m and l).

Data: every part lands whole and in order, and stores write them back to back.  Timing: one gather of
parts costs what one DMA of their total bytes costs (costs.dma_ps: one setup, one access per
pseudo-channel), which is less than one DMA per part.
"""
import numpy as np

from actors.ahbm.costs import dispatch_ps, dma_ps, stripe
from actors.ahbm.tl.kernel_registry import register_kernel
from actors.ahbm.testkit import hbm_fetch, hbm_place, machine
from emulator.testing import run

RNG = np.random.default_rng(3)
O = RNG.standard_normal((16, 8)).astype(np.float32)
M = RNG.standard_normal((16, 1)).astype(np.float32)
L = RNG.standard_normal((16, 1)).astype(np.float32)
H = RNG.standard_normal((4, 8)).astype(np.float16)
BASE, OUT = 0, 1 << 20
PARTS = [((16, 8), "<f4"), ((16, 1), "<f4"), ((16, 1), "<f4"), ((4, 8), "<f2")]
TIMES = {}


def _place(pes, prm):
    hbm_place(pes[0], prm, BASE, np.frombuffer(b"".join(x.tobytes() for x in (O, M, L, H)), np.uint8))


def k_round_trip(*, tl):
    o, m, l, h = tl.load_parts(BASE, PARTS)
    tl.store_parts(OUT, [m * 2.0, o, h, l])


async def test_parts_load_whole_and_store_back_to_back(vclock):
    system, prm, cube, _ = machine(register_kernel(k_round_trip), lambda pe: {}, setup=_place)
    r = await run(system)
    assert r.status == "finished", r.error
    at = OUT
    for want in (M * 2.0, O, H, L):
        got = hbm_fetch(cube[0], prm, at, want.shape, want.dtype)
        np.testing.assert_array_equal(got, want)
        at += want.nbytes


def k_timed(*, tl):
    t0 = tl.now()
    tl.wait(*tl.load_parts(BASE, PARTS))
    t1 = tl.now()
    for shape, dtype in PARTS:   # the same bytes, one DMA per tensor
        tl.wait(tl.load(BASE, shape, dtype))
    TIMES.update(gather=t1 - t0, separate=tl.now() - t1, dmas=tl.counts["dma"])


async def test_a_gather_costs_one_dma_of_its_total_bytes(vclock):
    system, prm, _, _ = machine(register_kernel(k_timed), lambda pe: {}, setup=_place, mode="timing")
    r = await run(system)
    assert r.status == "finished", r.error
    total = sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in PARTS)
    per_pc = [sum(n for _, n in pieces) for pieces in stripe(BASE, 1, total, total, prm.burst, prm.pcs)]
    one = dma_ps(per_pc, prm)
    assert TIMES["dmas"] == 1 + len(PARTS)
    # the DMA, its dispatch and the zero-latency completion: nothing per part
    assert TIMES["gather"] == dispatch_ps("dma", prm) + one
    assert TIMES["separate"] > TIMES["gather"] + (len(PARTS) - 1) * prm.dma_setup


def k_bad(*, tl):
    tl.load_parts(BASE, [])


async def test_empty_parts_is_a_kernel_error(vclock):
    system, _, _, _ = machine(register_kernel(k_bad), lambda pe: {})
    r = await run(system)
    assert r.status == "error" and "load_parts needs at least one part" in r.error, r.error
