"""Export an ``.emutrace`` for ui.perfetto.dev: native Perfetto protobuf (``.pftrace``) or trace-event JSON.

Why this layout: an architect opens the file in ui.perfetto.dev and wants to
see the machine's hierarchy, what each engine was doing, where each message
went and how full the queues were.  So:

* one *process* per top-level group of the actor name (``cube05``, ``ring``),
  one *thread* per actor (``thread_name`` / ``process_name`` metadata);
* busy spans become complete slices (``ph: "X"``);
* every message becomes a zero-length ``send`` slice on the sender, a
  zero-length ``deliver`` slice on the receiver, and a flow arrow between them
  (``ph: "s"`` / ``"f"`` with the same ``id``; flow ends bind to the enclosing
  slice, which is why the zero-length slices exist);
* the in-port queue depth (``depth`` of DELIVER / TAKE) is a counter track per
  in-port (``ph: "C"``);
* faults, errors, marks, blocked sends and actor completions are instant events.

Two encodings of the same events (:func:`_trace_events` yields them once, as
trace-event dicts):

* **protobuf** (``.pftrace``, the default; Perfetto's own ``perfetto_trace_pb2``
  from the ``perfetto`` package): a ``TrackDescriptor`` per process, actor and
  counter, ``TrackEvent`` slices / instants / counters with their names and
  categories interned (each distinct name written once), flows as ``flow_ids``.
  Perfetto counts integer nanoseconds, so **one virtual picosecond is written as
  one nanosecond** (exact: the UI's "ns" read as ps, its "us" as ns; the first
  track says so).  Busy spans that overlap on one actor (a GEMM's drain under the
  next command) go on a second lane of that actor (a slice track must nest);
* **JSON** (``.json``): Chrome trace-event format; virtual ps become its
  microseconds as ``ps / 1e6`` (a float: exact enough to display).

Both stream: the trace is read event by event (:class:`emulator.trace.TraceStream`,
payloads dropped) and written as it goes, so memory stays flat.  Output size is
capped (``max_mb``): at the cap the export refuses (default) or, with ``trim``,
keeps what was written and says what it cut (:class:`ExportStats`: events left
out, the virtual time where the file stops) -- never silently.
"""
from __future__ import annotations

import bisect
import fnmatch
import itertools
import json
import os
from dataclasses import dataclass

from emulator.trace import BLOCK, BUSY, DELIVER, DONE, ERROR, FAULT, KIND_CODES, MARK, SEND, TAKE, TraceFile

__all__ = ["export_perfetto", "PerfettoTooLarge", "ExportStats"]


class PerfettoTooLarge(ValueError):
    """The JSON would exceed the size cap (a clear message, never a traceback)."""


@dataclass
class ExportStats:
    events: int = 0         # trace-event objects written
    bytes: int = 0
    trimmed: bool = False   # the cap was reached and later events were left out
    format: str = "json"
    stopped_at_ps: int | None = None   # with ``trimmed``: the virtual time of the first event left out
    left_out: int = 0                   # with ``trimmed``: emulator events not exported (of ``total``)
    total: int = 0                      # emulator events in the trace

    def cut_note(self, max_mb: float) -> str:
        """What a trimmed export cut, in one sentence ('' when nothing was cut)."""
        if not self.trimmed:
            return ""
        from emulator.units import format_time
        at = format_time(self.stopped_at_ps) if self.stopped_at_ps is not None else "?"
        return (f"trimmed at the {max_mb:g} MB cap: the file stops at virtual time {at}; "
                f"{self.left_out:,} of {self.total:,} trace events after it are not in it")


def _us(ps: int) -> float:
    return ps / 1e6


def _group(name: str) -> str:
    return name.split("/", 1)[0]


def _jsonable(v):
    if isinstance(v, (bytes, bytearray)):
        return f"<{len(v)} bytes>"
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return v


