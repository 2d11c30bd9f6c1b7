"""``emu calibrate CSV --fit KEY ...``: fit declared machine parameters to observed figures, with held-out error.

**The calibration file** is a CSV (``#`` lines are comments, blank lines are skipped) with the header
``scenario,metric,value,unit,source`` and an optional ``split`` column (``fit`` or ``holdout``):

* ``scenario``: a scenario file, relative to the CSV's folder, confined like every input
  (emulator/input_paths.py: the CSV's folder, the shipped ``scenarios/``, ``--allow-path``);
* ``metric``: what to read from that scenario's run: a result.json key path as the sweep reads it
  (``end_time_ps``, ``energy.avg_power_w``, ``avg_power_w``, a workload report's key:
  tools/sweep/results.py ``metric_value``), or ``bench:NAME``, the ``measured_ns`` of the row ``NAME`` of a
  microbenchmark table (actors/ahbm/microbench.py prints them);
* ``value`` and ``unit``: the observed figure, parsed exactly by the project's quantity parser
  (emulator/units.py) as the metric's kind: a time for ``bench:`` and ``*_ps``/``*_ns``/``*_s`` keys, a
  power for ``*_w``, an energy for ``*_j``; ``tok/s`` for ``tokens_per_s``, ``tok/J`` for ``tokens_per_j``;
  no unit for any other key;
* ``source``: where the figure comes from (required: a figure without a source cannot be judged);
* ``split``: ``fit`` rows are fitted, ``holdout`` rows only reported.  Without the column the tool draws a
  seeded split (a third of the rows held out, ``numpy.random.SeedSequence(--seed)``) and prints it.  Both
  kinds must be present: the error that counts is the held-out one, never the fitted rows' alone.

**Parameters.**  ``--fit KEY`` fits a numeric parameter of the scenarios' machine profile within its
declared range (the profile's ``uncertainty:`` map, emulator/uncertainty.py); ``--fit KEY=LOW,HIGH``
gives the bounds (written like the value: ``20ns,40ns``), needed for a key the profile does not declare.
Every scenario of the file must run the same profile (``--profile NAME`` runs them all on NAME), and none
may set a fitted key itself (``machine.overrides``).

**Method.**  Each evaluation runs every scenario once with the parameter values written into its resolved
profile (as ``emu interval`` does), on the sweep backends (process pool or Ray); runs are deterministic,
and each distinct set of values runs once (cached).  First the default, then each parameter alone at both
ends of its range: a parameter that changes no fitted row there has zero sensitivity over its range, and
is refused (a fit cannot place it).  The fit minimises the sum of squared log ratios
``ln(model / observed)`` over the fitted rows (relative error, symmetric in over- and under-estimate) with
``scipy.optimize.least_squares`` (trust-region reflective, bounded), in coordinates scaled to ``[0, 1]``
over each range, with a Jacobian of forward differences run as one batch (a step of 1 % of the range, or
one unit for integers: cycle counts and the engine's integer quantities, ps, fJ, uW, which are rounded).
Integer cycle counts are then polished by trying one unit either side.  Same input, same result: the
optimiser is deterministic and so is every run.

**Output.**  The table of rows (observed, before, after, relative error before and after, split), the
mean and max absolute relative error of the fitted and the held-out rows before and after, the fitted
values, and the calibrated profile (``--out``): ``extends:`` the original, sets each fitted value, with its
provenance in comments (the CSV, the rows fitted and held out, the errors, the tool's version; no date, so
the file is the same on every run).  The written profile is loaded back with the first scenario.
"""
from __future__ import annotations

import csv
import difflib
import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

from emulator.input_paths import add_allow_path_argument, confined_file, input_roots
from emulator.schema import Doc, Int, Float, Problem, Quantity, SchemaError, _Ctx, load_yaml
from emulator.uncertainty import with_values
from emulator.units import KINDS, UnitError, format_quantity, parse_quantity
from tools.sweep.results import metric_value

__all__ = ["Row", "FitParam", "read_calibration", "resolve_params", "run_calibration", "format_calibration",
           "write_profile", "add_parser", "main", "HOLDOUT_FRACTION", "STEP"]

COLUMNS = ("scenario", "metric", "value", "unit", "source")
SPLITS = ("fit", "holdout")
#: the share of rows a seeded split holds out (when the file has no split column)
HOLDOUT_FRACTION = 1 / 3
#: the forward-difference step, as a fraction of a parameter's range (at least one unit for integers)
STEP = 0.01
BENCH = "bench:"
#: the plain-number units of rate metrics: metric key -> its unit
RATES = {"tokens_per_s": "tok/s", "tok_per_s": "tok/s", "tokens_per_j": "tok/J"}
#: the engine unit of each quantity kind, written after an exact value that has no shorter form
BASE_UNIT = {"time": "ps", "frequency": "Hz", "size": "B", "bandwidth": "B/s", "energy": "fJ",
             "energy_per_bit": "fJ/bit", "power": "uW"}


