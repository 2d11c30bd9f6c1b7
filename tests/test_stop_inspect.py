"""``emu run --stop-at T`` and ``emu inspect``: a run broken at a virtual time, the machine's state there
(emulator/snapshot.py), read back from the bundle -- checked against the trace of the same run to its end."""
import json
import subprocess

import msgpack
import pytest

import protocols.ahbm  # noqa: F401  (registers the AHBM message tags the trace's payloads use)
from conftest import EMU, ROOT
from emulator.trace import DELIVER, DIGEST, DIGESTS, SEND, read_trace
from protocols.codec import decode

DECODE_SP = str(ROOT / "scenarios/ahbm/gqa/decode_sp.yaml")


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """The decode_sp run to its end with its trace, once for the module's tests."""
    out = tmp_path_factory.mktemp("full") / "bundle"
    subprocess.run([*EMU, "run", DECODE_SP, "--quiet", "--out", str(out)], check=True, capture_output=True)
    return read_trace(str(out / "trace.emutrace"))


def _first_ipcq_hop(tf):
    """The first IPCQ-to-IPCQ message of the run (the Level-2 reduction's first hop): (link name, send, delivery)."""
    links = tf.header["links"]
    hop = {i for i, l in enumerate(links) if l["src"].endswith("/ipcq") and l["dst"].endswith("/ipcq")}
    send = next(e for e in tf.events if e[0] == SEND and e[2] in hop)
    deliver = next(e for e in tf.events if e[0] == DELIVER and e[2] == send[2] and e[3] == send[3])
    return links[send[2]]["name"], send, deliver


def test_a_stop_between_a_reduction_send_and_its_delivery_shows_it_in_flight(emu, tmp_path, full_run):
    tf = full_run
    name, send, deliver = _first_ipcq_hop(tf)
    t = (send[1] + deliver[1]) // 2                   # after the partial left, before it arrived
    r = emu("run", DECODE_SP, "--quiet", "--out", tmp_path / "stop", "--stop-at", f"{t}ps", check=0)
    assert "stopped at" in r.stdout and "state digest" in r.stdout
    res = json.loads((tmp_path / "stop" / "result.json").read_text())
    assert res["status"] == "stopped" and res["end_time_ps"] == t and res["state"]["file"] == "state.json"
    snap = json.loads((tmp_path / "stop" / "state.json").read_text())
    assert snap["t_ps"] == t and snap["state_digest"] == res["state"]["state_digest"]
    flight = snap["links"][name]["in_flight"]
    assert {"seq": send[3], "kind": type(decode(send[5])).__name__, "bytes": send[4], "deliver_ps": deliver[1]} \
        in flight, flight
    # every message the snapshot has in flight is one the full run sent before t and delivered after it
    by_name = {l["name"]: i for i, l in enumerate(tf.header["links"])}
    sent = {(e[2], e[3]): e[1] for e in tf.events if e[0] == SEND}
    delivered = {(e[2], e[3]): e[1] for e in tf.events if e[0] == DELIVER}
    for lname, l in snap["links"].items():
        for m in l["in_flight"]:
            key = (by_name[lname], m["seq"])
            assert sent[key] <= t < delivered[key] == m["deliver_ps"], (lname, m)
    # the stop is the run's own prefix: the digest of the events up to t is the full trace's first events'
    h = DIGESTS[DIGEST]()
    for ev in tf.events[:snap["events"]]:
        h.update(msgpack.packb(ev, use_bin_type=True))
    assert h.hexdigest() == snap["trace_digest"]
    # and the receiving CPU's side of it: the IPCQ it goes to has not yet seen it
    out = emu("inspect", tmp_path / "stop", "--actor", name.split("->")[1].split(".")[0], check=0).stdout
    assert f"state at {res['state']['t_ps'] / 1e6:g}us" in out or f"({t} ps)" in out
    assert name in out and f"in flight: {type(decode(send[5])).__name__}" in out, out


def test_the_same_stop_gives_the_same_state_in_two_processes(emu, tmp_path):
    digests = []
    for i in range(2):
        emu("run", DECODE_SP, "--quiet", "--out", tmp_path / f"s{i}", "--stop-at", "1.2us", check=0)
        digests.append(json.loads((tmp_path / f"s{i}" / "result.json").read_text())["state"]["state_digest"])
    assert digests[0] == digests[1]
    snap = json.loads((tmp_path / "s0" / "state.json").read_text())
    busy = [d for d in snap["actors"].values() if d["state"] == "busy"]
    assert busy and all(d["busy_until_ps"] > snap["t_ps"] and d["busy_label"] for d in busy)
    tcm = [d for n, d in snap["actors"].items() if n.endswith("/tcm")]
    assert tcm and all(sum(d["component"]["bytes_by_buffer"].values()) <= d["component"]["used"] for d in tcm)
    tree = emu("inspect", tmp_path / "s0", "--tree", check=0).stdout
    assert "\n  sip0/\n    cube00/\n" in tree and "[Tcm]: idle; used=" in tree


