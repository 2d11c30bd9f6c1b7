"""Links: latency + bytes/bandwidth, FIFO serialisation, independence of directions, back-pressure."""
import numpy as np
import pytest
import trio

from emulator.actor import Actor
from emulator.system import System
from emulator.testing import Sink, Source, pair, run
from emulator.units import ns, transfer_ps
from protocols.codec import TensorDesc, encode
from protocols.demo import Partial, Token

BW = 10 * 10**9  # 10 GB/s


def big(i, n=4096):
    return Partial(i, 1, None, None, TensorDesc.of((n,), "u1"))


async def test_single_message_time_is_latency_plus_bytes_over_bandwidth(vclock):
    msg = big(0)
    _, nbytes = encode(msg)
    assert nbytes > 4096                       # descriptor charged in full, plus the envelope
    system, src, sink, link = pair([(0, msg)], latency=ns(30), bandwidth=BW)
    await run(system)
    assert sink.times == [ns(30) + transfer_ps(nbytes, BW)]
    assert link.busy_ps == transfer_ps(nbytes, BW)


async def test_back_to_back_messages_serialise_fifo(vclock):
    msgs = [big(i) for i in range(5)]
    ser = [transfer_ps(encode(m)[1], BW) for m in msgs]
    system, src, sink, link = pair([(0, m) for m in msgs], capacity=8, latency=ns(30), bandwidth=BW)
    await run(system)
    expected = [ns(30) + sum(ser[:k + 1]) for k in range(5)]
    assert sink.times == expected
    assert [m.round for _, m in sink.got] == [0, 1, 2, 3, 4]


async def test_opposite_directions_are_independent(vclock):
    system = System("duplex")
    a_src, b_src = system.add(Source("a/src", [(0, big(i)) for i in range(3)])), \
        system.add(Source("b/src", [(0, big(i)) for i in range(3)]))
    a_sink, b_sink = system.add(Sink("a/sink", 3)), system.add(Sink("b/sink", 3))
    system.connect(a_src.out, b_sink.inp, capacity=4, latency=ns(10), bandwidth=BW)
    system.connect(b_src.out, a_sink.inp, capacity=4, latency=ns(10), bandwidth=BW)
    await run(system)
    # each direction sees only its own traffic: identical timelines
    assert a_sink.times == b_sink.times
    ser = transfer_ps(encode(big(0))[1], BW)
    assert b_sink.times == [ns(10) + ser * k for k in (1, 2, 3)]


async def test_full_link_blocks_the_sender(vclock):
    # capacity 2, a consumer that takes 100 ns per message: a message holds its
    # credit until the consumer takes it, so the 3rd send waits for the 1st take
    # (at 5 ns) and the 4th for the 2nd take (at 105 ns)
    script = [(0, Token(i, 1)) for i in range(4)]
    system, src, sink, link = pair(script, capacity=2, latency=ns(5), service=ns(100))
    await run(system)
    assert sink.times == [ns(5), ns(105), ns(205), ns(305)]
    assert src.sent_at == [0, 0, ns(5), ns(105)]
    assert link.blocked_count >= 1


async def test_fan_in_port_delivers_in_arrival_order(vclock):
    system = System("fanin")
    sink = system.add(Sink("sink", 4))
    fast = system.add(Source("fast", [(0, Token(1, 0)), (ns(50), Token(3, 0))]))
    slow = system.add(Source("slow", [(0, Token(2, 0)), (ns(50), Token(4, 0))]))
    system.connect(fast.out, sink.inp, latency=ns(10), capacity=2)
    system.connect(slow.out, sink.inp, latency=ns(20), capacity=2)
    await run(system)
    assert [(t, m.token) for t, m in sink.got] == [(ns(10), 1), (ns(20), 2), (ns(60), 3), (ns(70), 4)]


class Selector(Actor):
    def __init__(self, name):
        super().__init__(name)
        self.a, self.b = self.in_port("a"), self.in_port("b")
        self.got = []

    async def run(self):
        for _ in range(3):
            port, msg = await self.select(self.a, self.b)
            self.got.append((self.now, port.name, msg.token))


async def test_select_takes_whichever_port_delivers_first(vclock):
    system = System("select")
    sel = system.add(Selector("sel"))
    s1 = system.add(Source("s1", [(ns(30), Token(1, 0))]))
    s2 = system.add(Source("s2", [(ns(10), Token(2, 0)), (ns(40), Token(3, 0))]))
    system.connect(s1.out, sel.a, latency=ns(1))
    system.connect(s2.out, sel.b, latency=ns(1))
    await run(system)
    assert sel.got == [(ns(11), "b", 2), (ns(31), "a", 1), (ns(41), "b", 3)]


