"""``emu whatif SCENARIO``: what a faster (or slower) part buys, measured, beside the one-run estimate.

**Knobs.**  A resource class's speed is the set of profile keys its parameters come from, found in
the *declarations* (emulator/declare.py): every :class:`~emulator.declare.Param` of every component
class of the built machine (and the AHBM family's derived-parameter table,
actors/ahbm/params.py ``PARAMS``) whose unit is a speed -- ``B/s``, ``MAC/clk`` and ``clock``
(scaled by the speed factor ``s``), ``ps`` and ``cycles`` (divided by ``s``) -- except guards
(``*timeout*``) and keys set to 0 (a feature off, e.g. ``driver.poll_max_interval: 0``).  Of a derived parameter (several key paths) the first key is the knob (``hbm.pc_bandwidth``
of ``pc_bandwidth x efficiency``); a table value (``cpu.dispatch_cycles``) scales entry by entry.  Each
key goes to a resource class by its section (:data:`SECTION_CLASS`, the classes of
tools/explain/limits.py); a clock (``clock.pe``, ``clocks.core``) drives several classes and is a knob
of its own, named by its key.  Count-valued widths (``math.lanes``, ``gemm.array_rows``) are not speeds and
are not scaled.  Integer values are rounded, so the factor a key really got is reported (``actual``).

**Variants.**  For each knob group and each factor (default ``s = 1.1`` and ``s = 0.9``: 10 % faster and
slower) one run of the scenario with the group's keys scaled, on the sweep backends (tools/sweep/backends.py:
the process pool, or Ray); the faster variants go first (they are the cheaper runs).  The measured change is
the end time's relative change against the baseline.

**The one-run estimate.**  The baseline run's critical path (tools/explain/limits.py) gives each class's
share ``c`` of the end time; if that class's time scales by ``1/s`` and the path stays the same, the end time
changes by ``c (1/s - 1)``; for a clock, ``c`` is the sum over the classes that clock drives.  The estimate is
first order: it ignores work that moves on or off the path, and it assumes the group's keys are all of the
class's time (a class whose main cost has no exclusive knob, the AHBM GEMM array's core cycles at ``clock.pe``,
is over-estimated by its own row; the ``clock.pe`` row covers it).  How far off it was is part of every measured
row: ``error`` = measured minus estimated change, in points of the end time (a column beside each estimate),
and the line under the table names the largest (``largest_error``), so a reader sees at once where the one-run
reading of the critical path cannot be trusted.

**Coverage** (:func:`knob_coverage`, printed under the table, ``coverage`` in ``--json``).  The output says
which classes the what-if cannot speed up by themselves: a class of :data:`PARTIAL_KNOBS` (its main cost
counted in a width at a shared clock: the AHBM GEMM array's core MAC cycles ``ceil(m/R) ceil(n/C) k``, MATH's
per-element cycles) is marked ``*`` with its formula, its own keys and the clock row that reaches the rest;
a class on the critical path that no group of its own covers (the pccx HP ports: only ``clocks.axi``) is
listed with its clock.  Why the widths are not scaled instead: a 10 % larger array is another machine (32 ->
35 rows changes which tiles pad), and an integer width moves its time in steps (``ceil(n/C)``), not by 10 %;
``emu sweep`` over ``gemm.array_rows`` answers "a wider array" exactly.
"""
from __future__ import annotations

import copy
import importlib
import json
import sys
import tempfile
from pathlib import Path

from emulator.input_paths import add_allow_path_argument
from emulator.units import format_time
from tools.explain.limits import FAMILY_CLASSES
from emulator.declare import value_at

__all__ = ["knob_groups", "scaled_profile", "run_whatif", "format_whatif", "largest_error", "add_parser", "main",
           "SECTION_CLASS"]

#: speed units: scaled by s (a rate) or by 1/s (a time)
RATE_UNITS = ("B/s", "MAC/clk", "clock")
TIME_UNITS = ("ps", "cycles")

#: profile section (or full key) -> resource class, per family; ``None``: a clock, its own group
SECTION_CLASS = {
    "ahbm": {"hbm": "HBM channels", "dma": "DMA", "gemm": "GEMM array", "math": "MATH", "tcm": "TCM",
             "cpu": "CPU dispatch", "ipcq": "IPCQ", "noc": "NOC", "ucie": "UCIe", "io": "host", "clock": None},
    "pccx": {"hp": "HP ports", "ddr": "DDR", "l2": "L2", "gemv": "GEMV lanes", "cvo": "SFU",
             "gemm": "systolic array", "driver": "host round trips", "acp": "host round trips",
             "axil": "host round trips", "driver.poll_interval": "DONE polls",
             "driver.poll_max_interval": "DONE polls", "dispatcher": "control", "decoder_cycles": "control",
             "scheduler_cycles": "control", "clocks": None},
    "demo": {"workload.params.merge": "reduce PEs", "workload.params.produce": "reduce PEs",
             "workload.params.period": "reduce PEs", "workload.params.service": "ring nodes",
             "links": "links", "link": "links"},
}
_WORKLOAD = "workload.params."