@dataclass
class Row:
    """One observed figure: its CSV line, scenario, metric and value (in engine units of its kind)."""
    line: int
    scenario: str           # as written
    path: str               # resolved
    metric: str
    kind: str | None        # a quantity kind, or None (a plain number / a rate)
    unit: str
    observed: float         # engine units (ps, uW, fJ, ...) or the plain number
    value_text: str
    source: str
    split: str = "fit"

    @property
    def scale(self) -> float:
        """Engine units per one of the row's own unit (to print the model's values in the CSV's unit)."""
        return float(KINDS[self.kind][self.unit]) if self.kind else 1.0


@dataclass
class FitParam:
    """A parameter to fit: its key, profile value, bounds, and where the bounds come from."""
    key: str
    value: int | float
    low: int | float
    high: int | float
    integer: bool
    kind: str | None
    where: str               # "file:line" of the uncertainty entry, or "--fit"
    reason: str = ""

    def at(self, u: float):
        """The value at ``u`` in [0, 1] of the range (rounded for integers)."""
        v = self.low + min(1.0, max(0.0, u)) * (self.high - self.low)
        return int(round(v)) if self.integer else float(f"{v:.6g}")     # 6 digits: the value written is the one run

    def u_of(self, v) -> float:
        return min(1.0, max(0.0, (v - self.low) / (self.high - self.low)))

    def show(self, v) -> str:
        return format_quantity(int(v), self.kind) if self.kind else (f"{v:d}" if self.integer else f"{v:.6g}")


def _metric_kind(metric: str) -> tuple[str | None, str | None]:
    """``(quantity kind or None, the unit a non-quantity metric is written in)`` of a metric name."""
    name = metric[len(BENCH):] if metric.startswith(BENCH) else metric.rsplit(".", 1)[-1]
    if metric.startswith(BENCH) or name.endswith(("_ps", "_ns", "_s")):
        return "time", None
    if name.endswith("_w"):
        return "power", None
    if name.endswith("_j"):
        return "energy", None
    return None, RATES.get(name, "")


def _model_value(result: dict, row: Row) -> float | None:
    """The row's metric in the run's result, in the engine units of its kind; None when it has none."""
    m = row.metric
    if m.startswith(BENCH):
        name = m[len(BENCH):]
        for table in (result.get("tables") or {}).values():
            for r in table if isinstance(table, list) else ():
                if isinstance(r, dict) and r.get("bench") == name and isinstance(r.get("measured_ns"), (int, float)):
                    return float(r["measured_ns"]) * 1000
        return None
    v = metric_value(result, m)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    leaf = m.rsplit(".", 1)[-1]
    factor = {"_ps": 1, "_ns": 1e3, "_s": 1e12, "_w": 1e6, "_j": 1e15}
    for end, f in factor.items():
        if leaf.endswith(end) and row.kind is not None:
            return float(v) * f
    return float(v)


def _known_metrics(result: dict) -> list[str]:
    """The metric names a result offers (for 'did you mean')."""
    out = [f"{BENCH}{r['bench']}" for t in (result.get("tables") or {}).values() if isinstance(t, list)
           for r in t if isinstance(r, dict) and "bench" in r]

    def walk(node, prefix):
        for k, v in node.items():
            if isinstance(v, dict) and k not in ("tables",):
                walk(v, f"{prefix}{k}.")
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append(prefix + k)
    walk(result, "")
    return out


