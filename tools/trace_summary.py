"""Summarise a trace: utilisation, link traffic, longest waits, critical path.

Everything is computed from the trace events alone (no re-run), so it works
on any ``.emutrace`` -- including one from a deadlocked or faulted run.

* **utilisation** of an actor = its busy time (sum of BUSY spans) / end time;
* **links**: messages and bytes sent (SEND), delivered, dropped (sent, never
  delivered), sender blocks (BLOCK), peak in-port depth;
* **longest waits**: per message, the time it sat in the receiver's in-port
  (DELIVER -> TAKE), the top N;
* **critical path**: the chain of busy spans and messages that determined the
  time of the last event.  It is walked backwards from the actor of the last
  event; at each point ``(actor, t)`` the cause is, in this order:

  1. a busy span of the actor ending at ``t`` -> step back to its start;
  2. a message the actor took at ``t`` that was delivered at ``t`` (the actor
     was waiting for it) -> the message's flight, then its sender at send time;
  3. a send of the actor at ``t`` that had blocked for credit -> the receiver
     that freed the credit (its TAKE on that link at ``t``);
  4. otherwise the actor was idle on its own (a timer, the start of the run):
     the walk stops there -- that is where the path starts.

  If the last event is a delivery nobody took (a run ending in a deadlock or
  at a killed receiver), the path ends with that message's flight.

  With a message delivered earlier than taken (it waited in the queue) the
  receiver, not the message, was the bottleneck, so rule 2 does not apply.
"""
from __future__ import annotations

import bisect
from collections import defaultdict

from emulator.trace import BLOCK, BUSY, DELIVER, DONE, ERROR, FAULT, MARK, SEND, TAKE, TraceFile
from emulator.units import format_time

__all__ = ["summarise", "format_summary", "critical_path", "event_actor"]


def event_actor(trace: TraceFile, ev) -> str | None:
    """The actor an event belongs to (sender for SEND/BLOCK, receiver for DELIVER/TAKE)."""
    k = ev[0]
    if k in (SEND, BLOCK):
        return trace.links[ev[2]]["src"]
    if k in (DELIVER, TAKE):
        return trace.links[ev[2]]["dst"]
    if k in (BUSY, MARK, DONE):
        return trace.actors[ev[2]]
    return None


def end_time(trace: TraceFile) -> int:
    end = trace.footer.get("end_time_ps")
    if end is None:
        end = max((ev[3] if ev[0] == BUSY else ev[1] for ev in trace.events), default=0)
    return int(end)


def summarise(trace: TraceFile, *, top: int = 10) -> dict:
    """The summary as a JSON-friendly dict."""
    end = end_time(trace)
    busy = defaultdict(int)
    spans = defaultdict(int)
    for ev in trace.events:
        if ev[0] == BUSY:
            busy[ev[2]] += ev[3] - ev[1]
            spans[ev[2]] += 1
    actors = [{"actor": name, "busy_ps": busy[i], "spans": spans[i],
               "utilisation": round(busy[i] / end, 6) if end else 0.0}
              for i, name in enumerate(trace.actors)]
    actors.sort(key=lambda r: (-r["utilisation"], r["actor"]))

    n = len(trace.links)
    msgs, nbytes, delivered, blocks, peak = [0] * n, [0] * n, [0] * n, [0] * n, [0] * n
    deliver_t: dict[tuple[int, int], int] = {}
    waits = []
    faults = 0
    for ev in trace.events:
        k = ev[0]
        if k == SEND:
            msgs[ev[2]] += 1
            nbytes[ev[2]] += ev[4]
        elif k == DELIVER:
            delivered[ev[2]] += 1
            peak[ev[2]] = max(peak[ev[2]], ev[4])
            deliver_t[(ev[2], ev[3])] = ev[1]
        elif k == TAKE:
            d = deliver_t.pop((ev[2], ev[3]), None)
            if d is not None:
                waits.append((ev[1] - d, ev[2], ev[3], d, ev[1]))
        elif k == BLOCK:
            blocks[ev[2]] += 1
        elif k == FAULT:
            faults += 1
    links = [{"link": l["name"], "messages": msgs[i], "bytes": nbytes[i], "delivered": delivered[i],
              "lost": msgs[i] - delivered[i], "sender_blocked": blocks[i], "peak_depth": peak[i]}
             for i, l in enumerate(trace.links)]
    links.sort(key=lambda r: (-r["bytes"], r["link"]))
    waits.sort(key=lambda w: (-w[0], w[3], w[1], w[2]))
    longest = [{"wait_ps": w, "link": trace.links[li]["name"], "seq": seq, "delivered_ps": d, "taken_ps": t}
               for w, li, seq, d, t in waits[:top]]
    errors = [{"t_ps": ev[1], "where": ev[2], "text": ev[3]} for ev in trace.events if ev[0] == ERROR]
    return {
        "scenario": trace.header.get("scenario"), "seed": trace.header.get("seed"),
        "status": trace.footer.get("status"), "end_time_ps": end, "events": len(trace.events),
        "faults": faults, "errors": errors,
        "actors": actors, "links": links, "longest_waits": longest,
        "critical_path": critical_path(trace),
    }