#: per family: a class whose own keys cover only part of its time, the rest counted in a width (a count, not a
#: speed: scaling it changes the machine's shape and its padding, not its speed) at a clock it shares; the
#: part's formula (actors/ahbm/costs.py).  :func:`knob_coverage` adds the clock and the keys that are its own.
PARTIAL_KNOBS = {
    "ahbm": {
        "GEMM array": ("core MAC cycles ceil(m/R) ceil(n/C) k, R x C = gemm.array_rows x gemm.array_cols",
                       ("gemm.array_rows", "gemm.array_cols")),
        "MATH": ("per-element cycles passes x ceil(elements / lanes), lanes = math.lanes", ("math.lanes",)),
    },
}


def _declared(system, family: str) -> list:
    from emulator.declare import params_of

    seen = {}
    for a in system.actors.values():
        for p in params_of(type(a)).values():
            seen.setdefault((p.name, p.keys), (p, type(a)))
    try:   # a family's table of derived parameters (AHBM: actors/ahbm/params.py PARAMS)
        table = getattr(importlib.import_module(f"actors.{family}.params"), "PARAMS", {})
        for p in (table.values() if isinstance(table, dict) else ()):
            seen.setdefault((p.name, p.keys), (p, None))
    except ImportError:
        pass
    return list(seen.values())


def _section_class(key: str, family: str):
    table = SECTION_CLASS.get(family, {})
    if key in table:
        return table[key]
    head = key[len(_WORKLOAD):] if key.startswith(_WORKLOAD) else key
    sec = key.split(".")[0] if not key.startswith(_WORKLOAD) else _WORKLOAD + head.split(".")[0]
    if sec in table:
        return table[sec]
    return "?" + sec


def knob_groups(system, scenario) -> dict:
    """``{group: {"classes": [...], "keys": {key: unit}}}`` (module docstring); a clock is the group of its key."""
    from emulator.declare import params_of
    from tools.trace.summary import component_kind, kind_stems
    from tools.explain.limits import _kind_class

    family = scenario.family
    kinds = FAMILY_CLASSES.get(family, {})
    stems = kind_stems(system.actors)
    groups: dict = {}
    clock_users: dict = {}
    for p, cls in _declared(system, family):
        unit = p.unit
        if unit not in RATE_UNITS + TIME_UNITS or "timeout" in p.name:
            continue
        key = p.keys[0]
        value = (value_at(scenario.params, key[len(_WORKLOAD):]) if key.startswith(_WORKLOAD)
                 else value_at(scenario.profile, key))
        if value is None or isinstance(value, bool) or not (isinstance(value, (int, float)) or (
                isinstance(value, dict) and all(isinstance(v, (int, float)) for v in value.values()))):
            continue
        if not (sum(value.values()) if isinstance(value, dict) else value):   # 0: off (no backoff), no speed
            continue
        klass = _section_class(key, family)
        if klass is None:   # a clock: its own group; the classes it drives from the components declaring it
            g = groups.setdefault(key, {"classes": set(), "keys": {}})
            g["keys"][key] = "clock" if unit == "ps" else unit
            users = clock_users.setdefault(key, set())
            for a in system.actors.values():
                if any(key in q.keys for q in params_of(type(a)).values()):
                    users.add(_kind_class(component_kind(a.name, stems), kinds))
            continue
        g = groups.setdefault(klass, {"classes": {klass}, "keys": {}})
        g["keys"][key] = unit
    for key, users in clock_users.items():
        groups[key]["classes"] = users
    return {k: {"classes": sorted(v["classes"]), "keys": dict(sorted(v["keys"].items()))}
            for k, v in sorted(groups.items())}


