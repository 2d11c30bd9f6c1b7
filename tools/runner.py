"""Scenario -> built system -> run -> result: the path every ``emu run`` takes.

``build_system`` asks the machine family (``actors.registry``) to build the
workload's actors and links, installs the scenario's faults, and configures the
trace.  ``run_scenario`` runs it and assembles the result dictionary printed by
``emu run --json`` and written to ``result.json``.  A workload's ``check()`` may
return ``error`` (the machine ran to the end but the workload failed, e.g. a
halted driver): the result's status is then ``error``.
"""
from __future__ import annotations

import resource
import time
from pathlib import Path

import numpy as np

from actors import registry
from emulator.faults import install_faults
from emulator.scenario import Scenario
from emulator.system import RunResult, System, versions
from emulator.trace import TraceOptions

__all__ = ["build_system", "run_scenario", "default_out_dir", "jsonable", "scenario_from_resolved", "EXIT_CODES"]

EXIT_CODES = {"finished": 0, "error": 1, "deadlock": 3, "time-limit": 4, "wall-timeout": 5, "killed": 6}


def default_out_dir(scenario: Scenario) -> Path:
    return Path(scenario.output.get("dir") or Path("runs") / scenario.name)


def build_system(scenario: Scenario, *, trace_path: str | None = None) -> tuple[System, object]:
    family = registry.family(scenario.family)
    workload = family.WORKLOADS[scenario.workload]
    topts = None
    t = scenario.trace
    if not trace_path and t.get("enabled"):
        trace_path = t.get("path")   # None: enabled, but no bundle to put it in (emu run --no-bundle)
    if trace_path:
        Path(trace_path).parent.mkdir(parents=True, exist_ok=True)
        topts = TraceOptions(path=str(trace_path), payloads=t.get("payloads", True),
                             kinds=set(t["kinds"]) if t.get("kinds") else None, actors=t.get("actors"),
                             links=t.get("links"))
    system = System(scenario.name, seed=scenario.seed, mode=scenario.mode, trace=topts, scenario=scenario.resolved())
    context = workload.build(system, scenario.profile, scenario.params)
    install_faults(system, scenario.faults)
    return system, workload.bind(context)


def scenario_from_resolved(d: dict) -> Scenario:
    """Rebuild a :class:`Scenario` from :meth:`Scenario.resolved` (e.g. a trace header's ``scenario_resolved``)."""
    m = d["machine"]
    return Scenario(file=d.get("file", "<trace>"), name=d["name"], description="", seed=d["seed"], mode=d["mode"],
                    profile_name=m["profile"], profile_file=m.get("profile_file", ""), family=m["family"],
                    profile=m["resolved"], workload=d["workload"]["kind"], params=d["workload"]["params"],
                    faults=d.get("faults") or [], trace=d.get("trace") or {}, stop=d.get("stop") or {},
                    output=d.get("output") or {}, source={})


def jsonable(x):
    """Reports may hold numpy values; make them JSON-friendly."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist() if x.size <= 64 else {"shape": list(x.shape), "dtype": str(x.dtype)}
    if isinstance(x, np.generic):
        return x.item()
    return x


def run_scenario(scenario: Scenario, *, trace_path: str | None = None, progress=None) -> tuple[dict, System, RunResult]:
    """Build and run; returns (result dict, system, RunResult)."""
    t0 = time.perf_counter()
    system, workload = build_system(scenario, trace_path=trace_path)
    build_s = time.perf_counter() - t0
    if progress is not None:
        system.on_step = progress
        progress.events = lambda: system.recorder.count + len(system.recorder.events)
    stop = scenario.stop or {}
    wall = stop.get("wall_timeout")
    result = system.run(until=stop.get("max_time"), wall_timeout=(wall / 1e12) if wall else None)
    checks = {}
    if workload.check is not None:
        checks = workload.check(system, scenario.profile, scenario.params, result) or {}
    status, error = result.status, result.error
    if status == "finished" and checks.get("error"):
        # the machine ran to the end but the workload failed (e.g. a halted driver)
        status, error = "error", checks.pop("error")
    out = {
        "scenario": scenario.name,
        "file": scenario.file,
        "status": status,
        "digest": result.digest,
        "seed": result.seed,
        "mode": scenario.mode,
        "end_time_ps": result.end_time_ps,
        "messages": result.messages,
        "events": result.events,
        "time_steps": result.time_steps,
        "wall_s": round(result.wall_s, 6),
        "build_s": round(build_s, 6),
        "events_per_s": round(result.events_per_s, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "actors": len(system.actors),
        "links": len(system.links),
        "reports": jsonable(result.reports),
        **jsonable(checks),
        "faults": jsonable(result.faults),
        "versions": versions(),
    }
    if result.deadlock is not None:
        out["deadlock"] = result.deadlock.as_dict()
    if error:
        out["error"] = error
    return out, system, result
