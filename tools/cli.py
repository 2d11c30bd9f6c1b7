"""``emu``: the one command of the emulator.

Subcommands: ``run``, ``validate``, ``explain``, ``trace`` (perfetto, summary,
diff, replay), ``sweep``, ``bench``, ``profile`` and ``whatif`` (tools/explain/).  Errors a user can cause (a bad scenario, a model
error, a deadlock) are printed as clear messages with a non-zero exit status,
never as a traceback; ``--debug`` shows the traceback too.

Exit status, the same table for every subcommand (docs/exit-codes.md):
0 finished / ok, 1 model or tool error (``trace diff``: differ, ``trace replay``:
diverges), 2 bad input (scenario, usage, a missing or corrupt input file, an
unusable ``--out``), 3 deadlock, 4 virtual time limit reached, 5 wall-clock guard
fired, 6 workload actors killed by a fault (the workload did not complete),
130 interrupted (Ctrl-C or SIGTERM).  Output into a closed pipe
(``emu trace summary T | head -1``) ends quietly with status 0.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from emulator.errors import BuildError, EmulatorError
from emulator.schema import Problem, SchemaError
from emulator.units import format_time
from emulator.input_paths import add_allow_path_argument
from tools.table import format_table

__all__ = ["main"]


def _load(path: str, sets, allow=()):
    """The scenario at ``path``; a relative path missing here is looked up in the emulator's own tree (said).
    ``allow``: the ``--allow-path`` folders (emulator/input_paths.py)."""
    from actors import registry
    from emulator.scenario import load_scenario, scenario_path

    found = scenario_path(path)
    if str(found) != str(path):
        print(f"note: {path} is not in this directory; using the emulator's own {found}", file=sys.stderr)
    return load_scenario(str(found), registry, sets, allow=allow)


def cmd_schema(args) -> int:
    """Print the scenario format, and with a scenario, its machine profile's and workload's schemas."""
    from emulator.faults import FAULT_SCHEMA
    from emulator.scenario import SCENARIO_SCHEMA
    from emulator.schema import describe_schema

    print("scenario file:")
    print("\n".join("  " + line for line in describe_schema(SCENARIO_SCHEMA)))
    print("each entry of faults:")
    print("\n".join("  " + line for line in describe_schema(FAULT_SCHEMA)))
    if args.scenario:
        from actors import registry

        from tools.run.components import describe_components, family_components, scenario_schema, schema_notes

        sc = _load(args.scenario, args.set, args.allow_path)
        family = registry.family(sc.family)
        classes = family_components(family)
        schema = scenario_schema(family.PROFILE_SCHEMA, family.WORKLOADS[sc.workload].params)
        print(f"machine profile (family {sc.family}):")
        print("\n".join("  " + line for line in describe_schema(family.PROFILE_SCHEMA,
                                                                  notes=schema_notes(classes, schema))))
        for name, wl in family.WORKLOADS.items():
            print(f"workload {name}: {wl.summary}")
            print("\n".join("  " + line for line in describe_schema(wl.params)))
        print(f"components (family {sc.family}, their declared ports and parameters):")
        print("\n".join("  " + line for line in describe_components(classes, schema)))
    return 0


def cmd_validate(args) -> int:
    if args.schema:
        return cmd_schema(args)
    if not args.scenario:
        print("emu validate: give a scenario file (or --schema)", file=sys.stderr)
        return 2
    from tools.sweep.spec import looks_like_sweep
    if looks_like_sweep(args.scenario):
        from tools.sweep.command import validate_sweep
        return validate_sweep(args.scenario, args.allow_path)
    sc = _load(args.scenario, args.set, args.allow_path)
    from tools.run.runner import build_system   # every check short of running: build, resolve fault targets
    system, _ = build_system(sc)
    print(f"{args.scenario}: ok (machine {sc.profile_name} [{sc.family}], workload {sc.workload}, "
          f"mode {sc.mode}, seed {sc.seed}, {len(system.actors)} actors, {len(system.links)} links, "
          f"{len(sc.faults)} fault(s))")
    from emulator.faults import describe_matches
    for line in describe_matches(system.fault_plan, limit=3):
        print("  " + line)
    return 0


def _classes(system) -> dict:
    """The component classes of a built system, each with its first actor, in the order they were added."""
    out: dict = {}
    for a in system.actors.values():
        out.setdefault(type(a), a)
    return out


def cmd_explain(args) -> int:
    from tools.run.components import components_json, describe_components, scenario_schema
    from tools.run.runner import build_system

    sc = _load(args.scenario, args.set, args.allow_path)
    system, _ = build_system(sc)
    if args.faults:
        from emulator.faults import describe_matches
        print("\n".join(describe_matches(system.fault_plan, limit=10**9) or ["no faults"]))
        return 0
    if args.json:
        print(json.dumps({
            "scenario": sc.name, "profile": sc.profile, "workload": {"kind": sc.workload, "params": sc.params},
            "actors": {a.name: a.describe() for a in system.actors.values()},
            "links": [l.describe() for l in system.links],
            "components": components_json(_classes(system)),
            "uncertainty": {k: vars(d) for k, d in sc.uncertainty.items()},
        }, indent=1, default=str))
        return 0
    print(f"scenario {sc.name}: machine {sc.profile_name} ({sc.profile_file}), workload {sc.workload}, "
          f"mode {sc.mode}, seed {sc.seed}")
    from actors import registry
    from emulator.schema import with_units

    fam = registry.family(sc.family)
    print("machine parameters:")
    for k, v in with_units(fam.PROFILE_SCHEMA, sc.profile).items():
        print(f"  {k}: {_flow(v)}")
    from tools.run.energy import explain_energy
    for line in explain_energy(sc, fam.PROFILE_SCHEMA):
        print(line)
    from tools.explain.interval import explain_uncertainty
    for line in explain_uncertainty(sc):
        print(line)
    print("workload parameters:")
    for k, v in with_units(fam.WORKLOADS[sc.workload].params, sc.params).items():
        print(f"  {k}: {_flow(v)}")
    print(f"actors ({len(system.actors)}):")
    for a in system.actors.values():
        d = a.describe()
        extra = " ".join(f"{k}={v}" for k, v in d.items() if k not in ("type", "inputs", "outputs"))
        print(f"  {a.name} [{d['type']}] in={','.join(d['inputs'])} out={','.join(d['outputs'])} {extra}")
    print(f"components ({len(_classes(system))} classes: declared ports and parameters, emulator/declare.py):")
    schema = scenario_schema(fam.PROFILE_SCHEMA, fam.WORKLOADS[sc.workload].params)
    print("\n".join("  " + line for line in describe_components(list(_classes(system)), schema, sc.profile, sc.params,
                                                                  _classes(system))))
    print(f"links ({len(system.links)}):")
    for l in system.links:
        print(f"  {l.name}: capacity {l.capacity}, latency {format_time(l.latency)}, "
              f"bandwidth {f'{l.bandwidth / 1e9:g} GB/s' if l.bandwidth else 'unlimited'}")
    return 0


def _flow(v) -> str:
    """A value as YAML flow text (``{latency: 20ns, capacity: 2}``), as a profile would write it."""
    if isinstance(v, (dict, list)):
        import yaml
        return yaml.safe_dump(v, default_flow_style=True, sort_keys=False, width=10**6).strip()
    return str(v)


def energy_line(en: dict) -> str:
    """One line of a run's energy (docs/energy.md): joules, work per joule, average power, the split."""
    from emulator.energy import CATEGORIES

    per = next((k[:-len("s_per_j")] for k in en if k.endswith("s_per_j")), None)
    what = (en.get("per_unit") or {}).get("what")          # what one unit is (a token of one layer, ...)
    rate = (f" ({en[per + 's_per_j']:.4g} {per}/J{', ' + what if what else ''})"
            if per and en.get(per + "s_per_j") else "")
    split = ", ".join(f"{c} {en['split_pct'][c]:.1f}%" for c in CATEGORIES)
    caveat = f" ({en['caveat']})" if en.get("caveat") else ""
    return f"{_joules(en['total_j'])}{rate}, avg {en['avg_power_w']:.4g} W: {split}{caveat}"


