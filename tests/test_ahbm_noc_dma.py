"""NOC switching (store-and-forward / cut-through), router occupancy, DMA outstanding commands.

The closed forms are the test kit's (actors/ahbm/testkit.py), written out there from the
profile numbers (ahbm-1sip / ahbm-2sip, ref §2.6), independently of actors/ahbm/noc.py and
microbench.py: PE CPU / DMA<->router attach ATT (128 GB/s + 1 ns); HBM port<->router attach
HBM (256 GB/s + 1 ns, ref §1.2 hbm_to_router_bw_gbs); router ALPHA 3 ns; CUBE<->CUBE CUBE
(128 GB/s + 17 ns); SIP<->SIP SIP (64 GB/s + 20 ns); CPU dispatch 8 ns; DMA setup 20 ns;
HBM channel 30 ns + bytes / 25.6 GB/s.

* store-and-forward, links (B_i, L_i), n links: ``sum (S/B_i + L_i) + (n - 1) alpha``;
* cut-through (ref §4.6 R1, alpha h + S/B_bottleneck): ``sum L_i + (n - 1) alpha + max S/B_i``;
  every S/B rounded up to a picosecond (``noc_time``).
"""
import numpy as np
import pytest

from actors.ahbm.testkit import (ALPHA, ATT, CUBE, HBM, HOP_TARGETS, NS, SIP, back_to_back_scripts, buf, build,
                                 ceil_div, hop_ladder_scripts, load_profile, log, noc_size, noc_time, read_sizes,
                                 remote_load_store, run_scripts, ser)
from emulator.trace import TraceOptions, read_trace
from tools.trace.summary import summarise

TWO_PES = {"pes_per_cube": 2, "pe_grid": {"x": 2, "y": 1}}    # the CUBE mesh as profiled, 2 PEs per CUBE (fast)


def profile(mode, name="ahbm-1sip", extra=None):
    over = {"noc": {"switching": mode}, **TWO_PES}
    for k, v in (extra or {}).items():
        over[k] = {**over.get(k, {}), **v}
    return load_profile(name, over)


MODES = ["store_and_forward", "cut_through"]


# ------------------------------------------------------------------ R1 zero load, both modes
@pytest.mark.parametrize("mode", MODES)
async def test_zero_load_1_to_6_hops_both_modes(vclock, mode):
    src = (0, 0, 0)
    _, m, _ = await run_scripts(hop_ladder_scripts(0), [(src, "q", buf(4096))], profile(mode))
    S = noc_size(4096)
    for h, cube in HOP_TARGETS.items():
        t = log(m, (0, cube, 0), "r")[3] - log(m, src, f"h{h}")[2]
        assert t == noc_time(S, [ATT] + [CUBE] * h + [ATT], mode), (h, t)
    if mode == "cut_through":   # R1 as written: per-hop alpha (router + link latency) + S / B_bottleneck
        t6 = log(m, (0, 15, 0), "r")[3] - log(m, src, "h6")[2]
        assert t6 == 2 * 1 * NS + 7 * 3 * NS + 6 * 17 * NS + ser(S, 128)
        assert t6 - (log(m, (0, 1, 0), "r")[3] - log(m, src, "h1")[2]) == 5 * (3 * NS + 17 * NS)


