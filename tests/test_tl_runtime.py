"""tl runtime behaviour on virtual time: scratch recycling, lazy loads, composites, dispatch costs."""
import numpy as np
import pytest

from actors.ahbm.costs import dma_ps, dispatch_ps, gemm_ps, math_ps, stripe
from actors.ahbm.tl.kernel_registry import register_kernel
from actors.ahbm.tl.scratch import scheduler_reserve
from actors.ahbm.testkit import hbm_fetch, hbm_place, machine, params
from emulator.testing import run

ZERO_DISPATCH = {"cpu": {"dispatch_cycles": {k: 0 for k in ("dma", "gemm", "math", "composite", "ipcq", "noc")}}}


# ------------------------------------------------------------------ scratch_scope
def k_tiles(*, tiles, scoped, tl):
    """Each tile makes 4 temporaries of 64 KiB (fp32 [128, 128]) and folds into a carried sum."""
    acc = tl.zeros((128, 128))
    for j in range(tiles):
        if scoped:
            with tl.scratch_scope():
                x = tl.full((128, 128), float(j))
                y = tl.exp(x * 0.0)
                acc = acc + y * 1.0
        else:
            x = tl.full((128, 128), float(j))
            y = tl.exp(x * 0.0)
            acc = acc + y * 1.0
    tl.store(0, acc)


async def test_scratch_scope_recycles_past_the_tcm_size(vclock):
    tiles = 40   # 40 tiles x 4 x 64 KiB = 10 MiB of cumulative temporaries, TCM = 1 MiB
    system, prm, cube, host = machine(register_kernel(k_tiles), lambda pe: {"tiles": tiles, "scoped": True})
    r = await run(system)
    assert r.status == "finished", r.error
    stats = system.reports["io/host"]["pes"]["sip0/cube00/pe0"]
    assert tiles * 4 * 65536 > prm.tcm_bytes
    assert stats["tcm_peak_B"] <= 7 * 65536 < prm.tcm_bytes - scheduler_reserve(prm)
    np.testing.assert_array_equal(hbm_fetch(cube[0], prm, 0, (128, 128), "<f4"), np.full((128, 128), tiles))


async def test_same_loop_without_scratch_scope_overflows_the_tcm(vclock):
    system, prm, cube, host = machine(register_kernel(k_tiles), lambda pe: {"tiles": 40, "scoped": False})
    r = await run(system)
    assert r.status == "error"
    assert "KernelError" in r.error and "TCM overflow" in r.error and "scratch_scope" in r.error
    assert "tests/test_tl_runtime.py" in r.error


def k_collect(*, n, tl):
    """Per item a 64 KiB temporary and one 4 KiB result kept in a list that was empty before the scopes."""
    kept = []
    for j in range(n):
        with tl.scratch_scope():
            tmp = tl.full((128, 128), float(j))
            kept.append(tl.sum(tmp, axis=-1))
    out = kept[0]
    for x in kept[1:]:
        out = out + x
    tl.store(0, out)


async def test_a_list_empty_before_the_scope_keeps_what_is_appended_inside(vclock):
    """The batched decode's pattern (kernels/gqa_batched.py): results collected in a list bound (empty) before
    the scopes outlive them, the temporaries do not."""
    n = 8
    system, prm, cube, host = machine(register_kernel(k_collect), lambda pe: {"n": n})
    r = await run(system)
    assert r.status == "finished", r.error
    stats = system.reports["io/host"]["pes"]["sip0/cube00/pe0"]
    assert stats["tcm_peak_B"] < 3 * 65536        # one temporary at a time, not n
    want = sum(128.0 * j for j in range(n))
    np.testing.assert_array_equal(hbm_fetch(cube[0], prm, 0, (128, 1), "<f4"), np.full((128, 1), want))


# ------------------------------------------------------------------ lazy load overlap
N_LOAD = (256, 256)      # fp16: 128 KiB
GA, GB = (32, 64), (64, 32)


