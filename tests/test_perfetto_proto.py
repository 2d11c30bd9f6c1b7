"""The native Perfetto export (tools/trace/perfetto.py, protobuf): a well-formed Trace, exact times, names interned,
slices nested per track, flows paired, the same events as the JSON; a cap that says what it cut."""
import json
from collections import defaultdict

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from conftest import ROOT
from emulator.trace import BUSY, SEND, TraceStream, read_trace
from tools.trace.perfetto import export_perfetto

T = pb.TrackEvent


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    from actors import registry
    from emulator.scenario import load_scenario
    from tools.run.runner import run_scenario

    path = tmp_path_factory.mktemp("pf") / "decode.emutrace"
    res, _, _ = run_scenario(load_scenario(str(ROOT / "scenarios/ahbm/gqa/decode.yaml"), registry),
                             trace_path=str(path))
    assert res["status"] == "finished"
    return path


def parse(path) -> pb.Trace:
    t = pb.Trace()
    t.ParseFromString(path.read_bytes())
    return t


def test_the_trace_is_well_formed_and_exact(traced, tmp_path):
    out = tmp_path / "t.pftrace"
    stats = export_perfetto(TraceStream(str(traced), payloads=False), str(out))
    assert stats.format == "proto" and not stats.trimmed and stats.bytes == out.stat().st_size
    trace = parse(out)
    names, tracks, open_slices, flows_out, flows_in = {}, set(), defaultdict(list), set(), set()
    busy = []
    for p in trace.packet:
        assert p.trusted_packet_sequence_id == 1
        for n in p.interned_data.event_names:
            assert n.iid not in names, "an event name interned twice"
            names[n.iid] = n.name
        if p.HasField("track_descriptor"):
            tracks.add(p.track_descriptor.uuid)
        if not p.HasField("track_event"):
            continue
        te = p.track_event
        assert te.track_uuid in tracks, "an event on a track not described before it"
        if te.type == T.TYPE_SLICE_BEGIN:
            assert te.name_iid in names
            open_slices[te.track_uuid].append((p.timestamp, names[te.name_iid]))
        elif te.type == T.TYPE_SLICE_END:
            t0, name = open_slices[te.track_uuid].pop()
            assert p.timestamp >= t0
            busy.append((t0, p.timestamp, name))
        flows_out.update(te.flow_ids)
        flows_in.update(te.terminating_flow_ids)
    assert not any(open_slices.values())
    assert flows_in and flows_in <= flows_out                 # every arrow that ends has its start
    # each busy span of the emulator trace is a slice at its exact picoseconds (written as ns)
    want = sorted((ev[1], ev[3], ev[4]) for ev in read_trace(str(traced)).events if ev[0] == BUSY)
    assert sorted(busy) == want


def test_slices_on_a_track_never_overlap(traced, tmp_path):
    """A GEMM's drain overlaps the next command: a second lane keeps every slice track nested."""
    out = tmp_path / "t.pftrace"
    export_perfetto(TraceStream(str(traced), payloads=False), str(out))
    spans = defaultdict(list)
    begin = {}
    lanes = [p.track_descriptor.name for p in parse(out).packet if "lane 2" in p.track_descriptor.name]
    assert lanes, "the decode's GEMM engines overlap their spans: expected a second lane"
    for p in parse(out).packet:
        te = p.track_event
        if te.type == T.TYPE_SLICE_BEGIN:
            begin[te.track_uuid] = p.timestamp
        elif te.type == T.TYPE_SLICE_END:
            spans[te.track_uuid].append((begin.pop(te.track_uuid), p.timestamp))
    for s in spans.values():
        s.sort()
        assert all(a[1] <= b[0] for a, b in zip(s, s[1:]))


def test_proto_and_json_carry_the_same_events_and_proto_is_smaller(traced, tmp_path):
    pj, pp = tmp_path / "t.json", tmp_path / "t.pftrace"
    sj = export_perfetto(read_trace(str(traced)), str(pj))
    sp = export_perfetto(TraceStream(str(traced), payloads=False), str(pp))
    assert sj.events == sp.events and sj.format == "json"
    assert json.loads(pj.read_text())["traceEvents"]
    assert sp.bytes * 3 < sj.bytes
    sends = sum(1 for ev in read_trace(str(traced)).events if ev[0] == SEND)
    instants = [p for p in parse(pp).packet if p.track_event.type == T.TYPE_INSTANT and p.track_event.flow_ids]
    assert len(instants) == sends                              # every message's send carries its arrow


def test_a_trimmed_export_says_what_it_cut(traced, tmp_path, capsys):
    from tools.cli import main
    out = tmp_path / "cut.pftrace"
    assert main(["trace", "perfetto", str(traced), "-o", str(out), "--max-mb", "0.05", "--trim"]) == 0
    err = capsys.readouterr().err
    assert "trimmed at the 0.05 MB cap: the file stops at virtual time" in err and "trace events after it" in err
    assert out.stat().st_size <= 50_000
    last = [p.track_descriptor.name for p in parse(out).packet if p.HasField("track_descriptor")][-1]
    assert "trimmed at the 0.05 MB cap" in last and "digest" in last
