"""Composite GEMMs with TCM operands and outputs (seed §B.3), and the pipelined HBM pseudo-channel."""
import numpy as np
import trio

from emulator import numerics
import pytest

from actors.ahbm.costs import dispatch_ps, pc_occupancy_ps, pc_ps
from actors.ahbm.scheduler import panel_budget, panel_plan
from actors.ahbm.tiles import plan
from actors.ahbm.tl.kernel_registry import register_kernel
from actors.ahbm.params import Params
from actors.ahbm.testkit import hbm_fetch, hbm_place, machine, profile
from emulator.clock import VirtualClock
from emulator.testing import run

M, K, N = 40, 96, 72          # several M, K and N tiles, ragged edges on every axis
A_ADDR, B_ADDR, OUT = 0, 1 << 20, 2 << 20
PE = "sip0/cube00/pe0"


def _inputs():
    rng = np.random.default_rng(5)
    return rng.standard_normal((M, K)).astype(np.float16), rng.standard_normal((K, N)).astype(np.float16)


def k_composite(*, where, out, tl, via_math=True):
    """``where``: which operands are TCM-resident (``a``, ``b``, both, none); the result stored to OUT, through a
    MATH op (``via_math``) or straight from where the composite left it."""
    a = tl.load(A_ADDR, (M, K)) if "a" in where else tl.ref(A_ADDR, (M, K))
    b = tl.load(B_ADDR, (K, N)) if "b" in where else tl.ref(B_ADDR, (K, N))
    tl.wait(*[h for h, w in ((a, "a"), (b, "b")) if w in where])
    c = tl.wait(tl.composite("gemm", a=a, b=b, out=out, epilogue=[("scale", 0.5)]))
    tl.store(OUT, c * 1.0 if via_math else c)


def _run(where, out):
    A, B = _inputs()

    def setup(pes, prm):
        hbm_place(pes[0], prm, A_ADDR, A)
        hbm_place(pes[0], prm, B_ADDR, B)

    system, prm, cube, host = machine(register_kernel(k_composite), lambda pe: {"where": where, "out": out},
                                      setup=setup)
    return system, prm, cube, A, B


def _dma_commands(system) -> int:
    """DMA commands the PE's engine served: one ``setup`` busy span each (dma.py)."""
    return system.actors[f"{PE}/dma"].busy_spans


