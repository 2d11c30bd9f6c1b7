"""``python -m tools.bench.fidelity [--level L] [SCENARIO ...]``: end-time error of a coarser fidelity against the default.

Runs every scenario twice through the real CLI (``emu run --json --no-bundle``), at
``workload.params.fidelity=block`` (the default model: its digest is the shipped one)
and ``=pipeline`` (or ``--level stream``; actors/ahbm/pipeline.py), each in a fresh process, and prints one
Markdown row per scenario: end times, their relative difference, messages and wall
time of both.  ``--set KEY=VALUE`` is passed to both runs (e.g. a longer context).
The table in docs/gqa.md "Fidelity" is this script's output.  Scenarios whose
workload has no ``fidelity`` key are reported as such.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

__all__ = ["run_one", "compare", "main"]


def run_one(scenario: str, fidelity: str, sets: list[str]) -> dict:
    cmd = [sys.executable, "-m", "tools.cli", "run", scenario, "--json", "--compact", "--no-bundle", "--quiet",
           "--set", f"workload.params.fidelity={fidelity}"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]}
    return json.loads(p.stdout)


def compare(scenario: str, sets: list[str], level: str = "pipeline") -> dict:
    b = run_one(scenario, "block", sets)
    if "error" in b:
        return {"scenario": scenario, "error": b["error"]}
    q = run_one(scenario, level, sets)
    if "error" in q:
        return {"scenario": scenario, "error": q["error"]}
    eb, eq = b["end_time_ps"], q["end_time_ps"]
    return {"scenario": scenario, "block_ps": eb, "pipeline_ps": eq, "err": (eq - eb) / eb if eb else 0.0,
            "block_msgs": b["messages"], "pipeline_msgs": q["messages"], "block_wall": b["wall_s"],
            "pipeline_wall": q["wall_s"], "digest": b["digest"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.fidelity", description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="+")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--level", default="pipeline", choices=["pipeline", "stream"], help="the coarser fidelity")
    a = ap.parse_args(argv)
    L = a.level
    print(f"| scenario | block end | {L} end | error | messages block -> {L} | wall block -> {L} |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for s in a.scenarios:
        r = compare(s, a.set, L)
        if "error" in r:
            print(f"| {s} | - | - | n/a: {r['error']} | | |")
            continue
        worst = max(worst, abs(r["err"]))
        print(f"| {s} | {r['block_ps'] / 1e6:.3f} us | {r['pipeline_ps'] / 1e6:.3f} us | {100 * r['err']:+.3f} % |"
              f" {r['block_msgs']:,} -> {r['pipeline_msgs']:,} | {r['block_wall']:.1f} s -> {r['pipeline_wall']:.1f} s |",
              flush=True)
    print(f"\nworst |error|: {100 * worst:.3f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