@pytest.mark.parametrize("mode", MODES)
async def test_mixed_bandwidth_sip_crossing_is_the_bottleneck(vclock, mode):
    """CUBE 2 of SIP 0 -> CUBE 1 of SIP 1: CUBE link, UCIe SIP link (64 GB/s), CUBE link."""
    prof = profile(mode, "ahbm-2sip")
    src, dst = (0, 2, 0), (1, 1, 0)
    one_src, one_dst = (0, 3, 1), (1, 0, 1)                  # just the SIP crossing, later
    scripts = {src: [{"op": "noc_send", "to": list(dst), "buf": "q", "label": "s"}],
               dst: [{"op": "noc_recv", "buf": "r", "label": "r"}],
               one_src: [{"op": "sleep", "ps": 2000 * NS},
                         {"op": "noc_send", "to": list(one_dst), "buf": "q", "label": "s"}],
               one_dst: [{"op": "noc_recv", "buf": "r", "label": "r"}]}
    _, m, _ = await run_scripts(scripts, [(src, "q", buf(8192)), (one_src, "q", buf(8192))], prof)
    S = noc_size(8192)
    t = log(m, dst, "r")[3] - log(m, src, "s")[2]
    assert t == noc_time(S, [ATT, CUBE, SIP, CUBE, ATT], mode)
    t1 = log(m, one_dst, "r")[3] - log(m, one_src, "s")[2]
    assert t1 == noc_time(S, [ATT, SIP, ATT], mode)
    if mode == "cut_through":
        assert t == 2 * NS + 4 * ALPHA + 17 * NS + 20 * NS + 17 * NS + ser(S, 64)
        assert t1 == 2 * NS + 2 * ALPHA + 20 * NS + ser(S, 64)
    else:
        assert t == 2 * (ser(S, 128) + NS) + 4 * ALPHA + 2 * (ser(S, 128) + 17 * NS) + ser(S, 64) + 20 * NS


# ------------------------------------------------------------------ R2 back to back, contention
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sips", [1, 2])
async def test_two_back_to_back_messages(vclock, mode, sips):
    """Second message finishes S/B_bottleneck after the first; the opposite direction is not slowed."""
    if sips == 1:
        prof, a, b, links, bottleneck = profile(mode), (0, 0, 0), (0, 1, 0), [ATT, CUBE, ATT], 128
    else:
        prof, a, b, links, bottleneck = profile(mode, "ahbm-2sip"), (0, 3, 0), (1, 0, 0), [ATT, SIP, ATT], 64
    a2, b2 = (b[0], b[1], 1), (a[0], a[1], 1)
    scripts = back_to_back_scripts(a, b, a2, b2)
    _, m, _ = await run_scripts(scripts, [(a, "q", buf(4096)), (a2, "q", buf(4096))], prof)
    S = noc_size(4096)
    assert log(m, b, "r1")[3] - log(m, a, "s1")[2] == noc_time(S, links, mode)
    # s2 is issued one dispatch (8 ns) after s1; it waits behind s1 on the bottleneck link
    assert log(m, a, "s2")[2] - log(m, a, "s1")[2] == 8 * NS
    if mode == "cut_through":
        assert log(m, b, "r2")[3] - log(m, b, "r1")[3] == ser(S, bottleneck)
    else:   # store-and-forward: every link of the path is a stage; the slowest one spaces them
        assert log(m, b, "r2")[3] - log(m, b, "r1")[3] == max(ser(S, bw) for bw, _ in links)
    assert log(m, b2, "r")[3] - log(m, a2, "s")[2] == noc_time(S, links, mode)


async def test_cut_through_contention_serialises_fifo_on_the_shared_link(vclock):
    """A: CUBE 0 -> CUBE 2, B: CUBE 1 -> CUBE 2, sent at the same time: both use CUBE 1's E output.

    B's head reaches router 1 at t+1 ns (injection), A's at t + 1 + 3 + 17 = t+21 ns, so B
    holds the output from t+4 to t+4+S/B; A's head leaves at t+4+S/B instead of t+24 ns.
    """
    A, B, dA, dB = (0, 0, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1)
    scripts = {A: [{"op": "noc_send", "to": list(dA), "buf": "q", "label": "s"}],
               B: [{"op": "noc_send", "to": list(dB), "buf": "q", "label": "s"}],
               dA: [{"op": "noc_recv", "buf": "r", "label": "r"}],
               dB: [{"op": "noc_recv", "buf": "r", "label": "r"}]}
    _, m, _ = await run_scripts(scripts, [(A, "q", buf(4096)), (B, "q", buf(4096))], profile("cut_through"))
    S = noc_size(4096)
    sB = ser(S, 128)
    t = log(m, A, "s")[2]
    assert log(m, B, "s")[2] == t
    assert log(m, dB, "r")[3] - t == noc_time(S, [ATT, CUBE, ATT], "cut_through")
    # A: head leaves router 1 at t + 4 ns + S/B (behind B), then 17 ns link, 3 ns router, tail S/B, 1 ns attach
    assert log(m, dA, "r")[3] - t == 4 * NS + sB + 17 * NS + 3 * NS + sB + 1 * NS
    assert log(m, dA, "r")[3] - t - noc_time(S, [ATT, CUBE, CUBE, ATT], "cut_through") == 4 * NS + sB - 24 * NS


