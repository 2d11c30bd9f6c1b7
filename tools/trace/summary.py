"""Summarise a trace: utilisation, link traffic, longest waits, critical path.

Everything is computed from the trace events alone (no re-run), so it works
on any ``.emutrace`` -- including one from a deadlocked or faulted run.

* **utilisation** of an actor = its busy time (sum of BUSY spans) / end time;
* **links**: messages and bytes sent (SEND), delivered, dropped (sent, never
  delivered), sender blocks (BLOCK) and ``max_depth``: the peak number of
  messages waiting in the receiving in-port (all the links into that port),
  counting a message handed straight to a waiting receiver as 1 -- the same
  number as ``links.csv``'s ``max_depth`` (``System.link_metrics``,
  docs/outputs-links.md);
* **longest waits**: per message, the time it sat in the receiver's in-port
  (DELIVER -> TAKE), the top N;
* **critical path** over the whole run: the chain of busy spans, own waits and
  message flights that determined the time of the last event, walked
  backwards from it.  Each actor's own events (busy spans, sends, takes,
  blocks, marks, done) are taken in emission order, which inside one virtual
  instant is causal order.  From an event ``e`` of actor ``A`` at time ``t``:

  1. ``e`` is a TAKE of a message delivered at ``t`` (``A`` was waiting for
     it) -> the message's flight, then its sender at its SEND event;
  2. ``e`` is a SEND that had blocked for credit -> the receiver at the TAKE
     on that link that freed the credit;
  2b. in rule 1, if the sender only *polled* (its request followed a wait on
     its own timer, e.g. a driver reading a status register every 1 us), the
     request is not the cause: what the answer carries is -- the last message
     ``A`` took from another link since the previous poll.  The time from that
     news to the poll is a ``poll`` step of the poller;
  3. otherwise -> ``A``'s previous own event; the time between is ``A``'s:
     ``busy`` where a busy span covers it, ``idle`` otherwise (a sleep, a
     timer, a message that sat in its queue while it worked).

  The walk ends at an actor's first event (a ``start`` step from 0), so the
  steps partition ``[0, end]``.  It follows causality through every
  sub-actor (CPU -> scheduler -> DMA -> HBM -> GEMM -> ...) and the summary
  adds the time along it per **component kind** (the last element of an actor
  name without its digits: ``sip0/cube03/pe3/dma`` -> ``dma``) and per
  **link class** (``cpu.dma->dma.cmd``).  An actor with several internal
  tasks is one timeline: its previous own event may belong to another task
  (an approximation the path shares with every trace-only analysis).

  If the last event is a delivery nobody took (a run ending in a deadlock or
  at a killed receiver), the path ends with that message's flight.

A trace recorded with filters (``trace.kinds``, ``trace.actors``,
``trace.links``) lacks what some parts need; the summary names each part it
cannot compute (``missing``) instead of printing zeros.
"""
from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from emulator.trace import BLOCK, BUSY, DELIVER, DONE, ERROR, FAULT, KIND_CODES, MARK, SEND, TAKE, TraceFile
from emulator.units import format_time
from tools.trace.compact import CompactTrace, compact

__all__ = ["summarise", "format_summary", "critical_path", "path_by_kind", "event_actor", "component_kind",
           "kind_stems", "link_class", "missing_parts"]


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


_DIGITS = re.compile(r"\d+$")


def component_kind(actor: str, stems: set[str] | None = None) -> str:
    """An actor's component kind: the last element of its name, without an instance number.

    ``sip0/cube03/pe3/dma`` -> ``dma``, ``pccx/hp2`` -> ``hp``, ``sip0/cube03/pe3/pc5`` -> ``pc`` (an HBM
    pseudo-channel).  The number is dropped only when ``stems`` (from :func:`kind_stems`) says several
    instances share the stem, so ``pccx/l2`` stays ``l2``; without ``stems`` it is always dropped.
    """
    last = actor.rsplit("/", 1)[-1]
    stem = _DIGITS.sub("", last)
    if not stem or (stems is not None and stem not in stems):
        return last
    return stem