def test_bad_stops_and_bundles_without_a_state_are_clear_errors(emu, tmp_path):
    r = emu("run", DECODE_SP, "--quiet", "--no-bundle", "--stop-at", "1s", check=2)
    assert "--stop-at 1s: the run finished at" in r.stderr and "before it" in r.stderr
    r = emu("run", DECODE_SP, "--quiet", "--no-bundle", "--stop-at", "5", check=2)
    assert "--stop-at: expected a time with a unit" in r.stderr and "Traceback" not in r.stderr
    emu("run", DECODE_SP, "--quiet", "--out", tmp_path / "whole", check=0)
    r = emu("inspect", tmp_path / "whole", check=2)
    assert "no state.json" in r.stderr and "--stop-at" in r.stderr
    (tmp_path / "bad.json").write_text("[1, 2]")
    r = emu("inspect", tmp_path / "bad.json", check=2)
    assert "not a state snapshot" in r.stderr


def test_bisect_finds_the_checkpoint_interval_where_a_fault_makes_two_runs_part(emu, tmp_path, full_run):
    """Checkpoints cost no change to the run (same digest); two runs with the same checkpoints agree; a delay
    fault on the first reduction hop's link parts them in the interval that holds the hop's send."""
    tf = full_run
    name, send, _ = _first_ipcq_hop(tf)
    runs = {}
    for key, sets in (("a", []), ("b", []),
                      ("fault", ["--set", f'faults=[{{kind: delay, link: "{name}", delay: 5ns, start: 1ps}}]'])):
        r = emu("run", DECODE_SP, "--quiet", "--no-bundle", "--json", "--compact", "--checkpoint-every", "200ns",
                *sets, check=0)
        (tmp_path / f"{key}.json").write_text(r.stdout)
        runs[key] = json.loads(r.stdout)
    assert runs["a"]["digest"] == tf.footer["digest"]            # checkpoints change nothing
    marks = runs["a"]["checkpoints"]["marks"]
    assert marks and all(m["t_ps"] % 200_000 == 0 and m["from_ps"] <= m["t_ps"] for m in marks)
    assert emu("bisect", tmp_path / "a.json", tmp_path / "b.json", check=0).stdout.startswith("same state")
    out = emu("bisect", tmp_path / "a.json", tmp_path / "fault.json", check=1).stdout
    lo, hi = send[1] - send[1] % 200_000, send[1] - send[1] % 200_000 + 200_000
    from emulator.units import format_time
    assert f"the runs part between {format_time(lo)} and {format_time(hi)}" in out, (out, send[1])
    r = emu("bisect", tmp_path / "a.json", tmp_path / "missing.json", check=2)
    assert "no readable result.json" in r.stderr


def test_stop_on_a_condition_is_the_stop_at_its_time(emu, tmp_path, full_run):
    """--stop-on stops at the end of the step where the event happens: the same state as --stop-at that time
    (the reduction's first hop found in the full run's trace); #N counts matches; a condition that never
    fires, or a malformed one, is a clear error."""
    tf = full_run
    name, send, _ = _first_ipcq_hop(tf)
    on = json.loads(emu("run", DECODE_SP, "--quiet", "--out", tmp_path / "on", "--json", "--compact",
                        "--stop-on", "send IpcqData on *ipcq.tx_*", check=0).stdout)
    at = json.loads(emu("run", DECODE_SP, "--quiet", "--out", tmp_path / "at", "--json", "--compact",
                        "--stop-at", f"{send[1]}ps", check=0).stdout)
    assert on["status"] == "stopped" and on["end_time_ps"] == send[1]
    assert on["state"]["condition"]["matched"] == f"IpcqData #{send[3]} sent on {name}"
    assert on["state"]["state_digest"] == at["state"]["state_digest"]
    third = json.loads(emu("run", DECODE_SP, "--quiet", "--no-bundle", "--json", "--compact",
                           "--stop-on", "busy */gemm 'gemm*' #3", check=0).stdout)
    gemm_starts = sorted(e[1] for e in tf.events if e[0] == 3 and tf.header["actors"][e[2]].endswith("/gemm")
                         and str(e[4]).startswith("gemm"))
    assert third["end_time_ps"] == gemm_starts[2]
    r = emu("run", DECODE_SP, "--quiet", "--no-bundle", "--stop-on", "fault", check=2)
    assert "--stop-on 'fault' never happened: the run finished at 2.046us" in r.stderr
    r = emu("run", DECODE_SP, "--quiet", "--no-bundle", "--stop-on", "send IpcqData at x", check=2)
    assert "expected send KIND [on LINKGLOB]" in r.stderr and "Traceback" not in r.stderr
