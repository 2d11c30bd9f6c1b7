"""A one-line progress display for long runs on a terminal (virtual time reached, events/s).

Called by the clock once per virtual time step; it looks at the wall clock only
every 1024 steps so the hot path stays cheap.
"""
from __future__ import annotations

import time

from emulator.units import format_time


class Progress:
    def __init__(self, stream, every_s: float = 0.5):
        self.stream = stream
        self.every_s = every_s
        self.t0 = time.perf_counter()
        self.last = self.t0
        self.steps = 0
        self.shown = False
        self.events = lambda: 0   # set by the runner: events recorded so far

    def __call__(self, t_ps: int) -> None:
        self.steps += 1
        if self.steps & 1023:
            return
        now = time.perf_counter()
        if now - self.last < self.every_s:
            return
        self.last = now
        events = self.events()
        rate = events / (now - self.t0)
        self.stream.write(f"\r  virtual time {format_time(t_ps):>12}  {events:,} events  "
                          f"{rate:,.0f} events/s  wall {now - self.t0:.1f} s ")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * 79 + "\r")
            self.stream.flush()


def step_announcer(stream):
    """``step(name)``: one line per slow bundle step (Perfetto JSON, plots) so a long write is not silent."""

    def step(name: str) -> None:
        stream.write(f"  writing {name} ...\n")
        stream.flush()

    return step