def kind_stems(actors) -> set[str]:
    """The name stems that several numbered instances share (``hp`` for hp0..hp3), for :func:`component_kind`."""
    seen: dict[str, set[str]] = defaultdict(set)
    for a in actors:
        last = a.rsplit("/", 1)[-1]
        stem = _DIGITS.sub("", last)
        if stem != last:
            seen[stem].add(last)
    return {s for s, names in seen.items() if len(names) > 1}


def link_class(link: dict, stems: set[str] | None = None) -> str:
    """A link's class: its ends' component kinds and ports, ``cpu.dma->dma.cmd``."""
    return (f"{component_kind(link['src'], stems)}.{link.get('src_port', '?')}->"
            f"{component_kind(link['dst'], stems)}.{link.get('dst_port', '?')}")


def end_time(trace) -> int:
    end = trace.footer.get("end_time_ps")
    if end is None:
        if isinstance(trace, CompactTrace):
            bm = trace.k == BUSY
            end = max(int(trace.t.max()) if len(trace.t) else 0, int(trace.b[bm].max()) if bm.any() else 0)
            del bm
        else:
            end = max((ev[3] if ev[0] == BUSY else ev[1] for ev in trace.events), default=0)
    return int(end)


def recorded_filters(trace: TraceFile) -> dict:
    """The trace options the run was recorded with (kinds, actors, links globs), from the header."""
    t = (trace.header.get("scenario_resolved") or {}).get("trace") or {}
    return {"kinds": t.get("kinds"), "actors": t.get("actors"), "links": t.get("links")}


#: what each part of the summary needs from the trace
NEEDS = {
    "utilisation": {"busy"},
    "links": {"send", "deliver"},
    "longest_waits": {"deliver", "take"},
    "critical_path": {"busy", "send", "deliver", "take", "block", "done"},
}


def missing_parts(trace: TraceFile) -> dict[str, str]:
    """``{part: why}`` for each summary part this trace cannot give (recorded with filters)."""
    f = recorded_filters(trace)
    out = {}
    kinds = set(f["kinds"]) if f["kinds"] else None
    for part, need in NEEDS.items():
        if kinds is not None and not need <= kinds:
            out[part] = (f"needs the {', '.join(sorted(need - kinds))} events; the trace was recorded with "
                         f"trace.kinds=[{', '.join(sorted(kinds))}]")
    if "critical_path" not in out and (f["actors"] or f["links"]):
        which = " and ".join(f"trace.{k}={f[k]}" for k in ("actors", "links") if f[k])
        out["critical_path"] = (f"needs every actor's and link's events; the trace was recorded with {which}, "
                                "so a path would stop where it leaves them")
    return out


def summarise(trace, *, top: int = 10, critical: bool = True) -> dict:
    """The summary as a JSON-friendly dict; parts the trace cannot give are ``None`` and named in ``missing``.

    ``trace``: a path (read streaming, in columns: tools/trace/compact.py), a :class:`TraceFile` or a
    :class:`~tools.trace.compact.CompactTrace`.  ``critical=False`` skips the critical path (``None``).
    Each part is computed by a function of its own, so its temporaries are gone before the next.
    """
    ct = compact(trace)
    end = end_time(ct)
    missing = missing_parts(ct)
    actors = _actor_rows(ct, end)
    links = _link_rows(ct)
    longest = _longest_waits(ct, top)
    errors = [{"t_ps": ev[1], "where": ev[2], "text": ev[3]} for ev in ct.side.values() if ev[0] == ERROR]
    faults = sum(1 for ev in ct.side.values() if ev[0] == FAULT)
    cp = None if "critical_path" in missing or not critical else critical_path(ct)
    return {
        "scenario": ct.header.get("scenario"), "seed": ct.header.get("seed"),
        "status": ct.footer.get("status"), "end_time_ps": end, "events": len(ct.events),
        "faults": faults, "errors": errors, "missing": missing,
        "actors": None if "utilisation" in missing else actors,
        "links": None if "links" in missing else links,
        "longest_waits": None if "longest_waits" in missing else longest,
        "critical_path": cp,
        "critical_path_by_kind": None if cp is None else path_by_kind(cp, {l["name"]: l for l in ct.links},
                                                                      kind_stems(ct.actors)),
    }


