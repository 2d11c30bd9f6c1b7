"""Scenario -> run plan -> built system -> run -> one final status: the path every ``emu run`` takes.

:func:`plan_run` decides, once, everything a run needs before it starts: the
machine family and workload, the bundle directory, where and what the binary
trace records, the virtual-time limit and the wall-clock guard.
:func:`execute` carries the plan out: it builds the machine, runs it under a
:class:`~emulator.interrupt.StopSwitch` (Ctrl-C, SIGTERM and the wall-clock
guard stop the build, the input generation and the run alike), runs the
workload's ``check()``, decides the final status once (:func:`final_status`)
and writes it both into the trace footer and into the result dictionary
printed by ``emu run --json`` and written to ``result.json``.

Status policy: a stop from outside (``interrupted``, ``wall-timeout``) wins;
otherwise the engine's status, except that a workload check reporting an
``error`` turns ``finished`` into ``error`` (the machine ran to the end but the
workload failed, e.g. a halted driver).  A run stopped while it ran gets a
partial result: virtual time reached, events, messages, ``stopped_in``
(``build``, ``run`` or ``check``), and what its workload's check can say of an
unfinished run (a kernel: the latency it has at least, the share of its work
done, its bound; checks see ``result.status`` and compare nothing against a
reference).  A partial check that fails is a note, not the run's error.
"""
from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from actors import registry
from emulator.declare import check_system
from emulator.errors import BuildError
from emulator.faults import install_faults
from emulator.interrupt import RunStopped, StopSwitch
from emulator.scenario import Scenario
from emulator.system import RunResult, System, building, versions
from emulator.trace import TraceOptions
from emulator.units import format_time
from tools.run.energy import report_energy, run_energy

__all__ = ["RunPlan", "RunOutcome", "plan_run", "execute", "final_status", "build_system", "run_scenario", "result_dict",
           "default_out_dir", "jsonable", "scenario_from_resolved", "EXIT_CODES", "EXIT_BAD_INPUT",
           "DEFAULT_WALL_TIMEOUT_S", "DEFAULT_TRACE_KEEP_MB"]

#: exit status of ``emu run`` per final status (docs/exit-codes.md has the table for every command)
EXIT_CODES = {"finished": 0, "stopped": 0, "error": 1, "deadlock": 3, "time-limit": 4, "wall-timeout": 5, "killed": 6,
              "interrupted": 130}
EXIT_BAD_INPUT = 2
#: the wall-clock guard when the scenario sets no ``stop.wall_timeout`` (``--set stop.wall_timeout=10h``)
DEFAULT_WALL_TIMEOUT_S = 3600.0
#: a trace the user did not ask for (the bundle's default trace) is kept up to this size
DEFAULT_TRACE_KEEP_MB = 256.0
STOPPED = ("interrupted", "wall-timeout")


def default_out_dir(scenario: Scenario) -> Path:
    return Path(scenario.output.get("dir") or Path("runs") / scenario.name)


@dataclass(frozen=True)
class RunPlan:
    """Everything decided before a run, once: read by the runner, the bundle and the CLI."""

    scenario: Scenario
    family: Any                      # the machine family's module (actors.registry)
    workload: Any                    # its registry.Workload
    out_dir: Path | None             # the result bundle, None for no bundle
    trace: TraceOptions | None       # where and what the binary trace records, None for no file
    trace_requested: bool            # the user asked for it: kept whatever its size, Perfetto JSON too
    max_time: int | None             # virtual-time limit (ps)
    wall_timeout_s: float | None     # wall-clock guard over build + run + check
    plots: bool
    notes: tuple = ()                # things the user should know about the plan
    stop_at: int | None = None       # break at this virtual time (ps) with a state snapshot (emu run --stop-at)
    checkpoint_every: int | None = None   # record the trace digest at every multiple of it (emu run --checkpoint-every)
    on_built: Any = None             # ``on_built(system)`` after the build, before the run (emu fork's hook)
    stop_on: Any = None              # an emulator.stop_condition.StopCondition (emu run --stop-on)


