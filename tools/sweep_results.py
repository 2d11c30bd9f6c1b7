"""A sweep's rows: what is collected from each point, and the files and table they go to.

One row per point, in point order: ``point`` (its index in the expansion), the
varied values (one column per varied key), ``status``, the metrics, ``digest``,
the host measurements ``wall_s``, ``events_per_s``, ``peak_rss_mib`` (the only
columns that differ between two runs of the same sweep), and ``bundle`` (the
point's result bundle, relative to the sweep directory).  ``results.jsonl``
holds the same rows with values as JSON and the point's ``error`` when it
failed; ``results.csv`` writes lists as JSON text and a missing value as an empty
cell.

A metric name is a dotted path into the point's ``result.json``
(``end_time_ps``, ``reports.cube05/pe0.round_latency_ps``) or, failing that, a
key of a workload report (``round_latency_ps``).  Without a ``metrics`` list a
sweep collects ``end_time_ps``, ``events`` and every scalar number the
workload's check added to the result (``max_abs_err``, ``latency_ps``, ...).
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

__all__ = ["HOST_COLUMNS", "metric_value", "default_metrics", "make_row", "write_results", "format_rows"]

HOST_COLUMNS = ("wall_s", "events_per_s", "peak_rss_mib")

# keys every result.json has (tools.runner); anything else at the top level came from the workload's check
RUNNER_KEYS = {"scenario", "file", "status", "digest", "seed", "mode", "end_time_ps", "messages", "events",
               "time_steps", "wall_s", "build_s", "events_per_s", "peak_rss_mib", "actors", "links", "reports",
               "faults", "versions", "deadlock", "error", "bundle", "tables", "traceback"}

_MISSING = object()


def metric_value(result: dict, name: str):
    node = result
    for part in name.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        else:
            node = _MISSING
            break
    if node is not _MISSING:
        return node
    # a bare report key, e.g. ``round_latency_ps`` of reports["cube05/pe0"]
    for report in (result.get("reports") or {}).values():
        if isinstance(report, dict) and name in report:
            return report[name]
    return None


def _scalar(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def default_metrics(results: list[dict]) -> list[str]:
    names = ["end_time_ps", "events"]
    for res in results:
        for k, v in res.items():
            if k not in RUNNER_KEYS and _scalar(v) and k not in names:
                names.append(k)
    return names


def make_row(point, result: dict, metrics: list[str], keys: list[str]) -> dict:
    row = {"point": point.index}
    row.update({k: point.values.get(k) for k in keys})
    row["status"] = result.get("status", "error")
    for m in metrics:
        row[m] = metric_value(result, m)
    row["digest"] = result.get("digest")
    for h in HOST_COLUMNS:
        row[h] = result.get(h)
    row["bundle"] = f"points/{point.key}"
    return row


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, (list, dict, bool)):
        return json.dumps(v)
    return str(v)


def write_results(directory: Path, rows: list[dict], errors: dict[int, str]) -> None:
    """``results.csv`` and ``results.jsonl`` (written to a temporary name, then renamed: never half a file)."""
    if not rows:
        return
    cols = list(rows[0])
    tmp = directory / "results.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow([_cell(r.get(c)) for c in cols])
    tmp.replace(directory / "results.csv")
    tmp = directory / "results.jsonl.tmp"
    with open(tmp, "w") as f:
        for r in rows:
            out = dict(r)
            if r["point"] in errors:
                out["error"] = errors[r["point"]]
            f.write(json.dumps(out, default=str) + "\n")
    tmp.replace(directory / "results.jsonl")


def format_rows(rows: list[dict], keys: list[str]) -> list[dict]:
    """Rows for the printed table: short names for the varied keys, a short digest, no bundle path."""
    short = {k: k.rsplit(".", 1)[-1] for k in keys}
    if len(set(short.values())) != len(short):
        short = {k: k for k in keys}
    out = []
    for r in rows:
        t = {}
        for c, v in r.items():
            if c == "bundle":
                continue
            if c == "digest" and v:
                v = v[:12]
            if isinstance(v, (list, dict)):
                v = json.dumps(v)
            t[short.get(c, c)] = v
        out.append(t)
    return out
