"""``emu fork BUNDLE --at T``: re-execute a recorded run to ``T``, check that it is the same run there, change
something from ``T`` on, run to the end and compare the two futures.

Why re-execution: a run is deterministic (the same scenario and seed give the same events, byte for byte,
in any process), so running the bundle's own ``scenario.yaml`` again reaches exactly the recorded state
at ``T`` -- and the fork checks it rather than trusting it: the digest of the re-execution's events
before ``T`` must equal the digest of the recorded run's first as many events (its ``trace.emutrace``),
or, without a trace, its checkpoint at ``T`` (``emu run --checkpoint-every``).  A bundle whose scenario,
profile or code changed since it was recorded fails that check, with both digests.  (A true save and
restore of the running Trio tasks is not possible: a task's coroutine frames cannot be serialised, and
the ``tl`` kernels run in greenlets mid-call; re-execution to ``T`` costs the run's own time to ``T``.)

What can change from ``T`` on:

* ``--fault YAML`` / ``--delay YAML``: a fault of the scenario's fault syntax (docs/faults.md), as a YAML
  flow map (``{kind: drop, link: "...", ...}``; ``--delay`` is a fault of kind ``delay``); its ``start``
  defaults to ``T`` and may not be earlier.  The forked run is the scenario with that fault added: the
  prefix check also proves the fault changed nothing before ``T`` (a fault hook that switches an engine
  to another code path from time 0 is refused by it);
* ``--set machine.overrides.KEY=VALUE``: a machine parameter the family declares changeable mid-run (the
  AHBM family: HBM bandwidth and latency, DMA setup, GEMM fill/drain, MATH fixed cycles, CPU dispatch
  cycles -- actors/ahbm/params.py ``LIVE_FIELDS``; anything fixed at build, a clock, the wiring or the
  tiling, is refused naming the field).  It is applied at the start of time step ``T``: every service time
  computed from ``T`` on uses the new value.

``--variants FILE`` forks every variant of a YAML list (``{name, fault, delay, set}``) from the same time,
each in a worker of the sweep backends (tools/sweep/backends.py: the process pool, or Ray with
``--backend ray``; on a cluster of several hosts each fork's bundle stays on the host that ran it), and
prints one row per variant: status, end time, change, first divergence, bundle.

The comparison: end time, digests, the numeric metrics both runs report, and for each actor whose events
differ the first differing event (time, what each run did), earliest first.  The fork's own bundle (``--out``,
default ``runs/<scenario>-fork``) holds its result with a ``fork`` key (``at_ps``, ``changes``, ``prefix``,
``original``) and its trace.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import msgpack
import yaml

from emulator.trace import BLOCK, BUSY, DIGEST, DIGESTS, DONE, FAULT, MARK, SEND, TraceStream
from emulator.units import format_time

__all__ = ["add_parser", "main", "ForkError", "prefix_digest", "first_divergence_per_actor"]


class ForkError(ValueError):
    """A fork that cannot be made as asked (exit status 2): the message says why; nothing is written."""


def prefix_digest(trace_path: str, n: int) -> str:
    """The digest of a trace's first ``n`` events: the recorder's own hash (emulator/trace.py ``DIGESTS``,
    ``EMU_DIGEST``) over their msgpack bytes."""
    h = DIGESTS[DIGEST]()
    for i, ev in enumerate(TraceStream(trace_path)):
        if i >= n:
            break
        h.update(msgpack.packb(ev, use_bin_type=True))
    return h.hexdigest()


def _owners(header: dict) -> tuple[list, list]:
    """Per link index: (sender actor, receiver actor) names."""
    return [l["src"] for l in header["links"]], [l["dst"] for l in header["links"]]


def _by_actor(trace_path: str, from_event: int) -> tuple:
    """(actor name -> its events (payload-free tuples) from event index ``from_event`` on, the trace's reader)."""
    stream = TraceStream(trace_path, payloads=False)
    actors = stream.header["actors"]
    src, dst = _owners(stream.header)
    out: dict = {}
    for i, ev in enumerate(stream):
        if i < from_event:
            continue
        k = ev[0]
        if k in (BUSY, MARK, DONE):
            who = actors[ev[2]]
        elif k == FAULT:
            who = str(ev[2])
        elif k == SEND:
            who = src[ev[2]]
        else:                       # deliver, take, block: the receiving (or blocked sending) side
            who = src[ev[2]] if k == BLOCK else dst[ev[2]]
        out.setdefault(who, []).append(ev)
    return out, stream


def first_divergence_per_actor(a_path: str, b_path: str, from_event: int, limit: int = 10) -> list[dict]:
    """The actors whose events differ between two traces after their common prefix of ``from_event`` events,
    each with its first differing event in either run, earliest first (at most ``limit``)."""
    (a, ra), (b, rb) = _by_actor(a_path, from_event), _by_actor(b_path, from_event)
    rows = []
    for who in set(a) | set(b):
        ea, eb = a.get(who, []), b.get(who, [])
        i = next((j for j in range(min(len(ea), len(eb))) if ea[j] != eb[j]), None)
        if i is None and len(ea) == len(eb):
            continue
        i = min(len(ea), len(eb)) if i is None else i
        x, y = (ea[i] if i < len(ea) else None), (eb[i] if i < len(eb) else None)
        t = min(e[1] for e in (x, y) if e is not None)
        rows.append({"actor": who, "t_ps": t, "original": _describe(ra, x), "fork": _describe(rb, y)})
    rows.sort(key=lambda r: (r["t_ps"], r["actor"]))
    return rows[:limit]


def _describe(reader, ev) -> str:
    """An event in words, ids named (TraceHeader.describe), or the end of an actor's events."""
    return "(no more events)" if ev is None else reader.describe(ev)


def _faults(fault_texts, delay_texts, at: int) -> list[dict]:
    out = []
    for opt, text in [("--fault", t) for t in fault_texts] + [("--delay", t) for t in delay_texts]:
        try:
            f = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ForkError(f"{opt} {text!r}: not a YAML map ({e.problem})") from None
        if not isinstance(f, dict):
            raise ForkError(f"{opt} {text!r}: expected a YAML map like {{kind: delay, link: GLOB, delay: 5ns}}")
        if opt == "--delay":
            f.setdefault("kind", "delay")
        from emulator.units import parse_time
        start = f.get("start")
        if start is None:
            f["start"] = f"{at}ps"
        elif parse_time(start) < at:
            raise ForkError(f"{opt} {text!r}: start {start} is before the fork at {format_time(at)}: a fork changes "
                            "only what happens from its time on")
        out.append(f)
    return out


def _live_sets(sets, family, scenario_file: str, scenario, registry):
    """(changes, apply) for the --set options: each must be a machine parameter the family can change mid-run."""
    if not sets:
        return [], None
    bad = [s for s in sets if not s.startswith("machine.overrides.")]
    if bad:
        raise ForkError(f"--set {bad[0]}: a fork changes machine parameters (machine.overrides.KEY=VALUE) from "
                        "its time on; the workload and the rest of the scenario are fixed by its prefix")
    hook = getattr(family, "live_change", None)
    if hook is None:
        raise ForkError(f"--set {sets[0]}: the {scenario.family} family declares no parameter that can change "
                        "mid-run (faults can: --fault, --delay)")
    from emulator.scenario import load_scenario
    changed = load_scenario(scenario_file, registry, list(sets))
    try:
        fields, apply = hook(scenario.profile, changed.profile)
    except ValueError as e:
        raise ForkError(f"--set {' '.join(sets)}: {e}") from None
    return [{"set": s} for s in sets] + [{"fields": fields}], apply


def fork_run(bundle: str, at_text: str, *, faults=(), delays=(), sets=(), out: str | None = None):
    """One fork (module docstring): ``(original result, the fork's result with its fork key, the first
    divergent event per actor)``; a :class:`ForkError` for a fork that cannot be made, nothing written."""
    from actors import registry
    from emulator.scenario import load_scenario
    from tools.run.runner import execute, plan_run

    from emulator.input_paths import bundle_file
    bundle = Path(bundle)
    if not bundle.is_dir():
        raise ForkError(f"{bundle}: not a result bundle directory")
    scen_file, res_file = bundle_file(bundle, "scenario.yaml"), bundle_file(bundle, "result.json")
    if scen_file is None or res_file is None:
        raise ForkError(f"{bundle}: not a complete result bundle (scenario.yaml and result.json)")
    original = json.loads(res_file.read_text())
    from emulator.units import UnitError, parse_time
    try:
        at = parse_time(at_text)
    except (UnitError, ValueError):
        raise ForkError(f"--at {at_text!r}: expected a time with a unit, like 2.3us") from None
    if not 0 < at < original["end_time_ps"]:
        raise ForkError(f"--at {format_time(at)}: the recorded run lasts {format_time(original['end_time_ps'])}; "
                        "a fork time lies inside it")
    if original.get("status") not in ("finished", "stopped", "deadlock", "killed", "error"):
        raise ForkError(f"{bundle}: the recorded run ended {original.get('status')!r}: it cannot be re-executed "
                        "to a time")
    trace = bundle_file(bundle, "trace.emutrace") or bundle / "trace.emutrace"
    marks = (original.get("checkpoints") or {}).get("marks") or []
    every = (original.get("checkpoints") or {}).get("every_ps")
    if not trace.is_file() and not (every and at % every == 0):
        raise ForkError(f"{bundle}: the bundle has no trace and no checkpoint at {format_time(at)} to check the "
                        "re-execution against: record the run with its trace (the default bundle) or with "
                        "--checkpoint-every a divisor of the fork time")
    base = load_scenario(str(scen_file), registry)
    family = registry.family(base.family)
    faults = _faults(faults, delays, at)
    changes, apply = _live_sets(sets, family, str(scen_file), base, registry)
    sets = [f"faults={yaml.safe_dump(base.faults + faults, default_flow_style=True, width=10**9).strip()}"] \
        if faults else []
    forked = load_scenario(str(scen_file), registry, sets)
    prefix: dict = {}

    def at_fork(system) -> None:
        inner = system.on_step
        t0 = time.perf_counter()

        def on_step(t: int) -> None:
            if not prefix and t >= at:
                system.recorder.flush()
                prefix.update(events=system.recorder.count, digest=system.recorder.digest,
                              wall_s=round(time.perf_counter() - t0, 3))   # what re-executing to T cost
                if apply is not None:
                    apply(system)       # the new parameters: every service time computed from T on
            if inner is not None:
                inner(t)
        system.on_step = on_step

    out = Path(out) if out else Path("runs") / f"{base.name}-fork"
    if out.resolve() == bundle.resolve():
        raise ForkError(f"--out {out}: that is the original bundle; choose another directory")
    plan = dataclasses.replace(plan_run(forked, out=str(out), bundle=True), on_built=at_fork,
                               checkpoint_every=every)
    from tools.run.bundle import prepare_bundle
    bundle_out = prepare_bundle(plan)     # before the run (its trace goes there); emptied again on a refusal
    try:
        outcome = execute(plan)
        res = outcome.res
        if not prefix:
            raise ForkError(f"the re-executed run ended ({res['status']}) at {format_time(res['end_time_ps'])}, "
                            f"before {format_time(at)}: it is not the recorded run")
        if trace.is_file():
            recorded = prefix_digest(str(trace), prefix["events"])
            how = f"the recorded trace's first {prefix['events']:,} events"
        else:
            recorded = next((m["digest"] for m in marks if m["from_ps"] <= at <= m["t_ps"]), None)
            how = f"the recorded checkpoint at {format_time(at)}"
        if recorded != prefix["digest"]:
            raise ForkError(f"the re-execution is not the recorded run before {format_time(at)}: its events' "
                            f"digest {prefix['digest']} vs {recorded} ({how}); the bundle's scenario, profile or "
                            "the code changed since it was recorded, or a --fault changes the run before its start")
    except BaseException:
        prepare_bundle(plan)              # nothing written half: the refused fork's files go
        out.rmdir() if not any(out.iterdir()) else None
        raise
    res["bundle"] = str(out)
    res["fork"] = {"at_ps": at, "changes": [{"fault": f} for f in faults] + changes,
                   "prefix": {"events": prefix["events"], "digest": prefix["digest"], "checked_against": how,
                              "wall_s": prefix["wall_s"]},
                   "original": {"bundle": str(bundle), "end_time_ps": original["end_time_ps"],
                                "digest": original["digest"]}}
    bundle_out.write(plan, outcome)
    divergence = []
    if res["digest"] != original["digest"] and trace.is_file() and outcome.trace_path \
            and Path(outcome.trace_path).is_file():      # (equal digests: the same events, nothing to walk)
        divergence = first_divergence_per_actor(str(trace), outcome.trace_path, prefix["events"])
    res["fork"]["first_divergence"] = divergence
    (out / "result.json").write_text(json.dumps(res, indent=1))
    return original, res, divergence


def main(args) -> int:
    from tools.run.runner import EXIT_CODES

    if args.variants:
        return fan_out(args)
    original, res, divergence = fork_run(args.bundle, args.at, faults=args.fault, delays=args.delay,
                                         sets=args.set, out=args.out)
    if args.json:
        print(json.dumps(res["fork"] | {"end_time_ps": res["end_time_ps"], "digest": res["digest"],
                                        "status": res["status"]}, indent=1))
        return EXIT_CODES.get(res["status"], 1)
    print(_comparison(original, res, divergence))
    return EXIT_CODES.get(res["status"], 1)


def _variants(path: str) -> list[dict]:
    """The variants file: a YAML list of ``{name, fault: MAP or [MAP], delay: MAP or [MAP], set: TEXT or
    [TEXT]}``, each a fork from the same time; a clear error naming the entry otherwise."""
    from emulator.schema import read_text
    try:
        doc = yaml.safe_load(read_text(path))
    except yaml.YAMLError as e:
        raise ForkError(f"--variants {path}: not YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(doc, list) or not doc:
        raise ForkError(f"--variants {path}: expected a list of variants ({{name: ..., delay: {{...}}}}), found "
                        f"{type(doc).__name__}")
    out, names = [], set()
    for i, v in enumerate(doc):
        where = f"--variants {path}: entry {i}"
        if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not v["name"]:
            raise ForkError(f"{where}: expected a map with a name")
        name = v["name"]
        if not all(c.isalnum() or c in "-_." for c in name) or name in names:
            raise ForkError(f"{where}: name {name!r} must be unique, of letters, digits, -, _ and .")
        names.add(name)
        extra = set(v) - {"name", "fault", "delay", "set"}
        if extra:
            raise ForkError(f"{where} ({name}): unknown key {sorted(extra)[0]!r} (known: name, fault, delay, set)")
        as_list = lambda x: [] if x is None else x if isinstance(x, list) else [x]   # noqa: E731
        out.append({"name": name, "fault": [yaml.safe_dump(f, default_flow_style=True).strip()
                                            for f in as_list(v.get("fault"))],
                    "delay": [yaml.safe_dump(f, default_flow_style=True).strip() for f in as_list(v.get("delay"))],
                    "set": [str(x) for x in as_list(v.get("set"))]})
    return out


def _fork_point(task: dict) -> dict:
    """One variant of a fan-out, in a worker (a process of the pool or a Ray task): its summary."""
    try:
        original, res, div = fork_run(task["bundle"], task["at"], faults=task["fault"], delays=task["delay"],
                                      sets=task["set"], out=task["out"])
    except ForkError as e:
        return {"result": {"status": "refused", "error": str(e)}}
    return {"result": {"status": res["status"], "end_time_ps": res["end_time_ps"], "digest": res["digest"],
                       "original_end_ps": original["end_time_ps"], "original_digest": original["digest"],
                       "first_divergence_ps": div[0]["t_ps"] if div else None, "bundle": res["bundle"],
                       "prefix_events": res["fork"]["prefix"]["events"]}}


class _Collect:
    def __init__(self):
        self.records: dict = {}

    def running(self, n: int) -> None:
        pass

    def done(self, task: dict, record: dict) -> None:
        self.records[task["index"]] = record.get("result", {})


def fan_out(args) -> int:
    """Every variant of ``--variants`` forked from the same time, on the sweep backends (pool or Ray): a table."""
    from tools.sweep.backends import make_backend
    from tools.table import format_table

    variants = _variants(args.variants)
    out = Path(args.out) if args.out else Path("runs") / f"{Path(args.bundle).name}-forks"
    tasks = [{"index": i, "label": v["name"], "bundle": str(args.bundle), "at": args.at, "fault": v["fault"],
              "delay": v["delay"], "set": v["set"], "out": str(out / v["name"])} for i, v in enumerate(variants)]
    backend = make_backend(args.backend, args.jobs, args.address, work=_fork_point, preload=("tools.run.fork",))
    events = _Collect()
    backend.run(tasks, events)
    rows = []
    for t in tasks:
        r = events.records.get(t["index"], {})
        if r.get("status") in (None, "refused", "error") and "end_time_ps" not in r:
            rows.append({"variant": t["label"], "status": r.get("status", "lost"), "end time": "",
                         "change": "", "first divergence": "", "note": (r.get("error") or "")[:100]})
            continue
        e0, e1 = r["original_end_ps"], r["end_time_ps"]
        rows.append({"variant": t["label"], "status": r["status"], "end time": format_time(e1),
                     "change": f"{(e1 - e0) / e0 * 100:+.3f} %",
                     "first divergence": format_time(r["first_divergence_ps"]) if r["first_divergence_ps"]
                     else ("none (same digest)" if r["digest"] == r["original_digest"] else ""),
                     "note": r["bundle"]})
    print(format_table(f"forks of {args.bundle} at {args.at} ({backend.name})", rows))
    if args.json:
        print(json.dumps(events.records, indent=1))
    return 0 if all(r.get("status") == "finished" for r in events.records.values()) and \
        len(events.records) == len(tasks) else 1


def _metrics(res: dict) -> dict:
    return {k: v for k, v in res.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and k not in ("wall_s", "build_s", "events_per_s", "peak_rss_mib", "seed")}


def _comparison(original: dict, res: dict, divergence: list) -> str:
    f = res["fork"]
    e0, e1 = original["end_time_ps"], res["end_time_ps"]
    lines = [f"fork of {f['original']['bundle']} at {format_time(f['at_ps'])}: same run before it "
             f"({f['prefix']['events']:,} events, digest {f['prefix']['digest']}, checked against "
             f"{f['prefix']['checked_against']})",
             "  changes from there: " + ("; ".join(json.dumps(c.get("fault") or c.get("set") or c.get("fields"))
                                                 for c in f["changes"]) or "none"),
             f"  end time   {format_time(e0)} -> {format_time(e1)} ({(e1 - e0) / e0 * 100:+.3f} %)",
             f"  digest     {original['digest']} -> {res['digest']}"
             + (" (the same run)" if original["digest"] == res["digest"] else ""),
             f"  status     {original['status']} -> {res['status']}"]
    a, b = _metrics(original), _metrics(res)
    moved = [k for k in sorted(set(a) & set(b)) if a[k] != b[k] and k not in ("end_time_ps",)]
    for k in moved[:12]:
        lines.append(f"  {k:<10} {a[k]} -> {b[k]}")
    if divergence:
        lines.append("first divergent event per actor (earliest first):")
        for r in divergence:
            lines.append(f"  {r['actor']} at {format_time(r['t_ps'])}: original {r['original']}; fork {r['fork']}")
    elif original["digest"] != res["digest"]:
        lines.append("  (no trace to compare actor by actor)")
    lines.append(f"  bundle     {res['bundle']}")
    return "\n".join(lines)


def add_parser(sub) -> None:
    p = sub.add_parser("fork", help="re-run a recorded run to a time, change something from there on, compare "
                       "the two futures", description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", help="the original run's result bundle (emu run --out DIR)")
    p.add_argument("--at", required=True, metavar="TIME", help="the fork time, inside the recorded run (2.3us)")
    p.add_argument("--fault", action="append", default=[], metavar="YAML",
                   help="a fault from the fork time on, as a YAML flow map of the scenario's fault syntax "
                        "(its start defaults to --at); repeatable; default: none (with no --fault, --delay "
                        "or --set the fork runs on unchanged and must end as the recorded run)")
    p.add_argument("--delay", action="append", default=[], metavar="YAML",
                   help="the same for a fault of kind delay: {link: GLOB, delay: 5ns}; repeatable; default: none")
    p.add_argument("--set", action="append", default=[], metavar="machine.overrides.KEY=VALUE",
                   help="a machine parameter the family can change mid-run (AHBM: hbm.pc_bandwidth, "
                        "hbm.efficiency, hbm.access_latency, dma.setup_cycles, gemm.fill_drain_cycles, "
                        "math.fixed_cycles, cpu.dispatch_cycles.KIND); repeatable; default: none (the recorded values)")
    p.add_argument("--out", help="the fork's bundle (default: runs/<scenario name>-fork); with --variants the "
                   "folder of the variants' bundles (default: runs/<bundle name>-forks)")
    p.add_argument("--json", action="store_true", help="print the fork's summary as JSON")
    p.add_argument("--variants", metavar="FILE", help="fork every variant of this YAML list ({name, fault, delay, "
                   "set} each) from the same time, in parallel on the sweep backends; default: one fork")
    p.add_argument("--backend", choices=["pool", "ray"], default="pool",
                   help="with --variants: where the forks run (default: pool)")
    p.add_argument("-j", "--jobs", type=int, default=None, help="with --variants: forks at once (default: the cores)")
    p.add_argument("--address", default=None, help="with --backend ray: an existing cluster to join "
                   "(default: start a local Ray)")
    p.set_defaults(func=main)   # its errors are ValueErrors: "error: ...", exit 2 (tools/cli.py)