def _explicit(scenario: Scenario, *path) -> Any:
    """A value the scenario file (after ``--set``) states itself, None when it relies on the default."""
    node = scenario.source
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def plan_run(scenario: Scenario, *, out: str | None = None, bundle: bool = True, trace_path: str | None = None,
             plots: bool | None = None, stop_at: int | None = None, checkpoint_every: int | None = None,
             stop_on=None) -> RunPlan:
    """The plan of one run.

    Trace policy: ``trace_path`` (``--trace``) or the scenario's ``trace.path``
    wins; otherwise, with a bundle, the trace goes to ``<bundle>/trace.emutrace``
    unless the scenario says ``trace.enabled: false``.  A trace the scenario did
    not enable is the *default* trace: kept only up to :data:`DEFAULT_TRACE_KEEP_MB`
    (larger ones are deleted after the run, with a note) and exported to
    Perfetto JSON only on request.  Plots: ``plots`` (``--plots``) or the
    scenario's ``output.plots``; off by default (they cost more than most runs;
    ``emu trace ...`` works on the bundle's trace).
    """
    fam = registry.family(scenario.family)
    workload = fam.WORKLOADS[scenario.workload]
    t = scenario.trace
    out_dir = (Path(out) if out else default_out_dir(scenario)) if bundle else None
    enabled = _explicit(scenario, "trace", "enabled")
    path = trace_path or t.get("path")
    requested = bool(path) or enabled is True
    notes = [f"inputs_root: the files the scenario names may lie under {r}" for r, why in
             scenario.input_roots.items() if why == "inputs_root"]
    if not path and out_dir is not None and enabled is not False:
        path = str(out_dir / "trace.emutrace")
    if enabled and not path:
        notes.append("the scenario enables the trace but --no-bundle gives it no place: no trace file written "
                     "(use --trace FILE)")
    topts = None
    if path:
        topts = TraceOptions(path=str(path), payloads=t.get("payloads", True),
                             kinds=set(t["kinds"]) if t.get("kinds") else None, actors=t.get("actors"),
                             links=t.get("links"))
    stop = scenario.stop or {}
    wall = stop.get("wall_timeout")
    if plots is None:
        plots = bool(scenario.output.get("plots", False))
    max_time = stop.get("max_time")
    if stop_at is not None and max_time is not None and stop_at > max_time:
        notes.append(f"--stop-at {format_time(stop_at)} is past the scenario's stop.max_time "
                     f"{format_time(max_time)}: the run ends there, without a state snapshot")
    return RunPlan(scenario=scenario, family=fam, workload=workload, out_dir=out_dir, trace=topts,
                   trace_requested=requested, max_time=max_time,
                   wall_timeout_s=(wall / 1e12) if wall else DEFAULT_WALL_TIMEOUT_S, plots=bool(plots),
                   notes=tuple(notes), stop_at=stop_at, checkpoint_every=checkpoint_every, stop_on=stop_on)


def _build(plan: RunPlan) -> tuple[System, Any, Any]:
    """The built system, the workload bound to the context its ``build`` returned, and that context
    (docs/extending.md, "A workload")."""
    sc = plan.scenario
    if plan.trace is not None:
        Path(plan.trace.path).parent.mkdir(parents=True, exist_ok=True)
    with building():   # the cyclic GC paused while the machine is built (emulator/system.py)
        system = System(sc.name, seed=sc.seed, mode=sc.mode, trace=plan.trace, scenario=sc.resolved())
        if plan.stop_on is not None:
            plan.stop_on.install(system)    # taps the events: before the actors bind the emitter
        try:
            context = plan.workload.build(system, sc.profile, sc.params)
        except BuildError as e:   # "workload.params.C: ..." -> "file.yaml:9: workload.params.C: ..."
            raise BuildError(sc.locate(str(e))) from None
        check_system(system)   # ports and wiring against the components' declarations (emulator/declare.py)
        install_faults(system, sc.faults)
    return system, plan.workload.bind(context), context


def build_system(scenario: Scenario, *, trace_path: str | None = None) -> tuple[System, object]:
    """Build ``scenario``'s machine (no bundle), tracing to ``trace_path`` if given; returns (system, workload)."""
    system, workload, _ = _build(plan_run(scenario, bundle=False, trace_path=trace_path))
    return system, workload


def scenario_from_resolved(d: dict, input_roots: dict | None = None) -> Scenario:
    """Rebuild a :class:`Scenario` from :meth:`Scenario.resolved` (e.g. a trace header's ``scenario_resolved``).

    ``input_roots``: where the files it names may lie; give them for a recorded run (a trace, a bundle: its
    own folder, emulator/input_paths.py), whose recorded roots are not to be trusted.  None: the recorded
    ones (a sweep point resolved in this process)."""
    m = d["machine"]
    return Scenario(file=d.get("file", "<trace>"), name=d["name"], description="", seed=d["seed"], mode=d["mode"],
                    profile_name=m["profile"], profile_file=m.get("profile_file", ""), family=m["family"],
                    profile=m["resolved"], workload=d["workload"]["kind"], params=d["workload"]["params"],
                    faults=d.get("faults") or [], trace=d.get("trace") or {}, stop=d.get("stop") or {},
                    output=d.get("output") or {}, source={},
                    input_roots=input_roots if input_roots is not None else d.get("input_roots") or {})


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