async def test_data_mode_arrays_arrive_equal_and_read_only(vclock):
    arr = np.arange(12, dtype=np.float16).reshape(3, 4)
    system, src, sink, link = pair([(0, Partial(0, 1, arr, arr.T, arr[:, 1]))], mode="data")
    await run(system)
    got = sink.got[0][1]
    assert np.array_equal(got.m, arr) and np.array_equal(got.l, arr.T) and np.array_equal(got.O, arr[:, 1])
    assert got.m.dtype == np.float16 and not got.m.flags.writeable


async def test_unregistered_message_is_a_protocol_error_naming_the_link(vclock):
    system, src, sink, link = pair([(0, {"not": "a record"})])
    res = await run(system)
    assert res.status == "error"
    assert "src.out->sink.in" in res.error and "not a registered message record" in res.error


# --------------------------------------------------------------------------- strict decode (issue #13)
STRICT_SUBSET = ["scenarios/demo/reduce.yaml", "scenarios/faults/corrupt.yaml", "scenarios/ahbm/attention_decode.yaml",
                 "scenarios/pccx/program.yaml", "scenarios/ahbm/microbench-data.yaml"]


@pytest.mark.parametrize("path", STRICT_SUBSET)
def test_strict_decode_gives_the_same_digest_as_the_hand_over(path, monkeypatch):
    """The one flag (EMU_STRICT_DECODE / link.STRICT_DECODE) decodes every message; nothing else changes."""
    from actors import registry
    from conftest import ROOT
    from emulator import link as link_module
    from emulator.scenario import load_scenario
    from tools.run.runner import run_scenario

    out = {}
    for strict in (False, True):
        monkeypatch.setattr(link_module, "STRICT_DECODE", strict)
        res, _, _ = run_scenario(load_scenario(ROOT / path, registry))
        out[strict] = (res["status"], res["digest"], res["end_time_ps"], res["messages"])
    assert out[False] == out[True]


def test_a_write_to_a_sent_array_is_an_error():
    O = np.zeros((8, 128), np.float32)

    class Writer(Actor):
        def __init__(self):
            super().__init__("w")
            self.out = self.out_port("out")

        async def run(self):
            await self.out.send(Partial(0, 1, O[0].copy(), O[1].copy(), O))
            O[0, 0] = 1.0

    sys_ = System("t", mode="data")
    w = sys_.add(Writer())
    sink = sys_.add(Sink("s", expect=1))
    sys_.connect(w.out, sink.inp, capacity=1, latency=ns(1), bandwidth=0)
    res = sys_.run()
    assert res.status == "error" and "read-only" in res.error


async def test_sender_side_serialisation_leaves_only_latency_and_counts_the_reported_occupancy(vclock):
    msg = big(0)
    system, src, sink, link = pair([(0, msg)], latency=ns(30), bandwidth=BW)
    assert link.serialise_at_sender() == BW
    assert link.serialise_at_sender() == BW      # idempotent: the modelled figure is kept
    link.charge_occupancy(123)
    await run(system)
    assert sink.times == [ns(30)]                # the sender serialises: the link adds its latency only
    assert link.busy_ps == 123


def test_ports_tell_their_peer_and_the_capacity_of_a_link_from_it():
    system, src, sink, link = pair([], capacity=3, latency=0)
    other = system.add(Source("other", []))
    assert src.out.peer is sink
    assert sink.inp.capacity_from(src) == 3
    assert sink.inp.capacity_from(other) is None
    assert other.out.peer is None


class _Failing(Actor):
    caught = None

    async def run(self):
        async def bad():
            await self.sleep(ns(1))
            raise ValueError("sub-task broke")

        try:
            async with self.subtasks() as n:
                n.start_soon(bad)
                n.start_soon(trio.sleep_forever)
        except BaseException as e:
            self.caught = e
            raise


async def test_an_actor_sub_task_error_is_raised_plain_with_the_actor_named(vclock):
    system = System("subtasks")
    actor = system.add(_Failing("failing"))
    res = await run(system)
    assert type(actor.caught) is ValueError                     # plain, not an exception group
    assert res.status == "error"
    assert "failing failed at t=1000 ps: ValueError: sub-task broke" in res.error   # not an exception group
