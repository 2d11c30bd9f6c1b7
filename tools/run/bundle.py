"""Result bundles: everything about one run in one directory.

``emu run`` writes, by default to ``runs/<scenario name>/`` (``--out DIR`` to
choose; docs/outputs.md describes every file and column):

* ``scenario.yaml``  -- the scenario as run (after ``--set``), itself runnable:
  ``emu run runs/x/scenario.yaml`` reproduces the digest, wherever the bundle is
  copied: it names the bundle's own ``profile.yaml`` and ``input.*`` files;
* ``profile.yaml``   -- the machine profile as the run read it, its ``extends:``
  chain merged in (the overrides stay in ``scenario.yaml``);
* ``input.<name>``   -- a copy of each file a workload parameter names (a ``.pasm`` program);
* ``scenario.resolved.yaml`` -- the same with the profile merged in and every unit parsed;
* ``result.json``    -- status, digest, seed, metrics, checks, faults, versions,
  host speed (wall seconds, events/s, peak memory);
* ``actors.csv``, ``links.csv`` -- per-actor and per-link metrics (with their energy);
* ``table.<title>.csv`` -- each table the run printed (e.g. ``table.gqa-requests.csv``: one row per request);
* ``power.csv`` -- power per component class over time (docs/energy.md), when a trace was recorded;
* ``trace.emutrace`` -- the binary trace (the run plan's size policy, tools/run/runner.py);
* ``trace.pftrace`` -- the trace for ui.perfetto.dev (Perfetto protobuf), when the
  scenario enables the trace (capped at 1 GB: a trimmed file says so, on the terminal,
  in ``result.json``'s ``perfetto`` and in the file; ``emu trace perfetto`` makes one
  on demand, ``--format json`` for trace-event JSON);
* ``*.png`` -- plots, with ``--plots`` or ``output.plots: true``.

The directory is prepared before the run (:func:`prepare_bundle`): an
unwritable one is a clear error before anything runs, and the files of an
earlier run are removed so that no stale trace sits beside a new result.  A
directory holding files that are not a bundle's is refused.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import yaml

from emulator.errors import BuildError, EmulatorError
from emulator.input_paths import admits, confined_file
from tools.run.energy import energy_columns, write_power
from tools.run.power import run_power

__all__ = ["Bundle", "BundleError", "prepare_bundle", "check_trace_path", "BUNDLE_FILES"]

BUNDLE_FILES = ("scenario.yaml", "scenario.resolved.yaml", "profile.yaml", "result.json", "actors.csv", "links.csv",
                "power.csv",
                "faults.json", "state.json", "trace.emutrace", "trace.pftrace", "trace.perfetto.json")
INPUT_PREFIX = "input."
TABLE_PREFIX = "table."
#: the bundle's Perfetto file is trimmed at this size (with a note saying what was cut)
PERFETTO_CAP_MB = 1000.0


class BundleError(EmulatorError):
    """The bundle directory cannot be used (exit status 2: bad input)."""


def _ours(p: Path) -> bool:
    return p.is_file() and (p.name in BUNDLE_FILES or p.suffix == ".png" or p.name.startswith((INPUT_PREFIX, TABLE_PREFIX)))


def prepare_bundle(plan) -> "Bundle":
    """Make ``plan.out_dir`` ready for this run: created, writable, emptied of an earlier run's files."""
    d = plan.out_dir
    if d.exists() and not d.is_dir():
        raise BundleError(f"--out {d}: exists and is not a directory")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BundleError(f"--out {d}: cannot create the bundle directory ({e.strerror})") from None
    if not os.access(d, os.W_OK | os.X_OK):
        raise BundleError(f"--out {d}: the bundle directory is not writable")
    entries = list(d.iterdir())
    foreign = [p.name for p in entries if not _ours(p)]
    if foreign:
        raise BundleError(f"--out {d}: holds files that are not from an emu run ({', '.join(sorted(foreign)[:5])}"
                          f"{', ...' if len(foreign) > 5 else ''}); choose a new or empty directory")
    for p in entries:      # an earlier run's bundle: start clean
        p.unlink()
    return Bundle(d)


def check_trace_path(path: str) -> None:
    """An explicit trace file (``--trace``, ``trace.path``) must be writable: say so before the run."""
    p = Path(path)
    if p.is_dir():
        raise BundleError(f"trace file {p}: is a directory")
    parent = p.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BundleError(f"trace file {p}: cannot create its directory ({e.strerror})") from None
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise BundleError(f"trace file {p}: not writable")