def _actor_rows(ct: CompactTrace, end: int) -> list[dict]:
    """Busy time, spans and utilisation per actor, busiest first."""
    n_actors = len(ct.actors)
    rows = np.flatnonzero(ct.k == BUSY)
    who = ct.a[rows]
    busy = np.zeros(n_actors, np.int64)
    np.add.at(busy, who, ct.b[rows] - ct.t[rows])
    spans = np.bincount(who, minlength=n_actors)
    out = [{"actor": name, "busy_ps": int(busy[i]), "spans": int(spans[i]),
            "utilisation": round(int(busy[i]) / end, 6) if end else 0.0} for i, name in enumerate(ct.actors)]
    out.sort(key=lambda r: (-r["utilisation"], r["actor"]))
    return out


def _link_rows(ct: CompactTrace) -> list[dict]:
    """Messages, bytes, deliveries, losses, sender blocks and the peak in-port depth per link."""
    k, a, c, n = ct.k, ct.a, ct.c, len(ct.links)
    sends, delivers = np.flatnonzero(k == SEND), np.flatnonzero(k == DELIVER)
    msgs = np.bincount(a[sends], minlength=n)
    nbytes = np.zeros(n, np.int64)
    np.add.at(nbytes, a[sends], c[sends])
    delivered = np.bincount(a[delivers], minlength=n)
    blocks = np.bincount(a[k == BLOCK], minlength=n)
    ports: dict[tuple[str, str], int] = {}
    port_of = np.array([ports.setdefault((l["dst"], l.get("dst_port", "")), len(ports)) for l in ct.links] or [0],
                       np.int64)[:n]
    peak = np.zeros(max(1, len(ports)), np.int64)
    np.maximum.at(peak, port_of[a[delivers]], c[delivers])
    out = [{"link": l["name"], "messages": int(msgs[i]), "bytes": int(nbytes[i]), "delivered": int(delivered[i]),
            "lost": int(msgs[i] - delivered[i]), "sender_blocked": int(blocks[i]), "max_depth": int(peak[port_of[i]])}
           for i, l in enumerate(ct.links)]
    out.sort(key=lambda r: (-r["bytes"], r["link"]))
    return out


def _longest_waits(ct: CompactTrace, top: int) -> list[dict]:
    """The ``top`` longest in-port waits: each TAKE against the DELIVER of its (link, seq) before it."""
    k, t, a, b = ct.k, ct.t, ct.a, ct.b
    takes = np.flatnonzero(k == TAKE)
    d = _match(a, b, np.flatnonzero(k == DELIVER), takes).astype(np.int64)
    keep = (d >= 0) & (d < takes)
    di, ti = d[keep], takes[keep]
    wait = t[ti] - t[di]
    pick = np.lexsort((b[ti], a[ti], t[di], -wait))[:top]
    return [{"wait_ps": int(wait[m]), "link": ct.links[int(a[ti[m]])]["name"], "seq": int(b[ti[m]]),
             "delivered_ps": int(t[di[m]]), "taken_ps": int(t[ti[m]])} for m in pick]


def _key(link, seq) -> np.ndarray:
    """One int64 per (link, seq): a message's identity."""
    return (np.asarray(link, np.int64) << 40) | np.asarray(seq, np.int64)


