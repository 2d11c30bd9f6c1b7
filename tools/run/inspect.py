"""``emu inspect BUNDLE``: the machine's state where ``emu run --stop-at T`` stopped it, readable.

The bundle's ``state.json`` (emulator/snapshot.py; keys in docs/outputs.md "The state at a stop") holds,
at the stop, every actor that was not at rest, every link with a message in flight or a credit used, and
the component state each class declares.  This command prints it: one line per actor (what it is doing,
until when, on what; its queues), the links in use with their messages in flight and delivery times, and
with ``--tree`` the actors grouped by their place in the machine (``sip0/cube05/pe3/dma``).  ``--actor
GLOB`` (repeatable) keeps the matching actors, and the links into or out of them; ``--json`` prints the
selected part of the snapshot as it is.
"""
from __future__ import annotations

import fnmatch
import json
from pathlib import Path

from emulator.units import format_time

__all__ = ["add_parser", "main", "load_state", "actor_line"]


class InspectError(ValueError):
    """A bundle without a state snapshot, or an unreadable one (exit status 2)."""


def load_state(bundle: str) -> dict:
    """The snapshot of the bundle directory ``bundle`` (or of a ``state.json`` path)."""
    from emulator.input_paths import bundle_file
    p = Path(bundle)
    f = (bundle_file(p, "state.json") if p.is_dir() else p) or p / "state.json"   # (not a link out of the bundle)
    if not f.is_file():
        raise InspectError(f"{bundle}: no state.json: only a run stopped with emu run --stop-at TIME has a state "
                           "snapshot")
    try:
        snap = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise InspectError(f"{f}: not a readable state snapshot ({type(e).__name__})") from None
    if not isinstance(snap, dict) or not {"t_ps", "actors", "links"} <= set(snap):
        raise InspectError(f"{f}: not a state snapshot (expected the keys t_ps, actors, links)")
    return snap


def _msg(m: dict, at_key: str) -> str:
    return f"{m['kind']} {m.get('bytes', '')}{'B ' if 'bytes' in m else ''}@{format_time(m[at_key])}".replace("  ", " ")


def actor_line(name: str, d: dict) -> str:
    """One actor of a snapshot in words: state, until when and on what, queues, component state."""
    st = d["state"]
    what = {"busy": lambda: f"busy until {format_time(d['busy_until_ps'])} ({d['busy_label']})",
            "waiting": lambda: f"waiting until {format_time(d['until_ps'])}",
            "recv": lambda: "waiting for a message on " + ", ".join(p.split(".")[-1] for p in d["waits_on"]),
            "send": lambda: "blocked sending on " + ", ".join(p.split(".")[-1] for p in d["waits_on"]) + " (no credit)",
            "finished": lambda: f"finished at {format_time(d['finished_at_ps'])}"}.get(st, lambda: st)()
    parts = [f"{name} [{d['type']}]: {what}"]
    for port, q in (d.get("queues") or {}).items():
        heads = ", ".join(f"{h['kind']} from {h['from'].rsplit('/', 1)[-1]} since {format_time(h['delivered_ps'])}"
                          for h in q["heads"][:2])
        parts.append(f"queue {port}: {q['length']} ({heads}{', ...' if q['length'] > 2 else ''})")
    if d.get("component"):
        parts.append(" ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in d["component"].items()))
    return "; ".join(parts)


def _select(snap: dict, globs: list[str]) -> tuple[dict, dict]:
    actors, links = snap["actors"], snap["links"]
    if not globs:
        return actors, links
    keep = {n: d for n, d in actors.items() if any(fnmatch.fnmatchcase(n, g) for g in globs)}
    ends = lambda l: (l["src"].rsplit(".", 1)[0], l["dst"].rsplit(".", 1)[0])   # noqa: E731
    kept_links = {n: l for n, l in links.items()
                  if any(any(fnmatch.fnmatchcase(e, g) for g in globs) for e in ends(l))}
    return keep, kept_links


def _tree(actors: dict) -> list[str]:
    """The actors by their place in the machine: one line per path level, the actor's line at its leaf."""
    out, shown = [], []
    for name in sorted(actors):
        parts = name.split("/")
        common = 0
        while common < min(len(shown), len(parts) - 1) and shown[common] == parts[common]:
            common += 1
        for depth in range(common, len(parts) - 1):
            out.append("  " * depth + parts[depth] + "/")
        shown = parts[:-1]
        out.append("  " * (len(parts) - 1) + actor_line(parts[-1], actors[name]))
    return out


def main(args) -> int:
    snap = load_state(args.bundle)
    actors, links = _select(snap, args.actor)
    if args.json:
        print(json.dumps({**{k: v for k, v in snap.items() if k not in ("actors", "links")},
                          "actors": actors, "links": links}, indent=1))
        return 0
    states = ", ".join(f"{n} {k}" for k, n in sorted(snap["states"].items(), key=lambda kv: -kv[1]))
    print(f"state at {format_time(snap['t_ps'])} ({snap['t_ps']} ps): state digest {snap.get('state_digest')}, "
          f"trace digest {snap['trace_digest']} after {snap['events']:,} events")
    print(f"  actors: {states or 'none listed'} (of {snap['actors_total']:,}; {snap['actors_at_rest']:,} at rest, "
          "not listed)")
    print(f"  links: {snap['links_in_use']:,} in use of {snap['links_total']:,}; "
          f"{snap['messages_in_flight']:,} message(s) in flight")
    if args.actor:
        print(f"  selected by {', '.join(args.actor)}: {len(actors)} actor(s), {len(links)} link(s)")
    print("actors:" if actors else "actors: none")
    lines = _tree(actors) if args.tree else [actor_line(n, d) for n, d in actors.items()]
    print("\n".join("  " + line for line in lines))
    if links:
        print("links in use:")
        for n, l in links.items():
            flight = ", ".join(_msg(m, "deliver_ps") for m in l["in_flight"])
            more = l["in_flight_count"] - len(l["in_flight"])
            print(f"  {n}: {l['credits_used']}/{l['capacity']} credits used"
                  + (f"; in flight: {flight}{f', +{more} more' if more > 0 else ''}" if flight else ""))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="print the machine's state where emu run --stop-at stopped a run",
                       description=__doc__.split("\n\n")[1])
    p.add_argument("bundle", help="the result bundle of a run stopped with --stop-at (or its state.json)")
    p.add_argument("--actor", action="append", default=[], metavar="GLOB",
                   help="only the actors whose path matches (repeatable; e.g. 'sip0/cube00/pe0/*'); default: all")
    p.add_argument("--tree", action="store_true", help="group the actors by their place in the machine")
    p.add_argument("--json", action="store_true", help="print the (selected) snapshot as JSON")
    p.set_defaults(func=main)   # its errors are ValueErrors: "error: ...", exit 2 (tools/cli.py)

