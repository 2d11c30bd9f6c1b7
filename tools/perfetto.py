"""Export an ``.emutrace`` to Chrome / Perfetto trace-event JSON.

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

Virtual picoseconds become the format's microseconds as ``ps / 1e6`` (a float:
exact enough to display, the trace itself keeps the integers).

Output size is capped (``max_mb``): the JSON is generated event by event and
the export stops as soon as the cap is passed -- either refusing (default) or,
with ``trim``, keeping the events written so far and saying so.
"""
from __future__ import annotations

import fnmatch
import json
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


def _trace_events(trace: TraceFile, *, actors, kinds, start, end):
    """Yield trace-event dicts (after the metadata) for the selected events."""
    names = trace.actors
    links = trace.links

    def keep_actor(name: str) -> bool:
        return not actors or any(fnmatch.fnmatchcase(name, g) for g in actors)

    tracks = _Tracks(names, keep_actor)
    yield from tracks.meta
    codes = None if not kinds else {KIND_CODES[k] for k in kinds}
    lo = 0 if start is None else start
    hi = float("inf") if end is None else end
    sends: dict[tuple[int, int], int] = {}   # (link, seq) -> send time, for flows whose start was kept
    link_names = [l["name"] for l in links]

    def want(code: int) -> bool:
        return codes is None or code in codes

    for ev in trace.events:
        k = ev[0]
        if k == BUSY:
            _, t0, actor, t1, label = ev
            if not want(BUSY) or t1 < lo or t0 > hi:
                continue
            w = tracks.where(names[actor])
            if w is None:
                continue
            a, b = max(t0, lo), min(t1, hi)
            yield {"ph": "X", "name": str(label), "cat": "busy", "pid": w[0], "tid": w[1], "ts": _us(a),
                   "dur": _us(b - a), "args": {"t_ps": t0, "t_end_ps": t1}}
            continue
        t = ev[1]
        if t < lo or t > hi:
            continue
        if k == SEND:
            _, t, li, seq, nbytes, _payload = ev
            link = links[li]
            w = tracks.where(link["src"])
            if w is None or not want(SEND):
                continue
            yield {"ph": "X", "name": f"send {link['dst_port']}>{link['dst']}", "cat": "send", "pid": w[0],
                   "tid": w[1], "ts": _us(t), "dur": 0,
                   "args": {"link": link["name"], "seq": seq, "bytes": nbytes}}
            if tracks.where(link["dst"]) is not None and want(DELIVER):
                sends[(li, seq)] = t
                yield {"ph": "s", "name": "message", "cat": "msg", "id": li * 1_000_000_007 + seq, "pid": w[0],
                       "tid": w[1], "ts": _us(t)}
        elif k == DELIVER or k == TAKE:
            _, t, li, seq, depth = ev
            link = links[li]
            w = tracks.where(link["dst"])
            if w is None:
                continue
            if k == DELIVER and want(DELIVER):
                yield {"ph": "X", "name": f"deliver {link['src']}", "cat": "deliver", "pid": w[0], "tid": w[1],
                       "ts": _us(t), "dur": 0, "args": {"link": link["name"], "seq": seq, "depth": depth}}
                if sends.pop((li, seq), None) is not None:
                    yield {"ph": "f", "bp": "e", "name": "message", "cat": "msg", "id": li * 1_000_000_007 + seq,
                           "pid": w[0], "tid": w[1], "ts": _us(t)}
            if want(k):
                yield {"ph": "C", "name": f"queue {link['dst']}.{link['dst_port']}", "pid": w[0], "tid": w[1],
                       "ts": _us(t), "args": {"depth": depth}}
        elif k == FAULT:
            if not want(FAULT):
                continue
            _, t, target, label, detail = ev
            actor = target
            if target in link_names:
                actor = links[link_names.index(target)]["src"]
            w = tracks.where(actor) if isinstance(actor, str) else None
            if w is None and actors:
                continue
            e = {"ph": "i", "name": f"fault {label}", "cat": "fault", "ts": _us(t),
                 "args": {"target": target, "detail": _jsonable(detail)}}
            if w is None:
                e.update(pid=0, tid=0, s="g")
            else:
                e.update(pid=w[0], tid=w[1], s="t")
            yield e
        elif k == ERROR:
            if want(ERROR):
                _, t, where, text = ev
                yield {"ph": "i", "name": f"error {where}", "cat": "error", "s": "g", "pid": 0, "tid": 0,
                       "ts": _us(t), "args": {"where": str(where), "text": str(text)}}
        elif k in (MARK, DONE, BLOCK):
            if not want(k):
                continue
            if k == BLOCK:
                link = links[ev[2]]
                w = tracks.where(link["src"])
                name, args = f"blocked on {link['name']}", {"seq": ev[3]}
            elif k == MARK:
                w = tracks.where(names[ev[2]])
                name, args = str(ev[3]), {"value": _jsonable(ev[4])}
            else:
                w = tracks.where(names[ev[2]])
                name, args = "done", {}
            if w is None:
                continue
            yield {"ph": "i", "s": "t", "name": name, "cat": KINDS_NAME[k], "pid": w[0], "tid": w[1],
                   "ts": _us(t), "args": args}


KINDS_NAME = {MARK: "mark", DONE: "done", BLOCK: "block"}


def export_perfetto(trace: TraceFile, out_path: str, *, actors=None, kinds=None, start=None, end=None,
                    max_mb: float = 200.0, trim: bool = False) -> ExportStats:
    """Write ``trace`` as trace-event JSON to ``out_path``; returns what was written.

    Raises :class:`PerfettoTooLarge` (nothing written) when the output would
    exceed ``max_mb`` megabytes and ``trim`` is off.
    """
    if kinds:
        bad = [k for k in kinds if k not in KIND_CODES]
        if bad:
            raise ValueError(f"--kinds: unknown event kind(s) {', '.join(bad)} (known: {', '.join(KIND_CODES)})")
    cap = int(max_mb * 1_000_000)
    head = '{"displayTimeUnit":"ns","otherData":' + json.dumps({
        "scenario": str(trace.header.get("scenario")), "seed": trace.header.get("seed"),
        "mode": trace.header.get("mode"), "digest": trace.footer.get("digest"),
        "status": trace.footer.get("status"), "time_unit": "1 us in this file = 1e6 ps of virtual time"}) \
        + ',"traceEvents":[\n'
    tail = "\n]}\n"
    stats = ExportStats(bytes=len(head) + len(tail))
    parts: list[str] = []
    for e in _trace_events(trace, actors=actors, kinds=kinds, start=start, end=end):
        s = json.dumps(e, separators=(",", ":"))
        size = len(s) + 2
        if stats.bytes + size > cap:
            if not trim:
                raise PerfettoTooLarge(
                    f"the Perfetto JSON would exceed {max_mb:g} MB (passed it after {stats.events} trace events); "
                    "narrow it with --actors/--kinds/--start/--end, raise --max-mb, or use --trim to keep the "
                    "first events up to the cap")
            stats.trimmed = True
            break
        parts.append(s)
        stats.bytes += size
        stats.events += 1
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(head)
        f.write(",\n".join(parts))
        f.write(tail)
    return stats
