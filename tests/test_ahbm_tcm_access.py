"""TCM accesses (actors/ahbm/memory.py): one message per access, answered only when it reads.

A MATH op reads all its operands in one access; its result write is posted, or
rides on the next queued op's operand read; a script ``free`` is posted.  The
results and the timing are those of the per-buffer protocol (the formula tests
in test_ahbm_engines.py and the fidelity tests check the timing).
"""
import numpy as np

from emulator import numerics

from actors.ahbm.testkit import build

PE = (0, 0, 0)


def _link(system, src, dst):
    (link,) = [x for x in system.links if x.src.owner is src and x.dst.owner is dst]
    return link


async def test_math_ops_make_one_answered_tcm_access_each(vclock):
    ops = [{"op": "math", "fn": "add", "srcs": ["x", "x"], "out": "y", "async": True},
           {"op": "math", "fn": "mul", "srcs": ["y", "x"], "out": "z", "async": True},
           {"op": "math", "fn": "exp", "srcs": ["z"], "out": "w", "async": True},
           {"op": "math", "fn": "rowsum", "srcs": ["w"], "out": "s"},
           {"op": "free", "buf": "y"}]
    system, m, place = build({PE: ops}, mode="data")
    x = np.linspace(-1, 1, 8 * 64, dtype=np.float32).reshape(8, 64)
    place.tcm_put(PE, "x", x)
    res = await system.run_async()
    assert res.status == "finished", res.error
    pe = m.pe(*PE)
    req, resp = _link(system, pe.math, pe.tcm), _link(system, pe.tcm, pe.math)
    # one answer per op (all its operands at once), one request per op plus the posted writes that
    # could not ride on a queued op's read (at least the last one)
    assert resp.messages == len(ops) - 1
    assert len(ops) - 1 < req.messages <= 2 * (len(ops) - 1)
    # the CPU's free is posted: the TCM never answers the CPU
    assert _link(system, pe.cpu, pe.tcm).messages == 1 and _link(system, pe.tcm, pe.cpu).messages == 0
    # `emu bench machine` counts the same links per pair of component kinds (both directions)
    from tools.bench.command import message_pairs
    pairs = message_pairs(system)
    assert pairs["math<->tcm"] == req.messages + resp.messages and pairs["cpu<->tcm"] == 1
    assert pairs["cpu<->math"] == 2 * (len(ops) - 1)      # a command and its completion per op
    w = np.exp((x + x) * x)
    np.testing.assert_allclose(pe.tcm.bufs["s"], w.sum(axis=-1, keepdims=True), rtol=1e-6)
    assert "y" not in pe.tcm.bufs and pe.tcm.used == sum(b.nbytes for b in pe.tcm.bufs.values())


async def test_one_access_writes_then_frees_then_reads(vclock):
    from emulator.actor import Actor

    from actors.ahbm.memory import Tcm, TcmClient
    from emulator.system import System

    got = {}

    class Client(Actor):
        def __init__(self):
            super().__init__("client")
            self.tcm = TcmClient(self, "c")

        async def run(self):
            await self.tcm.write("a", np.ones(4, np.float32))
            await self.tcm.access(writes=[("b", np.zeros(2, np.float32))], frees=["a"])
            got["r"] = await self.tcm.access(writes=[("a", np.full(3, 7, np.float32))], reads=["a", "b"])
            await self.tcm.free_all(["a", "b"])
            got["used"] = (await self.tcm.access(writes=[("c", np.ones(1, np.int8))], reads=["c"]))[0].nbytes

    system = System("tcm", seed=0, mode="data")
    c, t = system.add(Client()), system.add(Tcm("tcm", clients=["c"], capacity=64))
    system.connect(c.tcm.req, t.req, capacity=1)
    system.connect(t.out["c"], c.tcm.resp, capacity=1)
    res = await system.run_async()
    assert res.status == "finished", res.error
    a, b = got["r"]
    np.testing.assert_array_equal(a, np.full(3, 7, np.float32))   # the write came before the read
    np.testing.assert_array_equal(b, np.zeros(2, np.float32))
    assert t.used == 1 and t.peak == 16 + 8 and got["used"] == 1     # frees took "a" (16 B) and "b" off
    # five accesses, two of them answered (the two that read)
    assert _link(system, t, c).messages == 2 and _link(system, c, t).messages == 5


