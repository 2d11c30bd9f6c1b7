"""PNG plots of a sweep: each metric against each varied key.

One figure per (metric, varied key) for the metrics that vary over the finished
points (a metric the same everywhere says nothing on a plot; the table lists
them): the key on the x axis by its short name (``C``, not ``workload.params.C``),
the metric on the y axis -- times (``*_ps``) in the unit that suits them, named
in the label (``latency (us)``) -- one line per combination of the other varied
keys (named in the legend).
Numeric keys are plotted at their values (on a log2 axis when they span a factor
of 8 or more, e.g. C = 1..8 or contexts 8K..128K); other keys (topology names)
at evenly spaced categories.  Points that did not finish are left out and
counted in the title.  Files: ``plots/<metric>_vs_<short key>.png``, and with a
``panel:`` in the sweep file ``plots/panel.png`` (:func:`plot_panel`).
"""
from __future__ import annotations

import re
from pathlib import Path

__all__ = ["plot_sweep", "plot_panel"]

MAX_LINES = 12


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def plot_sweep(directory: Path, rows: list[dict], keys: list[str], metrics: list[str], title: str) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tools.sweep.results import metric_label, short_names, time_scale, varying_metrics

    out_dir = directory / "plots"
    written = []
    ok = [r for r in rows if r.get("status") == "finished"]
    failed = len(rows) - len(ok)
    names = short_names(keys)
    for metric in varying_metrics(rows, metrics):
        if not any(_num(r.get(metric)) for r in ok):
            continue
        unit, scale = time_scale([r.get(metric) for r in ok]) if metric.endswith("_ps") else (None, 1)
        for key in keys:
            xs_all = sorted({_hashable(r[key]) for r in rows}, key=_order)
            if len(xs_all) < 2:
                continue
            numeric = all(_num(x) for x in xs_all)
            others = [k for k in keys if k != key]
            groups: dict[tuple, list] = {}
            for r in ok:
                if _num(r.get(metric)):
                    groups.setdefault(tuple(_hashable(r[k]) for k in others), []).append(
                        (_hashable(r[key]), r[metric] / scale))
            if not groups:
                continue
            fig, ax = plt.subplots(figsize=(7, 4.2))
            pos = {x: (x if numeric else i) for i, x in enumerate(xs_all)}
            for n, (g, pts) in enumerate(sorted(groups.items(), key=lambda kv: tuple(map(_order, kv[0])))):
                pts.sort(key=lambda p: _order(p[0]))
                label = ", ".join(f"{names[k]}={v}" for k, v in zip(others, g)) or None
                ax.plot([pos[x] for x, _ in pts], [y for _, y in pts], marker="o",
                        label=label if n < MAX_LINES else None, linewidth=1.2, markersize=4)
            if numeric and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 8:
                ax.set_xscale("log", base=2)
            ax.set_xticks([pos[x] for x in xs_all])
            ax.set_xticklabels([str(x) for x in xs_all], rotation=30 if not numeric else 0)
            ax.set_xlabel(names[key])
            ax.set_ylabel(metric_label(metric, unit))
            ax.ticklabel_format(axis="y", style="plain", useOffset=False)
            note = f" ({failed} point(s) not finished, not shown)" if failed else ""
            ax.set_title(f"{title}: {metric_label(metric, unit)} vs {names[key]}{note}", fontsize=10)
            ax.grid(True, alpha=0.3)
            if len(groups) > 1:
                ax.legend(fontsize=7, loc="best", title=None if len(groups) <= MAX_LINES else
                          f"first {MAX_LINES} of {len(groups)}")
            fig.tight_layout()
            out_dir.mkdir(parents=True, exist_ok=True)
            path = out_dir / f"{_safe(metric)}_vs_{_safe(names[key])}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def _order(v):
    return (0, v, "") if _num(v) else (1, 0, str(v))


def plot_panel(directory: Path, rows: list[dict], panel: dict, title: str) -> Path | None:
    """One figure for a sweep "panel": ``y`` against ``x``, a line per value of ``lines``.

    Each line point is the best (smallest ``y``) finished row over every other
    varied key (e.g. the best TILE and topology for this C and context); with
    ``bound`` the chosen rows' bounds are drawn dashed in the same colour and a
    second row of axes shows the ratio ``y / bound`` (>= 1 for a sound model).
    ``split`` draws one column of axes per value (e.g. 1 SIP | 4 SIPs).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x, y, lines, split, bound = panel["x"], panel["y"], panel.get("lines"), panel.get("split"), panel.get("bound")
    ok = [r for r in rows if r.get("status") == "finished" and _num(r.get(y)) and _num(r.get(x))]
    if not ok:
        return None
    splits = sorted({_hashable(r[split]) for r in ok}, key=_order) if split else [None]
    nrows = 2 if bound else 1
    fig, axes = plt.subplots(nrows, len(splits), figsize=(5.2 * len(splits), 3.6 * nrows), squeeze=False,
                             sharex="col")
    for c, sv in enumerate(splits):
        sub = [r for r in ok if split is None or _hashable(r[split]) == sv]
        best: dict = {}
        for r in sub:
            k = (_hashable(r[lines]) if lines else None, r[x])
            if k not in best or (r[y], r["point"]) < (best[k][y], best[k]["point"]):
                best[k] = r
        ax, rax = axes[0][c], axes[1][c] if bound else None
        for n, lv in enumerate(sorted({k[0] for k in best}, key=_order)):
            pts = sorted(((xv, r) for (l, xv), r in best.items() if l == lv), key=lambda p: p[0])
            colour = f"C{n % 10}"
            label = f"{lines.rsplit('.', 1)[-1]}={lv}" if lines else y
            ax.plot([p for p, _ in pts], [r[y] for _, r in pts], marker="o", color=colour, label=label)
            if bound:
                bpts = [(p, r) for p, r in pts if _num(r.get(bound)) and r[bound] > 0]
                ax.plot([p for p, _ in bpts], [r[bound] for _, r in bpts], linestyle="--", marker="x", color=colour,
                        linewidth=1, markersize=5, label=f"{label} bound")
                rax.plot([p for p, _ in bpts], [r[y] / r[bound] for _, r in bpts], marker="o", color=colour,
                         label=label)
        xs = sorted({r[x] for r in sub})
        for a in [ax] + ([rax] if rax is not None else []):
            if xs and min(xs) > 0 and max(xs) / min(xs) >= 8:
                a.set_xscale("log", base=2)
            a.set_xticks(xs)
            a.set_xticklabels([str(v) for v in xs], fontsize=7)
            a.grid(True, alpha=0.3)
        ax.set_yscale("log")
        ax.set_ylabel(y)
        ax.set_title((f"{split.rsplit('.', 1)[-1]}={sv}" if split else title), fontsize=9)
        ax.legend(fontsize=6, ncol=2)
        if rax is not None:
            rax.axhline(1.0, color="k", linewidth=0.8)
            rax.set_ylabel(f"{y} / {bound}")
            rax.set_xlabel(x)
        else:
            ax.set_xlabel(x)
    fig.suptitle(f"{title}: best {y} per {lines.rsplit('.', 1)[-1] if lines else x}", fontsize=10)
    fig.tight_layout()
    out = directory / "plots" / "panel.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