def path_by_kind(steps: list[dict], links: dict[str, dict], stems: set[str] | None = None) -> dict:
    """Time along a critical path per component kind (busy / idle) and per link class (message flights)."""
    kinds: dict[str, dict] = defaultdict(lambda: {"busy_ps": 0, "idle_ps": 0, "steps": 0})
    classes: dict[str, dict] = defaultdict(lambda: {"flight_ps": 0, "messages": 0})
    for s in steps:
        d = s["end_ps"] - s["start_ps"]
        if s["kind"] == "message":
            c = classes[link_class(links[s["link"]], stems) if s["link"] in links else s["link"]]
            c["flight_ps"] += d
            c["messages"] += 1
        elif s["kind"] in ("busy", "idle", "start", "poll"):
            k = kinds[component_kind(s["actor"], stems)]
            k["busy_ps" if s["kind"] == "busy" else "idle_ps"] += d
            k["steps"] += 1
    order = lambda d, key: dict(sorted(d.items(), key=lambda kv: (-key(kv[1]), kv[0])))  # noqa: E731
    return {"components": order(kinds, lambda v: v["busy_ps"] + v["idle_ps"]),
            "link_classes": order(classes, lambda v: v["flight_ps"])}


def _match(a, b, from_rows: np.ndarray, to_rows: np.ndarray) -> np.ndarray:
    """For each row of ``to_rows``, the last row of ``from_rows`` with the same (link, seq), or -1."""
    keys = _key(a[from_rows], b[from_rows])
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    want = _key(a[to_rows], b[to_rows])
    j = np.searchsorted(keys, want, side="right") - 1
    hit = j >= 0
    hit[hit] = keys[j[hit]] == want[hit]
    out = np.full(len(to_rows), -1, np.int32)
    out[hit] = from_rows[order[j[hit]]]
    return out


class _Index:
    """What the backward walk looks up, built from the trace's columns (numpy, ~14 bytes an event).

    Each actor's own events (the ones its task emits: BUSY, SEND, BLOCK,
    TAKE, MARK, DONE) are listed by event index: emission order, which within
    one virtual instant is causal order, so the walk never loops on events
    that share a time stamp.  Per TAKE (and DELIVER) row: the row of its
    message's SEND (``send_of``); per TAKE row: whether it was taken the instant
    it was delivered (``waited``: the actor was waiting for it); per blocked
    SEND: when it blocked.
    """

    def __init__(self, ct: CompactTrace):
        links = ct.links
        self.events = ct.events
        ids = {name: i for i, name in enumerate(ct.actors)}
        for l in links:                                          # link ends the actor list does not name
            ids.setdefault(l["src"], len(ids))
            ids.setdefault(l["dst"], len(ids))
        self.ids = ids
        src = np.array([ids[l["src"]] for l in links] or [0], np.int32)
        dst = np.array([ids[l["dst"]] for l in links] or [0], np.int32)
        k, t, a, b = ct.k, ct.t, ct.a, ct.b
        n = len(k)
        owner = np.full(n, -1, np.int32)
        for codes, by in (((SEND, BLOCK), src), ((TAKE,), dst)):
            m = np.isin(k, codes)
            owner[m] = by[a[m]]
        m = np.isin(k, (BUSY, MARK, DONE))
        owner[m] = a[m]
        del m
        counts = np.bincount(owner[owner >= 0], minlength=len(ids))
        self.start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.order = np.argsort(owner, kind="stable")[n - int(self.start[-1]):].astype(np.int32)   # -1s first
        del owner, counts                                        # order: by actor, then emission order
        self.pos = np.zeros(n, np.int32)
        for i in range(len(ids)):                                # rank of each own event in its actor's list
            s, e = self.start[i], self.start[i + 1]
            if e > s:
                self.pos[self.order[s:e]] = np.arange(e - s, dtype=np.int32)
        sends = np.flatnonzero(k == SEND).astype(np.int32)
        takes = np.flatnonzero(k == TAKE).astype(np.int32)
        delivers = np.flatnonzero(k == DELIVER).astype(np.int32)
        self.send_of = np.full(n, -1, np.int32)
        self.send_of[takes] = _match(a, b, sends, takes)
        self.send_of[delivers] = _match(a, b, sends, delivers)
        self.waited = np.zeros(n, bool)
        d = _match(a, b, delivers, takes)
        got = d >= 0
        self.waited[takes[got]] = t[d[got]] == t[takes[got]]
        del d, got, delivers
        blocks = np.flatnonzero(k == BLOCK).astype(np.int32)
        bs = _match(a, b, blocks, sends)
        self.blocked = {int(r): int(t[q]) for r, q in zip(sends[bs >= 0], bs[bs >= 0])}   # send row -> since
        del bs, blocks, sends
        torder = np.argsort(a[takes], kind="stable")             # by link, then index
        self.takes = takes[torder]
        del torder, takes
        self.take_start = np.searchsorted(a[self.takes], np.arange(len(links) + 1))
        when = t.copy()                                          # the latest point: a busy span's end counts
        busy = k == BUSY
        when[busy] = b[busy]
        when[(k == FAULT) | (k == ERROR)] = -1
        del busy
        top = int(when.max()) if n else -1
        self.last = (top, int(np.flatnonzero(when == top)[-1])) if top >= 0 else None

    def send_row(self, i: int) -> int | None:
        j = int(self.send_of[i])
        return j if j >= 0 else None

    def own(self, actor: str) -> np.ndarray:
        i = self.ids[actor]
        return self.order[self.start[i]:self.start[i + 1]]

    def takes_on(self, link: int) -> np.ndarray:
        return self.takes[self.take_start[link]:self.take_start[link + 1]]

    def polled(self, actor: str, send_i: int) -> bool:
        """Was the send at ``send_i`` a poll: preceded by a wait on the actor's own timer (a gap with no busy span)?"""
        own = self.own(actor)
        n = int(self.pos[send_i])
        if n == 0:
            return False
        prev = self.events[int(own[n - 1])]
        prev_t = prev[3] if prev[0] == BUSY else prev[1]
        return prev_t < self.events[send_i][1]

    def news(self, actor: str, take_i: int, link: int) -> int | None:
        """The last message ``actor`` took from another link since its previous take on ``link``, or None."""
        own, events = self.own(actor), self.events
        for j in reversed(own[:int(self.pos[take_i])].tolist()):
            ev = events[j]
            if ev[0] == TAKE:
                if ev[2] == link:
                    return None
                return j
        return None


