"""``emu trace summary`` on the real machines: a whole-run critical path through sub-actors, time by
component kind, one ``max_depth`` definition shared with ``links.csv``, and honest output on filtered traces."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REDUCE = ROOT / "scenarios" / "demo" / "reduce.yaml"


@pytest.fixture(scope="module")
def traces(machine_trace_files):
    """One AHBM prefill and one pccx program trace (tests/conftest.py)."""
    return machine_trace_files


def _summary(emu, path) -> dict:
    return json.loads(emu("trace", "summary", path, "--json", check=0).stdout)


def _check_chain(cp: list[dict], end: int) -> None:
    assert cp[0]["kind"] == "start" and cp[0]["start_ps"] == 0
    assert cp[-1]["end_ps"] == end
    for a, b in zip(cp, cp[1:]):
        assert a["end_ps"] == b["start_ps"], (a, b)          # the steps partition [0, end]
        # who acts at the boundary: a message ends at its receiver; after a poll, the polled actor answers
        at = a["to"] if a["kind"] == "message" else a["via"] if a["kind"] == "poll" else a["actor"]
        # (a blocked sender goes on when the receiver frees a credit)
        nxt = b["from"] if b["kind"] == "message" else b["freed_by"] if b["kind"] == "blocked" else b["actor"]
        assert nxt == at or b["kind"] == "poll", (a, b)


def test_ahbm_critical_path_covers_the_run_through_the_pe_sub_actors(traces, emu):
    s = _summary(emu, traces["ahbm"])
    cp, end = s["critical_path"], s["end_time_ps"]
    _check_chain(cp, end)
    assert len(cp) > 100
    kinds = s["critical_path_by_kind"]["components"]
    assert {"cpu", "gemm", "math", "dma", "host"} <= set(kinds)
    assert next(iter(kinds)) == "gemm"                     # the prefill is GEMM-bound along its path
    classes = s["critical_path_by_kind"]["link_classes"]
    assert {"cpu.gemm->gemm.cmd", "host.launch_3->cpu.launch", "cpu.pe_done->host.done"} <= set(classes)
    assert any(c.startswith("ipcq.") for c in classes)      # the reduce between PEs is on it
    total = sum(v["busy_ps"] + v["idle_ps"] for v in kinds.values()) + sum(
        v["flight_ps"] for v in classes.values())
    assert total == end
    text = emu("trace", "summary", traces["ahbm"], check=0).stdout
    assert "time along it by component kind" in text and "100 % of the run" in text


def test_pccx_critical_path_sees_through_the_driver_poll(traces, emu):
    s = _summary(emu, traces["pccx"])
    cp, end = s["critical_path"], s["end_time_ps"]
    _check_chain(cp, end)
    kinds = s["critical_path_by_kind"]["components"]
    # the weight stream through the HP ports, not the driver's 1us poll timer, decides the run
    assert next(iter(kinds)) == "hp"
    assert kinds["hp"]["busy_ps"] > end / 2
    assert {"l2", "cvo", "scheduler", "decoder"} <= set(kinds)
    polls = [st for st in cp if st["kind"] == "poll"]
    assert polls and all(st["actor"] == "pccx/driver" and st["via"] == "pccx/axil_stat" for st in polls)


def test_filtered_trace_says_what_it_cannot_compute(tmp_path, emu):
    path = tmp_path / "busy.emutrace"
    emu("run", REDUCE, "--no-bundle", "--quiet", "--trace", path, "--set", "trace.kinds=[busy]", check=0)
    text = emu("trace", "summary", path, check=0).stdout
    assert "utilisation per actor" in text
    assert "links: not computed -- needs the deliver, send events" in text
    assert "critical path: not computed -- needs the block, deliver, done, send, take events" in text
    assert "trace.kinds=[busy]" in text and " msgs " not in text
    s = _summary(emu, path)
    assert s["critical_path"] is None and s["links"] is None and set(s["missing"]) == {
        "links", "longest_waits", "critical_path"}
    path2 = tmp_path / "some.emutrace"
    emu("run", REDUCE, "--no-bundle", "--quiet", "--trace", path2, "--set", "trace.actors=[cube00/*]", check=0)
    assert "critical path: not computed" in emu("trace", "summary", path2, check=0).stdout


def test_links_csv_max_depth_is_the_summary_max_depth(tmp_path, emu):
    out = tmp_path / "bundle"
    # a fan-in root with a short merge period queues messages: depths above 1 occur
    emu("run", REDUCE, "--quiet", "--out", out, "--set", "trace.enabled=true", check=0)
    rows = {r["link"]: int(r["max_depth"]) for r in csv.DictReader(open(out / "links.csv"))}
    s = _summary(emu, out / "trace.emutrace")
    summ = {r["link"]: r["max_depth"] for r in s["links"]}
    assert rows == summ
    assert max(rows.values()) >= 1 and all(v >= 1 for l, v in rows.items() if s["links"])