@pytest.mark.parametrize("where,out", [("ab", "tcm"), ("a", "tcm"), ("", "tcm"), ("a", "hbm")])
async def test_composite_with_tcm_operands_matches_numpy(vclock, where, out):
    system, prm, cube, A, B = _run(where, out)
    r = await run(system)
    assert r.status == "finished", r.error
    got = hbm_fetch(cube[0], prm, OUT, (M, N), "<f4")
    want = 0.5 * numerics.matmul(A, B, acc=np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("where", ["ab", "a", ""], ids=["batch", "held-hbm-b", "held-hbm-ab"])
def test_pipeline_composite_result_is_in_the_tcm_for_the_engine_that_reads_it(where):
    """At fidelity pipeline (timing mode) the PE scheduler writes no descriptor of a TCM result (one GemmBatch,
    or the held array's block stream); the tl runtime writes it when another engine reads the result, here
    the DMA store (else: "TCM read of unknown buffer") -- at the block model's end time and DMA bytes.  Each
    run on its own virtual clock (both start at 0)."""
    ends = {}
    for fidelity in ("block", "pipeline"):
        system, prm, cube, _ = machine(register_kernel(k_composite), lambda pe: {"where": where, "out": "tcm",
                                       "via_math": False}, mode="timing", fidelity=fidelity)
        r = trio.run(system.run_async, None, clock=VirtualClock())
        assert r.status == "finished", r.error
        ends[fidelity] = r.end_time_ps, system.actors[f"{PE}/dma"].bytes_moved
    assert ends["pipeline"] == ends["block"]


async def test_tcm_resident_operands_issue_no_dma(vclock):
    """DMA commands = the kernel's own loads/stores + the scheduler's per-block DMAs for HBM operands only."""
    TM, TK, TN = (32, 64, 32)
    steps = plan(M, K, N, (TM, TK, TN))
    counts = {}
    for where, out in (("ab", "tcm"), ("a", "tcm"), ("", "tcm"), ("", "hbm")):
        system, prm, cube, A, B = _run(where, out)
        assert tuple(prm.tile) == (TM, TK, TN)
        r = await run(system)
        assert r.status == "finished", r.error
        counts[(where, out)] = _dma_commands(system)
    own = {"ab": 2, "a": 1, "": 0}        # the kernel's tl.loads
    # HBM B: the first step's block alone, the other blocks in panels (one DMA each, scheduler.py)
    n_panels = len(panel_plan(steps[1:], 2, panel_budget(prm, 2)))
    assert 0 < n_panels < sum(s.load_b for s in steps[1:])
    b_loads = 1 + n_panels
    a_loads = sum(s.load_a for s in steps)
    stores = len({s.tile for s in steps})
    # kernel: loads + one final store (+ the load of an HBM result before its MATH use)
    assert counts[("ab", "tcm")] == own["ab"] + 1                      # the composite itself: no DMA at all
    assert counts[("a", "tcm")] == own["a"] + 1 + b_loads              # B blocks streamed from HBM only
    assert counts[("", "tcm")] == 1 + a_loads + b_loads
    assert counts[("", "hbm")] == 1 + a_loads + b_loads + stores + 1   # C blocks stored, result loaded back
    assert b_loads > 0 and a_loads > 0 and stores > 1


def k_stream(*, n, tl):
    """``n`` back-to-back loads of one burst each on one pseudo-channel, issued without waiting."""
    t0 = tl.now()
    hs = [tl.load(i * 256 * 8, (128,), "<f2") for i in range(n)]   # burst 256 B, 8 PCs: all on PC 0
    tl.wait(*hs)
    tl.report("elapsed", tl.now() - t0)


async def test_pseudo_channel_pipelines_requests(vclock):
    """n one-burst loads in flight on one pseudo-channel (DMA with n outstanding, a 2-cycle setup so they reach
    the channel faster than its bus drains them): the channel overlaps each request's access latency with the
    bursts ahead of it, so the stream ends ``latency + n x burst`` after the first request reaches it
    (costs.pc_occupancy_ps), not ``n x (latency + burst)`` (a channel held for the whole access)."""
    n = 4
    over = {"dma": {"outstanding": n, "setup_cycles": 2}}
    system, prm, cube, host = machine(register_kernel(k_stream), lambda pe: {"n": n}, overrides=over)
    r = await run(system)
    assert r.status == "finished", r.error
    pc = system.actors[f"{PE}/hbm/pc0"]
    occ = pc_occupancy_ps(256, prm)
    assert pc.busy_spans == n and pc.busy_ps == n * occ               # the bus, burst by burst
    dd = dispatch_ps("dma", prm)
    assert max(dd, prm.dma_setup) < occ                               # requests arrive faster than bursts drain
    first = dd + prm.dma_setup                                        # first request reaches PC 0
    elapsed = system.reports[f"{PE}/cpu"]["elapsed"]
    assert elapsed == first + prm.hbm_latency + n * occ
    assert elapsed < first + n * pc_ps(256, prm)                      # the occupancy-for-the-whole-access model


async def test_gemm_engine_pipelines_back_to_back_commands(vclock):
    """Two GEMM tiles issued without waiting: the second streams behind the first, so both complete
    ``fill_drain + core_1 + core_2`` after the first starts (costs.gemm_cycles), the same as one command
    doing both blocks; a lone command still takes ``fill_drain + core``."""
    from actors.ahbm.costs import gemm_core_cycles, gemm_ps
    from actors.ahbm.testkit import build, log
    coord = (0, 0, 0)
    script = [
        {"op": "gemm", "a": "a", "b": "b", "acc": "c1", "m": 32, "k": 64, "n": 32, "async": True, "label": "g1"},
        {"op": "gemm", "a": "a", "b": "b", "acc": "c2", "m": 32, "k": 64, "n": 32, "async": True, "label": "g2"},
        {"op": "wait", "label": "w"},
        {"op": "gemm", "a": "a", "b": "b2", "acc": "c3", "m": 32, "k": 64, "n": 64, "label": "one"},
    ]
    system, m, place = build({coord: script})
    for name, shape in (("a", (32, 64)), ("b", (64, 32)), ("b2", (64, 64))):
        place.tcm_put(coord, name, np.ones(shape, np.float16))
    res = await system.run_async()
    assert res.status == "finished", res.error
    prm = m.pe(*coord).gemm.prm
    _, _, issued1, _ = log(m, coord, "g1")
    _, _, _, waited = log(m, coord, "w")
    _, _, issued, done = log(m, coord, "one")
    core = prm.pe_clk.ps(gemm_core_cycles(32, 64, 32, prm))
    assert waited - issued1 == prm.pe_clk.ps(prm.fill_drain) + 2 * core
    assert done - issued == gemm_ps(32, 64, 64, prm) == waited - issued1      # same work, same time
    assert m.pe(*coord).gemm.array_ps == 4 * core                            # the array: core cycles only


def _gqa_decode(gemm):
    from actors.ahbm.params import pe_name
    from actors.ahbm.testkit import build_workload
    from actors.ahbm.tl.gqa_workload import WORKLOAD
    params = {"case": "decode", "C": 1, "P": 1, "G": 8, "d": 128, "context": 256, "tile": 64, "gemm": gemm}
    system, prof, p, ctx = build_workload(WORKLOAD, params, name="gqa", mode="timing")
    result = system.run()
    assert result.status == "finished", result.error
    pe = pe_name(*ctx.layout.coords[0])
    return system, WORKLOAD.check(system, prof, p, result, context=ctx), pe


def test_gqa_decode_composite_reads_only_kv_blocks_and_costs_the_dot_gemm_time():
    """GQA decode no-SP (G = 8, d = 128): with q and P read from the TCM and S, O written there (seed §B.3),
    the composite path's DMAs are the q load, the K/V blocks the scheduler streams, and the output store;
    and its per-block GEMM commands keep the array busy exactly as long as the dot path's one command per
    GEMM (pipelined array, costs.gemm_cycles)."""
    sys_c, chk_c, pe = _gqa_decode("composite")
    sys_d, chk_d, _ = _gqa_decode("dot")
    prm = Params.of(profile())
    tiles, M, d, T = 256 // 64, 8, 128, 64
    kv_blocks = sum(s.load_b for s in plan(M, d, T, prm.tile)) + sum(s.load_b for s in plan(M, T, d, prm.tile))
    assert sum(s.load_a for s in plan(M, d, T, prm.tile)) > 0          # an HBM q would have cost A loads
    sched = sys_c.actors[f"{pe}/sched"]
    # cold composites stream their K/V blocks one DMA each; the ones taken ahead load B panels (tiles.panels)
    assert sched.taken_ahead > 0 and sched.panel_loads > 0
    qk, pv = plan(M, d, T, prm.tile), plan(M, T, d, prm.tile)
    budget = panel_budget(prm, 2)
    blocks = sum(s.load_b for s in qk)
    n_rest = len(panel_plan(qk[1:], 2, budget))   # the first block alone, the rest in panels
    assert blocks == sum(s.load_b for s in pv) and n_rest == len(panel_plan(pv[1:], 2, budget))
    assert 1 + n_rest < blocks and tiles * kv_blocks == 2 * tiles * blocks
    cold = 2 * tiles - sched.taken_ahead
    assert sched.block_loads == cold    # taken ahead: the first block is a (prefetched) panel of its own
    assert sched.panel_loads == sched.taken_ahead * (1 + n_rest) + cold * n_rest
    assert _dma(sys_c, pe) == 1 + sched.block_loads + sched.panel_loads + 1
    # the prefetch really is ahead: every taken-ahead composite's first panel DMA left before the
    # composite in front of it completed
    assert sched.min_panel_lead_ps is not None and sched.min_panel_lead_ps > 0
    assert sys_c.actors[f"{pe}/gemm"].array_ps == sys_d.actors[f"{pe}/gemm"].array_ps > 0
    assert chk_c["kv_bytes_read"] == chk_d["kv_bytes_read"]


def _dma(system, pe) -> int:
    return system.actors[f"{pe}/dma"].busy_spans


def k_back_to_back(*, tl):
    """Three composites issued without waiting (the scheduler takes each next one ahead and starts it
    behind the previous one's last GEMM), different plans so buffer parities collide; all results stored."""
    a, b = tl.ref(A_ADDR, (M, K)), tl.ref(B_ADDR, (K, N))
    cs = [tl.composite("gemm", a=a, b=b),
          tl.composite("gemm", a=tl.ref(A_ADDR, (8, 64)), b=tl.ref(B_ADDR, (64, 64)), epilogue=[("scale", 2.0)]),
          tl.composite("gemm", a=a, b=b, epilogue=[("scale", 0.5)])]
    off = 0
    for c in cs:
        r = tl.wait(c) * 1.0
        tl.store(OUT + off, r)
        off += r.shape[0] * r.shape[1] * 4


async def test_back_to_back_composites_taken_ahead_match_numpy(vclock):
    A, B = _inputs()

    def setup(pes, prm):
        hbm_place(pes[0], prm, A_ADDR, A)
        hbm_place(pes[0], prm, B_ADDR, B)

    system, prm, cube, host = machine(register_kernel(k_back_to_back), lambda pe: {}, setup=setup)
    r = await run(system)
    assert r.status == "finished", r.error
    assert system.actors[f"{PE}/sched"].taken_ahead >= 2
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    a2, b2 = A64.reshape(-1)[:8 * 64].reshape(8, 64), B64.reshape(-1)[:64 * 64].reshape(64, 64)
    off = 0
    mm = lambda x, y: numerics.matmul(x, y, acc=np.float64)   # noqa: E731  (no BLAS: any OpenBLAS kernel)
    for want in (mm(A64, B64), 2.0 * mm(a2, b2), 0.5 * mm(A64, B64)):
        got = hbm_fetch(cube[0], prm, OUT + off, want.shape, "<f4")
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
        off += want.size * 4
