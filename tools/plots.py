"""Plots of a run (matplotlib, PNG): utilisation per actor group, link traffic.

Without a trace: bar charts of aggregate utilisation per actor group (actor
names with the last path element dropped, e.g. ``cube05``) and bytes per link.
With a trace: utilisation over virtual time per actor group (busy spans binned)
and link bandwidth over time (bytes sent per bin).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from emulator.trace import BUSY, SEND, read_trace  # noqa: E402

BINS = 100
MAX_SERIES = 16


def group_of(name: str) -> str:
    return name.rsplit("/", 1)[0] if "/" in name else name


def _top(d: dict, n: int) -> list:
    return sorted(d, key=lambda k: -float(np.sum(d[k])))[:n]


def make_plots(out_dir: Path, system, result, trace_path: str | None) -> list[Path]:
    end = max(result.end_time_ps, 1)
    written = []
    groups_busy: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(BINS))
    groups_size: dict[str, int] = defaultdict(int)
    link_bytes: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(BINS))
    edges = np.linspace(0, end, BINS + 1)
    width = end / BINS
    for a in system.actors.values():
        groups_size[group_of(a.name)] += 1
    if trace_path:
        tr = read_trace(trace_path)
        actors, links = tr.actors, tr.links
        for ev in tr.events:
            if ev[0] == BUSY:
                t0, t1 = ev[1], ev[3]
                g = groups_busy[group_of(actors[ev[2]])]
                b0, b1 = int(min(t0 // width, BINS - 1)), int(min(max(t1 - 1, t0) // width, BINS - 1))
                for b in range(b0, b1 + 1):
                    lo, hi = max(t0, edges[b]), min(t1, edges[b + 1])
                    if hi > lo:
                        g[b] += hi - lo
            elif ev[0] == SEND:
                link_bytes[links[ev[2]]["name"]][int(min(ev[1] // width, BINS - 1))] += ev[4]
        fig, ax = plt.subplots(figsize=(10, 5))
        centers = (edges[:-1] + edges[1:]) / 2 / 1e6
        for g in _top(groups_busy, MAX_SERIES):
            ax.plot(centers, groups_busy[g] / (width * groups_size[g]), label=g)
        ax.set_xlabel("virtual time (us)")
        ax.set_ylabel("utilisation (busy fraction of the group's actors)")
        ax.set_title(f"{result.status}: utilisation per actor group")
        if groups_busy:
            ax.legend(fontsize=7, ncol=2)
        written.append(_save(fig, out_dir / "utilisation.png"))
        fig, ax = plt.subplots(figsize=(10, 5))
        for l in _top(link_bytes, MAX_SERIES):
            ax.plot(centers, link_bytes[l] / (width / 1e12) / 1e9, label=l)
        ax.set_xlabel("virtual time (us)")
        ax.set_ylabel("GB/s sent")
        ax.set_title("link bandwidth (busiest links)")
        if link_bytes:
            ax.legend(fontsize=6)
        written.append(_save(fig, out_dir / "links.png"))
        return written
    busy = defaultdict(int)
    for a in system.actors.values():
        busy[group_of(a.name)] += a.busy_ps
    names = sorted(busy)
    fig, ax = plt.subplots(figsize=(10, 5))
    ax.bar(range(len(names)), [busy[n] / (end * groups_size[n]) for n in names])
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
    ax.set_ylabel("utilisation over the run")
    ax.set_title("utilisation per actor group (enable the trace for a timeline)")
    written.append(_save(fig, out_dir / "utilisation.png"))
    top = sorted(system.links, key=lambda l: -l.bytes)[:40]
    fig, ax = plt.subplots(figsize=(10, 5))
    ax.bar(range(len(top)), [l.bytes / (end / 1e12) / 1e9 for l in top])
    ax.set_xticks(range(len(top)), [l.name for l in top], rotation=90, fontsize=5)
    ax.set_ylabel("mean GB/s over the run")
    ax.set_title("link bandwidth (busiest links)")
    written.append(_save(fig, out_dir / "links.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