# ------------------------------------------------------------------ the calibration file
def read_calibration(path, *, allow=(), seed: int = 0) -> tuple[list[Row], str]:
    """The rows of a calibration CSV and how they were split (``"file"`` or the seeded split's description);
    a :class:`SchemaError` listing every wrong line."""
    file = str(path)
    if not os.path.isfile(file):
        raise SchemaError([Problem(file, None, "", "an existing calibration CSV file", "no such file")])
    text = Path(file).read_text(encoding="utf-8")
    lines = [(i, l) for i, l in enumerate(text.splitlines(), 1) if l.strip() and not l.lstrip().startswith("#")]
    problems: list[Problem] = []
    if not lines:
        raise SchemaError([Problem(file, None, "", "a header line scenario,metric,value,unit,source[,split]",
                                   "an empty file")])
    head_line, head = lines[0][0], [c.strip() for c in next(csv.reader([lines[0][1]]))]
    missing = [c for c in COLUMNS if c not in head]
    extra = [c for c in head if c not in COLUMNS + ("split",)]
    if missing or extra:
        raise SchemaError([Problem(file, head_line, "header", "the columns scenario,metric,value,unit,source "
                                   "and optionally split", ",".join(head),
                                   "; ".join(x for x in (f"missing {', '.join(missing)}" if missing else "",
                                                         f"unknown {', '.join(extra)}" if extra else "") if x))])
    folder = Path(file).resolve().parent
    roots = input_roots(folder, allow=allow, own="the calibration file's folder")
    rows: list[Row] = []
    has_split = "split" in head
    for line, raw in lines[1:]:
        cells = [c.strip() for c in next(csv.reader([raw]))]
        if len(cells) != len(head):
            problems.append(Problem(file, line, "row", f"{len(head)} cells ({','.join(head)})",
                                    f"{len(cells)} cells"))
            continue
        cell = dict(zip(head, cells))
        bad = len(problems)
        scen = cell["scenario"]
        resolved = None
        if not scen:
            problems.append(Problem(file, line, "scenario", "a scenario file (relative to the CSV's folder)", "nothing"))
        else:
            try:
                resolved = confined_file([folder / scen], "scenario", scen, roots, (file, line))
            except SchemaError as e:
                problems.extend(e.problems)
                resolved = False
            if resolved is None:
                problems.append(Problem(file, line, "scenario", "a scenario file (relative to the CSV's folder "
                                        f"{folder})", repr(scen), "no such file"))
        metric = cell["metric"]
        if not metric:
            problems.append(Problem(file, line, "metric", "a result key path or bench:NAME", "nothing"))
        kind, plain_unit = _metric_kind(metric)
        observed = None
        value, unit = cell["value"], cell["unit"]
        try:
            number = Fraction(value)
        except (ValueError, ZeroDivisionError):
            number = None
            problems.append(Problem(file, line, "value", "a number (its unit in the unit column)", repr(value)))
        if number is not None:
            if kind is not None:
                try:
                    observed = float(Fraction(parse_quantity(f"{value}{unit}", kind)))
                except UnitError as e:
                    if unit and unit in KINDS[kind]:       # right unit, not a whole number of engine units
                        observed = float(number * KINDS[kind][unit])
                    else:
                        problems.append(Problem(file, line, "unit", f"a {kind} unit for metric {metric!r} "
                                                f"({', '.join(KINDS[kind])})", repr(unit), str(e)))
            elif unit != plain_unit:
                problems.append(Problem(file, line, "unit", f"{plain_unit!r} for metric {metric!r}" if plain_unit
                                        else f"no unit for metric {metric!r} (a plain number)", repr(unit)))
            else:
                observed = float(number)
            if observed is not None and observed <= 0:
                problems.append(Problem(file, line, "value", "a positive figure (the fit compares log ratios)",
                                        repr(value)))
        if not cell["source"]:
            problems.append(Problem(file, line, "source", "where the figure comes from", "nothing"))
        split = cell.get("split", "fit") if has_split else "fit"
        if has_split and split not in SPLITS:
            problems.append(Problem(file, line, "split", "fit or holdout", repr(split)))
        if len(problems) == bad:
            rows.append(Row(line, scen, str(resolved), metric, kind, unit if kind else plain_unit, observed,
                            value, cell["source"], split))
    if problems:
        raise SchemaError(problems)
    if not rows:
        raise SchemaError([Problem(file, head_line, "rows", "at least two rows (one fitted, one held out)",
                                   "none")])
    how = "the file's split column"
    if not has_split:
        n_hold = max(1, round(len(rows) * HOLDOUT_FRACTION))
        rng = np.random.default_rng(np.random.SeedSequence(seed))
        hold = sorted(int(i) for i in rng.permutation(len(rows))[:n_hold])
        for i in hold:
            rows[i].split = "holdout"
        how = (f"a seeded split (no split column): {n_hold} of {len(rows)} rows held out, seed {seed}: lines "
               + ", ".join(str(rows[i].line) for i in hold))
    for s in SPLITS:
        if not any(r.split == s for r in rows):
            raise SchemaError([Problem(file, head_line, "split", "at least one fit row and one holdout row (the "
                                       "error is reported on held-out rows, never on the fitted ones alone)",
                                       f"no {s} row")])
    return rows, how


# ------------------------------------------------------------------ the parameters
def _parse_fit(spec: str) -> tuple[str, list[str] | None]:
    key, eq, bounds = spec.partition("=")
    key = key.strip()
    if not eq:
        return key, None
    parts = [p.strip() for p in bounds.strip().strip("[]").split(",")]
    return key, parts


