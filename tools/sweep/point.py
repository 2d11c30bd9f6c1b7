"""One sweep point, run in a worker process: resolved scenario in, result bundle and record out.

The worker rebuilds the scenario from its resolved form (no file access: a Ray
worker on another machine needs nothing but the task), runs it through the same
runner as ``emu run`` (tools.run.runner) and writes the usual result bundle.  Every
failure of the point -- a model error, a deadlock, a time limit, an exception in
the workload -- becomes the record's status; nothing escapes to stop the sweep.

``peak_rss_mib`` (the runner reads the process's peak resident memory) is the
point's own even in a reused worker process (Ray): the worker resets the
kernel's peak counter before the point (Linux ``/proc/self/clear_refs``, value
5; where that is not possible the figure is the worker's peak so far).
"""
from __future__ import annotations

import os
import tempfile
import time
import traceback
from pathlib import Path

import dataclasses

from tools.run.bundle import Bundle
from tools.run.runner import execute, plan_run, scenario_from_resolved

__all__ = ["run_point", "run_point_collect"]


def run_point(task: dict, directory: str) -> dict:
    """Run ``task`` (``resolved``, ``sets``, ``source``, ``timeout_ps``, ``plots``) writing its bundle in ``directory``.

    Returns ``{"result": <result.json dict>}``; never raises for a failure of the point itself.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _reset_peak_memory()
    t0 = time.perf_counter()
    try:
        sc = scenario_from_resolved(task["resolved"])
        # the bundle's scenario.yaml: a sweep point's base as written with its --set items applied, runnable by
        # itself (docs/outputs.md); a task of emu interval / whatif / calibrate (values set on the resolved form,
        # a bundle in a temporary folder) names its base and items instead
        sc.source = task.get("source") or {"base": task["resolved"].get("file"), "set": task["sets"]}
        sc.output = {**(sc.output or {}), "dir": str(d), "plots": bool(task.get("plots"))}
        if task.get("timeout_ps") and not (sc.stop or {}).get("wall_timeout"):
            sc.stop = {**(sc.stop or {}), "wall_timeout": task["timeout_ps"]}
        plan = plan_run(sc, out=str(d), plots=bool(task.get("plots")))
        if not sc.trace.get("enabled"):   # a sweep keeps traces only where the scenario asks for one
            plan = dataclasses.replace(plan, trace=None, trace_requested=False)
        outcome = execute(plan)
        res = outcome.res
        res["bundle"] = str(d)
        Bundle(d).write(plan, outcome)
    except Exception as e:  # noqa: BLE001 -- any failure of one point is that point's status
        res = {"status": "error", "error": f"{type(e).__name__}: {e}",
               "traceback": traceback.format_exc(limit=8), "wall_s": round(time.perf_counter() - t0, 6)}
    return {"result": res}


def _reset_peak_memory() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def run_point_collect(task: dict) -> dict:
    """:func:`run_point` in a temporary directory, returning the bundle's files too (for remote workers)."""
    with tempfile.TemporaryDirectory(prefix="emu-point-") as tmp:
        record = run_point(task, tmp)
        files = {}
        for root, _, names in os.walk(tmp):
            for name in names:
                p = Path(root) / name
                files[str(p.relative_to(tmp))] = p.read_bytes()
        record["files"] = files
    return record