def knob_coverage(groups: dict, family: str, shares: dict) -> dict:
    """Which classes the what-if cannot speed up by themselves, and why (module docstring):

    ``partial``: ``{class: {"what", "widths", "clock", "shared_with", "own_keys"}}`` for a class of
    :data:`PARTIAL_KNOBS` that has a group: its row scales only ``own_keys``, so its measured change is
    smaller than its estimate, and only its clock's row (shared with ``shared_with``) speeds the rest;
    ``none``: ``{class: {"share", "clock", "shared_with"}}`` for a class on the critical path that no group
    of its own covers (only a clock's row reaches it; ``shared_with`` empty: the clock is its own)."""
    clocks = {g: spec["classes"] for g, spec in groups.items() if g not in spec["classes"]}

    def clock_of(cls):
        for g, classes in clocks.items():
            if cls in classes:
                return g, [c for c in classes if c != cls]
        return None, []

    partial = {}
    for cls, (what, widths) in PARTIAL_KNOBS.get(family, {}).items():
        if cls in groups:
            clock, others = clock_of(cls)
            partial[cls] = {"what": what, "widths": list(widths), "clock": clock, "shared_with": others,
                            "own_keys": list(groups[cls]["keys"])}
    covered = {c for g, spec in groups.items() if g not in clocks for c in spec["classes"]}
    none = {}
    for cls, share in sorted(shares.items(), key=lambda kv: -kv[1]):
        if share > 0 and cls not in covered:
            clock, others = clock_of(cls)
            none[cls] = {"share": share, "clock": clock, "shared_with": others}
    return {"partial": partial, "none": none}


def _scale(value, unit: str, s: float):
    f = s if unit in RATE_UNITS else 1 / s
    if isinstance(value, dict):
        return {k: _scale(v, unit, s) for k, v in value.items()}
    out = value * f
    if isinstance(value, int):
        out = max(1, round(out)) if value >= 1 else value
    return out


def scaled_profile(resolved: dict, keys: dict, s: float) -> tuple[dict, dict]:
    """A copy of a resolved scenario dict with ``keys`` scaled for speed factor ``s``; and per key
    ``(before, after, actual speed factor)``."""
    out = copy.deepcopy(resolved)
    changes = {}
    for key, unit in keys.items():
        if key.startswith(_WORKLOAD):
            node, path = out["workload"]["params"], key[len(_WORKLOAD):].split(".")
        else:
            node, path = out["machine"]["resolved"], key.split(".")
        for k in path[:-1]:
            node = node[k]
        before = node[path[-1]]
        after = _scale(before, unit, s)
        node[path[-1]] = after
        b = sum(before.values()) if isinstance(before, dict) else before
        a = sum(after.values()) if isinstance(after, dict) else after
        actual = (a / b if unit in RATE_UNITS else b / a) if a and b else None
        changes[key] = {"before": before, "after": after, "speed": None if actual is None else round(actual, 4)}
    return out, changes


class _Events:
    def __init__(self, out: dict, quiet: bool):
        self.out, self.quiet = out, quiet

    def running(self, n: int) -> None:
        pass

    def done(self, task: dict, record: dict) -> None:
        self.out[task["index"]] = record.get("result", {})
        if not self.quiet:
            r = self.out[task["index"]]
            print(f"  variant {task['label']}: {r.get('status')} {format_time(r['end_time_ps']) if r.get('end_time_ps') else ''}",
                  file=sys.stderr)