def resolve_params(specs: list[str], sc, family_schema) -> list[FitParam]:
    """The :class:`FitParam` of each ``--fit`` spec against the scenario ``sc`` (its profile and declared
    ranges); a :class:`SchemaError` listing every wrong one."""
    from emulator.declare import schema_spec, value_at
    from emulator.uncertainty import leaf_paths

    problems, out = [], []
    seen = set()
    for spec in specs:
        key, bounds = _parse_fit(spec)
        path = key
        if key in seen:
            problems.append(Problem("--fit", None, path, "each parameter once", "it twice"))
            continue
        seen.add(key)
        node = schema_spec(family_schema, key)
        value = value_at(sc.profile, key)
        if node is None or not isinstance(node, (Int, Float, Quantity)) or not isinstance(value, (int, float)) \
                or isinstance(value, bool):
            close = difflib.get_close_matches(key, leaf_paths(sc.profile), n=1)
            problems.append(Problem("--fit", None, path, f"the key path of a numeric parameter of profile "
                                    f"{sc.profile_name}", repr(key),
                                    f"did you mean {close[0]!r}?" if close else "emu explain lists them"))
            continue
        kind = getattr(node, "kind", None) if isinstance(node, Quantity) else None
        declared = sc.uncertainty.get(key)
        if bounds is not None:
            if len(bounds) != 2:
                problems.append(Problem("--fit", None, path, "KEY=LOW,HIGH (two bounds in the parameter's unit)",
                                        repr(spec)))
                continue
            doc = Doc({"fit": {key: bounds}}, {}, "--fit")
            ctx = _Ctx(doc)
            try:
                vals = [node.check(load_yaml(b, "--fit").value, ("fit", key, i), ctx) for i, b in enumerate(bounds)]
            except SchemaError as e:
                problems.extend(e.problems)
                continue
            if ctx.problems:
                for p in ctx.problems:
                    p.file, p.line, p.path = "--fit", None, f"{path} bound {p.path.rsplit('.', 1)[-1]}"
                problems.extend(ctx.problems)
                continue
            low, high = vals
            where, reason = "--fit", "given on the command line"
        elif declared is not None:
            low, high, where, reason = declared.low, declared.high, _where(declared), declared.reason
        else:
            problems.append(Problem("--fit", None, path, "a range to fit in: declared in the profile's "
                                    f"uncertainty: map ({_shown_file(sc.profile_file)}) or given as --fit {key}=LOW,HIGH",
                                    "no range (the profile does not declare this parameter uncertain)"))
            continue
        if not low < high:
            problems.append(Problem(where.rsplit(":", 1)[0] if ":" in where else where,
                                    int(where.rsplit(":", 1)[1]) if ":" in where and where.rsplit(":", 1)[1].isdigit()
                                    else None, path, "low < high",
                                    f"[{_show(low, kind)}, {_show(high, kind)}] (an inverted or empty range)"))
            continue
        out.append(FitParam(key, value, low, high, isinstance(value, int), kind, where, reason))
    if problems:
        raise SchemaError(problems)
    return out


def _shown_file(file) -> str:
    """A file as messages and written profiles name it: relative to the emulator's tree when it is a shipped
    one (so the text does not depend on where the emulator is installed), else resolved."""
    from emulator.input_paths import SHIPPED

    f = Path(file).resolve()
    return str(f.relative_to(SHIPPED.parent)) if f.is_relative_to(SHIPPED.parent) else str(f)


def _where(d) -> str:
    """``file:line`` of a declared range (:func:`_shown_file`)."""
    name = _shown_file(d.file)
    return f"{name}:{d.line}" if d.line else name


def _show(v, kind) -> str:
    return format_quantity(int(v), kind) if kind else f"{v:g}"


# ------------------------------------------------------------------ the runs
def calibrate_point(task: dict) -> dict:
    """One run of a resolved scenario (the sweep's runner, tools/run/runner.py), with no bundle and no trace:
    only its result.json dict (tables included) is read.  A failure of the run is its status."""
    import dataclasses

    from tools.run.runner import execute, plan_run, scenario_from_resolved

    try:
        sc = scenario_from_resolved(task["resolved"])
        sc.source = {"base": task["resolved"].get("file"), "set": task["sets"]}
        plan = dataclasses.replace(plan_run(sc, bundle=False, plots=False), trace=None, trace_requested=False)
        res = execute(plan).res
    except Exception as e:  # noqa: BLE001 -- a failed run is reported with the values it ran at
        res = {"status": "error", "error": f"{type(e).__name__}: {e}"}
    return {"result": res}


class _Collect:
    def __init__(self):
        self.out = {}

    def running(self, n: int) -> None:
        pass

    def done(self, task: dict, record: dict) -> None:
        self.out[task["index"]] = record.get("result", {})


