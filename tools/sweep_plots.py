"""PNG plots of a sweep: each metric against each varied key.

One figure per (metric, varied key): the key on the x axis, the metric on the y
axis, one line per combination of the other varied keys (named in the legend).
Numeric keys are plotted at their values (on a log2 axis when they span a factor
of 8 or more, e.g. C = 1..8 or contexts 8K..128K); other keys (topology names)
at evenly spaced categories.  Points that did not finish are left out and
counted in the title.  Files: ``plots/<metric>_vs_<key>.png``.
"""
from __future__ import annotations

import re
from pathlib import Path

__all__ = ["plot_sweep"]

MAX_LINES = 12


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def plot_sweep(directory: Path, rows: list[dict], keys: list[str], metrics: list[str], title: str) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = directory / "plots"
    written = []
    ok = [r for r in rows if r.get("status") == "finished"]
    failed = len(rows) - len(ok)
    for metric in metrics:
        if not any(_num(r.get(metric)) for r in ok):
            continue
        for key in keys:
            xs_all = sorted({_hashable(r[key]) for r in rows}, key=_order)
            if len(xs_all) < 2:
                continue
            numeric = all(_num(x) for x in xs_all)
            others = [k for k in keys if k != key]
            groups: dict[tuple, list] = {}
            for r in ok:
                if _num(r.get(metric)):
                    groups.setdefault(tuple(_hashable(r[k]) for k in others), []).append((_hashable(r[key]), r[metric]))
            if not groups:
                continue
            fig, ax = plt.subplots(figsize=(7, 4.2))
            pos = {x: (x if numeric else i) for i, x in enumerate(xs_all)}
            for n, (g, pts) in enumerate(sorted(groups.items(), key=lambda kv: tuple(map(_order, kv[0])))):
                pts.sort(key=lambda p: _order(p[0]))
                label = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(others, g)) or None
                ax.plot([pos[x] for x, _ in pts], [y for _, y in pts], marker="o",
                        label=label if n < MAX_LINES else None, linewidth=1.2, markersize=4)
            if numeric and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 8:
                ax.set_xscale("log", base=2)
            ax.set_xticks([pos[x] for x in xs_all])
            ax.set_xticklabels([str(x) for x in xs_all], rotation=30 if not numeric else 0)
            ax.set_xlabel(key)
            ax.set_ylabel(metric)
            note = f" ({failed} point(s) not finished, not shown)" if failed else ""
            ax.set_title(f"{title}: {metric} vs {key.rsplit('.', 1)[-1]}{note}", fontsize=10)
            ax.grid(True, alpha=0.3)
            if len(groups) > 1:
                ax.legend(fontsize=7, loc="best", title=None if len(groups) <= MAX_LINES else
                          f"first {MAX_LINES} of {len(groups)}")
            fig.tight_layout()
            out_dir.mkdir(parents=True, exist_ok=True)
            path = out_dir / f"{_safe(metric)}_vs_{_safe(key)}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def _order(v):
    return (0, v, "") if _num(v) else (1, 0, str(v))