def owner(trace: TraceFile, ev) -> str | None:
    """The actor whose task emitted ``ev`` (DELIVER is emitted by the link: its receiver)."""
    return event_actor(trace, ev)


def critical_path(trace, *, limit: int = 1_000_000) -> list[dict]:
    """The chain of steps (earliest first) that determined the time of the last event; see the module docstring.

    The steps partition ``[0, end]``: each starts where the previous ends.
    """
    trace = compact(trace)
    idx = _Index(trace)
    if idx.last is None:
        return []
    ev_list, links, actors = idx.events, trace.links, trace.actors
    t, i = idx.last
    ev = ev_list[i]
    steps: list[dict] = []
    if ev[0] == DELIVER:
        # the run ended with a message arriving (e.g. at a dead or blocked receiver): its flight is the end
        si = idx.send_row(i)
        if si is None:
            return []
        steps.append(_message(links, ev[2], ev[3], ev_list[si][1], t))
        actor, i, t = links[ev[2]]["src"], si, ev_list[si][1]
    else:
        actor = owner(trace, ev)
    while len(steps) < limit:
        ev = ev_list[i]
        k = ev[0]
        if k == BUSY:
            t_end = min(ev[3], t)
            if t > t_end:
                steps.append({"kind": "idle", "actor": actor, "start_ps": t_end, "end_ps": t})
            if t_end > ev[1]:
                steps.append({"kind": "busy", "actor": actor, "label": str(ev[4]), "start_ps": ev[1],
                              "end_ps": t_end})
            t = min(t, ev[1])
        elif k == TAKE and idx.waited[i] and (si := idx.send_row(i)) is not None:
            # the actor was waiting for this message: the path goes to its sender ...
            sent = ev_list[si][1]
            news = idx.news(actor, i, ev[2]) if idx.polled(links[ev[2]]["src"], si) else None
            if news is not None:
                # ... unless the sender only polled (a request sent after a timer): then what the answer
                # carries -- the last message this actor took from elsewhere since the previous poll -- is
                if t > ev[1]:
                    steps.append({"kind": "idle", "actor": actor, "start_ps": ev[1], "end_ps": t})
                t_news = ev_list[news][1]
                poller = links[ev[2]]["src"]
                steps.append({"kind": "poll", "actor": poller, "start_ps": t_news, "end_ps": ev[1],
                              "via": actor})
                i, t = news, t_news
                continue
            if t > ev[1]:
                steps.append({"kind": "idle", "actor": actor, "start_ps": ev[1], "end_ps": t})
            steps.append(_message(links, ev[2], ev[3], sent, ev[1]))
            actor, i, t = links[ev[2]]["src"], si, sent
            continue
        elif k == SEND and (since := idx.blocked.get(i)) is not None and since < ev[1]:
            # it waited for a credit: the path goes to the receiver's take that freed it
            takes = idx.takes_on(ev[2])
            j = int(np.searchsorted(takes, i)) - 1
            if t > ev[1]:
                steps.append({"kind": "idle", "actor": actor, "start_ps": ev[1], "end_ps": t})
            if j >= 0:
                steps.append({"kind": "blocked", "actor": actor, "link": links[ev[2]]["name"], "seq": ev[3],
                              "start_ps": ev[1], "end_ps": ev[1], "since_ps": since,
                              "freed_by": links[ev[2]]["dst"]})
                actor, i, t = links[ev[2]]["dst"], int(takes[j]), ev[1]
                continue
            t = ev[1]
        else:
            t_ev = ev[1]
            if t > t_ev:
                steps.append({"kind": "idle", "actor": actor, "start_ps": t_ev, "end_ps": t})
                t = t_ev
        # step back to this actor's previous own event
        own = idx.own(actor)
        n = int(idx.pos[i])
        while n > 0 and ev_list[int(own[n - 1])][1] > t:
            n -= 1        # a busy span booked ahead of its start (Actor.busy(start=...)): not yet begun
        if n == 0:
            steps.append({"kind": "start", "actor": actor, "start_ps": 0, "end_ps": t})
            break
        i = int(own[n - 1])
    steps.reverse()
    return steps


