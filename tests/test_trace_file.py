"""Trace files: refused clearly when truncated or corrupt; memory bounded when time stands still."""
import msgpack
import pytest

from emulator.system import System
from emulator.trace import TraceOptions, read_trace
from emulator.testing import Sink, Source
from protocols.demo import Token

from conftest import ROOT


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "t.emutrace"
    system = System("t", trace=TraceOptions(path=str(path)))
    src = system.add(Source("src", [(0, Token(i, 1)) for i in range(20)]))
    sink = system.add(Sink("sink", 20))
    system.connect(src.out, sink.inp, capacity=2, latency=1000)
    assert system.run().status == "finished"
    return path


def test_a_whole_trace_reads_back(good):
    tr = read_trace(str(good))
    assert tr.footer["status"] == "finished" and len(tr.events) == tr.footer["events"]


def test_a_truncated_trace_is_refused(good, tmp_path):
    data = good.read_bytes()
    cut = tmp_path / "cut.emutrace"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated trace: no footer"):
        read_trace(str(cut))
    assert read_trace(str(cut), allow_truncated=True).events


def test_structurally_bad_traces_are_refused(tmp_path):
    bad = tmp_path / "bad.emutrace"
    bad.write_bytes(msgpack.packb({"format": "emutrace", "version": 1}))
    with pytest.raises(ValueError, match="no actor name list"):
        read_trace(str(bad))
    bad.write_bytes(msgpack.packb({"format": "emutrace", "actors": ["a"], "links": []}) + msgpack.packb([1, 0]))
    with pytest.raises(ValueError, match=r"event 0 \(deliver\) has 1 fields, expected 4"):
        read_trace(str(bad))
    bad.write_bytes(msgpack.packb({"format": "emutrace", "actors": ["a"], "links": []})
                    + msgpack.packb([3, 0, 7, 10, "x"]))
    with pytest.raises(ValueError, match="names actor 7 of 1"):
        read_trace(str(bad))


def test_cli_tools_refuse_a_truncated_trace_without_a_traceback(good, tmp_path, emu):
    cut = tmp_path / "cut.emutrace"
    data = good.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    for cmd in (["summary", cut], ["perfetto", cut, "-o", tmp_path / "o.json"], ["replay", cut, "--actor", "src"]):
        p = emu("trace", *cmd)
        assert p.returncode == 2 and "truncated trace" in p.stderr and "Traceback" not in p.stderr
    cut.write_bytes(data[:20])
    p = emu("trace", "summary", cut)
    assert p.returncode == 2 and "no complete header" in p.stderr


def test_event_buffer_stays_bounded_when_time_stands_still():
    # zero latency, infinite bandwidth, no service time: 60,000 messages at t = 0
    system = System("still")
    src = system.add(Source("src", [(0, Token(i % 100, 1)) for i in range(20_000)]))
    sink = system.add(Sink("sink", 20_000))
    system.connect(src.out, sink.inp, capacity=4)
    peak = 0
    flush = system.recorder.flush

    def watching_flush():
        nonlocal peak
        peak = max(peak, len(system.recorder.events))
        flush()

    system.recorder.flush = watching_flush
    res = system.run()
    assert res.status == "finished" and res.end_time_ps == 0 and res.events >= 60_000
    assert peak < 2 * 8192


def test_no_bundle_writes_no_trace_file(emu, tmp_path):
    p = emu("run", ROOT / "scenarios/faults/delay.yaml", "--no-bundle", check=0)
    assert "no trace file written" in p.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
def test_the_trace_file_holds_exactly_the_bytes_the_digest_hashes(tmp_path, monkeypatch, algorithm):
    """Issue #13: the digest function changed (sha256 -> XXH3-128), the hashed bytes did not."""
    from emulator import trace

    monkeypatch.setattr(trace, "DIGEST", algorithm)
    path = tmp_path / "t.emutrace"
    system = System("t", trace=TraceOptions(path=str(path)))
    src = system.add(Source("src", [(0, Token(i, 1)) for i in range(50)]))
    sink = system.add(Sink("sink", expect=50))
    system.connect(src.out, sink.inp, capacity=2, latency=1000, bandwidth=10**9)
    res = system.run()
    raw = path.read_bytes()
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(raw)
    unpacker.unpack()
    start = unpacker.tell()
    objs = []
    while True:
        obj = unpacker.unpack()
        if isinstance(obj, dict):
            break
        objs.append(obj)
        end = unpacker.tell()
    assert len(objs) == res.events
    assert trace.DIGESTS[algorithm](raw[start:end]).hexdigest() == res.digest == obj["digest"]
