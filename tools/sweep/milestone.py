"""``python -m tools.sweep.milestone``: docs/milestone.md, the seed's milestone answered from the bench's sweeps.

The seed (ADR-0060) asks one question per panel, ``{single,multi}_user x {prefill,decode}``, on 1 and 4 SIPs:
which ``C``, tile, topology and Ring order is best, and how close to the bound it gets.  The sweeps of
``scenarios/ahbm/llama70b/`` answer it (``make milestone`` runs them, resumable); this module reads what they
wrote (``best.csv``, ``confirm.csv``, ``results.csv``, each point's ``result.json``: docs/sweep.md "The sweep
directory") and writes one table per panel, the panel plots, what limits each best point (its ``limits`` line,
from a re-run of the point with a trace: ``--limits``, skipped for points whose run took longer than
``--limits-budget``), and the seed's predictions beside what the bench found.  Every figure in the page comes
from those files; nothing is typed in by hand, so a changed model regenerates a changed page.
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from emulator.units import format_time

__all__ = ["PANELS", "main", "render"]

ROOT = Path(__file__).resolve().parents[2]
SPECS = "scenarios/ahbm/llama70b"


@dataclass(frozen=True)
class Sweep:
    """One sweep file of the bench: its name (``SPECS/<name>.yaml``, output ``<runs>/llama70b-<name>``)."""
    name: str
    case: str          # what the rows of its table say in the "case" column

    def directory(self, runs: Path) -> Path:
        return runs / f"llama70b-{self.name}"

    def command(self, runs: str = "runs/sweeps") -> str:
        return f"emu sweep {SPECS}/{self.name}.yaml --out {runs}/llama70b-{self.name}"


SINGLE_DECODE = (Sweep("decode-nosp", "no SP"), Sweep("decode-sp", "SP"))
SINGLE_PREFILL = (Sweep("prefill-nosp", "no SP"), Sweep("prefill-sp", "Ring"), Sweep("prefill-sp-32k", "Ring"))
MULTI_DECODE = Sweep("multi-user-decode", "decode")
MULTI_PREFILL = Sweep("multi-user-prefill", "prefill")
PANELS = {"single-user decode": SINGLE_DECODE, "single-user prefill": SINGLE_PREFILL,
          "multi-user decode": (MULTI_DECODE,), "multi-user prefill": (MULTI_PREFILL,)}

#: the short names of a configuration's keys in the tables
SHORT = {"workload.params.C": "C", "workload.params.P": "P", "workload.params.tile": "TILE",
         "workload.params.gemm": "", "workload.params.l2": "L2", "workload.params.l1": "L1",
         "workload.params.T_q": "T_q", "workload.params.ring_order": "", "workload.params.chunk": "chunk"}


def _read_csv(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [{k: _value(v) for k, v in r.items()} for r in csv.DictReader(f)]


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _t(ps) -> str:
    return format_time(int(ps)) if isinstance(ps, (int, float)) else "-"


def _f(x, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "-"


def _n(x) -> str:
    return f"{x:,.0f}" if isinstance(x, (int, float)) else "-"


def _config(row: dict, over: list[str]) -> str:
    parts = []
    for k in over:
        v = row.get(k)
        name = SHORT.get(k, k.rsplit(".", 1)[-1])
        parts.append(f"{name} {v}" if name else str(v))
    return ", ".join(parts)


def _ctx(tokens) -> str:
    return f"{tokens // 1024}K" if isinstance(tokens, int) and tokens >= 1024 and tokens % 1024 == 0 else str(tokens)


def _over(directory: Path) -> tuple[list[str], list[str]]:
    """The sweep's ``best.over`` and ``best.per`` keys, from the ``sweep.yaml`` it wrote."""
    import yaml
    doc = yaml.safe_load((directory / "sweep.yaml").read_text())["sweep"]
    best = doc.get("best") or {}
    return list(best.get("over") or []), list(best.get("per") or [])


def _result(directory: Path, row: dict) -> dict:
    path = directory / str(row.get("bundle") or row.get("confirm.bundle") or "") / "result.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _point(directory: Path, row: dict) -> dict:
    path = directory / str(row.get("bundle") or "") / "point.json"
    return json.loads(path.read_text()) if path.is_file() else {}