class Bundle:
    def __init__(self, directory: Path):
        self.dir = directory

    def write(self, plan, outcome, *, step=None) -> None:
        """Write the bundle of a finished (or stopped) run; ``step(name)`` announces each slow step."""
        d, sc, res = self.dir, plan.scenario, outcome.res
        with open(d / "scenario.yaml", "w") as f:
            yaml.safe_dump(runnable_scenario(sc, d), f, sort_keys=False)
        with open(d / "scenario.resolved.yaml", "w") as f:
            yaml.safe_dump(sc.resolved(), f, sort_keys=False)
        system, result = outcome.system, outcome.result
        if system is not None and result is not None:
            end = result.end_time_ps
            _csv(d / "actors.csv", energy_columns(system.actor_metrics(end), "actor", outcome.energy))
            _csv(d / "links.csv", energy_columns(system.link_metrics(end), "link", outcome.energy))
        for title, rows in (res.get("tables") or {}).items():   # every table the run printed, as a CSV
            if rows:
                _csv(d / f"{TABLE_PREFIX}{table_slug(title)}.csv", [{k: _cell(v) for k, v in r.items()} for r in rows])
        power = None
        if (outcome.energy is not None and (plan.plots or plan.trace_requested) and outcome.trace_path
                and Path(outcome.trace_path).exists()):   # asked for plots or Perfetto: the power profile too
            power = run_power(outcome.energy, outcome.trace_path, result.end_time_ps)
            write_power(d, power, res)
        if outcome.state is not None:               # the state snapshot at --stop-at (emulator/snapshot.py)
            with open(d / "state.json", "w") as f:
                json.dump(outcome.state, f, indent=1)
            res["state"]["file"] = "state.json"
        if result is not None and result.faults:   # every injection; result.json holds the per-fault summary
            with open(d / "faults.json", "w") as f:
                json.dump(result.faults, f, indent=None)
        trace_path = outcome.trace_path
        if trace_path and plan.trace_requested and Path(trace_path).resolve().parent == d.resolve():
            if step:
                step("trace.pftrace")
            from emulator.trace import TraceStream
            from tools.trace.perfetto import export_perfetto
            stats = export_perfetto(TraceStream(trace_path, payloads=False, allow_truncated=True),
                                    str(d / "trace.pftrace"), max_mb=PERFETTO_CAP_MB, trim=True, fmt="proto",
                                    power=power)
            res["perfetto"] = {"file": "trace.pftrace", "bytes": stats.bytes, "trace_events": stats.events,
                               "trimmed": stats.cut_note(PERFETTO_CAP_MB) or None}
            if stats.trimmed:
                outcome.notes.append(f"trace.pftrace {stats.cut_note(PERFETTO_CAP_MB)} (emu trace perfetto "
                                     "--start/--end/--actors exports a window of it whole)")
        if plan.plots and system is not None and result is not None:
            if step:
                step("plots")
            from tools.run.plots import make_plots
            make_plots(d, system, result, trace_path)
            if power is not None:
                from tools.run.plots import plot_power
                plot_power(d / "power.png", power, sc.name)
            if res.get("per_request"):
                from tools.run.plots import plot_requests
                plot_requests(d / "requests.png", res["per_request"], sc.name)
        with open(d / "result.json", "w") as f:       # last: a bundle with result.json is complete
            json.dump(res, f, indent=1)


def runnable_scenario(scenario, bundle_dir: Path) -> dict:
    """The scenario as run, self-contained: the files it names (the machine profile with its ``extends:``
    chain, workload input files) are copied into ``bundle_dir`` and named relative to it, so the bundle
    runs the same after ``cp -r`` anywhere (and does not change when the original files do)."""
    from emulator.scenario import read_profile

    src = json.loads(json.dumps(scenario.source, default=str))
    base = Path(scenario.file).resolve().parent
    machine = src.setdefault("machine", {})
    if scenario.profile_file:
        flat = read_profile(Path(scenario.profile_file), roots=scenario.input_roots or None).value   # extends: merged
        with open(bundle_dir / "profile.yaml", "w") as f:
            f.write(f"# machine profile {scenario.profile_name!r} as the run read it ({scenario.profile_file},\n"
                    "# extends: merged in); the scenario's machine.overrides apply on top\n")
            yaml.safe_dump(flat, f, sort_keys=False)
        machine["profile"] = "profile.yaml"
    params = (src.get("workload") or {}).get("params") or {}
    for key, value in params.items():
        if isinstance(value, str) and (base / value).is_file():
            try:   # only a file under the scenario's input roots (emulator/input_paths.py): never ../../etc/passwd
                path = confined_file([base / value], f"workload.params.{key}", value, scenario.input_roots)
            except BuildError:
                continue
            name = INPUT_PREFIX + Path(value).name
            for src_file, dst_name in _with_ranks(path, name):
                if admits(scenario.input_roots, src_file.resolve()):    # a rank file linked out of the tree: not
                    shutil.copyfile(src_file, bundle_dir / dst_name)
            params[key] = name
    src.pop("inputs_root", None)    # the bundle holds its files: it is confined to its own folder
    src.setdefault("name", scenario.name)
    return src


def _with_ranks(path: Path, name: str) -> list[tuple[Path, str]]:
    """``path`` copied as ``name``; a Chakra rank-0 file ``PREFIX.0.et`` brings its other ranks ``PREFIX.1.et``,
    ... along (the ``chakra`` workload names only rank 0's file)."""
    out = [(path, name)]
    if path.name.endswith(".0.et"):
        stem, r = path.name[:-len(".0.et")], 1
        while (path.parent / f"{stem}.{r}.et").is_file():
            out.append((path.parent / f"{stem}.{r}.et", f"{name[:-len('.0.et')]}.{r}.et"))
            r += 1
    return out


def table_slug(title: str) -> str:
    """A printed table's title as a file-name part: ``gqa requests, all`` -> ``gqa-requests-all``."""
    return "-".join("".join(c if c.isalnum() else " " for c in title.lower()).split())


def _cell(v):
    return json.dumps(v) if isinstance(v, (dict, list)) else v


def _csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        if not rows:
            return
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