def k_overlap(*, lazy, tl):
    a = tl.load(1 << 20, GA)
    b = tl.load(2 << 20, GB)
    tl.wait(a, b)
    t0 = tl.now()
    x = tl.load(0, N_LOAD)
    if not lazy:
        tl.wait(x)
    y = tl.dot(a, b)
    tl.wait(x)
    tl.report("elapsed", tl.now() - t0)


async def test_lazy_load_overlaps_compute_by_the_modelled_amount(vclock):
    times = {}
    for lazy in (True, False):
        system, prm, cube, host = machine(register_kernel(k_overlap), lambda pe, lazy=lazy: {"lazy": lazy})
        r = await run(system)
        assert r.status == "finished", r.error
        times[lazy] = system.reports["sip0/cube00/pe0/cpu"]["elapsed"]
    prm = params()
    nbytes = N_LOAD[0] * N_LOAD[1] * 2
    t_load = dma_ps([sum(l for _, l in pcs) for pcs in stripe(0, 1, nbytes, nbytes, prm.burst, prm.pcs)], prm)
    t_gemm = gemm_ps(32, 64, 32, prm)
    d_dma, d_gemm = dispatch_ps("dma", prm), dispatch_ps("gemm", prm)
    assert times[False] == d_dma + t_load + d_gemm + t_gemm                 # serial sum
    assert times[True] == d_dma + max(t_load, d_gemm + t_gemm)             # overlapped
    assert times[False] - times[True] == min(t_load, d_gemm + t_gemm) > 0  # the modelled saving


# ------------------------------------------------------------------ composites
def k_composites(*, tl):
    t0 = tl.now()
    h1 = tl.composite("gemm", a=tl.ref(0, (64, 128)), b=tl.ref(1 << 20, (128, 64)))
    t1 = tl.now()
    h2 = tl.composite("gemm", a=tl.ref(0, (64, 128)), b=tl.ref(1 << 20, (128, 64)))
    t2 = tl.now()
    c1, c2 = h1.pending, h2.pending
    tl.wait(h1, h2)
    d1, d2 = tl.be.completed[c1], tl.be.completed[c2]
    tl.report("t", [t0, t1, t2, d1["start"], d1["end"], d2["start"], d2["end"]])


async def test_composite_returns_at_once_and_two_pipeline_on_the_scheduler(vclock):
    system, prm, cube, host = machine(register_kernel(k_composites), lambda pe: {})
    r = await run(system)
    assert r.status == "finished", r.error
    t0, t1, t2, s1, e1, s2, e2 = system.reports["sip0/cube00/pe0/cpu"]["t"]
    d = dispatch_ps("composite", prm)
    assert t1 - t0 == d and t2 - t1 == d          # the CPU pays only the descriptor push
    assert t1 < e1 and t2 < e1                    # both issued before the first GEMM finished
    # the scheduler takes the second ahead while the first computes (its B loads prefetched, its first
    # GEMM behind the first's last, scheduler.py): it ends after the first, sooner than a lone one would
    assert s1 < s2 < e1 < e2
    assert e2 - e1 < e1 - s1


# ------------------------------------------------------------------ dispatch cost model
def k_dispatch(*, tl):
    t0 = tl.now()
    tl.zeros((1,))
    t1 = tl.now()
    tl.composite("gemm", a=tl.ref(0, (32, 64)), b=tl.ref(1 << 20, (64, 32)))
    t2 = tl.now()
    tl.report("t", [t1 - t0, t2 - t1])


@pytest.mark.parametrize("zero", [False, True])
async def test_dispatch_cost_per_op_kind_and_zero_setting(vclock, zero):
    over = ZERO_DISPATCH if zero else None
    system, prm, cube, host = machine(register_kernel(k_dispatch), lambda pe: {}, overrides=over)
    r = await run(system)
    assert r.status == "finished", r.error
    prim, comp = system.reports["sip0/cube00/pe0/cpu"]["t"]
    assert prim == dispatch_ps("math", prm) + math_ps("copy", 1, prm)
    assert comp == dispatch_ps("composite", prm)
    if zero:
        assert comp == 0
    else:
        assert comp > dispatch_ps("math", prm) > 0   # descriptor push >> primitive op (seed §9 item 6)


