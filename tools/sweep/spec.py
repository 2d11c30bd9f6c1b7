"""Sweep files: load, validate and expand into resolved points.

A sweep file names a base scenario and the keys to vary::

    name: reduce-grid                  # optional, defaults to the file name
    base: scenarios/demo/reduce.yaml   # relative to this file, the working directory or the repository
    set: {mode: timing}                # applied to every point (any --set path)
    vary:                              # the cartesian product of these axes
      seed: [1, 2]
      workload.params.rounds: {start: 1, stop: 4}          # 1, 2, 3, 4 (stop included)
      workload.params.G: {start: 1, stop: 8, times: 2}     # 1, 2, 4, 8
    zip:                               # each group is one axis: its lists advance together
      - {workload.params.d: [64, 128], workload.params.merge: [8ns, 16ns]}
    seeds: [1, 2, 3]                   # shorthand for one more axis over ``seed``
    metrics: [end_time_ps, max_abs_err] # keys of result.json or of a workload report
    timeout: 600s                      # wall-clock limit of one point
    point_plots: false                 # per-point bundle plots (off: sweeps stay fast)
    best: {minimize: end_time_ps, over: [workload.params.G]}   # the winner per case (tools.sweep.best)
    confirm: {set: {mode: data}}       # each winner run once more with these keys set (confirm.csv)
    panel: {x: workload.params.G, y: end_time_ps, lines: seed}  # plots/panel.png (tools.sweep.plots)

A key of ``vary``, ``zip`` or ``set`` is any ``emu run --set`` path.  Every point is
resolved through the same loader and schemas as ``emu run`` (emulator.scenario),
so a misspelt key or a bad value is reported with this file's name and line, the
key path, what was expected, what was found and the closest valid key -- once,
even if every point has it.  A point's identity is the sha256 of its resolved
scenario (without the output options and the base file's path): the key under
which its bundle lives, so an interrupted sweep resumes and a finished one is
not run again.
"""
from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from emulator.input_paths import check_inputs_root, confined_file, input_roots
from emulator.scenario import ROOT, load_scenario
from emulator.units import WALL_TIME_MAX
from emulator.schema import (AnyValue, Bool, Doc, Int, List, Map, Problem, Quantity, SchemaError, Spec, Str,
                             load_yaml, read_text, validate)

__all__ = ["SWEEP_SCHEMA", "SweepSpec", "Point", "load_sweep", "looks_like_sweep", "point_key", "confirm_points"]


