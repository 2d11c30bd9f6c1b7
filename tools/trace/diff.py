"""Compare two traces event by event and point at the first divergence.

Why event by event: two runs of the same scenario and seed must produce the
same stream (the digest says so); when they do not -- another seed, a changed
parameter, a code change -- the first differing event is where to look, and a
few events before it show what led there.  Events are compared as decoded
tuples (payload bytes included), so the result does not depend on how the
files were chunked.  Header differences (seed, versions) are reported as
notes, never as the verdict: the verdict is about the event streams.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from emulator.trace import TraceFile

__all__ = ["diff_traces", "DiffResult", "format_diff"]


@dataclass
class DiffResult:
    identical: bool
    index: int | None = None           # first diverging event index
    a_len: int = 0
    b_len: int = 0
    lines: list[str] = field(default_factory=list)


def _norm(ev):
    return tuple(tuple(x) if isinstance(x, list) else x for x in ev)


def _header_notes(a: TraceFile, b: TraceFile) -> list[str]:
    notes = []
    for key in ("scenario", "seed", "mode"):
        if a.header.get(key) != b.header.get(key):
            notes.append(f"note: {key} differs: {a.header.get(key)!r} vs {b.header.get(key)!r}")
    if a.actors != b.actors:
        notes.append("note: the actor lists differ (ids in the events are compared by name)")
    if [l["name"] for l in a.links] != [l["name"] for l in b.links]:
        notes.append("note: the link lists differ (ids in the events are compared by name)")
    return notes


def _named(trace: TraceFile, ev):
    """The event with actor/link ids replaced by names, so traces of different machines compare fairly."""
    from emulator.trace import KINDS

    _, fields = KINDS.get(ev[0], ("", ()))
    out = [ev[0]]
    for fname, v in zip(fields, ev[1:]):
        if fname == "link" and isinstance(v, int) and v < len(trace.links):
            v = trace.links[v]["name"]
        elif fname == "actor" and isinstance(v, int) and v < len(trace.actors):
            v = trace.actors[v]
        out.append(v)
    return _norm(out)


def diff_traces(a: TraceFile, b: TraceFile, *, context: int = 3) -> DiffResult:
    """Find the first event where ``a`` and ``b`` differ."""
    same_ids = a.actors == b.actors and [l["name"] for l in a.links] == [l["name"] for l in b.links]
    ea, eb = a.events, b.events
    res = DiffResult(identical=False, a_len=len(ea), b_len=len(eb))
    n = min(len(ea), len(eb))
    first = None
    for i in range(n):
        x, y = ea[i], eb[i]
        if x == y:
            continue
        if same_ids or _named(a, x) != _named(b, y):
            first = i
            break
    if first is None and len(ea) == len(eb):
        res.identical = True
        res.lines = [f"identical: {len(ea)} events"] + _header_notes(a, b)
        return res
    if first is None:
        first = n
    res.index = first
    lines = [f"traces differ at event {first} (A has {len(ea)} events, B has {len(eb)})"]
    lines += _header_notes(a, b)
    lo = max(0, first - context)
    if lo < first:
        lines.append("common events before it:")
        for i in range(lo, first):
            lines.append(f"  [{i}] {a.describe(ea[i])}")
    lines.append(f"A [{first}]: " + (a.describe(ea[first]) if first < len(ea) else "(end of trace)"))
    lines.append(f"B [{first}]: " + (b.describe(eb[first]) if first < len(eb) else "(end of trace)"))
    if first < n and ea[first][0] == eb[first][0] == 0 and ea[first][:5] == eb[first][:5]:
        pa, pb = ea[first][5], eb[first][5]
        if isinstance(pa, bytes) and isinstance(pb, bytes):
            off = next((j for j in range(min(len(pa), len(pb))) if pa[j] != pb[j]), min(len(pa), len(pb)))
            lines.append(f"the payloads differ first at byte {off} (of {len(pa)} / {len(pb)})")
    after = range(first + 1, first + 1 + context)
    more_a = [f"  A [{i}] {a.describe(ea[i])}" for i in after if i < len(ea)]
    more_b = [f"  B [{i}] {b.describe(eb[i])}" for i in after if i < len(eb)]
    if more_a or more_b:
        lines.append("then:")
        lines += more_a + more_b
    res.lines = lines
    return res


def format_diff(res: DiffResult) -> str:
    return "\n".join(res.lines)
