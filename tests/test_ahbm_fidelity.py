"""Fidelity requirements R1-R9 of reference/ahbm.md §4.6 against closed forms.

The closed forms (zero_load, ser, ipcq_time, ...) are the test kit's (actors/ahbm/testkit.py),
written out there from the profile numbers (scenarios/machines/ahbm-1sip.yaml, ref §2.6):
PE/NOC clock 1 GHz; CPU dispatch 8 cycles per primitive; PE CPU<->router attach
128 GB/s + 1 ns; router 3 cycles; CUBE<->CUBE UCIe 128 GB/s, 2 x 8 ns ports + 1 ns;
SIP<->SIP 64 GB/s, 20 ns; IPCQ 85.333 GB/s + 29.6 ns (ref §1.2 kernbench2: 31.1 ns
at 128 B, +1.5 ns per 128 B), credit return 1 ns; MATH 8 + ceil(E/64) cycles.
Model: store-and-forward per message (declared, R1).
"""
import numpy as np
import pytest

from actors.ahbm.testkit import (DISPATCH, HOP_TARGETS, NS, back_to_back_scripts, buf, build, hop_ladder_scripts,
                                 ipcq_size, ipcq_time, load_profile, log, noc_size, run_scripts, ser, zero_load)
from emulator.trace import TraceOptions, read_trace


# ------------------------------------------------------------------ R1 zero-load over 1-6 hops
async def test_r1_zero_load_1_to_6_hops(vclock):
    src = (0, 0, 4)
    _, m, _ = await run_scripts(hop_ladder_scripts(4), [(src, "q", buf(4096))])
    S = noc_size(4096)
    for h, cube in HOP_TARGETS.items():
        t = log(m, (0, cube, 4), "r")[3] - log(m, src, f"h{h}")[2]
        assert abs(t - zero_load(S, h)) <= 1 * NS, (h, t, zero_load(S, h))


async def test_r1_ucie_between_sips(vclock):
    prof = load_profile("ahbm-2sip")
    src, dst = (0, 3, 0), (1, 0, 0)      # east edge of SIP 0 -> west edge of SIP 1: one SIP crossing
    _, m, _ = await run_scripts({src: [{"op": "noc_send", "to": list(dst), "buf": "q", "label": "s"}],
                         dst: [{"op": "noc_recv", "buf": "r", "label": "r"}]}, [(src, "q", buf(8192))], prof)
    t = log(m, dst, "r")[3] - log(m, src, "s")[2]
    assert t == zero_load(noc_size(8192), 0, 1)


# ------------------------------------------------------------------ R2 FIFO per direction
async def test_r2_fifo_serialisation_and_independent_directions(vclock):
    a, b = (0, 0, 4), (0, 1, 4)
    a2, b2 = (0, 1, 5), (0, 0, 5)   # the opposite direction, same time
    scripts = back_to_back_scripts(a, b, a2, b2)
    _, m, _ = await run_scripts(scripts, [(a, "q", buf(4096)), (a2, "q", buf(4096))])
    S = noc_size(4096)
    first = log(m, b, "r1")[3] - log(m, a, "s1")[2]
    assert first == zero_load(S, 1)
    gap = log(m, b, "r2")[3] - log(m, b, "r1")[3]
    assert gap >= ser(S, 128) and gap == ser(S, 128)       # second waits one S/B behind the first
    # W->E traffic did not slow E->W
    assert log(m, b2, "r")[3] - log(m, a2, "s")[2] == zero_load(S, 1)


