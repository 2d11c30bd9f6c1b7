"""AHBM machine build: whole-machine idle run, placement policies, clear errors and deadlock reports."""
import numpy as np
import pytest

from actors.ahbm.idle import build_idle
from actors.ahbm.params import Params
from actors.ahbm.placement import split_rows
from actors.ahbm.testkit import CUBE, HBM, HOST, NS, build, load_profile, log, noc_time, write_sizes
from emulator.system import System


def test_idle_whole_2sip_machine_builds_and_runs():
    prof = load_profile("ahbm-2sip")
    system = System("idle", mode="timing")
    m = build_idle(system, prof, {"launch": True})["machine"]
    prm = Params.of(prof)
    # per PE: cpu, sched, dma, gemm, math, tcm, ipcq, hbm port + 8 pseudo-channels; per CUBE a router; one host;
    # per router output towards a neighbour CUBE (and the IO die's host output) an occupancy actor (noc.PortLoad)
    W = prm.sips * prm.cx
    mesh_outputs = 2 * ((W - 1) * prm.cy + W * (prm.cy - 1))
    assert len(system.actors) == prm.pes * (8 + prm.pcs) + prm.sips * prm.cubes + 1 + mesh_outputs + 1
    assert len(m.routers) == 32 and len(m.pes) == 256
    res = system.run()
    assert res.status == "finished", res.error
    assert len(m.host.logs) == 256
    assert res.end_time_ps == 2 * 100_000          # launch + done over the 100 ns IO links, empty scripts


def test_names_are_places():
    system, m, _ = build({})
    names = set(system.actors)
    for n in ("sip0/cube05/pe3/gemm", "sip0/cube05/pe3/dma", "sip0/cube05/pe3/hbm/pc7", "sip0/cube05/pe3/ipcq",
              "sip0/cube05/pe3/sched", "sip0/cube05/pe3/cpu", "sip0/cube05/pe3/tcm", "sip0/cube05/router",
              "io/host"):
        assert n in names
    # IPCQ pairs: PE 5 sits at (1, 1) of the 4x2 grid: neighbours N (pe1), E (pe6), W (pe4); no S
    assert sorted(m.pe(0, 5, 5).ipcq.dirs) == ["E", "N", "W"]


def test_placement_row_wise_and_replicate():
    system, m, place = build({}, mode="data")
    x = np.arange(50 * 4, dtype=np.float32).reshape(50, 4)
    shards = place.place(x, cubes=[0, 1], pes=[0, 1, 2], cube="row_wise", pe="row_wise")
    assert [s.rows for s in shards] == [(0, 9), (9, 17), (17, 25), (25, 34), (34, 42), (42, 50)]
    for s in shards:
        got = np.frombuffer(place.read(s.coord, s.addr, int(np.prod(s.shape)) * 4), np.float32).reshape(s.shape)
        np.testing.assert_array_equal(got, x[s.rows[0]:s.rows[1]])
    rep = place.place(x, cubes=[2], pes=[0, 1], cube="row_wise", pe="replicate")
    assert [s.rows for s in rep] == [(0, 50), (0, 50)]
    assert split_rows(7, 3) == [(0, 3), (3, 5), (5, 7)]
    with pytest.raises(ValueError, match="row_wise or replicate"):
        place.place(x, cubes=[0], pes=[0], pe="scatter")


async def test_unknown_command_is_a_clear_error(vclock):
    system, m, _ = build({(0, 0, 0): [{"op": "frobnicate"}]})
    res = await system.run_async()
    assert res.status == "error" and "unknown script command 'frobnicate'" in res.error


async def test_missing_ipcq_neighbour_is_a_clear_error(vclock):
    system, m, place = build({(0, 0, 0): [{"op": "send", "dir": "N", "buf": "q"}]})
    place.tcm_put((0, 0, 0), "q", np.zeros(4, np.float16))
    res = await system.run_async()
    assert res.status == "error" and "no neighbour in direction 'N'" in res.error


async def test_recv_without_sender_is_reported_as_deadlock(vclock):
    system, m, _ = build({(0, 0, 1): [{"op": "recv", "dir": "W", "buf": "x"}]})
    res = await system.run_async()
    assert res.status == "deadlock"
    text = str(res.deadlock)
    assert "io/host" in text and "sip0/cube00/pe1/cpu" in text