def _backend(name: str, jobs, address, families=()):
    """The sweep backend running :func:`calibrate_point`; the pool's workers fork from a server that has
    imported the runner and the scenarios' machine families (``families``: module names) once."""
    from tools.sweep.backends import make_backend
    return make_backend(name, jobs, address, work=calibrate_point,
                        preload=("tools.explain.calibrate", "tools.run.runner", *families))


@dataclass
class _Evaluator:
    """Runs every scenario of the file at given parameter values, one batch per call; caches by values."""
    scenarios: dict                  # path -> resolved scenario
    rows: list
    backend: object
    quiet: bool = True
    cache: dict = field(default_factory=dict)
    runs: int = 0

    def __call__(self, points: list[dict]) -> list[dict]:
        """For each point ``{key: value}``: ``{"values": [model value per row], "results": {path: result}}``."""
        keys = [tuple(sorted(p.items())) for p in points]
        todo = list(dict.fromkeys(k for k in keys if k not in self.cache))
        if todo:
            tasks, index = [], {}
            with tempfile.TemporaryDirectory(prefix="emu-calibrate-") as tmp:
                for k in todo:
                    for path, resolved in self.scenarios.items():
                        i = len(tasks)
                        index[i] = (k, path)
                        tasks.append({"index": i, "dir": str(Path(tmp) / f"p{i}"),
                                      "resolved": with_values(resolved, dict(k)),
                                      "sets": [f"machine.overrides.{a}={b}" for a, b in k], "timeout_ps": None,
                                      "plots": False, "label": ", ".join(f"{a}={b}" for a, b in k) or "default"})
                events = _Collect()
                self.backend.run(tasks, events)
            self.runs += len(tasks)
            if not self.quiet:
                print(f"  calibrate: {len(tasks)} runs ({self.runs} so far)", file=sys.stderr)
            for k in todo:
                self.cache[k] = {"results": {}, "values": []}
            for i, (k, path) in index.items():
                self.cache[k]["results"][path] = events.out.get(i, {"status": "error", "error": "no result"})
            for k in todo:
                entry = self.cache[k]
                for path, res in entry["results"].items():
                    if res.get("status") != "finished":
                        raise ValueError(f"{path}: the run at {dict(k) or 'the default values'} ended "
                                         f"{res.get('status')}: {res.get('error', '')}")
                entry["values"] = [_model_value(entry["results"][r.path], r) for r in self.rows]
        return [self.cache[k] for k in keys]


def _rel(model: float, observed: float) -> float:
    return (model - observed) / observed


def _stats(rows, values) -> dict:
    errs = [abs(_rel(v, r.observed)) for r, v in zip(rows, values)]
    return {"n": len(errs), "mean": float(np.mean(errs)), "max": float(np.max(errs))}