class _Index:
    """Per-actor event lists sorted by time, for the backward walk."""

    def __init__(self, trace: TraceFile):
        self.trace = trace
        self.busy_end = defaultdict(list)      # actor -> [(t_end, t_start, label)]
        self.takes = defaultdict(list)         # actor -> [(t, link, seq)]
        self.sends = {}                        # (link, seq) -> t
        self.delivers = {}                     # (link, seq) -> t
        self.blocked = {}                      # (link, seq) -> block time
        self.send_at = defaultdict(list)       # actor -> [(t, link, seq)]
        self.times = defaultdict(list)         # actor -> sorted event times (any kind)
        links = trace.links
        for ev in trace.events:
            k = ev[0]
            if k == BUSY:
                a = trace.actors[ev[2]]
                self.busy_end[a].append((ev[3], ev[1], ev[4]))
                self.times[a] += [ev[1], ev[3]]
            elif k == SEND:
                self.sends[(ev[2], ev[3])] = ev[1]
                a = links[ev[2]]["src"]
                self.send_at[a].append((ev[1], ev[2], ev[3]))
                self.times[a].append(ev[1])
            elif k == DELIVER:
                self.delivers[(ev[2], ev[3])] = ev[1]
            elif k == TAKE:
                a = links[ev[2]]["dst"]
                self.takes[a].append((ev[1], ev[2], ev[3]))
                self.times[a].append(ev[1])
            elif k == BLOCK:
                self.blocked[(ev[2], ev[3])] = ev[1]
            elif k == DONE:
                self.times[trace.actors[ev[2]]].append(ev[1])
        for d in (self.busy_end, self.takes, self.send_at, self.times):
            for v in d.values():
                v.sort()

    def previous_time(self, actor: str, t: int) -> int | None:
        ts = self.times.get(actor, [])
        i = bisect.bisect_left(ts, t)
        return ts[i - 1] if i > 0 else None


def _last_point(trace: TraceFile):
    """The latest event with an actor: ``(actor, time, event)``; at equal times an actor's own
    event (busy end, take, send, done) wins over a delivery into its queue."""
    best = None
    for ev in trace.events:
        k = ev[0]
        if k in (ERROR, FAULT, MARK, BLOCK):
            continue
        t = ev[3] if k == BUSY else ev[1]
        a = event_actor(trace, ev)
        if a is None:
            continue
        key = (t, k != DELIVER)
        if best is None or key > best[0]:
            best = (key, a, ev)
    return None if best is None else (best[1], best[0][0], best[2])


