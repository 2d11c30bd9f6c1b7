"""``emu sweep SPEC.yaml``: run every point of a sweep file, resumably, and tabulate and plot them.

The sweep directory (``--out DIR``, default ``runs/sweeps/<sweep name>``) holds::

    sweep.yaml            the sweep as written and its expanded points (index, key, values)
    points/<key>/         one result bundle per point (scenario.yaml, result.json, ...)
    points/<key>/point.json   the point's record, written last: the point is done
    results.csv, results.jsonl   one row per point (tools.sweep.results)
    plots/*.png           each metric against each varied key, and the panel (tools.sweep.plots)
    best.csv              the best choice per case, when the sweep file asks (tools.sweep.best)

``<key>`` is the hash of the point's resolved scenario (tools.sweep.spec), so a
sweep that was interrupted runs only the points that have no ``point.json`` yet,
and running a finished sweep again runs nothing (``--retry-failed`` re-runs the
points whose status is not ``finished``).  Two points of one sweep that resolve
to the same scenario run once.  A point that fails -- error, deadlock, time
limit, killed worker -- is recorded with its status and the others go on.

Exit status: 0 when every point has a record (whatever its status), 2 for a bad
sweep file or arguments, 130 when interrupted (the finished points are kept).
"""
from __future__ import annotations

import difflib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from emulator.input_paths import add_allow_path_argument
from tools.sweep.best import best_rows, write_best

from tools.sweep.backends import default_jobs, make_backend
from tools.sweep.plots import plot_panel, plot_sweep
from tools.sweep.progress import SweepProgress
from tools.sweep.results import constant_summary, default_metrics, format_rows, make_row, write_results
from tools.sweep.spec import Point, SweepSpec, confirm_points, load_sweep

__all__ = ["run_sweep", "add_parser", "validate_sweep", "SweepRun"]


@dataclass
class SweepRun:
    spec: SweepSpec
    directory: Path
    rows: list[dict]
    metrics: list[str]
    best: list[dict]
    confirmed: list[dict] = None


def _write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


def _read_record(path: Path) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _select(spec: SweepSpec, only: list[str]) -> list[Point]:
    points = spec.points
    for item in only:
        key, sep, text = item.partition("=")
        if not sep or key not in spec.keys:
            close = difflib.get_close_matches(key, spec.keys, n=1)
            raise ValueError(f"--only {item!r}: expected varied-key=value with a varied key of {spec.file} ("
                             + ", ".join(spec.keys) + ")" + (f"; did you mean {close[0]!r}?" if close else ""))
        value = yaml.safe_load(text)
        points = [p for p in points if p.values.get(key) == value]
    if not points:
        raise ValueError(f"--only {' '.join(only)}: no point of {spec.file} has these values")
    return points


def _why(result: dict) -> str | None:
    """Why a point did not finish, in one line (the error, or who is blocked in a deadlock)."""
    if result.get("error"):
        return str(result["error"])
    dl = result.get("deadlock")
    if dl:
        blocked = ", ".join(f"{b['actor']} ({b['direction']})" for b in dl.get("blocked", [])[:4])
        return f"deadlock at t={dl.get('time_ps')} ps: {dl.get('unfinished')} workload actor(s) unfinished; " \
               f"blocked: {blocked}"
    return None


def _label(p: Point) -> str:
    vals = " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in p.values.items())
    return f"point {p.index}" + (f" ({vals})" if vals else "")


