"""``emu trace perfetto | summary | diff`` through the real ``emu`` command, plus the pieces in-process."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from actors import registry
from emulator.scenario import load_scenario
from emulator.trace import read_trace
from tools.run.runner import run_scenario
from tools.trace.summary import critical_path, summarise

ROOT = Path(__file__).resolve().parents[1]
REDUCE = ROOT / "scenarios" / "demo" / "reduce.yaml"
SMALL = ["workload.params.rounds=2", "machine.overrides.cubes_x=2", "machine.overrides.cubes_y=2",
         "workload.params.root=[1,1]"]


def record(path, scenario=REDUCE, sets=()):
    sc = load_scenario(str(scenario), registry, list(sets))
    res, _, result = run_scenario(sc, trace_path=str(path))
    return res, read_trace(str(path))


@pytest.fixture(scope="module")
def reduce_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "reduce.emutrace"
    res, tr = record(path, sets=SMALL)
    assert res["status"] == "finished"
    return path, tr


# -- perfetto ---------------------------------------------------------------------
def test_perfetto_json_has_tracks_flows_counters_and_instants(reduce_trace, emu, tmp_path):
    path, tr = reduce_trace
    out = tmp_path / "out.json"
    p = emu("trace", "perfetto", path, "-o", out, check=0)
    assert f"wrote {out}" in p.stdout
    doc = json.loads(out.read_text())
    evs = doc["traceEvents"]
    threads = {e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    procs = {e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    assert threads == set(tr.actors)
    assert procs == {"cube00", "cube01", "cube02", "cube03"}
    # a thread lives in the process of its top-level group
    pid_of = {e["args"]["name"]: e["pid"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    for e in evs:
        if e["ph"] == "M" and e["name"] == "thread_name":
            assert e["pid"] == pid_of[e["args"]["name"].split("/")[0]]
    busy = [e for e in evs if e["ph"] == "X" and e["cat"] == "busy"]
    assert len(busy) == sum(1 for ev in tr.events if ev[0] == 3)
    b = next(e for e in busy if e["name"] == "merge")
    assert b["dur"] == pytest.approx((b["args"]["t_end_ps"] - b["args"]["t_ps"]) / 1e6)
    starts = {e["id"]: e for e in evs if e["ph"] == "s"}
    ends = {e["id"]: e for e in evs if e["ph"] == "f"}
    n_msgs = sum(1 for ev in tr.events if ev[0] == 1)
    assert len(starts) == len(ends) == n_msgs > 0
    for i, s in starts.items():
        assert ends[i]["ts"] > s["ts"]              # every message flies forward in time
        assert (ends[i]["pid"], ends[i]["tid"]) != (s["pid"], s["tid"])
    counters = [e for e in evs if e["ph"] == "C"]
    assert counters and all(e["name"].startswith("queue ") and "depth" in e["args"] for e in counters)
    assert any(e["ph"] == "i" and e["name"] == "round_done" for e in evs)   # marks
    assert any(e["ph"] == "i" and e["name"] == "done" for e in evs)


def test_perfetto_filters(reduce_trace, emu, tmp_path):
    path, tr = reduce_trace
    out = tmp_path / "f.json"
    emu("trace", "perfetto", path, "-o", out, "--actors", "cube00/*", "--kinds", "busy,send,deliver",
        "--start", "5us", "--end", "6us", check=0)
    evs = json.loads(out.read_text())["traceEvents"]
    threads = {e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == {a for a in tr.actors if a.startswith("cube00/")}
    data = [e for e in evs if e["ph"] != "M"]
    assert data and all(5.0 <= e["ts"] <= 6.0 for e in data)
    assert {e["ph"] for e in data} == {"X", "s", "f", "C"}       # no mark/done/fault instants
    emu("trace", "perfetto", path, "-o", out, "--kinds", "busy", "--kinds", "send", check=0)
    data = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] != "M"]
    assert {e["ph"] for e in data} == {"X"}                        # no deliveries: no flows, no counters


def test_perfetto_size_cap_refuses_or_trims(reduce_trace, emu, tmp_path):
    path, _ = reduce_trace
    out = tmp_path / "big.json"
    p = emu("trace", "perfetto", path, "-o", out, "--max-mb", "0.01", check=1)
    assert "would exceed 0.01 MB" in p.stderr and "--trim" in p.stderr and not out.exists()
    p = emu("trace", "perfetto", path, "-o", out, "--max-mb", "0.01", "--trim", check=0)
    assert "trimmed" in p.stderr
    assert 0 < out.stat().st_size <= 10_000
    json.loads(out.read_text())


def test_perfetto_bad_arguments_are_clear(reduce_trace, emu, tmp_path):
    path, _ = reduce_trace
    p = emu("trace", "perfetto", path, "--kinds", "bussy", check=2)
    assert "unknown event kind(s) bussy" in p.stderr
    p = emu("trace", "perfetto", path, "--start", "5 parsecs", check=2)
    assert "--start" in p.stderr and "Traceback" not in p.stderr
    p = emu("trace", "perfetto", tmp_path / "missing.emutrace", check=2)
    assert "no such trace file" in p.stderr
    junk = tmp_path / "junk.emutrace"
    junk.write_bytes(b"\x93\x01\x02")
    p = emu("trace", "summary", junk, check=2)
    assert "not an emulator trace" in p.stderr and "Traceback" not in p.stderr


# -- summary ----------------------------------------------------------------------
def test_summary_numbers_match_the_trace(reduce_trace, emu):
    path, tr = reduce_trace
    s = json.loads(emu("trace", "summary", path, "--json", check=0).stdout)
    assert s["status"] == "finished" and s["end_time_ps"] == tr.footer["end_time_ps"]
    root = next(r for r in s["actors"] if r["actor"] == "cube03/pe0")    # root [1,1] of a 2x2 mesh
    spans = [ev for ev in tr.events if ev[0] == 3 and tr.actors[ev[2]] == "cube03/pe0"]
    assert root["busy_ps"] == sum(ev[3] - ev[1] for ev in spans)
    assert root["utilisation"] == pytest.approx(root["busy_ps"] / s["end_time_ps"], rel=1e-5)
    link = next(r for r in s["links"] if r["link"] == "cube00/pe1.up->cube00/pe0.in")
    assert link["messages"] == 2 and link["delivered"] == 2 and link["lost"] == 0
    assert link["bytes"] == sum(ev[4] for ev in tr.events if ev[0] == 0
                                and tr.links[ev[2]]["name"] == link["link"])
    waits = s["longest_waits"]
    assert waits == sorted(waits, key=lambda w: -w["wait_ps"])
    assert all(w["taken_ps"] - w["delivered_ps"] == w["wait_ps"] for w in waits)


def test_critical_path_is_a_connected_chain_to_the_end(reduce_trace):
    _, tr = reduce_trace
    cp = critical_path(tr)
    assert cp[0]["kind"] == "start"
    assert cp[-1]["end_ps"] == tr.footer["end_time_ps"]
    assert cp[-1]["kind"] == "busy" and cp[-1]["actor"] == "cube03/pe0"
    for a, b in zip(cp, cp[1:]):
        assert a["end_ps"] == b["start_ps"]               # no gap: each step enables the next
        if b["kind"] == "message":
            assert a["actor"] == b["from"]
        if a["kind"] == "message":
            assert b["actor"] == a["to"]
    # the whole run: a leaf produces at 0, waits for its period, and the last round starts at 5us
    assert cp[0]["start_ps"] == 0 and cp[1]["label"] == "produce"
    idle = next(s for s in cp if s["kind"] == "idle")
    assert idle["end_ps"] == 5_000_000 and idle["actor"] == cp[0]["actor"]
    assert {s["kind"] for s in cp} == {"start", "busy", "idle", "message"}


def test_critical_path_follows_a_delayed_message(tmp_path):
    # delay one leaf's last message by 1us: it becomes the critical path
    _, tr = record(tmp_path / "d.emutrace", sets=SMALL + [
        'faults=[{kind: delay, link: "cube02/pe6.up->*", delay: 1us, start: 5us}]'])
    cp = critical_path(tr)
    msgs = [s for s in cp if s["kind"] == "message"]
    assert msgs[0]["link"] == "cube02/pe6.up->cube02/pe2.in"
    assert msgs[0]["end_ps"] - msgs[0]["start_ps"] > 1_000_000


def test_summary_text_and_a_deadlocked_trace(tmp_path, emu):
    path = tmp_path / "dl.emutrace"
    emu("run", ROOT / "scenarios" / "demo" / "deadlock.yaml", "--trace", path, "--no-bundle", "--quiet", check=3)
    p = emu("trace", "summary", path, check=0)
    assert "deadlock" in p.stdout and "utilisation per actor" in p.stdout and "critical path" in p.stdout
    assert "sender blocked" in p.stdout
    s = summarise(read_trace(str(path)))
    assert s["errors"] and s["errors"][0]["where"] == "deadlock"
    # every node sent one token at 0 and blocked on the second: the run ended with a token arriving
    cp = s["critical_path"]
    assert [st["kind"] for st in cp] == ["start", "message"]
    assert cp[-1]["end_ps"] == s["end_time_ps"] and cp[-1]["from"] == cp[0]["actor"]


def test_critical_path_of_a_killed_ring_ends_at_the_dead_node(tmp_path):
    _, tr = record(tmp_path / "k.emutrace", ROOT / "scenarios" / "faults" / "kill.yaml")
    cp = critical_path(tr)
    assert cp[-1]["kind"] == "message" and cp[-1]["to"] == "ring/n2"      # nobody takes it any more
    assert cp[-1]["end_ps"] == tr.footer["end_time_ps"]
    assert cp[0]["kind"] == "start" and cp[0]["start_ps"] == 0        # initial tokens leave at 0
    for a, b in zip(cp, cp[1:]):
        assert a["end_ps"] == b["start_ps"]
        assert {a["kind"], b["kind"]} <= {"start", "busy", "idle", "message"} and a["kind"] != b["kind"]


# -- diff -------------------------------------------------------------------------
def test_diff_same_seed_identical_other_seed_points_at_first_difference(tmp_path, emu):
    a, b, c = tmp_path / "a.emutrace", tmp_path / "b.emutrace", tmp_path / "c.emutrace"
    small = [x for s in SMALL for x in ("--set", s)]
    emu("run", REDUCE, "--trace", a, "--no-bundle", "--quiet", *small, check=0)
    emu("run", REDUCE, "--trace", b, "--no-bundle", "--quiet", *small, check=0)
    emu("run", REDUCE, "--trace", c, "--no-bundle", "--quiet", *small, "--set", "seed=2", check=0)
    p = emu("trace", "diff", a, b, check=0)
    assert p.stdout.startswith("identical:")
    p = emu("trace", "diff", a, c, check=1)
    ta, tc = read_trace(str(a)), read_trace(str(c))
    first = next(i for i, (x, y) in enumerate(zip(ta.events, tc.events)) if x != y)
    assert f"traces differ at event {first}" in p.stdout
    assert f"A [{first}]: {ta.describe(ta.events[first])}" in p.stdout
    assert f"B [{first}]: {tc.describe(tc.events[first])}" in p.stdout
    assert "note: seed differs: 1 vs 2" in p.stdout
    assert "the payloads differ first at byte" in p.stdout     # data mode: inputs drawn from the seed
    assert f"[{first - 1}]" in p.stdout                          # context before it


def test_diff_of_different_lengths(tmp_path):
    from tools.trace.diff import diff_traces

    _, a = record(tmp_path / "a.emutrace", sets=SMALL)
    _, b = record(tmp_path / "b.emutrace", sets=SMALL[:-1] + ["workload.params.root=[1,1]",
                                                             "workload.params.rounds=1"])
    res = diff_traces(a, b)
    assert not res.identical and res.index is not None and res.a_len > res.b_len
    assert diff_traces(a, a).identical


def test_the_compact_trace_reads_like_the_tuples_in_25_bytes_an_event(machine_trace_files):
    """emu trace summary streams the trace into columns (tools/trace/compact.py): same events, flat memory."""
    from tools.trace.compact import compact
    for path in machine_trace_files.values():
        full = read_trace(str(path))
        ct = compact(str(path))
        assert len(ct.events) == len(full.events) and ct.footer == full.footer
        for i, ev in enumerate(full.events):
            want = ev[:5] + (None,) if ev[0] == 0 else ev     # a SEND's payload is not kept
            assert ct.events[i] == want, (i, ev)
        columns = sum(x.nbytes for x in (ct.k, ct.t, ct.a, ct.b, ct.c))
        assert columns == 25 * len(full.events)
        assert summarise(ct) == summarise(full)


def test_compact_of_an_irregular_file_says_what_the_checked_stream_says(reduce_trace, tmp_path):
    """compact(path) reads a file in one fast loop (tools/trace/compact.py _compact_file); a file that fails
    its checks (a link index out of range, no footer) gets the checked stream's error, not wrong columns."""
    import msgpack

    from emulator.trace import SEND, iter_trace
    from tools.trace.compact import _compact_file, compact

    trace_path, _ = reduce_trace
    objs = list(iter_trace(str(trace_path)))
    first_send = next(i for i, o in enumerate(objs) if isinstance(o, (list, tuple)) and o[0] == SEND)
    n_links = len(objs[0]["links"])
    bad = list(objs)
    bad[first_send] = (SEND, bad[first_send][1], n_links, *bad[first_send][3:])
    cases = {"bad-link": (bad, f"event {first_send - 1} (send) names link {n_links} of {n_links}"),
             "no-footer": (objs[:-1], "truncated trace: no footer")}
    for name, (seq, message) in cases.items():
        path = tmp_path / f"{name}.emutrace"
        path.write_bytes(b"".join(msgpack.packb(o, use_bin_type=True) for o in seq))
        assert _compact_file(str(path)) is None
        with pytest.raises(ValueError, match=re.escape(message)):
            compact(str(path))
    assert _compact_file(str(trace_path)) is not None       # a regular file takes the fast loop