class _Tracks:
    """pid/tid assignment: deterministic, in the order of the header's actor list."""

    def __init__(self, actors: list[str], keep):
        self.pid: dict[str, int] = {}
        self.tid: dict[str, int] = {}
        self.actor_pid: dict[str, int] = {}
        self.meta: list[dict] = []
        for i, name in enumerate(actors):
            if not keep(name):
                continue
            g = _group(name)
            if g not in self.pid:
                self.pid[g] = len(self.pid) + 1
                self.meta.append({"ph": "M", "name": "process_name", "pid": self.pid[g], "tid": 0,
                                  "args": {"name": g}})
                self.meta.append({"ph": "M", "name": "process_sort_index", "pid": self.pid[g], "tid": 0,
                                  "args": {"sort_index": self.pid[g]}})
            pid = self.pid[g]
            self.actor_pid[name] = pid
            self.tid[name] = i + 1
            self.meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": i + 1, "args": {"name": name}})
            self.meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": i + 1,
                              "args": {"sort_index": i + 1}})

    def where(self, actor: str) -> tuple[int, int] | None:
        pid = self.actor_pid.get(actor)
        return None if pid is None else (pid, self.tid[actor])


def _trace_events(trace: TraceFile, *, actors, kinds, start, end, position=None):
    """Yield trace-event dicts (after the metadata) for the selected events of ``trace`` (a
    :class:`TraceFile` or a :class:`~emulator.trace.TraceStream`: anything with header and events);
    ``position`` (a one-item list) is kept at ``[index, time]`` of the emulator event being exported."""
    conv = _EventConverter(trace, actors, kinds, start, end)
    yield from conv.tracks.meta
    handlers = {BUSY: conv.busy, SEND: conv.send, DELIVER: conv.arrival, TAKE: conv.arrival,
                FAULT: conv.fault, ERROR: conv.error, MARK: conv.instant, DONE: conv.instant, BLOCK: conv.instant}
    lo, hi = conv.lo, conv.hi
    events = trace.events if isinstance(trace, TraceFile) else trace
    for n, ev in enumerate(events):
        if position is not None:
            position[0] = (n, ev[1])
        k = ev[0]
        if k != BUSY and (ev[1] < lo or ev[1] > hi):   # a busy span is kept when it overlaps the window
            continue
        handler = handlers.get(k)
        if handler is not None:
            yield from handler(ev)


