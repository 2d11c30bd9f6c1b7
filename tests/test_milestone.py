"""docs/milestone.md's generator (tools/sweep/milestone.py) on two small sweeps shaped like the bench's panels."""
from __future__ import annotations

import csv
from pathlib import Path

from tools.cli import main
from tools.sweep import milestone

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "scenarios/ahbm/llama70b"

DECODE_SP = f"""\
name: llama70b-decode-sp
base: {BASE / 'attention.yaml'}
set: {{workload.params.case: decode, workload.params.P: 8, workload.params.heads: 1, workload.params.tile: 64,
      workload.params.fidelity: pipeline}}
vary:
  workload.params.context: [128, 512]
  workload.params.C: [1, 2]
metrics: [latency_ps, energy_j, bound_ps, ratio_to_bound]
best: {{minimize: latency_ps, over: [workload.params.C]}}
confirm: {{set: {{machine.profile: ahbm-4sip, workload.params.heads: 2}}}}
"""

MULTI_DECODE = f"""\
name: llama70b-multi-user-decode
base: {BASE / 'requests.yaml'}
set: {{workload.params.context: 256}}
vary:
  workload.params.requests: [1, 2]
zip:
  - {{workload.params.C: [1, 2], workload.params.P: [1, 8], workload.params.tile: [64, 64]}}
  - {{machine.profile: [ahbm-1sip, ahbm-4sip], workload.params.heads: [1, 2]}}
metrics: [makespan_ps, step_p50_ps, step_p99_ps, tokens_per_s, tokens_per_j, hidden_fraction_mean]
best: {{minimize: makespan_ps, over: [workload.params.C], per: [workload.params.requests, machine.profile]}}
"""


def _sweep(tmp_path: Path, name: str, text: str) -> Path:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(text)
    out = tmp_path / "sweeps" / f"llama70b-{name}"
    assert main(["sweep", str(spec), "--out", str(out), "--no-plots", "-q"]) == 0
    return out


def _csv(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_the_page_is_the_sweeps_best_points_their_limits_and_the_missing_panels(tmp_path, capsys):
    dec = _sweep(tmp_path, "decode-sp", DECODE_SP)
    mud = _sweep(tmp_path, "multi-user-decode", MULTI_DECODE)
    page = tmp_path / "docs" / "milestone.md"
    page.parent.mkdir()
    assert milestone.main(["--runs", str(tmp_path / "sweeps"), "--out", str(page), "--limits"]) == 0
    text = page.read_text()
    lines = text.splitlines()

    # single-user decode: one row per context, the best C of best.csv, its latency and ratio, a limits clause,
    # and the 4-SIP confirmation's heads and latency ratio
    best = _csv(dec / "best.csv")
    confirm = {r["point"]: r for r in _csv(dec / "confirm.csv")}
    rows = [ln for ln in lines if ln.startswith("| SP |")]
    assert len(rows) == len(best) == 2
    for b, row in zip(best, rows):
        cells = [c.strip() for c in row.strip("|").split("|")]
        ctx = int(b["workload.params.context"])
        assert cells[1] == str(ctx) and cells[2] == f"C {b['workload.params.C']}"
        assert cells[3] == milestone.format_time(int(b["latency_ps"]))
        assert cells[7] == f"{float(b['ratio_to_bound']):.3f}"
        assert cells[9].startswith("critical path:"), cells[9]      # re-run with a trace: the limits line's lead
        c = confirm[b["point"]]
        assert cells[10] == f"2, {milestone.format_time(int(c['confirm.latency_ps']))}, " \
                            f"{float(c['confirm.latency_ps_ratio']):.3f}"
    # the re-runs are kept: a second generation reads them instead of running again
    assert len(list((tmp_path / "sweeps" / "milestone-limits").glob("*/result.json"))) == 2 + 2 * 1 * 2

    # multi-user decode: per machine a table of the loads, the best C and the other C's makespan
    mbest = _csv(mud / "best.csv")
    for m in ("ahbm-1sip", "ahbm-4sip"):
        assert any(ln.startswith(f"**256 context, {m}**") for ln in lines), m
    multi = [ln for ln in lines if ln.startswith("| 1 |") or ln.startswith("| 2 |")]
    assert len(multi) == len(mbest) == 4
    for b, row in zip(sorted(mbest, key=lambda r: (r["machine.profile"], int(r["workload.params.requests"]))), multi):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[0] == b["workload.params.requests"] and cells[1] == b["workload.params.C"]
        assert cells[2] == milestone.format_time(int(b["makespan_ps"]))
        other = "1" if b["workload.params.C"] == "2" else "2"
        assert cells[9].startswith(f"C {other}: ")
    assert "4 SIPs choose the same C as 1 SIP at" in text

    # the panels not run say how to run them; the findings table is built from what ran
    assert "not run: `emu sweep scenarios/ahbm/llama70b/prefill-sp.yaml" in text
    assert "Not run: `emu sweep scenarios/ahbm/llama70b/multi-user-prefill.yaml" in text
    assert any(ln.startswith("| §5.3: a short decode prefers a small C") for ln in lines)
    assert not any(ln.startswith("| §4.3, §5.3: the reduction is hidden") for ln in lines)   # C 8 not swept

    # what it cost: each sweep's points and wall time, from results.csv
    assert any(ln.startswith(f"| `decode-sp` | {len(_csv(dec / 'results.csv'))} |") for ln in lines)

    # a second generation without re-running gives the same page (but the loop calibration of the moment)
    assert milestone.main(["--runs", str(tmp_path / "sweeps"), "--out", str(page), "--limits"]) == 0
    def same(t):
        return [ln for ln in t.splitlines() if not ln.startswith("In all ")]
    assert same(page.read_text()) == same(text)