# ------------------------------------------------------------------ CUBE NOC peers
X = np.arange(64 * 32, dtype=np.float32).reshape(64, 32) / 100


def k_noc(*, tl):
    if tl.program_id(1) == 0:
        x = tl.load(0, (64, 32), "<f4")
        tl.wait(x)
        tl.report("t_send", tl.now())
        tl.send([0, 1, 0], x)
        y = tl.recv([0, 1, 0], (64, 32))
        tl.store(1 << 20, y)
    else:
        x = tl.recv_async([0, 0, 0], (64, 32))
        tl.wait(x)
        tl.report("t_recv", tl.now())
        tl.send([0, 0, 0], x * 2.0)


async def test_noc_send_recv_between_cubes(vclock):
    from protocols.ahbm import NocPacket, payload
    from protocols.codec import encode
    from actors.ahbm.cpu import PKT_ID0
    from emulator.units import transfer_ps
    system, prm, cube, m = machine(register_kernel(k_noc), lambda c: {}, coords=[(0, 0, 0), (0, 1, 0)])
    hbm_place(cube[0], prm, 0, X)
    r = await run(system)
    assert r.status == "finished", r.error
    np.testing.assert_array_equal(hbm_fetch(cube[0], prm, 1 << 20, (64, 32), "<f4"), X * 2)
    S = encode(NocPacket(PKT_ID0 + prm.pes, [0, 0, 0], [0, 1, 0], 0, payload(X)))[1]
    h = 1
    closed = (2 * (transfer_ps(S, prm.attach_bw) + prm.link_ps) + (h + 1) * prm.router_ps
              + h * (transfer_ps(S, prm.cube_link_bw) + prm.cube_link_latency))   # actors/ahbm/noc.py docstring
    t_send = system.reports["sip0/cube00/pe0/cpu"]["t_send"]
    t_recv = system.reports["sip0/cube01/pe0/cpu"]["t_recv"]
    assert t_recv - t_send == dispatch_ps("noc", prm) + closed


# ------------------------------------------------------------------ completion credits (no deep completion queue)
N_CHAIN = 60
CHAIN_SHAPE = (32, 64)   # 8 KiB fp32: MATH op of 8 + 32 cycles, 5x the 8-cycle dispatch


def k_chain(*, tl):
    x = tl.zeros(CHAIN_SHAPE)
    tl.wait(x)
    t0 = tl.now()
    for _ in range(N_CHAIN):       # 60 lazy MATH commands, never waited for in between
        x = x * 1.0
    tl.wait(x)
    tl.report("elapsed", tl.now() - t0)


async def test_long_lazy_chain_runs_with_bounded_completion_queues(vclock):
    """Far more commands in flight than the 16-deep command queue and the 17-entry completion queue: the
    CPU's completion credits keep the engine fed, no deadlock, and no time lost against the engine bound."""
    from actors.ahbm.builder import completion_depth
    system, prm, cube, m = machine(register_kernel(k_chain), lambda c: {})
    r = await run(system)
    assert r.status == "finished", r.error
    t_op, d = math_ps("scale", CHAIN_SHAPE[0] * CHAIN_SHAPE[1], prm), dispatch_ps("math", prm)
    assert t_op > d                                   # engine-bound: the MATH engine never idles
    assert system.reports["sip0/cube00/pe0/cpu"]["elapsed"] == d + N_CHAIN * t_op
    cpu = m.pe(0, 0, 0).cpu
    (math_done,) = [ln for ln in cpu.done.links if ln.src.owner.name.endswith("/math")]
    assert math_done.capacity == completion_depth(prm, "math") == prm.cmd_depth + 1 == 17
    assert math_done.blocked_count == 0                # the engine never waited on a full completion queue