def _joules(j: float) -> str:
    for unit, scale in (("J", 1), ("mJ", 1e-3), ("uJ", 1e-6), ("nJ", 1e-9)):
        if j >= scale:
            return f"{j / scale:.4g} {unit}"
    return f"{j / 1e-12:.4g} pJ"


def _summary(res: dict) -> str:
    lines = [f"{res['scenario']}: {res['status']}"]
    lines.append(f"  end time       {format_time(res['end_time_ps'])} ({res['end_time_ps']} ps)")
    lines.append(f"  messages       {res['messages']}")
    lines.append(f"  events         {res['events']}")
    lines.append(f"  wall           {res['wall_s']:.3f} s ({res['events_per_s']:,.0f} events/s)")
    lines.append(f"  digest         {res['digest']}")
    if res.get("trace"):
        lines.append(f"  trace          {res['trace']}")
    if res.get("energy"):
        lines.append(f"  energy         {energy_line(res['energy'])}")
    for key in ("max_abs_err", "max_rel_err"):
        if key in res:
            lines.append(f"  {key:<14} {res[key]:.3g}")
    for f in res.get("faults") or []:
        fired = (f"{f['injected']} injection(s) on {len(f['by_target'])} of {f['matched']} target(s)"
                 if f["fired"] else f"never fired ({f['matched']} target(s) matched)")
        lines.append(f"  fault          {f['fault']} ({f['kind']}): {fired}")
    if res.get("state"):
        st = res["state"]
        states = ", ".join(f"{n} {k}" for k, n in sorted(st["states"].items(), key=lambda kv: -kv[1]))
        lines.append(f"  stopped at     {format_time(st['t_ps'])}: {states or 'every actor at rest'}; "
                     f"{st['messages_in_flight']} message(s) in flight; state digest {st['state_digest']}")
        if st.get("condition"):
            lines.append(f"  stopped on     {st['condition']['text']}: {st['condition']['matched']}")
    if res.get("bundle"):
        lines.append(f"  bundle         {res['bundle']}")
    if res.get("limits"):
        lines.append(f"  limits         {res['limits']['line']}")
    for name, rows in (res.get("tables") or {}).items():
        lines.append("")
        lines.append(format_table(name, rows))
    return "\n".join(lines)