def test_microbench_same_timing_in_data_and_timing_mode():
    from actors.ahbm.microbench import build_microbench, check_microbench, MICRO_PARAMS
    from emulator.schema import Doc, validate
    params = validate(MICRO_PARAMS, Doc({"dma_sizes": ["4KiB"], "ipcq_bytes": ["4KiB"], "composite": [64, 128, 64]},
                                        {}, "test"))
    prof = load_profile("ahbm-1sip")
    out = {}
    for mode in ("timing", "data"):
        system = System("mb", mode=mode, seed=3)
        ctx = build_microbench(system, prof, params)
        res = system.run()
        assert res.status == "finished", res.error
        checks = check_microbench(system, prof, params, res, context=ctx)
        out[mode] = (res.end_time_ps, sorted(ctx["machine"].host.logs.items()))
        assert checks["max_abs_err_pct"] == 0
    assert out["timing"] == out["data"]
    assert checks["max_abs_err"] == 0.0      # same fp32 accumulation order as the engines
    assert len(checks["tables"]["data mode: results vs numpy"]) >= 6


@pytest.mark.parametrize("mode", ["timing", "data"])
async def test_host_loads_tensors_over_the_noc_then_launches(vclock, mode):
    owner, n, h = (0, 10, 2), 65536, 4            # CUBE 10 = (2, 2): 4 hops from the IO attach CUBE 0
    x = np.random.default_rng(5).standard_normal(n // 2).astype(np.float16)
    script = []
    system, m, place = build({owner: script}, mode=mode)
    addr = place.load(owner, x)
    script.append({"op": "dma", "kind": "load", "addr": addr, "row_bytes": n, "buf": "x", "shape": [n // 2],
                   "dtype": "<f2", "label": "use"})
    res = await system.run_async()
    assert res.status == "finished", res.error
    io = [0, 0, 8]
    req, ack = write_sizes(io, owner, addr, n)

    def path(S):   # host interface (64 GB/s, 500 ns) + h+1 routers + h CUBE links + HBM port attach (256 GB/s, ref §1.2)
        return noc_time(S, [HOST] + [CUBE] * h + [HBM])

    channels = 30 * NS + -(-(n // 8) * 10**12 // 25_600_000_000)
    assert m.host.load_done == [path(req) + channels + path(ack)]
    assert log(m, owner, "use")[1] == m.host.load_done[0] + 100 * NS       # launched after the load
    if mode == "data":
        np.testing.assert_array_equal(m.pe(*owner).tcm.bufs["x"], x)


async def test_bad_noc_destination_is_a_clear_error(vclock):
    system, m, place = build({(0, 0, 0): [{"op": "noc_send", "to": [0, 99, 0], "buf": "q"}]})
    place.tcm_put((0, 0, 0), "q", np.zeros(4, np.float16))
    res = await system.run_async()
    assert res.status == "error"
    assert "sip0/cube00/router" in res.error and "nonexistent PE [0, 99, 0]" in res.error
    assert "ExceptionGroup" not in res.error


async def test_pipelined_host_loads_complete_in_order(vclock):
    system, m, place = build({})
    for cube in (1, 2, 3):
        place.load((0, cube, 0), np.zeros(16384, np.float16))
    res = await system.run_async()
    assert res.status == "finished", res.error
    done = m.host.load_done
    assert len(done) == 3 and done == sorted(done)
    # the three requests share the 64 GB/s host interface: each later ack is at least one S/B later
    assert min(b - a for a, b in zip(done, done[1:])) >= 32768 * 10**12 // (64 * 10**9)
    assert system.reports["io/host"]["loads_done_ps"] == done[-1]


def test_many_to_many_remote_dma_under_back_pressure_finishes():
    """128 PEs each issue 6 async remote loads/stores of 32 KiB across the SIP: routers' bounded
    buffers and link credits back-pressure, requests and responses share the NOC, and it drains."""
    scripts = {}
    for c in range(16):
        for p in range(8):
            far, other = (0, 15 - c, (p + 3) % 8), (0, (c + 6) % 16, p)
            scripts[(0, c, p)] = [{"op": "dma", "kind": "store" if i % 2 else "load",
                                   "target": list(far if i % 2 else other), "addr": 0, "row_bytes": 32768,
                                   "buf": "x", "shape": [32768], "dtype": "|u1", "async": True} for i in range(6)]
    system, m, place = build(scripts)
    for k in scripts:
        place.tcm_put(k, "x", np.zeros(32768, np.uint8))
    res = system.run()
    assert res.status == "finished", (res.error, res.deadlock)
    assert sum(pe.port.served for pe in m.pes.values()) == 128 * 6
    assert any(l.blocked_count for l in system.links if "router" in l.name)   # back-pressure happened
