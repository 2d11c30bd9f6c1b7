"""``emu interval SCENARIO``: the spread of a run's results implied by its profile's declared uncertainty.

**What is sampled.**  Every parameter the machine profile declares uncertain (its ``uncertainty:`` map,
emulator/uncertainty.py) that the scenario does not pin (``machine.overrides``, ``--set``,
``interval: {pin: [...]}``).  Each is drawn uniformly in its declared ``[low, high]`` -- a declared
range says "somewhere in here", not a most likely value, so no shape is invented -- by a Latin
hypercube: ``N`` samples, each parameter's range cut into ``N`` equal strata, one draw per stratum, the
strata shuffled independently per parameter (McKay et al. 1979), so every range is covered evenly
even for small ``N``.  The draws come from ``numpy.random.default_rng(SeedSequence(seed))``: the same
seed gives the same samples wherever they run.  Integer parameters (cycle counts, and quantities,
which the engine holds as integers: ps, fJ, uW) are rounded.

**How.**  Each sample is one full run of the scenario with the sampled values written into its
resolved profile (as ``emu whatif`` does, tools/explain/whatif.py), on the sweep backends
(tools/sweep/backends.py: the process pool or Ray), plus the default run.  Every run is deterministic,
so the table does not depend on the backend or the order the runs finish.

**What is reported.**  For each metric the workload reports among the end time, latency,
throughput, tokens per joule and energy: p5 / p50 / p95 over the finished samples (numpy's linear
interpolation), the default run's value and whether it lies in [p5, p95] (it need not: a value at
the edge of a skewed spread is reported as outside, not hidden).

**Converged** when, for every metric, p5, p50 and p95 of the first half of the samples lie within
:data:`CONVERGED` (10 %) of the full width (p95 - p5) of those of all samples (a zero width: when
they are equal).  A "no" says: more samples would move the interval; run with a larger ``--samples``.

**Drivers.**  For each parameter and metric the Spearman rank correlation rho over the samples
(ranks by numpy argsort, ties averaged), and per metric the variance share rho^2 / sum(rho^2): with
independent inputs and a near-monotone response, rho^2 approximates the part of the metric's (rank)
variance each parameter explains.  Rows are ordered by their largest share.  With few samples and many
parameters, independent columns correlate by chance: a |rho| below 2/sqrt(n-1) (two standard errors under
no association, :func:`noise_level`) is marked ``~``.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from emulator.input_paths import add_allow_path_argument
from emulator.uncertainty import with_values
from emulator.units import format_quantity, format_time
from tools.sweep.results import metric_value

__all__ = ["explain_uncertainty", "latin_hypercube", "sample_values", "spearman", "run_interval", "format_interval", "add_parser", "main",
           "METRICS", "CONVERGED"]

#: (label, result.json metric names tried in turn, unit for printing)
METRICS = (
    ("end time", ("end_time_ps",), "time"),
    ("latency", ("latency_ps",), "time"),
    ("throughput", ("tokens_per_s", "tok_per_s"), "tok/s"),
    ("tokens/J", ("tokens_per_j",), "tok/J"),
    ("energy", ("energy_j",), "J"),
)
#: the convergence rule: first-half percentiles within this fraction of the full width of all samples'
CONVERGED = 0.10
PERCENTILES = (5, 50, 95)


def latin_hypercube(n: int, d: int, seed: int) -> np.ndarray:
    """``n`` points in ``[0, 1)^d``: per dimension one uniform draw in each of ``n`` strata, strata shuffled."""
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    u = (np.arange(n)[:, None] + rng.random((n, d))) / n
    for j in range(d):
        u[:, j] = u[rng.permutation(n), j]
    return u


def sample_values(declared: list, n: int, seed: int) -> list[dict]:
    """``n`` dicts ``{key: value}``: the Latin hypercube mapped onto each declared range (integers rounded)."""
    u = latin_hypercube(n, len(declared), seed)
    out = []
    for row in u:
        values = {}
        for x, d in zip(row, declared):
            v = d.low + x * (d.high - d.low)
            values[d.key] = int(round(v)) if d.integer else float(v)
        out.append(values)
    return out


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1, ties given their average rank (Spearman's convention)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    for v in np.unique(x):
        tie = x == v
        if tie.sum() > 1:
            ranks[tie] = ranks[tie].mean()
    return ranks


def spearman(x, y) -> float | None:
    """Spearman's rank correlation of two samples; None when either is constant (no ranking)."""
    rx, ry = _ranks(np.asarray(x, float)), _ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def noise_level(n: int) -> float:
    """The |rho| that independent inputs reach by chance about 1 time in 20: two standard errors,
    2 / sqrt(n - 1), of Spearman's rho under no association."""
    return 2 / max(1, n - 1) ** 0.5