def run_calibration(csv_path: str, fit: list[str], *, profile: str | None = None, backend: str = "pool",
                    jobs=None, address=None, seed: int = 0, allow=(), quiet: bool = True,
                    max_evals: int = 40) -> dict:
    """Read the file, check the parameters, fit, and return everything the report and the profile need."""
    from scipy.optimize import least_squares

    from actors import registry
    from emulator.scenario import load_scenario

    if not fit:
        raise ValueError("emu calibrate: expected at least one --fit KEY (a parameter to fit)")
    rows, how = read_calibration(csv_path, allow=allow, seed=seed)
    sets = [f"machine.profile={profile}"] if profile else []
    loaded, problems = {}, []
    for r in rows:
        if r.path in loaded:
            continue
        try:
            loaded[r.path] = load_scenario(r.path, registry, sets, allow=allow)
        except SchemaError as e:
            problems.append(Problem(csv_path, r.line, "scenario", f"a valid scenario ({r.scenario})",
                                    f"{len(e.problems)} problem(s): " + "; ".join(str(p) for p in e.problems)))
    if problems:
        raise SchemaError(problems)
    first = loaded[rows[0].path]
    for r in rows:
        sc = loaded[r.path]
        if Path(sc.profile_file).resolve() != Path(first.profile_file).resolve():
            problems.append(Problem(csv_path, r.line, "scenario", f"a scenario on profile {first.profile_name} "
                                    f"(every row calibrates one profile; --profile NAME runs them all on NAME)",
                                    f"{r.scenario} on {sc.profile_name}"))
    if problems:
        raise SchemaError(problems)
    params = resolve_params(fit, first, registry.family(first.family).PROFILE_SCHEMA)
    for r in rows:
        sc = loaded[r.path]
        for p in params:
            origin = next((w for k, w in sc.where.items() if k[:2] == ("machine", "overrides")
                           and ".".join(map(str, k[2:])) == p.key), None)
            if origin is not None:
                problems.append(Problem(csv_path, r.line, "scenario", f"a scenario that leaves {p.key} to the "
                                        "profile (the fit sets it)", f"{r.scenario} sets it at "
                                        f"{origin[0]}:{origin[1]}"))
    if problems:
        raise SchemaError(problems)
    families = sorted({registry.FAMILIES[sc.family] for sc in loaded.values()})
    evaluate = _Evaluator({p: sc.resolved() for p, sc in loaded.items()}, rows,
                          _backend(backend, jobs, address, families), quiet)
    default = {p.key: p.value for p in params}
    probes = [default] + [{**default, p.key: v} for p in params for v in (p.low, p.high)]
    probed = evaluate(probes)
    base = probed[0]
    for i, r in enumerate(rows):
        if base["values"][i] is None:
            res = base["results"][r.path]
            close = difflib.get_close_matches(r.metric, _known_metrics(res), n=1, cutoff=0.5)
            problems.append(Problem(csv_path, r.line, "metric", f"a metric of {r.scenario}'s result (a result.json "
                                    "key path such as end_time_ps or energy.avg_power_w, or bench:NAME of a "
                                    "microbenchmark table row)", repr(r.metric),
                                    f"did you mean {close[0]!r}?" if close else "not in its result"))
    if problems:
        raise SchemaError(problems)
    fit_idx = [i for i, r in enumerate(rows) if r.split == "fit"]
    for j, p in enumerate(params):
        lo, hi = probed[1 + 2 * j]["values"], probed[2 + 2 * j]["values"]
        moved = [i for i in fit_idx if not lo[i] == base["values"][i] == hi[i]]
        if not moved:
            held = [rows[i].line for i in range(len(rows)) if rows[i].split == "holdout"
                    and not lo[i] == base["values"][i] == hi[i]]
            file, _, line = p.where.rpartition(":")
            problems.append(Problem(file if line.isdigit() else p.where, int(line) if line.isdigit() else None,
                                    f"uncertainty.{p.key}" if line.isdigit() else p.key,
                                    "a parameter some fitted row depends on",
                                    f"no fitted row of {Path(csv_path).name} changes over its range "
                                    f"[{p.show(p.low)}, {p.show(p.high)}] (its sensitivity is zero there)",
                                    (f"held-out lines {', '.join(map(str, held))} depend on it: fit one of them"
                                     if held else "no row depends on it: drop it or add a figure that measures it")))
    if problems:
        raise SchemaError(problems)
    for i in fit_idx:
        if base["values"][i] <= 0:
            raise ValueError(f"{csv_path}:{rows[i].line}: {rows[i].metric} is {base['values'][i]} in the default "
                             "run: a log ratio needs a positive figure")

    obs = np.array([rows[i].observed for i in fit_idx])

    def values_of(u) -> dict:
        return {p.key: p.at(float(x)) for p, x in zip(params, u)}

    def resid(entry) -> np.ndarray:
        v = np.array([entry["values"][i] for i in fit_idx], float)
        if np.any(v <= 0):
            return np.full(len(fit_idx), 1e3)
        return np.log(v / obs)

    steps = [max(STEP, 1.0 / (p.high - p.low)) if p.integer else STEP for p in params]

    def fun(u):
        return resid(evaluate([values_of(u)])[0])

    def jac(u):
        pts, signs = [], []
        for j, h in enumerate(steps):
            s = 1.0 if u[j] + h <= 1.0 else -1.0
            w = np.array(u, float)
            w[j] += s * h
            pts.append(values_of(w))
            signs.append(s * h)
        out = evaluate([values_of(u)] + pts)
        r0 = resid(out[0])
        return np.column_stack([(resid(e) - r0) / d for e, d in zip(out[1:], signs)]) if pts else None

    u0 = np.array([p.u_of(p.value) for p in params])
    sol = least_squares(fun, u0, jac=jac, bounds=(0.0, 1.0), method="trf", x_scale=1.0, xtol=1e-6, ftol=1e-9,
                        gtol=1e-9, max_nfev=max_evals)
    best = values_of(sol.x)
    best_cost = float(np.sum(resid(evaluate([best])[0]) ** 2))
    for j, p in enumerate(params):           # integer cycle counts: one unit either side
        if not (p.integer and p.kind is None):
            continue
        cands = [{**best, p.key: v} for v in (best[p.key] - 1, best[p.key] + 1) if p.low <= v <= p.high]
        for cand, e in zip(cands, evaluate(cands)):
            c = float(np.sum(resid(e) ** 2))
            if c < best_cost:
                best, best_cost = cand, c
    after = evaluate([best])[0]
    holdout_idx = [i for i, r in enumerate(rows) if r.split == "holdout"]

    def split_stats(idx, entry):
        return _stats([rows[i] for i in idx], [entry["values"][i] for i in idx])

    return {"file": str(csv_path), "split": how, "profile": first.profile_name, "profile_file": first.profile_file,
            "scenario": rows[0].path, "rows": rows, "params": params, "default": default, "fitted": best,
            "before": base["values"], "after": after["values"], "runs": evaluate.runs,
            "optimizer": {"status": int(sol.status), "message": str(sol.message), "nfev": int(sol.nfev),
                          "cost": best_cost},
            "error": {"fit": {"before": split_stats(fit_idx, base), "after": split_stats(fit_idx, after)},
                      "holdout": {"before": split_stats(holdout_idx, base), "after": split_stats(holdout_idx, after)}}}