def run_sweep(spec_path: str, out: str | None = None, *, backend: str = "pool", jobs: int | None = None,
              address: str | None = None, retry_failed: bool = False, quiet: bool = False,
              plots: bool = True, only: list[str] | None = None, registry=None, allow=()) -> SweepRun:
    """Run (or resume) a sweep: its spec, directory, rows, metric names and best choices.

    ``only`` (``["key=value", ...]``) restricts the run and the tables to the points with those varied values;
    the points run are the same as in the whole sweep (same keys), so a later full run reuses them.
    ``allow``: ``--allow-path`` folders (emulator/input_paths.py).
    """
    be = make_backend(backend, jobs, address)
    spec = load_sweep(spec_path, registry, allow)
    if only:
        spec.points = _select(spec, only)
    directory = Path(out) if out else Path("runs") / "sweeps" / spec.name
    (directory / "points").mkdir(parents=True, exist_ok=True)
    with open(directory / "sweep.yaml", "w") as f:
        yaml.safe_dump({"sweep": spec.source, "file": spec.file, "base": spec.base,
                        "points": [{"index": p.index, "key": p.key, "values": p.values} for p in spec.points]},
                       f, sort_keys=False)

    results: dict[str, dict] = {}       # point key -> result
    try:
        _run_points(spec, spec.points, directory, be, retry_failed, quiet, results)
    finally:    # also when interrupted: the finished points are tabulated
        done_points = [p for p in spec.points if p.key in results]
        metrics = spec.metrics or default_metrics([results[p.key] for p in done_points])
        rows = [make_row(p, results[p.key], metrics, spec.keys) for p in done_points]
        errors = {p.index: _why(results[p.key]) for p in done_points if _why(results[p.key])}
        write_results(directory, rows, errors)
    best, confirmed = [], []
    if spec.best:
        best = best_rows(rows, spec.best["minimize"], spec.best["over"], spec.best["per"], metrics)
        write_best(directory / "best.csv", best)
        if spec.confirm:
            confirmed = _confirm(spec, best, metrics, directory, be, retry_failed, quiet)
    if plots and rows:
        plot_sweep(directory, rows, spec.keys, metrics, spec.name)
        if spec.panel:
            plot_panel(directory, rows, spec.panel, spec.name)
    return SweepRun(spec, directory, rows, metrics, best, confirmed)


def _confirm(spec: SweepSpec, best: list[dict], metrics: list[str], directory: Path, be, retry_failed: bool,
             quiet: bool) -> list[dict]:
    """Run each winner of ``best`` once more with ``confirm.set`` (spec.confirm_points); ``confirm.csv``: the
    winner's row with the confirmation's metrics beside it (``confirm.<metric>``) and the ratio of the
    minimised metric, confirmed / chosen."""
    by_index = {p.index: p for p in spec.points}
    winners = [by_index[b["point"]] for b in best if b.get("point") is not None]
    points = confirm_points(spec, winners)
    results: dict[str, dict] = {}
    _run_points(spec, points, directory, be, retry_failed, quiet, results)
    out = []
    target = spec.best["minimize"]
    for b in best:
        row = dict(b)
        p = next((q for q in points if q.index == b.get("point")), None)
        r = results.get(p.key) if p is not None else None
        c = make_row(p, r, metrics, spec.keys) if r is not None else {}
        row["confirm.status"] = c.get("status")
        for m in metrics:
            row[f"confirm.{m}"] = c.get(m)
        got, chosen = c.get(target), b.get(target)
        row[f"confirm.{target}_ratio"] = (round(got / chosen, 4) if isinstance(got, (int, float)) and chosen
                                          else None)
        row["confirm.bundle"] = c.get("bundle")
        out.append(row)
    write_best(directory / "confirm.csv", out)
    return out


def _run_points(spec: SweepSpec, points: list[Point], directory: Path, be, retry_failed: bool, quiet: bool,
                results: dict[str, dict]) -> None:
    """Run the points without a record in ``directory/points`` (resume); ``results`` gets point key -> result
    of every point with one (also of those done when an interrupt stops the run)."""
    by_key: dict[str, list[Point]] = {}
    for p in points:
        by_key.setdefault(p.key, []).append(p)
    todo = []
    for key, pts in by_key.items():
        rec = _read_record(directory / "points" / key / "point.json")
        if rec is not None and not (retry_failed and rec["result"].get("status") != "finished"):
            results[key] = rec["result"]
            continue
        p = pts[0]
        timeout_s = spec.timeout_ps / 1e12 if spec.timeout_ps else None
        todo.append({"index": p.index, "key": key, "dir": str(directory / "points" / key), "resolved": p.resolved,
                     "source": p.source, "sets": p.sets, "timeout_ps": spec.timeout_ps, "plots": spec.point_plots,
                     # the engine's wall guard stops the run first; this is the backstop for a point stuck elsewhere
                     "kill_after_s": timeout_s * 1.5 + 30 if timeout_s else None})

    progress = SweepProgress(len(todo), len(results), quiet=quiet)

    class Events:
        running = staticmethod(progress.running)

        @staticmethod
        def done(task: dict, record: dict) -> None:
            d = directory / "points" / task["key"]
            d.mkdir(parents=True, exist_ok=True)
            for name, data in (record.get("files") or {}).items():   # a remote worker's bundle
                (d / name).parent.mkdir(parents=True, exist_ok=True)
                (d / name).write_bytes(data)
            result = record["result"]
            first = by_key[task["key"]][0]
            _write_json_atomic(d / "point.json", {"index": first.index, "key": task["key"], "values": first.values,
                                                  "sets": first.sets, "result": result})
            results[task["key"]] = result
            progress.finished(_label(first), result.get("status", "error"), result.get("wall_s"))

    try:
        if todo:
            be.run(todo, Events)
    finally:
        progress.close()