# ------------------------------------------------------------------ R3 combine on the receiver
@pytest.mark.parametrize("mode", ["timing", "data"])
async def test_r3_combine_charged_on_receiving_math(vclock, mode):
    root, west, east = (0, 2, 1), (0, 2, 0), (0, 2, 2)
    n = 4096
    x, y = buf(n), buf(n)[::-1].copy()
    scripts = {
        west: [{"op": "send", "dir": "E", "buf": "p", "label": "s"}],
        east: [{"op": "send", "dir": "W", "buf": "p", "label": "s"}],
        root: [{"op": "recv", "dir": "W", "buf": "a", "label": "ra"},
               {"op": "recv", "dir": "E", "buf": "b", "label": "rb"},
               {"op": "math", "fn": "add", "srcs": ["a", "b"], "out": "o", "label": "combine"}],
    }
    system, m, _ = await run_scripts(scripts, [(west, "p", x), (east, "p", y)], mode=mode)
    arrival = log(m, west, "s")[2] + ipcq_time(ipcq_size(n))
    assert log(m, root, "ra")[3] == arrival
    t_math = (8 + n // 2 // 64) * NS
    assert log(m, root, "combine")[3] == arrival + DISPATCH + DISPATCH + t_math   # critical path
    assert m.pe(*root).math.busy_ps == t_math
    assert m.pe(*west).math.busy_ps == 0 and m.pe(*east).math.busy_ps == 0
    if mode == "data":
        out = m.pe(*root).tcm.bufs["o"]
        np.testing.assert_array_equal(out, x.astype(np.float32) + y.astype(np.float32))


# ------------------------------------------------------------------ R4 chunking / pipelining
async def test_r4_chunked_pipeline_formula(vclock):
    total, h = 16384, 3
    times = {}
    for k in (1, 2, 4, 8):
        src, dst = (0, 0, 4), (0, 3, 4)
        scripts = {src: [{"op": "noc_send", "to": list(dst), "buf": "q", "label": f"s{i}"} for i in range(k)],
                   dst: [{"op": "noc_recv", "buf": "r", "label": f"r{i}"} for i in range(k)]}
        _, m, _ = await run_scripts(scripts, [(src, "q", buf(total // k))])
        t = log(m, dst, f"r{k - 1}")[3] - log(m, src, "s0")[2]
        Sk = noc_size(total // k)
        model = zero_load(Sk, h) + (k - 1) * max(DISPATCH, ser(Sk, 128))
        assert t == model, (k, t, model)
        times[k] = t
    assert times[1] > times[2] > times[4] > times[8]


# ------------------------------------------------------------------ R5 bounded IPCQ
def tree_scripts(n):
    """Acyclic tree in CUBE 0 (4x2 PE grid): pe2 -W-> pe1, pe5 -N-> pe1, pe1 -W-> pe0, pe4 -N-> pe0."""
    P = lambda p: (0, 0, p)  # noqa: E731
    pe1 = []
    for i in range(n):
        pe1 += [{"op": "recv", "dir": "E", "buf": "t"}, {"op": "send", "dir": "W", "buf": "t"},
                {"op": "recv", "dir": "S", "buf": "t"}, {"op": "send", "dir": "W", "buf": "t"},
                {"op": "send", "dir": "W", "buf": "q", "label": f"own{i}"}]
    root = []
    for i in range(n):
        root += [{"op": "recv", "dir": "E", "buf": "a"}, {"op": "recv", "dir": "E", "buf": "b"},
                 {"op": "recv", "dir": "E", "buf": "c"}, {"op": "recv", "dir": "S", "buf": "d"},
                 {"op": "math", "fn": "exp", "srcs": ["a"], "out": "e", "label": f"m{i}"}]
    return {P(2): [{"op": "send", "dir": "W", "buf": "q", "label": f"s{i}"} for i in range(n)],
            P(5): [{"op": "send", "dir": "N", "buf": "q"} for _ in range(n)],
            P(4): [{"op": "send", "dir": "N", "buf": "q"} for _ in range(n)],
            P(1): pe1, P(0): root}


async def test_r5_bounded_ipcq_slows_but_never_deadlocks(vclock):
    n = 6
    tcm = [((0, 0, p), "q", buf(4096)) for p in (1, 2, 4, 5)]
    end = {}
    for depth in (4, 1):
        prof = load_profile("ahbm-1sip", {"ipcq": {"depth": depth}})
        _, m, res = await run_scripts(tree_scripts(n), tcm, prof)
        end[depth] = log(m, (0, 0, 0), f"m{n - 1}")[3]
        if depth == 1:
            # with one slot, each send waits for the previous slot's credit to come back:
            # gap >= S/B + IPCQ overhead + credit return latency (charged)
            gaps = [log(m, (0, 0, 2), f"s{i + 1}")[3] - log(m, (0, 0, 2), f"s{i}")[3] for i in range(n - 1)]
            assert min(gaps) >= ipcq_time(ipcq_size(4096)) + 1 * NS
    assert end[1] > end[4]


# ------------------------------------------------------------------ R6 contention ~ fair share
async def test_r6_contention_within_10pct_of_fair_share(vclock):
    n, nb = 16, 4096
    fa, fb = ((0, 0, 0), (0, 3, 0)), ((0, 1, 1), (0, 3, 1))      # share the CUBE links 1->2->3
    S = noc_size(nb)

    def flows(which):
        sc = {}
        for src, dst in which:
            sc[src] = [{"op": "noc_send", "to": list(dst), "buf": "q", "label": f"s{i}"} for i in range(n)]
            sc[dst] = [{"op": "noc_recv", "buf": "r", "label": f"r{i}"} for i in range(n)]
        return sc

    tcm = [(fa[0], "q", buf(nb)), (fb[0], "q", buf(nb))]
    _, m, _ = await run_scripts(flows([fa, fb]), tcm)
    for (src, dst), hops in ((fa, 3), (fb, 2)):
        t = log(m, dst, f"r{n - 1}")[3] - log(m, src, "s0")[2]
        # max-min fair share: the shared link carries 2n packets at B, each flow gets B/2
        estimate = 2 * n * ser(S, 128) + (zero_load(S, hops) - ser(S, 128))
        assert abs(t - estimate) / estimate < 0.10, (src, t, estimate)
    _, m1, _ = await run_scripts(flows([fa]), tcm[:1])
    alone = log(m1, fa[1], f"r{n - 1}")[3] - log(m1, fa[0], "s0")[2]
    assert alone == zero_load(S, 3) + (n - 1) * ser(S, 128)


# ------------------------------------------------------------------ R7 XY path in the trace
async def test_r7_xy_path_visible_in_trace(vclock, tmp_path):
    src, dst = (0, 0, 4), (0, 15, 4)
    path = tmp_path / "xy.emutrace"
    system, m, _ = await run_scripts({src: [{"op": "noc_send", "to": list(dst), "buf": "q"}],
                              dst: [{"op": "noc_recv", "buf": "r"}]}, [(src, "q", buf(256))],
                             trace=TraceOptions(path=str(path)))
    used = sorted(l.name for l in system.links if l.messages and "router.out_" in l.name and "router.in_" in l.name)
    r = "sip0/cube{:02d}/router"
    expect = sorted(f"{r.format(a)}.out_{d}->{r.format(b)}.in_{o}" for a, b, d, o in
                    ((0, 1, "E", "W"), (1, 2, "E", "W"), (2, 3, "E", "W"),
                     (3, 7, "S", "N"), (7, 11, "S", "N"), (11, 15, "S", "N")))
    assert used == expect
    tr = read_trace(str(path))
    hops = [ev[4] for ev in tr.of_kind("mark") if ev[3] == "hop"]
    assert [(h[1], h[2]) for h in hops] == [(r.format(0), "E"), (r.format(1), "E"), (r.format(2), "E"),
                                            (r.format(3), "S"), (r.format(7), "S"), (r.format(11), "S"),
                                            (r.format(15), "pe4")]


# ------------------------------------------------------------------ R8 determinism
def test_r8_determinism_same_digest_and_bits():
    """Two fresh runs (each on its own virtual clock): same digest, timestamps and output bits."""
    outs = []
    for _ in range(2):
        system, m, place = build(tree_scripts(3), mode="data")
        for p in (1, 2, 4, 5):
            place.tcm_put((0, 0, p), "q", (buf(1024) * np.float16(p / 1000)).astype(np.float16))
        res = system.run()
        assert res.status == "finished", res.error
        outs.append((res.digest, res.end_time_ps, sorted(m.host.logs.items()), m.pe(0, 0, 0).tcm.bufs["e"].tobytes()))
    assert outs[0] == outs[1]


# ------------------------------------------------------------------ R9 analytical cross-check
async def test_r9_analytical_cross_check_1_to_64_kib(vclock):
    src, dst = (0, 4, 4), (0, 6, 4)   # 2 hops
    sizes = [1024, 4096, 16384, 65536]
    s = []
    for i, nb in enumerate(sizes):
        if i:
            s.append({"op": "sleep", "ps": 5000 * NS})
        s.append({"op": "noc_send", "to": list(dst), "buf": f"q{i}", "label": f"s{i}"})
    scripts = {src: s, dst: [{"op": "noc_recv", "buf": "r", "label": f"r{i}"} for i in range(len(sizes))]}
    _, m, _ = await run_scripts(scripts, [(src, f"q{i}", buf(nb)) for i, nb in enumerate(sizes)])
    for i, nb in enumerate(sizes):
        t = log(m, dst, f"r{i}")[3] - log(m, src, f"s{i}")[2]
        # alpha/beta hand model: alpha = 2 x 1 ns attach + 3 x 3 ns routers + 2 x 17 ns links; beta = 4 x S/B
        S = noc_size(nb)
        hand = (2 * 1 + 3 * 3 + 2 * 17) * NS + 4 * S * 1000 / 128
        assert abs(t - hand) / hand < 0.05, (nb, t, hand)


# ------------------------------------------------------------------ R3 + R9 at tree scale
# 2-level reduce-to-root of seed §4: a neighbour-only PE tree inside every CUBE (IPCQ), then the
# CUBE roots reduce over the NOC to the centre CUBE (2, 2) = cube 10, rows first (ref §4.5).
PE_TREE = {1: [0, 2, 5], 2: [3, 6], 6: [7], 5: [4]}       # parent: children, on the 4x2 PE grid
PE_DIR = {0: "E", 2: "W", 5: "N", 3: "W", 6: "N", 7: "W", 4: "E"}   # direction a child sends in
OPP = {"N": "S", "S": "N", "E": "W", "W": "E"}
ROOT_PE, ROOT_CUBE = 1, 10


def mesh_parent(cube):
    x, y = cube % 4, cube // 4
    if x != 2:
        return y * 4 + x + (1 if x < 2 else -1)
    if y != 2:
        return (y + (1 if y < 2 else -1)) * 4 + x
    return None


def reduce_scripts():
    scripts = {}
    mesh_children = {c: [k for k in range(16) if mesh_parent(k) == c] for c in range(16)}
    for cube in range(16):
        for pe in range(8):
            s = []
            for child in PE_TREE.get(pe, []):
                s += [{"op": "recv", "dir": OPP[PE_DIR[child]], "buf": "in"},
                      {"op": "math", "fn": "add", "srcs": ["acc", "in"], "out": "acc"}]
            if pe == ROOT_PE:
                for _ in mesh_children[cube]:
                    s += [{"op": "noc_recv", "buf": "in"},
                          {"op": "math", "fn": "add", "srcs": ["acc", "in"], "out": "acc"}]
                up = mesh_parent(cube)
                if up is not None:
                    s.append({"op": "noc_send", "to": [0, up, ROOT_PE], "buf": "acc", "label": "up"})
                else:
                    s[-1]["label"] = "root_done"
            else:
                s.append({"op": "send", "dir": PE_DIR[pe], "buf": "acc", "label": "up"})
            scripts[(0, cube, pe)] = s
    return scripts, mesh_children


def reduce_model(nbytes, mesh_children):
    """The analytical script (R9): alpha/beta per hop + dispatch + t_combine, along the scripted order."""
    start = 100 * NS                                   # launch link
    t_comb = (8 + -(-(nbytes // 4) // 64)) * NS        # MATH add on fp32 elements
    ipcq = ipcq_time(ipcq_size(nbytes, "<f4"))
    S = noc_size(nbytes, "<f4")
    done = {}

    def node(cube, pe):
        t = start
        arrivals = [(node(cube, c) + DISPATCH + ipcq) for c in PE_TREE.get(pe, [])]
        if pe == ROOT_PE:
            # NOC partials are taken from the mailbox in arrival order (data-driven)
            arrivals += sorted(node(k, ROOT_PE) + DISPATCH + zero_load(S, 1) for k in mesh_children[cube])
        for a in arrivals:
            t = max(t + DISPATCH, a) + DISPATCH + t_comb      # recv (dispatch, wait), then add
        done[(cube, pe)] = t
        return t

    return node(ROOT_CUBE, ROOT_PE), done


@pytest.mark.parametrize("nbytes", [1024, 16384, 65536])
async def test_r3_r9_two_level_reduce_matches_analytical_script(vclock, nbytes):
    scripts, mesh_children = reduce_scripts()
    n = nbytes // 4
    tcm = [((0, c, p), "acc", np.full(n, c * 8 + p, np.float32)) for c in range(16) for p in range(8)]
    mode = "data" if nbytes == 1024 else "timing"
    system, m, res = await run_scripts(scripts, tcm, mode=mode)
    measured = log(m, (0, ROOT_CUBE, ROOT_PE), "root_done")[3]
    model, _ = reduce_model(nbytes, mesh_children)
    assert abs(measured - model) / model < 0.05, (measured, model)
    assert measured == model
    # combine charged on each receiving PE's MATH engine: one add per child
    t_comb = (8 + -(-n // 64)) * NS
    for (s, c, p), pe in m.pes.items():
        kids = len(PE_TREE.get(p, [])) + (len(mesh_children[c]) if p == ROOT_PE else 0)
        assert pe.math.busy_ps == kids * t_comb
    if mode == "data":
        np.testing.assert_array_equal(m.pe(0, ROOT_CUBE, ROOT_PE).tcm.bufs["acc"], np.full(n, sum(range(128)),
                                                                                          np.float32))
