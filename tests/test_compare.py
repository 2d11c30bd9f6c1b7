"""Several runs per test and ``emu compare A B``: result, per-link and per-actor deltas."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from emulator.units import format_time

ROOT = Path(__file__).resolve().parents[1]
REDUCE = ROOT / "scenarios" / "demo" / "reduce.yaml"
SMALL = ["workload.params.rounds=1", "machine.overrides.cubes_x=2", "machine.overrides.cubes_y=2",
         "workload.params.root=[1,1]"]
# a leaf's message into its CUBE root, 1us late: the whole reduce waits for (most of) it
DELAY = {"kind": "delay", "link": "cube02/pe6.up->*", "delay": "1us"}


def test_a_test_runs_a_baseline_and_a_faulted_variant_and_compares_them(emu_sim):
    base = emu_sim.run_sync(REDUCE, set=SMALL, label="baseline")
    again = emu_sim.run_sync(REDUCE, set=SMALL)
    slow = emu_sim.run_sync(REDUCE, set=SMALL, faults=[DELAY], label="delayed")
    same = emu_sim.compare(base, again)
    assert same.identical and same.end_time_delta == 0
    assert all(r["busy_ps"][2] == 0 for r in same.actors) and all(r["bytes"][2] == 0 for r in same.links)
    d = emu_sim.compare(base, slow)
    assert not d.identical
    assert d.end_time_delta == slow.end_time - base.end_time
    assert 500_000 < d.end_time_delta <= 1_000_000                  # most of the 1us is on the critical path
    assert d.result["status"] == ("finished", "finished")
    # the same messages and bytes everywhere; only timing moved
    assert d.link("*")["messages"][2] == 0 and d.link("*")["bytes"][2] == 0
    assert d.link("cube02/pe6.up->*")["messages"] == (1, 1, 0)
    assert d.link("cube02/pe6.up->*")["flight_ps"][2] == 1_000_000      # where the time went
    assert d.links[0]["link"] == "cube02/pe6.up->cube02/pe2.in"        # the most changed link first
    assert d.actor("*")["busy_ps"][2] == 0                       # the same work, later
    assert "fault" in d.divergence and d.a.label == "baseline" and d.b.label == "delayed"
    with pytest.raises(KeyError, match="no link matches 'nowhere'"):
        d.link("nowhere")


def test_per_actor_deltas_when_the_work_changes(emu_sim):
    base = emu_sim.run_sync(REDUCE, set=SMALL)
    slow = emu_sim.run_sync(REDUCE, set=SMALL + ["workload.params.merge=16ns"])
    d = emu_sim.compare(base, slow)
    root = d.actor("cube03/pe0")                                 # 4 merges, 8ns more each
    assert root["busy_ps"][2] == 4 * 8_000 and root["spans"][2] == 0
    assert d.actors[0]["busy_ps"][2] == max(r["busy_ps"][2] for r in d.actors)   # most changed first
    assert d.end_time_delta > 0


def test_cli_compare_of_two_bundles_and_two_traces(tmp_path, emu):
    a, b = tmp_path / "a", tmp_path / "b"
    sets = [x for s in SMALL + ["trace.enabled=true"] for x in ("--set", s)]
    emu("run", REDUCE, "--quiet", "--out", a, *sets, check=0)
    emu("run", REDUCE, "--quiet", "--out", b, *sets, "--set",
        'faults=[{kind: delay, link: "cube02/pe6.up->*", delay: 1us}]', check=0)
    p = emu("compare", a, b, check=0)
    ra, rb = (json.loads((d / "result.json").read_text()) for d in (a, b))
    delta = rb["end_time_ps"] - ra["end_time_ps"]
    assert 500_000 < delta <= 1_000_000
    assert f"+{format_time(delta)} (+" in p.stdout
    assert "actors whose busy time changed: 0 of 32" in p.stdout
    assert "links whose traffic or flight time changed: 1 of" in p.stdout
    assert "cube02/pe6.up->cube02/pe2.in" in p.stdout and "flight time +1us" in p.stdout
    assert "first diverging trace event:" in p.stdout and "fault" in p.stdout
    js = json.loads(emu("compare", a, b, "--json", check=0).stdout)
    assert js["end_time_delta_ps"] == delta and js["identical"] is False
    assert {r["link"] for r in js["links"]} == {r["link"] for r in json.loads(
        emu("compare", a, a, "--json", check=0).stdout)["links"]}
    same = emu("compare", a / "trace.emutrace", a / "trace.emutrace", check=0).stdout
    assert "identical runs" in same
    t = emu("compare", a / "trace.emutrace", b / "trace.emutrace", "--json", check=0).stdout
    assert json.loads(t)["end_time_delta_ps"] == delta
    bad = emu("compare", a, tmp_path / "missing", check=2)   # bad input: exit 2 (docs/exit-codes.md)
    assert "no such bundle directory or trace file" in bad.stderr and "Traceback" not in bad.stderr