def cmd_run(args) -> int:
    from tools.run.runner import execute, plan_run

    sc = _load(args.scenario, args.set, args.allow_path)
    stop_at = _time_option("--stop-at", args.stop_at)
    stop_on = None
    if args.stop_on is not None:
        from emulator.stop_condition import parse_condition
        stop_on = parse_condition(args.stop_on)
    plan = plan_run(sc, out=args.out, bundle=not args.no_bundle, trace_path=args.trace,
                    plots=True if args.plots else None, stop_at=stop_at,
                    checkpoint_every=_time_option("--checkpoint-every", args.checkpoint_every), stop_on=stop_on)
    from tools.run.bundle import check_trace_path, prepare_bundle

    bundle = None
    if plan.out_dir is not None:
        bundle = prepare_bundle(plan)          # before the run: an unusable --out is an error now
    if plan.trace is not None:
        check_trace_path(plan.trace.path)
    if not args.quiet:
        for note in plan.notes:
            print(f"note: {note}", file=sys.stderr)
    progress = None
    if sys.stderr.isatty() and not args.json and not args.quiet:
        from tools.run.progress import Progress
        progress = Progress(sys.stderr)

    def finish(outcome) -> int:
        if progress is not None:
            progress.close()
        return _report_run(args, plan, bundle, outcome)

    try:
        outcome = execute(plan, progress=progress, finish=finish)
    except BaseException:
        if progress is not None:
            progress.close()
        raise
    return finish(outcome)


def _time_option(option: str, text: str | None) -> int | None:
    """A time option (``--stop-at``) as integer picoseconds (a time with its unit: ``2.3us``), else a usage
    error naming the option."""
    if text is None:
        return None
    from emulator.units import UnitError, parse_time
    try:
        t = parse_time(text)
    except (UnitError, ValueError) as e:
        raise SchemaError([Problem("emu run", None, option, "a time with a unit, like 2.3us or 500ns", repr(text))]) \
            from e
    if t <= 0:
        raise SchemaError([Problem("emu run", None, option, "a time after 0", repr(text))])
    return t