class _EventConverter:
    """One emulator event kind -> the trace-event dicts that show it (zero or more), for the selected
    actors, kinds and time window; remembers the kept sends so their deliveries get a flow arrow."""

    def __init__(self, trace, actors, kinds, start, end):
        self.names = trace.actors
        self.links = trace.links
        self.link_names = [l["name"] for l in self.links]
        self.actors = actors
        self.tracks = _Tracks(self.names, lambda name: not actors or any(fnmatch.fnmatchcase(name, g) for g in actors))
        self.codes = None if not kinds else {KIND_CODES[k] for k in kinds}
        self.lo = 0 if start is None else start
        self.hi = float("inf") if end is None else end
        self.sends: dict[tuple[int, int], int] = {}   # (link, seq) -> send time, for flows whose start was kept

    def want(self, code: int) -> bool:
        return self.codes is None or code in self.codes

    def busy(self, ev):
        _, t0, actor, t1, label = ev
        if not self.want(BUSY) or t1 < self.lo or t0 > self.hi:
            return
        w = self.tracks.where(self.names[actor])
        if w is None:
            return
        a, b = max(t0, self.lo), min(t1, self.hi)
        yield {"ph": "X", "name": str(label), "cat": "busy", "pid": w[0], "tid": w[1], "ts": _us(a),
               "dur": _us(b - a), "args": {"t_ps": t0, "t_end_ps": t1}, "_t": a, "_d": b - a}

    def send(self, ev):
        _, t, li, seq, nbytes, _payload = ev
        link = self.links[li]
        w = self.tracks.where(link["src"])
        if w is None or not self.want(SEND):
            return
        yield {"ph": "X", "name": f"send {link['dst_port']}>{link['dst']}", "cat": "send", "pid": w[0],
               "tid": w[1], "ts": _us(t), "_t": t, "dur": 0,
               "args": {"link": link["name"], "seq": seq, "bytes": nbytes}}
        if self.tracks.where(link["dst"]) is not None and self.want(DELIVER):
            self.sends[(li, seq)] = t
            yield {"ph": "s", "name": "message", "cat": "msg", "id": li * 1_000_000_007 + seq, "pid": w[0],
                   "tid": w[1], "ts": _us(t), "_t": t}

    def arrival(self, ev):
        """A delivery (with the end of its flow arrow) or a take: the receiving queue's depth counter."""
        k, t, li, seq, depth = ev
        link = self.links[li]
        w = self.tracks.where(link["dst"])
        if w is None:
            return
        if k == DELIVER and self.want(DELIVER):
            yield {"ph": "X", "name": f"deliver {link['src']}", "cat": "deliver", "pid": w[0], "tid": w[1],
                   "ts": _us(t), "_t": t, "dur": 0, "args": {"link": link["name"], "seq": seq, "depth": depth}}
            if self.sends.pop((li, seq), None) is not None:
                yield {"ph": "f", "bp": "e", "name": "message", "cat": "msg", "id": li * 1_000_000_007 + seq,
                       "pid": w[0], "tid": w[1], "ts": _us(t), "_t": t}
        if self.want(k):
            yield {"ph": "C", "name": f"queue {link['dst']}.{link['dst_port']}", "pid": w[0], "tid": w[1],
                   "ts": _us(t), "_t": t, "args": {"depth": depth}}

    def fault(self, ev):
        """A fault instant on its target's track (a link's fault on its sender), global if not shown."""
        if not self.want(FAULT):
            return
        _, t, target, label, detail = ev
        actor = target
        if target in self.link_names:
            actor = self.links[self.link_names.index(target)]["src"]
        w = self.tracks.where(actor) if isinstance(actor, str) else None
        if w is None and self.actors:
            return
        e = {"ph": "i", "name": f"fault {label}", "cat": "fault", "ts": _us(t), "_t": t,
             "args": {"target": target, "detail": _jsonable(detail)}}
        e.update(pid=0, tid=0, s="g") if w is None else e.update(pid=w[0], tid=w[1], s="t")
        yield e

    def error(self, ev):
        if self.want(ERROR):
            _, t, where, text = ev
            yield {"ph": "i", "name": f"error {where}", "cat": "error", "s": "g", "pid": 0, "tid": 0,
                   "ts": _us(t), "_t": t, "args": {"where": str(where), "text": str(text)}}

    def instant(self, ev):
        """A mark, an actor's end or a blocked send: an instant on the actor's (the sender's) track."""
        k, t = ev[0], ev[1]
        if not self.want(k):
            return
        if k == BLOCK:
            link = self.links[ev[2]]
            w = self.tracks.where(link["src"])
            name, args = f"blocked on {link['name']}", {"seq": ev[3]}
        elif k == MARK:
            w = self.tracks.where(self.names[ev[2]])
            name, args = str(ev[3]), {"value": _jsonable(ev[4])}
        else:
            w = self.tracks.where(self.names[ev[2]])
            name, args = "done", {}
        if w is not None:
            yield {"ph": "i", "s": "t", "name": name, "cat": KINDS_NAME[k], "pid": w[0], "tid": w[1],
                   "ts": _us(t), "_t": t, "args": args}


KINDS_NAME = {MARK: "mark", DONE: "done", BLOCK: "block"}


def power_events(series: dict, pid: int = 10**6):
    """Trace-event dicts of a power profile (tools/run/power.py): one counter track per component class and
    one for the total, in mW, under a process named ``power (energy model)``; a counter value per window."""
    yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "power (energy model)"}}
    yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "power"}}
    rows = {"total": series["total_w"], **series["by_class_w"]}
    for name, ws in rows.items():
        for t, w in zip(series["t_ps"], ws):
            yield {"ph": "C", "name": f"power {name} (mW)", "pid": pid, "tid": 1, "ts": _us(t), "_t": t,
                   "args": {"mW": int(round(w * 1000))}}


