"""Result bundles: everything about one run in one directory.

``emu run`` writes, by default to ``runs/<scenario name>/`` (``--out DIR`` to
choose):

* ``scenario.yaml``  -- the scenario as written (after ``--set``) and, under
  ``resolved:``, with the machine profile merged in and every unit parsed;
* ``result.json``    -- status, digest, seed, metrics, checks, faults, versions,
  host speed (wall seconds, events/s, peak memory);
* ``actors.csv``, ``links.csv`` -- per-actor and per-link metrics;
* ``trace.emutrace`` -- the binary trace, when the scenario enables it, and
  ``trace.perfetto.json`` -- the same for ui.perfetto.dev (trimmed at 100 MB);
* ``*.png``          -- utilisation and link-bandwidth plots (from the trace
  when there is one, from the aggregate metrics otherwise).
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import yaml

from tools.runner import default_out_dir


class Bundle:
    def __init__(self, directory: Path):
        self.dir = directory
        self.trace_path = str(directory / "trace.emutrace")

    def write(self, scenario, res: dict, system, result, trace_path: str | None) -> None:
        d = self.dir
        with open(d / "scenario.yaml", "w") as f:
            yaml.safe_dump({"source": scenario.source, "resolved": scenario.resolved()}, f, sort_keys=False)
        with open(d / "result.json", "w") as f:
            json.dump(res, f, indent=1)
        if result.faults:   # every injection; result.json holds the per-fault summary
            with open(d / "faults.json", "w") as f:
                json.dump(result.faults, f, indent=None)
        end = result.end_time_ps
        _csv(d / "actors.csv", system.actor_metrics(end))
        _csv(d / "links.csv", system.link_metrics(end))
        have_trace = bool(trace_path) and Path(trace_path).exists()
        if have_trace:
            from emulator.trace import read_trace
            from tools.perfetto import export_perfetto
            export_perfetto(read_trace(trace_path), str(d / "trace.perfetto.json"), max_mb=100, trim=True)
        if scenario.output.get("plots", True):
            from tools.plots import make_plots
            make_plots(d, system, result, trace_path if have_trace else None)


def _csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        if not rows:
            return
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def prepare_bundle(scenario, out: str | None) -> Bundle:
    d = Path(out) if out else default_out_dir(scenario)
    d.mkdir(parents=True, exist_ok=True)
    return Bundle(d)