def _report_run(args, plan, bundle, outcome) -> int:
    """Write the bundle and print the outcome of ``emu run``; returns the exit status."""
    from tools.run.runner import EXIT_CODES

    res = outcome.res
    chatty = not args.json and not args.quiet
    if bundle is not None:
        from tools.run.progress import step_announcer
        res["bundle"] = str(bundle.dir)
        bundle.write(plan, outcome, step=step_announcer(sys.stderr) if chatty else None)
    if args.json:
        print(json.dumps(res, indent=None if args.compact else 1))
    else:
        print(_summary(res))
        if outcome.result is not None and outcome.result.deadlock is not None:
            print(str(outcome.result.deadlock), file=sys.stderr)
        if res.get("error"):
            print(f"error: {res['error']}", file=sys.stderr)
        if res.get("stopped_in"):
            print(f"{res['status']} during {res['stopped_in']}: partial result", file=sys.stderr)
    if not args.quiet:
        for note in outcome.notes[len(plan.notes):]:
            print(f"note: {note}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    if plan.stop_at is not None and outcome.state is None and res["status"] == "finished":
        print(f"error: --stop-at {format_time(plan.stop_at)}: the run finished at {format_time(res['end_time_ps'])}, "
              "before it: no state to show (its bundle is the whole run's)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if plan.stop_on is not None and outcome.state is None and res["status"] == "finished":
        print(f"error: --stop-on {plan.stop_on.text!r} never happened: the run finished at "
              f"{format_time(res['end_time_ps'])} (its bundle is the whole run's)", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_CODES.get(res["status"], 1)


def cmd_bench(args) -> int:
    from tools.bench.command import bench_engine, bench_machine

    if args.what == "machine":
        return bench_machine(json_out=args.json, repeats=args.repeats, full=args.full)
    if args.what != "engine":
        print(f"emu bench: unknown benchmark {args.what!r} (known: engine, machine)", file=sys.stderr)
        return 2
    return bench_engine(json_out=args.json, repeats=args.repeats, scale=args.scale)


def cmd_trace(args) -> int:
    from tools.trace import command as trace_tools

    return trace_tools.main(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="emu", description="Actor-based emulator of AI accelerators.")
    p.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="cmd", required=True)

    from tools.cli_help import add_help_command, add_set_argument, finish

    r = sub.add_parser("run", help="run a scenario", description="Run a scenario: build the machine, run the "
                       "workload on virtual time, check it, print the summary and write the result bundle "
                       "(docs/outputs.md).")
    r.add_argument("scenario", help="the scenario file (a relative path missing here is looked up in the "
                   "emulator's own scenarios/)")
    add_set_argument(r)
    add_allow_path_argument(r)
    r.add_argument("--json", action="store_true", help="print the result as one JSON object")
    r.add_argument("--compact", action="store_true", help="with --json: on one line")
    r.add_argument("--out", help="result bundle directory (default: runs/<scenario name>)")
    r.add_argument("--no-bundle", action="store_true", help="write no result bundle")
    r.add_argument("--trace", metavar="FILE", help="write the binary trace to FILE, whatever its size (default: "
                   "the bundle's trace.emutrace, kept up to 256 MB; docs/trace-format.md)")
    r.add_argument("--plots", action="store_true", help="also write PNG plots into the bundle (utilisation, "
                   "queues, power, requests)")
    r.add_argument("--quiet", action="store_true", help="no progress display and no notes on stderr")
    r.add_argument("--stop-at", metavar="TIME", help="break the run at this virtual time (a time with a unit: "
                   "2.3us) and write the machine's state there into the bundle (state.json; emu inspect BUNDLE); "
                   "default: run to the end")
    r.add_argument("--stop-on", metavar="CONDITION", help="break the run at the end of the time step where "
                   "CONDITION first happens and write the state there, as --stop-at: 'send KIND [on LINKGLOB]', "
                   "'deliver KIND [on LINKGLOB]', 'busy ACTORGLOB [LABELGLOB]', 'done ACTORGLOB', "
                   "'fault [TARGETGLOB]', 'mark NAME [on ACTORGLOB]', each with an optional #N (the N-th); "
                   "docs/outputs.md; default: none")
    r.add_argument("--checkpoint-every", metavar="TIME", help="record the trace digest at every multiple of this "
                   "virtual time in result.json (checkpoints), so emu bisect A B finds where two runs part; "
                   "default: none")
    r.set_defaults(func=cmd_run)

    v = sub.add_parser("validate", help="check a scenario without running it (--schema: print the format)",
                       description="Check a scenario or sweep file and build its machine without running it; "
                       "--schema prints the scenario format and every parameter with its default.")
    v.add_argument("scenario", nargs="?", help="the scenario or sweep file (with --schema: optional, adds its "
                   "profile's and workloads' parameters)")
    v.add_argument("--schema", action="store_true",
                   help="print the scenario format (and, with a scenario, its profile's and workloads' parameters)")
    add_set_argument(v)
    add_allow_path_argument(v)
    v.set_defaults(func=cmd_validate)

    e = sub.add_parser("explain", help="print the resolved machine: actors and links with their parameters",
                       description="Print the resolved machine of a scenario: its parameters with their units, "
                       "the energy coefficients, every actor and link, each component class's declared ports "
                       "and parameters (docs/components.md).")
    e.add_argument("scenario", help="the scenario file")
    add_set_argument(e)
    e.add_argument("--json", action="store_true", help="print the same as one JSON object")
    e.add_argument("--faults", action="store_true", help="list what each fault's target glob matches")
    add_allow_path_argument(e)
    e.set_defaults(func=cmd_explain)

    b = sub.add_parser("bench", help="benchmarks (engine: emulator vs SimPy on the same model; machine: AHBM/pccx)",
                       description="Benchmarks, measured as ratios against a peer in the same run: engine (the "
                       "emulator against SimPy on the same three models), machine (AHBM and pccx runs per CPU "
                       "second).")
    b.add_argument("what", choices=["engine", "machine"], help="engine or machine")
    b.add_argument("--json", action="store_true", help="print the table as JSON")
    b.add_argument("--repeats", type=int, default=5, help="runs of each workload; the best is kept")
    b.add_argument("--scale", type=float, default=1.0, help="multiply workload sizes")
    b.add_argument("--full", action="store_true", help="machine: also the 128-rank decode on 4 SIPs, the Llama3-70B 8K Ring prefill and 128K decode (once each)")
    b.set_defaults(func=cmd_bench)

    from tools.trace import compare
    from tools.sweep import command as sweep
    from tools.trace import command as trace_tools
    trace_tools.add_parser(sub)
    compare.add_parser(sub)
    sweep.add_parser(sub)
    from tools.robust import campaign
    from tools import pccx_cli
    campaign.add_parser(sub)   # emu faults campaign
    pccx_cli.add_parser(sub)   # pccx-specific subcommands
    from tools.explain import profile as explain_profile
    explain_profile.add_parser(sub)   # emu profile (tools/explain/)
    from tools.explain import whatif
    whatif.add_parser(sub)            # emu whatif
    from tools.explain import interval
    interval.add_parser(sub)          # emu interval: the spread from the profile's declared uncertainty
    from tools.explain import calibrate
    calibrate.add_parser(sub)         # emu calibrate: fit declared parameters to observed figures, held-out error
    add_help_command(sub, p)          # emu help [TOPIC]
    from tools.run import inspect as inspect_state
    inspect_state.add_parser(sub)     # emu inspect: the state where --stop-at stopped a run
    from tools.trace import bisect
    bisect.add_parser(sub)            # emu bisect: the first checkpoint interval where two runs part
    from tools.run import fork
    fork.add_parser(sub)              # emu fork: re-run to a time, change something, compare the futures
    finish(p)                         # the help layout and every command's examples (tools/cli_help.py)
    return p


EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
#: OSErrors about a file the user named: bad input, not a tool failure
_BAD_PATH = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def _version() -> str:
    from emulator import __version__

    return f"emu {__version__} (python {sys.version.split()[0]})"


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:          # argparse: usage errors exit 2, --help/--version 0
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    try:
        return _dispatch(args)
    except BrokenPipeError:
        # the reader went away (emu trace summary T | head -1): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


def _dispatch(args) -> int:
    from tools.run.bundle import BundleError

    try:
        return args.func(args)
    except (SchemaError, BuildError, BundleError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except EmulatorError as e:
        if args.debug:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        raise
    except (ValueError, *_BAD_PATH) as e:   # a missing, corrupt or unreadable input file, a bad value
        if args.debug:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as e:
        if args.debug:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
