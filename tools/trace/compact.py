"""A trace held in numpy columns: the summary and the critical path of large traces in bounded memory.

Why: a trace read as Python tuples costs ~150 bytes an event before any index
(a 206 MB trace took 2.8 GB for ``emu trace summary``).  Here each event is a
row of five columns -- kind (int8), time (int64), link or actor (int32), a
64-bit field (seq, or a busy span's end) and a 32-bit one (a message's bytes,
a queue depth, or a busy label's id) -- 25 bytes; the few events with free-form fields
(faults, errors, marks) keep their tuples on the side.  Payloads are never
kept.  Reading streams the file (:class:`emulator.trace.TraceStream`).

``trace.events[i]`` still gives the event's tuple (SEND's payload as ``None``),
so code written for :class:`emulator.trace.TraceFile` reads it unchanged; the
summary's counters use the columns directly.
"""
from __future__ import annotations

from array import array

import numpy as np

from emulator.trace import (BLOCK, BUSY, DELIVER, DONE, ERROR, FAULT, KINDS, MARK, SEND, TAKE, TraceFile,
                            TraceHeader, TraceStream, iter_trace)

__all__ = ["CompactTrace", "compact"]

_IRREGULAR = (FAULT, ERROR, MARK)       # fields that are not integers: kept as tuples


class _Events:
    """``events[i]`` / ``len`` / iteration over a :class:`CompactTrace`'s rows, as tuples."""

    def __init__(self, ct: "CompactTrace"):
        self.ct = ct

    def __len__(self) -> int:
        return len(self.ct.k)

    def __getitem__(self, i: int) -> tuple:
        ct = self.ct
        k = int(ct.k[i])
        if k in _IRREGULAR:
            return ct.side[int(i)]
        t, a, b, c = int(ct.t[i]), int(ct.a[i]), int(ct.b[i]), int(ct.c[i])
        if k == SEND:
            return (k, t, a, b, c, None)
        if k in (DELIVER, TAKE):
            return (k, t, a, b, c)
        if k == BUSY:
            return (k, t, a, b, ct.labels[c])
        if k == BLOCK:
            return (k, t, a, b)
        return (k, t, a)                       # DONE

    def __iter__(self):
        for start in range(0, len(self), 65536):      # rows converted a block at a time
            stop = min(len(self), start + 65536)
            for i in range(start, stop):
                yield self[i]


class CompactTrace(TraceHeader):
    """Header, footer and the events in columns (module docstring); ``events`` reads like a list."""

    def __init__(self, header: dict, footer: dict, cols: dict, side: dict, labels: list):
        self.header, self.footer, self.side, self.labels = header, footer, side, labels
        self.k, self.t, self.a, self.b, self.c = cols["k"], cols["t"], cols["a"], cols["b"], cols["c"]
        self.events = _Events(self)

    def of_kind(self, *codes: int) -> np.ndarray:
        """The row indices of events of these kind codes."""
        return np.flatnonzero(np.isin(self.k, codes))


def _label_index(label_id: dict, labels: list, lab) -> int:
    """The index of busy label ``lab`` in ``labels``, appended on first sight (equal values of one type share it)."""
    key = (type(lab), lab) if isinstance(lab, (str, int, float, bool, type(None))) else repr(lab)
    i = label_id.get(key)
    if i is None:
        i = label_id[key] = len(labels)
        labels.append(lab)
    return i