# ------------------------------------------------------------------ the report
def _fmt_value(v: float, row: Row) -> str:
    x = v / row.scale
    text = f"{x:,.0f}" if abs(x) >= 100000 else f"{x:.5g}"
    return f"{text} {row.unit}" if row.unit else text


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def format_calibration(c: dict) -> str:
    from tools.table import format_table

    name = Path(c["file"]).name
    out = [f"emu calibrate {name}: {len(c['rows'])} rows on profile {c['profile']}, "
           f"{len(c['params'])} parameter{'s' * (len(c['params']) != 1)} fitted, {c['runs']} runs",
           f"split: {c['split']}"]
    rows = [{"line": r.line, "scenario": Path(r.scenario).stem, "metric": r.metric, "observed": _fmt_value(r.observed, r),
             "before": _fmt_value(b, r), "after": _fmt_value(a, r), "err before": _pct(_rel(b, r.observed)),
             "err after": _pct(_rel(a, r.observed)), "split": r.split}
            for r, b, a in zip(c["rows"], c["before"], c["after"])]
    out.append(format_table("rows (err = (model - observed) / observed):", rows))
    e = c["error"]
    for s, label in (("fit", "fitted"), ("holdout", "held-out")):
        b, a = e[s]["before"], e[s]["after"]
        out.append(f"{label} rows ({b['n']}): mean |err| {100 * b['mean']:.1f}% -> {100 * a['mean']:.1f}%, "
                   f"max {100 * b['max']:.1f}% -> {100 * a['max']:.1f}%")
    prows = [{"parameter": p.key, "before": p.show(c["default"][p.key]), "after": p.show(c["fitted"][p.key]),
              "range": f"[{p.show(p.low)}, {p.show(p.high)}]",
              "at bound": "low" if c["fitted"][p.key] == p.low else "high" if c["fitted"][p.key] == p.high else "",
              "range from": Path(p.where.rsplit(":", 1)[0]).name + (":" + p.where.rsplit(":", 1)[1]
                                                                     if ":" in p.where else "")}
             for p in c["params"]]
    out.append(format_table("fitted parameters:", prows))
    return "\n".join(out)


def _yaml_value(p: FitParam, v) -> str:
    if p.kind:
        text = format_quantity(int(v), p.kind)
        try:
            if parse_quantity(text, p.kind) == int(v):
                return text
        except UnitError:
            pass
        return f"{int(v)}{BASE_UNIT[p.kind]}"
    return str(int(v)) if p.integer else repr(float(v))


