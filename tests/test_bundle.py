"""emu run writes a result bundle: resolved scenario, result.json, CSVs, trace, Perfetto trace, plots."""
import csv
import json

import yaml

from conftest import ROOT


def test_run_writes_a_complete_bundle(emu, tmp_path):
    out = tmp_path / "bundle"
    proc = emu("run", ROOT / "scenarios/demo/reduce.yaml", "--out", out, "--set", "trace.enabled=true",
               "--set", "workload.params.rounds=1", "--plots", check=0)
    assert f"bundle         {out}" in proc.stdout
    names = {p.name for p in out.iterdir()}
    assert {"scenario.yaml", "result.json", "actors.csv", "links.csv", "trace.emutrace", "trace.pftrace",
            "utilisation.png", "links.png"} <= names
    res = json.loads((out / "result.json").read_text())
    for key in ("digest", "seed", "versions", "wall_s", "events_per_s", "peak_rss_mib", "end_time_ps",
                "max_abs_err"):
        assert key in res, key
    resolved = yaml.safe_load((out / "scenario.resolved.yaml").read_text())
    assert resolved["machine"]["resolved"]["pe_link"]["latency"] == 20_000   # units parsed
    sc = yaml.safe_load((out / "scenario.yaml").read_text())
    assert sc["workload"]["params"]["rounds"] == 1                          # as run, after --set
    actors = list(csv.DictReader(open(out / "actors.csv")))
    assert len(actors) == 128 and float(actors[0]["utilisation"]) > 0
    links = list(csv.DictReader(open(out / "links.csv")))
    assert len(links) == 127 and all(int(l["messages"]) == 1 for l in links)
    assert res["perfetto"]["file"] == "trace.pftrace" and res["perfetto"]["trace_events"] > 0
    assert res["perfetto"]["trimmed"] is None and (out / "trace.pftrace").stat().st_size == res["perfetto"]["bytes"]
    assert (out / "utilisation.png").read_bytes()[:4] == b"\x89PNG"


def test_no_bundle_writes_nothing(emu, tmp_path):
    emu("run", ROOT / "scenarios/demo/ring.yaml", "--no-bundle", "--set", "workload.params.hops=5", check=0)
    assert not (tmp_path / "runs").exists()