async def test_block_copies_happen_inside_the_tcm_in_one_posted_access(vclock):
    """TcmReq copies: a block into a new buffer, a buffer into another at an offset (cast to its dtype),
    in access order after the writes; a block outside its buffer is an error naming both."""
    from emulator.actor import Actor
    from emulator.system import System

    from actors.ahbm.memory import Tcm, TcmClient
    from actors.ahbm.tcm_block import copy_block, place_block

    got = {}
    src = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)

    class Client(Actor):
        def __init__(self, bad):
            super().__init__("client")
            self.tcm = TcmClient(self, "c")
            self.bad = bad

        async def run(self):
            await self.tcm.access(writes=[("src", src), ("dst", np.zeros((4, 4), np.float16))])
            await copy_block(self.tcm, "src", 2, 4, 2, 3, "blk")          # src[2:4, 4:7] -> new "blk"
            await place_block(self.tcm, "blk", 2, 3, "dst", 1, 0)        # "blk" -> dst[1:3, 0:3], as f16
            if self.bad:
                await place_block(self.tcm, "blk", 2, 3, "dst", 3, 2)    # rows 3:5 of a 4-row buffer
            got["r"] = await self.tcm.read_all(["blk", "dst"])

    for bad in (False, True):
        system = System("tcm", seed=0, mode="data")
        c, t = system.add(Client(bad)), system.add(Tcm("tcm", clients=["c"], capacity=1024))
        system.connect(c.tcm.req, t.req, capacity=1)
        system.connect(t.out["c"], c.tcm.resp, capacity=1)
        res = await system.run_async()
        if bad:
            assert res.status == "error" and "TCM block [3:5, 2:5] outside buffer 'dst' of shape (4, 4)" in res.error
            continue
        assert res.status == "finished", res.error
        blk, dst = got["r"]
        np.testing.assert_array_equal(blk, src[2:4, 4:7])
        want = np.zeros((4, 4), np.float16)
        want[1:3, 0:3] = src[2:4, 4:7]
        assert dst.dtype == np.float16 and np.array_equal(dst, want)
        assert t.used == src.nbytes + 4 * 4 * 2 + blk.nbytes
        # four accesses, one answered; each block move was a single posted request
        assert _link(system, c, t).messages == 4 and _link(system, t, c).messages == 1


async def test_a_composite_moves_each_tcm_block_in_one_message(vclock):
    """The PE scheduler's composite with A, B and C in the TCM: every operand block copied and every
    result block placed by one posted request (no answers), a GEMM command's operands read in one
    access (one answer per command)."""
    from actors.ahbm.tiles import plan

    m_, k_, n_ = 64, 128, 64
    ops = [{"op": "composite", "m": m_, "k": k_, "n": n_, "dtype": "<f2", "a_buf": "A", "b_buf": "B", "c_buf": "C",
            "c_dtype": "<f4"}]
    system, m, place = build({PE: ops}, mode="data")
    a = (np.arange(m_ * k_, dtype=np.float32).reshape(m_, k_) % 7 / 7).astype(np.float16)
    b = (np.arange(k_ * n_, dtype=np.float32).reshape(k_, n_) % 5 / 5).astype(np.float16)
    place.tcm_put(PE, "A", a)
    place.tcm_put(PE, "B", b)
    res = await system.run_async()
    assert res.status == "finished", res.error
    pe = m.pe(*PE)
    np.testing.assert_allclose(pe.tcm.bufs["C"], numerics.matmul(a, b, acc=np.float64), rtol=1e-3)
    steps = plan(m_, k_, n_, (32, 64, 32))
    sched_req, sched_resp = _link(system, pe.sched, pe.tcm), _link(system, pe.tcm, pe.sched)
    gemm_req, gemm_resp = _link(system, pe.gemm, pe.tcm), _link(system, pe.tcm, pe.gemm)
    moves = sum(s.load_a for s in steps) + sum(s.load_b for s in steps) + sum(s.last for s in steps)
    assert sched_resp.messages == 0                        # block moves are posted: nothing answered
    assert sched_req.messages == 1 + moves                 # + the request that creates the result buffer
    assert gemm_resp.messages == len(steps)                # each command's operands in one answered read
    assert gemm_req.messages == 2 * len(steps)             # that read, and one posted write of its results
