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
import xxhash
import yaml

from emulator.trace import BLOCK, BUSY, DONE, FAULT, KINDS, MARK, SEND, TraceStream
from emulator.units import format_time

__all__ = ["add_parser", "main", "ForkError", "prefix_digest", "first_divergence_per_actor"]


class ForkError(ValueError):
    """A fork that cannot be made as asked (exit status 2): the message says why; nothing is written."""


def prefix_digest(trace_path: str, n: int) -> str:
    """The digest of a trace's first ``n`` events (the recorder's: xxh3-128 over their msgpack bytes)."""
    h = xxhash.xxh3_128()
    for i, ev in enumerate(TraceStream(trace_path)):
        if i >= n:
            break
        h.update(msgpack.packb(ev, use_bin_type=True))
    return h.hexdigest()


def _owners(header: dict) -> tuple[list, list]:
    """Per link index: (sender actor, receiver actor) names."""
    return [l["src"] for l in header["links"]], [l["dst"] for l in header["links"]]


def _by_actor(trace_path: str, from_event: int) -> dict:
    """actor name -> its events (payload-free tuples) from event index ``from_event`` on."""
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
    return out


def first_divergence_per_actor(a_path: str, b_path: str, from_event: int, limit: int = 10) -> list[dict]:
    """The actors whose events differ between two traces after their common prefix of ``from_event`` events,
    each with its first differing event in either run, earliest first (at most ``limit``)."""
    a, b = _by_actor(a_path, from_event), _by_actor(b_path, from_event)
    rows = []
    for who in set(a) | set(b):
        ea, eb = a.get(who, []), b.get(who, [])
        i = next((j for j in range(min(len(ea), len(eb))) if ea[j] != eb[j]), None)
        if i is None and len(ea) == len(eb):
            continue
        i = min(len(ea), len(eb)) if i is None else i
        x, y = (ea[i] if i < len(ea) else None), (eb[i] if i < len(eb) else None)
        t = min(e[1] for e in (x, y) if e is not None)
        rows.append({"actor": who, "t_ps": t, "original": _describe(x), "fork": _describe(y)})
    rows.sort(key=lambda r: (r["t_ps"], r["actor"]))
    return rows[:limit]


def _describe(ev) -> str:
    if ev is None:
        return "(no more events)"
    name, fields = KINDS.get(ev[0], ("?", ()))
    parts = [f"{f}={v}" for f, v in zip(fields[1:], ev[2:]) if f not in ("payload",)]
    return f"{name} at {format_time(ev[1])} " + " ".join(parts)


def _faults(args, at: int) -> list[dict]:
    out = []
    for opt, text in [("--fault", t) for t in args.fault] + [("--delay", t) for t in args.delay]:
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


def _live_sets(args, family, scenario_file: str, scenario, registry):
    """(changes, apply) for the --set options: each must be a machine parameter the family can change mid-run."""
    if not args.set:
        return [], None
    bad = [s for s in args.set if not s.startswith("machine.overrides.")]
    if bad:
        raise ForkError(f"--set {bad[0]}: a fork changes machine parameters (machine.overrides.KEY=VALUE) from "
                        "its time on; the workload and the rest of the scenario are fixed by its prefix")
    hook = getattr(family, "live_change", None)
    if hook is None:
        raise ForkError(f"--set {args.set[0]}: the {scenario.family} family declares no parameter that can change "
                        "mid-run (faults can: --fault, --delay)")
    from emulator.scenario import load_scenario
    changed = load_scenario(scenario_file, registry, args.set)
    try:
        fields, apply = hook(scenario.profile, changed.profile)
    except ValueError as e:
        raise ForkError(f"--set {' '.join(args.set)}: {e}") from None
    return [{"set": s} for s in args.set] + [{"fields": fields}], apply


def main(args) -> int:
    from actors import registry
    from emulator.scenario import load_scenario
    from tools.run.runner import EXIT_CODES, execute, plan_run

    from emulator.input_paths import bundle_file
    bundle = Path(args.bundle)
    if not bundle.is_dir():
        raise ForkError(f"{bundle}: not a result bundle directory")
    scen_file, res_file = bundle_file(bundle, "scenario.yaml"), bundle_file(bundle, "result.json")
    if scen_file is None or res_file is None:
        raise ForkError(f"{bundle}: not a complete result bundle (scenario.yaml and result.json)")
    original = json.loads(res_file.read_text())
    from emulator.units import UnitError, parse_time
    try:
        at = parse_time(args.at)
    except (UnitError, ValueError):
        raise ForkError(f"--at {args.at!r}: expected a time with a unit, like 2.3us") from None
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
    faults = _faults(args, at)
    changes, apply = _live_sets(args, family, str(scen_file), base, registry)
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

    out = Path(args.out) if args.out else Path("runs") / f"{base.name}-fork"
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
    if args.json:
        print(json.dumps(res["fork"] | {"end_time_ps": res["end_time_ps"], "digest": res["digest"],
                                        "status": res["status"]}, indent=1))
        return EXIT_CODES.get(res["status"], 1)
    print(_comparison(original, res, divergence))
    return EXIT_CODES.get(res["status"], 1)


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
                        "(its start defaults to --at); repeatable")
    p.add_argument("--delay", action="append", default=[], metavar="YAML",
                   help="the same for a fault of kind delay: {link: GLOB, delay: 5ns}; repeatable")
    p.add_argument("--set", action="append", default=[], metavar="machine.overrides.KEY=VALUE",
                   help="a machine parameter the family can change mid-run (AHBM: hbm.pc_bandwidth, "
                        "hbm.efficiency, hbm.access_latency, dma.setup_cycles, gemm.fill_drain_cycles, "
                        "math.fixed_cycles, cpu.dispatch_cycles.KIND); repeatable")
    p.add_argument("--out", help="the fork's bundle (default: runs/<scenario name>-fork)")
    p.add_argument("--json", action="store_true", help="print the fork's summary as JSON")
    p.set_defaults(func=main)   # its errors are ValueErrors: "error: ...", exit 2 (tools/cli.py)