def critical_path(trace: TraceFile, *, limit: int = 100_000) -> list[dict]:
    """The steps (earliest first) that determined the last event's time; see the module docstring."""
    start = _last_point(trace)
    if start is None:
        return []
    idx = _Index(trace)
    links = trace.links
    actor, t, last = start
    steps = []
    seen = set()
    if last[0] == DELIVER and (last[2], last[3]) in idx.sends:
        # the run ended with a message arriving (e.g. at a dead or blocked receiver): its flight is the end
        li, seq = last[2], last[3]
        sent = idx.sends[(li, seq)]
        steps.append({"kind": "message", "link": links[li]["name"], "seq": seq, "start_ps": sent, "end_ps": t,
                      "from": links[li]["src"], "to": actor})
        actor, t = links[li]["src"], sent
    while len(steps) < limit:
        if (actor, t) in seen:
            break
        seen.add((actor, t))
        # 1. a busy span ending at t
        spans = idx.busy_end.get(actor, [])
        i = bisect.bisect_right(spans, (t, float("inf"), "")) - 1
        if i >= 0 and spans[i][0] == t and spans[i][1] < t:
            t_end, t0, label = spans[i]
            steps.append({"kind": "busy", "actor": actor, "label": str(label), "start_ps": t0, "end_ps": t_end})
            t = t0
            continue
        # 2. a message taken at t, delivered at t, while the actor waited
        took = [(tt, li, seq) for tt, li, seq in idx.takes.get(actor, []) if tt == t
                and idx.delivers.get((li, seq)) == t and (li, seq) in idx.sends]
        if took:
            _, li, seq = took[-1]
            sent = idx.sends[(li, seq)]
            steps.append({"kind": "message", "link": links[li]["name"], "seq": seq, "start_ps": sent, "end_ps": t,
                          "from": links[li]["src"], "to": actor})
            actor, t = links[li]["src"], sent
            continue
        # 3. a send at t that had blocked for credit: the receiver freed it
        blocked = [(li, seq) for tt, li, seq in idx.send_at.get(actor, []) if tt == t and (li, seq) in idx.blocked]
        if blocked:
            li, seq = blocked[-1]
            b = idx.blocked[(li, seq)]
            steps.append({"kind": "blocked", "actor": actor, "link": links[li]["name"], "seq": seq, "start_ps": b,
                          "end_ps": t, "freed_by": links[li]["dst"]})
            if b < t:
                actor = links[li]["dst"]
                continue
            break
        # 4. idle on its own: the path starts here
        prev = idx.previous_time(actor, t)
        steps.append({"kind": "start", "actor": actor, "start_ps": t, "end_ps": t,
                      "idle_since_ps": prev})
        break
    steps.reverse()
    return steps


def _step_line(s: dict) -> str:
    span = f"{format_time(s['start_ps']):>10} -> {format_time(s['end_ps']):>10}"
    if s["kind"] == "busy":
        return f"{span}  busy     {s['actor']} [{s['label']}] {format_time(s['end_ps'] - s['start_ps'])}"
    if s["kind"] == "message":
        return (f"{span}  message  {s['link']} #{s['seq']} ({format_time(s['end_ps'] - s['start_ps'])} "
                f"send->deliver)")
    if s["kind"] == "blocked":
        return f"{span}  blocked  {s['actor']} on {s['link']} #{s['seq']} until {s['freed_by']} took a message"
    since = "" if s.get("idle_since_ps") is None else f" (idle since {format_time(s['idle_since_ps'])})"
    return f"{span}  start    {s['actor']} starts on its own{since}"


def format_summary(s: dict, *, rows: int = 15) -> str:
    out = [f"trace of {s['scenario']} (seed {s['seed']}): {s['status']}, end {format_time(s['end_time_ps'])} "
           f"({s['end_time_ps']} ps), {s['events']} events, {s['faults']} fault event(s)"]
    for e in s["errors"]:
        first = str(e["text"]).splitlines()[0] if e["text"] else ""
        out.append(f"  error at {format_time(e['t_ps'])} in {e['where']}: {first}")
    out.append("")
    out.append(f"utilisation per actor (busy / end time), top {min(rows, len(s['actors']))} of {len(s['actors'])}:")
    for r in s["actors"][:rows]:
        out.append(f"  {r['actor']:<32} {100 * r['utilisation']:6.2f} %  {format_time(r['busy_ps']):>10} busy"
                   f" in {r['spans']} span(s)")
    out.append("")
    out.append(f"links by bytes, top {min(rows, len(s['links']))} of {len(s['links'])}:")
    for r in s["links"][:rows]:
        extra = f", {r['lost']} lost" if r["lost"] else ""
        extra += f", sender blocked {r['sender_blocked']}x" if r["sender_blocked"] else ""
        out.append(f"  {r['link']:<44} {r['messages']:6d} msgs {r['bytes']:10d} B  peak depth {r['peak_depth']}"
                   f"{extra}")
    out.append("")
    out.append("longest waits in an in-port (deliver -> take):")
    if not s["longest_waits"]:
        out.append("  (none: every message was taken as it arrived)")
    for w in s["longest_waits"]:
        out.append(f"  {format_time(w['wait_ps']):>10}  {w['link']} #{w['seq']} (delivered "
                   f"{format_time(w['delivered_ps'])}, taken {format_time(w['taken_ps'])})")
    out.append("")
    cp = s["critical_path"]
    out.append(f"critical path ({len(cp)} steps, ends at {format_time(cp[-1]['end_ps']) if cp else '-'}):")
    for step in cp:
        out.append("  " + _step_line(step))
    return "\n".join(out)