@pytest.mark.parametrize("mode", MODES)
async def test_back_pressure_with_one_slot_buffers(vclock, mode):
    """Buffers and link credits of 1: a burst of 6 still arrives, at the rate the credits allow, no deadlock."""
    prof = profile(mode, extra={"noc": {"buffer": 1, "link_capacity": 1}})
    a, b = (0, 0, 0), (0, 3, 0)
    n = 6
    scripts = {a: [{"op": "noc_send", "to": list(b), "buf": "q", "label": f"s{i}"} for i in range(n)],
               b: [{"op": "noc_recv", "buf": "r", "label": f"r{i}"} for i in range(n)]}
    _, m, _ = await run_scripts(scripts, [(a, "q", buf(4096))], prof)
    S = noc_size(4096)
    links = [ATT, CUBE, CUBE, CUBE, ATT]
    assert log(m, b, "r0")[3] - log(m, a, "s0")[2] == noc_time(S, links, mode)
    gaps = [log(m, b, f"r{i}")[3] - log(m, b, f"r{i - 1}")[3] for i in range(1, n)]
    if mode == "cut_through":   # the credit is back when the head is taken downstream: full pipelining
        assert gaps == [ser(S, 128)] * (n - 1)
    else:   # one credit per link: a message enters a CUBE link when the previous one left it (S/B + 17 ns)
        assert gaps == [ser(S, 128) + 17 * NS] * (n - 1)