# ----------------------------------------------------------------------------------------------- limits

def limits_of(directory: Path, row: dict, out: Path, budget_s: float) -> str:
    """The ``limits`` line of ``row``'s point, re-run with a trace into ``out/<key>`` (kept: a second call reads it)
    when its recorded run took at most ``budget_s``; else the bound's binding term, saying why."""
    key = str(row.get("bundle", "")).rsplit("/", 1)[-1]
    done = out / key / "result.json"
    if not done.is_file():
        wall = row.get("wall_s")
        point = _point(directory, row)
        args = _rerun_args(directory, point)
        if args is None or not isinstance(wall, (int, float)) or wall > budget_s:
            res = _result(directory, row)
            line = ((res.get("limits") or {}).get("line") or "").split("; ", 1)[-1]
            return f"(not re-run with a trace: its run took {wall:.0f} s) {line}".strip() if isinstance(wall, (int, float)) else f"(not re-run with a trace) {line}".strip()
        cmd = [sys.executable, "-m", "tools.cli", "run", *args, "--out", str(out / key), "--quiet",
               "--allow-path", str(ROOT)]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if p.returncode != 0 or not done.is_file():
            return f"(re-run failed: {(p.stderr.strip().splitlines() or ['?'])[-1]})"
    return (json.loads(done.read_text()).get("limits") or {}).get("line", "-")


def _rerun_args(directory: Path, point: dict) -> list[str] | None:
    """What ``emu run`` re-runs the point with: its bundle's scenario.yaml, runnable by itself; a bundle of an
    earlier version (a ``base:`` and ``set:`` in place of the scenario) names the base and the ``--set`` items."""
    import yaml
    if not point:
        return None
    scen = directory / "points" / point["key"] / "scenario.yaml"
    doc = yaml.safe_load(scen.read_text()) if scen.is_file() else None
    if not isinstance(doc, dict):
        return None
    if "base" not in doc:
        return [str(scen)]
    base = doc.get("base")
    if not base or not Path(base).is_file():
        return None
    return [str(base)] + [x for s in point["sets"] for x in ("--set", s)]


def _leading(line: str) -> str:
    """The ``limits`` line's first clause (what the critical path spends most in), for a table cell."""
    return line.split("; ")[0].replace("|", "/")


# ----------------------------------------------------------------------------------------------- panels

def single_user(runs: Path, sweeps: tuple, *, prefill: bool, limits: dict) -> list[str]:
    """One row per (case, context): the best point on 1 SIP with one KV head, its 4-SIP confirmation."""
    rows = []
    head = ("| case | context | best configuration (1 SIP, one KV head) | latency | tok/s | tok/J | bound | ratio to"
            " bound | runner-up margin | what limits it | 4 SIPs: heads, latency, / 1 SIP |")
    rows += [head, "|" + "---|" * head.count(" | ") + "---|"]
    for sw in sweeps:
        d = sw.directory(runs)
        best = _read_csv(d / "best.csv")
        if not best:
            rows.append(f"| {sw.case} | - | not run: `{sw.command()}` | | | | | | | | |")
            continue
        over, _ = _over(d)
        confirm = {r["point"]: r for r in _read_csv(d / "confirm.csv")}
        results = {r["point"]: r for r in _read_csv(d / "results.csv")}
        for b in best:
            r = results.get(b["point"], b)
            ctx = r.get("workload.params.context") or _param(d, r.get("bundle"), "workload.params.context")
            chunk = r.get("workload.params.chunk") or _param(d, r.get("bundle"), "workload.params.chunk")
            tokens = (chunk or ctx) if prefill else 1
            conf = confirm.get(b["point"], {})
            conf_cell = "not run"
            if conf.get("confirm.status") == "finished":
                heads = _param(d, conf.get("confirm.bundle"), "workload.params.heads")
                conf_cell = f"{heads}, {_t(conf.get('confirm.latency_ps'))}, {_f(conf.get('confirm.latency_ps_ratio'))}"
            elif conf:
                conf_cell = str(conf.get("confirm.status"))
            lim = limits.get((sw.name, b["point"])) or "-"
            energy = r.get("energy_j")
            rows.append("| " + " | ".join([
                sw.case, _ctx(ctx), _config(b, over), _t(b.get("latency_ps")),
                _n(tokens / (b["latency_ps"] / 1e12)) if isinstance(b.get("latency_ps"), (int, float)) else "-",
                _n(tokens / energy) if isinstance(energy, (int, float)) and energy else "-",
                _t(r.get("bound_ps")), _f(r.get("ratio_to_bound")), _f(b.get("margin")), _leading(lim),
                conf_cell]) + " |")
    return rows