def _message(links, li: int, seq: int, sent: int, delivered: int) -> dict:
    l = links[li]
    return {"kind": "message", "link": l["name"], "seq": seq, "start_ps": sent, "end_ps": delivered,
            "from": l["src"], "to": l["dst"]}


def _step_line(s: dict) -> str:
    span = f"{format_time(s['start_ps']):>10} -> {format_time(s['end_ps']):>10}"
    dur = format_time(s["end_ps"] - s["start_ps"])
    if s["kind"] == "busy":
        return f"{span}  busy     {s['actor']} [{s['label']}] {dur}"
    if s["kind"] == "idle":
        return f"{span}  idle     {s['actor']} {dur} (own wait: timer, or its queue while it worked)"
    if s["kind"] == "poll":
        return f"{span}  poll     {s['actor']} {dur} until its next poll of {s['via']} saw the news"
    if s["kind"] == "message":
        return f"{span}  message  {s['link']} #{s['seq']} ({dur} send->deliver)"
    if s["kind"] == "blocked":
        return (f"{span}  blocked  {s['actor']} on {s['link']} #{s['seq']} since {format_time(s['since_ps'])}, "
                f"until {s['freed_by']} took a message")
    return f"{span}  start    {s['actor']} starts on its own"


def _not_computed(out: list[str], title: str, why: str) -> None:
    out.append(f"{title}: not computed -- {why}")


