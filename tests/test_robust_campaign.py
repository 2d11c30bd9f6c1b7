"""``emu faults campaign`` (issue 15): plans drawn from the real machine and the fault registry's
declared ranges, outcomes classified, tables, CSV and runnable reproducers."""
from __future__ import annotations

import csv
import fnmatch
from pathlib import Path

import numpy as np
import pytest

from actors import registry
from emulator.faults import FAULT_SCHEMA, KINDS
from emulator.scenario import load_scenario
from emulator.schema import Doc, List, validate
from tools.robust.campaign import classify, draw_plan, target_class
from tools.cli import main
from tools.run.runner import build_system

ROOT = Path(__file__).resolve().parents[1]
REDUCE = ROOT / "scenarios" / "demo" / "reduce.yaml"


@pytest.fixture(scope="module")
def machine():
    system, _ = build_system(load_scenario(str(REDUCE), registry, ["workload.params.rounds=1"]))
    return list(system.actors), [{"name": l.name, "bandwidth": l.bandwidth} for l in system.links]


def test_plans_use_real_targets_and_declared_ranges(machine):
    actors, links = machine
    rng = np.random.default_rng(0)
    plans = [draw_plan(rng, actors, links, 6_000_000) for _ in range(200)]
    faults = [f for p in plans for f in p]
    assert {(f["kind"], "link" if "link" in f else "actor") for f in faults} == set(KINDS)   # every kind drawn
    names = set(actors) | {l["name"] for l in links}
    assert all((f.get("link") or f.get("actor")) in names for f in faults)
    validate(List(FAULT_SCHEMA), Doc(faults, {}, "<plans>"))        # every plan is a valid fault list
    for f in faults:
        cls = KINDS[(f["kind"], "link" if "link" in f else "actor")]
        for key, param in cls.params.items():
            value = float(str(f[key]).rstrip("ps").rstrip("B/s"))
            assert param.low <= value <= param.high * 1.001, (f, key)


def test_plans_can_be_restricted_by_kind_and_glob(machine):
    actors, links = machine
    rng = np.random.default_rng(1)
    plans = [draw_plan(rng, actors, links, 10**6, kinds={"delay", "stall"}, targets="cube03/*") for _ in range(50)]
    faults = [f for p in plans for f in p]
    assert {f["kind"] for f in faults} == {"delay", "stall"}
    assert all(fnmatch.fnmatchcase(f.get("link") or f["actor"], "cube03/*") for f in faults)
    with pytest.raises(ValueError, match="no fault kind can target"):
        draw_plan(rng, actors, links, 10**6, kinds={"kill"}, targets="*->*")


def test_classification():
    base = {"status": "finished", "max_abs_err": 4.1e-8}
    assert classify({"status": "finished", "max_abs_err": 7.0e-8}, base) == "same"   # merge order only
    assert classify({"status": "finished", "max_abs_err": 2.7e-3}, base) == "different"
    assert classify({"status": "deadlock"}, base) == "deadlock"
    assert classify({"status": "wall-timeout"}, base) == "time-limit"
    assert classify({"status": "killed"}, base) == "killed"
    assert classify({"status": "error"}, base) == "error"
    assert target_class("cube05/pe1.up->cube05/pe0.in") == "cube#/pe#.up->cube#/pe#.in"


def test_campaign_command_writes_tables_csv_and_runnable_reproducers(tmp_path, capsys):
    out = tmp_path / "camp"
    rc = main(["faults", "campaign", str(ROOT / "scenarios" / "demo" / "ring.yaml"), "--plans", "4", "--seed", "3",
               "--jobs", "1", "--kinds", "drop,kill", "--out", str(out),
               "--set", "workload.params.nodes=4", "--set", "workload.params.hops=16"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "4 plans" in text and "fault kind" in text and "target class" in text
    rows = list(csv.DictReader(open(out / "outcomes.csv")))
    assert len(rows) == 4 and all(r["outcome"] in ("same", "deadlock", "killed") for r in rows)
    bad = [r for r in rows if r["outcome"] != "same"]
    assert bad, "drop and kill on a 4-node ring should break some runs"
    for r in bad:
        assert int(r["min_faults"]) <= int(r["faults"])
        rc = main(["run", r["reproducer"], "--no-bundle", "--quiet"])   # the reproducer gives the same outcome
        assert {"deadlock": 3, "killed": 6}[r["outcome"]] == rc
    capsys.readouterr()


def test_a_run_past_the_pool_timeout_is_a_hang_and_results_keep_their_order():
    from tools.robust.campaign import _Pool

    jobs = [{"scenario": str(ROOT / "scenarios" / "ahbm" / "attention_decode.yaml"), "sets": []},
            {"scenario": str(REDUCE), "sets": ["workload.params.rounds=1", "trace.enabled=false"]}]
    (slow,) = _Pool(1, timeout=0.0).map(jobs[:1])      # killed as soon as the pool looks
    assert slow["outcome"] == "hang" and slow["end_time_ps"] is None
    quick, decode = _Pool(2, timeout=60).map(jobs[::-1])  # the quick run finishes first, stays first
    assert quick["status"] == decode["status"] == "finished"
    assert quick["end_time_ps"] < decode["end_time_ps"]