def _metric(result: dict, names) -> float | None:
    for name in names:
        v = metric_value(result, name)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def interval_point(task: dict) -> dict:
    """One run (a sweep point in a temporary folder), returning its result.json only (no bundle files)."""
    from tools.sweep.point import run_point

    with tempfile.TemporaryDirectory(prefix="emu-interval-") as tmp:
        res = run_point(task, tmp)["result"]
    return {"result": {k: v for k, v in res.items() if k not in ("tables", "reports")} | {
        "reports": res.get("reports") or {}}}


class _Collect:
    def __init__(self, quiet: bool, total: int):
        self.out, self.quiet, self.total = {}, quiet, total

    def running(self, n: int) -> None:
        pass

    def done(self, task: dict, record: dict) -> None:
        self.out[task["index"]] = record.get("result", {})
        if not self.quiet:
            print(f"  run {len(self.out)}/{self.total}: {task['label']} {self.out[task['index']].get('status')}",
                  file=sys.stderr)


def _backend(name: str, jobs, address):
    from tools.sweep.backends import make_backend
    return make_backend(name, jobs, address, work=interval_point, preload=("tools.explain.interval",))


def _summary(values: list[float]) -> dict:
    a = np.asarray(values, float)
    return dict(zip(("p5", "p50", "p95"), (float(v) for v in np.percentile(a, PERCENTILES))))