# ------------------------------------------------------------------ one machine, one CPU class: scripts and kernels
def k_small(*, tl):
    tl.store(0, tl.full((4, 4), 1.5) * 2.0)
    tl.report("sip", tl.program_id(2))


async def test_scripts_and_kernels_share_one_machine_and_cpu_class(vclock):
    from actors.ahbm.builder import build_machine
    from actors.ahbm.cpu import PeCpu
    from actors.ahbm.tl.launcher import kernel_launches
    from actors.ahbm.testkit import profile
    from emulator.system import System
    prof = profile({"sips": 2})
    prm = params({"sips": 2})
    system = System("mixed", mode="data")
    kernels = kernel_launches(register_kernel(k_small), [(1, 1, 7)], lambda c: {}, lambda c: (c[2], c[1], c[0]),
                              (prm.P, prm.cubes, prm.sips))
    script = [{"op": "math", "fn": "exp", "srcs": ["x"], "out": "y", "label": "exp"}]
    m = build_machine(system, prof, scripts={(0, 0, 3): script}, kernels=kernels)
    m.pe(0, 0, 3).tcm.preload("x", np.zeros((2, 64), np.float32))
    r = await run(system)
    assert r.status == "finished", r.error
    assert all(type(pe.cpu) is PeCpu for pe in m.pes.values())
    host = system.reports["io/host"]
    assert host["pes_done"] == 2 and list(host["pes"]) == ["sip1/cube01/pe7"]
    assert m.host.logs["sip0/cube00/pe3/cpu"][0][0] == "exp"
    assert system.reports["sip1/cube01/pe7/cpu"]["sip"] == 1
    np.testing.assert_array_equal(hbm_fetch(m.pe(1, 1, 7), prm, 0, (4, 4), "<f4"), np.full((4, 4), 3.0))
    np.testing.assert_array_equal(m.pe(0, 0, 3).tcm.bufs["y"], np.ones((2, 64), np.float32))


# ------------------------------------------------------------------ the portal (issue #13)
async def test_through_portal_steps_like_greenback_await(vclock):
    """tl/runtime._await steps a suspending coroutine through the task's greenback portal (its
    greenlet's parent) as greenback.await_ does: same values, same virtual times, errors and a
    cancellation thrown in reach the coroutine and come out of the synchronous caller."""
    import greenback
    import greenlet
    import trio
    from greenback import _impl as greenback_impl

    from actors.ahbm.tl.runtime import _await
    from emulator.clock import sleep

    async def step(n):
        for _ in range(n):
            await sleep(10)
        return n * 10

    async def fails():
        await sleep(5)
        raise ValueError("inside")

    seen = {}

    async def main():
        await greenback.ensure_portal()
        task = trio.lowlevel.current_task()
        seen["portal"] = greenlet.getcurrent().parent is greenback_impl.task_portals[task]
        t0 = trio.current_time()
        seen["ours"] = (_await(step(3)), trio.current_time() - t0)
        t0 = trio.current_time()
        seen["greenback"] = (greenback.await_(step(3)), trio.current_time() - t0)
        try:
            _await(fails())
        except ValueError as e:
            seen["error"] = str(e)
        with trio.move_on_after(25) as scope:
            _await(step(10))
        seen["cancelled"] = scope.cancelled_caught

    await main()
    assert seen == {"portal": True, "ours": (30, 30), "greenback": (30, 30), "error": "inside", "cancelled": True}


async def test_a_waiting_tl_call_outside_a_portal_is_a_clear_error(vclock):
    """Without the portal run_kernel enters, a tl call that has to wait says so (not an AttributeError)."""
    from actors.ahbm.tl.runtime import _await
    from emulator.clock import sleep

    assert _await(_done()) == 7        # a call that does not wait needs no portal
    with pytest.raises(RuntimeError, match="outside a kernel: its Trio task has no greenback portal"):
        _await(sleep(10))
    await sleep(20)                    # the abandoned wait was undone: the task runs on normally


async def _done():
    return 7
