"""The event stream of a run: digest always, binary trace file on request.

Every run records its events as small tuples (first element: a kind code, second
the virtual time in ps).  Events are packed with msgpack in chunks; the
concatenation of the packed events (independent of chunk boundaries) feeds an
XXH3-128 hash: that is the run's **digest** (32 hex digits).  Two runs with the
same scenario and seed produce the same bytes, hence the same digest, in any
process.  (Until issue #13 the digest was the sha256 of the same bytes; sha256
ran at 0.4-1.8 GB/s on the shared 2-core machine and cost ~7 % of a data-mode
run whose messages carry arrays, XXH3 runs at tens of GB/s.  ``EMU_DIGEST=sha256``
computes the old digest, to compare with digests recorded before.)

The optional trace file (``.emutrace``) is a msgpack stream:

1. a header map: ``format``, ``version``, ``scenario``, ``seed``, ``mode``,
   ``versions`` (emulator, python, trio, numpy, msgpack), ``actors`` (names by
   id), ``links`` (one map per link), ``event_kinds``;
2. one msgpack array per event (see ``KINDS`` below);
3. a footer map: ``end_time_ps``, ``events``, ``digest``, ``status``.

With no filter and ``payloads`` on, the event bytes of the file are exactly the
bytes hashed into the digest.  Filters (kinds, actor/link globs) and dropping
payloads only change what is written, never the digest.

Events are in emission order, which is deterministic but not sorted by time:
a busy span is recorded when it is scheduled, possibly before it starts
(``Actor.busy(start=...)``).  Tools sort by time where they need to.

Recording costs one tuple append per event on the hot path; packing and
hashing happen in batches of ``CHUNK`` events.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import msgpack
import xxhash

__all__ = [
    "SEND", "DELIVER", "TAKE", "BUSY", "FAULT", "ERROR", "MARK", "DONE", "BLOCK",
    "KINDS", "KIND_CODES", "TraceOptions", "Recorder", "read_trace", "TraceFile", "TraceStream",
]

# kind code: (name, field names after the kind code)
SEND = 0      # (0, t, link, seq, nbytes, payload)  message accepted by a link
DELIVER = 1   # (1, t, link, seq, depth)            message placed in the receiver's in-port; depth after
TAKE = 2      # (2, t, link, seq, depth)            receiver consumed it; depth after
BUSY = 3      # (3, t_start, actor, t_end, label)   an engine busy span
FAULT = 4     # (4, t, target, kind, detail)        an injected fault took effect
ERROR = 5     # (5, t, where, text)                 an error ended the run
MARK = 6      # (6, t, actor, name, value)          an actor-defined annotation
DONE = 7      # (7, t, actor)                       an actor's task returned
BLOCK = 8     # (8, t, link, seq)                   a sender found no credit and blocked

KINDS = {
    SEND: ("send", ("t", "link", "seq", "nbytes", "payload")),
    DELIVER: ("deliver", ("t", "link", "seq", "depth")),
    TAKE: ("take", ("t", "link", "seq", "depth")),
    BUSY: ("busy", ("t", "actor", "t_end", "label")),
    FAULT: ("fault", ("t", "target", "kind", "detail")),
    ERROR: ("error", ("t", "where", "text")),
    MARK: ("mark", ("t", "actor", "name", "value")),
    DONE: ("done", ("t", "actor")),
    BLOCK: ("block", ("t", "link", "seq")),
}
KIND_CODES = {name: code for code, (name, _) in KINDS.items()}

#: events packed and hashed per batch.  Small on purpose: a SEND event holds its message's bytes until
#: the flush, and 8192 events of a data-mode run (4 KiB partials in the reduce) kept ~8 MiB alive, out
#: of the CPU caches: the numpy work between flushes ran ~6 % slower (issue #13, ``emu bench engine``
#: reduce 101 -> 95 us/msg).  A flush costs a few microseconds, ~0.01 us per event at this size.
CHUNK = 256

#: digest functions over the event bytes; the default, and sha256 for comparing with old digests
DIGESTS = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}
DIGEST = os.environ.get("EMU_DIGEST", "xxh3_128")
FORMAT = "emutrace"
FORMAT_VERSION = 1


@dataclass
class TraceOptions:
    """What the trace file contains (the digest always covers everything)."""

    path: str | None = None
    payloads: bool = True
    kinds: set[str] | None = None          # None = all kinds
    actors: list[str] | None = None        # globs over actor names (BUSY, MARK, DONE, FAULT)
    links: list[str] | None = None         # globs over link names (SEND, DELIVER, TAKE, BLOCK)


def _array_header_len(n: int) -> int:
    return 1 if n < 16 else 3 if n < 65536 else 5


class Recorder:
    """Collects events; keeps the digest; writes the trace file when asked."""

    def __init__(self, options: TraceOptions | None = None):
        self.options = options or TraceOptions()
        self.events: list = []
        self.count = 0
        if DIGEST not in DIGESTS:
            raise ValueError(f"EMU_DIGEST={DIGEST!r}: expected one of {', '.join(DIGESTS)}")
        self._hash = DIGESTS[DIGEST]()
        # flush packs into this packer's own buffer and hashes/writes a view of it (no copy of the
        # chunk into a bytes object: a data-mode chunk is megabytes of payload)
        self._packer = msgpack.Packer(use_bin_type=True, autoreset=False)
        self._file = None
        self._keep = None          # per-event predicate for the file, None = everything
        self._strip_payload = not self.options.payloads
        self.emit = self.events.append  # the hot path

    def tap(self, fn) -> None:
        """Also pass every event to ``fn(event)`` as it is emitted (e.g. replay watching one actor).

        Call it before actors and links are added to the system: they bind ``emit`` then.  Without a
        tap the hot path stays a bare ``list.append``.
        """
        append = self.events.append

        def emit(ev):
            fn(ev)
            append(ev)

        self.emit = emit

    # -- lifecycle ------------------------------------------------------------
    def open(self, header: dict) -> None:
        """Start the trace file (if a path is set) with ``header``."""
        opts = self.options
        if opts.path is None:
            return
        self._file = open(opts.path, "wb")
        self._file.write(msgpack.packb({"format": FORMAT, "version": FORMAT_VERSION, **header}, use_bin_type=True))
        self._keep = self._make_filter(header)

    def _make_filter(self, header: dict):
        opts = self.options
        if opts.kinds is None and opts.actors is None and opts.links is None:
            return None
        kinds = None if opts.kinds is None else {KIND_CODES[k] for k in opts.kinds}
        actor_ok = [True] * len(header.get("actors", []))
        if opts.actors is not None:
            actor_ok = [any(fnmatch.fnmatchcase(a, g) for g in opts.actors) for a in header["actors"]]
        link_ok = [True] * len(header.get("links", []))
        if opts.links is not None:
            link_ok = [any(fnmatch.fnmatchcase(l["name"], g) for g in opts.links) for l in header["links"]]

        def keep(ev) -> bool:
            k = ev[0]
            if kinds is not None and k not in kinds:
                return False
            if k in (SEND, DELIVER, TAKE, BLOCK):
                return link_ok[ev[2]]
            if k in (BUSY, MARK, DONE):
                return actor_ok[ev[2]]
            return True

        return keep

    def flush(self) -> None:
        events = self.events
        if not events:
            return
        n = len(events)
        packer = self._packer
        try:
            try:
                packer.pack(events)
            except OverflowError:
                events.clear()   # they cannot be recorded: the run fails (System.run says why)
                raise
            with packer.getbuffer() as packed:
                body = packed[_array_header_len(n):]
                self._hash.update(body)
                if self._file is not None and self._keep is None and not self._strip_payload:
                    self._file.write(body)
                body.release()
        finally:
            packer.reset()
        self.count += n
        if self._file is not None and (self._keep is not None or self._strip_payload):
            kept = events if self._keep is None else [e for e in events if self._keep(e)]
            if self._strip_payload:
                kept = [e[:5] + (None,) if e[0] == SEND else e for e in kept]
            if kept:
                p = msgpack.packb(kept, use_bin_type=True)
                self._file.write(memoryview(p)[_array_header_len(len(kept)):])
        events.clear()

    def maybe_flush(self) -> None:
        if len(self.events) >= CHUNK:
            self.flush()

    def close(self, footer: dict) -> str:
        """Flush, finish the file with ``footer`` and return the digest (hex)."""
        self.flush()
        digest = self._hash.hexdigest()
        if self._file is not None:
            self._file.write(msgpack.packb({**footer, "events": self.count, "digest": digest}, use_bin_type=True))
            self._file.close()
            self._file = None
        return digest

    @property
    def digest(self) -> str:
        return self._hash.copy().hexdigest()


class TraceHeader:
    """What every reader of a trace offers from its header: the actor names and the links, by id."""

    header: dict

    @property
    def actors(self) -> list[str]:
        return self.header["actors"]

    @property
    def links(self) -> list[dict]:
        return self.header["links"]

    def describe(self, ev) -> str:
        """One readable line for an event."""
        name, fields = KINDS.get(ev[0], (f"kind{ev[0]}", ()))
        parts = []
        for fname, value in zip(fields, ev[1:]):
            if fname == "link" and isinstance(value, int) and value < len(self.links):
                value = self.links[value]["name"]
            elif fname == "actor" and isinstance(value, int) and value < len(self.actors):
                value = self.actors[value]
            elif fname == "payload" and isinstance(value, (bytes, bytearray)):
                value = f"<{len(value)} bytes>"
            parts.append(f"{fname}={value}")
        return f"{name} " + " ".join(parts)



@dataclass
class TraceFile(TraceHeader):
    """A trace file read back: header, events (tuples), footer."""

    header: dict
    events: list = field(default_factory=list)
    footer: dict = field(default_factory=dict)

    def of_kind(self, *names: str) -> Iterator[tuple]:
        codes = {KIND_CODES[n] for n in names}
        return (e for e in self.events if e[0] in codes)


def iter_trace(path: str) -> Iterator:
    """Stream the objects of a trace file (header, events, footer) without loading it whole."""
    with open(path, "rb") as f:
        unpacker = msgpack.Unpacker(f, raw=False, use_list=False, strict_map_key=False, max_buffer_size=2**31 - 1)
        yield from unpacker


def _check_header(path: str, header: dict) -> None:
    actors, links = header.get("actors"), header.get("links")
    if not isinstance(actors, (list, tuple)) or not all(isinstance(a, str) for a in actors):
        raise ValueError(f"{path}: corrupt trace header (no actor name list)")
    if not isinstance(links, (list, tuple)) or not all(isinstance(l, dict) and "name" in l for l in links):
        raise ValueError(f"{path}: corrupt trace header (no link list)")


#: per kind code: (event length, field 2 is a link index, field 2 is an actor index), for the fast check
_SHAPE = {code: (len(fields) + 1, "link" in fields, "actor" in fields) for code, (_, fields) in KINDS.items()}


def _check_event(path: str, index: int, ev, n_actors: int, n_links: int) -> None:
    """A well-formed event passes in a few comparisons; anything else gets the full check and its message."""
    try:
        size, link, actor = _SHAPE[ev[0]]
        if len(ev) == size and ev[1].__class__ is int and (
                not (link or actor) or (ev[2].__class__ is int and 0 <= ev[2] < (n_links if link else n_actors))):
            return
    except (TypeError, KeyError, IndexError):
        pass
    _check_event_fully(path, index, ev, n_actors, n_links)


def _check_event_fully(path: str, index: int, ev, n_actors: int, n_links: int) -> None:
    if not isinstance(ev, (list, tuple)) or not ev or ev[0] not in KINDS:
        raise ValueError(f"{path}: corrupt trace: event {index} is not an event ({ev!r:.60})")
    name, fields = KINDS[ev[0]]
    if len(ev) != len(fields) + 1 or not isinstance(ev[1], int):
        raise ValueError(f"{path}: corrupt trace: event {index} ({name}) has {len(ev) - 1} fields, "
                         f"expected {len(fields)}")
    if "link" in fields and not (isinstance(ev[2], int) and 0 <= ev[2] < n_links):
        raise ValueError(f"{path}: corrupt trace: event {index} ({name}) names link {ev[2]!r} of {n_links}")
    if "actor" in fields and not (isinstance(ev[2], int) and 0 <= ev[2] < n_actors):
        raise ValueError(f"{path}: corrupt trace: event {index} ({name}) names actor {ev[2]!r} of {n_actors}")


class TraceStream(TraceHeader):
    """A trace file read event by event, in bounded memory: ``header`` at once, then ``for ev in
    stream`` (each checked as :func:`read_trace` checks it), ``footer`` once the events are through.

    ``payloads=False`` drops each SEND's payload bytes as it is read (``None`` in their place): the
    tools that summarise or export a trace never look inside them, and they are most of a data-mode
    trace's size.  Iterating twice re-reads the file."""

    def __init__(self, path: str, *, allow_truncated: bool = False, payloads: bool = True):
        self.path, self.allow_truncated, self.payloads = path, allow_truncated, payloads
        self.footer: dict = {}
        self.count = 0
        if not os.path.isfile(path):
            raise ValueError(f"{path}: no such trace file")
        self.header = self._open()[0]

    def _open(self):
        it = iter_trace(self.path)
        path = self.path
        try:
            header = next(it)
        except StopIteration:
            if os.path.getsize(path):
                raise ValueError(f"{path}: truncated trace or not an emulator trace (no complete header)") from None
            raise ValueError(f"{path}: empty file, not an emulator trace") from None
        except Exception as e:
            raise ValueError(f"{path}: not an emulator trace ({e})") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ValueError(f"{path}: not an emulator trace (no '{FORMAT}' header)")
        _check_header(path, header)
        return header, it

    def __iter__(self) -> Iterator[tuple]:
        header, it = self._open()
        path = self.path
        n_actors, n_links = len(header["actors"]), len(header["links"])
        n = 0
        footer: dict = {}
        try:
            for obj in it:
                if isinstance(obj, dict):
                    footer = obj
                    break
                _check_event(path, n, obj, n_actors, n_links)
                n += 1
                if not self.payloads and obj[0] == SEND:
                    obj = obj[:5] + (None,)
                yield obj
            extra = next(it, None)
        except ValueError:
            raise
        except Exception as e:
            raise ValueError(f"{path}: truncated or corrupt trace after {n} events ({e})") from None
        if extra is not None:
            raise ValueError(f"{path}: corrupt trace: data after the footer")
        if not footer and not self.allow_truncated:
            raise ValueError(f"{path}: truncated trace: no footer after {n} events (was the run interrupted?)")
        self.footer, self.count = footer, n


def read_trace(path: str, *, allow_truncated: bool = False) -> TraceFile:
    """Load a trace file; raises ``ValueError`` with a clear message if it is not a whole, valid one.

    A file without its footer (an interrupted run) is refused unless
    ``allow_truncated``: tools must not report on half a run as if it were whole.
    (:class:`TraceStream` reads one without holding it.)
    """
    stream = TraceStream(path, allow_truncated=allow_truncated)
    trace = TraceFile(header=stream.header)
    trace.events.extend(stream)
    trace.footer = stream.footer
    return trace