def run_whatif(path: str, sets=(), *, factor: float = 0.1, only=None, backend: str = "pool", jobs=None,
               address=None, quiet: bool = True, allow=()) -> dict:
    """Baseline (with its critical path), every knob group at ``1 + factor`` and ``1 - factor`` speed, the table.
    ``allow``: ``--allow-path`` folders (emulator/input_paths.py)."""
    from actors import registry
    from emulator.scenario import load_scenario, scenario_path
    from tools.run.runner import build_system, execute, plan_run
    from tools.sweep.backends import make_backend

    sc = load_scenario(str(scenario_path(path)), registry, list(sets), allow=allow)
    system, _ = build_system(sc)
    groups = all_groups = knob_groups(system, sc)
    del system
    if only:
        unknown = [o for o in only if o not in groups]
        if unknown:
            raise ValueError(f"emu whatif --only: unknown resource {', '.join(unknown)} "
                             f"(this machine's: {', '.join(groups)})")
        groups = {k: v for k, v in groups.items() if k in only}
    with tempfile.TemporaryDirectory(prefix="emu-whatif-") as tmp:
        plan = plan_run(sc, bundle=False, trace_path=str(Path(tmp) / "base.emutrace"))
        base = execute(plan).res
        if base["status"] != "finished":
            raise ValueError(f"{path}: the baseline run ended {base['status']}: {base.get('error', '')}")
        cp = base["limits"]["critical_path"]
        shares = {c: v["share"] for c, v in cp.get("classes", {}).items()}
        resolved = sc.resolved()
        tasks, meta = [], {}
        speeds = (1 + factor, 1 - factor)
        for s in speeds:                          # the faster variants first: the cheaper runs
            for g, spec in groups.items():
                r, changes = scaled_profile(resolved, spec["keys"], s)
                i = len(tasks)
                sets_ = [f"{'' if k.startswith(_WORKLOAD) else 'machine.overrides.'}{k}={c['after']}"
                         for k, c in changes.items()]
                tasks.append({"index": i, "dir": str(Path(tmp) / f"v{i}"), "resolved": r, "sets": sets_,
                              "timeout_ps": None, "plots": False, "label": f"{g} x{s:g}"})
                meta[i] = (g, s, changes)
        results: dict = {}
        make_backend(backend, jobs, address).run(tasks, _Events(results, quiet))
    end = base["end_time_ps"]
    rows = {}
    for i, (g, s, changes) in meta.items():
        r = results.get(i, {})
        row = rows.setdefault(g, {"resource": g, "classes": groups[g]["classes"], "critical_share": round(
            sum(shares.get(c, 0.0) for c in groups[g]["classes"]), 4), "keys": {}, "variants": {}})
        tag = "faster" if s > 1 else "slower"
        share = row["critical_share"]
        ok = r.get("status") == "finished"
        measured, estimate = (round(r["end_time_ps"] / end - 1, 5) if ok else None), round(share * (1 / s - 1), 5)
        row["variants"][tag] = {
            "speed": s, "status": r.get("status"), "end_time_ps": r.get("end_time_ps"), "measured": measured,
            "estimate": estimate, "error": None if measured is None else round(measured - estimate, 5),
            "changes": changes}
        if not ok:
            row["variants"][tag]["error"] = r.get("error")
        row["keys"] = {k: c["speed"] for k, c in changes.items()}
    order = sorted(rows.values(), key=lambda r: (-(abs(r["variants"].get("faster", {}).get("measured") or 0)),
                                                 r["resource"]))
    coverage = knob_coverage(all_groups, sc.family, shares)
    coverage["partial"] = {c: v for c, v in coverage["partial"].items() if c in rows}
    for r in order:
        r["own_knob"] = "part" if r["resource"] in coverage["partial"] else "all"
    return {"scenario": sc.name, "end_time_ps": end, "factor": factor, "backend": backend,
            "critical_path": shares, "rows": order, "coverage": coverage, "largest_error": largest_error(order)}


def largest_error(rows: list) -> dict | None:
    """The measured variant whose one-run estimate is furthest off: ``{"resource", "variant", "error",
    "measured", "estimate"}`` (fractions of the end time); None if no variant was measured."""
    errs = [(abs(v["error"]), r["resource"], tag, v) for r in rows for tag, v in r["variants"].items()
            if v.get("error") is not None]
    if not errs:
        return None
    _, res, tag, v = max(errs, key=lambda e: (e[0], e[1], e[2]))
    return {"resource": res, "variant": tag, "error": v["error"], "measured": v["measured"], "estimate": v["estimate"]}


def format_whatif(w: dict) -> str:
    f = w["factor"]
    out = [f"what if each resource were {100 * f:g} % faster / slower: {w['scenario']}, baseline end "
           f"{format_time(w['end_time_ps'])}",
           f"  {'resource':<16} {'path share':>10} {'faster: measured':>17} {'estimate':>9} {'error':>8} "
           f"{'slower: measured':>17} {'estimate':>9} {'error':>8}  keys (actual speed factor when faster)"]

    def pct(x):
        return "  failed" if x is None else f"{100 * x:+8.2f}%" if abs(x) >= 5e-5 else "    0.00%"

    def pts(x):   # measured - estimate, in points of the end time
        return "" if x is None else f"{100 * x:+.2f}pt" if abs(x) >= 5e-5 else "0.00pt"

    for r in w["rows"]:
        fa, sl = r["variants"].get("faster", {}), r["variants"].get("slower", {})
        keys = ", ".join(f"{k} x{c['speed']}" for k, c in fa.get("changes", {}).items())
        name = r["resource"] + (" *" if r.get("own_knob") == "part" else "")
        out.append(f"  {name:<16} {100 * r['critical_share']:9.1f}% {pct(fa.get('measured')):>17} "
                   f"{pct(fa.get('estimate')):>9} {pts(fa.get('error')):>8} {pct(sl.get('measured')):>17} "
                   f"{pct(sl.get('estimate')):>9} {pts(sl.get('error')):>8}  {keys}")
    big = w.get("largest_error")
    if big:
        out.append(f"  largest estimate error: {pts(big['error'])} of the end time, {big['resource']} {big['variant']}"
                   f" (measured {pct(big['measured']).strip()}, estimated {pct(big['estimate']).strip()})")
    out.extend(coverage_lines(w.get("coverage") or {}))
    return "\n".join(out)