class Axis(Spec):
    """The values of one varied key: a non-empty list, or a range ``{start, stop, step | times}`` (stop included)."""

    expected = "a non-empty list of values or a range like {start: 1, stop: 8, step: 1} or {start: 1, stop: 8, times: 2}"

    def check(self, value, path, ctx):
        if isinstance(value, list):
            if not value:
                ctx.fail(path, self.expected, value)
            return value
        if not isinstance(value, dict):
            ctx.fail(path, self.expected, value)
            return []
        rng = Map({"start": _NUM, "stop": _NUM, "step": Spec(default=None), "times": Spec(default=None)})
        r = rng.check(value, path, ctx)
        if not r or r.get("start") is None or r.get("stop") is None:
            return []
        start, stop, step, times = r["start"], r["stop"], r["step"], r["times"]
        if (step is None) == (times is None) and not (step is None and times is None):
            ctx.fail(path, "a range with either step or times, not both", value)
            return []
        if times is not None:
            if not _is_num(times) or times <= 1 or start <= 0:
                ctx.fail(path + ("times",), "a factor > 1 (and start > 0)", times)
                return []
            out, v = [], start
            while v <= stop and len(out) <= 10_000:
                out.append(v)
                v *= times
        else:
            step = 1 if step is None else step
            if not _is_num(step) or step <= 0:
                ctx.fail(path + ("step",), "a step > 0", step)
                return []
            n = int((stop - start) // step) + 1 if stop >= start else 0
            out = [start + i * step for i in range(min(n, 10_001))]
        if not out:
            ctx.fail(path, "a range holding at least one value (start <= stop)", value)
        elif len(out) > 10_000:
            ctx.fail(path, "a range of at most 10000 values", f"{len(out)}+ values", verbatim=True)
        return out


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class _Num(Spec):
    expected = "a number"

    def check(self, value, path, ctx):
        if not _is_num(value):
            ctx.fail(path, self.expected, value)
        return value


_NUM = _Num()

SWEEP_SCHEMA = Map({
    "name": Str(default=None, doc="defaults to the file name"),
    "description": Str(default=""),
    "base": Str(doc="the base scenario file: relative to the sweep file, the working directory or the repository "
                    "(under the sweep's folder, the shipped scenarios/, --allow-path or inputs_root)"),
    "inputs_root": Str(default=None, doc="a folder containing the sweep file under which its base (and the files "
                                         "the base names) may lie, like a scenario's inputs_root"),
    "set": Map(open=True, default={}, doc="key.path: value applied to every point (like emu run --set)"),
    "vary": Map(values=Axis(), default={}, doc="key.path: values; the points are the cartesian product"),
    "zip": List(Map(values=Axis()), default=[],
                doc="groups of key.path: values advancing together (equal lengths); each group is one axis"),
    "seeds": List(Int(min=0), default=None, doc="one more axis over the scenario seed"),
    "metrics": List(Str(), default=None,
                    doc="result.json keys (dotted paths) or workload report keys; default: end_time_ps and the "
                        "workload's scalar checks"),
    "timeout": Quantity("time", high=WALL_TIME_MAX, default=None, doc="wall-clock limit of one point (the engine's guard, then a kill)"),
    "point_plots": Bool(default=False, doc="write the per-point bundle plots"),
    "best": Map({
        "minimize": Str(doc="the metric to minimise"),
        "over": List(Str(), min_len=1, doc="the varied keys whose values are the choices compared"),
        "per": List(Str(), default=None, doc="one winner per combination of these varied keys (default: the others)"),
    }, default=None, doc="name the best choice per case (tools/sweep/best.py), written to best.csv"),
    "confirm": Map({
        "set": Map(open=True, doc="key.path: value applied to each winner (e.g. the larger machine)"),
    }, default=None, doc="run each best point once more with these keys set, written to confirm.csv (needs best)"),
    "panel": Map({
        "x": Str(doc="the varied key on the x axis"),
        "y": Str(doc="the metric (log y axis); each line point is the best row over the other keys"),
        "lines": Str(default=None, doc="a varied key: one line per value"),
        "split": Str(default=None, doc="a varied key: one column of axes per value"),
        "bound": Str(default=None, doc="a metric drawn dashed, with a second row of axes for y / bound"),
    }, default=None, doc="one summary figure, plots/panel.png (tools/sweep/plots.py)"),
})

SWEEP_ONLY_KEYS = {"base", "vary", "zip", "seeds", "metrics", "point_plots"}


@dataclass
class Point:
    """One run of a sweep: its varied values, the ``--set`` items that make it, its resolved scenario."""

    index: int
    values: dict                 # varied key -> value, in axis order
    sets: list[str]              # --set items applied to the base (fixed ones first)
    resolved: dict               # Scenario.resolved()
    key: str                     # point_key(resolved)
    source: dict = field(default_factory=dict)   # the base scenario as written with ``sets`` applied (its bundle's
                                                 # scenario.yaml: runnable by itself, tools.run.bundle)


@dataclass
class SweepSpec:
    file: str
    name: str
    description: str
    base: str
    keys: list[str]              # the varied keys, in column order
    points: list[Point]
    metrics: list[str] | None
    timeout_ps: int | None
    point_plots: bool
    best: dict | None = None     # {minimize, over, per} with per filled in
    panel: dict | None = None    # {x, y, lines, split, bound}
    source: dict = field(default_factory=dict)
    confirm: list[str] | None = None   # --set items applied to each best point (confirm_points)
    registry: object = None
    allow: tuple = ()            # folders the base scenario's files may lie under (--allow-path, inputs_root)


def point_key(resolved: dict) -> str:
    """The identity of a point: sha256 of its resolved scenario minus where it came from and where it writes."""
    ident = {k: v for k, v in resolved.items() if k not in ("file", "output", "input_roots")}
    text = json.dumps(ident, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def looks_like_sweep(path: str) -> bool:
    """Whether ``path`` is a sweep file (it has ``base:`` or ``vary:``) rather than a scenario."""
    try:
        doc = load_yaml(read_text(path), path)
    except SchemaError:
        return False
    return isinstance(doc.value, dict) and bool(SWEEP_ONLY_KEYS & set(doc.value)) and "machine" not in doc.value


def _find_base(base: str, sweep_file: str, roots: dict, where: tuple) -> Path | None:
    """The base scenario: relative to the sweep file, the working directory or the repository, the first of
    them under ``roots`` (a SchemaError at ``where`` when it exists only outside them)."""
    return confined_file((Path(sweep_file).resolve().parent / base, Path(base), ROOT / base), "base", base, roots,
                         where)


def _flatten(d: dict, prefix: str = "") -> dict:
    """``{workload: {params: {rounds: 2}}}`` -> ``{'workload.params.rounds': 2}`` (dotted keys kept as written)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _set_item(key: str, value) -> str:
    # JSON is YAML: the scenario loader parses it back to exactly this value
    return f"{key}={json.dumps(value)}"


def load_sweep(path: str, registry, allow=()) -> SweepSpec:
    """Load, validate and expand a sweep file; raises :class:`SchemaError` naming this file's lines.

    ``allow``: ``--allow-path`` folders, for its base and the files the base names (emulator/input_paths.py)."""
    file = str(path)
    if not os.path.isfile(file):
        raise SchemaError([Problem(file, None, "", "an existing sweep file", "no such file")])
    doc = load_yaml(read_text(file), file)
    if not isinstance(doc.value, dict):
        raise SchemaError([Problem(file, 1, "", "a map of sweep keys", type(doc.value).__name__)])
    if "base" not in doc.value and ("machine" in doc.value or "workload" in doc.value):
        raise SchemaError([Problem(file, 1, "base", "a sweep file (base: SCENARIO, vary: ...)",
                                   "a scenario file", "run it with emu run, or name it as the base of a sweep")])
    spec = validate(SWEEP_SCHEMA, doc)
    allow = tuple(allow) + _inputs_root(spec, doc, file)
    base_path = _find_base(spec["base"], file, input_roots(Path(file).parent, allow=allow, own="the sweep file's folder"), doc.where(("base",)))
    if base_path is None:
        raise SchemaError([Problem(*doc.where(("base",)), "base", "an existing scenario file (relative to the "
                                   "sweep file, the working directory or the repository)", repr(spec["base"]))])
    problems: list[Problem] = []
    axes = _axes(spec, doc, problems)
    keys = [k for ks, _, _ in axes for k in ks]
    best, panel = _choices(spec, doc, keys, problems)
    confirm = _confirm(spec, doc, best, problems)
    if problems:
        raise SchemaError(problems)
    from actors import registry as default_registry
    registry = registry or default_registry
    points = _points(spec, doc, axes, base_path, registry, allow)
    out = SweepSpec(file=file, name=spec["name"] or Path(file).stem, description=spec["description"],
                    base=str(base_path), keys=keys, points=points, metrics=spec["metrics"],
                    timeout_ps=spec["timeout"], point_plots=spec["point_plots"], best=best, panel=panel,
                    source=doc.value, confirm=confirm, registry=registry, allow=allow)
    if confirm and points:   # a bad confirm key or value is this file's error now, not after the grid ran
        try:
            confirm_points(out, points[:1])
        except SchemaError as e:
            origin = {item: ("confirm", "set", k) for item, k in zip(confirm, _flatten(spec["confirm"]["set"]))}
            raise SchemaError([_to_sweep_problem(p, origin, doc) for p in e.problems]) from None
    return out


def _inputs_root(spec: dict, doc, file: str) -> tuple:
    """The sweep's ``inputs_root:`` folder as a one-folder tuple (empty without one); a bad one is an error."""
    if spec["inputs_root"] is None:
        return ()
    folder, expected, found = check_inputs_root(spec["inputs_root"], file)
    if folder is None:
        raise SchemaError([Problem(*doc.where(("inputs_root",)), "inputs_root", expected, found)])
    return (folder,)


def _confirm(spec: dict, doc, best: dict | None, problems: list) -> list[str] | None:
    """``confirm.set`` as ``--set`` items; it needs ``best`` and may not set a key ``best`` chooses over."""
    c = spec["confirm"]
    if c is None:
        return None
    if best is None:
        problems.append(Problem(*doc.where(("confirm",)), "confirm", "a best: section (confirm re-runs its winners)",
                                "confirm without best"))
        return None
    flat = _flatten(c["set"])
    for k in flat:
        if k in best["over"]:
            problems.append(Problem(*doc.where(("confirm", "set", k)), f"confirm.set.{k}",
                                    "a key best does not choose over", f"{k!r}, one of best.over"))
    return [_set_item(k, v) for k, v in flat.items()]


def confirm_points(spec: SweepSpec, winners: list[Point]) -> list[Point]:
    """Each winning point with ``confirm.set`` applied (the same varied values; its own key, so it resumes)."""
    out = []
    for p in winners:
        sc = load_scenario(spec.base, spec.registry, p.sets + spec.confirm, allow=spec.allow)
        resolved = sc.resolved()
        out.append(Point(p.index, p.values, p.sets + spec.confirm, resolved, point_key(resolved), sc.source))
    return out


def _axes(spec: dict, doc, problems: list) -> list[tuple[list[str], list[tuple], list[tuple]]]:
    """The sweep's axes in product order -- ``vary`` keys, ``zip`` groups, ``seeds`` -- each as (keys, value
    tuples, where each value was written); a key varied or set twice, or a zip group of unequal lists, is a
    problem."""
    axes: list[tuple[list[str], list[tuple], list[tuple]]] = []
    seen: dict[str, tuple] = {}

    def claim(key: str, where: tuple) -> None:
        if key in seen:
            problems.append(Problem(*doc.where(where), _path(where), "each key varied or set once",
                                    f"{key!r} again (also at {_path(seen[key])})"))
        seen[key] = where

    for key in spec["set"]:
        claim(key, ("set", key))
    for key, values in spec["vary"].items():
        claim(key, ("vary", key))
        axes.append(([key], [(v,) for v in values], [("vary", key, i) for i in range(len(values))]))
    for g, group in enumerate(spec["zip"]):
        lengths = {k: len(v) for k, v in group.items()}
        if len(set(lengths.values())) > 1:
            problems.append(Problem(*doc.where(("zip", g)), f"zip[{g}]", "lists of equal length in a zip group",
                                    ", ".join(f"{k}: {n}" for k, n in lengths.items())))
            continue
        if not group:
            continue
        keys = list(group)
        for k in keys:
            claim(k, ("zip", g, k))
        n = next(iter(lengths.values()))
        axes.append((keys, [tuple(group[k][i] for k in keys) for i in range(n)],
                     [tuple(("zip", g, k, i) for k in keys) for i in range(n)]))
    if spec["seeds"] is not None:
        claim("seed", ("seeds",))
        axes.append((["seed"], [(s,) for s in spec["seeds"]], [("seeds", i) for i in range(len(spec["seeds"]))]))
    return axes


def _choices(spec: dict, doc, keys: list[str], problems: list) -> tuple[dict | None, dict | None]:
    """``best:`` (its ``per`` defaulted to the keys it does not choose over) and ``panel:``, their keys checked
    against the varied ones."""
    def known(k, where: tuple, label: str) -> None:
        if k not in keys:
            close = difflib.get_close_matches(k, keys, n=1)
            problems.append(Problem(*doc.where(where), label, "a varied key (" + ", ".join(keys) + ")", repr(k),
                                    f"did you mean {close[0]!r}?" if close else ""))

    best = spec["best"]
    if best is not None:
        for part in ("over", "per"):
            for i, k in enumerate(best[part] or []):
                known(k, ("best", part, i), f"best.{part}[{i}]")
        if best["per"] is None:
            best = {**best, "per": [k for k in keys if k not in best["over"]]}
    panel = spec["panel"]
    for part in ("x", "lines", "split"):
        k = (panel or {}).get(part)
        if k is not None:
            known(k, ("panel", part), f"panel.{part}")
    return best, panel


def _points(spec: dict, doc, axes: list, base_path, registry, allow: tuple) -> list[Point]:
    """Every point resolved through the scenario loader; a problem found in many points is reported once, at
    the line of the sweep file that set the value."""
    fixed = [_set_item(k, v) for k, v in _flatten(spec["set"]).items()]
    origin = {item: ("set", k) for item, k in zip(fixed, _flatten(spec["set"]))}
    points: list[Point] = []
    seen_problems: dict[tuple, Problem] = {}
    combos = itertools.product(*[list(zip(vals, wheres)) for _, vals, wheres in axes]) if axes else [()]
    for index, combo in enumerate(combos):
        values, sets = {}, list(fixed)
        for (ks, _, _), (vals, wheres) in zip(axes, combo):
            for k, v, w in zip(ks, vals, wheres if isinstance(wheres[0], tuple) else (wheres,)):
                values[k] = v
                item = _set_item(k, v)
                sets.append(item)
                origin[item] = w
        try:
            sc = load_scenario(str(base_path), registry, sets, allow=allow)
        except SchemaError as e:
            for p in e.problems:
                q = _to_sweep_problem(p, origin, doc)
                seen_problems.setdefault((q.file, q.line, q.path, q.expected, q.found), q)
            continue
        resolved = sc.resolved()
        points.append(Point(index, values, sets, resolved, point_key(resolved), sc.source))
    if seen_problems:
        raise SchemaError(list(seen_problems.values()))
    return points


def _path(where: tuple) -> str:
    out = ""
    for p in where:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _to_sweep_problem(p: Problem, origin: dict, doc: Doc) -> Problem:
    """A scenario problem caused by a ``--set`` item, re-addressed to the sweep file line that wrote it."""
    if not p.file.startswith("--set "):
        return p
    where = origin.get(p.file[len("--set "):])
    if where is None:
        return p
    if where[0] == "seeds":
        key, key_where = "seed", ("seeds",)
    elif isinstance(where[-1], int):        # vary.K[i] or zip[g].K[i]: one value of a list
        key, key_where = where[-2], where[:-1]
    else:                                   # set.K, or a range written as a map
        key, key_where = where[-1], where
    # an unknown key is the key's fault; a bad value is the value's
    at = key_where if p.expected == "a known key" else where
    label = _path(at) + (f" ({p.path})" if p.path and p.path != key else "")
    return Problem(*doc.where(at), label, p.expected, p.found, p.hint)
