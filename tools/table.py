"""Plain-text tables for the commands' output (workload checks, sweeps): columns two spaces apart,
numbers (with separators or a time unit) right-aligned, no trailing blanks."""
from __future__ import annotations

import re

__all__ = ["format_table"]


def format_table(title: str, rows: list[dict]) -> str:
    """A plain-text table of ``rows`` (dicts with the same keys), for workload checks."""
    if not rows:
        return f"{title}: (empty)"
    cols = list(rows[0])
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    out = [title, "  " + "  ".join(c.ljust(w) for c, w in zip(cols, widths)),
           "  " + "  ".join("-" * w for w in widths)]
    out += ["  " + "  ".join(v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(line.rstrip() for line in out)


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


_QUANTITY = re.compile(r"^[<>=]*\s*-?[\d,]*\.?\d+(e[+-]?\d+)?\s*(ps|ns|us|ms|s|%|x)?$")


def _numeric(s: str) -> bool:
    """A cell to right-align: a number, possibly with separators or a time unit (``9,827``, ``4.284us``)."""
    return bool(_QUANTITY.match(s.strip())) if s.strip() else False
