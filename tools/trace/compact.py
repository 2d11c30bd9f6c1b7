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

from emulator.trace import (BLOCK, BUSY, DELIVER, DONE, ERROR, FAULT, MARK, SEND, TAKE, TraceFile, TraceHeader,
                            TraceStream)

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


def compact(source) -> CompactTrace:
    """A :class:`CompactTrace` of ``source``: a path (streamed), a :class:`TraceStream`, a :class:`TraceFile`,
    or a CompactTrace (returned as is)."""
    if isinstance(source, CompactTrace):
        return source
    if isinstance(source, str):
        source = TraceStream(source, payloads=False)
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
            lab = ev[4]
            key = (type(lab), lab) if isinstance(lab, (str, int, float, bool, type(None))) else repr(lab)
            i = label_id.get(key)
            if i is None:
                i = label_id[key] = len(labels)
                labels.append(lab)
            a.append(ev[2]); b.append(ev[3]); c.append(i)               # noqa: E702
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
