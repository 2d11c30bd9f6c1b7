"""A sweep's rows: what is collected from each point, and the files and table they go to.

One row per point, in point order: ``point`` (its index in the expansion), the
varied values (one column per varied key), ``status``, the metrics, ``digest``,
the host measurements ``wall_s``, ``events_per_s``, ``peak_rss_mib`` and ``node``
(the machine, or the Ray node, that ran the point: tools.sweep.backends) -- the
only columns that differ between two runs of the same sweep -- and ``bundle``
(the point's result bundle, relative to the sweep directory).  ``results.jsonl``
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

from tools.sweep.energy_metrics import ENERGY_METRICS, energy_metric

__all__ = ["HOST_COLUMNS", "metric_value", "default_metrics", "make_row", "write_results", "format_rows",
           "varying_metrics", "constant_summary", "short_names", "metric_label", "time_scale"]

HOST_COLUMNS = ("wall_s", "events_per_s", "peak_rss_mib", "node")

# keys every result.json has (tools.run.runner); anything else at the top level came from the workload's check
RUNNER_KEYS = {"scenario", "file", "status", "digest", "seed", "mode", "end_time_ps", "messages", "events",
               "time_steps", "wall_s", "build_s", "events_per_s", "peak_rss_mib", "actors", "links", "reports",
               "faults", "versions", "deadlock", "error", "bundle", "tables", "traceback", "energy", "node",
               "project"}

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
    if name in ENERGY_METRICS:        # energy_j, energy_per_token_j, avg_power_w, tokens_per_j, edp_js
        return energy_metric(result, name)
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


def short_names(keys: list[str]) -> dict[str, str]:
    """``workload.params.C`` -> ``C`` (the full path where two keys would share a last part)."""
    short = {k: k.rsplit(".", 1)[-1] for k in keys}
    return short if len(set(short.values())) == len(short) else {k: k for k in keys}


def _same(values: list) -> bool:
    return all(json.dumps(v, sort_keys=True, default=str) == json.dumps(values[0], sort_keys=True, default=str)
               for v in values)


def varying_metrics(rows: list[dict], metrics: list[str]) -> list[str]:
    """The metrics whose value is not the same on every finished row (a sweep over decode points
    has ``ring_steps`` 0 everywhere: no column, no plot for it)."""
    ok = [r for r in rows if r.get("status") == "finished"] or rows
    return [m for m in metrics if len(ok) < 2 or not _same([r.get(m) for r in ok])]


def constant_summary(rows: list[dict], metrics: list[str], limit: int = 8) -> str:
    """``"constant over the points: ring_steps=0, tiles_skipped=0, ..."`` for the metrics left out."""
    ok = [r for r in rows if r.get("status") == "finished"] or rows
    same = [m for m in metrics if m not in varying_metrics(rows, metrics)]
    if not same or len(ok) < 2:
        return ""
    items = [f"{m}={_show(m, ok[0].get(m))}" for m in same]
    more = f", and {len(items) - limit} more (results.csv)" if len(items) > limit else ""
    return "constant over the points: " + ", ".join(items[:limit]) + more


TIME_UNITS = (("s", 10**12), ("ms", 10**9), ("us", 10**6), ("ns", 10**3), ("ps", 1))


def time_scale(values) -> tuple[str, int]:
    """The unit that shows picosecond ``values`` with the fewest digits before the point (``("us", 1e6)``)."""
    top = max((abs(v) for v in values if isinstance(v, (int, float))), default=0)
    for unit, scale in TIME_UNITS:
        if top >= scale:
            return unit, scale
    return "ps", 1


def metric_label(metric: str, unit: str | None = None) -> str:
    """An axis / column label: ``latency_ps`` -> ``latency (us)`` in the unit chosen for it."""
    if metric.endswith("_ps") and unit:
        return f"{metric[:-3]} ({unit})"
    return metric


def _show(column: str, v) -> str:
    """One cell: times (``*_ps``) with their unit, counts with thousands separators, ratios with 4 digits."""
    from emulator.units import format_time

    if v is None or v == "":
        return ""
    if isinstance(v, bool):
        return str(v)
    if column.endswith("_ps") and isinstance(v, (int, float)):
        return format_time(int(v))
    if isinstance(v, float):
        if v != v or abs(v) in (float("inf"),):
            return str(v)
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


def format_rows(rows: list[dict], keys: list[str], metrics: list[str] | None = None) -> list[dict]:
    """Rows for the printed table: the varied keys by their short names, status, the metrics that vary
    (``metrics`` given: the others go to :func:`constant_summary`), a short digest, wall seconds, and the
    node that ran each point when the points ran on more than one; times with units, counts with
    separators, every cell a string.  results.csv keeps every column, raw."""
    short = short_names(keys)
    shown = varying_metrics(rows, metrics) if metrics is not None else None
    drop = {"bundle", "events_per_s", "peak_rss_mib"}
    if len({r.get("node") for r in rows}) < 2:
        drop.add("node")
    out = []
    for r in rows:
        t = {}
        for c, v in r.items():
            if c in drop or (shown is not None and c in metrics and c not in shown):
                continue
            if c == "digest" and v:
                v = v[:12]
            label = short.get(c) or (c[:-3] if c.endswith("_ps") else c)
            t[label] = v if c in keys or c in ("status", "digest") else _show(c, v)
        out.append(t)
    return out