def _param(directory: Path, bundle, key: str):
    """A point's value of ``key`` (a dotted path such as ``workload.params.heads``): the value in force, from the
    bundle's scenario.resolved.yaml."""
    import yaml
    scen = directory / str(bundle or "") / "scenario.resolved.yaml"
    if not bundle or not scen.is_file():
        return None
    node = yaml.safe_load(scen.read_text()) or {}
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def multi_user(runs: Path, sw: Sweep, *, prefill: bool, limits: dict) -> list[str]:
    """One table per (context, machine): per load B, the best C and its latencies, throughput, energy, ratio."""
    d = sw.directory(runs)
    results = _read_csv(d / "results.csv")
    best = _read_csv(d / "best.csv")
    if not best:
        return [f"Not run: `{sw.command()}`.", ""]
    by_point = {r["point"]: r for r in results}
    for r in results + best:      # a context the sweep sets rather than varies: its points' bundles say
        if r.get("workload.params.context") in (None, ""):
            r["workload.params.context"] = _param(d, by_point.get(r["point"], r).get("bundle"), "workload.params.context")
    out = []
    contexts = sorted({r["workload.params.context"] for r in results if r["workload.params.context"] is not None})
    machines = sorted({r["machine.profile"] for r in results})
    metric = "first_token_p99_ps" if prefill else "makespan_ps"
    for ctx in contexts:
        for m in machines:
            sel = [b for b in best if b.get("machine.profile") == m and b.get("workload.params.context") == ctx]
            if not sel:
                continue
            title = f"**{_ctx(ctx)} context, "
            heads = {r.get("workload.params.heads") for r in results if r["machine.profile"] == m}
            out.append(f"{title}{m}** ({', '.join(map(str, sorted(heads)))} KV heads, B requests per head):")
            out.append("")
            if prefill:
                head = ("| B | best C | first token p50 | first token p99 | makespan | tok/s | tok/J | ratio to bound |"
                        " other C: first token p99 | what limits it |")
            else:
                head = ("| B | best C | makespan | step p50 | step p99 | tok/s | tok/J | ratio to bound | hidden |"
                        " other C: makespan | what limits it |")
            out += [head, "|" + "---|" * head.count(" | ") + "---|"]
            for b in sorted(sel, key=lambda r: r["workload.params.requests"]):
                r = by_point.get(b["point"], b)
                res = _result(d, r)
                other = [x for x in results if x["machine.profile"] == m and x.get("workload.params.context") == r.get(
                    "workload.params.context") and x["workload.params.requests"] == r["workload.params.requests"]
                    and x["point"] != r["point"]]
                other_cell = ", ".join(f"C {x['workload.params.C']}: {_t(x.get(metric))}" for x in other) or "-"
                lim = _leading(limits.get((sw.name, b["point"])) or "-")
                if prefill:
                    cells = [r["workload.params.requests"], r["workload.params.C"], _t(r.get("first_token_p50_ps")),
                             _t(r.get("first_token_p99_ps")), _t(r.get("makespan_ps")), _n(r.get("tokens_per_s")),
                             _f(r.get("tokens_per_j"), 1), _f(res.get("ratio_to_bound")), other_cell, lim]
                else:
                    cells = [r["workload.params.requests"], r["workload.params.C"], _t(r.get("makespan_ps")),
                             _t(r.get("step_p50_ps")), _t(r.get("step_p99_ps")), _n(r.get("tokens_per_s")),
                             _f(r.get("tokens_per_j"), 1), _f(res.get("ratio_to_bound")),
                             _f(r.get("hidden_fraction_mean")), other_cell, lim]
                out.append("| " + " | ".join(map(str, cells)) + " |")
            out.append("")
    out += _four_sip_check(results, best, metric)
    return out


