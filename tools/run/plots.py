"""Plots of a run (PNG) that each answer one question an architect asks.

* ``utilisation.png`` -- *which kind of component is the bottleneck, and when?*
  Utilisation over virtual time per component kind (the mean busy fraction of
  all actors of that kind: ``dma``, ``gemm``, ``hp``, ``lane`` ...; kinds as in
  ``emu trace summary``).  Without a trace: mean and busiest instance per kind.
* ``links.png`` -- *which class of wire carries the traffic?*  Bandwidth over
  time per link class (``cpu.dma->dma.cmd``, ``router.out_E->router.in_W``),
  the busiest classes; without a trace, mean bandwidth per class.
* ``ahbm_pes.png`` (AHBM) -- *is the work spread over the machine?*  One
  heatmap per engine kind (GEMM, MATH, DMA, CPU): each CUBE of the mesh at its
  place, its 8 PEs inside it, colour = the PE engine's utilisation over the run.
* ``ahbm_cubes.png`` (AHBM, with a trace) -- *when is each CUBE working?*  CUBE x
  time heatmap of the mean utilisation of its GEMM and MATH engines.
* ``pccx_units.png`` (pccx, with a trace) -- *do weight prefetch and compute
  overlap?*  Per-unit timeline (HP ports, GEMV lanes and weight switches, GEMM,
  SFU/CVO, L2, DDR ...) as a unit x time heatmap of busy fraction, and the
  occupancy of the weight FIFOs and the command FIFO over time.

Cost: busy time per time bin is computed with sorted prefix sums (numpy,
``O(n log n)`` per group, no per-event Python loop); the only Python pass over the
trace extracts the BUSY and SEND/TAKE fields into arrays.  matplotlib is imported
lazily with the Agg backend.
"""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from emulator.trace import BUSY, SEND, TAKE, read_trace
from tools.trace.summary import component_kind, kind_stems, link_class

__all__ = ["make_plots", "binned_busy"]