def export_perfetto(trace, out_path: str, *, actors=None, kinds=None, start=None, end=None,
                    max_mb: float = 200.0, trim: bool = False, fmt: str | None = None,
                    power: dict | None = None) -> ExportStats:
    """Write ``trace`` (a :class:`TraceFile` or a :class:`~emulator.trace.TraceStream`) to ``out_path`` as
    Perfetto protobuf (``fmt="proto"``, the default for a ``.pftrace`` / ``.perfetto-trace`` name) or JSON.

    Raises :class:`PerfettoTooLarge` (nothing written) when the output would
    exceed ``max_mb`` megabytes and ``trim`` is off; with ``trim`` the stats say what was cut.
    """
    if kinds:
        bad = [k for k in kinds if k not in KIND_CODES]
        if bad:
            raise ValueError(f"--kinds: unknown event kind(s) {', '.join(bad)} (known: {', '.join(KIND_CODES)})")
    if fmt is None:
        fmt = "json" if str(out_path).endswith(".json") else "proto"
    if fmt not in ("json", "proto"):
        raise ValueError(f"--format: expected json or proto, found {fmt!r}")
    cap = int(max_mb * 1_000_000)
    writer = (_ProtoWriter if fmt == "proto" else _JsonWriter)(trace)
    stats = ExportStats(format=fmt)
    position = [(0, 0)]
    tmp = f"{out_path}.tmp"
    try:
        with open(tmp, "wb") as f:
            stats.bytes = writer.begin(f)
            events = _trace_events(trace, actors=actors, kinds=kinds, start=start, end=end, position=position)
            if power is not None:    # the power counter tracks (docs/energy.md), after the trace's events
                events = itertools.chain(events, power_events(power))
            for e in events:
                size = writer.size(e)
                if stats.bytes + size > cap:
                    if not trim:
                        raise PerfettoTooLarge(
                            f"the Perfetto output would exceed {max_mb:g} MB (passed it after {stats.events} trace "
                            "events); narrow it with --actors/--kinds/--start/--end, raise --max-mb, or use --trim to "
                            "keep the first events up to the cap")
                    stats.trimmed = True
                    stats.stopped_at_ps = position[0][1]
                    stats.left_out = -position[0][0]       # completed below, once the total is known
                    break
                writer.write(f)
                stats.bytes += size
                stats.events += 1
            footer = trace.footer if isinstance(trace, TraceFile) else None
            if stats.trimmed:
                total = len(trace.events) if isinstance(trace, TraceFile) else None
                if total is None:                          # a stream: count what is left without writing it
                    total = position[0][0] + sum(1 for _ in _rest(trace, position[0][0]))
                stats.total = total
                stats.left_out += total
            else:
                stats.total = position[0][0] + 1 if stats.events else 0
            footer = trace.footer if footer is None else footer
            stats.bytes += writer.end(f, footer, stats.cut_note(max_mb) if stats.trimmed else "")
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return stats


def _rest(stream, done: int):
    """The events of a stream after the first ``done`` (re-read: the export stopped in the middle)."""
    for n, ev in enumerate(stream):
        if n >= done:
            yield ev


#: bytes kept free under the cap for what an export writes last (it names what a trimmed export cut)
TAIL_RESERVE = 1000


class _JsonWriter:
    """Chrome trace-event JSON: ``{"traceEvents": [...], "otherData": {...}}`` (the footer goes last)."""

    def __init__(self, trace):
        self.header = trace.header
        self.first = True
        self._s = b""

    def begin(self, f) -> int:
        head = b'{"displayTimeUnit":"ns","traceEvents":[\n'
        f.write(head)
        return len(head) + TAIL_RESERVE      # the tail written at the end (otherData), reserved

    def size(self, e: dict) -> int:
        e = {k: v for k, v in e.items() if k[0] != "_"}      # the exact ps fields are for the proto writer
        self._s = (b"" if self.first else b",\n") + json.dumps(e, separators=(",", ":")).encode()
        return len(self._s)

    def write(self, f) -> None:
        f.write(self._s)
        self.first = False

    def end(self, f, footer: dict, note: str) -> int:
        other = {"scenario": str(self.header.get("scenario")), "seed": self.header.get("seed"),
                 "mode": self.header.get("mode"), "digest": footer.get("digest"), "status": footer.get("status"),
                 "time_unit": "1 us in this file = 1e6 ps of virtual time"}
        if note:
            other["trimmed"] = note
        tail = ("\n],\"otherData\":" + json.dumps(other) + "}\n").encode()
        f.write(tail)
        return len(tail) - TAIL_RESERVE