async def test_cut_through_remote_dma_data_mode(vclock):
    """Remote load and store in data mode under cut-through: bytes land, times follow the CT closed form."""
    me, owner = (0, 0, 0), (0, 5, 1)                 # 2 hops
    n = 8192
    data = np.random.default_rng(5).integers(0, 255, n, dtype=np.uint8)
    system, m, place, addr, dst = remote_load_store(me, owner, data, profile("cut_through"), mode="data")
    res = await system.run_async()
    assert res.status == "finished", res.error
    path = [ATT, CUBE, CUBE, HBM]                     # DMA attach -> 2 CUBE links -> owner's HBM port
    chan = 30 * NS + ceil_div(n // 8 * 10**12, 25_600_000_000)
    req, resp = read_sizes(me, owner, addr, n)
    _, _, issued, done = log(m, me, "rload")
    assert done - issued == 20 * NS + noc_time(req, path, "cut_through") + chan + noc_time(resp, path[::-1],
                                                                                        "cut_through")
    assert place.read(owner, dst, n) == data.tobytes()


# ------------------------------------------------------------------ router occupancy
@pytest.mark.parametrize("mode", MODES)
async def test_router_outputs_report_occupancy_without_changing_timing(vclock, mode, tmp_path):
    src, dst = (0, 0, 0), (0, 5, 0)        # XY: E to CUBE 1, then S to CUBE 5
    path = tmp_path / "occ.emutrace"
    system, m, res = await run_scripts({src: [{"op": "noc_send", "to": list(dst), "buf": "q", "label": "s"}],
                                dst: [{"op": "noc_recv", "buf": "r", "label": "r"}]}, [(src, "q", buf(4096))],
                               profile(mode), trace=TraceOptions(path=str(path)))
    S = noc_size(4096)
    assert log(m, dst, "r")[3] - log(m, src, "s")[2] == noc_time(S, [ATT, CUBE, CUBE, ATT], mode)
    e, s_ = system.actors["sip0/cube00/router/out_E"], system.actors["sip0/cube01/router/out_S"]
    # one span per packet: the output's serialisation (S/B, cut-through: the tail may lag, here it does not)
    assert (e.busy_ps, e.busy_spans) == (ser(S, 128), 1)
    assert (s_.busy_ps, s_.busy_spans) == (ser(S, 128), 1)
    assert system.actors["sip0/cube00/router/out_S"].busy_ps == 0
    links = {l.name: l for l in system.links}
    assert links["sip0/cube00/router.out_E->sip0/cube01/router.in_W"].busy_ps == ser(S, 128)   # both modes
    assert links["sip0/cube01/router.out_S->sip0/cube05/router.in_N"].busy_ps == ser(S, 128)
    util = {r["actor"]: r for r in summarise(read_trace(str(path)), top=1000)["actors"]}
    assert util["sip0/cube00/router/out_E"]["busy_ps"] == ser(S, 128)
    assert util["sip0/cube01/router/out_S"]["busy_ps"] == ser(S, 128)
    assert "sip0/cube00/router/out_io" in system.actors and "sip0/cube01/router/out_io" not in system.actors


async def test_cut_through_occupancy_lasts_until_the_tail_leaves(vclock):
    """Behind a slow link (SIP crossing, 64 GB/s) a fast output is held until the tail passes: S/B_64."""
    src, dst = (0, 3, 0), (1, 1, 0)        # SIP link, then CUBE link E on SIP 1
    system, m, _ = await run_scripts({src: [{"op": "noc_send", "to": list(dst), "buf": "q", "label": "s"}],
                              dst: [{"op": "noc_recv", "buf": "r", "label": "r"}]}, [(src, "q", buf(4096))],
                             profile("cut_through", "ahbm-2sip"))
    S = noc_size(4096)
    assert system.actors["sip0/cube03/router/out_E"].busy_ps == ser(S, 64)
    assert system.actors["sip1/cube00/router/out_E"].busy_ps == ser(S, 64)
    assert log(m, dst, "r")[3] - log(m, src, "s")[2] == noc_time(S, [ATT, SIP, CUBE, ATT], "cut_through")


# ------------------------------------------------------------------ DMA outstanding commands
def _remote_then_local(outstanding, mode="timing", store=False):
    me, owner = (0, 0, 1), (0, 15, 1)     # 6 hops
    n = 4096
    rng = np.random.default_rng(11)
    far, near = rng.integers(0, 255, n, dtype=np.uint8), rng.integers(0, 255, n, dtype=np.uint8)
    script = []
    system, m, place = build({me: script}, load_profile("ahbm-1sip", {"dma": {"outstanding": outstanding}, **TWO_PES}),
                             mode=mode)
    a_far, a_near = place.put(owner, far), place.put(me, near)
    script.append({"op": "dma", "kind": "load", "target": list(owner), "addr": a_far, "row_bytes": n, "buf": "rx",
                   "shape": [n], "dtype": "|u1", "async": True, "label": "remote"})
    dst = None
    if store:   # async store of "rx" right behind the load into it: read-after-write on the TCM buffer
        dst = place.alloc(me, n)
        script.append({"op": "dma", "kind": "store", "addr": dst, "row_bytes": n, "buf": "rx", "shape": [n],
                       "dtype": "|u1", "async": True, "label": "store"})
    script += [{"op": "dma", "kind": "load", "addr": a_near, "row_bytes": n, "buf": "lx", "shape": [n],
                "dtype": "|u1", "label": "local"},
               {"op": "wait", "label": "wait"}]
    return system, m, place, (me, owner, a_far, n, far, near, dst)


@pytest.mark.parametrize("outstanding", [1, 2])
async def test_local_dma_overtakes_a_remote_one(vclock, outstanding):
    system, m, _, (me, owner, a_far, n, _, _, _) = _remote_then_local(outstanding)
    res = await system.run_async()
    assert res.status == "finished", res.error
    path = [ATT] + [CUBE] * 6 + [HBM]                 # DMA attach -> 6 CUBE links -> owner's HBM port
    req, resp = read_sizes(me, owner, a_far, n)
    chan = 30 * NS + ceil_div(n // 8 * 10**12, 25_600_000_000)     # 4 KiB striped over 8 channels: 512 B each
    t_remote_issued = log(m, me, "remote")[2]          # launch + 8 ns dispatch; the DMA starts its setup
    remote_done = t_remote_issued + 20 * NS + noc_time(req, path, "store_and_forward") + chan + noc_time(
        resp, path[::-1], "store_and_forward")
    _, _, local_issued, local_done = log(m, me, "local")
    assert local_issued == t_remote_issued + 8 * NS
    assert log(m, me, "wait")[3] == max(remote_done, local_done)
    if outstanding == 1:      # the serial engine: the local load waits for the whole round trip
        assert local_done == remote_done + 20 * NS + chan
    else:                     # its setup follows the remote's setup, its channels run during the round trip
        assert local_done == t_remote_issued + 20 * NS + 20 * NS + chan
        assert local_done < remote_done
        assert m.pe(*me).dma.peak_in_flight == 2


async def test_outstanding_dma_data_mode_and_tcm_hazard(vclock):
    """Out-of-order completions land in the right buffers; a store of a buffer being loaded waits for the load."""
    system, m, place, (me, owner, _, n, far, near, dst) = _remote_then_local(4, mode="data", store=True)
    res = await system.run_async()
    assert res.status == "finished", res.error
    tcm = m.pe(*me).tcm.bufs
    assert tcm["rx"].tobytes() == far.tobytes() and tcm["lx"].tobytes() == near.tobytes()
    assert place.read(me, dst, n) == far.tobytes()        # the store saw the loaded bytes
    # admission is in order: the store waits for the remote load, and the local load behind it waits too
    # (then both run in parallel: the local load ends after its setup, 20 ns after the store's, + channels)
    assert m.pe(*me).dma.peak_in_flight == 2
    assert log(m, me, "local")[3] == log(m, me, "wait")[3]


def test_outstanding_must_be_positive():
    from emulator.schema import SchemaError
    with pytest.raises(SchemaError) as e:
        load_profile("ahbm-1sip", {"dma": {"outstanding": 0}})
    assert "outstanding" in str(e.value)
    with pytest.raises(SchemaError) as e:
        load_profile("ahbm-1sip", {"noc": {"switching": "wormhole"}})
    assert "switching" in str(e.value) and "cut_through" in str(e.value)


def test_microbench_cut_through_table(emu):
    """scenarios/ahbm/microbench-cut-through.yaml: every row equals its closed form; routed rows are labelled."""
    import json
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scenarios" / "ahbm" / "microbench-cut-through.yaml"
    out = json.loads(emu("run", path, "--json", "--compact", "--no-bundle", check=0).stdout)
    rows = out["tables"]["AHBM microbenchmarks: measured vs closed form"]
    for r in rows:
        assert r["measured_ns"] is not None and r["err_%"] == 0, r
    ct = {r["bench"]: r for r in rows if r["bench"].endswith("[cut-through]")}
    assert len(ct) == 9          # NOC 1-6 hops, UCIe, remote DMA, host load
    S = noc_size(4096)
    assert round(ct["noc 6 hops 4096 B [cut-through]"]["model_ns"] * NS) == (
        2 * NS + 7 * ALPHA + 6 * 17 * NS + ser(S, 128))
    assert round(ct["ucie sip0->sip1 4 hops 4096 B [cut-through]"]["model_ns"] * NS) == (
        2 * NS + 5 * ALPHA + 3 * 17 * NS + 20 * NS + ser(S, 64))


def test_cut_through_is_deterministic():
    """Two fresh runs of a contended cut-through flow give the same digest and timestamps (R8)."""
    outs = []
    for _ in range(2):
        scripts = {(0, 0, 0): [{"op": "noc_send", "to": [0, 2, 0], "buf": "q"}] * 3,
                   (0, 1, 1): [{"op": "noc_send", "to": [0, 2, 1], "buf": "q"}] * 3,
                   (0, 2, 0): [{"op": "noc_recv", "buf": "r"}] * 3, (0, 2, 1): [{"op": "noc_recv", "buf": "r"}] * 3}
        system, m, place = build(scripts, profile("cut_through"))
        for c in ((0, 0, 0), (0, 1, 1)):
            place.tcm_put(c, "q", buf(2048))
        res = system.run()
        assert res.status == "finished", res.error
        outs.append((res.digest, res.end_time_ps, sorted(m.host.logs.items())))
    assert outs[0] == outs[1]