def write_profile(c: dict, out: str, *, allow=()) -> str:
    """Write the calibrated profile (``extends:`` the original), load it back with the first scenario, and
    return what to print about it."""
    from actors import registry
    from emulator import __version__
    from emulator.declare import value_at
    from emulator.scenario import MACHINES_DIR, load_scenario

    outp = Path(out)
    orig = Path(c["profile_file"]).resolve()
    extends = orig.stem if orig.parent == MACHINES_DIR.resolve() else os.path.relpath(orig, outp.resolve().parent)
    e = c["error"]
    fit_lines = [r.line for r in c["rows"] if r.split == "fit"]
    hold_lines = [r.line for r in c["rows"] if r.split == "holdout"]
    lines = [f"# Calibrated profile: {c['profile']} with {len(c['params'])} parameter(s) fitted by emu calibrate "
             f"(emulator {__version__}).",
             f"# Figures: {Path(c['file']).name}; fitted rows at lines {', '.join(map(str, fit_lines))}; "
             f"held-out rows at lines {', '.join(map(str, hold_lines))} ({c['split']}).",
             f"# Held-out error (mean |model - observed| / observed): {100 * e['holdout']['before']['mean']:.1f}% "
             f"before -> {100 * e['holdout']['after']['mean']:.1f}% after (max "
             f"{100 * e['holdout']['before']['max']:.1f}% -> {100 * e['holdout']['after']['max']:.1f}%);",
             f"# fitted rows {100 * e['fit']['before']['mean']:.1f}% -> {100 * e['fit']['after']['mean']:.1f}%. "
             "Method: docs/calibrate.md.",
             f"extends: {extends}",
             f"description: {json.dumps(c['profile'] + ' calibrated to ' + Path(c['file']).name)}"]
    tree: dict = {}
    for p in c["params"]:
        node = tree
        parts = p.key.split(".")
        for k in parts[:-1]:
            node = node.setdefault(k, {})
        node[parts[-1]] = p

    def emit(node, depth):
        for k, v in node.items():
            pad = "  " * depth
            if isinstance(v, dict):
                lines.append(f"{pad}{k}:")
                emit(v, depth + 1)
            else:
                val = c["fitted"][v.key]
                lines.append(f"{pad}{k}: {_yaml_value(v, val)}    # emu calibrate: was {_yaml_value(v, c['default'][v.key])}, "
                             f"fitted in [{v.show(v.low)}, {v.show(v.high)}] (range: {v.where})")
    emit(tree, 0)
    declared = [p for p in c["params"] if p.where != "--fit"]
    outside = [p for p in declared if not p.low <= c["fitted"][p.key] <= p.high]
    if outside:
        lines.append("uncertainty:")
        for p in outside:
            lines.append(f"  {p.key}: null    # the fitted value lies outside the inherited range")
    outp.parent.mkdir(parents=True, exist_ok=True)
    outp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    sc = load_scenario(c["scenario"], registry, [f"machine.profile={outp.resolve()}"],
                       allow=(*allow, str(outp.resolve().parent)))
    wrong = [p.key for p in c["params"] if value_at(sc.profile, p.key) != c["fitted"][p.key]]
    if wrong:
        raise ValueError(f"{out}: the written profile does not give the fitted value of {', '.join(wrong)}")
    return f"wrote {out} (extends {extends}); checked: {Path(c['scenario']).name} loads with it"


# ------------------------------------------------------------------ the command
def add_parser(sub) -> None:
    from tools.sweep.backends import add_backend_arguments
    p = sub.add_parser("calibrate", help="fit declared profile parameters to observed figures (a CSV) and report "
                                         "the error on held-out rows; writes a calibrated profile (docs/calibrate.md)")
    p.add_argument("csv", help="the calibration file: scenario,metric,value,unit,source[,split] (docs/calibrate.md)")
    p.add_argument("--fit", action="append", default=[], metavar="KEY[=LOW,HIGH]", required=True,
                   help="a profile parameter to fit (repeatable), within its declared uncertainty range or the "
                        "bounds given (written like the value, e.g. ipcq.fixed_overhead=20ns,40ns)")
    p.add_argument("--profile", help="run every scenario of the file on this machine profile (name or path) "
                                     "instead of its own (default: the scenarios' own, which must agree)")
    p.add_argument("--out", required=True, metavar="PROFILE.yaml",
                   help="where to write the calibrated profile (it extends the original)")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out split when the file has no split column")
    p.add_argument("--max-evals", type=int, default=40, help="most evaluations the optimiser may make (each runs "
                                                            "every scenario once, plus a Jacobian batch)")
    add_backend_arguments(p, "runs")
    p.add_argument("--json", action="store_true", help="print the rows, errors and fitted values as JSON")
    add_allow_path_argument(p)
    p.set_defaults(func=main)


def _as_json(c: dict) -> dict:
    return {"file": c["file"], "split": c["split"], "profile": c["profile"], "runs": c["runs"],
            "optimizer": c["optimizer"], "error": c["error"],
            "parameters": [{"key": p.key, "before": c["default"][p.key], "after": c["fitted"][p.key], "low": p.low,
                            "high": p.high, "range_from": p.where} for p in c["params"]],
            "rows": [{"line": r.line, "scenario": r.scenario, "metric": r.metric, "unit": r.unit,
                      "observed": r.observed / r.scale, "before": b / r.scale, "after": a / r.scale,
                      "err_before": _rel(b, r.observed), "err_after": _rel(a, r.observed), "split": r.split,
                      "source": r.source} for r, b, a in zip(c["rows"], c["before"], c["after"])]}


def main(args) -> int:
    if args.seed < 0:
        raise ValueError(f"emu calibrate --seed: expected an integer >= 0, found {args.seed}")
    if args.max_evals < 1:
        raise ValueError(f"emu calibrate --max-evals: expected an integer >= 1, found {args.max_evals}")
    c = run_calibration(args.csv, args.fit, profile=args.profile, backend=args.backend, jobs=args.jobs,
                        address=args.address, seed=args.seed, allow=args.allow_path,
                        quiet=args.json or not sys.stderr.isatty(), max_evals=args.max_evals)
    note = write_profile(c, args.out, allow=args.allow_path)
    if args.json:
        print(json.dumps(_as_json(c), indent=1, default=str))
    else:
        print(format_calibration(c))
        print(note)
    return 0