def compact(source) -> CompactTrace:
    """A :class:`CompactTrace` of ``source``: a path (streamed), a :class:`TraceStream`, a :class:`TraceFile`,
    or a CompactTrace (returned as is)."""
    if isinstance(source, CompactTrace):
        return source
    if isinstance(source, str):
        fast = _compact_file(source)
        if fast is not None:
            return fast
        source = TraceStream(source, payloads=False)     # anything irregular: the checked stream says what
    events = source.events if isinstance(source, TraceFile) else source
    k, t, a, b, c = array("b"), array("q"), array("i"), array("q"), array("i")
    side: dict[int, tuple] = {}
    labels: list = []
    label_id: dict = {}
    for n, ev in enumerate(events):
        kind = ev[0]
        k.append(kind)
        t.append(ev[1])
        if kind == SEND:
            a.append(ev[2]); b.append(ev[3]); c.append(ev[4])           # noqa: E702
        elif kind == DELIVER or kind == TAKE:
            a.append(ev[2]); b.append(ev[3]); c.append(ev[4])           # noqa: E702
        elif kind == BUSY:
            a.append(ev[2]); b.append(ev[3]); c.append(_label_index(label_id, labels, ev[4]))   # noqa: E702
        elif kind == BLOCK:
            a.append(ev[2]); b.append(ev[3]); c.append(0)               # noqa: E702
        elif kind == DONE:
            a.append(ev[2]); b.append(0); c.append(0)                   # noqa: E702
        else:                                                           # FAULT, ERROR, MARK
            side[n] = ev
            a.append(ev[2] if kind == MARK else -1); b.append(0); c.append(0)   # noqa: E702
    cols = {"k": np.frombuffer(k, np.int8), "t": np.frombuffer(t, np.int64), "a": np.frombuffer(a, np.int32),
            "b": np.frombuffer(b, np.int64), "c": np.frombuffer(c, np.int32)}
    return CompactTrace(source.header, source.footer, cols, side, labels)


#: per kind code: the event's length; the kinds whose field 2 is a link / an actor index
_SIZE = {code: len(fields) + 1 for code, (_, fields) in KINDS.items()}
_LINK_KINDS = [code for code, (_, fields) in KINDS.items() if "link" in fields]
_ACTOR_KINDS = [code for code, (_, fields) in KINDS.items() if "actor" in fields]


def _compact_file(path: str) -> CompactTrace | None:
    """The columns of a trace file in one tight loop over its msgpack stream, or ``None`` if anything is irregular.

    Why: the limits line of every run (tools/explain/limits.py) reads the run's whole trace; through
    :class:`TraceStream` (a generator, and a per-event check call) a 1.9 M-event trace took 2.0 s, here
    1.2 s.  The checks are the stream's: each event's length and integer time in the loop, the link /
    actor index ranges on the columns after it, a footer and nothing after it.  Whatever fails them (a
    corrupt or truncated file) returns ``None`` and the caller reads the file again through the checked
    stream, which raises with its message (file, event index, what is wrong)."""
    stream = TraceStream(path, payloads=False)            # the header, checked (raises on a bad one)
    header = stream.header
    k, t, a, b, c = array("b"), array("q"), array("i"), array("q"), array("i")
    ka, ta, aa, ba, ca = k.append, t.append, a.append, b.append, c.append
    side: dict[int, tuple] = {}
    labels: list = []
    label_id: dict = {}
    footer = None
    size = _SIZE
    try:
        it = iter_trace(path)
        next(it)                                        # the header
        n = 0
        for ev in it:
            if ev.__class__ is dict:
                footer = ev
                break
            kind = ev[0]
            if len(ev) != size[kind] or ev[1].__class__ is not int:
                return None
            ka(kind)
            ta(ev[1])
            if kind <= TAKE:                              # SEND, DELIVER, TAKE: link, seq, nbytes / depth
                aa(ev[2]); ba(ev[3]); ca(ev[4])           # noqa: E702
            elif kind == BUSY:
                aa(ev[2]); ba(ev[3]); ca(_label_index(label_id, labels, ev[4]))   # noqa: E702
            elif kind == BLOCK:
                aa(ev[2]); ba(ev[3]); ca(0)               # noqa: E702
            elif kind == DONE:
                aa(ev[2]); ba(0); ca(0)                   # noqa: E702
            else:                                         # FAULT, ERROR, MARK
                side[n] = ev
                aa(ev[2] if kind == MARK else -1); ba(0); ca(0)   # noqa: E702
            n += 1
        if footer is None or next(it, None) is not None:
            return None
    except Exception:  # noqa: BLE001 -- a non-tuple, a wrong type, an overflow, a msgpack error: the stream says
        return None
    cols = {"k": np.frombuffer(k, np.int8), "t": np.frombuffer(t, np.int64), "a": np.frombuffer(a, np.int32),
            "b": np.frombuffer(b, np.int64), "c": np.frombuffer(c, np.int32)}
    for kinds, bound in ((_LINK_KINDS, len(header["links"])), (_ACTOR_KINDS, len(header["actors"]))):
        sel = cols["a"][np.isin(cols["k"], kinds)]
        if sel.size and (sel.min() < 0 or sel.max() >= bound):
            return None
    return CompactTrace(header, footer, cols, side, labels)