BINS = 150
MAX_KINDS = 12
MAX_CLASSES = 16
AHBM_PE = re.compile(r"^sip(\d+)/cube(\d+)/pe(\d+)/(\w+)$")
PE_KINDS = ("gemm", "math", "dma", "cpu")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def binned_busy(t0: np.ndarray, t1: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Busy time of spans ``[t0, t1)`` inside each bin ``[edges[i], edges[i+1])`` (spans may overlap).

    ``B(x) = sum over spans of clip(x - t0, 0, t1 - t0) = sum_{t0<x}(x - t0) - sum_{t1<x}(x - t1)``, evaluated
    at the edges with sorted prefix sums; the per-bin busy time is its difference.
    """
    if len(t0) == 0:
        return np.zeros(len(edges) - 1)

    def ramp(starts: np.ndarray) -> np.ndarray:
        s = np.sort(starts.astype(np.float64))
        prefix = np.concatenate(([0.0], np.cumsum(s)))
        n = np.searchsorted(s, edges, side="left")
        return edges * n - prefix[n]

    b = ramp(t0) - ramp(t1)
    return np.diff(b)


class _Busy:
    """The BUSY spans of a trace as arrays (actor id, start, end)."""

    def __init__(self, trace):
        spans = [(ev[2], ev[1], ev[3]) for ev in trace.events if ev[0] == BUSY]
        arr = np.array(spans, dtype=np.int64).reshape(-1, 3)
        self.actor, self.t0, self.t1 = arr[:, 0], arr[:, 1], arr[:, 2]

    def per_group(self, group_of_actor: np.ndarray, n_groups: int, edges: np.ndarray) -> np.ndarray:
        """``[group, bin]`` busy time; ``group_of_actor[i]`` is actor i's group (-1: none)."""
        g = group_of_actor[self.actor] if len(self.actor) else np.zeros(0, dtype=np.int64)
        out = np.zeros((n_groups, len(edges) - 1))
        order = np.argsort(g, kind="stable")
        gs = g[order]
        bounds = np.searchsorted(gs, np.arange(n_groups + 1))
        for k in range(n_groups):
            sel = order[bounds[k]:bounds[k + 1]]
            if len(sel):
                out[k] = binned_busy(self.t0[sel], self.t1[sel], edges)
        return out


def _index(names: list[str], key) -> tuple[np.ndarray, list[str]]:
    """Group ids per name (``key(name)`` or None for no group) and the group labels, in first-seen order."""
    labels: dict[str, int] = {}
    ids = np.full(len(names), -1, dtype=np.int64)
    for i, n in enumerate(names):
        k = key(n)
        if k is not None:
            ids[i] = labels.setdefault(k, len(labels))
    return ids, list(labels)


def make_plots(out_dir: Path, system, result, trace_path: str | None, *, trace=None) -> list[Path]:
    """Write the plots of a run into ``out_dir``; returns the files written.

    ``trace`` (a :class:`TraceFile` already read) saves reading ``trace_path`` again; with a trace,
    ``system`` is not needed (``None``): everything is computed from the events.
    """
    out_dir = Path(out_dir)
    end = max(int(result.end_time_ps), 1)
    if trace is None and trace_path:
        trace = read_trace(trace_path)
    names = list(trace.actors) if trace is not None else [a.name for a in system.actors.values()]
    stems = kind_stems(names)
    written = []
    if trace is not None:
        busy = _Busy(trace)
        edges = np.linspace(0, end, BINS + 1)
        written.append(_utilisation_over_time(out_dir, trace, busy, edges, stems, result.status))
        written.append(_links_over_time(out_dir, trace, edges, stems))
        if any(AHBM_PE.match(n) for n in names):
            written.append(_ahbm_cubes(out_dir, trace, busy, edges))
        if any(n.startswith("pccx/") for n in names):
            written.append(_pccx_units(out_dir, trace, busy, edges))
    else:
        written.append(_utilisation_bars(out_dir, system, end, stems, result.status))
        written.append(_link_bars(out_dir, system, end, stems))
    if any(AHBM_PE.match(n) for n in names):
        if trace is not None:
            per_actor = np.bincount(busy.actor, weights=busy.t1 - busy.t0, minlength=len(names))
            busy_ps = dict(zip(names, per_actor.tolist()))
        else:
            busy_ps = {a.name: a.busy_ps for a in system.actors.values()}
        written.append(_ahbm_pes(out_dir, busy_ps, end))
    return written


# -- utilisation by component kind ------------------------------------------------------
def _utilisation_over_time(out_dir, trace, busy, edges, stems, status) -> Path:
    """One panel per component kind (shared time axis): mean busy % of the kind's *active* instances
    (those busy at least once), so 8 working PEs of 128 are not averaged away; the panel says how many."""
    plt = _plt()
    gid, kinds = _index(trace.actors, lambda n: component_kind(n, stems))
    counts = np.bincount(gid[gid >= 0], minlength=len(kinds))
    active_ids = np.unique(busy.actor)
    active = np.bincount(gid[active_ids][gid[active_ids] >= 0], minlength=len(kinds))
    per = busy.per_group(gid, len(kinds), edges) / (np.diff(edges) * np.maximum(active, 1)[:, None])
    order = [k for k in np.argsort(-per.mean(axis=1), kind="stable") if per[k].max() > 0][:MAX_KINDS]
    centers = (edges[:-1] + edges[1:]) / 2 / 1e6
    fig, axes = plt.subplots(max(len(order), 1), 1, figsize=(11, 0.9 * max(len(order), 1) + 1.4), sharex=True,
                             squeeze=False)
    for ax, k in zip(axes[:, 0], order):
        ax.fill_between(centers, 100 * per[k], step="mid", alpha=0.6)
        ax.set_ylim(0, 100)
        ax.set_yticks([0, 50, 100], ["0", "50", "100 %"], fontsize=7)
        ax.text(1.005, 0.5, f"{kinds[k]}\n{active[k]} of {counts[k]} active\nmean {100 * per[k].mean():.0f} %",
                transform=ax.transAxes, fontsize=8, va="center")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("virtual time (us)")
    fig.suptitle(f"{trace.header.get('scenario')} ({status}): utilisation by component kind over time "
                 "(busy % of the kind's active instances)", fontsize=10)
    return _save(fig, out_dir / "utilisation.png")


def _utilisation_bars(out_dir, system, end, stems, status) -> Path:
    plt = _plt()
    by = defaultdict(list)
    for a in system.actors.values():
        by[component_kind(a.name, stems)].append(a.busy_ps / end)
    kinds = sorted((k for k in by if max(by[k]) > 0), key=lambda k: -np.mean(by[k]))
    fig, ax = plt.subplots(figsize=(11, 5))
    x = np.arange(len(kinds))
    ax.bar(x - 0.2, [100 * np.mean(by[k]) for k in kinds], 0.4, label="mean over instances")
    ax.bar(x + 0.2, [100 * max(by[k]) for k in kinds], 0.4, label="busiest instance")
    ax.set_xticks(x, [f"{k}\n(x{len(by[k])})" for k in kinds], fontsize=8)
    ax.set_ylabel("busy, % of the run")
    ax.set_title(f"{system.name} ({status}): utilisation by component kind (enable the trace for a timeline)")
    ax.legend(fontsize=8)
    return _save(fig, out_dir / "utilisation.png")


# -- link bandwidth by link class --------------------------------------------------------
def _links_over_time(out_dir, trace, edges, stems) -> Path:
    """Per link class: total bytes (bars) and bandwidth over time (heatmap rows, GB/s, log colour)."""
    plt = _plt()
    from matplotlib.colors import LogNorm

    cid, classes = _index(list(range(len(trace.links))), lambda i: link_class(trace.links[i], stems))
    sends = np.array([(ev[1], ev[2], ev[4]) for ev in trace.events if ev[0] == SEND], dtype=np.int64).reshape(-1, 3)
    width = edges[1] - edges[0]
    b = np.minimum((sends[:, 0] / width).astype(np.int64), BINS - 1)
    c = cid[sends[:, 1]]
    per = np.bincount(c * BINS + b, weights=sends[:, 2], minlength=len(classes) * BINS).reshape(len(classes), BINS)
    gbs = per / (width / 1e12) / 1e9
    totals = per.sum(axis=1)
    order = [k for k in np.argsort(-totals, kind="stable") if totals[k] > 0][:MAX_CLASSES]
    n_links = np.bincount(cid, minlength=len(classes))
    fig, (axb, axh) = plt.subplots(1, 2, figsize=(13, 0.32 * max(len(order), 3) + 1.6), sharey=True,
                                   gridspec_kw={"width_ratios": [1, 3]})
    labels = [f"{classes[k]} (x{n_links[k]})" for k in order]
    axb.barh(range(len(order)), [totals[k] / 1e6 for k in order])
    axb.set_yticks(range(len(order)), labels, fontsize=7)
    axb.set_xlabel("MB sent over the run")
    data = gbs[order] if order else np.zeros((1, BINS))
    positive = data[data > 0]
    norm = LogNorm(vmin=max(positive.min(), positive.max() / 1e4), vmax=positive.max()) if len(positive) else None
    im = axh.imshow(np.where(data > 0, data, np.nan), aspect="auto", cmap="viridis", norm=norm,
                    interpolation="nearest", extent=(edges[0] / 1e6, edges[-1] / 1e6, len(order) - 0.5, -0.5))
    axh.set_xlabel("virtual time (us)")
    fig.colorbar(im, ax=axh, label="GB/s, all links of the class", pad=0.01)
    fig.suptitle(f"link bandwidth by link class: the {len(order)} classes with most bytes, of {len(classes)}",
                 fontsize=10)
    return _save(fig, out_dir / "links.png")


def _link_bars(out_dir, system, end, stems) -> Path:
    plt = _plt()
    by = defaultdict(int)
    for l in system.links:
        by[link_class({"src": l.src.owner.name, "dst": l.dst.owner.name, "src_port": l.src.name,
                       "dst_port": l.dst.name}, stems)] += l.bytes
    top = sorted((k for k in by if by[k]), key=lambda k: -by[k])[:20]
    fig, ax = plt.subplots(figsize=(11, 5))
    ax.barh(range(len(top)), [by[k] / (end / 1e12) / 1e9 for k in top])
    ax.set_yticks(range(len(top)), top, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("mean GB/s over the run, all links of the class")
    ax.set_title("link bandwidth by link class (enable the trace for a timeline)")
    return _save(fig, out_dir / "links.png")


# -- AHBM ---------------------------------------------------------------------------------
def _mesh(n: int) -> tuple[int, int]:
    """CUBE mesh (rows, cols) for ``n`` CUBEs per SIP: square when it can be."""
    r = int(round(n ** 0.5))
    return (r, n // r) if r * (n // r) == n else (1, n)


def _ahbm_pes(out_dir, busy_ps: dict[str, int], end: int) -> Path:
    """Per-PE utilisation of each engine kind, laid out as the CUBE mesh with 2 x 4 PEs per CUBE."""
    plt = _plt()
    pes = {}
    for name, b in busy_ps.items():
        m = AHBM_PE.match(name)
        if m:
            pes[(int(m[1]), int(m[2]), int(m[3]), m[4])] = b / end
    sips = sorted({k[0] for k in pes})
    cubes = max(k[1] for k in pes) + 1
    per_pe = max(k[2] for k in pes) + 1
    mr, mc = _mesh(cubes)
    pr, pc = (2, per_pe // 2) if per_pe % 2 == 0 and per_pe > 2 else (1, per_pe)
    kinds = [k for k in PE_KINDS if any(key[3] == k for key in pes)]
    fig, axes = plt.subplots(len(sips), len(kinds), figsize=(3.2 * len(kinds) + 1.2, 2.2 * len(sips) + 0.8),
                             squeeze=False, layout="constrained")
    vmax = max(pes.values()) or 1.0
    for si, sip in enumerate(sips):
        for ki, kind in enumerate(kinds):
            img = np.full((mr * pr, mc * pc), np.nan)
            for (s, cu, pe, k), u in pes.items():
                if s == sip and k == kind:
                    y, x = (cu // mc) * pr + pe // pc, (cu % mc) * pc + pe % pc
                    img[y, x] = 100 * u
            ax = axes[si][ki]
            im = ax.imshow(img, cmap="viridis", vmin=0, vmax=100 * vmax, interpolation="nearest")
            for r in range(1, mr):
                ax.axhline(r * pr - 0.5, color="white", lw=2)
            for c in range(1, mc):
                ax.axvline(c * pc - 0.5, color="white", lw=2)
            ax.set_xticks([c * pc + (pc - 1) / 2 for c in range(mc)], [f"x{c}" for c in range(mc)], fontsize=7)
            ax.set_yticks([r * pr + (pr - 1) / 2 for r in range(mr)], [f"y{r}" for r in range(mr)], fontsize=7)
            ax.set_title(f"sip{sip} {kind}: mean {np.nanmean(img):.1f} %", fontsize=9)
    fig.colorbar(im, ax=axes, shrink=0.8, label="busy, % of the run")
    fig.suptitle(f"utilisation per PE engine: CUBE mesh, {pr}x{pc} PEs per CUBE", fontsize=10)
    return _save(fig, out_dir / "ahbm_pes.png", tight=False)


def _ahbm_cubes(out_dir, trace, busy, edges) -> Path:
    plt = _plt()

    def cube(n):
        m = AHBM_PE.match(n)
        return f"sip{m[1]}/cube{m[2]}" if m and m[4] in ("gemm", "math") else None

    gid, cubes = _index(trace.actors, cube)
    counts = np.bincount(gid[gid >= 0], minlength=len(cubes))
    per = 100 * busy.per_group(gid, len(cubes), edges) / (np.diff(edges) * counts[:, None])
    fig, ax = plt.subplots(figsize=(11, 0.22 * len(cubes) + 1.8))
    im = ax.imshow(per, aspect="auto", cmap="magma", vmin=0, vmax=100, interpolation="nearest",
                   extent=(edges[0] / 1e6, edges[-1] / 1e6, len(cubes) - 0.5, -0.5))
    ax.set_yticks(range(len(cubes)), cubes, fontsize=6 if len(cubes) > 32 else 8)
    ax.set_xlabel("virtual time (us)")
    ax.set_title("per CUBE over time: mean busy % of its GEMM and MATH engines")
    fig.colorbar(im, ax=ax, label="busy %")
    return _save(fig, out_dir / "ahbm_cubes.png")


# -- pccx ---------------------------------------------------------------------------------
PCCX_ORDER = ("driver", "axil", "decoder", "scheduler", "dispatcher", "ddr", "hp", "acp", "l2", "gemv", "wsw",
              "lane", "gemm", "cvo")


def _pccx_units(out_dir, trace, busy, edges) -> Path:
    plt = _plt()
    ids = [i for i, n in enumerate(trace.actors) if n.startswith("pccx/")]
    has_busy = set(np.unique(busy.actor).tolist())
    units = [i for i in ids if i in has_busy]

    def rank(i):
        last = trace.actors[i].rsplit("/", 1)[-1]
        pos = next((k for k, p in enumerate(PCCX_ORDER) if last.startswith(p)), len(PCCX_ORDER))
        return pos, trace.actors[i]

    units.sort(key=rank)
    gid = np.full(len(trace.actors), -1, dtype=np.int64)
    for row, i in enumerate(units):
        gid[i] = row
    per = 100 * busy.per_group(gid, len(units), edges) / np.diff(edges)
    fifos = [i for i, l in enumerate(trace.links) if re.match(r"wfifo\d|cmd_fifo", l["name"])]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 0.3 * len(units) + 4.5), sharex=True, layout="constrained",
                                  gridspec_kw={"height_ratios": [max(len(units), 4), 4]})
    im = ax.imshow(per, aspect="auto", cmap="Blues", vmin=0, vmax=100, interpolation="nearest",
                   extent=(edges[0] / 1e6, edges[-1] / 1e6, len(units) - 0.5, -0.5))
    ax.set_yticks(range(len(units)), [trace.actors[i].removeprefix("pccx/") for i in units], fontsize=8)
    ax.set_title(f"{trace.header.get('scenario')}: per-unit busy % over time")
    fig.colorbar(im, ax=[ax, ax2], label="busy % (top panel)", pad=0.01, shrink=0.7, anchor=(0, 1))
    # FIFO occupancy: messages holding a credit (sent, not yet taken)
    fifo_set = set(fifos)
    evs = np.array([(ev[1], ev[2], 1 if ev[0] == SEND else -1) for ev in trace.events
                    if ev[0] in (SEND, TAKE) and ev[2] in fifo_set], dtype=np.int64).reshape(-1, 3)
    for li in fifos:
        sel = evs[evs[:, 1] == li]
        if not len(sel):
            continue
        occ = np.cumsum(sel[:, 2])
        l = trace.links[li]
        ax2.step(np.concatenate(([0], sel[:, 0], [edges[-1]])) / 1e6, np.concatenate(([0], occ, [occ[-1]])),
                 where="post", label=f"{l['name']} (capacity {l['capacity']})", lw=1.2)
    ax2.set_ylabel("entries in the FIFO")
    ax2.set_xlabel("virtual time (us)")
    ax2.set_title("weight FIFOs (HP port -> GEMV/GEMM) and the command FIFO: occupancy")
    if fifos:
        ax2.legend(fontsize=7, loc="upper right")
    return _save(fig, out_dir / "pccx_units.png", tight=False)


def _save(fig, path: Path, *, tight: bool = True) -> Path:
    import matplotlib.pyplot as plt

    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight" if not tight else None)
    plt.close(fig)
    return path


def plot_requests(path: Path, per_request: list, title: str) -> None:
    """``requests.png`` (several requests, docs/requests.md): the distribution of the decode step latencies
    and first-token times (empirical CDFs), and each request's life from arrival to its last step."""
    plt = _plt()
    steps = sorted(x for r in per_request for x in r["step_latency_ps"])
    first = sorted(r["first_token_ps"] for r in per_request)
    top = max(steps + first + [r["done_ps"] for r in per_request])
    scale, unit = (1e6, "us") if top < 1e9 else (1e9, "ms")
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for vals, label in ((steps, "decode step latency"), (first, "first-token time")):
        if vals:
            a.step(np.array(vals) / scale, np.arange(1, len(vals) + 1) / len(vals), where="post", label=label)
    a.set_xlabel(f"latency ({unit})")
    a.set_ylabel("fraction of steps / requests")
    a.set_title("latency distribution")
    a.legend()
    for i, r in enumerate(per_request):
        b.plot([r["arrival_ps"] / scale, r["done_ps"] / scale], [i, i], color="C0", lw=3)
        b.plot([r["arrival_ps"] / scale], [i], "k|")
    b.set_xlabel(f"time ({unit})")
    b.set_ylabel("request")
    b.set_title("arrival to last step")
    fig.suptitle(title)
    _save(fig, path)


def plot_power(path: Path, series: dict, title: str) -> None:
    """``power.png``: power per component class over time, stacked (the energy model, docs/energy.md)."""
    plt = _plt()
    t = np.array(series["t_ps"], dtype=float)
    scale, unit = (1e6, "us") if t[-1] < 1e9 else (1e9, "ms")
    classes = sorted(series["by_class_w"], key=lambda c: -sum(series["by_class_w"][c]))
    top, rest = classes[:8], classes[8:]
    ys = [series["by_class_w"][c] for c in top]
    labels = list(top)
    if rest:
        ys.append([sum(series["by_class_w"][c][i] for c in rest) for i in range(len(t))])
        labels.append("other")
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.stackplot(t / scale, ys, labels=labels, step="post")
    ax.set_xlabel(f"virtual time ({unit})")
    ax.set_ylabel("power (W)")
    ax.set_title(f"{title}: power by component class (window {series['window_ps'] / scale:g} {unit}; "
                 f"peak {series['peak_w']:.3g} W)")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
