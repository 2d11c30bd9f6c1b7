"""The best operating point of a sweep: which choice minimises a metric, per case.

A sweep file may ask::

    best:
      minimize: latency_ps                          # a metric of the rows
      over: [workload.params.C, workload.params.l1]  # the choices compared
      per: [workload.params.counter]                 # one winner per value of these (default: every other varied key)

For each combination of the ``per`` keys, the finished row with the smallest
metric wins (ties: the first in point order, so the result is deterministic).
The winners are printed and written to ``best.csv``: the ``per`` values, the
winning ``over`` values, the metric, the runner-up's metric and the margin
``runner_up / best``, then the row's other metrics.  Rows that did not finish
never win; a case where none finished is listed with an empty choice.
"""
from __future__ import annotations

import csv
from pathlib import Path

__all__ = ["best_rows", "write_best"]


def _key(v):
    return tuple(v) if isinstance(v, list) else v


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def best_rows(rows: list[dict], metric: str, over: list[str], per: list[str], metrics: list[str]) -> list[dict]:
    cases: dict[tuple, list[dict]] = {}
    for r in rows:
        cases.setdefault(tuple(_key(r.get(k)) for k in per), []).append(r)
    out = []
    for case, members in cases.items():
        ok = sorted((r for r in members if r.get("status") == "finished" and _num(r.get(metric))),
                    key=lambda r: (r[metric], r["point"]))
        row = {k: v for k, v in zip(per, case)}
        if not ok:
            row.update({k: None for k in over})
            row.update({metric: None, "runner_up": None, "margin": None, "point": None})
            out.append(row)
            continue
        win = ok[0]
        row.update({k: win.get(k) for k in over})
        row[metric] = win[metric]
        row["runner_up"] = ok[1][metric] if len(ok) > 1 else None
        row["margin"] = round(ok[1][metric] / win[metric], 4) if len(ok) > 1 and win[metric] else None
        row["point"] = win["point"]
        row.update({m: win.get(m) for m in metrics if m != metric and m not in row})
        out.append(row)
    return out


def write_best(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    cols = list(rows[0])
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow(["" if r.get(c) is None else r.get(c) for c in cols])
