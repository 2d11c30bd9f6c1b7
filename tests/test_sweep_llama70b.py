"""The Llama3-70B milestone bench at a reduced size: every emulated latency is at least its analytic bound."""
from __future__ import annotations

import csv
from pathlib import Path

from tools.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_reduced_milestone_bench_never_beats_its_bound(tmp_path, capsys):
    out = tmp_path / "l70"
    assert main(["sweep", str(ROOT / "scenarios/ahbm/llama70b/reduced.yaml"), "--out", str(out), "--no-plots",
                 "-q"]) == 0
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["workload.params.case"], r["workload.params.C"], r["workload.params.P"]) for r in rows] == [
        ("decode", "1", "1"), ("decode", "2", "8"), ("decode", "2", "8"), ("prefill", "1", "1"), ("prefill", "1", "8")]
    assert [r["status"] for r in rows] == ["finished"] * 5
    for r in rows:
        # an emulated time below the bound computed from the same profile is a model bug
        assert int(r["latency_ps"]) >= int(r["bound_ps"]) > 0, r
        assert float(r["ratio_to_bound"]) >= 1.0, r
    # SP decode reduces over both levels; no-SP decode has nothing to reduce
    assert (rows[0]["l2_rounds"], rows[0]["l1_rounds"]) == ("0", "0")
    assert int(rows[1]["l2_rounds"]) >= 1 and int(rows[1]["l1_rounds"]) >= 1
    with open(out / "best.csv", newline="") as f:
        best = list(csv.DictReader(f))
    sp = [b for b in best if (b["workload.params.case"], b["workload.params.C"]) == ("decode", "2")]
    assert len(sp) == 1 and sp[0]["workload.params.l2"] in ("tree", "ring")
    assert sp[0]["latency_ps"] == str(min(int(rows[1]["latency_ps"]), int(rows[2]["latency_ps"])))
