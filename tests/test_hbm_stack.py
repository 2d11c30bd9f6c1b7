"""memory.HbmStack (``fidelity: pipeline``, timing mode): a PE's pseudo-channels as one actor keep the
per-channel FIFO pipeline of memory.HbmChannel exactly.

Two block accesses that share channels and overlap in time: the second's pieces on the shared channels
wait for the first's bursts there (``max(t + access_latency, end of that channel's previous burst)``),
its pieces on channels of its own do not; each access is answered once, when its last burst ends.
"""
from actors.ahbm.costs import pc_occupancy_ps, stripe
from actors.ahbm.memory import HbmStack
from actors.ahbm.testkit import params
from emulator.declare import params_for
from emulator.system import System
from emulator.testing import Sink, Source, run
from protocols.ahbm import HbmReq

PRM = params()


def _bytes(addr, row_bytes, rows=1):
    """Bytes per channel of a block of ``rows`` rows, one channel stride apart (costs.stripe)."""
    pitch = PRM.burst * PRM.pcs
    return [sum(ln for _, ln in p) for p in stripe(addr, rows, row_bytes, pitch, PRM.burst, PRM.pcs)]


def _closed_form(accesses):
    """Per-channel FIFO: ``[(t, nbytes per pc), ...]`` in arrival order -> each access's answer time."""
    free = [0] * PRM.pcs
    out = []
    for t, nbytes in accesses:
        done = 0
        for pc, nb in enumerate(nbytes):
            if nb:
                free[pc] = max(t + PRM.hbm_latency, free[pc]) + pc_occupancy_ps(nb, PRM)
                done = max(done, free[pc])
        out.append(done)
    return out


async def test_two_overlapping_accesses_on_shared_channels(vclock):
    burst = PRM.burst
    a = _bytes(0, 4 * burst, rows=4)            # channels 0-3, four bursts each
    b = _bytes(2 * burst, 4 * burst)            # channels 2-5, one burst each
    assert [i for i, n in enumerate(a) if n] == [0, 1, 2, 3] and [i for i, n in enumerate(b) if n] == [2, 3, 4, 5]
    tb = 10_000                                 # b arrives while a's bursts still hold channels 2 and 3
    system = System("hbm-stack", mode="timing")
    stack = system.add(HbmStack("pe/hbm/stack", prm=params_for(HbmStack, PRM)))
    dma = system.add(Source("dma", [(0, HbmReq(1, "read", a, "dma"))]))
    port = system.add(Source("port", [(tb, HbmReq(1, "write", b, "port"))]))
    got = {c: system.add(Sink(f"sink_{c}", expect=1)) for c in ("dma", "port")}
    system.connect(dma.out, stack.req, capacity=16)
    system.connect(port.out, stack.req, capacity=16)
    for c in ("dma", "port"):
        system.connect(stack.resp[c], got[c].inp, capacity=16)
    r = await run(system)
    assert r.status == "finished", r.error
    want = _closed_form([(0, a), (tb, b)])
    assert [got["dma"].times[0], got["port"].times[0]] == want
    occ1 = pc_occupancy_ps(burst, PRM)
    assert want[1] == 4 * occ1 + PRM.hbm_latency + occ1 > tb + PRM.hbm_latency + occ1   # b waited on 2 and 3
    assert stack.pc_busy_ps == [4 * occ1] * 2 + [5 * occ1] * 2 + [occ1] * 2 + [0] * (PRM.pcs - 6)
    assert stack.pc_bytes["read"][:4] == a[:4] and stack.pc_bytes["write"][2:6] == b[2:6]
    assert stack.bytes_by_op == {"read": sum(a), "write": sum(b)}


async def test_a_later_access_on_other_channels_is_answered_first(vclock):
    """An access that arrives later but only on idle channels is answered before a long one still bursting
    (answers leave at their own times, not in arrival order: a DMA with several commands in flight)."""
    burst = PRM.burst
    a = _bytes(0, 4 * burst, rows=8)            # channels 0-3, eight bursts each
    b = _bytes(4 * burst, burst)                # channel 4 only, idle
    system = System("hbm-stack-order", mode="timing")
    stack = system.add(HbmStack("pe/hbm/stack", prm=params_for(HbmStack, PRM)))
    d = system.add(Source("dma", [(0, HbmReq(1, "read", a, "dma")), (1_000, HbmReq(2, "read", b, "dma"))]))
    sink = system.add(Sink("sink", expect=2))
    system.connect(d.out, stack.req, capacity=16)
    system.connect(stack.resp["dma"], sink.inp, capacity=16)
    r = await run(system)
    assert r.status == "finished", r.error
    want = _closed_form([(0, a), (1_000, b)])
    assert want[1] < want[0]
    assert [(t, m.id) for t, m in sink.got] == [(want[1], 2), (want[0], 1)]