class _ProtoWriter:
    """Perfetto's ``Trace`` proto, one ``TracePacket`` at a time (field 1 of ``Trace``, length-prefixed)."""

    SEQ = 1          # trusted_packet_sequence_id of every packet

    def __init__(self, trace):
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
        self.pb = pb
        self.header = trace.header
        self.names: dict[str, int] = {}          # interned event names -> iid
        self.cats: dict[str, int] = {}
        self.annos: dict[str, int] = {}
        self.strings: dict[str, int] = {}
        self.tracks: dict = {}                   # (pid, tid) -> uuid of the actor's track, lanes separately
        self.lanes: dict = {}                    # (pid, tid) -> [sorted [(start, end)] per lane]
        self.counters: dict = {}                 # (pid, tid, name) -> uuid
        self.proc: dict = {}                     # pid -> uuid
        self.thread_names: dict = {}             # (pid, tid) -> name
        self.pending_slice = None                # a zero-length message slice awaiting its flow event
        self._out: list[bytes] = []
        self.first = True

    # -- framing ---------------------------------------------------------------
    def _frame(self, packet) -> None:
        packet.trusted_packet_sequence_id = self.SEQ
        if self.first:
            packet.sequence_flags = self.pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            packet.first_packet_on_sequence = True
            self.first = False
        elif packet.HasField("track_event"):
            packet.sequence_flags = self.pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        body = packet.SerializeToString()
        n, head = len(body), bytearray([0x0A])   # Trace.packet = field 1, wire type 2
        while True:
            b = n & 0x7F
            n >>= 7
            head.append(b | (0x80 if n else 0))
            if not n:
                break
        self._out.append(bytes(head) + body)

    def begin(self, f) -> int:
        p = self.pb.TracePacket()
        d = p.track_descriptor
        d.uuid = 1
        d.name = "virtual time: 1 ns shown = 1 ps of the run (exact)"
        self._frame(p)
        data = b"".join(self._out)
        self._out.clear()
        f.write(data)
        return len(data) + TAIL_RESERVE      # the closing descriptor (status, digest, what was cut), reserved

    def size(self, e: dict) -> int:
        self._out.clear()
        self._encode(e)
        return sum(map(len, self._out))

    def write(self, f) -> None:
        f.write(b"".join(self._out))
        self._out.clear()

    def end(self, f, footer: dict, note: str) -> int:
        self._out.clear()
        self._flush_pending()
        p = self.pb.TracePacket()
        d = p.track_descriptor
        d.uuid = 2
        d.name = (f"{self.header.get('scenario')} (seed {self.header.get('seed')}, {self.header.get('mode')}): "
                  f"{footer.get('status')}, digest {footer.get('digest')}" + (f"; {note}" if note else ""))
        self._frame(p)
        data = b"".join(self._out)
        f.write(data)
        return len(data) - TAIL_RESERVE

    # -- interning and tracks ---------------------------------------------------
    def _iid(self, table: dict, kind: str, name: str, packet) -> int:
        iid = table.get(name)
        if iid is None:
            iid = table[name] = len(table) + 1
            entry = getattr(packet.interned_data, kind).add()
            entry.iid = iid
            entry.name = name
        return iid

    def _thread(self, pid: int, tid: int) -> int:
        uuid = self.tracks.get((pid, tid))
        if uuid is None:
            uuid = self.tracks[(pid, tid)] = 1000 + len(self.tracks) * 8
            p = self.pb.TracePacket()
            d = p.track_descriptor
            d.uuid = uuid
            d.parent_uuid = self.proc.get(pid, 0)
            d.thread.pid, d.thread.tid = pid, tid
            d.thread.thread_name = self.thread_names.get((pid, tid), str(tid))
            self._frame(p)
        return uuid

    def _lane(self, pid: int, tid: int, t0: int, t1: int) -> int:
        """The track of a busy span: the actor's own, or a lane below it where it would overlap a span there."""
        lanes = self.lanes.setdefault((pid, tid), [])
        for n, spans in enumerate(lanes):
            i = bisect.bisect_left(spans, (t0, t1))
            if (i == 0 or spans[i - 1][1] <= t0) and (i == len(spans) or t1 <= spans[i][0]):
                spans.insert(i, (t0, t1))
                return self._thread(pid, tid) if n == 0 else self._extra_lane(pid, tid, n)
        lanes.append([(t0, t1)])
        n = len(lanes) - 1
        return self._thread(pid, tid) if n == 0 else self._extra_lane(pid, tid, n)

    def _extra_lane(self, pid: int, tid: int, n: int) -> int:
        key = (pid, tid, n)
        uuid = self.tracks.get(key)
        if uuid is None:
            uuid = self.tracks[key] = self._thread(pid, tid) + n
            p = self.pb.TracePacket()
            d = p.track_descriptor
            d.uuid = uuid
            d.parent_uuid = self.proc.get(pid, 0)
            d.name = f"{self.thread_names.get((pid, tid), tid)} (overlapping spans, lane {n + 1})"
            self._frame(p)
        return uuid

    def _counter(self, pid: int, tid: int, name: str) -> int:
        key = (pid, tid, name)
        uuid = self.counters.get(key)
        if uuid is None:
            uuid = self.counters[key] = 10**9 + len(self.counters)
            p = self.pb.TracePacket()
            d = p.track_descriptor
            d.uuid = uuid
            d.parent_uuid = self._thread(pid, tid)
            d.name = name
            d.counter.SetInParent()
            self._frame(p)
        return uuid

    # -- events -----------------------------------------------------------------
    def _event(self, e: dict, track: int, kind: int, ts_ps: int):
        p = self.pb.TracePacket()
        p.timestamp = ts_ps
        te = p.track_event
        te.type = kind
        te.track_uuid = track
        if kind != self.pb.TrackEvent.TYPE_COUNTER:
            te.name_iid = self._iid(self.names, "event_names", e["name"], p)
            if e.get("cat"):
                te.category_iids.append(self._iid(self.cats, "event_categories", e["cat"], p))
            for k, v in (e.get("args") or {}).items():
                if k in ("t_ps", "t_end_ps"):
                    continue
                a = te.debug_annotations.add()
                a.name_iid = self._iid(self.annos, "debug_annotation_names", k, p)
                if isinstance(v, bool):
                    a.bool_value = v
                elif isinstance(v, int):
                    a.int_value = v
                else:                                  # link names etc.: interned, each written once
                    text = v if isinstance(v, str) else json.dumps(v)
                    iid = self.strings.get(text)
                    if iid is None:
                        iid = self.strings[text] = len(self.strings) + 1
                        entry = p.interned_data.debug_annotation_string_values.add()
                        entry.iid, entry.str = iid, text.encode()
                    a.string_value_iid = iid
        return p

    def _flush_pending(self) -> None:
        if self.pending_slice is not None:
            for p in self.pending_slice:
                self._frame(p)
            self.pending_slice = None

    def _encode(self, e: dict) -> None:
        pb, ph = self.pb, e["ph"]
        T = pb.TrackEvent
        if ph in ("s", "f"):                      # a flow end: onto the message slice it follows
            if self.pending_slice is not None:
                begin = self.pending_slice[0].track_event
                (begin.flow_ids if ph == "s" else begin.terminating_flow_ids).append(e["id"])
            self._flush_pending()
            return
        self._flush_pending()
        if ph == "M":
            if e["name"] == "process_name":
                p = pb.TracePacket()
                d = p.track_descriptor
                d.uuid = self.proc[e["pid"]] = 100 + e["pid"]
                d.process.pid = e["pid"]
                d.process.process_name = e["args"]["name"]
                self._frame(p)
            elif e["name"] == "thread_name":
                self.thread_names[(e["pid"], e["tid"])] = e["args"]["name"]
                self._thread(e["pid"], e["tid"])
            return
        if ph == "X":
            t0 = e["_t"]
            t1 = t0 + e.get("_d", 0)
            if not e.get("_d"):                          # a message slice: an instant that carries the flow
                self.pending_slice = [self._event(e, self._thread(e["pid"], e["tid"]), T.TYPE_INSTANT, t0)]
                return
            track = self._lane(e["pid"], e["tid"], t0, t1)
            self._frame(self._event(e, track, T.TYPE_SLICE_BEGIN, t0))
            end = pb.TracePacket()
            end.timestamp = t1
            end.track_event.type = T.TYPE_SLICE_END
            end.track_event.track_uuid = track
            self._frame(end)
        elif ph == "C":
            track = self._counter(e["pid"], e["tid"], e["name"])
            p = self._event(e, track, T.TYPE_COUNTER, e["_t"])
            p.track_event.counter_value = int(next(iter(e["args"].values())))
            self._frame(p)
        elif ph == "i":
            track = self._thread(e["pid"], e["tid"]) if e.get("pid") else 1
            self._frame(self._event(e, track, T.TYPE_INSTANT, e["_t"]))