@dataclass
class RunOutcome:
    """What :func:`execute` returns: the result dictionary and the objects behind it."""

    res: dict
    system: System | None            # None when stopped while building
    result: RunResult | None         # None when stopped while building
    trace_path: str | None           # the trace file written (with its footer), None for none
    notes: list = field(default_factory=list)
    context: Any = None              # what the workload's ``build`` returned (handed to its check)
    checks: dict = field(default_factory=dict)   # what the workload's check measured (also in ``res``)
    energy: Any = None               # the exact energy account (emulator/energy.py), None without a model
    state: dict | None = None        # the state snapshot at the plan's stop_at (emulator/snapshot.py)


def final_status(result: RunResult | None, checks: dict, stopped: str | None) -> tuple[str, str | None]:
    """The run's one final status and error text (see the module docstring); pops ``checks['error']``."""
    if stopped is not None:
        return stopped, None
    status, error = result.status, result.error
    if status == "finished" and checks.get("error"):
        status, error = "error", checks.pop("error")
    return status, error


def execute(plan: RunPlan, *, progress=None, finish=None) -> RunOutcome:
    """Build, run and check per ``plan``; the final status goes into the trace footer and the result.

    ``finish(outcome) -> exit status``: how the caller reports an outcome (print,
    bundle).  Given, it is also the last resort when a stop request finds the
    main thread stuck in one C call (:mod:`emulator.interrupt`): a watchdog
    thread reports the partial outcome and ends the process with that status.
    """
    sc = plan.scenario
    system = result = context = None
    checks: dict = {}
    phase = "build"
    t0 = time.perf_counter()
    build_s = 0.0
    snap: dict = {}

    def take_snapshot(reason: str) -> None:
        cond = plan.stop_on
        if cond is not None and cond.matched_at is None and plan.stop_at is None:
            return                           # the limit was stop.max_time's, not the condition's
        if reason == "time-limit":           # at the break (not at a deadlock or an error before it)
            from emulator.snapshot import snapshot, state_digest
            snap.update(snapshot(system))
            snap["state_digest"] = state_digest(snap)

    def stuck(reason: str) -> None:
        partial = system.stop_result(reason) if system is not None else None
        trace_path = plan.trace.path if partial is not None and plan.trace is not None else None
        res = result_dict(sc, system, partial, reason, None, {}, trace_path, time.perf_counter() - t0)
        res["stopped_in"] = phase
        os._exit(finish(RunOutcome(res=res, system=system, result=partial, trace_path=trace_path,
                                   notes=list(plan.notes))))

    with StopSwitch(plan.wall_timeout_s, on_stuck=stuck if finish is not None else None) as switch:
        try:
            system, workload, context = _build(plan)
            build_s = time.perf_counter() - t0
            phase = "run"
            if progress is not None:
                progress.attach(system, workload.progress and (lambda: workload.progress(system)))
            system.checkpoint_every = plan.checkpoint_every
            if plan.on_built is not None:
                plan.on_built(system)
            until = plan.max_time
            if plan.stop_at is not None and (until is None or plan.stop_at <= until):
                until = plan.stop_at
                system.on_decided = take_snapshot
            if plan.stop_on is not None:
                system.on_decided = take_snapshot
            with switch.soft(system.request_stop):
                result = system.run(until=until, footer=False,
                                    wall_timeout=None if switch.active else plan.wall_timeout_s)
            if snap and result.status == "time-limit":
                result.status = "stopped"          # the break asked for, not a guard's limit
            switch.check()
            if result.status not in STOPPED:
                phase = "check"
                if progress is not None:
                    progress.phase("check")
                if workload.check is not None:
                    checks = workload.check(system, sc.profile, sc.params, result) or {}
            switch.check()
        except RunStopped:
            pass
    stopped = switch.reason or (result.status if result is not None and result.status in STOPPED else None)
    notes = list(plan.notes)
    if stopped and phase == "run" and result is not None and workload.check is not None:
        result.status = stopped                     # what the check sees: the run did not finish
        try:
            checks = workload.check(system, sc.profile, sc.params, result) or {}
        except Exception as e:   # (an unfinished machine may lack what a check reads)
            notes.append(f"no partial metrics: the workload's check failed on the unfinished run "
                         f"({type(e).__name__}: {e})")
    if phase == "build" and stopped:
        build_s = time.perf_counter() - t0
    status, error = final_status(result, checks, stopped)
    trace_path = None
    if system is not None and result is not None:
        system.finish_trace(status, result.end_time_ps)
        trace_path = plan.trace.path if plan.trace is not None else None
    trace_path = _apply_trace_policy(plan, trace_path, notes)
    res = result_dict(sc, system, result, status, error, checks, trace_path, build_s)
    if stopped:
        res["stopped_in"] = phase
    if plan.checkpoint_every and system is not None:
        res["checkpoints"] = {"every_ps": plan.checkpoint_every, "marks": system.checkpoints}
    if snap:
        res["state"] = {"t_ps": snap["t_ps"], "state_digest": snap["state_digest"],
                        "trace_digest": snap["trace_digest"], "states": snap["states"],
                        "messages_in_flight": snap["messages_in_flight"]}
        if plan.stop_on is not None and plan.stop_on.matched_at is not None:
            snap["condition"] = res["state"]["condition"] = {"text": plan.stop_on.text,
                                                             "matched": plan.stop_on.matched,
                                                             "at_ps": plan.stop_on.matched_at}
    elif plan.stop_at is not None and result is not None and result.status not in ("time-limit",):
        notes.append(f"--stop-at {format_time(plan.stop_at)}: the run ended ({result.status}) at "
                     f"{format_time(result.end_time_ps)}, before it: no state snapshot")
    energy = None
    if result is not None:   # from the counters the run kept (docs/energy.md); never traced, digest unchanged
        energy, res["energy"] = run_energy(plan.family, system, sc.profile, sc.params, checks, result.end_time_ps)
        if energy is None:
            del res["energy"]
        else:
            report_energy(plan.family, res)   # e.g. tokens per joule in the Gemma 3N budget table
    if result is not None:   # what limits it: the bound's binding term, critical-path shares (tools/explain/limits.py)
        from tools.explain.limits import run_limits
        dropped = plan.trace is not None and trace_path is None and not plan.trace_requested   # the size policy
        res["limits"] = run_limits(sc, res, trace_path, context, trace_dropped=dropped)
    return RunOutcome(res=res, system=system, result=result, trace_path=trace_path, notes=notes, context=context,
                      checks=checks, energy=energy, state=snap or None)


