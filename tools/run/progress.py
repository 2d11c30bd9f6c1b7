"""A one-line progress display for runs on a terminal: phase, share of the work done, ETA, virtual time.

A thread of its own redraws the line every ``every_s`` (0.5 s) from what the run
exposes as plain attributes -- the clock's virtual time, the trace recorder's
event count, and the workload's ``progress`` hook (``(done, total, unit)``: the
MACs of a ``tl`` kernel, actors/registry.py) -- so the first line appears within
a second whatever the run does between time steps, and the run's hot path pays
nothing (the old display counted clock steps and looked at the wall clock every
1024 of them: on a run with few, heavy steps the first update came after 8 s).

The ETA is the work left at the rate of the work done so far in this run; a
workload without a known total shows virtual time and events only.
"""
from __future__ import annotations

import threading
import time

from emulator.units import format_time

__all__ = ["Progress", "step_announcer", "format_duration"]


def format_duration(s: float) -> str:
    """``75.2`` -> ``'1m15s'``; under a minute with one decimal."""
    if s < 60:
        return f"{s:.1f}s"
    m, s = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


class Progress:
    """The status line (module docstring).  ``phase(name)``, ``attach(system, work)``, ``close()``."""

    def __init__(self, stream, every_s: float = 0.5, *, clock=time.monotonic, start: bool = True):
        self.stream = stream
        self.every_s = every_s
        self.clock = clock
        self.t0 = clock()
        self.run_t0 = None
        self.name = "build"
        self.system = None
        self.work = None
        self.shown = False
        self._width = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="emu-progress", daemon=True) if start else None
        if self._thread is not None:
            self._thread.start()

    def phase(self, name: str) -> None:
        self.name = name

    def attach(self, system, work=None) -> None:
        """The run begins: read ``system`` (virtual time, events) and ``work() -> (done, total, unit)``."""
        self.system, self.work = system, work
        self.run_t0 = self.clock()
        self.name = "run"

    def line(self) -> str:
        """The status line now (the thread writes it; tests read it)."""
        now = self.clock()
        parts = [f"{self.name:<5}"]
        s = self.system
        if s is not None and self.name == "run":
            got = None
            if self.work is not None:
                try:
                    got = self.work()
                except Exception:      # a hook reading a half-built structure: no share this time
                    got = None
            if got:
                done, total, unit = got
                frac = min(1.0, done / total) if total else 0.0
                parts.append(f"{100 * frac:5.1f} % of {unit}")
                ran = now - self.run_t0
                if 0 < frac < 1 and ran > 0:
                    parts.append(f"ETA {format_duration(ran * (1 - frac) / frac)}")
            events = s.recorder.count + len(s.recorder.events)
            parts.append(f"virtual {format_time(s.clock.now)}")
            parts.append(f"{events:,} events ({events / max(1e-9, now - self.run_t0):,.0f}/s)")
        parts.append(f"wall {format_duration(now - self.t0)}")
        return "  ".join(parts)

    def draw(self) -> None:
        with self._lock:
            text = "  " + self.line()
            pad = max(0, self._width - len(text))
            self._width = len(text)
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
            self.shown = True

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.draw()
            except Exception:          # a closed stream: stop drawing, never disturb the run
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self.shown:
                self.stream.write("\r" + " " * self._width + "\r")
                self.stream.flush()
                self.shown = False


def step_announcer(stream):
    """``step(name)``: one line per slow bundle step (Perfetto JSON, plots) so a long write is not silent."""

    def step(name: str) -> None:
        stream.write(f"  writing {name} ...\n")
        stream.flush()

    return step