def _four_sip_check(results: list[dict], best: list[dict], metric: str) -> list[str]:
    """Whether the 4-SIP machine picks the same C as the 1-SIP one at every (context, B)."""
    pick: dict = {}
    for b in best:
        pick.setdefault((b.get("workload.params.context"), b["workload.params.requests"]), {})[b["machine.profile"]] = b
    same, differ = 0, []
    for (ctx, n), bym in sorted(pick.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        if len(bym) < 2:
            continue
        cs = {m: r["workload.params.C"] for m, r in bym.items()}
        if len(set(cs.values())) == 1:
            same += 1
        else:
            differ.append(f"{_ctx(ctx) + ', ' if ctx else ''}B = {n}: " + ", ".join(f"{m} C {c}" for m, c in cs.items()))
    if not same and not differ:
        return []
    text = f"4 SIPs choose the same C as 1 SIP at {same} of {same + len(differ)} loads"
    return [text + (": they differ at " + "; ".join(differ) + "." if differ else "."), ""]


# ----------------------------------------------------------------------------------------------- findings

def findings(runs: Path) -> list[str]:
    """The seed's predictions (ADR-0060 §4.3, §5.3, §5.5, §6) beside what the sweeps measured."""
    out = ["| the seed predicts | the bench finds |", "|---|---|"]
    sp = _read_csv(SINGLE_DECODE[1].directory(runs) / "best.csv")
    if sp:
        cs = ", ".join(f"{_ctx(b['workload.params.context'])}: C {b['workload.params.C']}" for b in sp)
        out.append(f"| §5.3: a short decode prefers a small C (less inter-CUBE reduction); raise C only when the"
                   f" context needs more KV parallelism | best C per context (1 SIP, one KV head): {cs} |")
    rs = []
    for sw in SINGLE_PREFILL[1:]:
        for r in _read_csv(sw.directory(runs) / "results.csv"):
            if r.get("workload.params.context") in (None, ""):    # set by the sweep, not varied: its bundle says
                r["workload.params.context"] = _param(sw.directory(runs), r.get("bundle"), "workload.params.context")
            rs.append(r)
    zig = _ratio_by(rs, "workload.params.ring_order", "contiguous", "zigzag")
    if zig:
        out.append("| §5.5: Ring prefill with causal skip (about half the steps skipped); the ring order is a"
                   " tuning item | contiguous / zigzag latency at the same C: " + ", ".join(zig) + " |")
    c84 = _ratio_by([r for r in rs if r.get("workload.params.ring_order") == "contiguous"], "workload.params.C", 4, 8)
    if c84:
        out.append("| §0, §5.5: a large C for long-context prefill (C = 8 or 4) | Ring latency C 4 / C 8"
                   " (contiguous): " + ", ".join(c84) + " |")
    md = _read_csv(MULTI_DECODE.directory(runs) / "results.csv")
    hid = [r for r in md if r.get("workload.params.C") == 8 and r.get("machine.profile") == "ahbm-1sip"
           and isinstance(r.get("hidden_fraction_mean"), (int, float))]
    if hid:
        cells = []
        for ctx in sorted({r["workload.params.context"] for r in hid}):
            pts = sorted((r for r in hid if r["workload.params.context"] == ctx), key=lambda r: r["workload.params.requests"])
            solo = next((r for r in md if r.get("workload.params.C") == 8 and r.get("machine.profile") == "ahbm-1sip"
                         and r["workload.params.context"] == ctx and r["workload.params.requests"] == 1), None)
            gain = ""
            if solo and pts:
                last = pts[-1]
                gain = (f"; throughput B = {last['workload.params.requests']} / B = 1:"
                        f" {last['tokens_per_s'] / solo['tokens_per_s']:.3f}")
            cells.append(f"{_ctx(ctx)}: hidden " + ", ".join(
                f"{r['hidden_fraction_mean']:.2f} (B = {r['workload.params.requests']})" for r in pts) + gain)
        out.append("| §4.3, §5.3: the reduction is hidden by concurrent decode tokens | C 8 x P 8, 1 SIP: "
                   + "; ".join(cells) + " |")
    shares = []
    d = SINGLE_DECODE[1].directory(runs)
    results = {r["point"]: r for r in _read_csv(d / "results.csv")}
    for b in sp:
        res = _result(d, results.get(b["point"], {}))
        phases = res.get("phases") or []
        red = sum(p["ps"] for p in phases if str(p.get("phase", "")).startswith("reduction"))
        if phases and res.get("latency_ps"):
            shares.append(f"{_ctx(b['workload.params.context'])} {100 * red / res['latency_ps']:.0f} %")
    if shares:
        out.append("| §6: a blocking `tl.recv` suffices; a hardware pop would help only a lone reduction (batch 1, short"
                   " context), whose wait nothing hides | one request (B = 1), the best SP decode: the reduction's share"
                   " of the critical chain (`phases`) " + ", ".join(shares) + "; with concurrent requests the"
                   " hidden fractions above |")
    return out


def _ratio_by(rows: list[dict], key: str, num, den) -> list[str]:
    """``latency(key=num) / latency(key=den)`` for rows equal in every other varied key except ``key``."""
    groups: dict = {}
    for r in rows:
        if r.get("status") != "finished":
            continue
        other = tuple((k, r[k]) for k in sorted(r) if k.startswith("workload.params.") and k != key)
        groups.setdefault(other, {})[r[key]] = r["latency_ps"]
    out = []
    for other, vals in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if num in vals and den in vals:
            o = dict(other)
            label = f"{_ctx(o.get('workload.params.context'))}" + (f" C {o['workload.params.C']}"
                                                                    if "workload.params.C" in o else "")
            out.append(f"{label}: {vals[num] / vals[den]:.2f}")
    return out


# ----------------------------------------------------------------------------------------------- page

def render(runs: Path, docs: Path, *, limits_budget: float | None) -> str:
    limits = {}
    if limits_budget is not None:
        cache = runs / "milestone-limits"
        for sweeps in PANELS.values():
            for sw in sweeps:
                d = sw.directory(runs)
                results = {r["point"]: r for r in _read_csv(d / "results.csv")}
                for b in _read_csv(d / "best.csv"):
                    row = {**b, **results.get(b["point"], {})}
                    limits[(sw.name, b["point"])] = limits_of(d, row, cache, limits_budget)
    wall = {sw.name: sum(r["wall_s"] for r in _read_csv(sw.directory(runs) / "results.csv")
                         if isinstance(r.get("wall_s"), (int, float)))
            for sweeps in PANELS.values() for sw in sweeps}
    lines = ["# The milestone: Llama3-70B GQA attention on AHBM, the four panels on 1 and 4 SIPs", "",
             "<!-- generated by `python -m tools.sweep.milestone` from runs/sweeps/llama70b-*: do not edit by hand -->",
             "",
             "The seed's milestone asks, for `{single,multi}_user x {prefill,decode}` on 1 and 4 SIPs, which `C`,"
             " tile, topology and Ring order is best, and how close to its bound it gets. The sweeps of"
             " `scenarios/ahbm/llama70b/` answer it (one attention layer, Llama3-70B shapes: G = 8 query heads per KV"
             " head, d = 128; timing mode, `fidelity: stream` where the composites read K/V from HBM and `pipeline` for"
             " the Ring prefills, both the block model's end times, docs/gqa.md \"Fidelity\"); `make milestone` runs"
             " them all (resumable) and"
             " regenerates this page with `python -m tools.sweep.milestone --limits`. Every figure below is read"
             " from the sweeps' files (docs/sweep.md \"The sweep directory\"); *tok/s* and *tok/J* count tokens"
             " through this one attention layer (not whole-model tokens): in the single-user tables of one KV head's"
             " Group (a decode step is one token, a prefill the prompt's tokens), in the multi-user tables the"
             " requests' tokens with every KV head of the machine (2 on 1 SIP, 8 on 4 SIPs: so tok/J falls on 4"
             " SIPs, with four times the heads' energy and the SIPs' static power), *ratio to bound* is latency / the analytic bound (docs/gqa.md \"The bound\"), *what limits"
             " it* is the first clause of the point's `limits` line (docs/explain.md), from a re-run of the point"
             " with a trace at the sweep's fidelity: at `pipeline` and `stream` the critical path does not see the"
             " engines the scheduler holds or batches, whose time it counts as *scheduler* and *DONE polls*"
             " (docs/outputs.md \"What limits it\": `fidelity: block` walks them, with the same end time).", ""]
    for title, sweeps in PANELS.items():
        lines += [f"## {title[0].upper() + title[1:]}", ""]
        if title.startswith("single"):
            lines += single_user(runs, sweeps, prefill="prefill" in title, limits=limits)
            lines.append("")
        else:
            lines += multi_user(runs, sweeps[0], prefill="prefill" in title, limits=limits)
        for sw in sweeps:
            png = sw.directory(runs) / "plots" / "panel.png"
            if png.is_file():
                target = docs / "milestone" / f"{sw.name}.png"
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(png, target)
                lines += [f"![{sw.name}](milestone/{sw.name}.png)", ""]
        ran = [f"{sw.name} {wall[sw.name] / 60:.1f} min" for sw in sweeps if wall[sw.name]]
        lines += ["Regenerate: " + "; ".join(f"`{sw.command()}`" for sw in sweeps) +
                  (f" (the points' run times, wall, one core each: {', '.join(ran)})." if ran else "."), ""]
    lines += ["## What the seed predicted, and what the bench found", ""] + findings(runs) + [""]
    lines += ["## What it cost", ""] + costs(runs) + [""]
    return "\n".join(lines)


def costs(runs: Path) -> list[str]:
    """Per sweep: points, the sum and the largest of their recorded wall times (``wall_s``, one core each), and
    the confirmation's; the machine's loop calibration now, to read the times against (docs/sweep.md)."""
    from tools.bench.command import loop_ns
    out = ["| sweep | points | their wall time (one core each) | the longest | 4-SIP confirmations |", "|---|---|---|---|---|"]
    total = 0.0
    for sweeps in PANELS.values():
        for sw in sweeps:
            rows = _read_csv(sw.directory(runs) / "results.csv")
            walls = [r["wall_s"] for r in rows if isinstance(r.get("wall_s"), (int, float))]
            conf = []
            for c in _read_csv(sw.directory(runs) / "confirm.csv"):
                res = _result(sw.directory(runs), {"bundle": c.get("confirm.bundle")})
                if isinstance(res.get("wall_s"), (int, float)):
                    conf.append(res["wall_s"])
            total += sum(walls) + sum(conf)
            out.append(f"| `{sw.name}` | {len(rows)} | {sum(walls) / 60:.1f} min | {max(walls, default=0):.0f} s |"
                       f" {len(conf)}, {sum(conf) / 60:.1f} min |")
    out += ["", f"In all {total / 60:.1f} min of one core's wall time; the machine's loop calibration when this page"
                f" was written: {loop_ns():.1f} ns (`tools.bench.command.loop_ns`: compare times only at a similar"
                " figure and load)."]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.sweep.milestone", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="runs/sweeps", help="where the sweeps wrote their directories (default: runs/sweeps)")
    ap.add_argument("--out", default="docs/milestone.md", help="the page to write (default: docs/milestone.md)")
    ap.add_argument("--limits", action="store_true", help="re-run each best point with a trace for its limits line")
    ap.add_argument("--limits-budget", type=float, default=60.0,
                    help="with --limits: re-run only points whose sweep run took at most this many seconds (default: 60)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    text = render(Path(a.runs), out.parent, limits_budget=a.limits_budget if a.limits else None)
    out.write_text(text)
    print(f"wrote {out} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
