from emulator.testing import pair, run
from emulator.units import ns
from protocols.demo import Token


async def test_pair_latency(vclock):
    system, src, sink, link = pair([(0, Token(1, 1))], latency=ns(30))
    res = await run(system)
    assert res.status == "finished"
    assert sink.times == [30_000]