def _apply_trace_policy(plan: RunPlan, trace_path: str | None, notes: list) -> str | None:
    if trace_path is None or plan.trace_requested or not os.path.exists(trace_path):
        return trace_path
    mb = os.path.getsize(trace_path) / 1e6
    if mb <= DEFAULT_TRACE_KEEP_MB:
        return trace_path
    os.remove(trace_path)
    notes.append(f"the default trace ({mb:.0f} MB) is larger than {DEFAULT_TRACE_KEEP_MB:g} MB and was not kept "
                 "(--set trace.enabled=true keeps it)")
    return None


def result_dict(scenario: Scenario, system, result, status, error, checks, trace_path, build_s: float = 0.0) -> dict:
    """The result.json dictionary of a run (docs/outputs.md); ``result`` None: stopped while building."""
    sc = scenario
    if result is not None:
        run = {"digest": result.digest, "seed": result.seed, "end_time_ps": result.end_time_ps,
               "messages": result.messages, "events": result.events, "time_steps": result.time_steps,
               "wall_s": round(result.wall_s, 6), "events_per_s": round(result.events_per_s, 1)}
    else:   # stopped while building: nothing ran
        run = {"digest": None, "seed": sc.seed, "end_time_ps": 0, "messages": 0, "events": 0, "time_steps": 0,
               "wall_s": 0.0, "events_per_s": 0.0}
    out = {
        "scenario": sc.name,
        "file": sc.file,
        "status": status,
        "digest": run["digest"],
        "seed": run["seed"],
        "mode": sc.mode,
        "end_time_ps": run["end_time_ps"],
        "messages": run["messages"],
        "events": run["events"],
        "time_steps": run["time_steps"],
        "wall_s": run["wall_s"],
        "build_s": round(build_s, 6),
        "events_per_s": run["events_per_s"],
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "actors": len(system.actors) if system is not None else 0,
        "links": len(system.links) if system is not None else 0,
        "reports": jsonable(result.reports) if result is not None else {},
        **jsonable(checks),
        "faults": jsonable(result.fault_summary) if result is not None else [],   # per fault; every
        "trace": trace_path,                                                       # injection: faults.json
        "versions": versions(),
    }
    if result is not None and result.deadlock is not None:
        out["deadlock"] = result.deadlock.as_dict()
    if error:
        out["error"] = error
    if result is not None and (len(result.errors) > 1 or result.more_errors):
        out["errors"] = result.errors
        out["more_errors"] = result.more_errors
    return out


def run_scenario(scenario: Scenario, *, trace_path: str | None = None, progress=None) -> tuple[dict, System, RunResult]:
    """Build and run without a bundle; returns (result dict, system, RunResult)."""
    outcome = execute(plan_run(scenario, bundle=False, trace_path=trace_path), progress=progress)
    return outcome.res, outcome.system, outcome.result