def format_summary(s: dict, *, rows: int = 15) -> str:
    out = [f"trace of {s['scenario']} (seed {s['seed']}): {s['status']}, end {format_time(s['end_time_ps'])} "
           f"({s['end_time_ps']} ps), {s['events']} events, {s['faults']} fault event(s)"]
    missing = s.get("missing") or {}
    for e in s["errors"]:
        first = str(e["text"]).splitlines()[0] if e["text"] else ""
        out.append(f"  error at {format_time(e['t_ps'])} in {e['where']}: {first}")
    out.append("")
    if s["actors"] is None:
        _not_computed(out, "utilisation per actor", missing["utilisation"])
    else:
        out.append(f"utilisation per actor (busy / end time), top {min(rows, len(s['actors']))} of "
                   f"{len(s['actors'])}:")
        for r in s["actors"][:rows]:
            out.append(f"  {r['actor']:<32} {100 * r['utilisation']:6.2f} %  {format_time(r['busy_ps']):>10} busy"
                       f" in {r['spans']} span(s)")
    out.append("")
    if s["links"] is None:
        _not_computed(out, "links", missing["links"])
    else:
        out.append(f"links by bytes, top {min(rows, len(s['links']))} of {len(s['links'])} "
                   "(max depth: peak messages waiting in the receiving in-port):")
        for r in s["links"][:rows]:
            extra = f", {r['lost']} lost" if r["lost"] else ""
            extra += f", sender blocked {r['sender_blocked']}x" if r["sender_blocked"] else ""
            out.append(f"  {r['link']:<44} {r['messages']:6d} msgs {r['bytes']:10d} B  max depth {r['max_depth']}"
                       f"{extra}")
    out.append("")
    if s["longest_waits"] is None:
        _not_computed(out, "longest waits", missing["longest_waits"])
    else:
        out.append("longest waits in an in-port (deliver -> take):")
        if not s["longest_waits"]:
            out.append("  (none: every message was taken as it arrived)")
        for w in s["longest_waits"]:
            out.append(f"  {format_time(w['wait_ps']):>10}  {w['link']} #{w['seq']} (delivered "
                       f"{format_time(w['delivered_ps'])}, taken {format_time(w['taken_ps'])})")
    out.append("")
    cp = s["critical_path"]
    if cp is None:
        _not_computed(out, "critical path", missing["critical_path"])
        return "\n".join(out)
    end = s["end_time_ps"] or 1
    covered = (cp[-1]["end_ps"] - cp[0]["start_ps"]) if cp else 0
    out.append(f"critical path: {len(cp)} steps over {format_time(covered)} "
               f"({100 * covered / end:.0f} % of the run), ends at {format_time(cp[-1]['end_ps']) if cp else '-'}")
    by = s["critical_path_by_kind"]
    out.append("  time along it by component kind:")
    out.append(f"    {'kind':<14} {'busy':>10} {'idle':>10} {'share':>7}")
    for kind, v in list(by["components"].items())[:rows]:
        out.append(f"    {kind:<14} {format_time(v['busy_ps']):>10} {format_time(v['idle_ps']):>10} "
                   f"{100 * (v['busy_ps'] + v['idle_ps']) / end:6.1f}%")
    flights = sum(v["flight_ps"] for v in by["link_classes"].values())
    out.append(f"  message flights by link class ({format_time(flights)}, {100 * flights / end:.1f}% of the run):")
    for cls, v in list(by["link_classes"].items())[:rows]:
        out.append(f"    {cls:<40} {v['messages']:5d} msgs {format_time(v['flight_ps']):>10} "
                   f"{100 * v['flight_ps'] / end:6.1f}%")
    longest = sorted(range(len(cp)), key=lambda i: (-(cp[i]["end_ps"] - cp[i]["start_ps"]), i))[:rows]
    out.append(f"  its {len(longest)} longest steps, in time order (--json lists all {len(cp)}):")
    for i in sorted(longest):
        out.append("    " + _step_line(cp[i]))
    return "\n".join(out)
