"""TCM accesses (actors/ahbm/memory.py): one message per access, answered only when it reads.

A MATH op reads all its operands in one access; its result write is posted, or
rides on the next queued op's operand read; a script ``free`` is posted.  The
results and the timing are those of the per-buffer protocol (the formula tests
in test_ahbm_engines.py and the fidelity tests check the timing).
"""
import numpy as np

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
    from tools.bench import message_pairs
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