def validate_sweep(path: str, allow=()) -> int:
    spec = load_sweep(path, None, allow)
    keys = ", ".join(spec.keys) or "nothing"
    print(f"{path}: ok (sweep {spec.name} over {spec.base}: {len(spec.points)} point(s), varying {keys})")
    return 0


def cmd_sweep(args) -> int:
    from emulator.interrupt import stop_signals_interrupt
    from tools.table import format_table

    try:
        with stop_signals_interrupt():
            run = run_sweep(args.spec, args.out, backend=args.backend, jobs=args.jobs,
                            address=args.address, retry_failed=args.retry_failed,
                            quiet=args.quiet or args.json, plots=not args.no_plots, only=args.only,
                            allow=args.allow_path)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        why = f" ({e.args[0]})" if e.args else ""
        print(f"sweep interrupted{why}: the finished points are kept (results.csv); run the same command again "
              "to resume", file=sys.stderr)
        return 130
    spec, directory, rows = run.spec, run.directory, run.rows
    if args.json:
        for r in rows:
            print(json.dumps(r, default=str))
        return 0
    print(format_table(f"sweep {spec.name}: {len(rows)} point(s) ({directory})",
                       format_rows(rows, spec.keys, run.metrics)))
    same = constant_summary(rows, run.metrics)
    if same:
        print(same)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(", ".join(f"{n} {s}" for s, n in counts.items()) + f"; results in {directory / 'results.csv'}")
    if run.best:
        b = spec.best
        print()
        print(format_table(f"best {', '.join(b['over'])} by {b['minimize']} (smallest), per "
                           f"{', '.join(b['per']) or 'sweep'} ({directory / 'best.csv'})",
                           format_rows(run.best, spec.keys, run.metrics)))
    if run.confirmed:
        b = spec.best
        keep = [*b["per"], *b["over"], b["minimize"]]
        cols = [m for m in run.confirmed[0] if m.startswith("confirm.") and m != "confirm.bundle"]
        view = [{c: r.get(c) for c in keep + cols} for r in run.confirmed]
        print()
        print(format_table(f"best points confirmed with {', '.join(spec.confirm)} ({directory / 'confirm.csv'})",
                           format_rows(view, spec.keys, cols)))
        same = constant_summary(view, cols)
        if same:
            print(same)
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("sweep", help="run every point of a sweep file (a grid over a base scenario)")
    s.add_argument("spec", help="the sweep file (base scenario, keys to vary, metrics)")
    s.add_argument("--out", help="sweep directory (default runs/sweeps/<sweep name>); re-running resumes it")
    s.add_argument("-j", "--jobs", type=int, default=None, help=f"points run at once (default: cores, here "
                   f"{default_jobs()})")
    s.add_argument("--backend", choices=["pool", "ray"], default="pool",
                   help="pool: local processes (default); ray: Ray tasks (local Ray, or --address)")
    s.add_argument("--address", help="with --backend ray: join this Ray cluster (e.g. ray://host:10001 or auto); "
                   "default: a local Ray of its own")
    s.add_argument("--only", action="append", default=[], metavar="KEY=VALUE",
                   help="run and tabulate only the points with this varied value (repeatable); default: every point")
    s.add_argument("--retry-failed", action="store_true", help="run again the recorded points that did not finish")
    s.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    s.add_argument("--json", action="store_true", help="print the rows as JSON lines instead of a table")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    add_allow_path_argument(s)
    s.set_defaults(func=cmd_sweep)
