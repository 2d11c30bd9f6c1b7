"""Every fault kind of emulator/faults.py, on the demo machine, seen in the trace and the result.

Each test runs a scenario of scenarios/faults/ and the same scenario without
its faults (``--set faults=[]``) and compares the two traces at the message or
span the fault targets, so the effect measured is exactly the fault's.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from actors import registry
from emulator.errors import BuildError
from emulator.scenario import load_scenario
from emulator.schema import SchemaError
from emulator.trace import BUSY, DELIVER, FAULT, SEND, read_trace
from emulator.units import transfer_ps
from tools.run.runner import run_scenario

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ROOT / "scenarios" / "faults"


def run(tmp_path, name: str, *sets: str, tag: str = ""):
    sc = load_scenario(str(FAULTS / f"{name}.yaml"), registry, list(sets))
    path = tmp_path / f"{name}{tag}.emutrace"
    res, system, result = run_scenario(sc, trace_path=str(path))
    return res, result, read_trace(str(path))


def link_id(trace, name):
    return [l["name"] for l in trace.links].index(name)


def times(trace, kind, link_name):
    li = link_id(trace, link_name)
    return {ev[3]: ev[1] for ev in trace.events if ev[0] == kind and ev[2] == li}


def fault_events(trace):
    return [ev for ev in trace.events if ev[0] == FAULT]


LINK = "cube05/pe1.up->cube05/pe0.in"


CRITICAL = "cube15/pe0.up->cube14/pe0.in"   # the farthest CUBE's mesh link: on the reduce's critical path
BASE_END = 6_141_831                          # the fault-free end time of the three examples below


def round_latencies(result):
    return result.reports["cube05/pe0"]["round_latency_ps"]


def test_delay_example_shifts_the_end_of_the_run_by_the_delay(tmp_path):
    _, base_r, base = run(tmp_path, "delay", "faults=[]", tag="-base")
    res, r, tr = run(tmp_path, "delay")
    assert r.status == base_r.status == "finished" and base_r.end_time_ps == BASE_END
    d0, d1 = times(base, DELIVER, CRITICAL), times(tr, DELIVER, CRITICAL)
    assert d1[1] == d0[1]                     # round 0: outside the window
    assert d1[2] - d0[2] == 200_000           # round 1: +200 ns
    assert times(tr, SEND, CRITICAL) == times(base, SEND, CRITICAL)
    # what the comment of delay.yaml promises: the run (round 1) ends 200ns later, round 0 unchanged
    assert r.end_time_ps - base_r.end_time_ps == 200_000
    assert round_latencies(r) == [round_latencies(base_r)[0], round_latencies(base_r)[1] + 200_000]
    (f,) = fault_events(tr)
    assert f[2] == CRITICAL and f[3] == "delay@" + CRITICAL and f[4] == 2
    assert r.faults == [{"t_ps": f[1], "fault": "delay@" + CRITICAL, "index": 0, "kind": "delay",
                         "target": CRITICAL, "detail": {"seq": 2, "message": "Partial", "delay_ps": 200_000}}]


def test_delay_count_limits_the_injections(tmp_path):
    _, _, base = run(tmp_path, "delay", "faults=[]", tag="-base")
    _, r, tr = run(tmp_path, "delay", "faults.0.start=0ns", "faults.0.count=1")
    d0, d1 = times(base, DELIVER, CRITICAL), times(tr, DELIVER, CRITICAL)
    assert d1[1] - d0[1] == 200_000           # the first message: +200 ns
    assert d1[2] == d0[2]                     # count: 1 -> the second is on time
    assert len(r.faults) == 1


def test_drop_ends_in_a_deadlock_report_naming_the_waiting_actor(tmp_path, emu):
    res, r, tr = run(tmp_path, "drop")
    assert r.status == "deadlock"
    assert 1 in times(tr, SEND, LINK) and 1 not in times(tr, DELIVER, LINK)
    blocked = {b.actor: b for b in r.deadlock.blocked}
    assert blocked["cube05/pe0"].direction == "recv"
    assert "cube05/pe1" in blocked["cube05/pe0"].peers
    assert [f[3] for f in fault_events(tr)] == ["drop@" + LINK]
    # the real command: exit status 3 and the report, no traceback
    p = emu("run", FAULTS / "drop.yaml", "--no-bundle", "--quiet", check=3)
    assert "deadlock at t=" in p.stderr and "cube05/pe0: receiving on cube05/pe0.in" in p.stderr
    assert "Traceback" not in p.stderr


def test_corrupt_changes_the_content_and_the_result(tmp_path):
    base_res, _, base = run(tmp_path, "corrupt", "faults=[]", tag="-base")
    res, r, tr = run(tmp_path, "corrupt")   # seed 1: the flipped bits still decode
    assert r.status == "finished"
    li = link_id(tr, LINK)
    sent = {ev[3]: ev[5] for ev in tr.events if ev[0] == SEND and ev[2] == li}
    clean = {ev[3]: ev[5] for ev in base.events if ev[0] == SEND and ev[2] == li}
    for entry in r.faults:
        seq, bits = entry["detail"]["seq"], entry["detail"]["bits"]
        expect = bytearray(clean[seq])
        for pos in bits:
            expect[pos // 8] ^= 1 << (pos % 8)
        assert sent[seq] == bytes(expect) != clean[seq]   # exactly the logged bits were flipped
    assert len(r.faults) == 2
    assert res["max_abs_err"] > 100 * base_res["max_abs_err"]


def test_corrupt_that_breaks_decoding_is_a_protocol_error_naming_link_and_message(tmp_path, emu):
    res, r, tr = run(tmp_path, "corrupt", "seed=4")
    assert r.status == "error"
    assert f"link {LINK} failed" in r.error and "message Partial" in r.error and "ProtocolError" in r.error
    p = emu("run", FAULTS / "corrupt.yaml", "--set", "seed=4", "--no-bundle", "--quiet", check=1)
    assert f"protocol error on link {LINK}, message Partial" in p.stderr
    assert "Traceback" not in p.stderr


def test_slow_link_example_stretches_serialisation_and_the_run(tmp_path):
    _, base_r, base = run(tmp_path, "slow-link", "faults=[]", tag="-base")
    _, r, tr = run(tmp_path, "slow-link")
    assert r.status == "finished"
    nbytes = next(ev[4] for ev in tr.events if ev[0] == SEND and ev[2] == link_id(tr, CRITICAL))
    ser, slow = transfer_ps(nbytes, 32_000_000_000), transfer_ps(nbytes, 8_000_000_000)
    assert 4 * ser - 4 <= slow <= 4 * ser     # a quarter of the bandwidth (ps rounded up)
    d0, d1 = times(base, DELIVER, CRITICAL), times(tr, DELIVER, CRITICAL)
    assert d1[1] == d0[1]                     # window 5-10us: round 1 only
    assert d1[2] - d0[2] == slow - ser
    # the comment of slow-link.yaml: the run ends 3 x 132.0 ns later
    assert r.end_time_ps - base_r.end_time_ps == slow - ser == 395_906


def busy_spans(trace, actor):
    aid = trace.actors.index(actor)
    return [(ev[1], ev[3], ev[4]) for ev in trace.events if ev[0] == BUSY and ev[2] == aid]


def test_slow_actor_stretches_its_busy_spans_only(tmp_path):
    _, _, base = run(tmp_path, "slow-actor", "faults=[]", tag="-base")
    res, r, tr = run(tmp_path, "slow-actor")
    assert r.status == "finished"
    slow, fast = busy_spans(tr, "cube05/pe0"), busy_spans(base, "cube05/pe0")
    assert [e - s for s, e, _ in slow] == [2 * (e - s) for s, e, _ in fast]
    assert {lbl for *_, lbl in slow} == {"produce", "merge"}
    other = "cube05/pe1"
    assert [e - s for s, e, _ in busy_spans(tr, other)] == [e - s for s, e, _ in busy_spans(base, other)]
    assert len(r.faults) == len(slow)
    assert r.end_time_ps > base.footer["end_time_ps"]


def test_stall_example_holds_the_actor_and_the_run_ends_a_window_later(tmp_path):
    _, base_r, base = run(tmp_path, "stall", "faults=[]", tag="-base")
    res, r, tr = run(tmp_path, "stall")
    assert r.status == "finished"
    spans = busy_spans(tr, "cube15/pe7")
    assert spans[0] == busy_spans(base, "cube15/pe7")[0]                        # round 0: outside the window
    assert spans[1] == (5_000_000, 6_000_000 + 100_000, "produce (stalled)")   # held 1us, then 100ns of work
    up = "cube15/pe7.up->cube15/pe3.in"
    assert times(base, SEND, up)[2] == 5_100_000
    assert times(tr, SEND, up)[2] == 6_100_000
    assert times(tr, DELIVER, up)[2] - times(base, DELIVER, up)[2] == 1_000_000
    assert times(tr, SEND, up)[1] == times(base, SEND, up)[1]
    assert r.faults[0]["detail"] == {"label": "produce", "held_ps": 1_000_000}
    # the comment of stall.yaml: the run ends exactly 1us later
    assert r.end_time_ps - base_r.end_time_ps == 1_000_000


def test_kill_stops_the_actor_and_the_others_deadlock(tmp_path, emu):
    res, r, tr = run(tmp_path, "kill")
    assert r.status == "deadlock"
    blocked = {b.actor for b in r.deadlock.blocked}
    assert "ring/n2" not in blocked and blocked == {"ring/n0", "ring/n1", "ring/n3"}
    (f,) = fault_events(tr)
    assert f[1:4] == (100_000, "ring/n2", "kill@ring/n2")
    aid = tr.actors.index("ring/n2")
    out = link_id(tr, "ring/n2.out->ring/n3.in")
    after = [ev for ev in tr.events if ev[1] > 100_000 and ((ev[0] == BUSY and ev[2] == aid)
                                                           or (ev[0] == SEND and ev[2] == out))]
    assert after == []                         # nothing from ring/n2 after its death
    p = emu("run", FAULTS / "kill.yaml", "--no-bundle", "--quiet", check=3)
    assert "ring/n0: receiving on ring/n0.in" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("name", sorted(p.stem for p in FAULTS.glob("*.yaml")))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_fault_plan_ends_with_a_result_error_or_deadlock(tmp_path, name, seed):
    # probability 0.5 and other seeds: whatever is injected, the run ends cleanly
    sc = load_scenario(str(FAULTS / f"{name}.yaml"), registry, [f"seed={seed}", "faults.0.probability=0.5"])
    res, _, r = run_scenario(sc, trace_path=str(tmp_path / "t.emutrace"))
    assert r.status in ("finished", "deadlock", "error")
    if r.status == "error":
        assert "failed at t=" in r.error
    if r.status == "deadlock":
        assert r.deadlock.blocked


def test_fault_runs_are_deterministic(tmp_path):
    a = run(tmp_path, "corrupt", "faults.0.probability=0.5", tag="-a")[1]
    b = run(tmp_path, "corrupt", "faults.0.probability=0.5", tag="-b")[1]
    assert a.digest == b.digest


@pytest.mark.parametrize("entry, key, expected", [
    ("{kind: drop, actor: 'ring/n1'}", "kind", "an actor fault kind"),
    ("{kind: delay, link: 'ring/*'}", "delay", "'delay' for a delay fault"),
    ("{kind: slow, actor: 'ring/n1', factor: 0}", "factor", "a slow-down factor > 0"),
    ("{kind: stall, actor: 'ring/n1'}", "end", "the stall window's end"),
    ("{kind: kill, link: 'ring/*', at: 1ns}", "kind", "a link fault kind"),
    ("{kind: delay, link: 'ring/*', actor: 'ring/n1', delay: 1ns}", "link", "exactly one of"),
])
def test_bad_fault_entries_are_clear_errors(tmp_path, entry, key, expected):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"machine: {{profile: demo}}\nworkload: {{kind: ring, params: {{nodes: 4}}}}\nfaults:\n"
                   f"  - {entry}\n")
    with pytest.raises(SchemaError) as info:
        load_scenario(str(bad), registry)
    text = str(info.value)
    assert re.search(rf"bad\.yaml:4: (faults)?\[0\]\.{key}: expected .*{re.escape(expected)}", text), text


def test_bad_fault_entry_from_the_command_line_and_unmatched_glob(tmp_path, emu):
    bad = tmp_path / "bad.yaml"
    bad.write_text("machine: {profile: demo}\nworkload: {kind: ring, params: {nodes: 4}}\nfaults:\n"
                   "  - {kind: drop, actor: 'ring/n1'}\n")
    p = emu("validate", bad, check=2)
    assert "an actor fault kind" in p.stderr and "Traceback" not in p.stderr
    p = emu("run", FAULTS / "kill.yaml", "--set", "faults.0.actor=ring/n9", "--no-bundle", "--quiet", check=2)
    assert "faults[0].actor: no actor matches 'ring/n9'" in p.stderr and "Traceback" not in p.stderr


def test_slow_on_an_infinite_bandwidth_link_is_refused(tmp_path):
    sc = load_scenario(str(FAULTS / "slow-link.yaml"), registry,
                       ["machine.overrides.mesh_link.bandwidth=unlimited"])
    with pytest.raises(BuildError, match="matches only links of unlimited bandwidth"):
        run_scenario(sc, trace_path=str(tmp_path / "t.emutrace"))