def _converged(values: list[float]) -> tuple[bool, float]:
    """(converged, largest shift of a percentile between the first half and all samples, as a fraction of
    the width)."""
    full, half = _summary(values), _summary(values[: max(1, len(values) // 2)])
    width = full["p95"] - full["p5"]
    shift = max(abs(full[p] - half[p]) for p in full)
    if width == 0:
        return shift == 0, 0.0 if shift == 0 else float("inf")
    return shift <= CONVERGED * width, shift / width


def run_interval(path: str, sets=(), *, samples: int = 32, seed: int = 0, backend: str = "pool", jobs=None,
                 address=None, quiet: bool = True, allow=()) -> dict:
    """The default run and ``samples`` runs over the declared ranges; the percentiles, convergence, drivers."""
    from actors import registry
    from emulator.scenario import load_scenario, scenario_path

    if samples < 2:
        raise ValueError(f"emu interval --samples: expected at least 2, found {samples}")
    sc = load_scenario(str(scenario_path(path)), registry, list(sets), allow=allow)
    declared = [d for d in sc.uncertainty.values() if not d.pinned]
    pinned = [d.key for d in sc.uncertainty.values() if d.pinned]
    if not declared:
        raise ValueError(f"{path}: no uncertain parameter to sample: the profile {sc.profile_name} declares "
                         + ("none (its uncertainty: map, docs/interval.md)" if not pinned else
                            f"only pinned ones ({', '.join(pinned)})"))
    draws = sample_values(declared, samples, seed)
    resolved = sc.resolved()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="emu-interval-") as tmp:
        tasks = [{"index": 0, "dir": str(Path(tmp) / "default"), "resolved": resolved, "sets": [], "timeout_ps": None,
                  "plots": False, "label": "default"}]
        for i, values in enumerate(draws, 1):
            tasks.append({"index": i, "dir": str(Path(tmp) / f"s{i}"), "resolved": with_values(resolved, values),
                          "sets": [f"machine.overrides.{k}={v}" for k, v in values.items()], "timeout_ps": None,
                          "plots": False, "label": f"sample {i}"})
        events = _Collect(quiet, len(tasks))
        _backend(backend, jobs, address).run(tasks, events)
    wall = time.perf_counter() - t0
    base = events.out.get(0, {})
    if base.get("status") != "finished":
        raise ValueError(f"{path}: the default run ended {base.get('status')}: {base.get('error', '')}")
    ok = [i for i in range(1, samples + 1) if events.out.get(i, {}).get("status") == "finished"]
    failed = {i: f"{events.out.get(i, {}).get('status')}: {events.out.get(i, {}).get('error', '')}"
              for i in range(1, samples + 1) if i not in ok}
    metrics = {}
    for label, names, unit in METRICS:
        default = _metric(base, names)
        if default is None:
            continue
        vals = [_metric(events.out[i], names) for i in ok]
        if not vals or any(v is None for v in vals):
            continue
        if label != "end time" and "end time" in metrics and default == metrics["end time"]["default"] \
                and vals == metrics["end time"]["values"]:
            continue       # a latency that is the end time (one request, one kernel) says nothing more
        s = _summary(vals)
        conv, shift = _converged(vals)
        metrics[label] = {"unit": unit, **s, "default": default, "inside": s["p5"] <= default <= s["p95"],
                          "converged": conv, "shift": shift, "values": vals}
    drivers = []
    for d in declared:
        x = [draws[i - 1][d.key] for i in ok]
        rho = {m: spearman(x, v["values"]) for m, v in metrics.items()}
        drivers.append({"key": d.key, "low": d.low, "high": d.high, "kind": d.kind, "rho": rho})
    for m in metrics:
        total = sum((r["rho"][m] or 0.0) ** 2 for r in drivers)
        for r in drivers:
            r.setdefault("share", {})[m] = ((r["rho"][m] or 0.0) ** 2 / total) if total else 0.0
    drivers.sort(key=lambda r: (-max(r["share"].values(), default=0.0), r["key"]))
    return {"scenario": sc.name, "file": str(path), "seed": seed, "samples": samples, "finished": len(ok),
            "failed": failed, "backend": backend, "wall_s": round(wall, 2), "pinned": pinned,
            "parameters": [{"key": d.key, "low": d.low, "high": d.high, "kind": d.kind, "where": d.where,
                            "reason": d.reason} for d in declared],
            "converged": bool(metrics) and all(v["converged"] for v in metrics.values()),
            "metrics": metrics, "drivers": drivers, "draws": draws}


def _fmt(v: float, unit: str) -> str:
    if unit == "time":
        return format_time(int(round(v)))
    if unit != "J":
        return f"{v:,.0f} {unit}" if abs(v) >= 1000 else f"{v:.4g} {unit}"
    name, factor = next(((n, f) for n, f in (("J", 1), ("mJ", 1e-3), ("uJ", 1e-6), ("nJ", 1e-9)) if abs(v) >= f),
                        ("pJ", 1e-12))
    return f"{v / factor:.4g} {name}"


def _fmt_range(r: dict) -> str:
    if r["kind"]:
        return f"[{format_quantity(int(r['low']), r['kind'])}, {format_quantity(int(r['high']), r['kind'])}]"
    return f"[{r['low']:g}, {r['high']:g}]"


def explain_uncertainty(sc) -> list[str]:
    """``emu explain``'s block: each declared range beside its value, where it is declared and why."""
    if not sc.uncertainty:
        return []
    out = ["declared uncertainty (docs/interval.md; emu interval samples the unpinned ranges):"]
    for d in sc.uncertainty.values():
        r = {"low": d.low, "high": d.high, "kind": d.kind}
        value = format_quantity(int(d.value), d.kind) if d.kind else f"{d.value:g}"
        out.append(f"  {d.key}: {value} in {_fmt_range(r)}{' (pinned by the scenario)' if d.pinned else ''}"
                   f" -- {Path(d.file).name}:{d.line}: {d.reason}")
    return out


def format_interval(w: dict, top: int = 8) -> str:
    from tools.table import format_table

    out = [f"emu interval {w['scenario']}: {w['finished']} of {w['samples']} samples finished (Latin hypercube, "
           f"seed {w['seed']}, {len(w['parameters'])} uncertain parameters"
           + (f"; pinned: {', '.join(w['pinned'])}" if w["pinned"] else "") + ")"]
    rows = [{"metric": m, "p5": _fmt(v["p5"], v["unit"]), "p50": _fmt(v["p50"], v["unit"]),
             "p95": _fmt(v["p95"], v["unit"]), "default": _fmt(v["default"], v["unit"]),
             "in [p5, p95]": "yes" if v["inside"] else "NO", "converged": "yes" if v["converged"] else "no"}
            for m, v in w["metrics"].items()]
    out.append(format_table(f"percentiles over the {w['finished']} finished samples:", rows))
    out.append(f"converged: {'yes' if w['converged'] else 'no'} (each metric's p5/p50/p95 of the first half of the "
               f"samples within {100 * CONVERGED:g} % of the width p95-p5 of all)")
    for i, err in w["failed"].items():
        out.append(f"  sample {i} failed: {err}")
    names = list(w["metrics"])
    chance = noise_level(w["finished"])
    drows = []
    for r in w["drivers"][:top]:
        row = {"parameter": r["key"], "range": _fmt_range(r)}
        for m in names:
            rho = r["rho"][m]
            row[f"{m} rho (share)"] = "-" if rho is None else \
                f"{rho:+.2f} ({100 * r['share'][m]:.0f}%){'~' if abs(rho) < chance else ''}"
        drows.append(row)
    out.append(format_table(f"drivers, top {len(drows)} of {len(w['drivers'])} (Spearman rank correlation rho over "
                            "the samples; share = rho^2 normalised per metric):", drows))
    out.append(f"~: |rho| < 2/sqrt(n-1) = {chance:.2f} for n = {w['finished']} samples, not told apart from chance "
               "(more samples narrow it)")
    return "\n".join(out)


def add_parser(sub) -> None:
    from tools.sweep.backends import add_backend_arguments
    p = sub.add_parser("interval", help="sample the profile's declared parameter ranges: p5/p50/p95 of the results "
                                        "and which parameters drive them (docs/interval.md)")
    p.add_argument("scenario", help="the scenario file")
    from tools.cli_help import add_set_argument
    add_set_argument(p)
    p.add_argument("--samples", type=int, default=32, help="runs over the declared ranges (default 32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the Latin hypercube (default 0)")
    p.add_argument("--top", type=int, default=8, help="driver rows shown (default 8)")
    add_backend_arguments(p, "samples")
    p.add_argument("--json", action="store_true", help="print the samples, percentiles and drivers as JSON")
    add_allow_path_argument(p)
    p.set_defaults(func=main)


def main(args) -> int:
    if args.seed < 0:
        raise ValueError(f"emu interval --seed: expected an integer >= 0, found {args.seed}")
    w = run_interval(args.scenario, args.set, samples=args.samples, seed=args.seed, backend=args.backend,
                     jobs=args.jobs, address=args.address, quiet=args.json or not sys.stderr.isatty(),
                     allow=args.allow_path)
    if args.json:
        print(json.dumps(w, indent=1, default=str))
    else:
        print(format_interval(w, args.top))
    return 0 if not w["failed"] else 1