def _clock_text(clock, others) -> str:
    if clock is None:
        return "no knob reaches it"
    return f"the {clock} row speeds it" + (f" (with {', '.join(others)})" if others else " (the clock is its own)")


def coverage_lines(cov: dict) -> list[str]:
    """The notes under the table: the rows marked ``*`` and the classes on the path without a row of their own."""
    out = []
    partial, none = cov.get("partial") or {}, cov.get("none") or {}
    if partial:
        out.append("  * no exclusive speed knob for its main cost: the row scales only its own keys, the estimate "
                   "assumes they are all of the class's time")
        for cls, p in partial.items():
            own = ", ".join(p["own_keys"]) or "none"
            out.append(f"    {cls}: {p['what']} (counts, not scaled) at {p['clock'] or 'a shared clock'}; "
                       f"its own keys: {own}; {_clock_text(p['clock'], p['shared_with'])}")
    if none:
        out.append("  on the critical path without a row of their own: " + "; ".join(
            f"{cls} {100 * v['share']:.1f}% ({_clock_text(v['clock'], v['shared_with'])})" for cls, v in none.items()))
    return out


def plot_whatif(w: dict, path: str) -> None:
    """A tornado chart: per resource the measured change faster (left) and slower (right), the estimate as ticks."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(reversed(w["rows"]))
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.5))
    y = range(len(rows))
    for tag, color in (("faster", "tab:green"), ("slower", "tab:red")):
        m = [100 * (r["variants"].get(tag, {}).get("measured") or 0) for r in rows]
        e = [100 * (r["variants"].get(tag, {}).get("estimate") or 0) for r in rows]
        ax.barh(list(y), m, color=color, alpha=0.6, label=f"{100 * w['factor']:g} % {tag}: measured")
        ax.scatter(e, list(y), marker="|", s=200, color="k")
    ax.set_yticks(list(y))
    ax.set_yticklabels([r["resource"] for r in rows])
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel("end-to-end change (%)  (| = one-run critical-path estimate)")
    ax.set_title(f"emu whatif {w['scenario']}")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_parser(sub) -> None:
    from tools.sweep.backends import add_backend_arguments
    p = sub.add_parser("whatif", help="scale each resource's speed, run the variants, compare with the one-run estimate")
    p.add_argument("scenario", help="the scenario file")
    from tools.cli_help import add_set_argument
    add_set_argument(p)
    p.add_argument("--factor", type=float, default=0.1, help="speed change (default 0.1: 10 %% faster and slower)")
    p.add_argument("--only", action="append", default=[], metavar="RESOURCE",
                   help="only this resource (repeatable); default: every resource")
    p.add_argument("--list", action="store_true", help="list the resources and the profile keys each scales; run nothing")
    add_backend_arguments(p, "variants", "a Ray cluster to join (--backend ray); default: a local Ray of its own")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.add_argument("--plot", metavar="PNG", help="write a tornado chart to PNG; default: no chart")
    add_allow_path_argument(p)
    p.set_defaults(func=main)


def main(args) -> int:
    if not 0 < args.factor < 1:
        raise ValueError(f"emu whatif --factor: expected a number in (0, 1), found {args.factor}")
    if args.list:
        from actors import registry
        from emulator.scenario import load_scenario, scenario_path
        from tools.run.runner import build_system

        sc = load_scenario(str(scenario_path(args.scenario)), registry, list(args.set), allow=args.allow_path)
        system, _ = build_system(sc)
        groups = knob_groups(system, sc)
        partial = knob_coverage(groups, sc.family, {})["partial"]
        for g, spec in groups.items():
            extra = f" (drives {', '.join(spec['classes'])})" if spec["classes"] != [g] else ""
            print(f"{g}{' *' if g in partial else ''}{extra}: {', '.join(f'{k} [{u}]' for k, u in spec['keys'].items())}")
        for line in coverage_lines({"partial": partial}):
            print(line[2:])
        return 0
    w = run_whatif(args.scenario, args.set, factor=args.factor, only=args.only or None, backend=args.backend,
                   jobs=args.jobs, address=args.address, quiet=args.json or not sys.stderr.isatty(),
                   allow=args.allow_path)
    if args.plot:
        plot_whatif(w, args.plot)
    if args.json:
        print(json.dumps(w, indent=1, default=str))
    else:
        print(format_whatif(w))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0 if all(v.get("measured") is not None for r in w["rows"] for v in r["variants"].values()) else 1
